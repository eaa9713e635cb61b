//! Map definitions. Layouts and semantics are documented in `weir-abi`.
//!
//! The agent overrides `max_entries` of the services and backends maps from its
//! flags before loading; the numbers here are the defaults.
use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    macros::map,
    maps::{HashMap, LruHashMap},
};
use weir_abi::{
    Backend4, DEFAULT_MAX_BACKENDS, DEFAULT_MAX_REVSOCK, DEFAULT_MAX_SERVICES, RevNat4,
    RevSock4Key, RevSock4Value, Service4Key, Service4Value,
};

// Not preallocated: entries are freed after an RCU grace period, so a program that
// looked up an entry the agent is deleting still reads the old value, never a
// recycled one.
#[map(name = "WEIR_SVC4")]
pub static SERVICES4: HashMap<Service4Key, Service4Value> =
    HashMap::pinned(DEFAULT_MAX_SERVICES, BPF_F_NO_PREALLOC);

#[map(name = "WEIR_BACKEND4")]
pub static BACKENDS4: HashMap<u32, Backend4> =
    HashMap::pinned(DEFAULT_MAX_BACKENDS, BPF_F_NO_PREALLOC);

#[map(name = "WEIR_REVNAT4")]
pub static REVNAT4: HashMap<u32, RevNat4> =
    HashMap::pinned(DEFAULT_MAX_SERVICES, BPF_F_NO_PREALLOC);

// LRU: an entry per connected socket, written by the datapath; old sockets age out.
#[map(name = "WEIR_REVSOCK4")]
pub static REVSOCK4: LruHashMap<RevSock4Key, RevSock4Value> =
    LruHashMap::pinned(DEFAULT_MAX_REVSOCK, 0);
