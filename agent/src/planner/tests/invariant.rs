//! Randomized planner tests: the make-before-break invariant under torn reads
//! of the datapath, and restore after random histories.
use std::{collections::BTreeSet, net::IpAddr};

use weir_abi::BACKEND_STATE_ACTIVE;

use super::*;
use crate::planner::check::{Endpoint, check_torn_reads, endpoint, endpoints, pickable};

/// xorshift64: deterministic pseudo-random numbers without a dependency.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A set of backends on network `10.net.0.0/24` with at least one serving,
/// sometimes with terminating ones only, often with draining ones too. Half
/// the sets are dense: more backends than the master holds
/// (`weir_abi::SVC_IDS`), so positions move between the master and its
/// slots.
fn random_backends(rng: &mut XorShift, net: u8) -> Vec<Backend> {
    let all_terminating = rng.below(5) == 0;
    let dense = rng.below(2) == 0;
    loop {
        let mut out = Vec::new();
        for host in 1..=12u8 {
            for port in [8080u16, 8443] {
                let taken = if dense {
                    rng.below(4) != 0
                } else {
                    rng.below(5) == 0
                };
                if taken {
                    let state = if rng.below(4) == 0 {
                        BackendState::Draining
                    } else if all_terminating || rng.below(3) == 0 {
                        BackendState::Terminating
                    } else {
                        BackendState::Active
                    };
                    out.push(Backend {
                        addr: IpAddr::from([10, net, 0, host]),
                        port,
                        state,
                    });
                }
            }
        }
        if out.iter().any(|b| b.state.serves()) {
            let n = out.len() as u64;
            out.rotate_left(rng.below(n) as usize);
            return out;
        }
    }
}

#[test]
fn a_frontend_with_backends_never_looks_empty_nor_reaches_a_removed_backend() {
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut w = World::new();
    let fes = [web(), vip(20, 53, Protocol::Udp)];
    let mut current: Vec<Vec<Backend>> = vec![Vec::new(); fes.len()];
    for (n, fe) in fes.iter().enumerate() {
        current[n] = random_backends(&mut rng, n as u8);
        w.set(*fe, &current[n]);
    }
    // Rounds whose plan wrote or pruned a slot past the master.
    let mut with_slots = 0;
    for round in 0..250 {
        let n = rng.below(fes.len() as u64) as usize;
        let (fe, other) = (fes[n], fes[1 - n]);
        let a = current[n].clone();
        let b = random_backends(&mut rng, n as u8);
        let ctx = format!("round {round}: {fe} {a:?} -> {b:?}");
        let either: BTreeSet<Endpoint> = endpoints(a.iter().chain(&b));
        let p = w.plan(fe, Some(b.as_slice()));
        assert_phases(&p.ops);
        with_slots += usize::from(p.ops.iter().any(
            |op| matches!(op, MapOp::UpsertService(k, _) | MapOp::DeleteService(k) if k.slot != 0),
        ));
        let mut states = vec![w.maps.state.clone()];
        for (i, op) in p.ops.iter().enumerate() {
            w.maps.apply(op).expect("roomy fake maps accept every op");
            states.push(w.maps.state.clone());
            for roll in 0..16 {
                match w.maps.connect(service_key(fe, 0), roll) {
                    Ok(Some(got)) => assert!(
                        either.contains(&endpoint(&got)),
                        "{ctx}: after op {i} roll {roll} reached {got:?}"
                    ),
                    got => panic!("{ctx}: after op {i} ({op:?}) roll {roll} got {got:?}"),
                }
                // The other frontend is not disturbed.
                let got = w.maps.connect(service_key(other, 0), roll);
                let got = got.ok().flatten().map(|b| endpoint(&b));
                assert!(
                    got.is_some_and(|e| pickable(&current[1 - n]).contains(&e)),
                    "{ctx}: after op {i} the other frontend reached {got:?}"
                );
            }
        }
        check_torn_reads(&states, fe, &either, &ctx);
        w.settle(&p);
        current[n] = b.clone();

        // Done: exactly B's pickable backends, in B's states.
        let want = pickable(&b);
        let mut reached = BTreeSet::new();
        for roll in 0..64 {
            let got = w.maps.connect(service_key(fe, 0), roll);
            let got = got.unwrap_or_else(|_| panic!("{ctx}: refused after the plan"));
            let got = got.unwrap_or_else(|| panic!("{ctx}: frontend gone after the plan"));
            assert!(
                want.contains(&endpoint(&got)),
                "{ctx}: reached {got:?} after the plan"
            );
            let state = b
                .iter()
                .find(|x| (x.addr, x.port) == endpoint(&got))
                .unwrap()
                .state;
            assert_eq!(
                got.state == BACKEND_STATE_ACTIVE,
                state == BackendState::Active
            );
            reached.insert(endpoint(&got));
        }
        assert_eq!(
            reached, want,
            "{ctx}: some pickable backend is never chosen"
        );
        check_draining(&w, fe, &b, &ctx);
    }
    assert!(with_slots > 50, "only {with_slots} rounds moved slots");
}

/// `fe`'s draining backends of `bs` are in the backends map, owned by its
/// rev-NAT id, in the draining state and in no slot.
fn check_draining(w: &World, fe: Frontend, bs: &[Backend], ctx: &str) {
    let img = &w.images[&fe];
    let in_slots: BTreeSet<u32> = img.services.iter().flat_map(|(_, v)| v.ids).collect();
    let mut draining = BTreeSet::new();
    for (id, b) in &w.maps.state.backends {
        if b.rev_nat_id != img.rev_nat_id || b.state != weir_abi::BACKEND_STATE_DRAINING {
            continue;
        }
        assert!(
            !in_slots.contains(id),
            "{ctx}: draining backend {id} in a slot"
        );
        draining.insert(endpoint(b));
    }
    let want = endpoints(bs.iter().filter(|b| b.state == BackendState::Draining));
    assert_eq!(draining, want, "{ctx}: draining backends");
}

/// The states a plan's ops go through, applied in the given order.
fn states_of(w: &World, ops: &[MapOp]) -> Vec<Snapshot> {
    let mut fake = w.maps.clone();
    let mut states = vec![fake.state.clone()];
    for op in ops {
        fake.apply(op).unwrap();
        states.push(fake.state.clone());
    }
    states
}

#[test]
fn torn_read_check_rejects_break_before_make() {
    let mut w = World::new();
    w.set(web(), &active(&[1, 2, 3, 4, 5]));
    let allowed = endpoints(&active(&[1, 2, 3, 4, 5]));
    let p = w.plan(web(), Some(&active(&[1, 2])));
    check_torn_reads(&states_of(&w, &p.ops), web(), &allowed, "as planned");

    // Pruning before the master switches: a reader of the old master can miss
    // a slot, and its retry reads the same old master.
    let mut early_prune = p.ops.clone();
    let master = early_prune
        .iter()
        .position(|op| matches!(op, MapOp::UpsertService(k, _) if k.slot == 0))
        .unwrap();
    let m = early_prune.remove(master);
    early_prune.push(m);
    let states = states_of(&w, &early_prune);
    let caught = std::panic::catch_unwind(|| {
        check_torn_reads(&states, web(), &allowed, "prune first");
    });
    assert!(caught.is_err(), "pruning before the master went unnoticed");

    // A master that names slots not written yet.
    let mut w = World::new();
    w.set(web(), &active(&[1]));
    let p = w.plan(web(), Some(&active(&[1, 2, 3])));
    let mut master_first = p.ops.clone();
    let master = master_first
        .iter()
        .position(|op| matches!(op, MapOp::UpsertService(k, _) if k.slot == 0))
        .unwrap();
    let m = master_first.remove(master);
    master_first.insert(0, m);
    let states = states_of(&w, &master_first);
    let caught = std::panic::catch_unwind(|| {
        check_torn_reads(
            &states,
            web(),
            &endpoints(&active(&[1, 2, 3])),
            "master first",
        );
    });
    assert!(
        caught.is_err(),
        "a master ahead of its slots went unnoticed"
    );
}

#[test]
fn restore_matches_the_planner_after_random_histories() {
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    let mut w = World::new();
    // Both scopes of two addresses (eTP=Local): separate frontends that
    // share address, port and protocol and differ only in the key's scope.
    let fes = [
        web(),
        web().in_scope(crate::model::Scope::External),
        vip(11, 53, Protocol::Udp),
        vip(12, 443, Protocol::Tcp),
        vip(12, 443, Protocol::Tcp).in_scope(crate::model::Scope::External),
    ];
    for step in 0..200 {
        let n = rng.below(fes.len() as u64) as usize;
        let b = (rng.below(4) != 0).then(|| random_backends(&mut rng, n as u8));
        w.run(fes[n], b.as_deref());
        let r = restore(&w.maps.state);
        assert!(r.orphans.is_empty(), "step {step}: {:?}", r.orphans);
        assert_eq!(r.images, w.images, "step {step}");
        for fe in fes {
            let ops = diff(fe, w.images.get(&fe), r.images.get(&fe));
            assert!(ops.is_empty(), "step {step}: {fe}: {ops:?}");
        }
    }
}
