//! Controller tests over in-memory maps: rejections, conflicts, health and
//! the UDP backends whose sockets are destroyed.
use std::net::IpAddr;

use super::*;
use crate::{
    maps::{Capacity, MapName, fake::FakeMaps},
    model::{
        Backend, BackendState, DesiredFrontend, EndpointSpec, Frontend, IpFamily, NodeInfo,
        ServicePortSpec, ServiceSpec, ServiceType, SliceId, SlicePortSpec, SliceSpec,
    },
    store::{Change, StoreOptions},
};

fn controller(reports: Reports) -> Controller<FakeMaps> {
    let cap = Capacity {
        services: 64,
        backends: 64,
        revnat: 64,
        src_ranges: 64,
        maglev: 64,
    };
    let rec = Reconciler::restore(FakeMaps::new(cap)).unwrap();
    let node = NodeInfo {
        name: "n".into(),
        zone: None,
        addresses: vec!["192.168.0.1".parse().unwrap()],
        ..NodeInfo::default()
    };
    let store = Store::with_options(node, StoreOptions::default());
    Controller::new(
        rec,
        store,
        Hooks {
            reports,
            ..Hooks::default()
        },
    )
}

fn node_port_svc(name: &str, ip: [u8; 4], node_port: u16) -> ServiceSpec {
    ServiceSpec {
        id: ServiceId::new("default", name),
        kind: ServiceType::NodePort,
        cluster_ips: vec![IpAddr::from(ip)].into(),
        ports: vec![ServicePortSpec {
            name: "".into(),
            port: 80,
            proto: Protocol::Tcp,
            node_port: Some(node_port),
        }]
        .into(),
        ..ServiceSpec::default()
    }
}

#[test]
fn rejected_service_is_reported_once_and_others_are_programmed() {
    let (reports, mut rx) = Reports::channel(16);
    let mut ctl = controller(reports);
    let mut dirty = BTreeSet::new();
    ctl.handle(
        SourceMsg::Changes(vec![
            Change::service(node_port_svc("bad", [10, 96, 0, 1], 80)),
            Change::service(node_port_svc("good", [10, 96, 0, 2], 30_080)),
        ]),
        &mut dirty,
    );
    ctl.sync(dirty.clone());
    // ClusterIP and one NodePort frontend of the good Service only.
    assert_eq!(ctl.reconciler.frontend_count(), 2);
    let Ok(Report::Failed {
        service,
        reason,
        message,
    }) = rx.try_recv()
    else {
        panic!("no report");
    };
    assert_eq!(service, ServiceId::new("default", "bad"));
    assert_eq!(reason, Reason::InvalidService);
    assert!(message.contains("spec.ports[0].nodePort"), "{message}");
    // Retrying the same rejection is quiet.
    ctl.sync(dirty);
    assert!(rx.try_recv().is_err());

    // Fixed: programmed, and the failure is cleared.
    let mut dirty = BTreeSet::new();
    ctl.handle(
        SourceMsg::Changes(vec![Change::service(node_port_svc(
            "bad",
            [10, 96, 0, 1],
            30_081,
        ))]),
        &mut dirty,
    );
    ctl.sync(dirty);
    assert_eq!(ctl.reconciler.frontend_count(), 4);
    assert!(matches!(
        rx.try_recv(),
        Ok(Report::Recovered {
            stage: Stage::Validation,
            ..
        })
    ));
}

#[test]
fn node_port_handed_to_the_older_service_in_one_batch_needs_no_retry() {
    let (reports, mut rx) = Reports::channel(16);
    let mut ctl = controller(reports);
    let mut dirty = BTreeSet::new();
    // The younger "z" owns 30080 first; then the older "a" arrives and
    // takes it. The batch syncs "a" before "z" has released the port, so
    // "a" conflicts on its first try.
    let mut z = node_port_svc("z", [10, 96, 0, 2], 30_080);
    z.created = Some(200);
    ctl.handle(SourceMsg::Changes(vec![Change::service(z)]), &mut dirty);
    ctl.sync(std::mem::take(&mut dirty));
    let mut a = node_port_svc("a", [10, 96, 0, 1], 30_080);
    a.created = Some(100);
    ctl.handle(SourceMsg::Changes(vec![Change::service(a)]), &mut dirty);
    assert_eq!(dirty.len(), 2);
    ctl.sync(dirty);
    assert!(ctl.failed.is_empty(), "{:?}", ctl.failed);
    assert!(ctl.last_error.is_empty(), "{:?}", ctl.last_error);
    assert_eq!(ctl.reconciler.frontend_count(), 2);
    let Ok(Report::Failed {
        service, reason, ..
    }) = rx.try_recv()
    else {
        panic!("no report");
    };
    assert_eq!(
        (service, reason),
        (ServiceId::new("default", "z"), Reason::InvalidService)
    );
    assert!(rx.try_recv().is_err());
}

fn udp(backends: &[(u8, BackendState)]) -> DesiredService {
    udp_at(53, backends)
}

/// A UDP Service on ClusterIP `10.96.0.<vip>:53` over `10.0.0.<h>:5353`.
fn udp_at(vip: u8, backends: &[(u8, BackendState)]) -> DesiredService {
    let fe = Frontend {
        addr: IpAddr::from([10, 96, 0, vip]),
        port: 53,
        proto: Protocol::Udp,
        scope: crate::model::Scope::All,
    };
    let b = backends
        .iter()
        .map(|&(h, state)| Backend {
            addr: IpAddr::from([10, 0, 0, h]),
            port: 5353,
            state,
        })
        .collect();
    DesiredService {
        frontends: vec![DesiredFrontend::plain(fe, b)],
        ..DesiredService::default()
    }
}

/// The pair of frontend `10.96.0.<vip>:53` and backend `10.0.0.<h>:5353`.
fn pair(vip: u8, h: u8) -> UdpPair {
    UdpPair {
        frontend: SocketAddr::from(([10, 96, 0, vip], 53)),
        backend: SocketAddr::from(([10, 0, 0, h], 5353)),
    }
}

#[test]
fn udp_pairs_gone_are_the_backends_a_frontend_no_longer_serves() {
    use BackendState::{Active, Draining, Terminating};
    let mut ctl = controller(Reports::none());
    let id = ServiceId::new("kube-system", "dns");
    assert!(
        ctl.udp_pairs_gone(&id, &udp(&[(1, Active), (2, Active)]))
            .is_empty()
    );
    // Terminating but serving still gets traffic: not gone.
    assert!(
        ctl.udp_pairs_gone(&id, &udp(&[(1, Active), (2, Terminating)]))
            .is_empty()
    );
    // Draining (serving: false, terminating: true): still in the maps for
    // tracked flows, but gone for connected UDP sockets.
    assert_eq!(
        ctl.udp_pairs_gone(&id, &udp(&[(1, Active), (2, Draining)])),
        [pair(53, 2)]
    );
    // Leaving the slice afterwards hands nothing over twice.
    assert!(ctl.udp_pairs_gone(&id, &udp(&[(1, Active)])).is_empty());
    // Deleted or rejected: every backend goes.
    assert_eq!(
        ctl.udp_pairs_gone(&id, &DesiredService::default()),
        [pair(53, 1)]
    );
    assert!(ctl.udp_pairs.is_empty());
    assert!(ctl.udp_refs.is_empty());
}

#[test]
fn a_backend_another_service_keeps_is_still_gone_for_the_service_that_dropped_it() {
    use BackendState::Active;
    let mut ctl = controller(Reports::none());
    // Two Services over the same DNS pods, on two ClusterIPs.
    let dns = ServiceId::new("kube-system", "kube-dns");
    let alt = ServiceId::new("kube-system", "dns-alt");
    assert!(
        ctl.udp_pairs_gone(&dns, &udp_at(10, &[(1, Active), (2, Active)]))
            .is_empty()
    );
    assert!(
        ctl.udp_pairs_gone(&alt, &udp_at(11, &[(1, Active), (2, Active)]))
            .is_empty()
    );
    // kube-dns drops pod 2: its sockets on pod 2 go, dns-alt's stay.
    assert_eq!(
        ctl.udp_pairs_gone(&dns, &udp_at(10, &[(1, Active)])),
        [pair(10, 2)]
    );
    assert_eq!(
        ctl.udp_pairs_gone(&alt, &DesiredService::default()),
        [pair(11, 1), pair(11, 2)]
    );
    assert_eq!(
        ctl.udp_pairs_gone(&dns, &DesiredService::default()),
        [pair(10, 1)]
    );
    assert!(ctl.udp_refs.is_empty());
}

#[test]
fn a_frontend_handed_from_a_deleted_service_to_a_new_one_keeps_its_sockets() {
    use BackendState::Active;
    let mut ctl = controller(Reports::none());
    let old = ServiceId::new("default", "old");
    let new = ServiceId::new("default", "new");
    assert!(
        ctl.udp_pairs_gone(&old, &udp(&[(1, Active), (2, Active)]))
            .is_empty()
    );
    // One batch: the new Service is programmed before the old one's
    // deletion is; pod 1 serves the same ClusterIP throughout.
    assert!(ctl.udp_pairs_gone(&new, &udp(&[(1, Active)])).is_empty());
    assert_eq!(
        ctl.udp_pairs_gone(&old, &DesiredService::default()),
        [pair(53, 2)]
    );
}

/// A controller over maps with room for `services` entries, whose health
/// fails as soon as a change waits (timeout zero), so a test sees at once
/// what an hour would show.
fn strict(services: u32, maps: impl FnOnce(&mut FakeMaps)) -> Controller<FakeMaps> {
    let mut fake = FakeMaps::new(Capacity {
        services,
        backends: 64,
        revnat: 64,
        src_ranges: 64,
        maglev: 64,
    });
    maps(&mut fake);
    let node = NodeInfo {
        name: "n".into(),
        zone: None,
        addresses: vec!["192.168.0.1".parse().unwrap()],
        ..NodeInfo::default()
    };
    Controller::new(
        Reconciler::restore(fake).unwrap(),
        Store::with_options(node, StoreOptions::default()),
        Hooks {
            health: Arc::new(Health::new(Duration::ZERO)),
            ..Hooks::default()
        },
    )
}

fn apply(ctl: &mut Controller<FakeMaps>, svcs: Vec<ServiceSpec>) {
    let mut dirty = BTreeSet::new();
    ctl.handle(
        SourceMsg::Changes(svcs.into_iter().map(Change::service).collect()),
        &mut dirty,
    );
    ctl.sync(dirty);
    // Past the (zero) timeout for anything still pending.
    std::thread::sleep(Duration::from_millis(2));
}

#[test]
fn a_service_that_does_not_fit_or_conflicts_leaves_the_node_healthy() {
    // Room for one NodePort Service's two frontends, not a second's.
    let mut ctl = strict(3, |_| {});
    apply(
        &mut ctl,
        vec![
            node_port_svc("fits", [10, 96, 0, 1], 30_080),
            node_port_svc("toobig", [10, 96, 0, 2], 30_081),
        ],
    );
    assert!(ctl.failed.contains(&ServiceId::new("default", "toobig")));
    assert!(
        ctl.hooks.health.status().healthy,
        "one Service that does not fit is that Service's problem"
    );
    // Retries keep failing; health stays.
    ctl.sync(ctl.failed.clone());
    std::thread::sleep(Duration::from_millis(2));
    assert!(ctl.hooks.health.status().healthy);
}

/// A ClusterIP Service on port 80 and its slice of `backends` endpoints.
fn with_backends(name: &str, ip: [u8; 4], backends: u8) -> Vec<Change> {
    let svc = ServiceSpec {
        id: ServiceId::new("default", name),
        kind: ServiceType::ClusterIp,
        cluster_ips: vec![IpAddr::from(ip)].into(),
        ports: vec![ServicePortSpec {
            name: "".into(),
            port: 80,
            proto: Protocol::Tcp,
            node_port: None,
        }]
        .into(),
        ..ServiceSpec::default()
    };
    let slice = SliceSpec {
        id: SliceId::new("default", format!("{name}-1")),
        service: ServiceId::new("default", name),
        family: IpFamily::V4,
        ports: vec![SlicePortSpec {
            name: "".into(),
            port: 8080,
            proto: Protocol::Tcp,
        }]
        .into(),
        endpoints: (1..=backends)
            .map(|last| EndpointSpec::ready(IpAddr::from([10, 0, ip[3], last])))
            .collect(),
    };
    vec![Change::service(svc), Change::slice(slice)]
}

#[test]
fn a_full_map_is_reported_once_though_its_counts_change() {
    // 34 backends, a master and three slots each (11 a entry): the second
    // Service does not fit, and
    // refusing its frontend takes the one entry left, so the retry reads
    // "5 of 5 in use, needs 3 more" where the first try read "4 of 5, 4".
    let (reports, mut rx) = Reports::channel(16);
    let mut ctl = strict(5, |_| {});
    ctl.hooks.reports = reports;
    let mut dirty = BTreeSet::new();
    let mut changes = with_backends("fits", [10, 96, 0, 1], 34);
    changes.extend(with_backends("toobig", [10, 96, 0, 2], 34));
    ctl.handle(SourceMsg::Changes(changes), &mut dirty);
    ctl.sync(dirty);
    let toobig = ServiceId::new("default", "toobig");
    assert!(ctl.failed.contains(&toobig));
    let Ok(Report::Failed {
        service,
        reason: Reason::MapFull,
        message,
    }) = rx.try_recv()
    else {
        panic!("no MapFull report");
    };
    assert_eq!(service, toobig);
    assert!(message.contains("4 of 5"), "{message}");
    for _ in 0..3 {
        ctl.sync(ctl.failed.clone());
    }
    assert!(rx.try_recv().is_err(), "the same failure reported again");
    let full = ctl
        .hooks
        .metrics
        .map_full
        .get_or_create(&MapLabel::of(MapName::Services));
    assert_eq!(full.get(), 1, "counted once");
}

#[test]
fn a_map_write_the_kernel_refuses_fails_health_until_it_works() {
    let mut ctl = strict(64, |m| m.fail_after(0));
    apply(&mut ctl, vec![node_port_svc("a", [10, 96, 0, 1], 30_080)]);
    assert!(!ctl.hooks.health.status().healthy, "the datapath refused");
    // The injected failure was one write: the retry goes through.
    ctl.sync(ctl.failed.clone());
    assert!(ctl.hooks.health.status().healthy);
    assert_eq!(ctl.reconciler.frontend_count(), 2);
}

#[test]
fn a_refused_external_ip_is_reported_once_and_withdrawn_when_it_goes() {
    let (reports, mut rx) = Reports::channel(16);
    let mut ctl = controller(reports);
    let victim = node_port_svc("victim", [10, 96, 0, 10], 30_080);
    let mut evil = node_port_svc("aaa-evil", [10, 96, 0, 20], 30_081);
    evil.external_ips = vec![IpAddr::from([10, 96, 0, 10])].into();
    let mut dirty = BTreeSet::new();
    ctl.handle(
        SourceMsg::Changes(vec![Change::service(victim), Change::service(evil.clone())]),
        &mut dirty,
    );
    ctl.sync(dirty.clone());
    assert!(ctl.failed.is_empty(), "{:?}", ctl.last_error);
    // Both Services' cluster IPs and node ports; not evil's external IP.
    assert_eq!(ctl.reconciler.frontend_count(), 4);
    let Ok(Report::Failed {
        service,
        reason,
        message,
    }) = rx.try_recv()
    else {
        panic!("no report");
    };
    assert_eq!(service, ServiceId::new("default", "aaa-evil"));
    assert_eq!(reason, Reason::FrontendRefused);
    assert!(message.contains("spec.externalIPs[0]"), "{message}");
    assert!(message.contains("default/victim"), "{message}");
    ctl.sync(dirty);
    assert!(rx.try_recv().is_err(), "reported once");

    evil.external_ips = Box::default();
    let mut dirty = BTreeSet::new();
    ctl.handle(SourceMsg::Changes(vec![Change::service(evil)]), &mut dirty);
    ctl.sync(dirty);
    assert_eq!(
        rx.try_recv(),
        Ok(Report::Recovered {
            service: ServiceId::new("default", "aaa-evil"),
            stage: Stage::Frontends,
        })
    );
}

#[tokio::test]
async fn nothing_is_synced_before_the_sources_first_complete_view() {
    // A paginated list: the Service arrives in one batch, its slice later.
    let mut changes = with_backends("a", [10, 96, 0, 1], 3);
    let slice = changes.pop().unwrap();
    let svc = changes.pop().unwrap();
    let mut ctl = controller(Reports::none());
    let feed = |msgs: Vec<SourceMsg>| {
        let (tx, rx) = tokio::sync::mpsc::channel(msgs.len());
        for m in msgs {
            tx.try_send(m).unwrap();
        }
        rx
    };
    ctl.run(
        feed(vec![SourceMsg::Changes(vec![svc.clone()])]),
        std::future::pending(),
    )
    .await;
    assert_eq!(
        ctl.reconciler.frontend_count(),
        0,
        "a Service programmed before its slice would lose its backends"
    );
    ctl.run(
        feed(vec![
            SourceMsg::Changes(vec![slice.clone()]),
            SourceMsg::Synced { complete: true },
        ]),
        std::future::pending(),
    )
    .await;
    assert_eq!(ctl.reconciler.frontend_count(), 1);

    // As many writes as when both came at once: no master was written twice.
    let mut once = controller(Reports::none());
    once.run(
        feed(vec![
            SourceMsg::Changes(vec![svc, slice]),
            SourceMsg::Synced { complete: true },
        ]),
        std::future::pending(),
    )
    .await;
    assert!(once.initial_ops > 0);
    assert_eq!(ctl.initial_ops, once.initial_ops);

    // Once synced, a change is programmed as it comes.
    let mut more = with_backends("b", [10, 96, 0, 2], 2);
    more.truncate(1);
    ctl.run(feed(vec![SourceMsg::Changes(more)]), std::future::pending())
        .await;
    assert_eq!(ctl.reconciler.frontend_count(), 2);
}

#[tokio::test]
async fn a_cold_start_programs_services_whose_slices_came_and_a_restart_waits() {
    let feed = |msgs: Vec<SourceMsg>| {
        let (tx, rx) = tokio::sync::mpsc::channel(msgs.len());
        for m in msgs {
            tx.try_send(m).unwrap();
        }
        rx
    };
    // Half a list: a with its slice, b without one yet.
    let b = with_backends("b", [10, 96, 0, 2], 2);
    let mut half = with_backends("a", [10, 96, 0, 1], 3);
    half.push(b[0].clone());

    // Nothing restored: a is programmed while the list goes on; b, and
    // health, wait.
    let mut cold = controller(Reports::none());
    cold.run(
        feed(vec![SourceMsg::Changes(half.clone())]),
        std::future::pending(),
    )
    .await;
    assert_eq!(
        cold.reconciler.frontend_count(),
        1,
        "a is in the maps, b is not"
    );
    assert_eq!(
        cold.hooks.health.status().last_updated,
        None,
        "not up to date before the complete view"
    );
    cold.run(
        feed(vec![
            SourceMsg::Changes(vec![b[1].clone()]),
            SourceMsg::Synced { complete: true },
        ]),
        std::future::pending(),
    )
    .await;
    assert_eq!(cold.reconciler.frontend_count(), 2);
    assert!(cold.hooks.health.status().last_updated.is_some());

    // A restart over those maps, and a list that so far has b's slice
    // only as far as its first endpoint: held whole, or b would lose the
    // other one until the rest came.
    let mut partial = with_backends("a", [10, 96, 0, 1], 3);
    partial.extend(with_backends("b", [10, 96, 0, 2], 1));
    let mut warm = Controller::new(
        Reconciler::restore(cold.reconciler.maps().clone()).unwrap(),
        Store::new(cold.store.node().clone()),
        Hooks::default(),
    );
    let before = warm.reconciler.maps().log.len();
    warm.run(
        feed(vec![SourceMsg::Changes(partial)]),
        std::future::pending(),
    )
    .await;
    assert_eq!(warm.reconciler.maps().log.len(), before, "nothing written");
}

#[test]
fn kube_proxy_counts_changes_pending_ones_and_local_policies_without_endpoints() {
    use crate::model::TrafficPolicy;
    let mut ctl = controller(Reports::none());
    let mut changes = with_backends("itp", [10, 96, 0, 8], 2);
    if let Change::UpsertService(spec) = &mut changes[0] {
        Arc::make_mut(spec).internal_policy = TrafficPolicy::Local;
    }
    let mut etp = node_port_svc("etp", [10, 96, 0, 9], 30080);
    etp.external_policy = TrafficPolicy::Local;
    changes.push(Change::service(etp));
    let mut dirty = BTreeSet::new();
    ctl.handle(SourceMsg::Changes(changes), &mut dirty);
    exposes(
        &ctl,
        &[
            "kubeproxy_sync_proxy_rules_service_changes_total 2",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 1",
            "kubeproxy_sync_proxy_rules_service_changes_pending 2",
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending 1",
        ],
    );

    ctl.handle(SourceMsg::Synced { complete: true }, &mut dirty);
    exposes(
        &ctl,
        &[
            "kubeproxy_sync_proxy_rules_service_changes_pending 0",
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending 0",
            // Both of itp's endpoints are on other nodes; etp has none at all.
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"internal\"} 1",
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\"} 1",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count 1",
        ],
    );

    // One of itp's endpoints moves here; etp goes.
    let mut dirty = BTreeSet::new();
    let mut here = EndpointSpec::ready(IpAddr::from([10, 0, 8, 1]));
    here.edit_meta(|m| m.node_name = Some("n".into()));
    let slice = SliceSpec {
        id: SliceId::new("default", "itp-1"),
        service: ServiceId::new("default", "itp"),
        family: IpFamily::V4,
        ports: vec![SlicePortSpec {
            name: "".into(),
            port: 8080,
            proto: Protocol::Tcp,
        }]
        .into(),
        endpoints: vec![here].into(),
    };
    let gone = Change::DeleteService(ServiceId::new("default", "etp"));
    ctl.handle(
        SourceMsg::Changes(vec![Change::slice(slice), gone]),
        &mut dirty,
    );
    ctl.sync(dirty);
    exposes(
        &ctl,
        &[
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"internal\"} 0",
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"external\"} 0",
            "kubeproxy_sync_partial_proxy_rules_duration_seconds_count 1",
            "kubeproxy_sync_proxy_rules_service_changes_total 3",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total 2",
        ],
    );
}

/// Fails naming the first of `lines` missing from the controller's metrics.
fn exposes(ctl: &Controller<FakeMaps>, lines: &[&str]) {
    let text = ctl.hooks.metrics.encode();
    for line in lines {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
}

#[test]
fn a_bulk_sync_ends_as_syncing_each_service_alone() {
    // More than BULK Services: new ones (written in groups), one with a
    // node port out of range (rejected), two contending for one node port
    // (the second to sync conflicts, then loses), and more backends than
    // fit.
    let mut changes = Vec::new();
    for i in 0..300u16 {
        let [hi, lo] = i.to_be_bytes();
        changes.extend(with_backends(
            &format!("s{i:03}"),
            [10, 97, hi, lo],
            u8::try_from(i % 14 + 1).unwrap(),
        ));
    }
    changes.push(Change::service(node_port_svc("bad", [10, 96, 0, 1], 80)));
    changes.push(Change::service(node_port_svc(
        "np-a",
        [10, 96, 0, 2],
        30_080,
    )));
    changes.push(Change::service(node_port_svc(
        "np-z",
        [10, 96, 0, 3],
        30_080,
    )));
    changes.extend(with_backends("huge", [10, 96, 0, 4], 200));
    let run = |batch: usize| {
        let cap = Capacity {
            services: 2048,
            backends: 2400,
            revnat: 2048,
            src_ranges: 64,
            maglev: 64,
        };
        let (reports, mut rx) = Reports::channel(4096);
        let rec = Reconciler::restore(FakeMaps::new(cap)).unwrap();
        let mut ctl = Controller::new(
            rec,
            Store::with_options(NodeInfo::default(), StoreOptions::default()),
            Hooks {
                reports,
                ..Hooks::default()
            },
        );
        let mut dirty = BTreeSet::new();
        ctl.handle(SourceMsg::Changes(changes.clone()), &mut dirty);
        let ids: Vec<ServiceId> = dirty.into_iter().collect();
        for part in ids.chunks(batch) {
            ctl.sync(part.iter().cloned().collect());
        }
        let mut sent = Vec::new();
        while let Ok(r) = rx.try_recv() {
            sent.push(format!("{r:?}"));
        }
        let maps = ctl.reconciler.maps();
        (
            maps.state.clone(),
            maps.labels.clone(),
            ctl.failed.clone(),
            sent,
        )
    };
    let (state, labels, failed, sent) = run(usize::MAX);
    let alone = run(1);
    assert_eq!(state.services.len(), alone.0.services.len());
    assert!(state == alone.0, "the maps differ");
    assert_eq!(labels, alone.1);
    assert_eq!(failed, alone.2);
    assert_eq!(sent.len(), alone.3.len(), "{sent:#?}");
    // The backends run out before the last Services, in both.
    assert!(!failed.is_empty() && failed.len() < 10, "{failed:?}");
    assert!(sent.iter().any(|r| r.contains("\"bad\"")), "{sent:#?}");
}
