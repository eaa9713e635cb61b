//! The planner's invariants as executable checks: make-before-break order of
//! a plan's ops, and what a datapath reader can reach while they are written.
//! The unit tests and the fuzz targets (fuzz/) share them, so both hold the
//! planner to the same oracle; that is the only reason this is public.
use std::{collections::BTreeSet, net::IpAddr};

use weir_abi::{Backend as AbiBackend, SVC_IDS, ServiceValue};

use super::service_key;
use crate::{
    maps::{MapOp, Snapshot},
    model::{Backend, BackendState, Frontend},
};

/// Position of an op in make-before-break order.
pub fn phase(op: &MapOp) -> u8 {
    match op {
        MapOp::UpsertBackend(_, b) if b.state == weir_abi::BACKEND_STATE_DRAINING => 8,
        MapOp::UpsertBackend(..) => 0,
        MapOp::UpsertRevNat(..) => 1,
        MapOp::UpsertSrcRange(_) => 2,
        MapOp::UpsertService(k, _) if k.slot != 0 => 3,
        MapOp::SetMaglev(_) => 4,
        MapOp::UpsertService(..) => 5,
        MapOp::DeleteService(k) if k.slot == 0 => 6,
        MapOp::DeleteService(_) => 7,
        MapOp::DeleteMaglev(..) => 9,
        MapOp::DeleteBackend(_) => 10,
        MapOp::DeleteSrcRange(_) => 11,
        MapOp::DeleteRevNat(_) => 12,
    }
}

/// Panics unless `ops` come in make-before-break order.
pub fn assert_phases(ops: &[MapOp]) {
    for w in ops.windows(2) {
        assert!(
            phase(&w[0]) <= phase(&w[1]),
            "{:?} must not come before {:?}",
            w[0],
            w[1]
        );
    }
}

pub type Endpoint = (IpAddr, u16);

pub fn endpoint(b: &AbiBackend) -> Endpoint {
    (IpAddr::from(b.addr), u16::from_be(b.port))
}

pub fn endpoints<'a>(bs: impl IntoIterator<Item = &'a Backend>) -> BTreeSet<Endpoint> {
    bs.into_iter().map(|b| (b.addr, b.port)).collect()
}

/// What new connections to a frontend with these backends may reach.
pub fn pickable(bs: &[Backend]) -> BTreeSet<Endpoint> {
    let act: Vec<&Backend> = bs
        .iter()
        .filter(|b| b.state == BackendState::Active)
        .collect();
    if act.is_empty() {
        endpoints(bs.iter().filter(|b| b.state.serves()))
    } else {
        endpoints(act)
    }
}

/// The number of positions `pick_in` chooses from.
pub fn live(master: &ServiceValue) -> u16 {
    if master.count > 0 {
        master.count
    } else {
        master.qcount
    }
}

/// Checks `pick_backend` of ebpf/programs/src/sock.rs while `states` are
/// written one after another, each of its lookups seeing its own state, never
/// an older one than the lookup before: the master at `i`, the slot holding
/// the position (if not the master itself) at `j >= i`, the backend at
/// `m >= j`. When the slot or the backend is gone, the program re-reads the
/// master and tries once more, at states from the failure on. Every
/// connection must reach a backend in `allowed`.
pub fn check_torn_reads(
    states: &[Snapshot],
    fe: Frontend,
    allowed: &BTreeSet<Endpoint>,
    ctx: &str,
) {
    let last = states.len() - 1;
    let key = |slot| service_key(fe, slot);
    let masters: Vec<ServiceValue> = states
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let m = *s.services.get(&key(0)).unwrap_or_else(|| {
                panic!("{ctx}: the frontend vanished after op {i}");
            });
            assert!(live(&m) > 0, "{ctx}: the frontend looks empty after op {i}");
            m
        })
        .collect();
    // The states a reader holding master `i` reads position `p`'s entry at:
    // the master's own copy, or its slot at any later state.
    let entry_states = |p: usize, i: usize| if p < SVC_IDS { i..=i } else { i..=last };
    // None: the slot is gone and the program re-reads the master.
    let id_at = |p: usize, i: usize, j: usize| -> Option<u32> {
        let (slot, index) = weir_abi::position_slot(p).expect("a position of a u16 count");
        let v = if slot == 0 {
            masters[i]
        } else {
            *states[j].services.get(&key(slot))?
        };
        Some(v.ids[index])
    };
    // None: gone, or draining, which is no pick either (`pick_in`).
    let backend = |id: u32, m: usize| {
        states[m]
            .backends
            .get(&id)
            .filter(|b| b.state != weir_abi::BACKEND_STATE_DRAINING)
            .copied()
    };
    let reaches = |b: AbiBackend, at: &str| {
        assert!(
            allowed.contains(&endpoint(&b)) && b.proto == fe.proto.ip_proto(),
            "{ctx}: {at} reached {b:?}, not an old or new backend"
        );
    };
    // A second attempt that starts at state k succeeds whatever the timing.
    let mut retry_ok = vec![true; states.len() + 1];
    for k in (0..=last).rev() {
        let ok = (0..usize::from(live(&masters[k]))).all(|p| {
            entry_states(p, k).all(|j| {
                (j..=last).all(|m| match id_at(p, k, j).and_then(|id| backend(id, m)) {
                    Some(b) => {
                        reaches(b, &format!("retry at {k}"));
                        true
                    }
                    None => false,
                })
            })
        });
        retry_ok[k] = ok && retry_ok[k + 1];
    }
    for (i, master) in masters.iter().enumerate() {
        for p in 0..usize::from(live(master)) {
            for j in entry_states(p, i) {
                let Some(id) = id_at(p, i, j) else {
                    assert!(
                        retry_ok[j],
                        "{ctx}: master@{i} position {p}@{j} is gone and the retry can fail too"
                    );
                    continue;
                };
                for (m, &retry) in retry_ok.iter().enumerate().take(last + 1).skip(j) {
                    match backend(id, m) {
                        Some(b) => reaches(b, &format!("master@{i} position {p}@{j} backend@{m}")),
                        None => assert!(
                            retry,
                            "{ctx}: master@{i} position {p}@{j} backend@{m} is gone and the retry can fail too"
                        ),
                    }
                }
            }
        }
    }
}
