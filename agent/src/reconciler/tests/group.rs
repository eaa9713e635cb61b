//! Services written as a group (`reconciler::group`) end exactly as they
//! would one at a time, keep every plan's order, and fail alone.
use super::*;
use crate::planner::check::{assert_phases, phase};

/// New Services of every shape a group takes: a few backends, enough to
/// spill into slots, source ranges with affinity, a Maglev table, and
/// eTP=Local with both scopes.
fn fresh() -> Vec<(ServiceId, Vec<DesiredFrontend>)> {
    let hosts = |n: u8| (1..=n).collect::<Vec<u8>>();
    let mut maglev = want(fe(40, 80), 4, &hosts(5));
    maglev.kind = crate::model::FrontendKind::LoadBalancer;
    maglev.maglev = Some(251);
    vec![
        (id("a"), vec![want(fe(1, 80), 1, &hosts(3))]),
        (
            id("b"),
            vec![
                want(fe(2, 80), 2, &hosts(30)),
                want(fe(2, 81), 2, &hosts(2)),
            ],
        ),
        (
            id("lb"),
            lb_with(&["10.0.0.0/8", "192.0.2.0/24"], Some(60), &[1, 2]),
        ),
        (id("mg"), vec![maglev]),
        (id("np"), node_port(Some(&[1]), &[1, 2])),
    ]
}

fn items(services: &[(ServiceId, Vec<DesiredFrontend>)]) -> Vec<(&ServiceId, &[DesiredFrontend])> {
    services.iter().map(|(id, d)| (id, d.as_slice())).collect()
}

fn one_at_a_time(
    services: &[(ServiceId, Vec<DesiredFrontend>)],
    capacity: Capacity,
) -> (Vec<Result<usize, String>>, Shared) {
    let (mut rec, maps) = new(capacity);
    let results = services
        .iter()
        .map(|(id, d)| rec.sync_service(id, d).map_err(|e| e.to_string()))
        .collect();
    (results, maps)
}

fn grouped(
    services: &[(ServiceId, Vec<DesiredFrontend>)],
    capacity: Capacity,
) -> (Vec<Result<usize, String>>, Shared, Reconciler<Shared>) {
    let (mut rec, maps) = new(capacity);
    let results = rec
        .sync_services(&items(services))
        .into_iter()
        .map(|r| r.map_err(|e| e.to_string()))
        .collect();
    (results, maps, rec)
}

#[test]
fn a_group_writes_what_one_at_a_time_writes_phase_by_phase() {
    let services = fresh();
    let (want_results, alone) = one_at_a_time(&services, ROOMY);
    let (results, maps, _) = grouped(&services, ROOMY);
    assert_eq!(results, want_results);
    assert_same(&alone.state(), &maps.state(), "grouped vs one at a time");
    assert_eq!(alone.0.borrow().labels, maps.0.borrow().labels);
    // Written as one group: every rev-NAT entry before any slot, every
    // slot before any master.
    let log = maps.0.borrow().log.clone();
    assert_phases(&log);
    let alone_log = alone.0.borrow().log.clone();
    assert!(
        alone_log.windows(2).any(|w| phase(&w[0]) > phase(&w[1])),
        "one at a time is phase-sorted across Services too, so this proves nothing"
    );
}

#[test]
fn no_reader_of_a_group_in_progress_finds_a_frontend_half_written() {
    let services = fresh();
    let (_, maps, _) = grouped(&services, ROOMY);
    let log = maps.0.borrow().log.clone();
    let mut end = FakeMaps::new(ROOMY);
    end.state = maps.state();
    let mut m = FakeMaps::new(ROOMY);
    for (i, op) in log.iter().enumerate() {
        m.apply(op).unwrap();
        for (svc, desired) in &services {
            for d in desired {
                let key = service_key(d.frontend, 0);
                if !m.state.services.contains_key(&key) {
                    continue;
                }
                for roll in 0..8 {
                    // A master is only written once all it names is.
                    assert_eq!(
                        m.connect(key, roll),
                        end.connect(key, roll),
                        "after write {i} ({op:?}): {svc} {}",
                        d.frontend
                    );
                }
                if d.local && d.frontend.scope == Scope::All {
                    let out = m.connect_from_outside(key, 0);
                    assert!(
                        matches!(out, Ok(Some(_))),
                        "after write {i}: a LOCAL master without its local view: {out:?}"
                    );
                }
            }
        }
    }
}

#[test]
fn services_that_cannot_join_are_synced_alone_in_their_turn() {
    let mut services = fresh();
    // Updated, not new; and new with a draining backend, whose write comes
    // after its master.
    let (mut rec, maps) = new(ROOMY);
    rec.sync_service(&id("a"), &[want(fe(1, 80), 1, &[9])])
        .unwrap();
    let mut draining = want(fe(9, 80), 9, &[1, 2, 3]);
    draining.backends[2].state = BackendState::Draining;
    services.insert(2, (id("dr"), vec![draining]));
    let (alone_rec, alone) = {
        let (mut r, m) = new(ROOMY);
        r.sync_service(&id("a"), &[want(fe(1, 80), 1, &[9])])
            .unwrap();
        for (id, d) in &services {
            r.sync_service(id, d).unwrap();
        }
        (r, m)
    };
    let results = rec.sync_services(&items(&services));
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_same(&alone.state(), &maps.state(), "mixed group");
    assert_eq!(alone_rec.usage(), rec.usage());
}

#[test]
fn a_failed_write_fails_its_own_service_and_leaves_no_trace_of_it() {
    let services = fresh();
    let (_, reference, _) = grouped(&services, ROOMY);
    let (total, want_state) = (reference.writes(), reference.state());
    let owner_of = |op: &MapOp| -> ServiceId {
        let fe_of = |d: &DesiredFrontend| d.frontend;
        let state = reference.state();
        for (svc, desired) in &services {
            for f in desired.iter().map(fe_of) {
                let master = state.services[&service_key(f, 0)];
                let mine = match op {
                    MapOp::UpsertService(k, _) => *k == service_key(f, k.slot),
                    MapOp::UpsertBackend(b, _) => state.positions(service_key(f, 0)).contains(b),
                    MapOp::UpsertRevNat(r, _) => *r == master.rev_nat_id,
                    MapOp::SetMaglev(t) => t.rev_nat_id == master.rev_nat_id,
                    MapOp::UpsertSrcRange(r) => r.rev_nat_id() == master.rev_nat_id,
                    other => panic!("a group of new Services wrote {other:?}"),
                };
                if mine {
                    return svc.clone();
                }
            }
        }
        panic!("no Service owns {op:?}")
    };
    for n in 0..total {
        let (mut rec, maps) = new(ROOMY);
        maps.fail_after(n);
        let failing = owner_of(&reference.0.borrow().log[n]);
        let results = rec.sync_services(&items(&services));
        for ((svc, _), r) in services.iter().zip(&results) {
            if *svc == failing {
                assert!(
                    matches!(r, Err(ReconcileError::Map { service, .. }) if service == svc),
                    "write {n}: {svc}: {r:?}"
                );
            } else {
                assert!(
                    r.is_ok(),
                    "write {n}: {svc} failed with another's write: {r:?}"
                );
            }
        }
        let failed = &services.iter().find(|(s, _)| *s == failing).unwrap().1;
        let state = maps.state();
        for d in failed {
            assert!(
                !state.services.contains_key(&service_key(d.frontend, 0)),
                "write {n}: {failing} left a master"
            );
        }
        // Retried, it is written; and then the maps hold as many entries
        // as the reference, with no id left behind.
        rec.sync_service(&failing, failed).unwrap();
        let state = maps.state();
        assert_eq!(
            (
                state.services.len(),
                state.backends.len(),
                state.revnat.len()
            ),
            (
                want_state.services.len(),
                want_state.backends.len(),
                want_state.revnat.len()
            ),
            "write {n}"
        );
        assert_eq!(state.src_ranges.len(), want_state.src_ranges.len());
        assert_eq!(state.maglev.len(), want_state.maglev.len());
    }
}

#[test]
fn a_service_that_does_not_fit_is_refused_as_it_would_be_alone() {
    let services = fresh();
    for capacity in [
        Capacity {
            services: 4,
            ..ROOMY
        },
        Capacity {
            backends: 10,
            ..ROOMY
        },
        Capacity { revnat: 2, ..ROOMY },
    ] {
        let (want_results, alone) = one_at_a_time(&services, capacity);
        assert!(
            want_results.iter().any(Result::is_err),
            "{capacity:?} holds everything"
        );
        let (results, maps, _) = grouped(&services, capacity);
        assert_eq!(results, want_results, "{capacity:?}");
        assert_same(&alone.state(), &maps.state(), &format!("{capacity:?}"));
    }
}
