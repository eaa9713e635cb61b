//! Connection tracking for one parsed packet, shared by TC and XDP: the
//! conntrack hits (steps 2 and 3 of the datapath design). New flows are in
//! [`super::new_flow`], route lookups and header rewrites in [`super::route`].
//!
//! Each flow has two entries in its protocol's CT map: FORWARD, keyed by the
//! client's tuple as it arrives, and REPLY, keyed by the backend's answer as
//! it arrives. Each entry's key and value give its peer's key (see
//! [`CtKey::peer`]), which is how the agent's collector removes pairs.
// Map keys and values go by reference on purpose: by value they would be
// copied onto the 512-byte stack first.
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::{
    bindings::{BPF_FIB_LKUP_RET_SUCCESS, BPF_NOEXIST, bpf_fib_lookup},
    maps::LruHashMap,
};
use weir_abi::{
    Addr, CFG_F_CSUM_IPV6, CT_DIR_FORWARD, CT_DIR_REPLY, CT_F_CLUSTERIP, CT_F_FIN_FORWARD,
    CT_F_FIN_REPLY, CT_F_SNAT, CT_TCP_CLOSING, CT_TCP_ESTABLISHED, CT_TCP_SYN_SENT, Config, CtKey,
    CtValue, DEFAULT_CONFIG, DEFAULT_SNAT_PORT_MAX, DEFAULT_SNAT_PORT_MIN, PROTO_TCP,
    STAT_DROP_MALFORMED, STAT_FORWARD, STAT_PASS, STAT_REPLY, STAT_REPLY_IGNORED, STAT_XDP_TO_TC,
};

use super::{
    Hdr, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN,
    ctx::Pkt,
    new_flow::new_flow,
    prog_of,
    route::{drop_reason, rewrite, route},
};
use crate::{
    maps::{CONFIG, CT_TCP, CT_UDP, Scratch, count, now_secs},
    pick::owned_backend,
};

pub enum Verdict {
    Pass,
    Drop,
    /// The program's return value from a redirect helper.
    Redirect(u32),
}

pub type CtMap = LruHashMap<CtKey, CtValue>;

#[inline(always)]
pub fn ct_map(proto: u8) -> &'static CtMap {
    if proto == PROTO_TCP { &CT_TCP } else { &CT_UDP }
}

/// The agent's configuration; an array entry it never wrote reads as zeros,
/// and a zero or inverted SNAT range falls back to the default range.
#[inline(always)]
fn config() -> Config {
    let mut cfg = match CONFIG.get(0) {
        Some(c) if c.ct_udp != 0 => *c,
        _ => DEFAULT_CONFIG,
    };
    if cfg.snat_port_min == 0 || cfg.snat_port_max < cfg.snat_port_min {
        cfg.snat_port_min = DEFAULT_SNAT_PORT_MIN;
        cfg.snat_port_max = DEFAULT_SNAT_PORT_MAX;
    }
    cfg
}

/// Whether `CFG_F_CSUM_IPV6` is on (see `ctx::L4Csum::ipv6`).
#[inline(always)]
pub fn csum_v6(cfg: &Config) -> bool {
    cfg.flags & CFG_F_CSUM_IPV6 != 0
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
    if !xdp
        && let Some(e) = ct.get_ptr_mut(&key)
        // SAFETY: the pointer comes from a successful lookup.
        && reply_device_ok(unsafe { &*e }, pkt.ifindex())
    {
        // SAFETY: as above.
        let v = unsafe { &*e };
        if !stale_reply(ct, &key, v, h, now) {
            return translate_hit::<P, V6>(
                pkt, h, ct, &key, e, scratch, &cfg, now, xdp, STAT_REPLY,
            );
        }
        // The tuple now belongs to a connection this node does not
        // translate (or a new one of ours): drop the old flow and look the
        // packet up as any other.
        let peer = key.peer(v);
        if entry_points_to(ct, &peer, &key) == Some(true) {
            let _ = ct.remove(&peer);
        }
        let _ = ct.remove(&key);
    }
    key.dir = CT_DIR_FORWARD;
    if let Some(e) = ct.get_ptr_mut(&key) {
        // SAFETY: the pointer comes from a successful lookup.
        let v = unsafe { &*e };
        if xdp && v.flags & CT_F_CLUSTERIP != 0 {
            count(prog, STAT_PASS, h.bytes);
            return Verdict::Pass;
        }
        // Any backend state is fine here: a draining backend keeps its flows.
        let alive = match owned_backend(v.backend_id, v.rev_nat_id, &h.daddr) {
            Some(b) => b.addr == v.nat_daddr && b.port == v.nat_dport,
            None => false,
        };
        // A client reusing its port after a close starts a new connection,
        // which must not inherit the old one's backend or its closing timeout.
        let restart = h.proto == PROTO_TCP
            && v.tcp_state == CT_TCP_CLOSING
            && h.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
        // An expired entry may have lost its REPLY peer to the collector
        // (it deletes pairs, but the two deletes are not atomic); put the
        // peer back before refreshing so the flow is never half there.
        if alive
            && !restart
            && (v.expires >= now
                || restore_reply::<P, V6>(pkt, h, ct, &key, v, scratch, &cfg, now, xdp))
        {
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
        // Free the old reply tuple so that the new flow may take it again,
        // unless another flow owns that tuple by now.
        let peer = key.peer(v);
        if entry_points_to(ct, &peer, &key) == Some(true) {
            let _ = ct.remove(&peer);
        }
    }
    new_flow::<P, V6>(pkt, h, ct, &key, scratch, &cfg, now, xdp)
}

/// Whether a packet that arrived on device `ifindex` may be a reply of the
/// flow whose REPLY entry is `v`: only on the device the backend's replies
/// arrive on (`CtValue::aux`, the egress device of the route to the backend
/// when the flow was made; 0 for entries that do not know it).
///
/// TC runs before the kernel's reverse-path filter, and the REPLY key is
/// just `backend:port → SNAT address:port` (or the client's tuple), which
/// any local pod can forge: without this check a pod could close or remove
/// other clients' flows by sending that tuple from its own veth. A packet
/// failing the check is not a reply here and is looked up as any other
/// packet (usually not ours: passed on, and the kernel's rp_filter or local
/// delivery deals with it). Replies must therefore come back on the device
/// the forward packets leave by, as rp_filter=1 demands; with a bridge CNI
/// whose pod veths are bridge ports the reply is translated by TC on the
/// bridge device (the route's device), and the check cannot tell apart the
/// pods behind one bridge.
#[inline(always)]
fn reply_device_ok(v: &CtValue, ifindex: u32) -> bool {
    v.aux == 0 || v.aux == ifindex
}

/// Whether the REPLY entry `(key, v)` that packet `h` hit (on the right
/// device) is a leftover of a finished flow whose tuple is being reused by
/// another connection; the pair is then removed and the packet looked up as
/// any other.
///
/// - An expired entry whose FORWARD peer is gone (or belongs to another
///   flow): nothing can refresh it any more; the collector just has not
///   removed it yet.
/// - A TCP SYN (a SYN-ACK) on a CLOSING flow: a flow of ours that
///   (re)starts always has a fresh SYN_SENT entry here (`new_flow`), so
///   this answers a new connection on the tuple, typically the client now
///   talking to the backend's own address from the same port.
///
/// A SYN on an ESTABLISHED flow is not stale: as in netfilter, a SYN from
/// the reply side never resets an established connection (see
/// [`refresh`]); it is translated and changes nothing. It is either forged,
/// or the backend retransmits its SYN-ACK because the client's ACK was lost
/// after this node saw it (translated, the client acknowledges again), or
/// it answers a direct connection from the port of a flow this node still
/// tracks as established (one whose FIN/RST it never saw): that direct
/// connection then fails until the old flow expires. Treating it as stale,
/// as before, let anyone who can send from the backend's side tear down
/// established flows with one packet.
#[inline(always)]
fn stale_reply(ct: &CtMap, key: &CtKey, v: &CtValue, h: &Hdr, now: u32) -> bool {
    if h.proto == PROTO_TCP && h.tcp_flags & TCP_SYN != 0 && v.tcp_state == CT_TCP_CLOSING {
        return true;
    }
    v.expires < now && entry_points_to(ct, &key.peer(v), key) != Some(true)
}

/// Makes room for a new flow's REPLY entry at `rkey` (the client's own
/// address, no SNAT), which an entry of another flow may hold: Linux reuses
/// one local port towards different destinations, so `client:P → VIP_a` and
/// `client:P → VIP_b` that pick the same backend have the same reply tuple.
///
/// False when the holder is live: not a leftover of this very client tuple
/// (`fwd_key`), not a CLOSING TCP flow, and not expired (it, or its FORWARD
/// peer); the new flow must then take another source port. Otherwise the
/// holder may be replaced, and its own FORWARD entry is removed first if it
/// still points back at `rkey`.
#[inline(always)]
pub fn reply_tuple_free(ct: &CtMap, rkey: &CtKey, fwd_key: &CtKey, now: u32) -> bool {
    let Some(p) = ct.get_ptr(rkey) else {
        return true;
    };
    // SAFETY: the pointer comes from a successful lookup; plain integers.
    let o = unsafe { &*p };
    if points_to(o, fwd_key) {
        return true;
    }
    let peer = rkey.peer(o);
    let theirs = match ct.get_ptr(&peer) {
        // SAFETY: the pointer comes from a successful lookup; plain integers.
        Some(f) => {
            let f = unsafe { &*f };
            points_to(f, rkey).then_some(f.expires)
        }
        None => None,
    };
    // Only a packet's own entry is refreshed (the peer only on state
    // changes), so a one-way flow keeps just its FORWARD entry fresh.
    let live = o.expires >= now || theirs.is_some_and(|exp| exp >= now);
    if live && o.tcp_state != CT_TCP_CLOSING {
        return false;
    }
    if theirs.is_some() {
        let _ = ct.remove(&peer);
    }
    true
}

/// Whether entry value `v` names `key` as its peer, i.e. belongs to the same
/// flow as the entry at `key`.
#[inline(always)]
pub fn points_to(v: &CtValue, key: &CtKey) -> bool {
    v.nat_daddr == key.saddr
        && v.nat_saddr == key.daddr
        && v.nat_dport == key.sport
        && v.nat_sport == key.dport
}

/// Whether the entry at `at` belongs to the flow of `key` (see
/// [`points_to`]); `None` if there is no entry at `at`.
#[inline(always)]
pub fn entry_points_to(ct: &CtMap, at: &CtKey, key: &CtKey) -> Option<bool> {
    let p = ct.get_ptr(at)?;
    // SAFETY: the pointer comes from a successful lookup; plain integers.
    Some(points_to(unsafe { &*p }, key))
}

/// Re-creates the REPLY entry of the forward entry `(key, v)` if it is
/// missing: it translates the backend's answer back to the tuple the client
/// sent, which is the forward key. False if another flow holds that reply
/// tuple now; this flow then cannot get its replies back and starts afresh.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn restore_reply<P: Pkt, const V6: bool>(
    pkt: &P,
    h: &Hdr,
    ct: &CtMap,
    key: &CtKey,
    v: &CtValue,
    scratch: *mut Scratch,
    cfg: &Config,
    now: u32,
    xdp: bool,
) -> bool {
    // SAFETY: see `run_family`; fields disjoint from `h`, unused by the caller
    // until `new_flow` or `translate_hit` rewrite them.
    let (rkey, rval, fib) = unsafe {
        (
            &mut (*scratch).rkey,
            &mut (*scratch).val,
            &mut (*scratch).fib,
        )
    };
    // The device replies arrive on, as `new_flow` records it.
    let ifindex = reply_ifindex::<P, V6>(
        pkt,
        h,
        &v.nat_saddr,
        v.nat_sport,
        &v.nat_daddr,
        v.nat_dport,
        fib,
        xdp,
    );
    *rkey = key.peer(v);
    *rval = CtValue {
        nat_daddr: key.saddr,
        nat_saddr: key.daddr,
        nat_dport: key.sport,
        nat_sport: key.dport,
        backend_id: v.backend_id,
        rev_nat_id: v.rev_nat_id,
        expires: now.wrapping_add(state_timeout(key.proto, v.tcp_state, cfg)),
        tcp_state: v.tcp_state,
        flags: v.flags,
        _pad: [0; 2],
        aux: ifindex,
        packets: 0,
        bytes: 0,
    };
    if ct.insert(&*rkey, &*rval, BPF_NOEXIST as u64).is_ok() {
        return true;
    }
    match entry_points_to(ct, rkey, key) {
        Some(ours) => ours,
        // Gone again between the two calls: one more try.
        None => ct.insert(&*rkey, &*rval, BPF_NOEXIST as u64).is_ok(),
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
    if out {
        // Route before touching the packet: a rewritten packet that cannot
        // be redirected would die silently as a martian.
        let rc = route::<P, V6>(pkt, h, &saddr, sport, &daddr, dport, fib, xdp, false);
        if rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
            // XDP leaves it untouched to TC, which counts the real outcome.
            if xdp {
                count(prog, STAT_XDP_TO_TC, h.bytes);
                return Verdict::Pass;
            }
            count(prog, drop_reason(rc), h.bytes);
            return Verdict::Drop;
        }
        // XDP hands the redirect to TC through a mark; without one the
        // untouched packet is left to TC altogether.
        if xdp && !pkt.mark_for_tc() {
            count(prog, STAT_XDP_TO_TC, h.bytes);
            return Verdict::Pass;
        }
    }
    let ignored = refresh(ct, key, v, h, cfg, now, reason == STAT_REPLY);
    if rewrite::<P, V6>(pkt, h, &saddr, sport, &daddr, dport, csum_v6(cfg)).is_none() {
        count(prog, STAT_DROP_MALFORMED, h.bytes);
        return Verdict::Drop;
    }
    count(
        prog,
        if ignored { STAT_REPLY_IGNORED } else { reason },
        h.bytes,
    );
    if !out || xdp {
        return Verdict::Pass;
    }
    Verdict::Redirect(pkt.redirect(fib))
}

/// TC's half of a translation `weir_xdp` made (see `ctx::XDP_MARK`): the
/// packet already carries its new tuple and only needs to leave by redirect.
/// XDP checked the route before rewriting; should it have changed since,
/// the packet is dropped here rather than left to die as a martian.
#[inline(always)]
pub fn finish_xdp<P: Pkt, const V6: bool>(pkt: &mut P, h: &Hdr, scratch: *mut Scratch) -> Verdict {
    // SAFETY: see `run_family`; a field disjoint from `h`.
    let fib = unsafe { &mut (*scratch).fib };
    let rc = route::<P, V6>(
        pkt, h, &h.saddr, h.sport, &h.daddr, h.dport, fib, false, false,
    );
    if rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        count(prog_of(false), drop_reason(rc), h.bytes);
        return Verdict::Drop;
    }
    Verdict::Redirect(pkt.redirect(fib))
}

/// The device the replies of a flow whose forward packets leave as
/// `saddr:sport → daddr:dport` arrive on: the egress device of the route to
/// the backend from this packet's ingress device (SNAT flows are redirected
/// there, others forwarded there by the kernel). 0 (any device) if there is
/// no such route; such a flow's packets are not forwarded anyway.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn reply_ifindex<P: Pkt, const V6: bool>(
    pkt: &P,
    h: &Hdr,
    saddr: &Addr,
    sport: u16,
    daddr: &Addr,
    dport: u16,
    fib: &mut bpf_fib_lookup,
    xdp: bool,
) -> u32 {
    let rc = route::<P, V6>(pkt, h, saddr, sport, daddr, dport, fib, xdp, false);
    if rc == i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        fib.ifindex
    } else {
        0
    }
}

/// Counts the packet on its entry, advances the TCP state and pushes the
/// expiry out by the state's timeout.
///
/// TCP: SYN_SENT becomes ESTABLISHED on the first packet without SYN (the
/// client's handshake ACK, or data either way), not on the SYN-ACK, so that a
/// retransmitted SYN-ACK still finds SYN_SENT. A FIN sets its direction's
/// `CT_F_FIN_*` bit on both entries; the flow is CLOSING (short timeout) only
/// once both sides sent one, or on an RST. A half-closed connection may still
/// carry data for hours one way, so it keeps the established timeout.
///
/// From the reply side, netfilter's rules for state changes apply. An RST
/// closes the flow only if it is exactly what the client would accept as a
/// reset (RFC 5961 §3.2; netfilter requires it in the window and not
/// before the acknowledged data): in SYN_SENT one that acknowledges the
/// client's SYN, afterwards one whose sequence number is the client's last
/// acknowledgement number (kept in the forward entry's `aux`). Any other
/// RST is still translated (the client decides; an in-window one makes it
/// send a challenge ACK, which a backend that really reset answers with the
/// exact RST) but leaves the flow as it is. A backend whose socket is gone
/// answers every segment with `seq = the segment's ack`, which is exact. A
/// SYN never changes an established flow. So a forged packet from the
/// backend's side cannot close a flow without knowing its sequence numbers.
/// True for a reply-side packet ignored that way (`reply-ignored`).
#[inline(always)]
fn refresh(
    ct: &CtMap,
    key: &CtKey,
    v: &mut CtValue,
    h: &Hdr,
    cfg: &Config,
    now: u32,
    reply: bool,
) -> bool {
    v.packets += 1;
    v.bytes += h.bytes;
    if h.proto != PROTO_TCP {
        v.expires = now.wrapping_add(cfg.ct_udp);
        return false;
    }
    let mut rst = h.tcp_flags & TCP_RST != 0;
    if !reply && h.tcp_flags & TCP_ACK != 0 {
        // The client's RCV.NXT; never moved back by a reordered ACK (in
        // SYN_SENT `aux` still holds the client's own SYN sequence).
        let ack = u32::from_be(h.ack);
        if v.tcp_state == CT_TCP_SYN_SENT || v.aux == 0 || (ack.wrapping_sub(v.aux) as i32) > 0 {
            v.aux = ack;
        }
    }
    let mut ignored = reply && h.tcp_flags & TCP_SYN != 0 && v.tcp_state == CT_TCP_ESTABLISHED;
    if reply && rst && !reply_rst_closes(ct, key, v, h) {
        rst = false;
        ignored = true;
    }
    let old_state = v.tcp_state;
    let old_flags = v.flags;
    let mut flags = old_flags;
    if h.tcp_flags & TCP_FIN != 0 {
        flags |= if reply {
            CT_F_FIN_REPLY
        } else {
            CT_F_FIN_FORWARD
        };
    }
    let both_fin = CT_F_FIN_FORWARD | CT_F_FIN_REPLY;
    let state = if rst || flags & both_fin == both_fin {
        CT_TCP_CLOSING
    } else if old_state == CT_TCP_SYN_SENT && h.tcp_flags & TCP_SYN == 0 {
        // Not on the SYN-ACK: ESTABLISHED means the handshake is over, so a
        // SYN-ACK on it can only be another connection's (`stale_reply`).
        CT_TCP_ESTABLISHED
    } else {
        old_state
    };
    let timeout = state_timeout(PROTO_TCP, state, cfg);
    v.expires = now.wrapping_add(timeout);
    if state == old_state && flags == old_flags {
        return ignored;
    }
    v.tcp_state = state;
    v.flags = flags;
    // Keep the peer in step: the forward side must see CLOSING to restart on
    // a new SYN, neither side should keep the SYN timeout, and the FIN bits
    // of both directions must meet on both entries.
    // Only while the peer is still this flow's: another flow may own that
    // tuple by now.
    let peer = key.peer(v);
    if let Some(p) = ct.get_ptr_mut(&peer)
        // SAFETY: the pointer comes from a successful lookup.
        && points_to(unsafe { &*p }, key)
    {
        // SAFETY: as above.
        unsafe {
            (*p).tcp_state = state;
            (*p).flags |= flags & both_fin;
            (*p).expires = now.wrapping_add(timeout);
        }
    }
    ignored
}

/// Whether the RST `h` from the reply side, which hit REPLY entry
/// `(key, v)`, may close the flow (see [`refresh`]). True when the forward
/// entry is gone or no longer this flow's: there is nothing left to
/// protect.
#[inline(always)]
fn reply_rst_closes(ct: &CtMap, key: &CtKey, v: &CtValue, h: &Hdr) -> bool {
    let Some(p) = ct.get_ptr(&key.peer(v)) else {
        return true;
    };
    // SAFETY: the pointer comes from a successful lookup; plain integers.
    let f = unsafe { &*p };
    // aux 0: an entry of an older agent, which did not keep the number.
    if !points_to(f, key) || f.aux == 0 {
        return true;
    }
    if f.tcp_state == CT_TCP_SYN_SENT {
        h.tcp_flags & TCP_ACK != 0 && u32::from_be(h.ack) == f.aux
    } else {
        u32::from_be(h.seq) == f.aux
    }
}

/// The timeout of an entry of `proto` in TCP state `state`.
#[inline(always)]
pub fn state_timeout(proto: u8, state: u8, cfg: &Config) -> u32 {
    if proto != PROTO_TCP {
        return cfg.ct_udp;
    }
    match state {
        CT_TCP_ESTABLISHED => cfg.ct_tcp_established,
        CT_TCP_CLOSING => cfg.ct_tcp_closing,
        _ => cfg.ct_tcp_syn,
    }
}
