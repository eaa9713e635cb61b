//! The agent's Prometheus metrics: our own families under `weir_`,
//! kube-proxy's under its own names ([`super::kube_proxy`]), client-go's
//! request metrics ([`super::rest_client`]) and the `process_*` collector,
//! all in one exposition.
use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::{kube_proxy::KubeProxy, process::ProcessCollector, rest_client::RestClientMetrics};
use crate::maps::MapName;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MapLabel {
    pub map: String,
}

impl MapLabel {
    pub fn of(map: MapName) -> Self {
        Self {
            map: map.pin_name().to_owned(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

/// `tcp` or `udp` (the UDP conntrack table also holds SCTP).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProtoLabel {
    pub proto: String,
}

/// One listener of a Service's healthCheckNodePort (`address` is ip:port).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    pub namespace: String,
    pub service: String,
    pub address: String,
}

/// A datapath counter: `xdp`, `tc-ingress` or `sock`, and its reason, as
/// `weir-agent inspect stats` names them.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatLabel {
    pub program: String,
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: String,
}

pub struct Metrics {
    registry: Registry,
    /// One pass of the controller over the Services a change touched
    /// (kube-proxy: `sync_proxy_rules_duration_seconds`).
    pub sync_duration: Histogram,
    /// From an EndpointSlice's `endpoints.kubernetes.io/last-change-trigger-time`
    /// to the change being in the maps (kube-proxy:
    /// `network_programming_duration_seconds`, same buckets).
    pub network_programming: Histogram,
    pub last_sync: Gauge<f64, AtomicU64>,
    pub services: Gauge,
    pub frontends: Gauge,
    pub backends: Gauge,
    pub map_entries: Family<MapLabel, Gauge>,
    pub map_capacity: Family<MapLabel, Gauge>,
    /// entries / capacity, as Cilium's `bpf_map_pressure`.
    pub map_pressure: Family<MapLabel, Gauge<f64, AtomicU64>>,
    pub map_full: Family<MapLabel, Counter>,
    pub map_ops: Counter,
    pub sync_errors: Family<ReasonLabel, Counter>,
    pub invalid_objects: Family<KindLabel, Counter>,
    pub watch_errors: Family<KindLabel, Counter>,
    pub healthz: Family<CodeLabel, Counter>,
    pub livez: Family<CodeLabel, Counter>,
    /// Entries the last conntrack GC sweep found, per table.
    pub conntrack_entries: Family<ProtoLabel, Gauge>,
    /// Expired conntrack entries the GC deleted.
    pub conntrack_gc_deleted: Counter,
    /// 1 per healthCheckNodePort listener that cannot bind; the series goes
    /// when it binds or the Service stops needing it.
    pub health_check_unbound: Family<ListenerLabel, Gauge>,
    /// The datapath's packet counters (`WEIR_STATS`, summed over CPUs),
    /// read after every conntrack sweep: outcomes and drop reasons such as
    /// `drop-snat-ports` (SNAT range exhausted) or `drop-ct-invalid`.
    pub datapath_packets: Family<StatLabel, Counter>,
    /// kube-proxy's families that have no counterpart here.
    pub kube_proxy: KubeProxy,
    /// The API client's requests (the layer is added where the client is built).
    pub rest_client: RestClientMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// One conntrack collection's outcome.
    pub fn observe_gc(&self, r: &crate::ct_gc::GcReport) {
        self.conntrack_entries
            .get_or_create(&ProtoLabel {
                proto: r.proto.to_owned(),
            })
            .set(i64::try_from(r.entries).unwrap_or(i64::MAX));
        self.conntrack_gc_deleted
            .inc_by(u64::try_from(r.deleted).unwrap_or(u64::MAX));
    }

    pub fn new() -> Self {
        let mut root = Registry::default();
        let sync_duration = Histogram::new(
            prometheus_client::metrics::histogram::exponential_buckets(0.0005, 2.0, 16),
        );
        let network_programming = Histogram::new(programming_buckets());
        let this = Self {
            registry: Registry::default(),
            sync_duration,
            network_programming,
            last_sync: Gauge::default(),
            services: Gauge::default(),
            frontends: Gauge::default(),
            backends: Gauge::default(),
            map_entries: Family::default(),
            map_capacity: Family::default(),
            map_pressure: Family::default(),
            map_full: Family::default(),
            map_ops: Counter::default(),
            sync_errors: Family::default(),
            invalid_objects: Family::default(),
            watch_errors: Family::default(),
            healthz: Family::default(),
            livez: Family::default(),
            conntrack_entries: Family::default(),
            conntrack_gc_deleted: Counter::default(),
            health_check_unbound: Family::default(),
            datapath_packets: Family::default(),
            kube_proxy: KubeProxy::default(),
            rest_client: RestClientMetrics::default(),
        };
        let r = root.sub_registry_with_prefix("weir");
        r.register(
            "sync_duration_seconds",
            "Time to program the Services one change touched",
            this.sync_duration.clone(),
        );
        r.register(
            "network_programming_duration_seconds",
            "From an EndpointSlice's last-change-trigger-time to the change in the BPF maps",
            this.network_programming.clone(),
        );
        r.register(
            "sync_last_timestamp_seconds",
            "When the maps were last synced (Unix time)",
            this.last_sync.clone(),
        );
        r.register(
            "services",
            "Services the agent programs",
            this.services.clone(),
        );
        r.register(
            "frontends",
            "VIP:port/proto frontends in the maps",
            this.frontends.clone(),
        );
        r.register(
            "backends",
            "Backend entries in the maps",
            this.backends.clone(),
        );
        r.register(
            "map_entries",
            "Entries in each agent-written BPF map",
            this.map_entries.clone(),
        );
        r.register(
            "map_capacity",
            "Maximum entries of each agent-written BPF map",
            this.map_capacity.clone(),
        );
        r.register(
            "map_pressure",
            "Fill ratio of each agent-written BPF map (entries / capacity)",
            this.map_pressure.clone(),
        );
        r.register(
            "map_full",
            "Services that did not fit, by the map that was full",
            this.map_full.clone(),
        );
        r.register(
            "map_operations",
            "Writes and deletes applied to the BPF maps",
            this.map_ops.clone(),
        );
        r.register(
            "sync_errors",
            "Services whose programming failed, by reason",
            this.sync_errors.clone(),
        );
        r.register(
            "invalid_objects",
            "Objects rejected by validation, by kind",
            this.invalid_objects.clone(),
        );
        r.register(
            "k8s_watch_errors",
            "Failed list or watch calls to the API server, by kind",
            this.watch_errors.clone(),
        );
        r.register(
            "healthz",
            "/healthz answers by HTTP code",
            this.healthz.clone(),
        );
        r.register("livez", "/livez answers by HTTP code", this.livez.clone());
        r.register(
            "conntrack_entries",
            "Conntrack entries found by the last GC sweep, by table",
            this.conntrack_entries.clone(),
        );
        r.register(
            "conntrack_gc_deleted",
            "Expired conntrack entries deleted by the GC",
            this.conntrack_gc_deleted.clone(),
        );
        r.register(
            "health_check_node_port_unbound",
            "healthCheckNodePort listeners that cannot bind (another process holds the port), by Service",
            this.health_check_unbound.clone(),
        );
        r.register(
            "datapath_packets",
            "Packets (socket calls for sock) counted by the datapath programs, by program and reason, as of the last conntrack sweep",
            this.datapath_packets.clone(),
        );
        this.kube_proxy.register(
            root.sub_registry_with_prefix("kubeproxy"),
            &super::kube_proxy::Shared {
                network_programming: &this.network_programming,
                last_sync: &this.last_sync,
                healthz: &this.healthz,
                livez: &this.livez,
            },
        );
        this.rest_client.register(&mut root);
        root.register_collector(Box::new(ProcessCollector));
        Self {
            registry: root,
            ..this
        }
    }

    /// One sync's duration, into ours and kube-proxy's histograms; `full`
    /// for those up to the first complete view.
    pub fn observe_sync(&self, secs: f64, full: bool) {
        self.sync_duration.observe(secs);
        let kp = &self.kube_proxy;
        kp.sync_duration.observe(secs);
        if full {
            kp.sync_full.observe(secs)
        } else {
            kp.sync_partial.observe(secs)
        }
    }

    /// Adds `delta` packets to the datapath counter `program`/`reason`.
    pub fn add_datapath_packets(&self, program: &str, reason: &str, delta: u64) {
        self.datapath_packets
            .get_or_create(&StatLabel {
                program: program.to_owned(),
                reason: reason.to_owned(),
            })
            .inc_by(delta);
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub fn set_map_usage(&self, map: MapName, used: u64, capacity: u32) {
        self.set_usage(&MapLabel::of(map), used, capacity);
    }

    /// [`Self::set_map_usage`] for a map the datapath writes, counted by a
    /// walk (the conntrack collector's thread).
    pub fn set_named_map_usage(&self, pin_name: &str, used: usize, capacity: u32) {
        let l = MapLabel {
            map: pin_name.to_owned(),
        };
        self.set_usage(&l, u64::try_from(used).unwrap_or(u64::MAX), capacity);
    }

    fn set_usage(&self, l: &MapLabel, used: u64, capacity: u32) {
        self.map_entries
            .get_or_create(l)
            .set(i64::try_from(used).unwrap_or(i64::MAX));
        self.map_capacity.get_or_create(l).set(i64::from(capacity));
        let pressure = if capacity == 0 {
            0.0
        } else {
            used as f64 / f64::from(capacity)
        };
        self.map_pressure.get_or_create(l).set(pressure);
    }
}

/// kube-proxy's buckets for `network_programming_duration_seconds`: fine below
/// a second, then coarser out to about five minutes.
fn programming_buckets() -> Vec<f64> {
    use prometheus_client::metrics::histogram::linear_buckets;
    linear_buckets(0.25, 0.25, 2)
        .chain(linear_buckets(1.0, 1.0, 59))
        .chain(linear_buckets(60.0, 5.0, 12))
        .chain(linear_buckets(120.0, 30.0, 7))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_every_family_and_map_pressure() {
        let m = Metrics::new();
        m.set_map_usage(MapName::Services, 3, 12);
        m.sync_duration.observe(0.002);
        m.map_ops.inc_by(5);
        m.conntrack_entries
            .get_or_create(&ProtoLabel {
                proto: "tcp".into(),
            })
            .set(7);
        m.conntrack_gc_deleted.inc_by(2);
        m.health_check_unbound
            .get_or_create(&ListenerLabel {
                namespace: "default".into(),
                service: "lb".into(),
                address: "0.0.0.0:32000".into(),
            })
            .set(1);
        let text = m.encode();
        for name in [
            "weir_sync_duration_seconds_bucket",
            "weir_network_programming_duration_seconds_count",
            "weir_services ",
            "weir_backends ",
            "weir_map_operations_total 5",
            "weir_conntrack_entries{proto=\"tcp\"} 7",
            "weir_conntrack_gc_deleted_total 2",
            "weir_health_check_node_port_unbound{namespace=\"default\",service=\"lb\",address=\"0.0.0.0:32000\"} 1",
            "weir_map_entries{map=\"WEIR_SVC\"} 3",
            "weir_map_capacity{map=\"WEIR_SVC\"} 12",
            "weir_map_pressure{map=\"WEIR_SVC\"} 0.25",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn datapath_counters_add_up_by_program_and_reason() {
        let m = Metrics::new();
        m.add_datapath_packets("tc-ingress", "drop-snat-ports", 3);
        m.add_datapath_packets("tc-ingress", "drop-snat-ports", 4);
        m.add_datapath_packets("xdp", "pass", 0);
        let text = m.encode();
        for line in [
            "weir_datapath_packets_total{program=\"tc-ingress\",reason=\"drop-snat-ports\"} 7",
            "weir_datapath_packets_total{program=\"xdp\",reason=\"pass\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
