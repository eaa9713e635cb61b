//! Frontends two Services ask for: an external IP never takes another
//! Service's cluster or load-balancer IP, anything else goes to the oldest
//! claim, and neither depends on the order the Services arrive in.
use std::{collections::BTreeSet, net::IpAddr};

use super::*;
use crate::model::{ServicePortSpec, ServiceType};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn node() -> NodeInfo {
    NodeInfo {
        name: "node-1".into(),
        zone: None,
        addresses: vec![ip("192.168.0.10")],
        ..NodeInfo::default()
    }
}

/// `default/<name>`: ClusterIP `vip` on TCP 80, created at `created`.
fn svc(name: &str, vip: &str, created: i64) -> ServiceSpec {
    ServiceSpec {
        id: ServiceId::new("default", name),
        created: Some(created),
        cluster_ips: vec![ip(vip)].into(),
        ports: vec![ServicePortSpec {
            name: "http".into(),
            port: 80,
            proto: Protocol::Tcp,
            node_port: None,
        }]
        .into(),
        ..ServiceSpec::default()
    }
}

fn with_external(mut s: ServiceSpec, ips: &[&str]) -> ServiceSpec {
    s.external_ips = ips.iter().map(|i| ip(i)).collect();
    s
}

/// The store after applying `services` in order, and what became dirty.
fn store_of(services: &[ServiceSpec]) -> (Store, BTreeSet<ServiceId>) {
    let mut store = Store::new(node());
    let mut dirty = BTreeSet::new();
    for s in services {
        store.apply(Change::service(s.clone()), &mut dirty);
    }
    (store, dirty)
}

/// The `addr:port/proto` of every frontend `name` gets.
fn served(store: &Store, name: &str) -> Vec<String> {
    let mut v: Vec<String> = store
        .frontends(&ServiceId::new("default", name))
        .iter()
        .map(|d| d.frontend.to_string())
        .collect();
    v.sort();
    v.dedup();
    v
}

fn refused(store: &Store, name: &str) -> Vec<StoreError> {
    store
        .desired(&ServiceId::new("default", name))
        .expect("valid")
        .refused
}

#[test]
fn an_external_ip_on_another_services_cluster_ip_is_refused_whatever_the_age_or_order() {
    // `aaa-evil` is older and sorts first: neither helps it.
    let victim = svc("victim", "10.96.0.10", 2_000);
    let evil = with_external(
        svc("aaa-evil", "10.96.0.20", 1_000),
        &["10.96.0.10", "192.0.2.9"],
    );
    for order in [
        [victim.clone(), evil.clone()],
        [evil.clone(), victim.clone()],
    ] {
        let (store, _) = store_of(&order);
        assert_eq!(served(&store, "victim"), ["10.96.0.10:80/TCP"]);
        // Evil keeps its own cluster IP and its other external IP.
        assert_eq!(
            served(&store, "aaa-evil"),
            ["10.96.0.20:80/TCP", "192.0.2.9:80/TCP"]
        );
        let r = refused(&store, "aaa-evil");
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(r[0].field(), "spec.externalIPs[0]");
        let msg = r[0].to_string();
        assert!(
            msg.contains("10.96.0.10 is the cluster IP of Service default/victim"),
            "{msg}"
        );
        assert!(refused(&store, "victim").is_empty());
    }
}

#[test]
fn an_external_ip_on_another_services_load_balancer_ip_is_refused() {
    let mut victim = svc("victim", "10.96.0.10", 2_000);
    victim.kind = ServiceType::LoadBalancer;
    victim.lb_ips = vec![ip("198.51.100.1")].into();
    let evil = with_external(svc("aaa-evil", "10.96.0.20", 1_000), &["198.51.100.1"]);
    let (store, _) = store_of(&[evil, victim]);
    assert_eq!(
        served(&store, "victim"),
        ["10.96.0.10:80/TCP", "198.51.100.1:80/TCP"]
    );
    assert_eq!(served(&store, "aaa-evil"), ["10.96.0.20:80/TCP"]);
    let msg = refused(&store, "aaa-evil")[0].to_string();
    assert!(
        msg.contains("198.51.100.1 is the load-balancer IP of Service default/victim"),
        "{msg}"
    );
}

#[test]
fn a_cluster_ip_appearing_or_going_marks_the_external_ip_services_on_it() {
    let evil = with_external(svc("evil", "10.96.0.20", 1_000), &["10.96.0.10"]);
    let (mut store, _) = store_of(&[evil]);
    assert_eq!(
        served(&store, "evil"),
        ["10.96.0.10:80/TCP", "10.96.0.20:80/TCP"],
        "nobody's cluster IP yet"
    );
    let mut dirty = BTreeSet::new();
    store.apply(
        Change::service(svc("victim", "10.96.0.10", 2_000)),
        &mut dirty,
    );
    assert!(
        dirty.contains(&ServiceId::new("default", "evil")),
        "{dirty:?}"
    );
    assert_eq!(served(&store, "evil"), ["10.96.0.20:80/TCP"]);
    let mut dirty = BTreeSet::new();
    store.apply(
        Change::DeleteService(ServiceId::new("default", "victim")),
        &mut dirty,
    );
    assert!(
        dirty.contains(&ServiceId::new("default", "evil")),
        "{dirty:?}"
    );
    assert_eq!(served(&store, "evil").len(), 2);
    assert!(refused(&store, "evil").is_empty());
}

#[test]
fn a_shared_external_ip_goes_to_the_oldest_service_whatever_the_order() {
    let old = with_external(svc("zzz-old", "10.96.0.30", 1_000), &["192.0.2.50"]);
    let young = with_external(svc("aaa-young", "10.96.0.31", 2_000), &["192.0.2.50"]);
    for order in [[old.clone(), young.clone()], [young.clone(), old.clone()]] {
        let (store, _) = store_of(&order);
        assert_eq!(
            served(&store, "zzz-old"),
            ["10.96.0.30:80/TCP", "192.0.2.50:80/TCP"]
        );
        assert_eq!(served(&store, "aaa-young"), ["10.96.0.31:80/TCP"]);
        let r = refused(&store, "aaa-young");
        assert_eq!(r[0].field(), "spec.externalIPs[0]");
        let msg = r[0].to_string();
        assert!(
            msg.contains("192.0.2.50:80/TCP is already served by Service default/zzz-old"),
            "{msg}"
        );
    }
    // The owner goes: the younger one gets it, and is told to sync.
    let (mut store, _) = store_of(&[old, young]);
    let mut dirty = BTreeSet::new();
    store.apply(
        Change::DeleteService(ServiceId::new("default", "zzz-old")),
        &mut dirty,
    );
    assert!(dirty.contains(&ServiceId::new("default", "aaa-young")));
    assert_eq!(served(&store, "aaa-young").len(), 2);
}

#[test]
fn an_older_service_that_is_rejected_or_refused_holds_nothing() {
    // Rejected (its node port is out of range): no frontend at all.
    let mut bad = with_external(svc("bad", "10.96.0.40", 100), &["192.0.2.60"]);
    bad.kind = ServiceType::NodePort;
    bad.ports[0].node_port = Some(80);
    let young = with_external(svc("young", "10.96.0.41", 2_000), &["192.0.2.60"]);
    let (store, _) = store_of(&[bad, young]);
    assert_eq!(served(&store, "young").len(), 2);

    // An older external IP on the victim's cluster IP is no claim on it.
    let victim = svc("victim", "10.96.0.10", 2_000);
    let evil = with_external(svc("evil", "10.96.0.20", 100), &["10.96.0.10"]);
    let (store, _) = store_of(&[evil, victim]);
    assert!(refused(&store, "victim").is_empty());
    assert_eq!(served(&store, "victim"), ["10.96.0.10:80/TCP"]);
}

#[test]
fn a_service_rejected_for_a_node_port_stops_holding_its_address_frontends() {
    // "a" holds an external IP "c" also lists. When an older Service takes
    // "a"'s node port, "a" is rejected and holds nothing: "c" must be told
    // to sync, and gets the address.
    let mut a = with_external(svc("a", "10.96.0.50", 200), &["192.0.2.70"]);
    a.kind = ServiceType::NodePort;
    a.ports[0].node_port = Some(30_080);
    let c = with_external(svc("c", "10.96.0.52", 300), &["192.0.2.70"]);
    let (mut store, _) = store_of(&[a, c]);
    assert_eq!(served(&store, "c"), ["10.96.0.52:80/TCP"]);
    let mut oldest = svc("oldest", "10.96.0.51", 100);
    oldest.kind = ServiceType::NodePort;
    oldest.ports[0].node_port = Some(30_080);
    let mut dirty = BTreeSet::new();
    store.apply(Change::service(oldest), &mut dirty);
    assert!(dirty.contains(&ServiceId::new("default", "c")), "{dirty:?}");
    assert_eq!(
        served(&store, "c"),
        ["10.96.0.52:80/TCP", "192.0.2.70:80/TCP"]
    );
}
