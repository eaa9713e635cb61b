//! The ABI between Weir's kernel programs and `weir-agent`.
//!
//! Every type here is `#[repr(C)]` with explicit padding and no `bool`, because the
//! kernel programs and userspace read the same bytes. Each field documents its byte
//! order. "Network order" fields hold the value exactly as it appears on the wire
//! and in `sockaddr_in{,6}`, so the programs compare and copy them without
//! conversion; "host order" fields are plain integers.
//!
//! # Addresses
//!
//! Every map is dual-stack: an address is an [`Addr`] of 16 bytes, IPv6 as is and
//! IPv4 as the IPv4-mapped IPv6 address `::ffff:a.b.c.d` (as Linux's dual-stack
//! sockets and Katran's `vip_definition` do). A frontend's family is the family of
//! its address; the agent never gives a frontend a backend of the other family
//! and the datapath refuses one if it finds it, so v4 and v6 never mix within an
//! entry. One key space also means a v6 socket connecting to `::ffff:VIP` finds
//! the IPv4 Service, exactly as the kernel would route it.
//!
//! # Maps
//!
//! | pin name              | type        | key               | value             | written by |
//! |-----------------------|-------------|-------------------|-------------------|------------|
//! | [`MAP_SERVICES`]      | hash        | [`ServiceKey`]    | [`ServiceValue`]  | agent      |
//! | [`MAP_BACKENDS`]      | array, mmapable | `u32` backend id | [`Backend`]   | agent      |
//! | [`MAP_REVNAT`]        | hash        | `u32` rev-NAT id  | [`RevNat`]        | agent      |
//! | [`MAP_SRC_RANGES`]    | LPM trie    | [`SrcRangeKey`]   | `u8` (1)          | agent      |
//! | [`MAP_CONFIG`]        | array[1]    | `u32` 0           | [`Config`]        | agent      |
//! | [`MAP_REVSOCK`]       | LRU hash    | [`RevSockKey`]    | [`RevSockValue`]  | datapath   |
//! | [`MAP_SOCK_PICKS`]    | socket storage | the socket     | [`SockPicks`]     | datapath   |
//! | [`MAP_CT_TCP`]        | LRU hash    | [`CtKey`]         | [`CtValue`]       | datapath; agent GC |
//! | [`MAP_CT_UDP`]        | LRU hash    | [`CtKey`]         | [`CtValue`]       | datapath; agent GC |
//! | [`MAP_AFFINITY`]      | LRU hash    | [`AffinityKey`]   | [`AffinityValue`] | datapath   |
//! | [`MAP_STATS`]         | per-CPU array | `u32` [`stat_index`] | [`StatValue`] | datapath |
//!
//! A frontend (`addr:port/proto`) owns slot 0 of the services map, its *master*
//! entry, which carries the backend counts, the rev-NAT id and the frontend's
//! flags. Its backends have positions: `0..count` the active ones, then
//! `count..count+qcount` the terminating ones that still serve. Every entry
//! holds [`SVC_IDS`] positions' backend ids, the master the first ones, slot
//! `s` positions `s * SVC_IDS ..`; so a frontend of up to [`SVC_IDS`]
//! backends is one entry. The agent writes backends, then slots, then the
//! master, then prunes, so a reader that sees a master always finds the slots
//! and backends it names.
//!
//! NodePort frontends are written once per node address (not as a wildcard), so
//! the socket hooks and the packet programs find them with the same exact
//! lookup as any other frontend.
#![no_std]

pub mod maglev;
pub mod pick;

/// Pin name of the services map.
pub const MAP_SERVICES: &str = "WEIR_SVC";
/// Pin name of the backends map.
pub const MAP_BACKENDS: &str = "WEIR_BACKEND";
/// Pin name of the rev-NAT map.
pub const MAP_REVNAT: &str = "WEIR_REVNAT";
/// Pin name of the socket reverse-translation map.
pub const MAP_REVSOCK: &str = "WEIR_REVSOCK";
/// Pin name of the per-socket backend memory of unconnected UDP sockets.
pub const MAP_SOCK_PICKS: &str = "WEIR_SOCK_PICK";
/// Pin name of the TCP connection-tracking map.
pub const MAP_CT_TCP: &str = "WEIR_CT_TCP";
/// Pin name of the UDP (and SCTP) connection-tracking map.
pub const MAP_CT_UDP: &str = "WEIR_CT_UDP";
/// Pin name of the session-affinity map.
pub const MAP_AFFINITY: &str = "WEIR_AFFINITY";
/// Pin name of the `loadBalancerSourceRanges` LPM trie.
pub const MAP_SRC_RANGES: &str = "WEIR_SRC_RANGE";
/// Pin name of the datapath configuration (one [`Config`] at index 0).
pub const MAP_CONFIG: &str = "WEIR_CONFIG";
/// Pin name of the per-CPU packet counters.
pub const MAP_STATS: &str = "WEIR_STATS";
/// Pin name of the Maglev tables: a hash from
/// [`maglev::MaglevKey`] (a frontend's rev-NAT id and a chunk number) to
/// [`maglev::MaglevChunk`] (see [`maglev`]).
pub const MAP_MAGLEV: &str = "WEIR_MAGLEV";
/// Pin name of the frontend labels: rev-NAT id → [`SvcLabel`]. Written by
/// the agent for `weir-agent inspect`; no program reads it.
pub const MAP_SVC_LABELS: &str = "WEIR_SVC_LABEL";

/// Default capacity of the services map in entries: a master per frontend,
/// and a slot per [`SVC_IDS`] backends beyond the master's. Cilium's `lbmap`
/// default in number; each of Cilium's entries holds one backend.
pub const DEFAULT_MAX_SERVICES: u32 = 65_536;
/// Default capacity of the backends map, as Calico's eBPF backend map. The
/// array has one element more: id 0 means "none" and is never handed out.
pub const DEFAULT_MAX_BACKENDS: u32 = 262_144;
/// Default capacity of the LRU map that remembers which frontend each socket
/// was sent to (`--max-revsock`). Entries live as long as their socket, so
/// this bounds concurrently open translated sockets, not connections made.
pub const DEFAULT_MAX_REVSOCK: u32 = 262_144;
/// Default capacity of each conntrack map (Cilium's `bpf-ct-global-tcp-max`
/// default is 512Ki; each flow takes two entries, forward and reply).
pub const DEFAULT_MAX_CT: u32 = 524_288;
/// Default capacity of the affinity map (Cilium's `lbmap` affinity default).
pub const DEFAULT_MAX_AFFINITY: u32 = 65_536;
/// Default capacity of the source-range trie.
pub const DEFAULT_MAX_SRC_RANGES: u32 = 16_384;
/// Default number of Maglev tables (`--max-maglev-tables`). The map holds
/// chunks, allocated as they are written (4 KiB each, 68 KiB for a table of
/// the default size); its capacity in chunks is this times
/// [`maglev::chunks`] of the table size, and the kernel allocates 16 bytes
/// of hash buckets per chunk of capacity up front (2 MiB at the defaults).
pub const DEFAULT_MAX_MAGLEV_TABLES: u32 = 4_096;

/// `IPPROTO_TCP`.
pub const PROTO_TCP: u8 = 6;
/// `IPPROTO_UDP`.
pub const PROTO_UDP: u8 = 17;
/// `IPPROTO_SCTP`.
pub const PROTO_SCTP: u8 = 132;

/// Backend serves new connections (`ready: true`).
pub const BACKEND_STATE_ACTIVE: u8 = 0;
/// Backend is terminating but still serving (`serving: true, terminating: true`);
/// chosen only while the frontend has no active backend (KEP-1669).
pub const BACKEND_STATE_TERMINATING: u8 = 1;
/// Backend is terminating and no longer serving (`serving: false,
/// terminating: true`): in the backends map but in no slot, so flows already
/// tracked to it (conntrack) keep going while it drains and nothing new picks
/// it. Removed when the endpoint leaves its EndpointSlice.
pub const BACKEND_STATE_DRAINING: u8 = 2;

/// Scope of a services-map entry: the frontend as clients inside the cluster
/// see it (pods and the node's own processes), and as everyone sees a frontend
/// that has no [`SCOPE_EXTERNAL`] entries.
pub const SCOPE_ALL: u8 = 0;
/// Scope of the entries the packet programs use for traffic arriving from
/// outside when the `SCOPE_ALL` master has [`SVC_F_LOCAL`]: the frontend with
/// only this node's endpoints (`externalTrafficPolicy: Local`), while the
/// `SCOPE_ALL` entries keep every endpoint for in-cluster clients, as
/// kube-proxy sends pod and node traffic for external destinations to any
/// endpoint. Same master/slot layout, its own rev-NAT id.
pub const SCOPE_EXTERNAL: u8 = 1;

/// [`ServiceValue::flags`]: a NodePort, externalIP or load-balancer ingress
/// frontend, reachable from outside the node. ClusterIP frontends have it clear.
pub const SVC_F_EXTERNAL: u16 = 1 << 0;
/// [`ServiceValue::flags`]: a NodePort frontend (one per node address).
pub const SVC_F_NODEPORT: u16 = 1 << 1;
/// [`ServiceValue::flags`]: `externalTrafficPolicy: Local`. On the `SCOPE_ALL`
/// master it tells the packet programs to use the [`SCOPE_EXTERNAL`] entries,
/// which hold only this node's endpoints; there the datapath keeps the
/// client's source address (no SNAT) and drops new flows while
/// `count + qcount` is 0.
pub const SVC_F_LOCAL: u16 = 1 << 2;
/// [`ServiceValue::flags`]: `sessionAffinity: ClientIP`, timeout in
/// [`ServiceValue::affinity_timeout`].
pub const SVC_F_AFFINITY: u16 = 1 << 3;
/// [`ServiceValue::flags`]: `loadBalancerSourceRanges` apply; a new flow is
/// accepted only if [`MAP_SRC_RANGES`] holds a prefix of
/// `(rev_nat_id, client address)`.
pub const SVC_F_SRC_RANGES: u16 = 1 << 4;
/// [`ServiceValue::flags`]: new flows from outside the node (the packet
/// programs) pick their backend from the frontend's Maglev table in
/// [`MAP_MAGLEV`], so every node sends a given flow to the same backend. The
/// master's [`ServiceValue::table_size`] holds the table's size. Sockets pick
/// at random as before: their flows never leave the node they start on.
pub const SVC_F_MAGLEV: u16 = 1 << 5;

/// An IPv4 or IPv6 address, network order: the 16 bytes of `in6_addr`, read as
/// four `u32` words in memory order (as `s6_addr32` and `bpf_sock_addr.user_ip6`).
/// IPv4 is `::ffff:a.b.c.d`: words `[0, 0, V4_MAPPED_WORD, sin_addr]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Addr(pub [u32; 4]);

/// Third word of an IPv4-mapped address (`00 00 ff ff` in memory).
pub const V4_MAPPED_WORD: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

impl Addr {
    /// The mapped form of an IPv4 address given as `sin_addr` (network order).
    #[inline(always)]
    pub const fn from_v4(sin_addr: u32) -> Self {
        Self([0, 0, V4_MAPPED_WORD, sin_addr])
    }

    #[inline(always)]
    pub const fn is_v4(&self) -> bool {
        self.0[0] == 0 && self.0[1] == 0 && self.0[2] == V4_MAPPED_WORD
    }

    /// `sin_addr` of an IPv4-mapped address.
    #[inline(always)]
    pub const fn v4(&self) -> u32 {
        self.0[3]
    }
}

/// An address as the maps hold it: IPv4 becomes `::ffff:a.b.c.d`. Userspace
/// only; one conversion for the agent and the test tools that read its maps.
#[cfg(feature = "user")]
impl From<core::net::IpAddr> for Addr {
    fn from(addr: core::net::IpAddr) -> Self {
        let v6 = match addr {
            core::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            core::net::IpAddr::V6(v6) => v6,
        };
        let o = v6.octets();
        let word = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
        Self([word(0), word(4), word(8), word(12)])
    }
}

/// The inverse: mapped addresses come back as IPv4.
#[cfg(feature = "user")]
impl From<Addr> for core::net::IpAddr {
    fn from(addr: Addr) -> Self {
        let mut o = [0u8; 16];
        for (i, w) in addr.0.iter().enumerate() {
            o[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        core::net::Ipv6Addr::from(o).to_canonical()
    }
}

/// Key of the services map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// Frontend address, network order.
    pub addr: Addr,
    /// Frontend port, network order.
    pub port: u16,
    /// Slot, host order: 0 is the master entry; slot `s` holds the backend ids
    /// of positions `s * SVC_IDS ..`.
    pub slot: u16,
    /// IP protocol number (`PROTO_*`).
    pub proto: u8,
    /// `SCOPE_ALL`, or `SCOPE_EXTERNAL` for the local-only view of an
    /// `externalTrafficPolicy: Local` frontend.
    pub scope: u8,
    /// Always zero, so keys hash the same in the kernel and in userspace.
    pub _pad: [u8; 2],
}

/// Backend ids a services-map entry holds. With the master's fields they
/// make a 64-byte value, one cache line: a lookup brings a small frontend's
/// whole backend list, and a frontend takes one entry per 11 backends (at
/// 100k Services of 10 endpoints, a tenth of the entries of one per backend,
/// and a tenth of the hash inserts a cold sync makes).
pub const SVC_IDS: usize = 11;

/// Services-map entries a frontend of `positions` backends takes: its
/// master, and a slot per [`SVC_IDS`] past the master's.
pub const fn service_entries(positions: usize) -> usize {
    let n = positions.div_ceil(SVC_IDS);
    if n == 0 { 1 } else { n }
}

/// Where position `p` is held: the slot of its entry (0, the master, for
/// the first [`SVC_IDS`]) and its index in that entry's `ids`. `None` past
/// the last slot a `u16` can name.
pub const fn position_slot(p: usize) -> Option<(u16, usize)> {
    let slot = p / SVC_IDS;
    if slot > u16::MAX as usize {
        return None;
    }
    Some((slot as u16, p % SVC_IDS))
}

/// Value of the services map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceValue {
    /// Master with [`SVC_F_MAGLEV`]: the size of the frontend's Maglev
    /// table, host order. Otherwise 0.
    pub table_size: u32,
    /// Master: number of active backends, host order. Slots: 0.
    pub count: u16,
    /// Master: number of terminating backends after the active ones, host order.
    /// Slots: 0.
    pub qcount: u16,
    /// Rev-NAT id of the frontend, host order; the same in the master and its slots.
    pub rev_nat_id: u32,
    /// Master: `SVC_F_*`, host order. Slots: 0.
    pub flags: u16,
    /// Always zero.
    pub _pad: [u8; 2],
    /// Master with [`SVC_F_AFFINITY`]: `sessionAffinityConfig.clientIP.timeoutSeconds`,
    /// host order (1..=86400). Otherwise 0.
    pub affinity_timeout: u32,
    /// Backend ids, host order, of positions `slot * SVC_IDS ..` (see the
    /// crate docs); 0 past the frontend's last position.
    pub ids: [u32; SVC_IDS],
}

/// The services map's value before an entry held several backends (until
/// 2026-12): a slot per backend, slot `p + 1` holding position `p`'s id.
/// Userspace only, for the agent that carries such a map over.
#[cfg(feature = "user")]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceValueV1 {
    /// Slots: the backend id. Master: the Maglev table size, or 0.
    pub backend_id: u32,
    pub count: u16,
    pub qcount: u16,
    pub rev_nat_id: u32,
    pub flags: u16,
    pub _pad: [u8; 2],
    pub affinity_timeout: u32,
}

/// Value of the backends map, an array indexed by backend id (host order). An
/// element of zeros (rev-NAT id 0) is a free id: no backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Backend {
    /// Backend address, network order; same family as its frontend.
    pub addr: Addr,
    /// Backend port, network order.
    pub port: u16,
    /// IP protocol number (`PROTO_*`).
    pub proto: u8,
    /// `BACKEND_STATE_*`.
    pub state: u8,
    /// Rev-NAT id of the frontend that owns this backend, host order. The
    /// datapath only uses a backend whose owner matches the master it read, so
    /// a reader racing with an id being freed and reused can never reach
    /// another Service's backend.
    pub rev_nat_id: u32,
}

/// Value of the rev-NAT map, keyed by a `u32` rev-NAT id (host order): the
/// frontend that replies from a backend must appear to come from.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RevNat {
    /// Frontend address, network order.
    pub addr: Addr,
    /// Frontend port, network order.
    pub port: u16,
    /// Always zero.
    pub _pad: [u8; 2],
}

/// `SvcLabel::kind`: which field of its Service a frontend comes from.
pub const SVC_KIND_CLUSTER_IP: u8 = 1;
pub const SVC_KIND_NODE_PORT: u8 = 2;
pub const SVC_KIND_EXTERNAL_IP: u8 = 3;
pub const SVC_KIND_LOAD_BALANCER: u8 = 4;

/// Bytes of [`SvcLabel::text`]: a namespace and a Service name (DNS labels,
/// 63 bytes at most) and a port name (15) fit with room to spare.
pub const SVC_LABEL_TEXT: usize = 156;

/// Value of [`MAP_SVC_LABELS`], keyed by a `u32` rev-NAT id (host order):
/// the Service port a frontend serves, so that `inspect` names it after an
/// agent restart, when only the maps remain.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SvcLabel {
    /// `SVC_KIND_*`.
    pub kind: u8,
    /// Lengths of the three parts of `text`, in bytes.
    pub namespace_len: u8,
    pub name_len: u8,
    pub port_len: u8,
    /// Namespace, Service name and port name, back to back, UTF-8; zero
    /// after them.
    pub text: [u8; SVC_LABEL_TEXT],
}

impl Default for SvcLabel {
    fn default() -> Self {
        Self {
            kind: 0,
            namespace_len: 0,
            name_len: 0,
            port_len: 0,
            text: [0; SVC_LABEL_TEXT],
        }
    }
}

/// Key of the socket reverse-translation map: one socket talking to one backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RevSockKey {
    /// `bpf_get_socket_cookie()` of the client socket, host order.
    pub cookie: u64,
    /// Backend address, network order.
    pub addr: Addr,
    /// Backend port, network order.
    pub port: u16,
    /// Always zero.
    pub _pad: [u8; 6],
}

/// Value of the socket reverse-translation map: the frontend the socket asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RevSockValue {
    /// Frontend address, network order.
    pub addr: Addr,
    /// Frontend port, network order.
    pub port: u16,
    /// Always zero.
    pub _pad: [u8; 2],
    /// Rev-NAT id at connect time, host order. The reverse path translates only
    /// while the rev-NAT map still maps this id to the same frontend, so a deleted
    /// and recreated Service never borrows a stale translation.
    pub rev_nat_id: u32,
}

/// Frontends one unconnected UDP socket keeps a backend for (see [`SockPicks`]).
pub const SOCK_PICKS: usize = 4;

/// The backend an unconnected UDP socket was sent to for one frontend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SockPick {
    /// Rev-NAT id of the frontend, host order; 0: unused entry.
    pub rev_nat_id: u32,
    /// Backend id chosen, host order.
    pub backend_id: u32,
    /// Backend address, network order: what the id named when it was chosen,
    /// so an id freed and reused for another address is not followed, and
    /// the key of the socket's [`MAP_REVSOCK`] entry when it is released.
    pub addr: Addr,
    /// Backend port, network order.
    pub port: u16,
    /// Always zero.
    pub _pad: [u8; 2],
}

/// Value of [`MAP_SOCK_PICKS`], socket-local storage the kernel frees with
/// the socket: the backends an unconnected UDP socket keeps, per frontend,
/// so that every datagram of a QUIC, DTLS or SIP client reaches the backend
/// that holds its state (kube-proxy gets this from conntrack). A socket
/// sending to more frontends than [`SOCK_PICKS`] replaces its entries in
/// turn, and the frontends it replaced pick afresh on their next datagram.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SockPicks {
    pub picks: [SockPick; SOCK_PICKS],
    /// The entry to replace next when none is free or matches, `< SOCK_PICKS`.
    pub next: u32,
}

/// [`CtKey::dir`]: the entry of the client → frontend tuple as it arrived.
pub const CT_DIR_FORWARD: u8 = 0;
/// [`CtKey::dir`]: the entry of the backend → client (or SNAT address) tuple of
/// the replies.
pub const CT_DIR_REPLY: u8 = 1;

/// Key of the conntrack maps: a packet's tuple exactly as it appears in its
/// headers when it reaches the programs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CtKey {
    /// Source address, network order.
    pub saddr: Addr,
    /// Destination address, network order.
    pub daddr: Addr,
    /// Source port, network order.
    pub sport: u16,
    /// Destination port, network order.
    pub dport: u16,
    /// IP protocol number (`PROTO_*`).
    pub proto: u8,
    /// `CT_DIR_*`.
    pub dir: u8,
    /// Always zero.
    pub _pad: [u8; 2],
}

impl CtKey {
    /// The key of the other entry of this entry's flow, derived from its value
    /// `v`. The two directions are symmetric: a forward value rewrites towards
    /// the backend from the (SNAT or client) source, which is exactly the
    /// reply's tuple reversed; a reply value rewrites towards the client from
    /// the frontend, the forward tuple reversed. One definition for the
    /// datapath and the agent's collector, which must agree on it.
    #[inline(always)]
    pub const fn peer(&self, v: &CtValue) -> CtKey {
        CtKey {
            saddr: v.nat_daddr,
            daddr: v.nat_saddr,
            sport: v.nat_dport,
            dport: v.nat_sport,
            proto: self.proto,
            dir: if self.dir == CT_DIR_FORWARD {
                CT_DIR_REPLY
            } else {
                CT_DIR_FORWARD
            },
            _pad: [0; 2],
        }
    }
}

/// [`CtValue::flags`]: the forward direction rewrote the source (SNAT).
pub const CT_F_SNAT: u8 = 1 << 0;
/// [`CtValue::flags`]: the flow was created by the XDP program.
pub const CT_F_XDP: u8 = 1 << 1;
/// [`CtValue::flags`]: the frontend is a ClusterIP translated per packet.
pub const CT_F_CLUSTERIP: u8 = 1 << 2;
/// [`CtValue::flags`]: the client (forward direction) sent a FIN. Set on both
/// entries of the flow; TCP is closing only once both FINs (or an RST) were
/// seen, so a half-closed connection keeps the established timeout.
pub const CT_F_FIN_FORWARD: u8 = 1 << 3;
/// [`CtValue::flags`]: the backend (reply direction) sent a FIN. Set on both
/// entries of the flow.
pub const CT_F_FIN_REPLY: u8 = 1 << 4;

/// [`CtValue::tcp_state`]: a SYN was seen, no reply yet.
pub const CT_TCP_SYN_SENT: u8 = 1;
/// [`CtValue::tcp_state`]: the backend answered.
pub const CT_TCP_ESTABLISHED: u8 = 2;
/// [`CtValue::tcp_state`]: a FIN or RST was seen.
pub const CT_TCP_CLOSING: u8 = 3;

/// Value of the conntrack maps. The forward entry says how to rewrite the
/// client's packets; the reply entry how to rewrite the backend's. Each
/// names the other's key, so the collector removes a flow's two entries
/// together, and only once both have expired.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CtValue {
    /// New destination address, network order. Forward: the backend. Reply:
    /// the original client (undoing SNAT).
    pub nat_daddr: Addr,
    /// New source address, network order. Forward: the SNAT address, or the
    /// client's own when there is no SNAT. Reply: the frontend.
    pub nat_saddr: Addr,
    /// New destination port, network order (forward: backend; reply: client).
    pub nat_dport: u16,
    /// New source port, network order (forward: SNAT port or the client's;
    /// reply: the frontend port).
    pub nat_sport: u16,
    /// Backend id chosen, host order. A forward entry whose backend is no longer
    /// in the backends map (or now belongs to another frontend) is a dead flow:
    /// the next packet picks a fresh backend.
    pub backend_id: u32,
    /// Rev-NAT id of the frontend, host order.
    pub rev_nat_id: u32,
    /// `CLOCK_MONOTONIC` seconds (`bpf_ktime_get_ns() / 1e9`) after which the
    /// entry is expired, host order. The collector in the agent deletes
    /// expired pairs; the datapath refreshes it on every packet.
    pub expires: u32,
    /// `CT_TCP_*` for TCP, 0 otherwise.
    pub tcp_state: u8,
    /// `CT_F_*`.
    pub flags: u8,
    /// Always zero.
    pub _pad: [u8; 2],
    /// Forward entry of a TCP flow: the sequence number a reset from the
    /// backend must carry to close the flow, host order. In SYN_SENT the
    /// client's SYN sequence number + 1 (which an RST answering the SYN
    /// acknowledges); afterwards the client's last acknowledgement number,
    /// i.e. its `RCV.NXT` (RFC 5961 §3.2: only an RST with exactly that
    /// sequence number resets). Reply entry: the index of the device the
    /// backend's replies arrive on (the egress device of the route to the
    /// backend); a reply-direction packet arriving on another device is not
    /// treated as a reply. 0: not known (entries of older agents, no route),
    /// any device.
    pub aux: u32,
    /// Packets seen on this entry, host order.
    pub packets: u64,
    /// Bytes seen on this entry (IP total length), host order.
    pub bytes: u64,
}

/// Key of the affinity map (Cilium's `lb_affinity_key`): one client of one
/// frontend. Socket clients are keyed by their network namespace, packet
/// clients by their address; the other field is zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AffinityKey {
    /// Client address for the packet programs, network order; zero for sockets.
    pub client: Addr,
    /// `bpf_get_netns_cookie()` of a socket client, host order; zero for packets.
    pub netns_cookie: u64,
    /// Rev-NAT id of the frontend, host order.
    pub rev_nat_id: u32,
    /// Always zero.
    pub _pad: [u8; 4],
}

/// Value of the affinity map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AffinityValue {
    /// Backend id the client sticks to, host order.
    pub backend_id: u32,
    /// `CLOCK_MONOTONIC` seconds of the last use, host order. The entry holds
    /// while `now - last_used <= affinity_timeout`.
    pub last_used: u32,
}

/// Data of a source-range LPM key. The trie key's prefix length counts bits
/// from the start of this struct: 32 for the rev-NAT id plus the range's
/// prefix length within the 128-bit (IPv4-mapped) address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SrcRangeKey {
    /// Rev-NAT id of the frontend, **network order** (LPM tries match bytes
    /// from the first).
    pub rev_nat_id: u32,
    /// Range address, network order.
    pub addr: Addr,
}

/// [`Config::flags`]: the cgroup socket hooks are attached (`--socket-lb`).
pub const CFG_F_SOCKET_LB: u32 = 1 << 0;
/// [`Config::flags`]: the kernel knows `BPF_F_IPV6` for
/// `bpf_l4_csum_replace` (6.16+), which keeps `skb->csum` right on IPv6
/// address rewrites of CHECKSUM_COMPLETE packets.
pub const CFG_F_CSUM_IPV6: u32 = 1 << 1;

/// The datapath's tunables, written by the agent at start (index 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Config {
    /// TCP conntrack timeout before the backend answered, seconds, host order.
    pub ct_tcp_syn: u32,
    /// TCP established timeout, seconds, host order.
    pub ct_tcp_established: u32,
    /// TCP timeout after FIN or RST, seconds, host order.
    pub ct_tcp_closing: u32,
    /// UDP and SCTP timeout, seconds, host order.
    pub ct_udp: u32,
    /// `CFG_F_*`, host order.
    pub flags: u32,
    /// First SNAT source port, host order. The range must stay outside the
    /// node's `ip_local_port_range`: the programs cannot see the host's own
    /// sockets, so a shared range would hand out tuples local connections use.
    pub snat_port_min: u16,
    /// Last SNAT source port, host order.
    pub snat_port_max: u16,
}

/// Cilium's defaults: `bpf-ct-timeout-regular-tcp-syn` 60 s,
/// `-regular-tcp` 6 h, `-regular-tcp-fin` 10 s, `-regular-any` 60 s.
pub const DEFAULT_CONFIG: Config = Config {
    ct_tcp_syn: 60,
    ct_tcp_established: 21_600,
    ct_tcp_closing: 10,
    ct_udp: 60,
    flags: CFG_F_SOCKET_LB,
    snat_port_min: DEFAULT_SNAT_PORT_MIN,
    snat_port_max: DEFAULT_SNAT_PORT_MAX,
};

/// Default SNAT port range: above Linux's default `ip_local_port_range`
/// (32768-60999), so SNAT never collides with the node's own connections.
pub const DEFAULT_SNAT_PORT_MIN: u16 = 61_000;
pub const DEFAULT_SNAT_PORT_MAX: u16 = 65_535;

/// Value of the per-CPU stats array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StatValue {
    /// Packets (or socket calls), host order.
    pub packets: u64,
    /// Bytes (IP total length; 0 for socket calls), host order.
    pub bytes: u64,
}

/// Programs that count, the first index of [`stat_index`].
pub const STAT_PROG_XDP: u32 = 0;
pub const STAT_PROG_TC_INGRESS: u32 = 1;
pub const STAT_PROG_SOCK: u32 = 2;
pub const STAT_PROGS: u32 = 3;
/// Display names of `STAT_PROG_*`, by index.
pub const STAT_PROG_NAMES: [&str; STAT_PROGS as usize] = ["xdp", "tc-ingress", "sock"];

/// Outcomes and drop reasons, the second index of [`stat_index`].
/// Not a frontend or flow of ours; passed on untouched.
pub const STAT_PASS: u32 = 0;
/// New flow translated to a backend.
pub const STAT_NEW_FLOW: u32 = 1;
/// Packet of a tracked flow translated forward.
pub const STAT_FORWARD: u32 = 2;
/// Reply translated back to the frontend.
pub const STAT_REPLY: u32 = 3;
/// Dropped: the frontend has no backend it may use.
pub const STAT_DROP_NO_BACKEND: u32 = 4;
/// Dropped: the client is outside `loadBalancerSourceRanges`.
pub const STAT_DROP_SRC_RANGE: u32 = 5;
/// Dropped: no free SNAT port for this backend.
pub const STAT_DROP_SNAT_PORTS: u32 = 6;
/// Dropped: a conntrack entry could not be written.
pub const STAT_DROP_CT_FULL: u32 = 7;
/// Dropped: headers could not be read or rewritten.
pub const STAT_DROP_MALFORMED: u32 = 8;
/// Passed: IP fragment or options the programs do not translate.
pub const STAT_PASS_UNSUPPORTED: u32 = 9;
/// XDP only: a frontend packet left for TC (could not be handled in XDP).
pub const STAT_XDP_TO_TC: u32 = 10;
/// Socket only: connect/sendmsg refused (no backend).
pub const STAT_SOCK_REFUSED: u32 = 11;
/// Dropped: the kernel has no route to the backend (FIB lookup failed), so
/// there is no address to SNAT to or next hop to redirect to.
pub const STAT_DROP_NO_ROUTE: u32 = 12;
/// Dropped: the translated packet exceeds the egress MTU (FIB lookup said
/// fragmentation needed).
pub const STAT_DROP_FRAG_NEEDED: u32 = 13;
/// Dropped: a TCP packet to a frontend without a tracked flow that is not
/// a SYN, which netfilter's conntrack calls invalid
/// (`nf_conntrack_tcp_loose=0`).
pub const STAT_DROP_CT_INVALID: u32 = 14;
/// A packet from a flow's backend side translated to the client but not
/// allowed to change the flow, as netfilter ignores it: an RST whose
/// sequence number is not the client's `RCV.NXT` (RFC 5961: the client
/// answers an in-window one with a challenge ACK, to which a backend that
/// really reset sends the exact one), or a SYN on an established flow.
pub const STAT_REPLY_IGNORED: u32 = 15;
pub const STAT_REASONS: u32 = 16;
/// Display names of the `STAT_*` reasons, by index.
pub const STAT_REASON_NAMES: [&str; STAT_REASONS as usize] = [
    "pass",
    "new-flow",
    "forward",
    "reply",
    "drop-no-backend",
    "drop-source-range",
    "drop-snat-ports",
    "drop-ct-full",
    "drop-malformed",
    "pass-unsupported",
    "xdp-to-tc",
    "sock-refused",
    "drop-no-route",
    "drop-frag-needed",
    "drop-ct-invalid",
    "reply-ignored",
];
/// Entries of [`MAP_STATS`].
pub const STAT_ENTRIES: u32 = STAT_PROGS * STAT_REASONS;

/// Index of `(program, reason)` in [`MAP_STATS`].
#[inline(always)]
pub const fn stat_index(prog: u32, reason: u32) -> u32 {
    prog * STAT_REASONS + reason
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are `#[repr(C)]`, `Copy`, built only from integers, and
    // have explicit padding fields, so every byte pattern is a valid value.
    unsafe impl aya::Pod for super::Addr {}
    unsafe impl aya::Pod for super::ServiceKey {}
    unsafe impl aya::Pod for super::ServiceValue {}
    unsafe impl aya::Pod for super::ServiceValueV1 {}
    unsafe impl aya::Pod for super::Backend {}
    unsafe impl aya::Pod for super::RevNat {}
    unsafe impl aya::Pod for super::SvcLabel {}
    unsafe impl aya::Pod for super::RevSockKey {}
    unsafe impl aya::Pod for super::RevSockValue {}
    unsafe impl aya::Pod for super::SockPicks {}
    unsafe impl aya::Pod for super::CtKey {}
    unsafe impl aya::Pod for super::CtValue {}
    unsafe impl aya::Pod for super::AffinityKey {}
    unsafe impl aya::Pod for super::AffinityValue {}
    unsafe impl aya::Pod for super::SrcRangeKey {}
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::StatValue {}
    unsafe impl aya::Pod for super::maglev::MaglevKey {}
    unsafe impl aya::Pod for super::maglev::MaglevChunk {}
}

#[cfg(test)]
mod tests {
    use core::mem::size_of;

    use super::*;

    #[test]
    fn positions_fill_the_master_then_one_slot_per_eleven() {
        let entries = [0, 1, 11, 12, 22, 23].map(service_entries);
        assert_eq!(entries, [1, 1, 1, 2, 2, 3]);
        let at = [0, 10, 11, 21, 22].map(|p| position_slot(p).unwrap());
        assert_eq!(at, [(0, 0), (0, 10), (1, 0), (1, 10), (2, 0)]);
        assert_eq!(position_slot(SVC_IDS * 65_536), None);
    }

    /// The kernel programs were compiled against these sizes; a change here is an
    /// ABI break that needs new pin names.
    #[test]
    fn sizes_are_stable() {
        assert_eq!(size_of::<Addr>(), 16);
        assert_eq!(size_of::<ServiceKey>(), 24);
        assert_eq!(size_of::<ServiceValue>(), 64);
        #[cfg(feature = "user")]
        assert_eq!(size_of::<ServiceValueV1>(), 20);
        assert_eq!(size_of::<Backend>(), 24);
        assert_eq!(size_of::<RevNat>(), 20);
        assert_eq!(size_of::<SvcLabel>(), 160);
        assert_eq!(size_of::<RevSockKey>(), 32);
        assert_eq!(size_of::<RevSockValue>(), 24);
        assert_eq!(size_of::<SockPicks>(), 116);
        assert_eq!(size_of::<CtKey>(), 40);
        assert_eq!(size_of::<CtValue>(), 72);
        assert_eq!(size_of::<AffinityKey>(), 32);
        assert_eq!(size_of::<AffinityValue>(), 8);
        assert_eq!(size_of::<SrcRangeKey>(), 20);
        assert_eq!(size_of::<Config>(), 24);
        assert_eq!(size_of::<StatValue>(), 16);
    }

    #[test]
    fn v4_mapping_matches_in6_addr_bytes() {
        let a = Addr::from_v4(u32::from_ne_bytes([10, 96, 0, 1]));
        let mut bytes = [0u8; 16];
        for (i, w) in a.0.iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        assert_eq!(
            bytes,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 96, 0, 1]
        );
        assert!(a.is_v4());
    }
}
