//! Socket-level load balancing (IPv4 and IPv6).
//!
//! `connect` and `sendmsg` rewrite a destination `frontend:port` to a backend
//! before the socket ever builds a packet, so no per-packet NAT is needed. They
//! remember the frontend per socket cookie; `getpeername` and `recvmsg` use that
//! to show the application the address it asked for.
//!
//! An unconnected UDP socket keeps the backend it was first sent to, per
//! frontend, in socket storage (`SOCK_PICKS`), as long as that backend stays
//! owned by the frontend and is not draining: every datagram of a QUIC or DTLS
//! session must reach the server that holds its state. TCP and connected UDP
//! pick once, at connect. `sock_release` removes what a socket left in the
//! reverse map, so the map holds open sockets rather than history.
//!
//! The v6 hooks also see IPv4-mapped destinations of dual-stack sockets; the
//! maps store IPv4 in that same mapped form, so such a destination finds the
//! IPv4 frontend with no special case.
use aya_ebpf::{
    EbpfContext as _,
    bindings::{bpf_sock, bpf_sock_addr},
    helpers::generated::{
        bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_set_retval, bpf_sk_storage_get,
    },
    macros::{cgroup_sock, cgroup_sock_addr},
    programs::{SockAddrContext, SockContext},
};
use weir_abi::{
    Addr, AffinityKey, PROTO_SCTP, PROTO_TCP, PROTO_UDP, RevSockKey, RevSockValue, SCOPE_ALL,
    SOCK_PICKS as PICKS_PER_SOCKET, STAT_FORWARD, STAT_NEW_FLOW, STAT_PASS, STAT_PROG_SOCK,
    STAT_REPLY, STAT_SOCK_REFUSED, SVC_F_AFFINITY, SVC_F_SRC_RANGES, ServiceKey, ServiceValue,
    SockPick, SockPicks,
};

use crate::{
    maps::{REVNAT, REVSOCK, SERVICES, SOCK_PICKS, count, now_secs},
    pick::{Fresh, Pick, choose, sticky_backend},
};

/// Return value that lets the syscall go on.
const SYS_PROCEED: i32 = 1;
/// Return value that fails the syscall with the errno set by `bpf_set_retval`.
const SYS_REJECT: i32 = 0;
const ECONNREFUSED: i32 = 111;
const AF_INET: u32 = 2;

/// `forward`'s `SEND`: the call is a `sendmsg` with an address.
const CONNECT: bool = false;
const SEND: bool = true;

#[cgroup_sock_addr(connect4)]
pub fn weir_connect4(ctx: SockAddrContext) -> i32 {
    forward::<false, CONNECT>(&ctx)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn weir_sendmsg4(ctx: SockAddrContext) -> i32 {
    forward::<false, SEND>(&ctx)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn weir_recvmsg4(ctx: SockAddrContext) -> i32 {
    reverse::<false>(&ctx);
    SYS_PROCEED
}

#[cgroup_sock_addr(getpeername4)]
pub fn weir_getpeername4(ctx: SockAddrContext) -> i32 {
    reverse::<false>(&ctx);
    SYS_PROCEED
}

/// Every inet socket of the cgroup passes here once, as it closes.
#[cgroup_sock(sock_release)]
pub fn weir_sock_release(ctx: SockContext) -> i32 {
    release(&ctx);
    SYS_PROCEED
}

#[cgroup_sock_addr(connect6)]
pub fn weir_connect6(ctx: SockAddrContext) -> i32 {
    forward::<true, CONNECT>(&ctx)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn weir_sendmsg6(ctx: SockAddrContext) -> i32 {
    forward::<true, SEND>(&ctx)
}

#[cgroup_sock_addr(recvmsg6)]
pub fn weir_recvmsg6(ctx: SockAddrContext) -> i32 {
    reverse::<true>(&ctx);
    SYS_PROCEED
}

#[cgroup_sock_addr(getpeername6)]
pub fn weir_getpeername6(ctx: SockAddrContext) -> i32 {
    reverse::<true>(&ctx);
    SYS_PROCEED
}

/// The destination address of the call, in the maps' dual-stack form.
#[inline(always)]
fn read_addr<const V6: bool>(sa: *mut bpf_sock_addr) -> Addr {
    // SAFETY: `sa` is the kernel's context. Volatile word reads keep the
    // accesses at the 4-byte width the verifier accepts for every field.
    unsafe {
        if V6 {
            let p = &raw const (*sa).user_ip6;
            Addr([
                core::ptr::read_volatile(&raw const (*p)[0]),
                core::ptr::read_volatile(&raw const (*p)[1]),
                core::ptr::read_volatile(&raw const (*p)[2]),
                core::ptr::read_volatile(&raw const (*p)[3]),
            ])
        } else {
            Addr::from_v4(core::ptr::read_volatile(&raw const (*sa).user_ip4))
        }
    }
}

#[inline(always)]
fn write_addr<const V6: bool>(sa: *mut bpf_sock_addr, addr: &Addr, port: u16) {
    // SAFETY: as in `read_addr`; these fields are writable in all four hooks.
    unsafe {
        if V6 {
            let p = &raw mut (*sa).user_ip6;
            core::ptr::write_volatile(&raw mut (*p)[0], addr.0[0]);
            core::ptr::write_volatile(&raw mut (*p)[1], addr.0[1]);
            core::ptr::write_volatile(&raw mut (*p)[2], addr.0[2]);
            core::ptr::write_volatile(&raw mut (*p)[3], addr.0[3]);
        } else {
            core::ptr::write_volatile(&raw mut (*sa).user_ip4, addr.v4());
        }
        // user_port holds sin_port (network order) in its low 16 bits.
        core::ptr::write_volatile(&raw mut (*sa).user_port, u32::from(port));
    }
}

#[inline(always)]
fn forward<const V6: bool, const SEND: bool>(ctx: &SockAddrContext) -> i32 {
    let sa = ctx.sock_addr;
    // SAFETY: the kernel hands every sock_addr program a valid context.
    let proto = unsafe { core::ptr::read_volatile(&raw const (*sa).protocol) } as u8;
    if proto != PROTO_TCP && proto != PROTO_UDP && proto != PROTO_SCTP {
        return SYS_PROCEED;
    }
    let frontend = read_addr::<V6>(sa);
    // SAFETY: as above.
    let port = unsafe { core::ptr::read_volatile(&raw const (*sa).user_port) } as u16;
    let mut key = ServiceKey {
        addr: frontend,
        port,
        slot: 0,
        proto,
        scope: SCOPE_ALL,
        _pad: [0; 2],
    };
    // SAFETY: values are plain integers, and an element's memory outlives
    // the program's RCU read section (its contents may change: maps.rs).
    let Some(master) = (unsafe { SERVICES.get(key) }) else {
        return SYS_PROCEED;
    };
    let master = *master;
    // loadBalancerSourceRanges are checked per packet by TC, which sees the
    // client's address; translating here would hand the connection to a
    // backend before any check. SCOPE_ALL also means SVC_F_LOCAL is ignored:
    // in-cluster clients may use every endpoint, as with kube-proxy.
    if master.flags & SVC_F_SRC_RANGES != 0 {
        count(STAT_PROG_SOCK, STAT_PASS, 0);
        return SYS_PROCEED;
    }
    // A frontend we own never falls through to the address itself: no usable
    // backend, or a race with an update we cannot resolve, refuses the call.
    // Session affinity already keeps a client on one backend, with the
    // timeout the Service asks for; only the other frontends need the
    // socket's own memory.
    let sticky = SEND && proto == PROTO_UDP && master.flags & SVC_F_AFFINITY == 0;
    let chosen = if sticky {
        sticky_pick(ctx, &mut key, &master)
    } else {
        choose_for(ctx, &mut key, &master).map(|p| (p, STAT_NEW_FLOW))
    };
    let Some((pick, outcome)) = chosen else {
        count(STAT_PROG_SOCK, STAT_SOCK_REFUSED, 0);
        return refuse();
    };
    // SAFETY: bpf_get_socket_cookie is available to sock_addr programs.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let rev_key = RevSockKey {
        cookie,
        addr: pick.addr,
        port: pick.port,
        _pad: [0; 6],
    };
    let rev_val = RevSockValue {
        addr: frontend,
        port,
        _pad: [0; 2],
        rev_nat_id: pick.rev_nat_id,
    };
    // Written only when missing or different (Cilium's sock4_update_revnat):
    // every datagram of an unconnected socket passes here, and an update
    // takes the LRU's locks while a lookup takes none.
    // SAFETY: values are plain integers.
    let current = unsafe { REVSOCK.get(rev_key) }.copied();
    if current != Some(rev_val) {
        // Losing this entry only costs the reverse translation of
        // getpeername/recvmsg; the connection itself still works, so a failed
        // insert does not refuse it.
        let _ = REVSOCK.insert(rev_key, rev_val, 0);
    }
    write_addr::<V6>(sa, &pick.addr, pick.port);
    count(STAT_PROG_SOCK, outcome, 0);
    SYS_PROCEED
}

/// The backend this unconnected UDP socket keeps for the frontend, or a new
/// pick it then keeps, with the outcome to count: a kept backend is a
/// forward of a known flow, a new one a new flow. Without socket storage
/// (the kernel could not allocate it) every datagram picks afresh, which
/// still reaches a valid backend.
#[inline(always)]
fn sticky_pick(
    ctx: &SockAddrContext,
    key: &mut ServiceKey,
    master: &ServiceValue,
) -> Option<(Pick, u32)> {
    // SAFETY: the map is our socket storage, ctx->sk is the calling socket.
    let picks = unsafe { SOCK_PICKS.get_or_insert_ptr_mut(ctx, None) };
    if picks.is_null() {
        return choose_for(ctx, key, master).map(|p| (p, STAT_NEW_FLOW));
    }
    // SAFETY: a non-null pointer from sk_storage_get is the socket's value,
    // alive while the socket is. Two threads sending on one socket may race
    // on it; whatever they leave is revalidated below before it is used.
    let picks = unsafe { &mut *picks };
    let mut slot = picks.next as usize % PICKS_PER_SOCKET;
    let mut free = None;
    // A constant trip count: the verifier walks it without a loop bound.
    for i in 0..PICKS_PER_SOCKET {
        let p = picks.picks[i];
        if p.rev_nat_id == master.rev_nat_id {
            if let Some(kept) = sticky_backend(p.backend_id, master, &key.addr)
                && kept.addr == p.addr
                && kept.port == p.port
            {
                return Some((kept, STAT_FORWARD));
            }
            // Removed, draining, or its id now names another address: the
            // socket moves, and this entry records where.
            free = Some(i);
            break;
        }
        if p.rev_nat_id == 0 && free.is_none() {
            free = Some(i);
        }
    }
    let replaced = free.is_none();
    if let Some(i) = free {
        slot = i;
    }
    let pick = choose_for(ctx, key, master)?;
    if let Some(entry) = picks.picks.get_mut(slot) {
        *entry = SockPick {
            rev_nat_id: master.rev_nat_id,
            backend_id: pick.backend_id,
            addr: pick.addr,
            port: pick.port,
            _pad: [0; 2],
        };
    }
    if replaced {
        picks.next = ((slot + 1) % PICKS_PER_SOCKET) as u32;
    }
    Some((pick, STAT_NEW_FLOW))
}

/// Removes the reverse-map entries of a closing socket: the backend it is
/// connected to, and the backends its unconnected sends were given. Entries
/// for sockets the hooks never translated are not there; the lookup first
/// keeps such closes off the LRU's locks.
#[inline(always)]
fn release(ctx: &SockContext) {
    let sk = ctx.sock;
    // SAFETY: the kernel hands every cgroup sock program a valid context.
    let proto = unsafe { core::ptr::read_volatile(&raw const (*sk).protocol) } as u8;
    if proto != PROTO_TCP && proto != PROTO_UDP && proto != PROTO_SCTP {
        return;
    }
    // SAFETY: bpf_get_socket_cookie accepts a cgroup sock context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    // SAFETY: as above; dst_port is a 2-byte field in network order.
    let port = unsafe { core::ptr::read_volatile(&raw const (*sk).dst_port) };
    if port != 0 {
        forget(cookie, peer_addr(sk), port);
    }
    if proto != PROTO_UDP {
        return;
    }
    // SAFETY: for cgroup sock programs the helper takes the context as the
    // socket; no value and no flags: only an existing entry is returned.
    let picks = unsafe {
        bpf_sk_storage_get(
            core::ptr::from_ref(&SOCK_PICKS).cast_mut().cast(),
            ctx.as_ptr(),
            core::ptr::null_mut(),
            0,
        )
    }
    .cast::<SockPicks>();
    if picks.is_null() {
        return;
    }
    for i in 0..PICKS_PER_SOCKET {
        // SAFETY: a non-null pointer from sk_storage_get is this socket's value.
        let p = unsafe { (*picks).picks[i] };
        if p.rev_nat_id != 0 {
            forget(cookie, p.addr, p.port);
        }
    }
    // The storage itself goes with the socket.
}

/// The connected peer of a closing socket, in the maps' dual-stack form.
#[inline(always)]
fn peer_addr(sk: *mut bpf_sock) -> Addr {
    // SAFETY: the kernel hands every cgroup sock program a valid context;
    // word reads at the widths the verifier accepts. All five words are
    // read whatever the family: with the reads in two branches, LLVM chose
    // between two field addresses and loaded through the chosen pointer,
    // which the verifier refuses ("dereference of modified ctx ptr").
    let (family, v4, v6) = unsafe {
        let p = &raw const (*sk).dst_ip6;
        (
            core::ptr::read_volatile(&raw const (*sk).family),
            core::ptr::read_volatile(&raw const (*sk).dst_ip4),
            [
                core::ptr::read_volatile(&raw const (*p)[0]),
                core::ptr::read_volatile(&raw const (*p)[1]),
                core::ptr::read_volatile(&raw const (*p)[2]),
                core::ptr::read_volatile(&raw const (*p)[3]),
            ],
        )
    };
    if family == AF_INET {
        Addr::from_v4(v4)
    } else {
        Addr(v6)
    }
}

#[inline(always)]
fn forget(cookie: u64, addr: Addr, port: u16) {
    let key = RevSockKey {
        cookie,
        addr,
        port,
        _pad: [0; 6],
    };
    // SAFETY: values are plain integers.
    if unsafe { REVSOCK.get(key) }.is_some() {
        let _ = REVSOCK.remove(key);
    }
}

/// The backend for this call (see [`choose`]). Sockets have no stable client
/// address before connect, so a client is its network namespace, as Cilium's
/// socket-LB affinity does.
#[inline(always)]
fn choose_for(ctx: &SockAddrContext, key: &mut ServiceKey, master: &ServiceValue) -> Option<Pick> {
    let aff = AffinityKey {
        client: Addr([0; 4]),
        netns_cookie: if master.flags & SVC_F_AFFINITY != 0 {
            // SAFETY: bpf_get_netns_cookie accepts a sock_addr context.
            unsafe { bpf_get_netns_cookie(ctx.as_ptr()) }
        } else {
            0
        },
        rev_nat_id: master.rev_nat_id,
        _pad: [0; 4],
    };
    choose(key, master, &aff, now_secs(), Fresh::Random)
}

#[inline(always)]
fn reverse<const V6: bool>(ctx: &SockAddrContext) {
    let sa = ctx.sock_addr;
    // SAFETY: bpf_get_socket_cookie is available to sock_addr programs.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = RevSockKey {
        cookie,
        addr: read_addr::<V6>(sa),
        // SAFETY: the kernel hands every sock_addr program a valid context.
        port: unsafe { core::ptr::read_volatile(&raw const (*sa).user_port) } as u16,
        _pad: [0; 6],
    };
    // SAFETY: values are plain integers.
    let Some(rev) = (unsafe { REVSOCK.get(key) }) else {
        return;
    };
    let rev = *rev;
    // Translate only while the frontend still exists under the same id.
    // SAFETY: as above.
    let Some(nat) = (unsafe { REVNAT.get(rev.rev_nat_id) }) else {
        return;
    };
    if nat.addr != rev.addr || nat.port != rev.port {
        return;
    }
    // A v4 hook can only write an IPv4 address back.
    if !V6 && !rev.addr.is_v4() {
        return;
    }
    write_addr::<V6>(sa, &rev.addr, rev.port);
    count(STAT_PROG_SOCK, STAT_REPLY, 0);
}

#[inline(always)]
fn refuse() -> i32 {
    // SAFETY: bpf_set_retval is allowed in cgroup sock_addr programs.
    unsafe { bpf_set_retval(-ECONNREFUSED) };
    SYS_REJECT
}
