//! Socket-level load balancing for ClusterIP (IPv4).
//!
//! `connect4` and `sendmsg4` rewrite a destination `VIP:port` to a backend before
//! the socket ever builds a packet, so no per-packet NAT is needed. They remember
//! the frontend per socket cookie; `getpeername4` and `recvmsg4` use that to show
//! the application the address it asked for.
use aya_ebpf::{
    EbpfContext as _,
    helpers::generated::{bpf_get_prandom_u32, bpf_get_socket_cookie, bpf_set_retval},
    macros::cgroup_sock_addr,
    programs::SockAddrContext,
};
use weir_abi::{
    PROTO_SCTP, PROTO_TCP, PROTO_UDP, RevSock4Key, RevSock4Value, SCOPE_ALL, Service4Key,
    Service4Value,
};

use crate::maps::{BACKENDS4, REVNAT4, REVSOCK4, SERVICES4};

/// Return value that lets the syscall go on.
const SYS_PROCEED: i32 = 1;
/// Return value that fails the syscall with the errno set by `bpf_set_retval`.
const SYS_REJECT: i32 = 0;
const ECONNREFUSED: i32 = 111;

#[cgroup_sock_addr(connect4)]
pub fn weir_connect4(ctx: SockAddrContext) -> i32 {
    forward(&ctx)
}

#[cgroup_sock_addr(sendmsg4)]
pub fn weir_sendmsg4(ctx: SockAddrContext) -> i32 {
    forward(&ctx)
}

#[cgroup_sock_addr(recvmsg4)]
pub fn weir_recvmsg4(ctx: SockAddrContext) -> i32 {
    reverse(&ctx);
    SYS_PROCEED
}

#[cgroup_sock_addr(getpeername4)]
pub fn weir_getpeername4(ctx: SockAddrContext) -> i32 {
    reverse(&ctx);
    SYS_PROCEED
}

/// A backend picked for one connect or send.
struct Pick {
    addr: u32,
    port: u16,
    rev_nat_id: u32,
}

#[inline(always)]
fn forward(ctx: &SockAddrContext) -> i32 {
    // SAFETY: the kernel hands every sock_addr program a valid context.
    let sa = unsafe { &mut *ctx.sock_addr };
    let proto = sa.protocol as u8;
    if proto != PROTO_TCP && proto != PROTO_UDP && proto != PROTO_SCTP {
        return SYS_PROCEED;
    }
    let vip = sa.user_ip4;
    // user_port holds sin_port (network order) in its low 16 bits.
    let port = sa.user_port as u16;
    let mut key = Service4Key {
        addr: vip,
        port,
        slot: 0,
        proto,
        scope: SCOPE_ALL,
        _pad: [0; 2],
    };
    // SAFETY: values are plain integers; entries are freed only after RCU.
    let Some(master) = (unsafe { SERVICES4.get(key) }) else {
        return SYS_PROCEED;
    };
    let master = *master;
    let roll = unsafe { bpf_get_prandom_u32() };
    // A frontend we own never falls through to the VIP itself: no usable backend,
    // or a race with an update we cannot resolve, refuses the connection.
    let Some(pick) = pick_backend(&mut key, &master, roll) else {
        return refuse();
    };
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let rev_key = RevSock4Key {
        cookie,
        addr: pick.addr,
        port: pick.port,
        _pad: [0; 2],
    };
    let rev_val = RevSock4Value {
        addr: vip,
        port,
        _pad: [0; 2],
        rev_nat_id: pick.rev_nat_id,
    };
    // Losing this entry only costs the reverse translation of getpeername/recvmsg;
    // the connection itself still works, so a failed insert does not refuse it.
    let _ = REVSOCK4.insert(rev_key, rev_val, 0);
    sa.user_ip4 = pick.addr;
    sa.user_port = u32::from(pick.port);
    SYS_PROCEED
}

/// Picks a backend uniformly among the active slots, or among the terminating
/// ones when the frontend has no active backend (KEP-1669).
#[inline(always)]
fn pick_backend(key: &mut Service4Key, master: &Service4Value, roll: u32) -> Option<Pick> {
    if let Some(pick) = pick_in(key, master, roll) {
        return Some(pick);
    }
    // The agent writes a shrinking frontend's new master before it prunes the
    // slots beyond it, so a slot can vanish between our two lookups. Read the
    // master again and pick within what it holds now.
    key.slot = 0;
    // SAFETY: as above.
    let fresh = *unsafe { SERVICES4.get(*key) }?;
    pick_in(key, &fresh, roll)
}

#[inline(always)]
fn pick_in(key: &mut Service4Key, master: &Service4Value, roll: u32) -> Option<Pick> {
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
    let slot = unsafe { SERVICES4.get(*key) }?;
    // SAFETY: as above.
    let backend = unsafe { BACKENDS4.get(slot.backend_id) }?;
    // The id may have been freed and handed to another frontend since we read
    // the slot; only our own backend will do.
    if backend.rev_nat_id != master.rev_nat_id {
        return None;
    }
    Some(Pick {
        addr: backend.addr,
        port: backend.port,
        rev_nat_id: master.rev_nat_id,
    })
}

#[inline(always)]
fn reverse(ctx: &SockAddrContext) {
    // SAFETY: the kernel hands every sock_addr program a valid context.
    let sa = unsafe { &mut *ctx.sock_addr };
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let key = RevSock4Key {
        cookie,
        addr: sa.user_ip4,
        port: sa.user_port as u16,
        _pad: [0; 2],
    };
    // SAFETY: values are plain integers.
    let Some(rev) = (unsafe { REVSOCK4.get(key) }) else {
        return;
    };
    let rev = *rev;
    // Translate only while the frontend still exists under the same id.
    // SAFETY: as above.
    let Some(nat) = (unsafe { REVNAT4.get(rev.rev_nat_id) }) else {
        return;
    };
    if nat.addr != rev.addr || nat.port != rev.port {
        return;
    }
    sa.user_ip4 = rev.addr;
    sa.user_port = u32::from(rev.port);
}

#[inline(always)]
fn refuse() -> i32 {
    // SAFETY: bpf_set_retval is allowed in cgroup sock_addr programs.
    unsafe { bpf_set_retval(-ECONNREFUSED) };
    SYS_REJECT
}
