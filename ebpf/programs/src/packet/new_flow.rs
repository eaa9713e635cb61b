//! Step 4 of the datapath design: a packet to a frontend with no live flow.
//!
//! SCTP: its CRC32c covers the ports but not the addresses (no pseudo
//! header), and cannot be updated incrementally at a reasonable cost here. So
//! SCTP flows are translated only while no port changes (backend port equal
//! to the frontend port, SNAT keeping the client's port); others pass
//! untranslated, counted as unsupported.
#![allow(clippy::needless_borrows_for_generic_args)]

use core::{ffi::c_void, ptr::null_mut};

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    helpers::generated::{bpf_get_prandom_u32, bpf_loop},
    maps::lpm_trie::Key,
};
use weir_abi::{
    AffinityKey, CT_DIR_REPLY, CT_F_CLUSTERIP, CT_F_SNAT, CT_F_XDP, CT_TCP_SYN_SENT, Config, CtKey,
    CtValue, PROTO_SCTP, PROTO_TCP, SCOPE_ALL, SCOPE_EXTERNAL, STAT_DROP_CT_FULL,
    STAT_DROP_CT_INVALID, STAT_DROP_MALFORMED, STAT_DROP_NO_BACKEND, STAT_DROP_SNAT_PORTS,
    STAT_DROP_SRC_RANGE, STAT_NEW_FLOW, STAT_PASS, STAT_PASS_UNSUPPORTED, STAT_XDP_TO_TC,
    SVC_F_EXTERNAL, SVC_F_LOCAL, SVC_F_MAGLEV, SVC_F_SRC_RANGES, ServiceKey, SrcRangeKey,
    maglev::flow_hash,
};

use super::{
    Hdr, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN,
    ctx::Pkt,
    flow::{CtMap, Verdict, csum_v6, ct_map, reply_ifindex, reply_tuple_free, state_timeout},
    prog_of,
    route::{drop_reason, fib_src, rewrite},
};
use crate::{
    maps::{Probe, SCRATCH, SERVICES, SRC_RANGES, Scratch, count},
    pick::{Fresh, choose},
};

#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn new_flow<P: Pkt, const V6: bool>(
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
    // SAFETY: values are plain integers, and an element's memory outlives
    // the program's RCU read section (its contents may change: maps.rs).
    let Some(found) = (unsafe { SERVICES.get(skey) }) else {
        count(prog, STAT_PASS, h.bytes);
        return Verdict::Pass;
    };
    // Verifier: in scratch space, as the stack next to the pick's frames
    // would be over 512 bytes with it.
    // SAFETY: see `run_family`; a field disjoint from `h`.
    let master = unsafe { &mut (*scratch).master };
    *master = *found;
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
    // Only a SYN starts a TCP flow. Anything else to a frontend without a
    // tracked flow (an ACK, data, FIN or RST) is what netfilter with
    // `nf_conntrack_tcp_loose=0` calls INVALID, and it is dropped here
    // rather than passed untranslated:
    // - a flow made from it would take two entries of the LRU tables, so a
    //   flood of forged ACKs would evict the established flows;
    // - passed untranslated it would reach the node's own stack (NodePort,
    //   externalIP: no socket, so the node answers every forged packet with
    //   an RST, a reflection) or be routed onward to a ClusterIP or LB IP
    //   that means nothing beyond this node;
    // - kube-proxy drops such packets too (`--ctstate INVALID -j DROP`).
    // A client whose flow this node lost (a full table) sees its packets
    // dropped and times out, or retransmits into a new connection, instead
    // of being RST by another backend.
    if h.proto == PROTO_TCP && h.tcp_flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) != TCP_SYN {
        count(prog, STAT_DROP_CT_INVALID, h.bytes);
        return Verdict::Drop;
    }
    // externalTrafficPolicy: Local. The SCOPE_ALL entries hold every
    // endpoint, for the socket hooks (in-cluster clients); packets use the
    // node-local view the agent writes as SCOPE_EXTERNAL, with its own
    // rev-NAT id, source ranges and affinity, so the client address can be
    // kept. A missing SCOPE_EXTERNAL master means no local endpoint.
    if master.flags & SVC_F_LOCAL != 0 {
        skey.scope = SCOPE_EXTERNAL;
        // SAFETY: as above.
        let Some(ext) = (unsafe { SERVICES.get(skey) }) else {
            count(prog, STAT_DROP_NO_BACKEND, h.bytes);
            return Verdict::Drop;
        };
        *master = *ext;
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
    // Maglev frontends: the same backend on every node for this tuple.
    let how = if master.flags & SVC_F_MAGLEV != 0 {
        Fresh::Flow(flow_hash(&h.saddr, &h.daddr, h.sport, h.dport, h.proto))
    } else {
        Fresh::Random
    };
    let Some(pick) = choose(&mut skey, master, &aff, now, how) else {
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
    let tcp = h.proto == PROTO_TCP;
    let mut flags = 0;
    if xdp {
        flags |= CT_F_XDP;
    }
    if master.flags & SVC_F_EXTERNAL == 0 {
        flags |= CT_F_CLUSTERIP;
    }
    // The REPLY entry first: its value undoes the translation, back to the
    // tuple the client sent.
    *val = CtValue {
        nat_daddr: h.saddr,
        nat_saddr: h.daddr,
        nat_dport: h.sport,
        nat_sport: h.dport,
        backend_id: pick.backend_id,
        rev_nat_id: pick.rev_nat_id,
        expires: now.wrapping_add(state_timeout(h.proto, CT_TCP_SYN_SENT, cfg)),
        tcp_state: if tcp { CT_TCP_SYN_SENT } else { 0 },
        flags,
        _pad: [0; 2],
        aux: 0,
        packets: 0,
        bytes: 0,
    };
    *rkey = CtKey {
        saddr: pick.addr,
        daddr: h.saddr,
        sport: pick.port,
        dport: h.sport,
        proto: h.proto,
        dir: CT_DIR_REPLY,
        _pad: [0; 2],
    };
    // Without SNAT the reply tuple is the client's own, which a live flow
    // of the same client port towards another frontend with the same
    // backend may hold (see `reply_tuple_free`). Like netfilter's clash
    // resolution, this flow then keeps the client's address and only takes
    // another source port; the address matters to network policies.
    if !snat {
        // The kernel forwards the packets along this route, and the backend's
        // replies come back over its device (`flow::reply_device_ok`).
        val.aux =
            reply_ifindex::<P, V6>(pkt, h, &h.saddr, h.sport, &pick.addr, pick.port, fib, xdp);
    }
    if !snat && ct.insert(&*rkey, &*val, BPF_NOEXIST as u64).is_err() {
        if reply_tuple_free(ct, rkey, fwd_key, now) {
            if ct.insert(&*rkey, &*val, BPF_ANY as u64).is_err() {
                count(prog, STAT_DROP_CT_FULL, h.bytes);
                return Verdict::Drop;
            }
        } else if !alloc_snat_port(ct, scratch, h.sport, cfg, h.proto != PROTO_SCTP, xdp) {
            count(prog, STAT_DROP_SNAT_PORTS, h.bytes);
            return Verdict::Drop;
        }
    }
    let mut nat_saddr = h.saddr;
    if snat {
        // Before anything is written or rewritten: no route, no flow.
        match fib_src::<P, V6>(pkt, h, &pick.addr, pick.port, fib, xdp) {
            Ok(a) => nat_saddr = a,
            Err(_) if xdp => {
                count(prog, STAT_XDP_TO_TC, h.bytes);
                return Verdict::Pass;
            }
            Err(rc) => {
                count(prog, drop_reason(rc), h.bytes);
                return Verdict::Drop;
            }
        }
        val.flags |= CT_F_SNAT;
        // The packets are redirected to the route's device, and the replies
        // come back over it.
        val.aux = fib.ifindex;
        rkey.daddr = nat_saddr;
        if !alloc_snat_port(ct, scratch, h.sport, cfg, h.proto != PROTO_SCTP, xdp) {
            count(prog, STAT_DROP_SNAT_PORTS, h.bytes);
            return Verdict::Drop;
        }
    }
    val.nat_daddr = pick.addr;
    val.nat_saddr = nat_saddr;
    val.nat_dport = pick.port;
    val.nat_sport = rkey.dport;
    // The forward entry keeps what an RST from the backend must acknowledge
    // to close the flow in SYN_SENT (`flow::refresh`).
    val.aux = if tcp {
        u32::from_be(h.seq).wrapping_add(1)
    } else {
        0
    };
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
    let csum = csum_v6(cfg);
    if rewrite::<P, V6>(pkt, h, &nat_saddr, rkey.dport, &pick.addr, pick.port, csum).is_none() {
        count(prog, STAT_DROP_MALFORMED, h.bytes);
        return Verdict::Drop;
    }
    count(prog, STAT_NEW_FLOW, h.bytes);
    if !snat || xdp {
        return Verdict::Pass;
    }
    // The source is now this node's; see `flow::translate_hit`. `fib_src`
    // left the egress device in `fib`.
    Verdict::Redirect(pkt.redirect(fib))
}

/// Claims a SNAT port by inserting the reply entry (`Scratch::rkey`, value
/// `Scratch::val`) only if its tuple is free (also used without SNAT,
/// `rkey.daddr` = the client, to resolve a clash). Ports come from
/// `Config::snat_port_{min,max}`, a range the node's own sockets do not use
/// (the programs cannot see them): the client's port if it lies in the
/// range (least surprise), then a linear probe over the whole range from a
/// random start, so a new flow fails only when every port of the range is
/// taken towards this backend (counted `drop-snat-ports`). A handful of
/// random tries instead fail often long before: at 80% use, 8 tries all
/// miss for 0.8^8 ≈ 17% of new connections. SCTP cannot change ports, so it
/// keeps the client's wherever it lies. `rkey.dport` holds the port on
/// success.
///
/// The probe runs in `bpf_loop` (Linux 5.17; the packet programs need 6.7
/// anyway), which the verifier checks by verifying the callback once, with
/// the iteration count a runtime value up to 2^23: a plain `for` loop over
/// up to 65,536 ports would be verified iteration by iteration (its
/// counter is a different precise value each time) and blow the
/// verifier's 1M-instruction budget. The bound is `span`, the size of the
/// range, at most 65,536 (checked below). Its cost is one hash lookup per
/// taken port (about 50 ns), so it is noticeable only when the range is
/// nearly full: milliseconds for a full 64Ki range, and a full range is a
/// configuration problem `drop-snat-ports` reports.
#[inline(always)]
fn alloc_snat_port(
    ct: &CtMap,
    scratch: *mut Scratch,
    client_port: u16,
    cfg: &Config,
    may_remap: bool,
    xdp: bool,
) -> bool {
    // SAFETY: see `run_family`; fields disjoint from `h`, which the caller
    // filled (`rkey`, `val`) or does not use (`probe`).
    let (rkey, val, probe) =
        unsafe { (&mut (*scratch).rkey, &(*scratch).val, &mut (*scratch).probe) };
    let (min, max) = (u32::from(cfg.snat_port_min), u32::from(cfg.snat_port_max));
    let own = u32::from(u16::from_be(client_port));
    rkey.dport = client_port;
    if (!may_remap || (min <= own && own <= max)) && claim(ct, rkey, val) {
        return true;
    }
    if !may_remap {
        return false;
    }
    // `config` guarantees min <= max; the check spares the verifier a
    // division-by-zero panic path it would reject.
    let span = max.wrapping_sub(min).wrapping_add(1);
    if span == 0 || span > 65_536 {
        return false;
    }
    // SAFETY: bpf_get_prandom_u32 has no preconditions.
    let roll = unsafe { bpf_get_prandom_u32() };
    *probe = Probe {
        start: roll % span,
        span,
        min,
        found: 0,
    };
    // Two instances of the callback, one per scratch slot: the verifier
    // needs the callback as a constant, so it is not chosen at run time.
    // SAFETY: the callback has the signature bpf_loop expects and takes no
    // context (null); it finds its state in this CPU's scratch slot.
    let _ = unsafe {
        if xdp {
            bpf_loop(span, probe_fn::<true>(), null_mut(), 0)
        } else {
            bpf_loop(span, probe_fn::<false>(), null_mut(), 0)
        }
    };
    probe.found != 0
}

/// Inserts the reply entry `rkey` if its tuple is free. Looked up first:
/// an LRU map takes a free node (evicting some entry when full) before it
/// finds that a `BPF_NOEXIST` key exists, so inserting into taken tuples
/// would evict live flows.
#[inline(always)]
fn claim(ct: &CtMap, rkey: &CtKey, val: &CtValue) -> bool {
    ct.get_ptr(rkey).is_none() && ct.insert(rkey, val, BPF_NOEXIST as u64).is_ok()
}

/// `probe_port::<XDP>` as the pointer `bpf_loop` takes.
#[inline(always)]
fn probe_fn<const XDP: bool>() -> *mut c_void {
    probe_port::<XDP> as *const () as *mut c_void
}

/// One step of the linear probe (see [`alloc_snat_port`]), called by
/// `bpf_loop` with `i` in `0..span`: tries port `min + (start + i) % span`
/// of the scratch slot of TC (`XDP` false) or XDP. Returns 1 (stop) once a
/// port is claimed.
#[inline(never)]
extern "C" fn probe_port<const XDP: bool>(i: u64, _ctx: *mut c_void) -> i64 {
    let Some(s) = SCRATCH.get_ptr_mut(u32::from(XDP)) else {
        return 1;
    };
    // SAFETY: this CPU's slot, which the program that called bpf_loop is
    // using and nothing else touches meanwhile; disjoint fields.
    let (rkey, val, probe) = unsafe { (&mut (*s).rkey, &(*s).val, &mut (*s).probe) };
    // start < span and i < span, so one subtraction wraps it into range
    // without a division.
    let mut off = probe.start.wrapping_add(i as u32);
    if off >= probe.span {
        off = off.wrapping_sub(probe.span);
    }
    rkey.dport = (probe.min.wrapping_add(off) as u16).to_be();
    if claim(ct_map(rkey.proto), rkey, val) {
        probe.found = 1;
        return 1;
    }
    0
}
