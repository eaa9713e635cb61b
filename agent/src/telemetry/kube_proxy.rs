//! kube-proxy's own metric families (`kubeproxy_*`), served next to ours so
//! dashboards and alerts written for kube-proxy keep working after the
//! switch.
//!
//! Names, types, help texts and buckets are kube-proxy's
//! (`pkg/proxy/metrics`). Labels are those of kube-proxy up to 1.32: from
//! 1.33 kube-proxy runs one proxier per IP family and adds `ip_family`,
//! but the agent programs both families in one sync, so splitting its
//! timings by family would invent numbers. The iptables and nftables
//! families (rule counts, restore failures) have no meaning here and are
//! left out rather than served as constant zeros.
use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use super::metrics::CodeLabel;

/// `internal` (internalTrafficPolicy) or `external` (externalTrafficPolicy).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrafficPolicyLabel {
    pub traffic_policy: String,
}

pub struct KubeProxy {
    /// kube-proxy's buckets (1 ms × 2^0..14); ours start at 0.5 ms, so this
    /// is its own histogram observed at the same points.
    pub sync_duration: Histogram,
    /// Syncs up to and including the first complete view (kube-proxy's full
    /// resync), and every one after it (its partial syncs).
    pub sync_full: Histogram,
    pub sync_partial: Histogram,
    pub last_queued: Gauge<f64, AtomicU64>,
    pub endpoint_changes_pending: Gauge,
    pub endpoint_changes: Counter,
    pub service_changes_pending: Gauge,
    pub service_changes: Counter,
    pub no_local_endpoints: Family<TrafficPolicyLabel, Gauge>,
}

/// Families both namespaces serve: the same series under two names.
pub struct Shared<'a> {
    pub network_programming: &'a Histogram,
    pub last_sync: &'a Gauge<f64, AtomicU64>,
    pub healthz: &'a Family<CodeLabel, Counter>,
    pub livez: &'a Family<CodeLabel, Counter>,
}

fn sync_buckets() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 2.0, 15,
    ))
}

impl Default for KubeProxy {
    fn default() -> Self {
        Self {
            sync_duration: sync_buckets(),
            sync_full: sync_buckets(),
            sync_partial: sync_buckets(),
            last_queued: Gauge::default(),
            endpoint_changes_pending: Gauge::default(),
            endpoint_changes: Counter::default(),
            service_changes_pending: Gauge::default(),
            service_changes: Counter::default(),
            no_local_endpoints: Family::default(),
        }
    }
}

impl KubeProxy {
    /// Registers every family on `r`, which carries the `kubeproxy` prefix.
    pub fn register(&self, r: &mut Registry, shared: &Shared<'_>) {
        r.register(
            "sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            self.sync_duration.clone(),
        );
        r.register(
            "sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            self.sync_full.clone(),
        );
        r.register(
            "sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            self.sync_partial.clone(),
        );
        r.register(
            "sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            shared.last_sync.clone(),
        );
        r.register(
            "sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            self.last_queued.clone(),
        );
        r.register(
            "network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            shared.network_programming.clone(),
        );
        r.register(
            "sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            self.endpoint_changes_pending.clone(),
        );
        // Counters get their `_total` suffix from the encoder.
        r.register(
            "sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            self.endpoint_changes.clone(),
        );
        r.register(
            "sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            self.service_changes_pending.clone(),
        );
        r.register(
            "sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            self.service_changes.clone(),
        );
        // A gauge despite its name, as in kube-proxy.
        r.register(
            "sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            self.no_local_endpoints.clone(),
        );
        r.register(
            "proxy_healthz",
            "Cumulative proxy healthz HTTP status",
            shared.healthz.clone(),
        );
        r.register(
            "proxy_livez",
            "Cumulative proxy livez HTTP status",
            shared.livez.clone(),
        );
    }

    /// Publishes the count of Service ports with a Local policy and no
    /// local endpoint, per policy.
    pub fn set_no_local_endpoints(&self, internal: usize, external: usize) {
        for (policy, n) in [("internal", internal), ("external", external)] {
            self.no_local_endpoints
                .get_or_create(&TrafficPolicyLabel {
                    traffic_policy: policy.to_owned(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::Metrics;

    /// kube-proxy's families that carry over, with their types and labels
    /// as the Kubernetes metrics reference lists them (labels as of 1.32),
    /// plus client-go's and the process collector's that kube-proxy serves.
    const KUBE_PROXY: &[(&str, &str, &[&str])] = &[
        (
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "histogram",
            &[],
        ),
        (
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "histogram",
            &[],
        ),
        (
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "histogram",
            &[],
        ),
        (
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "gauge",
            &[],
        ),
        (
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "gauge",
            &[],
        ),
        (
            "kubeproxy_network_programming_duration_seconds",
            "histogram",
            &[],
        ),
        (
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "gauge",
            &[],
        ),
        (
            "kubeproxy_sync_proxy_rules_endpoint_changes_total",
            "counter",
            &[],
        ),
        (
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "gauge",
            &[],
        ),
        (
            "kubeproxy_sync_proxy_rules_service_changes_total",
            "counter",
            &[],
        ),
        (
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "gauge",
            &["traffic_policy"],
        ),
        ("kubeproxy_proxy_healthz_total", "counter", &["code"]),
        ("kubeproxy_proxy_livez_total", "counter", &["code"]),
        (
            "rest_client_requests_total",
            "counter",
            &["code", "method", "host"],
        ),
        (
            "rest_client_request_duration_seconds",
            "histogram",
            &["verb", "host"],
        ),
        ("process_cpu_seconds_total", "counter", &[]),
        ("process_resident_memory_bytes", "gauge", &[]),
        ("process_virtual_memory_bytes", "gauge", &[]),
        ("process_start_time_seconds", "gauge", &[]),
        ("process_open_fds", "gauge", &[]),
        ("process_max_fds", "gauge", &[]),
    ];

    /// `# TYPE` lines name a counter without `_total` in OpenMetrics (and
    /// with it in Prometheus' text format); scrapers store the sample name.
    fn family(name: &str, kind: &str) -> String {
        match kind {
            "counter" => name.trim_end_matches("_total").to_owned(),
            _ => name.to_owned(),
        }
    }

    /// The label names of `name`'s first sample line.
    fn labels_of(text: &str, sample: &str) -> Option<Vec<String>> {
        let line = text.lines().find(|l| {
            l.strip_prefix(sample)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })?;
        let rest = &line[sample.len()..];
        let Some(inner) = rest.strip_prefix('{') else {
            return Some(Vec::new());
        };
        let inner = &inner[..inner.find('}')?];
        Some(
            inner
                .split(',')
                .filter(|kv| !kv.starts_with("le="))
                .map(|kv| kv.split('=').next().unwrap_or_default().to_owned())
                .collect(),
        )
    }

    #[test]
    fn kube_proxy_names_types_and_labels() {
        let m = Metrics::new();
        // Label sets appear once something is observed.
        m.kube_proxy.set_no_local_endpoints(1, 2);
        m.rest_client.observe("GET", "10.96.0.1:443", "200", 0.01);
        for fam in [&m.healthz, &m.livez] {
            fam.get_or_create(&CodeLabel { code: "200".into() }).inc();
        }
        let text = m.encode();
        for &(name, kind, labels) in KUBE_PROXY {
            let fam = family(name, kind);
            let type_line = format!("# TYPE {fam} {kind}\n");
            assert!(
                text.contains(&type_line),
                "{type_line:?} missing from:\n{text}"
            );
            let sample = match kind {
                "histogram" => format!("{name}_count"),
                _ => name.to_owned(),
            };
            let got = labels_of(&text, &sample)
                .unwrap_or_else(|| panic!("no sample {sample} in:\n{text}"));
            assert_eq!(got, labels, "labels of {sample}");
        }
        for line in [
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"internal\"} 1",
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\"} 2",
            "kubeproxy_proxy_healthz_total{code=\"200\"} 1",
            // kube-proxy's buckets, not ours.
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"0.001\"} 0",
            "kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"16.384\"} 0",
            "kubeproxy_network_programming_duration_seconds_bucket{le=\"0.25\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }

    #[test]
    fn one_sync_lands_in_ours_and_in_the_full_or_partial_histogram() {
        let m = Metrics::new();
        m.observe_sync(0.002, true);
        m.observe_sync(0.004, false);
        m.observe_sync(0.004, false);
        let text = m.encode();
        for line in [
            "weir_sync_duration_seconds_count 3",
            "kubeproxy_sync_proxy_rules_duration_seconds_count 3",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count 1",
            "kubeproxy_sync_partial_proxy_rules_duration_seconds_count 2",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
