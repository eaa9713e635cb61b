//! Route lookups and header rewrites of a translated packet.
use aya_ebpf::{
    bindings::{
        BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_SUCCESS, BPF_FIB_LOOKUP_SKIP_NEIGH,
        BPF_FIB_LOOKUP_SRC, bpf_fib_lookup,
    },
    helpers::generated::bpf_fib_lookup as fib_lookup,
};
use weir_abi::{Addr, STAT_DROP_FRAG_NEEDED, STAT_DROP_NO_ROUTE};

use super::{Hdr, IP4_CSUM, ctx::Pkt, daddr_off, l4_csum, l4_off, saddr_off};

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// The drop reason of a failed route lookup's return code.
#[inline(always)]
pub fn drop_reason(rc: i64) -> u32 {
    if rc == i64::from(BPF_FIB_LKUP_RET_FRAG_NEEDED) {
        STAT_DROP_FRAG_NEEDED
    } else {
        STAT_DROP_NO_ROUTE
    }
}

/// Looks up the route of the tuple as it will leave, from the ingress
/// device, and returns the helper's code (`BPF_FIB_LKUP_RET_*`, negative on
/// bad input). On success `p` holds the egress device, and with `src` the
/// source address the kernel would pick (`BPF_FIB_LOOKUP_SRC`).
///
/// The lookup also checks the egress MTU: TC leaves `tot_len` 0, so the
/// helper checks the skb itself (GSO-aware); XDP frames are single packets
/// and give their length.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn route<P: Pkt, const V6: bool>(
    pkt: &P,
    h: &Hdr,
    saddr: &Addr,
    sport: u16,
    daddr: &Addr,
    dport: u16,
    p: &mut bpf_fib_lookup,
    xdp: bool,
    src: bool,
) -> i64 {
    // SAFETY: an all-zero bpf_fib_lookup is a valid value of this plain C struct.
    *p = unsafe { core::mem::zeroed() };
    p.family = if V6 { AF_INET6 } else { AF_INET };
    p.l4_protocol = h.proto;
    p.sport = sport;
    p.dport = dport;
    if xdp {
        p.__bindgen_anon_1.tot_len = h.bytes as u16;
    }
    p.ifindex = pkt.ifindex();
    if V6 {
        p.__bindgen_anon_3.ipv6_src = saddr.0;
        p.__bindgen_anon_4.ipv6_dst = daddr.0;
    } else {
        p.__bindgen_anon_3.ipv4_src = saddr.v4();
        p.__bindgen_anon_4.ipv4_dst = daddr.v4();
    }
    // The neighbour is resolved by bpf_redirect_neigh (or the kernel).
    let mut flags = BPF_FIB_LOOKUP_SKIP_NEIGH;
    if src {
        flags |= BPF_FIB_LOOKUP_SRC;
    }
    // SAFETY: `p` is a valid, fully initialized parameter block of the size given.
    unsafe {
        fib_lookup(
            pkt.raw(),
            p,
            core::mem::size_of::<bpf_fib_lookup>() as i32,
            flags,
        )
    }
}

/// The address the kernel would use as source towards `dst`, for SNAT, with
/// the route to `dst` (its egress device) left in `p`; else the lookup's
/// failure code (a route without a usable source counts as no route).
#[inline(always)]
pub fn fib_src<P: Pkt, const V6: bool>(
    pkt: &P,
    h: &Hdr,
    dst: &Addr,
    dport: u16,
    p: &mut bpf_fib_lookup,
    xdp: bool,
) -> Result<Addr, i64> {
    let rc = route::<P, V6>(pkt, h, &h.saddr, h.sport, dst, dport, p, xdp, true);
    if rc != i64::from(BPF_FIB_LKUP_RET_SUCCESS) {
        return Err(rc);
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
        return Err(-1);
    }
    Ok(src)
}

/// Rewrites the packet's tuple from `h`'s to the given one, touching only
/// what changes. `csum_v6` is `CFG_F_CSUM_IPV6`.
#[inline(always)]
pub fn rewrite<P: Pkt, const V6: bool>(
    pkt: &mut P,
    h: &Hdr,
    saddr: &Addr,
    sport: u16,
    daddr: &Addr,
    dport: u16,
    csum_v6: bool,
) -> Option<()> {
    let csum = l4_csum::<V6>(h.proto, csum_v6);
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
