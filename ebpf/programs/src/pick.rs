//! Backend selection shared by the socket hooks and the packet programs: the
//! pick itself is `weir_abi::pick` (which the agent's tests run too), over
//! the kernel's maps; session affinity, which writes a map, is here.
use aya_ebpf::helpers::generated::bpf_get_prandom_u32;
pub use weir_abi::pick::Pick;
use weir_abi::{
    Addr, AffinityKey, AffinityValue, Backend, SVC_F_AFFINITY, ServiceKey, ServiceValue,
    maglev::{CHUNK, MaglevKey},
    pick::{self as shared, LbMapsView},
};

use crate::maps::{AFFINITY, BACKENDS, MAGLEV, SERVICES};

/// The kernel's services and backends maps.
pub struct Kernel;

impl LbMapsView for Kernel {
    #[inline(always)]
    fn service(&self, key: &ServiceKey) -> Option<ServiceValue> {
        // SAFETY: values are plain integers, and an element's memory outlives
        // the program's RCU read section (its contents may change: maps.rs).
        unsafe { SERVICES.get(key) }.copied()
    }

    #[inline(always)]
    fn slot_id(&self, key: &ServiceKey, index: usize) -> Option<u32> {
        // SAFETY: as above; the agent rewrites a slot by linking a new
        // element in its place, so the id read is whole.
        let value = unsafe { SERVICES.get(key) }?;
        value.ids.get(index).copied()
    }

    #[inline(always)]
    fn backend(&self, id: u32) -> Option<Backend> {
        // A free id reads as zeros, which is no backend (see maps.rs).
        BACKENDS.get(id).copied().filter(|b| b.rev_nat_id != 0)
    }

    #[inline(always)]
    fn maglev(&self, rev_nat_id: u32, index: u32) -> Option<u32> {
        let key = MaglevKey {
            rev_nat_id,
            chunk: index / CHUNK,
        };
        // SAFETY: as above. An update by the agent links a new element in
        // place of this one, so the chunk read is whole (old or new).
        let chunk = unsafe { MAGLEV.get(key) }?;
        // Verifier: see `bounded`.
        chunk.ids.get(shared::bounded(index % CHUNK)).copied()
    }
}

/// See [`weir_abi::pick::pick_backend`].
#[inline(always)]
pub fn pick_backend(key: &mut ServiceKey, master: &ServiceValue, roll: u32) -> Option<Pick> {
    shared::pick_backend(&Kernel, key, master, roll)
}

/// See [`weir_abi::pick::owned_backend`].
#[inline(always)]
pub fn owned_backend(id: u32, rev_nat_id: u32, frontend: &Addr) -> Option<Pick> {
    shared::owned_backend(&Kernel, id, rev_nat_id, frontend)
}

/// See [`weir_abi::pick::sticky_backend`].
#[inline(always)]
pub fn sticky_backend(id: u32, master: &ServiceValue, frontend: &Addr) -> Option<Pick> {
    shared::sticky_backend(&Kernel, id, master, frontend)
}

/// How a new pick is made when no remembered one applies.
#[derive(Clone, Copy)]
pub enum Fresh {
    /// At random among the usable slots: sockets, and frontends without
    /// Maglev.
    Random,
    /// From the frontend's Maglev table if it has one, by this
    /// [`weir_abi::maglev::flow_hash`]: new flows of the packet programs.
    Flow(u32),
}

#[inline(always)]
fn fresh_pick(key: &mut ServiceKey, master: &ServiceValue, how: Fresh) -> Option<Pick> {
    if let Fresh::Flow(hash) = how
        && let Some(pick) = shared::maglev_backend(&Kernel, master, &key.addr, hash)
    {
        return Some(pick);
    }
    // SAFETY: bpf_get_prandom_u32 has no preconditions.
    let roll = unsafe { bpf_get_prandom_u32() };
    pick_backend(key, master, roll)
}

/// The backend for a new connection or flow of the frontend whose master key
/// and value are `key` and `master`: under session affinity the client's
/// remembered backend while it is fresh and still usable, else a new pick
/// made `how` (remembered when affinity is on). `aff` identifies the client.
#[inline(always)]
pub fn choose(
    key: &mut ServiceKey,
    master: &ServiceValue,
    aff: &AffinityKey,
    now: u32,
    how: Fresh,
) -> Option<Pick> {
    if master.flags & SVC_F_AFFINITY == 0 {
        return fresh_pick(key, master, how);
    }
    if let Some(entry) = AFFINITY.get_ptr_mut(aff) {
        // SAFETY: the pointer comes from a successful lookup; racing writers
        // only ever store whole plain-integer values.
        let stored = unsafe { *entry };
        if now.wrapping_sub(stored.last_used) <= master.affinity_timeout
            && let Some(pick) =
                shared::backend_usable(&Kernel, stored.backend_id, master, &key.addr)
        {
            // SAFETY: as above.
            unsafe { (*entry).last_used = now };
            return Some(pick);
        }
    }
    let pick = fresh_pick(key, master, how)?;
    let value = AffinityValue {
        backend_id: pick.backend_id,
        last_used: now,
    };
    // A lost entry only means the next connection picks afresh.
    let _ = AFFINITY.insert(aff, value, 0);
    Some(pick)
}
