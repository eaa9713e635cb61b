use std::net::IpAddr;

use super::*;
use crate::model::{
    BackendState, EndpointMeta, EndpointSpec, IpFamily, Protocol, ServicePortSpec, SlicePortSpec,
    TrafficPolicy,
};

fn last_octet(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(v4) => v4.octets()[3],
        IpAddr::V6(v6) => v6.octets()[15],
    }
}

fn svc(name: &str, ip: [u8; 4]) -> ServiceSpec {
    ServiceSpec {
        id: ServiceId::new("default", name),
        cluster_ips: vec![IpAddr::from(ip)].into(),
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

fn slice(name: &str, service: &str, eps: &[(u8, bool, bool, bool)]) -> SliceSpec {
    SliceSpec {
        id: SliceId::new("default", name),
        service: ServiceId::new("default", service),
        family: IpFamily::V4,
        ports: vec![SlicePortSpec {
            name: "http".into(),
            port: 8080,
            proto: Protocol::Tcp,
        }]
        .into(),
        endpoints: eps
            .iter()
            .map(|&(last, ready, serving, terminating)| EndpointSpec {
                addr: IpAddr::from([10, 0, 0, last]),
                ready,
                serving,
                terminating,
                meta: None,
            })
            .collect(),
    }
}

#[test]
fn slice_before_service_takes_effect_when_service_appears() {
    let mut store = Store::default();
    let mut dirty = BTreeSet::new();
    store.apply(
        Change::slice(slice("a-1", "a", &[(1, true, true, false)])),
        &mut dirty,
    );
    let id = ServiceId::new("default", "a");
    assert!(store.frontends(&id).is_empty());
    store.apply(Change::service(svc("a", [10, 96, 0, 1])), &mut dirty);
    let fe = store.frontends(&id);
    assert_eq!(fe.len(), 1);
    assert_eq!(fe[0].backends.len(), 1);
    assert_eq!(fe[0].backends[0].port, 8080);
}

#[test]
fn states_follow_kep_1669_and_duplicates_keep_best_state() {
    let mut store = Store::default();
    let mut dirty = BTreeSet::new();
    store.apply(Change::service(svc("a", [10, 96, 0, 1])), &mut dirty);
    store.apply(
        Change::slice(slice(
            "a-1",
            "a",
            &[
                (1, true, true, false),
                (2, false, true, true),
                (3, false, false, true),
            ],
        )),
        &mut dirty,
    );
    // Endpoint 2 shows up again, ready, in a second slice.
    store.apply(
        Change::slice(slice("a-2", "a", &[(2, true, true, false)])),
        &mut dirty,
    );
    let fe = store.frontends(&ServiceId::new("default", "a"));
    let states: Vec<_> = fe[0]
        .backends
        .iter()
        .map(|b| (last_octet(b.addr), b.state))
        .collect();
    // Endpoint 3 stopped serving while terminating: it drains.
    assert_eq!(
        states,
        vec![
            (1, BackendState::Active),
            (2, BackendState::Active),
            (3, BackendState::Draining)
        ]
    );
    store.apply(
        Change::DeleteSlice(SliceId::new("default", "a-2")),
        &mut dirty,
    );
    let fe = store.frontends(&ServiceId::new("default", "a"));
    let states: Vec<_> = fe[0]
        .backends
        .iter()
        .map(|b| (last_octet(b.addr), b.state))
        .collect();
    // Endpoint 3 is not serving: never picked, only kept for its flows.
    assert_eq!(
        states,
        vec![
            (1, BackendState::Active),
            (2, BackendState::Terminating),
            (3, BackendState::Draining)
        ]
    );
}

#[test]
fn unchanged_upsert_marks_nothing_dirty() {
    let mut store = Store::default();
    let mut dirty = BTreeSet::new();
    store.apply(Change::service(svc("a", [10, 96, 0, 1])), &mut dirty);
    dirty.clear();
    store.apply(Change::service(svc("a", [10, 96, 0, 1])), &mut dirty);
    assert!(dirty.is_empty());
}

#[test]
fn slice_moving_to_another_service_dirties_both() {
    let mut store = Store::default();
    let mut dirty = BTreeSet::new();
    store.apply(
        Change::slice(slice("s", "a", &[(1, true, true, false)])),
        &mut dirty,
    );
    dirty.clear();
    store.apply(
        Change::slice(slice("s", "b", &[(1, true, true, false)])),
        &mut dirty,
    );
    assert_eq!(
        dirty.into_iter().collect::<Vec<_>>(),
        vec![
            ServiceId::new("default", "a"),
            ServiceId::new("default", "b")
        ]
    );
}

/// Endpoints 10.0.0.N on `node-N % 2`, zone hint "zone-a" for odd N.
fn topo_slice(eps: &[(u8, bool)], zone_hints: bool) -> SliceSpec {
    let mut s = slice("t-1", "t", &[]);
    s.endpoints = eps
        .iter()
        .map(|&(last, ready)| EndpointSpec {
            addr: IpAddr::from([10, 0, 0, last]),
            ready,
            serving: true,
            terminating: !ready,
            meta: EndpointMeta {
                node_name: Some(format!("node-{}", last % 2).into()),
                zone_hints: if zone_hints {
                    vec![if last % 2 == 1 { "zone-a" } else { "zone-b" }.into()]
                } else {
                    Vec::new()
                },
                ..EndpointMeta::default()
            }
            .shared(),
        })
        .collect();
    s
}

fn addrs(store: &Store, id: &ServiceId) -> Vec<(u8, BackendState)> {
    store.frontends(id)[0]
        .backends
        .iter()
        .map(|b| (last_octet(b.addr), b.state))
        .collect()
}

fn node(name: &str, zone: Option<&str>) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        zone: zone.map(Into::into),
        addresses: Vec::new(),
        ..NodeInfo::default()
    }
}

#[test]
fn internal_traffic_policy_local_uses_only_this_nodes_endpoints_and_never_falls_back() {
    use BackendState::{Active, Terminating};
    let mut store = Store::new(node("node-1", None));
    let mut dirty = BTreeSet::new();
    let mut svc = svc("t", [10, 96, 0, 9]);
    svc.internal_policy = TrafficPolicy::Local;
    store.apply(Change::service(svc), &mut dirty);
    store.apply(
        Change::slice(topo_slice(&[(1, true), (2, true), (3, false)], false)),
        &mut dirty,
    );
    let id = ServiceId::new("default", "t");
    // 1 and 3 are on node-1; 3 is terminating, kept for the datapath's fallback.
    assert_eq!(addrs(&store, &id), vec![(1, Active), (3, Terminating)]);

    // On node-0 only endpoint 2 is local.
    dirty.clear();
    store.apply(Change::Node(node("node-0", None)), &mut dirty);
    assert!(dirty.contains(&id), "a node change re-plans every Service");
    assert_eq!(addrs(&store, &id), vec![(2, Active)]);

    // A node with no endpoint gets none: refused, not sent elsewhere.
    store.apply(Change::Node(node("node-9", None)), &mut dirty);
    assert!(store.frontends(&id)[0].backends.is_empty());
}

#[test]
fn zone_hints_narrow_to_this_zone_and_fall_back_as_kube_proxy_does() {
    let id = ServiceId::new("default", "t");
    let mut dirty = BTreeSet::new();
    let mut store = Store::new(node("node-1", Some("zone-a")));
    store.apply(Change::service(svc("t", [10, 96, 0, 9])), &mut dirty);
    store.apply(
        Change::slice(topo_slice(&[(1, true), (2, true), (3, true)], true)),
        &mut dirty,
    );
    let only = |v: Vec<(u8, BackendState)>| v.into_iter().map(|(a, _)| a).collect::<Vec<_>>();
    assert_eq!(
        only(addrs(&store, &id)),
        vec![1, 3],
        "zone-a endpoints only"
    );

    store.apply(Change::Node(node("node-1", Some("zone-b"))), &mut dirty);
    assert_eq!(only(addrs(&store, &id)), vec![2]);

    // A zone no hint names, or a node without a zone label: every endpoint.
    store.apply(Change::Node(node("node-1", Some("zone-c"))), &mut dirty);
    assert_eq!(only(addrs(&store, &id)), vec![1, 2, 3]);
    store.apply(Change::Node(node("node-1", None)), &mut dirty);
    assert_eq!(only(addrs(&store, &id)), vec![1, 2, 3]);

    // One ready endpoint without hints disables hints for the Service.
    store.apply(Change::Node(node("node-1", Some("zone-a"))), &mut dirty);
    let mut s = topo_slice(&[(1, true), (2, true), (3, true)], true);
    s.endpoints[1].edit_meta(|m| m.zone_hints.clear());
    store.apply(Change::slice(s), &mut dirty);
    assert_eq!(only(addrs(&store, &id)), vec![1, 2, 3]);

    // A not-ready endpoint without hints does not count.
    let mut s = topo_slice(&[(1, true), (2, false), (3, true)], true);
    s.endpoints[1].edit_meta(|m| m.zone_hints.clear());
    store.apply(Change::slice(s), &mut dirty);
    assert_eq!(only(addrs(&store, &id)), vec![1, 3]);
}

#[test]
fn node_hints_win_over_zone_hints() {
    let id = ServiceId::new("default", "t");
    let mut dirty = BTreeSet::new();
    let mut store = Store::new(node("node-1", Some("zone-a")));
    store.apply(Change::service(svc("t", [10, 96, 0, 9])), &mut dirty);
    let mut s = topo_slice(&[(1, true), (2, true), (3, true)], true);
    for ep in &mut s.endpoints {
        ep.edit_meta(|m| m.node_hints = m.node_name.iter().map(|n| n.to_string()).collect());
    }
    store.apply(Change::slice(s), &mut dirty);
    let got: Vec<u8> = addrs(&store, &id).into_iter().map(|(a, _)| a).collect();
    assert_eq!(got, vec![1, 3], "both on node-1 by hint");
}

#[test]
fn draining_endpoints_are_narrowed_like_the_ones_they_were() {
    use BackendState::{Active, Draining};
    let draining = |s: &mut SliceSpec, i: usize| {
        let ep = &mut s.endpoints[i];
        (ep.ready, ep.serving, ep.terminating) = (false, false, true);
    };
    let id = ServiceId::new("default", "t");
    let mut dirty = BTreeSet::new();

    // internalTrafficPolicy: Local: only this node's draining endpoint.
    let mut store = Store::new(node("node-1", None));
    let mut local = svc("t", [10, 96, 0, 9]);
    local.internal_policy = TrafficPolicy::Local;
    store.apply(Change::service(local), &mut dirty);
    let mut s = topo_slice(&[(1, true), (2, true), (3, true), (4, true)], false);
    draining(&mut s, 2);
    draining(&mut s, 3);
    store.apply(Change::slice(s), &mut dirty);
    assert_eq!(addrs(&store, &id), vec![(1, Active), (3, Draining)]);

    // Zone hints: a draining endpoint hinted for another zone is not ours;
    // one whose hints were dropped (they go when it stops being ready) may
    // have served us and is kept; neither decides whether hints apply.
    let mut store = Store::new(node("node-1", Some("zone-a")));
    store.apply(Change::service(svc("t", [10, 96, 0, 9])), &mut dirty);
    let mut s = topo_slice(
        &[(1, true), (2, true), (3, true), (4, true), (5, true)],
        true,
    );
    draining(&mut s, 2);
    draining(&mut s, 3);
    draining(&mut s, 4);
    s.endpoints[4].edit_meta(|m| m.zone_hints.clear());
    store.apply(Change::slice(s), &mut dirty);
    assert_eq!(
        addrs(&store, &id),
        vec![(1, Active), (3, Draining), (5, Draining)]
    );
}
