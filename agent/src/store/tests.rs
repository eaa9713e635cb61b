use std::net::Ipv4Addr;

use super::*;
use crate::model::{EndpointSpec, Protocol, ServicePortSpec, SlicePortSpec};

fn svc(name: &str, ip: [u8; 4]) -> ServiceSpec {
    ServiceSpec {
        id: ServiceId::new("default", name),
        cluster_ips: vec![Ipv4Addr::from(ip)],
        ports: vec![ServicePortSpec {
            name: "http".into(),
            port: 80,
            proto: Protocol::Tcp,
        }],
    }
}

fn slice(name: &str, service: &str, eps: &[(u8, bool, bool, bool)]) -> SliceSpec {
    SliceSpec {
        id: SliceId {
            namespace: "default".into(),
            name: name.into(),
        },
        service: ServiceId::new("default", service),
        ports: vec![SlicePortSpec {
            name: "http".into(),
            port: 8080,
            proto: Protocol::Tcp,
        }],
        endpoints: eps
            .iter()
            .map(|&(last, ready, serving, terminating)| EndpointSpec {
                addrs: vec![Ipv4Addr::new(10, 0, 0, last)],
                ready,
                serving,
                terminating,
            })
            .collect(),
    }
}

#[test]
fn slice_before_service_takes_effect_when_service_appears() {
    let mut store = Store::default();
    let mut dirty = BTreeSet::new();
    store.apply(
        Change::UpsertSlice(slice("a-1", "a", &[(1, true, true, false)])),
        &mut dirty,
    );
    let id = ServiceId::new("default", "a");
    assert!(store.frontends(&id).is_empty());
    store.apply(Change::UpsertService(svc("a", [10, 96, 0, 1])), &mut dirty);
    let fe = store.frontends(&id);
    assert_eq!(fe.len(), 1);
    assert_eq!(fe[0].backends.len(), 1);
    assert_eq!(fe[0].backends[0].port, 8080);
}

#[test]
fn states_follow_kep_1669_and_duplicates_keep_best_state() {
    let mut store = Store::default();
    let mut dirty = BTreeSet::new();
    store.apply(Change::UpsertService(svc("a", [10, 96, 0, 1])), &mut dirty);
    store.apply(
        Change::UpsertSlice(slice(
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
        Change::UpsertSlice(slice("a-2", "a", &[(2, true, true, false)])),
        &mut dirty,
    );
    let fe = store.frontends(&ServiceId::new("default", "a"));
    let states: Vec<_> = fe[0]
        .backends
        .iter()
        .map(|b| (b.addr.octets()[3], b.state))
        .collect();
    assert_eq!(
        states,
        vec![(1, BackendState::Active), (2, BackendState::Active)]
    );
    store.apply(
        Change::DeleteSlice(SliceId {
            namespace: "default".into(),
            name: "a-2".into(),
        }),
        &mut dirty,
    );
    let fe = store.frontends(&ServiceId::new("default", "a"));
    let states: Vec<_> = fe[0]
        .backends
        .iter()
        .map(|b| (b.addr.octets()[3], b.state))
        .collect();
    // Endpoint 3 is not serving and is never a backend.
    assert_eq!(
        states,
        vec![(1, BackendState::Active), (2, BackendState::Terminating)]
    );
}

#[test]
fn unchanged_upsert_marks_nothing_dirty() {
    let mut store = Store::default();
    let mut dirty = BTreeSet::new();
    store.apply(Change::UpsertService(svc("a", [10, 96, 0, 1])), &mut dirty);
    dirty.clear();
    store.apply(Change::UpsertService(svc("a", [10, 96, 0, 1])), &mut dirty);
    assert!(dirty.is_empty());
}

#[test]
fn slice_moving_to_another_service_dirties_both() {
    let mut store = Store::default();
    let mut dirty = BTreeSet::new();
    store.apply(
        Change::UpsertSlice(slice("s", "a", &[(1, true, true, false)])),
        &mut dirty,
    );
    dirty.clear();
    store.apply(
        Change::UpsertSlice(slice("s", "b", &[(1, true, true, false)])),
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
