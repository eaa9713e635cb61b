//! Step 4 of the datapath design: a packet to a frontend with no live flow.
//!
//! SCTP: its CRC32c covers the ports but not the addresses (no pseudo
//! header), and cannot be updated incrementally at a reasonable cost here. So
//! SCTP flows are translated only while no port changes (backend port equal
//! to the frontend port, SNAT keeping the client's port); others pass
//! untranslated, counted as unsupported.
#![allow(clippy::needless_borrows_for_generic_args)]

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    helpers::generated::bpf_get_prandom_u32,
    maps::lpm_trie::Key,
};
use weir_abi::{
    AffinityKey, CT_DIR_REPLY, CT_F_CLUSTERIP, CT_F_SNAT, CT_F_XDP, CT_TCP_SYN_SENT, Config, CtKey,
    CtValue, PROTO_SCTP, PROTO_TCP, SCOPE_ALL, SCOPE_EXTERNAL, STAT_DROP_CT_FULL,
    STAT_DROP_MALFORMED, STAT_DROP_NO_BACKEND, STAT_DROP_SNAT_PORTS, STAT_DROP_SRC_RANGE,
    STAT_NEW_FLOW, STAT_PASS, STAT_PASS_UNSUPPORTED, STAT_XDP_TO_TC, SVC_F_EXTERNAL, SVC_F_LOCAL,
    SVC_F_SRC_RANGES, ServiceKey, SrcRangeKey,
};

use super::{
    Hdr,
    ctx::Pkt,
    flow::{CtMap, Verdict, csum_v6, reply_tuple_free, state_timeout},
    prog_of,
    route::{drop_reason, fib_src, rewrite},
};
use crate::{
    maps::{SERVICES, SRC_RANGES, Scratch, count},
    pick::choose,
};

/// Random SNAT ports tried after the client's own.
const SNAT_TRIES: u32 = 8;

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
    // SAFETY: values are plain integers; entries are freed only after RCU.
    let Some(master) = (unsafe { SERVICES.get(skey) }) else {
        count(prog, STAT_PASS, h.bytes);
        return Verdict::Pass;
    };
    let mut master = *master;
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
        master = *ext;
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
        _pad: [0; 6],
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
    if !snat && ct.insert(&*rkey, &*val, BPF_NOEXIST as u64).is_err() {
        if reply_tuple_free(ct, rkey, fwd_key, now) {
            if ct.insert(&*rkey, &*val, BPF_ANY as u64).is_err() {
                count(prog, STAT_DROP_CT_FULL, h.bytes);
                return Verdict::Drop;
            }
        } else if !alloc_snat_port(ct, rkey, val, h.sport, cfg, h.proto != PROTO_SCTP) {
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
        rkey.daddr = nat_saddr;
        if !alloc_snat_port(ct, rkey, val, h.sport, cfg, h.proto != PROTO_SCTP) {
            count(prog, STAT_DROP_SNAT_PORTS, h.bytes);
            return Verdict::Drop;
        }
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

/// Claims a SNAT port by inserting the reply entry only if its tuple is free
/// (also used without SNAT, `rkey.daddr` = the client, to resolve a clash).
/// Ports come from `Config::snat_port_{min,max}`, a range the node's own
/// sockets do not use (the programs cannot see them): the client's port if
/// it lies in the range (least surprise), then a few random ones. SCTP
/// cannot change ports, so it keeps the client's wherever it lies.
/// `rkey.dport` holds the port on success.
#[inline(always)]
fn alloc_snat_port(
    ct: &CtMap,
    rkey: &mut CtKey,
    val: &CtValue,
    client_port: u16,
    cfg: &Config,
    may_remap: bool,
) -> bool {
    let (min, max) = (u32::from(cfg.snat_port_min), u32::from(cfg.snat_port_max));
    let own = u32::from(u16::from_be(client_port));
    rkey.dport = client_port;
    if (!may_remap || (min <= own && own <= max))
        && ct.insert(&*rkey, val, BPF_NOEXIST as u64).is_ok()
    {
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
    for _ in 0..SNAT_TRIES {
        // SAFETY: bpf_get_prandom_u32 has no preconditions.
        let roll = unsafe { bpf_get_prandom_u32() };
        rkey.dport = ((min + roll % span) as u16).to_be();
        if ct.insert(&*rkey, val, BPF_NOEXIST as u64).is_ok() {
            return true;
        }
    }
    false
}
