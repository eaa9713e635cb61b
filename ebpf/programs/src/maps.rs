//! Map definitions. Layouts and semantics are documented in `weir-abi`.
//!
//! The agent overrides `max_entries` from its flags before loading; the numbers
//! here are the defaults. Every map is pinned by name so that a restarted agent
//! (and the conntrack collector) finds the same maps and their state.
use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC, bpf_fib_lookup},
    btf_maps::SkStorage,
    macros::{btf_map, map},
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray},
};
use weir_abi::{
    AffinityKey, AffinityValue, Backend, Config, CtKey, CtValue, DEFAULT_MAX_AFFINITY,
    DEFAULT_MAX_BACKENDS, DEFAULT_MAX_CT, DEFAULT_MAX_MAGLEV_TABLES, DEFAULT_MAX_REVSOCK,
    DEFAULT_MAX_SERVICES, DEFAULT_MAX_SRC_RANGES, RevNat, RevSockKey, RevSockValue, STAT_ENTRIES,
    ServiceKey, ServiceValue, SockPicks, SrcRangeKey, StatValue, SvcLabel,
    maglev::{DEFAULT_TABLE_SIZE, MaglevChunk, MaglevKey, chunks},
};

// Preallocated: the agent's first sync writes an entry per frontend (more
// for one of over `SVC_IDS` backends), 100k at 100k Services, and an insert
// into a preallocated table costs under half of one that allocates
// (measured: 400 vs 1,000-1,700 ns, batched). The memory is taken when the
// map is created, and `--max-services` sizes it. A deleted element goes to
// the next insert without waiting for readers (the kernel's BPF allocator
// reuses freed elements at once), so the programs never trust what a slot
// names: `pick::owned_backend` checks that a backend still belongs to the
// frontend it was reached from.
#[map(name = "WEIR_SVC")]
pub static SERVICES: HashMap<ServiceKey, ServiceValue> = HashMap::pinned(DEFAULT_MAX_SERVICES, 0);

// An array indexed by backend id (the agent hands ids out densely from 1),
// which the agent writes through a shared mapping (`BPF_F_MMAPABLE`): a
// million backends cost it a few milliseconds of stores instead of half a
// second of hash inserts. Index 0 is never used, hence the extra entry. An
// all-zero element is a free id; its rev-NAT id 0 is no frontend's, so the
// ownership check refuses it as it refuses a reused id. The agent rewrites an
// element in place, as the hash's element reuse did, so the same check makes
// a torn read harmless.
#[map(name = "WEIR_BACKEND")]
pub static BACKENDS: Array<Backend> = Array::pinned(DEFAULT_MAX_BACKENDS + 1, BPF_F_MMAPABLE);

// One entry per frontend, sized by `--max-services` like the services map,
// where a frontend of many backends takes several entries: allocated as
// used, it takes memory only for the frontends there are.
#[map(name = "WEIR_REVNAT")]
pub static REVNAT: HashMap<u32, RevNat> = HashMap::pinned(DEFAULT_MAX_SERVICES, BPF_F_NO_PREALLOC);

// No program reads it: the agent writes which Service port each rev-NAT id
// serves, and `inspect` reads it after a restart. It lives here so that it
// is created, sized (like WEIR_REVNAT, one entry per frontend) and pinned
// with the rest, and removed by `cleanup` with them.
#[map(name = "WEIR_SVC_LABEL")]
pub static SVC_LABELS: HashMap<u32, SvcLabel> =
    HashMap::pinned(DEFAULT_MAX_SERVICES, BPF_F_NO_PREALLOC);

// The kernel requires BPF_F_NO_PREALLOC for LPM tries; aya adds it.
#[map(name = "WEIR_SRC_RANGE")]
pub static SRC_RANGES: LpmTrie<SrcRangeKey, u8> = LpmTrie::pinned(DEFAULT_MAX_SRC_RANGES, 0);

#[map(name = "WEIR_CONFIG")]
pub static CONFIG: Array<Config> = Array::pinned(1, 0);

// LRU: an entry per (socket, backend) the socket hooks translated. The
// release hook removes a socket's entries when it closes, so the table holds
// open sockets; the LRU only decides who loses when more are open than fit.
#[map(name = "WEIR_REVSOCK")]
pub static REVSOCK: LruHashMap<RevSockKey, RevSockValue> =
    LruHashMap::pinned(DEFAULT_MAX_REVSOCK, 0);

// Socket storage: the kernel allocates a value on a socket's first unconnected
// UDP send to a Service and frees it with the socket, so it needs no size and
// no collector. A BTF map because the kernel refuses to create socket storage
// without BTF key and value types. The loader pins it by path (BTF map
// definitions carry no pinning), so sockets keep their backends across an
// agent restart.
#[btf_map(name = "WEIR_SOCK_PICK")]
pub static SOCK_PICKS: SkStorage<SockPicks> = SkStorage::new();

// Maglev tables in chunks (see `weir_abi::maglev::CHUNK` for why not a
// hash of arrays). Allocated per chunk as written: most nodes hold few
// tables, and a preallocated map would reserve 4 KiB per chunk of capacity.
#[map(name = "WEIR_MAGLEV")]
pub static MAGLEV: HashMap<MaglevKey, MaglevChunk> = HashMap::pinned(
    DEFAULT_MAX_MAGLEV_TABLES * chunks(DEFAULT_TABLE_SIZE),
    BPF_F_NO_PREALLOC,
);

// LRU so that a full table evicts the oldest flows instead of refusing new ones;
// the agent's collector removes expired pairs long before that in normal use.
#[map(name = "WEIR_CT_TCP")]
pub static CT_TCP: LruHashMap<CtKey, CtValue> = LruHashMap::pinned(DEFAULT_MAX_CT, 0);

#[map(name = "WEIR_CT_UDP")]
pub static CT_UDP: LruHashMap<CtKey, CtValue> = LruHashMap::pinned(DEFAULT_MAX_CT, 0);

#[map(name = "WEIR_AFFINITY")]
pub static AFFINITY: LruHashMap<AffinityKey, AffinityValue> =
    LruHashMap::pinned(DEFAULT_MAX_AFFINITY, 0);

#[map(name = "WEIR_STATS")]
pub static STATS: PerCpuArray<StatValue> = PerCpuArray::pinned(STAT_ENTRIES, 0);

/// Per-CPU working space of the packet programs for values too large to
/// keep on the 512-byte stack. Index 0: TC, 1: XDP. Not pinned: it holds
/// nothing between two runs.
pub struct Scratch {
    pub h: crate::packet::Hdr,
    /// The frontend's master, copied once (64 bytes).
    pub master: ServiceValue,
    pub val: CtValue,
    pub rkey: CtKey,
    pub fib: bpf_fib_lookup,
    pub probe: Probe,
}

/// State of the SNAT port probe, shared with its `bpf_loop` callback (see
/// `packet::new_flow::alloc_snat_port`), which finds it here rather than
/// through a pointer to the caller's stack.
#[derive(Clone, Copy, Default)]
pub struct Probe {
    /// Offset into the range of the first port tried, `< span`.
    pub start: u32,
    /// Ports in the range, `1..=65536`.
    pub span: u32,
    /// First port of the range, host order.
    pub min: u32,
    /// Set by the callback once it claimed a port.
    pub found: u32,
}

#[map(name = "WEIR_SCRATCH")]
pub static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(2, 0);

/// Counts one packet (or socket call) of `bytes` under `(prog, reason)`.
#[inline(always)]
pub fn count(prog: u32, reason: u32, bytes: u64) {
    // Per-CPU values: no other CPU writes this slot. A rare lost increment when
    // a program is preempted on this CPU by another one counting here is an
    // acceptable price for not using atomics on every packet.
    if let Some(p) = STATS.get_ptr_mut(weir_abi::stat_index(prog, reason)) {
        // SAFETY: the pointer comes from a successful lookup of a per-CPU array.
        unsafe {
            (*p).packets += 1;
            (*p).bytes += bytes;
        }
    }
}

/// `CLOCK_MONOTONIC` in whole seconds, as the conntrack and affinity maps store it.
#[inline(always)]
pub fn now_secs() -> u32 {
    // SAFETY: bpf_ktime_get_ns is available to every program type.
    (unsafe { aya_ebpf::helpers::generated::bpf_ktime_get_ns() } / 1_000_000_000) as u32
}
