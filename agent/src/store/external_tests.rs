//! Frontend sets of NodePort, LoadBalancer, externalIP, eTP=Local, affinity,
//! source-range and dual-stack Services, and the store's bad-input checks:
//! each names the Service and the field, and leaves other Services alone.
use std::{collections::BTreeSet, net::IpAddr};

use super::*;
use crate::{
    k8s::Problem,
    model::{
        BackendState, Cidr, EndpointSpec, FrontendKind, IpFamily, ServicePortSpec, ServiceType,
        SlicePortSpec, TrafficPolicy,
    },
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const NODE_V4: &str = "192.168.0.10";
const NODE_V6: &str = "2001:db8:ff::10";

fn node() -> NodeInfo {
    NodeInfo {
        name: "node-1".into(),
        zone: None,
        addresses: vec![ip(NODE_V4), ip(NODE_V6)],
    }
}

/// A dual-stack LoadBalancer Service `default/<name>` on port 80 (node port
/// `node_port`), with an external IP and an ingress IP of each family.
fn lb(name: &str, node_port: u16) -> ServiceSpec {
    ServiceSpec {
        id: ServiceId::new("default", name),
        kind: ServiceType::LoadBalancer,
        cluster_ips: vec![ip("10.96.0.10"), ip("fd00::10")],
        ports: vec![ServicePortSpec {
            name: "http".into(),
            port: 80,
            proto: Protocol::Tcp,
            node_port: Some(node_port),
        }],
        external_ips: vec![ip("192.0.2.7"), ip("2001:db8::7")],
        lb_ips: vec![ip("198.51.100.1"), ip("2001:db8::1")],
        ..ServiceSpec::default()
    }
}

fn node_port_svc(name: &str, node_port: u16, created: Option<i64>) -> ServiceSpec {
    ServiceSpec {
        id: ServiceId::new("default", name),
        created,
        kind: ServiceType::NodePort,
        cluster_ips: vec![ip(&format!("10.96.1.{}", name.len()))],
        ports: vec![ServicePortSpec {
            name: "http".into(),
            port: 80,
            proto: Protocol::Tcp,
            node_port: Some(node_port),
        }],
        ..ServiceSpec::default()
    }
}

/// One endpoint per `(address, node, ready)`; not ready means terminating
/// and still serving.
fn slice(name: &str, family: IpFamily, eps: &[(&str, &str, bool)]) -> SliceSpec {
    SliceSpec {
        id: SliceId {
            namespace: "default".into(),
            name: name.into(),
        },
        service: ServiceId::new("default", "web"),
        family,
        ports: vec![SlicePortSpec {
            name: "http".into(),
            port: 8080,
            proto: Protocol::Tcp,
        }],
        endpoints: eps
            .iter()
            .map(|&(a, node, ready)| EndpointSpec {
                addrs: vec![ip(a)],
                ready,
                serving: true,
                terminating: !ready,
                node_name: Some(node.into()),
                zone_hints: Vec::new(),
                node_hints: Vec::new(),
            })
            .collect(),
    }
}

fn web_store(svc: ServiceSpec) -> Store {
    let mut store = Store::new(node());
    let mut dirty = BTreeSet::new();
    store.apply(Change::UpsertService(svc), &mut dirty);
    for s in [
        slice(
            "web-v4",
            IpFamily::V4,
            &[("10.0.0.1", "node-1", true), ("10.0.0.2", "node-2", true)],
        ),
        slice(
            "web-v6",
            IpFamily::V6,
            &[("fd00:1::1", "node-1", true), ("fd00:1::2", "node-2", true)],
        ),
    ] {
        store.apply(Change::UpsertSlice(s), &mut dirty);
    }
    store
}

/// `addr:port kind local backends...` per frontend, for whole-set asserts.
fn summary(store: &Store, id: &str) -> Vec<String> {
    store
        .desired(&ServiceId::new("default", id))
        .unwrap()
        .frontends
        .iter()
        .map(|d| {
            let bs: Vec<String> = d.backends.iter().map(|b| b.addr.to_string()).collect();
            format!(
                "{} {:?}{} [{}]",
                d.frontend,
                d.kind,
                if d.local { " local" } else { "" },
                bs.join(" ")
            )
        })
        .collect()
}

#[test]
fn dual_stack_load_balancer_gets_every_frontend_of_each_family() {
    let store = web_store(lb("web", 30080));
    assert_eq!(
        summary(&store, "web"),
        [
            "10.96.0.10:80/TCP ClusterIp [10.0.0.1 10.0.0.2]",
            "192.168.0.10:30080/TCP NodePort [10.0.0.1 10.0.0.2]",
            "198.51.100.1:80/TCP LoadBalancer [10.0.0.1 10.0.0.2]",
            "192.0.2.7:80/TCP ExternalIp [10.0.0.1 10.0.0.2]",
            "[fd00::10]:80/TCP ClusterIp [fd00:1::1 fd00:1::2]",
            "[2001:db8:ff::10]:30080/TCP NodePort [fd00:1::1 fd00:1::2]",
            "[2001:db8::1]:80/TCP LoadBalancer [fd00:1::1 fd00:1::2]",
            "[2001:db8::7]:80/TCP ExternalIp [fd00:1::1 fd00:1::2]",
        ]
    );
}

#[test]
fn a_frontend_never_gets_a_backend_of_the_other_family() {
    let store = web_store(lb("web", 30080));
    for d in store.frontends(&ServiceId::new("default", "web")) {
        let family = IpFamily::of(&d.frontend.addr);
        assert!(
            d.backends.iter().all(|b| IpFamily::of(&b.addr) == family),
            "{d:?}"
        );
    }
    // A single-stack IPv4 Service ignores the IPv6 slice, node address,
    // external IP and ingress IP entirely.
    let mut v4 = lb("web", 30080);
    v4.cluster_ips = vec![ip("10.96.0.10")];
    let store = web_store(v4);
    let all = summary(&store, "web");
    assert_eq!(all.len(), 4, "{all:?}");
    assert!(
        all.iter()
            .all(|s| !s.contains("fd00") && !s.contains("2001"))
    );
}

#[test]
fn node_port_service_has_no_ingress_frontends() {
    let mut svc = lb("web", 30080);
    svc.kind = ServiceType::NodePort;
    svc.lb_ips.clear();
    svc.cluster_ips.truncate(1);
    let store = web_store(svc);
    let kinds: Vec<FrontendKind> = store
        .frontends(&ServiceId::new("default", "web"))
        .iter()
        .map(|d| d.kind)
        .collect();
    assert_eq!(
        kinds,
        [
            FrontendKind::ClusterIp,
            FrontendKind::NodePort,
            FrontendKind::ExternalIp
        ]
    );
}

#[test]
fn external_traffic_policy_local_narrows_only_external_frontends() {
    let mut svc = lb("web", 30080);
    svc.cluster_ips.truncate(1);
    svc.external_policy = TrafficPolicy::Local;
    svc.health_check_node_port = Some(32000);
    let store = web_store(svc);
    assert_eq!(
        summary(&store, "web"),
        [
            "10.96.0.10:80/TCP ClusterIp [10.0.0.1 10.0.0.2]",
            "192.168.0.10:30080/TCP NodePort local [10.0.0.1]",
            "198.51.100.1:80/TCP LoadBalancer local [10.0.0.1]",
            "192.0.2.7:80/TCP ExternalIp local [10.0.0.1]",
        ]
    );
    let hc = store
        .desired(&ServiceId::new("default", "web"))
        .unwrap()
        .health_check;
    assert_eq!(
        hc,
        Some(HealthCheck {
            node_port: 32000,
            local_endpoints: 1
        })
    );
}

#[test]
fn local_external_frontends_fall_back_to_local_terminating_endpoints_only() {
    let mut svc = lb("web", 30080);
    svc.cluster_ips.truncate(1);
    svc.external_policy = TrafficPolicy::Local;
    svc.health_check_node_port = Some(32000);
    let mut store = web_store(svc);
    let mut dirty = BTreeSet::new();
    store.apply(
        Change::UpsertSlice(slice(
            "web-v4",
            IpFamily::V4,
            &[("10.0.0.1", "node-1", false), ("10.0.0.2", "node-2", true)],
        )),
        &mut dirty,
    );
    let d = store.desired(&ServiceId::new("default", "web")).unwrap();
    let np = d
        .frontends
        .iter()
        .find(|d| d.kind == FrontendKind::NodePort)
        .unwrap();
    // The local terminating endpoint, never the remote ready one.
    assert_eq!(
        np.backends
            .iter()
            .map(|b| (b.addr, b.state))
            .collect::<Vec<_>>(),
        [(ip("10.0.0.1"), BackendState::Terminating)]
    );
    // Health checks count ready endpoints only: the LB should drain us.
    assert_eq!(d.health_check.unwrap().local_endpoints, 0);
}

#[test]
fn affinity_is_on_every_frontend_and_source_ranges_on_ingress_ones_by_family() {
    let mut svc = lb("web", 30080);
    svc.affinity = Some(600);
    svc.source_ranges = vec![Cidr::parse("203.0.113.0/24").unwrap()];
    let store = web_store(svc);
    let fes = store.frontends(&ServiceId::new("default", "web"));
    assert!(fes.iter().all(|d| d.affinity == Some(600)));
    for d in &fes {
        let want: Vec<Cidr> = match (d.kind, IpFamily::of(&d.frontend.addr)) {
            (FrontendKind::LoadBalancer, IpFamily::V4) => {
                vec![Cidr::parse("203.0.113.0/24").unwrap()]
            }
            // No IPv6 range given: the IPv6 ingress IP is open, as kube-proxy
            // filters ranges by family.
            _ => Vec::new(),
        };
        assert_eq!(d.source_ranges, want, "{}", d.frontend);
    }
}

fn rejection(store: &Store, name: &str) -> Vec<(String, Problem)> {
    let r = store
        .desired(&ServiceId::new("default", name))
        .expect_err("rejected");
    assert_eq!(r.service, ServiceId::new("default", name));
    assert!(r.to_string().contains(&format!("default/{name}")), "{r}");
    r.errors
        .errors
        .into_iter()
        .map(|e| (e.field, e.problem))
        .collect()
}

#[test]
fn node_port_outside_the_range_rejects_only_that_service() {
    let mut store = Store::with_options(
        node(),
        StoreOptions {
            node_port_range: 31_000..=31_999,
        },
    );
    let mut dirty = BTreeSet::new();
    store.apply(
        Change::UpsertService(node_port_svc("bad", 30_080, None)),
        &mut dirty,
    );
    store.apply(
        Change::UpsertService(node_port_svc("good", 31_080, None)),
        &mut dirty,
    );
    assert_eq!(
        rejection(&store, "bad"),
        [(
            "spec.ports[0].nodePort".to_owned(),
            Problem::NodePortOutOfRange {
                port: 30_080,
                min: 31_000,
                max: 31_999
            }
        )]
    );
    assert!(
        store
            .frontends(&ServiceId::new("default", "bad"))
            .is_empty()
    );
    assert_eq!(store.frontends(&ServiceId::new("default", "good")).len(), 2);
}

#[test]
fn node_port_conflict_goes_to_the_older_service_whatever_the_order() {
    let old = node_port_svc("old", 30_080, Some(100));
    let new = node_port_svc("newer", 30_080, Some(200));
    for order in [[&old, &new], [&new, &old]] {
        let mut store = Store::new(node());
        let mut dirty = BTreeSet::new();
        for s in order {
            store.apply(Change::UpsertService(s.clone()), &mut dirty);
        }
        assert_eq!(
            store.frontends(&old.id).len(),
            2,
            "ClusterIP + the v4 node address"
        );
        assert_eq!(
            rejection(&store, "newer"),
            [(
                "spec.ports[0].nodePort".to_owned(),
                Problem::NodePortInUse {
                    port: 30_080,
                    proto: Protocol::Tcp,
                    owner: old.id.clone()
                }
            )]
        );
        // The winner leaving hands the port over, and says so.
        let mut dirty = BTreeSet::new();
        store.apply(Change::DeleteService(old.id.clone()), &mut dirty);
        assert!(dirty.contains(&new.id), "{dirty:?}");
        assert_eq!(store.frontends(&new.id).len(), 2);
    }
}

#[test]
fn node_port_conflict_without_timestamps_goes_by_name() {
    let mut store = Store::new(node());
    let mut dirty = BTreeSet::new();
    let b = node_port_svc("b", 30_080, None);
    let a = node_port_svc("a", 30_080, None);
    store.apply(Change::UpsertService(b.clone()), &mut dirty);
    store.apply(Change::UpsertService(a.clone()), &mut dirty);
    assert!(store.desired(&a.id).is_ok());
    assert!(store.desired(&b.id).is_err());
    // A different protocol is a different node port.
    let mut udp = node_port_svc("c", 30_080, None);
    udp.ports[0].proto = Protocol::Udp;
    store.apply(Change::UpsertService(udp.clone()), &mut dirty);
    assert!(store.desired(&udp.id).is_ok());
    // Moving off the port releases it for b at once.
    let mut dirty = BTreeSet::new();
    let mut moved = a.clone();
    moved.ports[0].node_port = Some(30_081);
    store.apply(Change::UpsertService(moved), &mut dirty);
    assert!(dirty.contains(&b.id));
    assert!(store.desired(&b.id).is_ok());
}

#[test]
fn external_ip_on_a_node_address_names_the_index() {
    let mut store = web_store(lb("web", 30080));
    let mut dirty = BTreeSet::new();
    let mut bad = lb("bad", 30081);
    bad.cluster_ips = vec![ip("10.96.0.11")];
    bad.external_ips = vec![ip("192.0.2.8"), ip(NODE_V4)];
    store.apply(Change::UpsertService(bad), &mut dirty);
    assert_eq!(
        rejection(&store, "bad"),
        [(
            "spec.externalIPs[1]".to_owned(),
            Problem::ExternalIpIsNodeAddress { ip: ip(NODE_V4) }
        )]
    );
    assert_eq!(store.frontends(&ServiceId::new("default", "web")).len(), 8);
}

#[test]
fn node_addresses_change_every_service_and_node_labels_keep_them() {
    let mut store = web_store(lb("web", 30080));
    let mut dirty = BTreeSet::new();
    store.apply(
        Change::Node(NodeInfo {
            name: "node-1".into(),
            zone: Some("z".into()),
            addresses: Vec::new(),
        }),
        &mut dirty,
    );
    assert_eq!(store.node().addresses.len(), 2);
    let mut dirty = BTreeSet::new();
    store.apply(Change::NodeAddresses(vec![ip("192.168.0.11")]), &mut dirty);
    assert!(dirty.contains(&ServiceId::new("default", "web")));
    let nps: Vec<String> = store
        .frontends(&ServiceId::new("default", "web"))
        .iter()
        .filter(|d| d.kind == FrontendKind::NodePort)
        .map(|d| d.frontend.to_string())
        .collect();
    assert_eq!(nps, ["192.168.0.11:30080/TCP"]);
}
