//! The ABI between Weir's kernel programs and `weir-agent`.
//!
//! Every type here is `#[repr(C)]` with explicit padding and no `bool`, because the
//! kernel programs and userspace read the same bytes. Each field documents its byte
//! order. "Network order" fields hold the value exactly as it appears in a
//! `sockaddr_in` (`sin_addr`, `sin_port`), so the socket hooks compare and copy them
//! without conversion; "host order" fields are plain integers.
//!
//! # Maps
//!
//! | pin name            | type      | key             | value            | written by |
//! |---------------------|-----------|-----------------|------------------|------------|
//! | [`MAP_SERVICES4`]   | hash      | [`Service4Key`] | [`Service4Value`]| agent      |
//! | [`MAP_BACKENDS4`]   | hash      | `u32` backend id| [`Backend4`]     | agent      |
//! | [`MAP_REVNAT4`]     | hash      | `u32` rev-NAT id| [`RevNat4`]      | agent      |
//! | [`MAP_REVSOCK4`]    | LRU hash  | [`RevSock4Key`] | [`RevSock4Value`]| datapath   |
//!
//! A frontend (`VIP:port/proto`) owns slot 0 of the services map, its *master*
//! entry, which carries the backend counts and the rev-NAT id. Slots
//! `1..=count` point at active backends and slots `count+1..=count+qcount` at
//! terminating ones that still serve. The agent writes backends, then slots, then
//! the master, then prunes, so a reader that sees a master always finds the slots
//! and backends it names.
#![no_std]

/// Pin name of the IPv4 services map.
pub const MAP_SERVICES4: &str = "WEIR_SVC4";
/// Pin name of the IPv4 backends map.
pub const MAP_BACKENDS4: &str = "WEIR_BACKEND4";
/// Pin name of the IPv4 rev-NAT map.
pub const MAP_REVNAT4: &str = "WEIR_REVNAT4";
/// Pin name of the IPv4 socket reverse-translation map.
pub const MAP_REVSOCK4: &str = "WEIR_REVSOCK4";

/// Default capacity of the services map: service-port entries, master and slots
/// together, as Cilium's `lbmap` default.
pub const DEFAULT_MAX_SERVICES: u32 = 65_536;
/// Default capacity of the backends map, as Calico's eBPF backend map.
pub const DEFAULT_MAX_BACKENDS: u32 = 262_144;
/// Capacity of the LRU map that remembers which VIP each socket connected to.
pub const DEFAULT_MAX_REVSOCK: u32 = 262_144;

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

/// Scope of a services-map entry: the frontend as every client sees it.
pub const SCOPE_ALL: u8 = 0;

/// Key of the services map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Service4Key {
    /// Frontend IPv4 address, network order.
    pub addr: u32,
    /// Frontend port, network order.
    pub port: u16,
    /// Slot, host order: 0 is the master entry, `1..` point at backends.
    pub slot: u16,
    /// IP protocol number (`PROTO_*`).
    pub proto: u8,
    /// `SCOPE_*`; reserved for traffic-policy scoped entries.
    pub scope: u8,
    /// Always zero, so keys hash the same in the kernel and in userspace.
    pub _pad: [u8; 2],
}

/// Value of the services map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Service4Value {
    /// Slots: the backend id, host order. Master: 0.
    pub backend_id: u32,
    /// Master: number of active backends, host order. Slots: 0.
    pub count: u16,
    /// Master: number of terminating backends after the active ones, host order.
    /// Slots: 0.
    pub qcount: u16,
    /// Rev-NAT id of the frontend, host order; the same in the master and its slots.
    pub rev_nat_id: u32,
    /// Reserved, zero.
    pub flags: u8,
    /// Always zero.
    pub _pad: [u8; 3],
}

/// Value of the backends map, keyed by a `u32` backend id (host order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Backend4 {
    /// Backend IPv4 address, network order.
    pub addr: u32,
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
pub struct RevNat4 {
    /// Frontend IPv4 address, network order.
    pub addr: u32,
    /// Frontend port, network order.
    pub port: u16,
    /// Always zero.
    pub _pad: [u8; 2],
}

/// Key of the socket reverse-translation map: one socket talking to one backend.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RevSock4Key {
    /// `bpf_get_socket_cookie()` of the client socket, host order.
    pub cookie: u64,
    /// Backend IPv4 address, network order.
    pub addr: u32,
    /// Backend port, network order.
    pub port: u16,
    /// Always zero.
    pub _pad: [u8; 2],
}

/// Value of the socket reverse-translation map: the frontend the socket asked for.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RevSock4Value {
    /// Frontend IPv4 address, network order.
    pub addr: u32,
    /// Frontend port, network order.
    pub port: u16,
    /// Always zero.
    pub _pad: [u8; 2],
    /// Rev-NAT id at connect time, host order. The reverse path translates only
    /// while the rev-NAT map still maps this id to the same frontend, so a deleted
    /// and recreated Service never borrows a stale translation.
    pub rev_nat_id: u32,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are `#[repr(C)]`, `Copy`, built only from integers, and
    // have explicit padding fields, so every byte pattern is a valid value.
    unsafe impl aya::Pod for super::Service4Key {}
    unsafe impl aya::Pod for super::Service4Value {}
    unsafe impl aya::Pod for super::Backend4 {}
    unsafe impl aya::Pod for super::RevNat4 {}
    unsafe impl aya::Pod for super::RevSock4Key {}
    unsafe impl aya::Pod for super::RevSock4Value {}
}

#[cfg(test)]
mod tests {
    use core::mem::size_of;

    use super::*;

    /// The kernel programs were compiled against these sizes; a change here is an
    /// ABI break that needs new pin names.
    #[test]
    fn sizes_are_stable() {
        assert_eq!(size_of::<Service4Key>(), 12);
        assert_eq!(size_of::<Service4Value>(), 16);
        assert_eq!(size_of::<Backend4>(), 12);
        assert_eq!(size_of::<RevNat4>(), 8);
        assert_eq!(size_of::<RevSock4Key>(), 16);
        assert_eq!(size_of::<RevSock4Value>(), 12);
    }
}
