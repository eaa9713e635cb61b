//! Backend selection shared by the socket hooks and the packet programs.
use aya_ebpf::helpers::generated::bpf_get_prandom_u32;
use weir_abi::{
    Addr, AffinityKey, AffinityValue, BACKEND_STATE_ACTIVE, BACKEND_STATE_DRAINING,
    BACKEND_STATE_TERMINATING, SVC_F_AFFINITY, ServiceKey, ServiceValue,
};

use crate::maps::{AFFINITY, BACKENDS, SERVICES};

/// A backend picked for one connect, send or new flow.
#[derive(Clone, Copy)]
pub struct Pick {
    pub backend_id: u32,
    pub addr: Addr,
    pub port: u16,
    pub rev_nat_id: u32,
}

/// Picks a backend uniformly among the active slots, or among the terminating
/// ones when the frontend has no active backend (KEP-1669). `key` is the
/// frontend's master key; its slot is clobbered.
#[inline(always)]
pub fn pick_backend(key: &mut ServiceKey, master: &ServiceValue, roll: u32) -> Option<Pick> {
    if let Some(pick) = pick_in(key, master, roll) {
        return Some(pick);
    }
    // The agent writes a shrinking frontend's new master before it prunes the
    // slots beyond it, so a slot can vanish between our two lookups; and it
    // marks a backend draining before it takes it out of the slots. Read the
    // master again and pick within what it holds now, from another slot so a
    // draining backend still in the old layout is not hit twice.
    key.slot = 0;
    // SAFETY: values are plain integers, and an element's memory outlives
    // the program's RCU read section (its contents may change: maps.rs).
    let fresh = *unsafe { SERVICES.get(*key) }?;
    pick_in(key, &fresh, roll.wrapping_add(1))
}

#[inline(always)]
fn pick_in(key: &mut ServiceKey, master: &ServiceValue, roll: u32) -> Option<Pick> {
    // Terminating slots follow the active ones, so with no active backend they
    // start at slot 1 too.
    let n = if master.count > 0 {
        u32::from(master.count)
    } else {
        u32::from(master.qcount)
    };
    if n == 0 {
        return None;
    }
    key.slot = (roll % n + 1) as u16;
    // SAFETY: as above.
    let slot = unsafe { SERVICES.get(*key) }?;
    let backend_id = slot.backend_id;
    // SAFETY: as above.
    let backend = unsafe { BACKENDS.get(backend_id) }?;
    // A draining backend only finishes the flows it has; nothing new picks it.
    if backend.state == BACKEND_STATE_DRAINING {
        return None;
    }
    owned_backend(backend_id, master.rev_nat_id, &key.addr)
}

/// The backend `id` if it still belongs to frontend `rev_nat_id` and has the
/// frontend's address family. The id may have been freed and handed to another
/// frontend since it was read, and a backend of the other family can never be
/// reached by rewriting an address in place; both count as no backend. Any
/// state is accepted: conntrack hits use this, and a draining backend keeps
/// the flows it already has.
#[inline(always)]
pub fn owned_backend(id: u32, rev_nat_id: u32, frontend: &Addr) -> Option<Pick> {
    // SAFETY: values are plain integers, and an element's memory outlives
    // the program's RCU read section (its contents may change: maps.rs).
    let backend = unsafe { BACKENDS.get(id) }?;
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

/// The backend `id` if a new connection of the frontend may still use it:
/// owned (see [`owned_backend`]) and active, or terminating while the frontend
/// has no active backend; never draining. Used to honour session affinity.
#[inline(always)]
pub fn backend_usable(id: u32, master: &ServiceValue, frontend: &Addr) -> Option<Pick> {
    // SAFETY: values are plain integers, and an element's memory outlives
    // the program's RCU read section (its contents may change: maps.rs).
    let backend = unsafe { BACKENDS.get(id) }?;
    let usable = backend.state == BACKEND_STATE_ACTIVE
        || (backend.state == BACKEND_STATE_TERMINATING && master.count == 0);
    if !usable
        || backend.rev_nat_id != master.rev_nat_id
        || backend.addr.is_v4() != frontend.is_v4()
    {
        return None;
    }
    Some(Pick {
        backend_id: id,
        addr: backend.addr,
        port: backend.port,
        rev_nat_id: master.rev_nat_id,
    })
}

/// The backend for a new connection or flow of the frontend whose master key
/// and value are `key` and `master`: under session affinity the client's
/// remembered backend while it is fresh and still usable, else a new pick
/// (remembered when affinity is on). `aff` identifies the client.
#[inline(always)]
pub fn choose(
    key: &mut ServiceKey,
    master: &ServiceValue,
    aff: &AffinityKey,
    now: u32,
) -> Option<Pick> {
    // SAFETY: bpf_get_prandom_u32 has no preconditions.
    let roll = unsafe { bpf_get_prandom_u32() };
    if master.flags & SVC_F_AFFINITY == 0 {
        return pick_backend(key, master, roll);
    }
    if let Some(entry) = AFFINITY.get_ptr_mut(aff) {
        // SAFETY: the pointer comes from a successful lookup; racing writers
        // only ever store whole plain-integer values.
        let stored = unsafe { *entry };
        if now.wrapping_sub(stored.last_used) <= master.affinity_timeout
            && let Some(pick) = backend_usable(stored.backend_id, master, &key.addr)
        {
            // SAFETY: as above.
            unsafe { (*entry).last_used = now };
            return Some(pick);
        }
    }
    let pick = pick_backend(key, master, roll)?;
    let value = AffinityValue {
        backend_id: pick.backend_id,
        last_used: now,
    };
    // A lost entry only means the next connection picks afresh.
    let _ = AFFINITY.insert(aff, value, 0);
    Some(pick)
}
