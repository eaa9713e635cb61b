//! Connection tracking and NAT for one parsed packet, shared by TC and XDP.
//!
//! Each flow has two entries in its protocol's CT map: FORWARD, keyed by the
//! client's tuple as it arrives, and REPLY, keyed by the backend's answer as
//! it arrives. Each entry's key and value give its peer's key (see
//! [`peer_key`]), which is how the agent's collector removes pairs.
//!
//! SCTP: its CRC32c covers the ports but not the addresses (no pseudo
//! header), and cannot be updated incrementally at a reasonable cost here. So
//! SCTP flows are translated only while no port changes (backend port equal
//! to the frontend port, SNAT keeping the client's port); others pass
//! untranslated, counted as unsupported.
// Map keys and values go by reference on purpose: by value they would be
// copied onto the 512-byte stack first.
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::{
    bindings::{
        BPF_ANY, BPF_FIB_LKUP_RET_SUCCESS, BPF_FIB_LOOKUP_SKIP_NEIGH, BPF_FIB_LOOKUP_SRC,
        BPF_NOEXIST, bpf_fib_lookup,
    },
    helpers::generated::{bpf_fib_lookup as fib_lookup, bpf_get_prandom_u32},
    maps::{LruHashMap, lpm_trie::Key},
};
use weir_abi::{
    Addr, AffinityKey, CT_DIR_FORWARD, CT_DIR_REPLY, CT_F_CLUSTERIP, CT_F_SNAT, CT_F_XDP,
    CT_TCP_CLOSING, CT_TCP_ESTABLISHED, CT_TCP_SYN_SENT, Config, CtKey, CtValue, DEFAULT_CONFIG,
    PROTO_SCTP, PROTO_TCP, SCOPE_ALL, STAT_DROP_CT_FULL, STAT_DROP_MALFORMED, STAT_DROP_NO_BACKEND,
    STAT_DROP_SNAT_PORTS, STAT_DROP_SRC_RANGE, STAT_FORWARD, STAT_NEW_FLOW, STAT_PASS,
    STAT_PASS_UNSUPPORTED, STAT_REPLY, STAT_XDP_TO_TC, SVC_F_EXTERNAL, SVC_F_LOCAL,
    SVC_F_SRC_RANGES, ServiceKey, SrcRangeKey,
};

use super::{
    Hdr, IP4_CSUM, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, ctx::Pkt, daddr_off, l4_csum, l4_off,
    prog_of, saddr_off,
};
use crate::{
    maps::{CONFIG, CT_TCP, CT_UDP, SERVICES, SRC_RANGES, Scratch, count, now_secs},
    pick::{choose, owned_backend},
};

pub enum Verdict {
    Pass,
    Drop,
    /// The program's return value from a redirect helper.
    Redirect(u32),
}

/// SNAT ports tried after the client's own, drawn from Linux's default
/// ephemeral range.
const SNAT_TRIES: u32 = 8;
const SNAT_PORT_MIN: u32 = 32_768;
const SNAT_PORT_SPAN: u32 = 60_999 - 32_768 + 1;

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

type CtMap = LruHashMap<CtKey, CtValue>;

#[inline(always)]
fn ct_map(proto: u8) -> &'static CtMap {
    if proto == PROTO_TCP { &CT_TCP } else { &CT_UDP }
}

/// The agent's timeouts; an array entry it never wrote reads as zeros.
#[inline(always)]
fn config() -> Config {
    match CONFIG.get(0) {
        Some(c) if c.ct_udp != 0 => *c,
        _ => DEFAULT_CONFIG,
    }
}

#[inline(always)]
pub fn handle<P: Pkt, const V6: bool>(
    pkt: &mut P,
    h: &Hdr,
    scratch: *mut Scratch,
    xdp: bool,
) -> Verdict {
    let prog = prog_of(xdp);
    let ct = ct_map(h.proto);
    let cfg = config();
    let now = now_secs();
    let mut key = CtKey {
        saddr: h.saddr,
        daddr: h.daddr,
        sport: h.sport,
        dport: h.dport,
        proto: h.proto,
        dir: CT_DIR_REPLY,
        _pad: [0; 2],
    };
    // XDP leaves replies to TC on the reply's ingress device.
    if !xdp && let Some(e) = ct.get_ptr_mut(&key) {
        return translate_hit::<P, V6>(pkt, h, ct, &key, e, scratch, &cfg, now, xdp, STAT_REPLY);
    }
    key.dir = CT_DIR_FORWARD;
    if let Some(e) = ct.get_ptr_mut(&key) {
        // SAFETY: the pointer comes from a successful lookup.
        let v = unsafe { &*e };
        if xdp && v.flags & CT_F_CLUSTERIP != 0 {
            count(prog, STAT_PASS, h.bytes);
            return Verdict::Pass;
        }
        let alive = match owned_backend(v.backend_id, v.rev_nat_id, &h.daddr) {
            Some(b) => b.addr == v.nat_daddr && b.port == v.nat_dport,
            None => false,
        };
        // A client reusing its port after a close starts a new connection,
        // which must not inherit the old one's backend or its closing timeout.
        let restart = h.proto == PROTO_TCP
            && v.tcp_state == CT_TCP_CLOSING
            && h.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
        if alive && !restart {
            return translate_hit::<P, V6>(
                pkt,
                h,
                ct,
                &key,
                e,
                scratch,
                &cfg,
                now,
                xdp,
                STAT_FORWARD,
            );
        }
        // Free the old reply tuple so that the new flow may take it again.
        let peer = peer_key(&key, v);
        let _ = ct.remove(&peer);
    }
    new_flow::<P, V6>(pkt, h, ct, &key, scratch, &cfg, now, xdp)
}

/// The key of the other entry of the flow that `(key, v)` belongs to.
#[inline(always)]
fn peer_key(key: &CtKey, v: &CtValue) -> CtKey {
    CtKey {
        saddr: v.nat_daddr,
        daddr: v.nat_saddr,
        sport: v.nat_dport,
        dport: v.nat_sport,
        proto: key.proto,
        dir: if key.dir == CT_DIR_FORWARD {
            CT_DIR_REPLY
        } else {
            CT_DIR_FORWARD
        },
        _pad: [0; 2],
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn translate_hit<P: Pkt, const V6: bool>(
    pkt: &mut P,
    h: &Hdr,
    ct: &CtMap,
    key: &CtKey,
    e: *mut CtValue,
    scratch: *mut Scratch,
    cfg: &Config,
    now: u32,
    xdp: bool,
    reason: u32,
) -> Verdict {
    let prog = prog_of(xdp);
    // SAFETY: the pointer comes from a successful lookup. Counters race with
    // other CPUs updating the same flow; an occasional lost increment is
    // cheaper than atomics on every packet.
    let v = unsafe { &mut *e };
    // SAFETY: see `run_family`; a field disjoint from `h`.
    let fib = unsafe { &mut (*scratch).fib };
    let (saddr, sport, daddr, dport) = (v.nat_saddr, v.nat_sport, v.nat_daddr, v.nat_dport);
    // The new source may be an address of this node: the SNAT address, or a
    // NodePort frontend's node address in a reply. The input route lookup
    // drops such packets as martians, so they leave by redirect instead.
    // ClusterIP flows without SNAT keep the normal forwarding path (and the
    // FORWARD chain that network policies may rely on).
    let out = if reason == STAT_REPLY {
        v.flags & CT_F_CLUSTERIP == 0 || v.flags & CT_F_SNAT != 0
    } else {
        v.flags & CT_F_SNAT != 0
    };
    // XDP hands the redirect to TC through a mark; without one the
    // untouched packet is left to TC altogether.
    if out && xdp && !pkt.mark_for_tc() {
        count(prog, STAT_XDP_TO_TC, h.bytes);
        return Verdict::Pass;
    }
    refresh(ct, key, v, h, cfg, now, reason == STAT_REPLY);
    if rewrite::<P, V6>(pkt, h, &saddr, sport, &daddr, dport).is_none() {
        count(prog, STAT_DROP_MALFORMED, h.bytes);
        return Verdict::Drop;
    }
    count(prog, reason, h.bytes);
    if !out || xdp {
        return Verdict::Pass;
    }
    let flags = BPF_FIB_LOOKUP_SKIP_NEIGH;
    if !route::<P, V6>(pkt, h.proto, &saddr, sport, &daddr, dport, fib, flags) {
        return Verdict::Pass;
    }
    Verdict::Redirect(pkt.redirect(fib))
}

/// TC's half of a translation `weir_xdp` made (see `ctx::XDP_MARK`): the
/// packet already carries its new tuple and only needs to leave by redirect.
#[inline(always)]
pub fn finish_xdp<P: Pkt, const V6: bool>(pkt: &mut P, h: &Hdr, scratch: *mut Scratch) -> Verdict {
    // SAFETY: see `run_family`; a field disjoint from `h`.
    let fib = unsafe { &mut (*scratch).fib };
    let flags = BPF_FIB_LOOKUP_SKIP_NEIGH;
    if !route::<P, V6>(
        pkt, h.proto, &h.saddr, h.sport, &h.daddr, h.dport, fib, flags,
    ) {
        return Verdict::Pass;
    }
    Verdict::Redirect(pkt.redirect(fib))
}

/// Counts the packet on its entry, advances the TCP state and pushes the
/// expiry out by the state's timeout.
#[inline(always)]
fn refresh(ct: &CtMap, key: &CtKey, v: &mut CtValue, h: &Hdr, cfg: &Config, now: u32, reply: bool) {
    v.packets += 1;
    v.bytes += h.bytes;
    if h.proto != PROTO_TCP {
        v.expires = now.wrapping_add(cfg.ct_udp);
        return;
    }
    let old = v.tcp_state;
    let new = if h.tcp_flags & (TCP_FIN | TCP_RST) != 0 {
        CT_TCP_CLOSING
    } else if reply && old == CT_TCP_SYN_SENT {
        CT_TCP_ESTABLISHED
    } else {
        old
    };
    let timeout = tcp_timeout(new, cfg);
    v.expires = now.wrapping_add(timeout);
    if new != old {
        v.tcp_state = new;
        // Keep the peer in step: the forward side must see CLOSING to restart
        // on a new SYN, and neither side should keep the SYN timeout.
        let peer = peer_key(key, v);
        if let Some(p) = ct.get_ptr_mut(&peer) {
            // SAFETY: the pointer comes from a successful lookup.
            unsafe {
                (*p).tcp_state = new;
                (*p).expires = now.wrapping_add(timeout);
            }
        }
    }
}

#[inline(always)]
fn tcp_timeout(state: u8, cfg: &Config) -> u32 {
    match state {
        CT_TCP_ESTABLISHED => cfg.ct_tcp_established,
        CT_TCP_CLOSING => cfg.ct_tcp_closing,
        _ => cfg.ct_tcp_syn,
    }
}

/// Step 4 of the datapath design: a packet to a frontend with no live flow.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn new_flow<P: Pkt, const V6: bool>(
    pkt: &mut P,
    h: &Hdr,
    ct: &CtMap,
    fwd_key: &CtKey,
    scratch: *mut Scratch,
    cfg: &Config,
    now: u32,
    xdp: bool,
) -> Verdict {
    let prog = prog_of(xdp);
    let mut skey = ServiceKey {
        addr: h.daddr,
        port: h.dport,
        slot: 0,
        proto: h.proto,
        scope: SCOPE_ALL,
        _pad: [0; 2],
    };
    // SAFETY: values are plain integers; entries are freed only after RCU.
    let Some(master) = (unsafe { SERVICES.get(skey) }) else {
        count(prog, STAT_PASS, h.bytes);
        return Verdict::Pass;
    };
    let master = *master;
    if xdp {
        if master.flags & SVC_F_EXTERNAL == 0 {
            count(prog, STAT_PASS, h.bytes);
            return Verdict::Pass;
        }
        // A reply to a flow whose SNAT port equals this frontend's port
        // looks like a new flow here; TC checks replies first.
        // SAFETY: see `run_family`; a field disjoint from `h`.
        let rkey = unsafe { &mut (*scratch).rkey };
        *rkey = *fwd_key;
        rkey.dir = CT_DIR_REPLY;
        if ct.get_ptr(&*rkey).is_some() {
            count(prog, STAT_XDP_TO_TC, h.bytes);
            return Verdict::Pass;
        }
    }
    if master.flags & SVC_F_SRC_RANGES != 0 {
        // Prefix length 160: the whole rev-NAT id and the whole address, so
        // the trie returns the longest range containing the client.
        let lpm = Key::new(
            160,
            SrcRangeKey {
                rev_nat_id: master.rev_nat_id.to_be(),
                addr: h.saddr,
            },
        );
        if SRC_RANGES.get(&lpm).is_none() {
            count(prog, STAT_DROP_SRC_RANGE, h.bytes);
            return Verdict::Drop;
        }
    }
    let aff = AffinityKey {
        client: h.saddr,
        netns_cookie: 0,
        rev_nat_id: master.rev_nat_id,
        _pad: [0; 4],
    };
    let Some(pick) = choose(&mut skey, &master, &aff, now) else {
        count(prog, STAT_DROP_NO_BACKEND, h.bytes);
        return Verdict::Drop;
    };
    if h.proto == PROTO_SCTP && pick.port != h.dport {
        count(prog, STAT_PASS_UNSUPPORTED, h.bytes);
        return Verdict::Pass;
    }
    // External clients must see replies come back through this node, so they
    // are masqueraded unless the Service keeps the client source (eTP=Local).
    // A backend talking to its own Service must be masqueraded too, or it
    // would answer itself directly, bypassing the reverse translation.
    let snat = (master.flags & SVC_F_EXTERNAL != 0 && master.flags & SVC_F_LOCAL == 0)
        || h.saddr == pick.addr;
    // The flow's entries and the SNAT route lookup live in per-CPU scratch
    // space: together they do not fit the 512-byte stack next to the rest.
    // SAFETY: see `run_family`; these fields are disjoint from `h`.
    let (val, rkey, fib) = unsafe {
        (
            &mut (*scratch).val,
            &mut (*scratch).rkey,
            &mut (*scratch).fib,
        )
    };
    let mut nat_saddr = h.saddr;
    if snat {
        match fib_src::<P, V6>(pkt, h, &pick.addr, pick.port, fib) {
            Some(a) => nat_saddr = a,
            None if xdp => {
                count(prog, STAT_XDP_TO_TC, h.bytes);
                return Verdict::Pass;
            }
            None => {
                count(prog, STAT_DROP_NO_BACKEND, h.bytes);
                return Verdict::Drop;
            }
        }
    }
    let tcp = h.proto == PROTO_TCP;
    let mut flags = 0;
    if snat {
        flags |= CT_F_SNAT;
    }
    if xdp {
        flags |= CT_F_XDP;
    }
    if master.flags & SVC_F_EXTERNAL == 0 {
        flags |= CT_F_CLUSTERIP;
    }
    *val = CtValue {
        nat_daddr: h.saddr,
        nat_saddr: h.daddr,
        nat_dport: h.sport,
        nat_sport: h.dport,
        backend_id: pick.backend_id,
        rev_nat_id: pick.rev_nat_id,
        expires: now.wrapping_add(if tcp { cfg.ct_tcp_syn } else { cfg.ct_udp }),
        tcp_state: if tcp { CT_TCP_SYN_SENT } else { 0 },
        flags,
        _pad: [0; 6],
        packets: 0,
        bytes: 0,
    };
    *rkey = CtKey {
        saddr: pick.addr,
        daddr: nat_saddr,
        sport: pick.port,
        dport: h.sport,
        proto: h.proto,
        dir: CT_DIR_REPLY,
        _pad: [0; 2],
    };
    if !snat {
        // The client's own tuple: a leftover entry can only be this flow's.
        if ct.insert(&*rkey, &*val, BPF_ANY as u64).is_err() {
            count(prog, STAT_DROP_CT_FULL, h.bytes);
            return Verdict::Drop;
        }
    } else if !alloc_snat_port(ct, rkey, val, h.proto != PROTO_SCTP) {
        count(prog, STAT_DROP_SNAT_PORTS, h.bytes);
        return Verdict::Drop;
    }
    val.nat_daddr = pick.addr;
    val.nat_saddr = nat_saddr;
    val.nat_dport = pick.port;
    val.nat_sport = rkey.dport;
    val.packets = 1;
    val.bytes = h.bytes;
    if ct.insert(fwd_key, &*val, BPF_ANY as u64).is_err() {
        let _ = ct.remove(&*rkey);
        count(prog, STAT_DROP_CT_FULL, h.bytes);
        return Verdict::Drop;
    }
    // Without a mark TC must do the translation itself; it will find the
    // entries just written, so nothing is lost but the acceleration.
    if snat && xdp && !pkt.mark_for_tc() {
        count(prog, STAT_XDP_TO_TC, h.bytes);
        return Verdict::Pass;
    }
    if rewrite::<P, V6>(pkt, h, &nat_saddr, rkey.dport, &pick.addr, pick.port).is_none() {
        count(prog, STAT_DROP_MALFORMED, h.bytes);
        return Verdict::Drop;
    }
    count(prog, STAT_NEW_FLOW, h.bytes);
    if !snat || xdp {
        return Verdict::Pass;
    }
    // The source is now this node's; see `translate_hit`. `fib_src` left the
    // egress device in `fib`.
    Verdict::Redirect(pkt.redirect(fib))
}

/// Claims a SNAT port by inserting the reply entry only if its tuple is free:
/// the client's port first (least surprise, and SCTP cannot change ports),
/// then a few random ones. `rkey.dport` holds the port on success.
#[inline(always)]
fn alloc_snat_port(ct: &CtMap, rkey: &mut CtKey, val: &CtValue, may_remap: bool) -> bool {
    if ct.insert(&*rkey, val, BPF_NOEXIST as u64).is_ok() {
        return true;
    }
    if !may_remap {
        return false;
    }
    for _ in 0..SNAT_TRIES {
        // SAFETY: bpf_get_prandom_u32 has no preconditions.
        let roll = unsafe { bpf_get_prandom_u32() };
        rkey.dport = ((SNAT_PORT_MIN + roll % SNAT_PORT_SPAN) as u16).to_be();
        if ct.insert(&*rkey, val, BPF_NOEXIST as u64).is_ok() {
            return true;
        }
    }
    false
}

/// Looks up the route of the tuple as it will leave, from the ingress device.
/// On success `p` holds the egress device, and unless `flags` has
/// `BPF_FIB_LOOKUP_SKIP_NEIGH` the MAC addresses.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn route<P: Pkt, const V6: bool>(
    pkt: &P,
    proto: u8,
    saddr: &Addr,
    sport: u16,
    daddr: &Addr,
    dport: u16,
    p: &mut bpf_fib_lookup,
    flags: u32,
) -> bool {
    // SAFETY: an all-zero bpf_fib_lookup is a valid value of this plain C struct.
    *p = unsafe { core::mem::zeroed() };
    p.family = if V6 { AF_INET6 } else { AF_INET };
    p.l4_protocol = proto;
    p.sport = sport;
    p.dport = dport;
    // tot_len stays 0: a non-zero one makes the helper check the MTU, which
    // the kernel's own output path handles.
    p.ifindex = pkt.ifindex();
    if V6 {
        p.__bindgen_anon_3.ipv6_src = saddr.0;
        p.__bindgen_anon_4.ipv6_dst = daddr.0;
    } else {
        p.__bindgen_anon_3.ipv4_src = saddr.v4();
        p.__bindgen_anon_4.ipv4_dst = daddr.v4();
    }
    // SAFETY: `p` is a valid, fully initialized parameter block of the size given.
    let rc = unsafe {
        fib_lookup(
            pkt.raw(),
            p,
            core::mem::size_of::<bpf_fib_lookup>() as i32,
            flags,
        )
    };
    rc == i64::from(BPF_FIB_LKUP_RET_SUCCESS)
}

/// The address the kernel would use as source towards `dst`, for SNAT, with
/// the route to `dst` (its egress device) left in `p`.
#[inline(always)]
fn fib_src<P: Pkt, const V6: bool>(
    pkt: &P,
    h: &Hdr,
    dst: &Addr,
    dport: u16,
    p: &mut bpf_fib_lookup,
) -> Option<Addr> {
    let flags = BPF_FIB_LOOKUP_SRC | BPF_FIB_LOOKUP_SKIP_NEIGH;
    if !route::<P, V6>(pkt, h.proto, &h.saddr, h.sport, dst, dport, p, flags) {
        return None;
    }
    // SAFETY: reading union fields of plain integers.
    let src = unsafe {
        if V6 {
            Addr(p.__bindgen_anon_3.ipv6_src)
        } else {
            Addr::from_v4(p.__bindgen_anon_3.ipv4_src)
        }
    };
    if src.0 == [0; 4] || (!V6 && src.v4() == 0) {
        return None;
    }
    Some(src)
}

/// Rewrites the packet's tuple from `h`'s to the given one, touching only
/// what changes.
#[inline(always)]
fn rewrite<P: Pkt, const V6: bool>(
    pkt: &mut P,
    h: &Hdr,
    saddr: &Addr,
    sport: u16,
    daddr: &Addr,
    dport: u16,
) -> Option<()> {
    let csum = l4_csum::<V6>(h.proto);
    if V6 {
        for i in 0..4 {
            if h.saddr.0[i] != saddr.0[i] {
                pkt.set_word(saddr_off(true) + 4 * i, h.saddr.0[i], saddr.0[i], 0, csum)?;
            }
            if h.daddr.0[i] != daddr.0[i] {
                pkt.set_word(daddr_off(true) + 4 * i, h.daddr.0[i], daddr.0[i], 0, csum)?;
            }
        }
    } else {
        if h.saddr.v4() != saddr.v4() {
            pkt.set_word(saddr_off(false), h.saddr.v4(), saddr.v4(), IP4_CSUM, csum)?;
        }
        if h.daddr.v4() != daddr.v4() {
            pkt.set_word(daddr_off(false), h.daddr.v4(), daddr.v4(), IP4_CSUM, csum)?;
        }
    }
    let l4 = l4_off(V6);
    if h.sport != sport {
        pkt.set_port(l4, h.sport, sport, csum)?;
    }
    if h.dport != dport {
        pkt.set_port(l4 + 2, h.dport, dport, csum)?;
    }
    Some(())
}
