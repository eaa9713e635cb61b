//! Frontend sets of NodePort, LoadBalancer, externalIP, eTP=Local, affinity,
//! source-range and dual-stack Services, and the store's bad-input checks:
//! each names the Service and the field, and leaves other Services alone.
use std::{collections::BTreeSet, net::IpAddr};

use super::*;
use crate::model::{
    BackendState, Cidr, EndpointMeta, EndpointSpec, FrontendKind, IpFamily, NodePortAddresses,
    Scope, ServicePortSpec, ServiceType, SlicePortSpec, TrafficPolicy,
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
        ..NodeInfo::default()
    }
}

/// A dual-stack LoadBalancer Service `default/<name>` on port 80 (node port
/// `node_port`), with an external IP and an ingress IP of each family.
fn lb(name: &str, node_port: u16) -> ServiceSpec {
    ServiceSpec {
        id: ServiceId::new("default", name),
        kind: ServiceType::LoadBalancer,
        cluster_ips: vec![ip("10.96.0.10"), ip("fd00::10")].into(),
        ports: vec![ServicePortSpec {
            name: "http".into(),
            port: 80,
            proto: Protocol::Tcp,
            node_port: Some(node_port),
        }]
        .into(),
        external_ips: vec![ip("192.0.2.7"), ip("2001:db8::7")].into(),
        lb_ips: vec![ip("198.51.100.1"), ip("2001:db8::1")].into(),
        ..ServiceSpec::default()
    }
}

/// Gives `svc` a second port, 81/TCP, on `node_port`.
fn add_port_81(svc: &mut ServiceSpec, node_port: u16) {
    let port = ServicePortSpec {
        name: "x".into(),
        port: 81,
        proto: Protocol::Tcp,
        node_port: Some(node_port),
    };
    svc.ports = svc.ports.iter().cloned().chain([port]).collect();
}

fn node_port_svc(name: &str, node_port: u16, created: Option<i64>) -> ServiceSpec {
    ServiceSpec {
        id: ServiceId::new("default", name),
        created,
        kind: ServiceType::NodePort,
        cluster_ips: vec![ip(&format!("10.96.1.{}", name.len()))].into(),
        ports: vec![ServicePortSpec {
            name: "http".into(),
            port: 80,
            proto: Protocol::Tcp,
            node_port: Some(node_port),
        }]
        .into(),
        ..ServiceSpec::default()
    }
}

/// One endpoint per `(address, node, ready)`; not ready means terminating
/// and still serving.
fn slice(name: &str, family: IpFamily, eps: &[(&str, &str, bool)]) -> SliceSpec {
    SliceSpec {
        id: SliceId::new("default", name),
        service: ServiceId::new("default", "web"),
        family,
        ports: vec![SlicePortSpec {
            name: "http".into(),
            port: 8080,
            proto: Protocol::Tcp,
        }]
        .into(),
        endpoints: eps
            .iter()
            .map(|&(a, node, ready)| EndpointSpec {
                addr: ip(a),
                ready,
                serving: true,
                terminating: !ready,
                meta: EndpointMeta {
                    node_name: Some(node.into()),
                    ..EndpointMeta::default()
                }
                .shared(),
            })
            .collect(),
    }
}

/// The backends (address, state) of the first NodePort frontend of `scope`.
fn node_port_backends(d: &DesiredService, scope: Scope) -> Vec<(IpAddr, BackendState)> {
    d.frontends
        .iter()
        .find(|d| d.kind == FrontendKind::NodePort && d.frontend.scope == scope)
        .unwrap()
        .backends
        .iter()
        .map(|b| (b.addr, b.state))
        .collect()
}

fn web_store(svc: ServiceSpec) -> Store {
    let mut store = Store::new(node());
    let mut dirty = BTreeSet::new();
    store.apply(Change::service(svc), &mut dirty);
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
        store.apply(Change::slice(s), &mut dirty);
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
    v4.cluster_ips = vec![ip("10.96.0.10")].into();
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
    svc.lb_ips = Box::default();
    svc.cluster_ips = svc.cluster_ips[..1].into();
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
fn external_traffic_policy_local_narrows_only_the_external_scope_of_external_frontends() {
    let mut svc = lb("web", 30080);
    svc.cluster_ips = svc.cluster_ips[..1].into();
    svc.external_policy = TrafficPolicy::Local;
    svc.health_check_node_port = Some(32000);
    let store = web_store(svc);
    // Each external frontend twice: the All scope keeps every endpoint (pods
    // and the node reach external destinations through all of them, as with
    // kube-proxy), the External scope has this node's only; both LOCAL.
    assert_eq!(
        summary(&store, "web"),
        [
            "10.96.0.10:80/TCP ClusterIp [10.0.0.1 10.0.0.2]",
            "192.168.0.10:30080/TCP (external scope) NodePort local [10.0.0.1]",
            "192.168.0.10:30080/TCP NodePort local [10.0.0.1 10.0.0.2]",
            "198.51.100.1:80/TCP (external scope) LoadBalancer local [10.0.0.1]",
            "198.51.100.1:80/TCP LoadBalancer local [10.0.0.1 10.0.0.2]",
            "192.0.2.7:80/TCP (external scope) ExternalIp local [10.0.0.1]",
            "192.0.2.7:80/TCP ExternalIp local [10.0.0.1 10.0.0.2]",
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
    svc.cluster_ips = svc.cluster_ips[..1].into();
    svc.external_policy = TrafficPolicy::Local;
    svc.health_check_node_port = Some(32000);
    let mut store = web_store(svc);
    let mut dirty = BTreeSet::new();
    store.apply(
        Change::slice(slice(
            "web-v4",
            IpFamily::V4,
            &[("10.0.0.1", "node-1", false), ("10.0.0.2", "node-2", true)],
        )),
        &mut dirty,
    );
    let d = store.desired(&ServiceId::new("default", "web")).unwrap();
    let np = |scope| node_port_backends(&d, scope);
    // From outside: the local terminating endpoint, never the remote ready
    // one.
    assert_eq!(
        np(Scope::External),
        [(ip("10.0.0.1"), BackendState::Terminating)]
    );
    // From inside: the cluster-wide set, whose fallback is its own.
    assert_eq!(
        np(Scope::All),
        [
            (ip("10.0.0.1"), BackendState::Terminating),
            (ip("10.0.0.2"), BackendState::Active)
        ]
    );
    // Health checks count ready endpoints only: the LB should drain us.
    assert_eq!(d.health_check.unwrap().local_endpoints, 0);
}

#[test]
fn affinity_is_on_every_frontend_and_source_ranges_on_ingress_ones_by_family() {
    let mut svc = lb("web", 30080);
    svc.affinity = Some(600);
    svc.source_ranges = vec![Cidr::parse("203.0.113.0/24").unwrap()].into();
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

fn rejection(store: &Store, name: &str) -> Vec<StoreError> {
    let r = store
        .desired(&ServiceId::new("default", name))
        .expect_err("rejected");
    assert_eq!(r.service, ServiceId::new("default", name));
    // One line names the Service, the field and the bad value (what the
    // integration tests grep the log for).
    let line = r.to_string();
    assert!(line.contains(&format!("default/{name}")), "{line}");
    for e in &r.errors {
        assert!(line.contains(&format!("{}: ", e.field())), "{line}");
    }
    r.errors
}

#[test]
fn node_port_outside_the_range_rejects_only_that_service() {
    let mut store = Store::with_options(
        node(),
        StoreOptions {
            node_port_range: 31_000..=31_999,
            ..StoreOptions::default()
        },
    );
    let mut dirty = BTreeSet::new();
    store.apply(
        Change::service(node_port_svc("bad", 30_080, None)),
        &mut dirty,
    );
    store.apply(
        Change::service(node_port_svc("good", 31_080, None)),
        &mut dirty,
    );
    assert_eq!(
        rejection(&store, "bad"),
        [StoreError::NodePortOutOfRange {
            index: 0,
            port: 30_080,
            min: 31_000,
            max: 31_999
        }]
    );
    assert_eq!(
        rejection(&store, "bad")[0].to_string(),
        "spec.ports[0].nodePort: node port 30080 is outside the node port range 31000-31999"
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
            store.apply(Change::service(s.clone()), &mut dirty);
        }
        assert_eq!(
            store.frontends(&old.id).len(),
            2,
            "ClusterIP + the v4 node address"
        );
        assert_eq!(
            rejection(&store, "newer"),
            [StoreError::NodePortInUse {
                index: 0,
                port: 30_080,
                proto: Protocol::Tcp,
                owner: old.id.clone()
            }]
        );
        let msg = rejection(&store, "newer")[0].to_string();
        assert!(
            msg.starts_with(
                "spec.ports[0].nodePort: node port 30080/TCP is already used by Service default/old, which claimed it first"
            ),
            "{msg}"
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
    store.apply(Change::service(b.clone()), &mut dirty);
    store.apply(Change::service(a.clone()), &mut dirty);
    assert!(store.desired(&a.id).is_ok());
    assert!(store.desired(&b.id).is_err());
    // A different protocol is a different node port.
    let mut udp = node_port_svc("c", 30_080, None);
    udp.ports[0].proto = Protocol::Udp;
    store.apply(Change::service(udp.clone()), &mut dirty);
    assert!(store.desired(&udp.id).is_ok());
    // Moving off the port releases it for b at once.
    let mut dirty = BTreeSet::new();
    let mut moved = a.clone();
    moved.ports[0].node_port = Some(30_081);
    store.apply(Change::service(moved), &mut dirty);
    assert!(dirty.contains(&b.id));
    assert!(store.desired(&b.id).is_ok());
}

#[test]
fn external_ip_on_a_node_address_names_the_index() {
    let mut store = web_store(lb("web", 30080));
    let mut dirty = BTreeSet::new();
    let mut bad = lb("bad", 30081);
    bad.cluster_ips = vec![ip("10.96.0.11")].into();
    bad.external_ips = vec![ip("192.0.2.8"), ip(NODE_V4)].into();
    store.apply(Change::service(bad), &mut dirty);
    assert_eq!(
        rejection(&store, "bad"),
        [StoreError::ExternalIpIsNodeAddress {
            index: 1,
            ip: ip(NODE_V4)
        }]
    );
    assert_eq!(rejection(&store, "bad")[0].field(), "spec.externalIPs[1]");
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
            ..NodeInfo::default()
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

/// The NodePort frontends of `web` in `store`, as text.
fn node_port_frontends(store: &Store) -> Vec<String> {
    store
        .frontends(&ServiceId::new("default", "web"))
        .iter()
        .filter(|d| d.kind == FrontendKind::NodePort)
        .map(|d| d.frontend.to_string())
        .collect()
}

#[test]
fn node_port_addresses_select_by_range_or_the_nodes_primary_ips() {
    let with = |addrs: NodePortAddresses| {
        let mut store = Store::with_options(
            node(),
            StoreOptions {
                node_port_addresses: addrs,
                ..StoreOptions::default()
            },
        );
        let mut dirty = BTreeSet::new();
        store.apply(Change::service(lb("web", 30080)), &mut dirty);
        store
    };
    let v4_only = NodePortAddresses::Cidrs(vec![Cidr::parse("192.168.0.0/16").unwrap()]);
    assert_eq!(
        node_port_frontends(&with(v4_only)),
        ["192.168.0.10:30080/TCP"]
    );
    assert_eq!(node_port_frontends(&with(NodePortAddresses::All)).len(), 2);

    // primary: none until the Node says which; then only an address the
    // node really has, whatever else the Node lists.
    let mut store = with(NodePortAddresses::Primary);
    assert!(node_port_frontends(&store).is_empty());
    let mut dirty = BTreeSet::new();
    store.apply(
        Change::Node(NodeInfo {
            name: "node-1".into(),
            primary_ips: vec![ip(NODE_V6), ip("10.9.9.9")],
            ..NodeInfo::default()
        }),
        &mut dirty,
    );
    assert!(dirty.contains(&ServiceId::new("default", "web")));
    assert_eq!(node_port_frontends(&store), ["[2001:db8:ff::10]:30080/TCP"]);
    // A Node update without addresses keeps the known ones.
    store.apply(
        Change::Node(NodeInfo {
            name: "node-1".into(),
            ..NodeInfo::default()
        }),
        &mut BTreeSet::new(),
    );
    assert_eq!(node_port_frontends(&store).len(), 1);
    // External IPs are still checked against every address.
    let mut bad = lb("bad", 30081);
    bad.external_ips = vec![ip(NODE_V4)].into();
    store.apply(Change::service(bad), &mut BTreeSet::new());
    assert!(matches!(
        rejection(&store, "bad")[..],
        [StoreError::ExternalIpIsNodeAddress { .. }]
    ));
}

#[test]
fn node_port_addresses_parse_as_kube_proxy_validates_them() {
    let p = |v: &[&str]| {
        NodePortAddresses::parse(&v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
    };
    assert_eq!(p(&[]), Ok(NodePortAddresses::All));
    assert_eq!(p(&["primary"]), Ok(NodePortAddresses::Primary));
    assert_eq!(
        p(&["10.0.0.0/8", "fd00::/8"])
            .map(|a| matches!(a, NodePortAddresses::Cidrs(c) if c.len() == 2)),
        Ok(true)
    );
    assert_eq!(
        p(&["primary", "10.0.0.0/8"]),
        Err("\"primary\" must be the only value".into())
    );
    assert_eq!(
        p(&["10.0.0.1"]),
        Err("\"10.0.0.1\" is neither a CIDR such as 10.0.0.0/8 nor \"primary\"".into())
    );
}

#[test]
fn a_service_rejected_for_its_own_reasons_holds_no_node_port() {
    // The older Service puts an external IP on a node address: refused, so
    // the younger one keeps 30080.
    let mut store = Store::new(node());
    let mut dirty = BTreeSet::new();
    let mut old = node_port_svc("old", 30_080, Some(100));
    old.external_ips = vec![ip(NODE_V4)].into();
    let young = node_port_svc("young", 30_080, Some(200));
    store.apply(Change::service(old.clone()), &mut dirty);
    store.apply(Change::service(young.clone()), &mut dirty);
    assert!(matches!(
        rejection(&store, "old")[..],
        [StoreError::ExternalIpIsNodeAddress { index: 0, .. }]
    ));
    assert_eq!(store.frontends(&young.id).len(), 2);

    // A second port out of range refuses the older one too.
    let mut old2 = node_port_svc("old", 30_080, Some(100));
    add_port_81(&mut old2, 80);
    let mut dirty = BTreeSet::new();
    store.apply(Change::service(old2), &mut dirty);
    // Refused before and after: no claim changed, the younger one is not
    // even resynced.
    assert!(!dirty.contains(&young.id));
    assert_eq!(store.frontends(&young.id).len(), 2);

    // Fixed: the older Service takes the port back and says so.
    let mut dirty = BTreeSet::new();
    store.apply(
        Change::service(node_port_svc("old", 30_080, Some(100))),
        &mut dirty,
    );
    assert!(dirty.contains(&young.id), "{dirty:?}");
    assert!(store.desired(&young.id).is_err());
    assert_eq!(store.frontends(&old.id).len(), 2);

    // The node address moving away makes the first version valid again.
    let mut dirty = BTreeSet::new();
    store.apply(Change::service(young.clone()), &mut dirty);
    store.apply(Change::service(old.clone()), &mut dirty);
    assert!(store.desired(&young.id).is_ok());
    store.apply(Change::NodeAddresses(vec![ip("192.168.0.99")]), &mut dirty);
    assert!(store.desired(&old.id).is_ok());
    assert!(store.desired(&young.id).is_err());
}

#[test]
fn a_service_that_loses_one_node_port_holds_none_of_the_others() {
    // a (oldest) has 30080; b wants 30080 and 30081; c (youngest) 30081.
    // b loses 30080 and gets no frontend, so c keeps 30081.
    let a = node_port_svc("a", 30_080, Some(100));
    let mut b = node_port_svc("bb", 30_080, Some(200));
    add_port_81(&mut b, 30_081);
    let c = node_port_svc("ccc", 30_081, Some(300));
    let mut store = Store::new(node());
    let mut dirty = BTreeSet::new();
    for s in [&c, &b, &a] {
        store.apply(Change::service(s.clone()), &mut dirty);
    }
    assert!(store.desired(&a.id).is_ok());
    assert_eq!(
        rejection(&store, "bb"),
        [StoreError::NodePortInUse {
            index: 0,
            port: 30_080,
            proto: Protocol::Tcp,
            owner: a.id.clone()
        }]
    );
    assert!(store.desired(&c.id).is_ok());

    // a leaves: b wins both ports, c loses 30081 to it; the change reaches c
    // through b, even when b was already dirty for another reason.
    let mut dirty = BTreeSet::from([b.id.clone()]);
    store.apply(Change::DeleteService(a.id.clone()), &mut dirty);
    assert!(dirty.contains(&b.id) && dirty.contains(&c.id), "{dirty:?}");
    assert!(store.desired(&b.id).is_ok());
    assert!(matches!(
        rejection(&store, "ccc")[..],
        [StoreError::NodePortInUse { port: 30_081, .. }]
    ));
}

#[test]
fn cluster_ip_service_with_external_ips_honours_local_policy_on_them() {
    let svc = ServiceSpec {
        id: ServiceId::new("default", "web"),
        kind: ServiceType::ClusterIp,
        cluster_ips: vec![ip("10.96.0.10")].into(),
        ports: lb("web", 30080).ports,
        external_ips: vec![ip("192.0.2.7")].into(),
        external_policy: TrafficPolicy::Local,
        ..ServiceSpec::default()
    };
    let store = web_store(svc);
    assert_eq!(
        summary(&store, "web"),
        [
            "10.96.0.10:80/TCP ClusterIp [10.0.0.1 10.0.0.2]",
            "192.0.2.7:80/TCP (external scope) ExternalIp local [10.0.0.1]",
            "192.0.2.7:80/TCP ExternalIp local [10.0.0.1 10.0.0.2]",
        ]
    );
}

#[test]
fn a_long_chain_of_contenders_settles_oldest_first() {
    // s[i] claims 30000+i and 30001+i: s0 wins, s1 loses to it, so s2 wins,
    // and so on, alternating down the chain.
    let n = 300u16;
    let mut store = Store::new(node());
    let mut dirty = BTreeSet::new();
    let svc = |i: u16| {
        let mut s = node_port_svc(&format!("s{i:04}"), 30_000 + i, Some(i64::from(i)));
        add_port_81(&mut s, 30_001 + i);
        s
    };
    for i in (0..n).rev() {
        store.apply(Change::service(svc(i)), &mut dirty);
    }
    for i in [0, 1, 2, n - 2, n - 1] {
        assert_eq!(store.desired(&svc(i).id).is_ok(), i % 2 == 0, "s{i}");
    }
    // The head leaving flips the whole chain.
    let mut dirty = BTreeSet::new();
    store.apply(Change::DeleteService(svc(0).id), &mut dirty);
    assert_eq!(dirty.len(), usize::from(n));
    for i in [1, 2, n - 2, n - 1] {
        assert_eq!(store.desired(&svc(i).id).is_ok(), i % 2 == 1, "s{i}");
    }
}

#[test]
fn draining_endpoints_stay_with_the_scopes_they_served_and_never_count_as_local() {
    let mut svc = lb("web", 30080);
    svc.cluster_ips = svc.cluster_ips[..1].into();
    svc.external_policy = TrafficPolicy::Local;
    svc.health_check_node_port = Some(32000);
    let mut store = web_store(svc);
    let mut dirty = BTreeSet::new();
    // Graceful shutdown of both: readiness flipped, still terminating.
    let mut s = slice(
        "web-v4",
        IpFamily::V4,
        &[
            ("10.0.0.1", "node-1", false),
            ("10.0.0.2", "node-2", false),
            ("10.0.0.3", "node-2", true),
        ],
    );
    for ep in &mut s.endpoints[..2] {
        ep.serving = false;
    }
    store.apply(Change::slice(s), &mut dirty);
    let d = store.desired(&ServiceId::new("default", "web")).unwrap();
    let np = |scope| node_port_backends(&d, scope);
    // From outside only the local endpoint ever served: it drains there.
    assert_eq!(
        np(Scope::External),
        [(ip("10.0.0.1"), BackendState::Draining)]
    );
    assert_eq!(
        np(Scope::All),
        [
            (ip("10.0.0.1"), BackendState::Draining),
            (ip("10.0.0.2"), BackendState::Draining),
            (ip("10.0.0.3"), BackendState::Active)
        ]
    );
    // A draining local endpoint is no reason for the LB to send traffic here.
    assert_eq!(d.health_check.unwrap().local_endpoints, 0);
}

#[test]
fn maglev_tables_go_where_packets_from_outside_pick() {
    let table = |store: &Store| -> Vec<(FrontendKind, Scope, Option<u32>)> {
        let mut v: Vec<_> = store
            .desired(&ServiceId::new("default", "web"))
            .unwrap()
            .frontends
            .iter()
            .filter(|d| IpFamily::of(&d.frontend.addr) == IpFamily::V4)
            .map(|d| (d.kind, d.frontend.scope, d.maglev))
            .collect();
        v.sort_by_key(|(k, s, _)| (*k as u8, *s as u8));
        v
    };
    let lb_options = |algorithm| StoreOptions {
        lb: LbOptions {
            algorithm,
            maglev_table_size: 509,
        },
        ..StoreOptions::default()
    };
    let store_with = |svc: ServiceSpec, options| {
        let mut store = Store::with_options(node(), options);
        store.apply(Change::service(svc), &mut BTreeSet::new());
        store
    };
    use crate::model::LbAlgorithm::{Maglev, Random};
    use FrontendKind::*;

    // The agent's default, for every external frontend; never ClusterIP.
    let s = store_with(lb("web", 30_080), lb_options(Maglev));
    assert_eq!(
        table(&s),
        [
            (ClusterIp, Scope::All, None),
            (NodePort, Scope::All, Some(509)),
            (ExternalIp, Scope::All, Some(509)),
            (LoadBalancer, Scope::All, Some(509)),
        ]
    );
    // The annotation wins, either way.
    let off = ServiceSpec {
        lb_algorithm: Some(Random),
        ..lb("web", 30_080)
    };
    assert!(
        table(&store_with(off, lb_options(Maglev)))
            .iter()
            .all(|t| t.2.is_none())
    );
    let on = ServiceSpec {
        lb_algorithm: Some(Maglev),
        external_policy: TrafficPolicy::Local,
        ..lb("web", 30_080)
    };
    // eTP=Local: only the local view, which packets from outside use.
    let s = store_with(on, lb_options(Random));
    assert!(table(&s).contains(&(LoadBalancer, Scope::External, Some(509))));
    assert!(table(&s).contains(&(LoadBalancer, Scope::All, None)));
    assert!(table(&s).contains(&(NodePort, Scope::All, None)));
}
