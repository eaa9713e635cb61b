//! The labels map behind the plans: what `inspect` reads to name frontends.
use std::{net::IpAddr, sync::Arc};

use super::tests::ROOMY;
use super::*;
use crate::maps::{fake::FakeMaps, labels::LabelView};
use crate::model::{Backend, BackendState, FrontendKind, Protocol};

fn fe(last: u8, port: u16) -> Frontend {
    Frontend::new(IpAddr::from([10, 96, 0, last]), port, Protocol::Tcp)
}

fn want(frontend: Frontend, port_name: &str, kind: FrontendKind) -> DesiredFrontend {
    let backend = Backend {
        addr: IpAddr::from([10, 1, 0, 1]),
        port: 8080,
        state: BackendState::Active,
    };
    DesiredFrontend {
        kind,
        port_name: Arc::from(port_name),
        ..DesiredFrontend::plain(frontend, vec![backend])
    }
}

fn svc(name: &str) -> ServiceId {
    ServiceId::new("shop", name)
}

/// Each label the maps hold, as `inspect` shows it, by rev-NAT id.
fn labels(maps: &FakeMaps) -> Vec<(u32, String, &'static str)> {
    maps.labels
        .iter()
        .map(|(id, l)| {
            let v = LabelView::decode(l).expect("a label the agent wrote");
            (*id, v.service_port(), v.kind)
        })
        .collect()
}

fn reconciler() -> Reconciler<FakeMaps> {
    Reconciler::restore(FakeMaps::new(ROOMY)).unwrap()
}

#[test]
fn each_frontend_is_labelled_with_its_service_port_and_type_until_it_goes() {
    let mut rec = reconciler();
    let web = [
        want(fe(1, 80), "http", FrontendKind::ClusterIp),
        want(fe(200, 30080), "http", FrontendKind::NodePort),
    ];
    rec.sync_service(&svc("web"), &web).unwrap();
    rec.sync_service(
        &svc("db"),
        &[want(fe(2, 5432), "", FrontendKind::ClusterIp)],
    )
    .unwrap();
    // Written behind the plans, at the end of the controller's batch.
    assert!(rec.maps().labels.is_empty());
    rec.flush_labels();
    assert_eq!(
        labels(rec.maps()),
        [
            (1, "shop/web:http".to_owned(), "ClusterIP"),
            (2, "shop/web:http".to_owned(), "NodePort"),
            (3, "shop/db".to_owned(), "ClusterIP"),
        ]
    );
    // The rev-NAT ids are those the services map names.
    let state = rec.maps().state.clone();
    assert_eq!(state.revnat.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);

    // The NodePort goes, and its id is reused by a new Service: the label
    // follows the id's new owner.
    rec.sync_service(&svc("web"), &web[..1]).unwrap();
    rec.flush_labels();
    assert_eq!(labels(rec.maps()).len(), 2);
    rec.sync_service(
        &svc("api"),
        &[want(fe(3, 443), "https", FrontendKind::LoadBalancer)],
    )
    .unwrap();
    rec.sync_service(&svc("db"), &[]).unwrap();
    rec.flush_labels();
    assert_eq!(
        labels(rec.maps()),
        [
            (1, "shop/web:http".to_owned(), "ClusterIP"),
            (2, "shop/api:https".to_owned(), "LoadBalancer"),
        ]
    );
}

#[test]
fn a_restart_with_nothing_changed_rewrites_no_label_and_drops_stray_ones() {
    let mut rec = reconciler();
    let web = [want(fe(1, 80), "http", FrontendKind::ClusterIp)];
    let db = [want(fe(2, 5432), "pg", FrontendKind::ClusterIp)];
    rec.sync_service(&svc("web"), &web).unwrap();
    rec.sync_service(&svc("db"), &db).unwrap();
    rec.flush_labels();

    // The restarted agent finds one label whose frontend is gone.
    let mut maps = rec.maps().clone();
    let stray = maps.labels[&1];
    maps.labels.insert(77, stray);
    maps.label_writes = 0;
    let mut rec = Reconciler::restore(maps).unwrap();
    assert_eq!(rec.maps().label_writes, 1, "the stray label is deleted");
    rec.sync_service(&svc("web"), &web).unwrap();
    rec.sync_service(&svc("db"), &db).unwrap();
    rec.flush_labels();
    assert_eq!(
        rec.maps().label_writes,
        1,
        "an unchanged label was rewritten"
    );
    assert_eq!(rec.maps().labels.len(), 2);

    // A renamed port is relabelled, in place.
    let db = [want(fe(2, 5432), "postgres", FrontendKind::ClusterIp)];
    rec.sync_service(&svc("db"), &db).unwrap();
    rec.flush_labels();
    assert_eq!(rec.maps().label_writes, 2);
    assert_eq!(labels(rec.maps())[1].1, "shop/db:postgres");
}

#[test]
fn failed_label_writes_are_retried_and_never_touch_the_datapath() {
    let mut rec = reconciler();
    rec.maps_mut().fail_labels = true;
    rec.sync_service(
        &svc("web"),
        &[want(fe(1, 80), "http", FrontendKind::ClusterIp)],
    )
    .unwrap();
    rec.flush_labels();
    // The frontend serves; only its label waits.
    assert_eq!(rec.maps().state.revnat.len(), 1);
    assert!(rec.maps().labels.is_empty());
    assert_eq!(rec.labels.pending(), 1);

    rec.maps_mut().fail_labels = false;
    rec.flush_labels();
    assert_eq!(labels(rec.maps())[0].1, "shop/web:http");
    assert_eq!(rec.labels.pending(), 0);
}
