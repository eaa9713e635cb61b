//! Backend selection: the one implementation the kernel programs run and the
//! agent's in-memory maps (`FakeMaps`) model, so tests of the planner and the
//! reconciler see exactly what a socket or packet would reach.
//!
//! Everything here reads the maps through [`LbMapsView`]: the programs
//! implement it over the kernel's maps, the agent over a snapshot. The
//! functions are generic rather than dynamic so that the programs get them
//! inlined, as the verifier needs.
use crate::{
    Addr, BACKEND_STATE_ACTIVE, BACKEND_STATE_DRAINING, BACKEND_STATE_TERMINATING, Backend,
    SVC_F_MAGLEV, SVC_IDS, ServiceKey, ServiceValue,
};

/// Read access to the services and backends maps. Values are copies: in the
/// kernel an element's contents may change under a reader (see the programs'
/// `maps.rs`), so every check is made on one copy.
pub trait LbMapsView {
    fn service(&self, key: &ServiceKey) -> Option<ServiceValue>;
    /// `ids[index]` of the services-map entry `key`. The kernel reads the
    /// one id in place: a copy of the whole value would cost the programs
    /// 64 bytes more of their 512-byte stack.
    #[inline(always)]
    fn slot_id(&self, key: &ServiceKey, index: usize) -> Option<u32> {
        self.service(key)?.ids.get(index).copied()
    }
    fn backend(&self, id: u32) -> Option<Backend>;
    /// Position `index` of frontend `rev_nat_id`'s Maglev table: a backend id.
    fn maglev(&self, rev_nat_id: u32, index: u32) -> Option<u32>;
}

/// A backend picked for one connect, send or new flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pick {
    pub backend_id: u32,
    pub addr: Addr,
    pub port: u16,
    pub rev_nat_id: u32,
}

/// Picks a backend uniformly among the active positions, or among the terminating
/// ones when the frontend has no active backend (KEP-1669). `key` is the
/// frontend's master key; its slot is clobbered. `roll` is the random number.
#[inline(always)]
pub fn pick_backend<M: LbMapsView>(
    maps: &M,
    key: &mut ServiceKey,
    master: &ServiceValue,
    roll: u32,
) -> Option<Pick> {
    if let Some(pick) = pick_in(maps, key, master, roll) {
        return Some(pick);
    }
    // The agent writes a shrinking frontend's new master before it prunes the
    // slots beyond it, so a slot can vanish between our two lookups; and it
    // marks a backend draining before it takes it out of the positions. Read
    // the master again and pick within what it holds now, at another
    // position so a draining backend still in the old layout is not hit
    // twice.
    key.slot = 0;
    let fresh = maps.service(key)?;
    pick_in(maps, key, &fresh, roll.wrapping_add(1))
}

#[inline(always)]
fn pick_in<M: LbMapsView>(
    maps: &M,
    key: &mut ServiceKey,
    master: &ServiceValue,
    roll: u32,
) -> Option<Pick> {
    // Terminating positions follow the active ones, so with no active backend
    // they start at position 0 too.
    let n = if master.count > 0 {
        u32::from(master.count)
    } else {
        u32::from(master.qcount)
    };
    if n == 0 {
        return None;
    }
    let position = roll % n;
    let index = bounded(position % SVC_IDS as u32);
    // The master copy names the first positions itself, consistent with the
    // counts read with them.
    let backend_id = if position < SVC_IDS as u32 {
        *master.ids.get(index)?
    } else {
        key.slot = (position / SVC_IDS as u32) as u16;
        maps.slot_id(key, index)?
    };
    let backend = maps.backend(backend_id)?;
    // A draining backend only finishes the flows it has; nothing new picks it.
    if backend.state == BACKEND_STATE_DRAINING {
        return None;
    }
    owned(backend_id, &backend, master.rev_nat_id, &key.addr)
}

/// `x` as an index the verifier can bound. LLVM knows a remainder is below
/// its divisor, drops the bounds check of `get`, and computes the remainder
/// as `x - q * d`, which the verifier cannot bound ("unbounded memory
/// access"). A volatile read hides the range from LLVM, so the check stays.
#[inline(always)]
pub fn bounded(x: u32) -> usize {
    // SAFETY: a read of a local.
    unsafe { core::ptr::read_volatile(&x) as usize }
}

/// `backend` (id `id`) if it belongs to frontend `rev_nat_id` and has the
/// frontend's address family. The id may have been freed and handed to
/// another frontend since it was read, and a backend of the other family can
/// never be reached by rewriting an address in place; both count as no
/// backend.
#[inline(always)]
fn owned(id: u32, backend: &Backend, rev_nat_id: u32, frontend: &Addr) -> Option<Pick> {
    if backend.rev_nat_id != rev_nat_id || backend.addr.is_v4() != frontend.is_v4() {
        return None;
    }
    Some(Pick {
        backend_id: id,
        addr: backend.addr,
        port: backend.port,
        rev_nat_id,
    })
}

/// The backend `id` if it still belongs to frontend `rev_nat_id` (see
/// [`owned`]). Any state is accepted: conntrack hits use this, and a
/// draining backend keeps the flows it already has.
#[inline(always)]
pub fn owned_backend<M: LbMapsView>(
    maps: &M,
    id: u32,
    rev_nat_id: u32,
    frontend: &Addr,
) -> Option<Pick> {
    owned(id, &maps.backend(id)?, rev_nat_id, frontend)
}

/// The backend `id` if a new connection of the frontend may still use it:
/// owned and active, or terminating while the frontend has no active
/// backend; never draining. Used to honour session affinity.
#[inline(always)]
pub fn backend_usable<M: LbMapsView>(
    maps: &M,
    id: u32,
    master: &ServiceValue,
    frontend: &Addr,
) -> Option<Pick> {
    let backend = maps.backend(id)?;
    let usable = backend.state == BACKEND_STATE_ACTIVE
        || (backend.state == BACKEND_STATE_TERMINATING && master.count == 0);
    if !usable {
        return None;
    }
    owned(id, &backend, master.rev_nat_id, frontend)
}

/// The backend the frontend's Maglev table gives the flow whose
/// [`crate::maglev::flow_hash`] is `hash`, if a new flow may use it (see
/// [`backend_usable`]). `None` when the master has no table, or while the
/// table and the master disagree during an update; the caller then picks as
/// it would without Maglev, so a flow is never refused for it.
#[inline(always)]
pub fn maglev_backend<M: LbMapsView>(
    maps: &M,
    master: &ServiceValue,
    frontend: &Addr,
    hash: u32,
) -> Option<Pick> {
    let size = master.table_size;
    if master.flags & SVC_F_MAGLEV == 0 || size == 0 {
        return None;
    }
    let id = maps.maglev(master.rev_nat_id, hash % size)?;
    backend_usable(maps, id, master, frontend)
}

/// The backend `id` if an unconnected UDP socket that was given it may keep
/// it: owned and still serving. A terminating backend keeps its sockets, as
/// conntrack keeps a terminating endpoint's UDP flows under kube-proxy; a
/// draining one (no longer serving) moves them.
#[inline(always)]
pub fn sticky_backend<M: LbMapsView>(
    maps: &M,
    id: u32,
    master: &ServiceValue,
    frontend: &Addr,
) -> Option<Pick> {
    let backend = maps.backend(id)?;
    if backend.state == BACKEND_STATE_DRAINING {
        return None;
    }
    owned(id, &backend, master.rev_nat_id, frontend)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::collections::BTreeMap;

    use super::*;
    use crate::{PROTO_TCP, SCOPE_ALL};

    #[derive(Default)]
    struct Maps {
        services: BTreeMap<ServiceKey, ServiceValue>,
        backends: BTreeMap<u32, Backend>,
        maglev: BTreeMap<u32, std::vec::Vec<u32>>,
    }

    impl LbMapsView for Maps {
        fn service(&self, key: &ServiceKey) -> Option<ServiceValue> {
            self.services.get(key).copied()
        }
        fn backend(&self, id: u32) -> Option<Backend> {
            self.backends.get(&id).copied()
        }
        fn maglev(&self, rev_nat_id: u32, index: u32) -> Option<u32> {
            let t = self.maglev.get(&rev_nat_id)?;
            t.get(index as usize).copied()
        }
    }

    fn key(slot: u16) -> ServiceKey {
        ServiceKey {
            addr: Addr::from_v4(u32::from_ne_bytes([10, 96, 0, 1])),
            port: 80u16.to_be(),
            slot,
            proto: PROTO_TCP,
            scope: SCOPE_ALL,
            _pad: [0; 2],
        }
    }

    /// A frontend (rev-NAT id 7) with backends 1..=n at positions 0..n, all
    /// of `state`, IPv4 unless `v6`.
    fn frontend(n: u16, state: u8, v6: bool) -> Maps {
        let mut m = Maps::default();
        let mut master = ServiceValue {
            count: if state == BACKEND_STATE_ACTIVE { n } else { 0 },
            qcount: if state == BACKEND_STATE_ACTIVE { 0 } else { n },
            rev_nat_id: 7,
            ..ServiceValue::default()
        };
        let ids: std::vec::Vec<u32> = (1..=u32::from(n)).collect();
        for (slot, chunk) in ids.chunks(SVC_IDS).enumerate() {
            let mut v = ServiceValue {
                rev_nat_id: 7,
                ..ServiceValue::default()
            };
            v.ids[..chunk.len()].copy_from_slice(chunk);
            if slot == 0 {
                master.ids = v.ids;
            } else {
                m.services.insert(key(slot as u16), v);
            }
        }
        m.services.insert(key(0), master);
        for id in ids {
            let addr = if v6 {
                Addr([0xfd, 0, 0, id])
            } else {
                Addr::from_v4(u32::from_ne_bytes([10, 0, 0, id as u8]))
            };
            m.backends.insert(
                id,
                Backend {
                    addr,
                    port: 8080u16.to_be(),
                    proto: PROTO_TCP,
                    state,
                    rev_nat_id: 7,
                },
            );
        }
        m
    }

    fn pick(m: &Maps, roll: u32) -> Option<u32> {
        let master = m.service(&key(0))?;
        pick_backend(m, &mut key(0), &master, roll).map(|p| p.backend_id)
    }

    #[test]
    fn every_roll_lands_on_its_slot() {
        let m = frontend(3, BACKEND_STATE_ACTIVE, false);
        assert_eq!(
            (0..6).map(|r| pick(&m, r)).collect::<std::vec::Vec<_>>(),
            [1, 2, 3, 1, 2, 3].map(Some)
        );
    }

    #[test]
    fn positions_past_the_masters_are_read_from_the_slots() {
        let m = frontend(25, BACKEND_STATE_ACTIVE, false);
        assert_eq!(m.services.len(), 3, "11 in the master, 11 + 3 in two slots");
        let picks: std::collections::BTreeSet<_> = (0..25).filter_map(|r| pick(&m, r)).collect();
        assert_eq!(picks, (1..=25).collect());
        assert_eq!(
            (pick(&m, 10), pick(&m, 11), pick(&m, 24)),
            (Some(11), Some(12), Some(25))
        );
        // A slot gone under a reader (a shrink pruning it): the retry reads
        // the master again, which still names it here, so no pick.
        let mut gone = m;
        gone.services.remove(&key(2));
        assert_eq!(pick(&gone, 23), None);
        assert_eq!(pick(&gone, 3), Some(4));
    }

    #[test]
    fn a_draining_backend_in_a_slot_sends_the_pick_to_the_next_slot() {
        let mut m = frontend(3, BACKEND_STATE_ACTIVE, false);
        m.backends.get_mut(&2).unwrap().state = BACKEND_STATE_DRAINING;
        assert_eq!(pick(&m, 1), Some(3));
        // Two draining in a row: the second try fails too.
        m.backends.get_mut(&3).unwrap().state = BACKEND_STATE_DRAINING;
        assert_eq!(pick(&m, 1), None);
    }

    #[test]
    fn another_frontends_or_another_familys_backend_is_no_backend() {
        let mut m = frontend(1, BACKEND_STATE_ACTIVE, false);
        m.backends.get_mut(&1).unwrap().rev_nat_id = 8;
        assert_eq!(pick(&m, 0), None);
        let m = frontend(1, BACKEND_STATE_ACTIVE, true);
        assert_eq!(pick(&m, 0), None, "a v6 backend behind a v4 frontend");
    }

    #[test]
    fn terminating_backends_serve_only_when_no_active_one_is_left() {
        let m = frontend(2, BACKEND_STATE_TERMINATING, false);
        assert_eq!(pick(&m, 1), Some(2));
        let master = m.service(&key(0)).unwrap();
        let fe = key(0).addr;
        assert!(backend_usable(&m, 1, &master, &fe).is_some());
        let busy = ServiceValue { count: 1, ..master };
        assert!(backend_usable(&m, 1, &busy, &fe).is_none());
        // A socket already on a terminating backend keeps it; a draining
        // one moves.
        assert!(sticky_backend(&m, 1, &busy, &fe).is_some());
        let mut d = m;
        d.backends.get_mut(&1).unwrap().state = BACKEND_STATE_DRAINING;
        assert!(sticky_backend(&d, 1, &busy, &fe).is_none());
        assert!(owned_backend(&d, 1, 7, &fe).is_some(), "tracked flows stay");
    }

    #[test]
    fn maglev_picks_the_tables_backend_while_it_is_usable() {
        let mut m = frontend(3, BACKEND_STATE_ACTIVE, false);
        let fe = key(0).addr;
        let plain = m.service(&key(0)).unwrap();
        assert_eq!(
            maglev_backend(&m, &plain, &fe, 5),
            None,
            "no flag, no table"
        );
        let master = ServiceValue {
            flags: SVC_F_MAGLEV,
            table_size: 5,
            ..plain
        };
        assert_eq!(maglev_backend(&m, &master, &fe, 5), None, "no table yet");
        m.maglev.insert(7, std::vec![3, 1, 2, 3, 1]);
        let at = |m: &Maps, h| maglev_backend(m, &master, &fe, h).map(|p| p.backend_id);
        assert_eq!(
            (at(&m, 1), at(&m, 7), at(&m, 9)),
            (Some(1), Some(2), Some(1))
        );
        // Draining, or handed to another frontend: the caller picks afresh.
        m.backends.get_mut(&3).unwrap().state = BACKEND_STATE_DRAINING;
        assert_eq!(at(&m, 0), None);
        m.backends.get_mut(&1).unwrap().rev_nat_id = 8;
        assert_eq!(at(&m, 1), None);
        // A table shorter than the master says (mid-update): no backend.
        m.maglev.insert(7, std::vec![2]);
        assert_eq!(at(&m, 3), None);
    }
}
