//! Per-packet load balancing: `weir_tc_ingress` on every `--devices` device
//! and pod host-side veth, and the shared parsing both it and `weir_xdp` use.
//!
//! Only Ethernet frames (TC: `skb->protocol` IPv4/IPv6 with a 14-byte
//! Ethernet header in front) carrying IPv4 without options and unfragmented,
//! or IPv6 whose next header is TCP, UDP or SCTP directly, are translated. The
//! rest goes on untouched (counted as pass-unsupported when it is IP we
//! decline).
pub mod ctx;
pub mod flow;
pub mod new_flow;
pub mod route;

use aya_ebpf::{macros::classifier, programs::TcContext};
use weir_abi::{
    Addr, PROTO_SCTP, PROTO_TCP, PROTO_UDP, STAT_PASS, STAT_PASS_UNSUPPORTED, STAT_PROG_TC_INGRESS,
    STAT_PROG_XDP,
};

use self::{
    ctx::{L4Csum, Pkt, TcPkt},
    flow::Verdict,
};
use crate::maps::{SCRATCH, count};

/// tcx: let later programs on the device run, then pass. Legacy cls_bpf in
/// direct-action mode reads the same value (`TC_ACT_UNSPEC`) as "continue".
/// Returning `TCX_PASS` (0) instead would silently skip e.g. a CNI's policy
/// program attached after ours.
const TCX_NEXT: i32 = -1;
/// `TC_ACT_SHOT` / `TCX_DROP`.
const TC_ACT_SHOT: i32 = 2;

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;

/// Offset of the IPv4 header checksum.
pub const IP4_CSUM: usize = ETH_HLEN + 10;

/// Offsets of the fields we read and rewrite, by family.
#[inline(always)]
pub const fn saddr_off(v6: bool) -> usize {
    if v6 { ETH_HLEN + 8 } else { ETH_HLEN + 12 }
}
#[inline(always)]
pub const fn daddr_off(v6: bool) -> usize {
    if v6 { ETH_HLEN + 24 } else { ETH_HLEN + 16 }
}
#[inline(always)]
pub const fn l4_off(v6: bool) -> usize {
    if v6 { ETH_HLEN + 40 } else { ETH_HLEN + 20 }
}

/// TCP flags byte bits.
pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

/// What the programs need from one packet's headers.
#[derive(Clone, Copy, Default)]
pub struct Hdr {
    pub saddr: Addr,
    pub daddr: Addr,
    /// IP total length, for byte counters.
    pub bytes: u64,
    /// Ports, network order.
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// TCP flags byte, 0 for other protocols.
    pub tcp_flags: u8,
    /// TCP sequence and acknowledgement numbers, network order; 0 for
    /// other protocols.
    pub seq: u32,
    pub ack: u32,
}

/// The L4 checksum of `proto`; `csum_v6` is `CFG_F_CSUM_IPV6`. Derived from the protocol rather than stored
/// with the headers so that its offset stays a constant the verifier can
/// check packet accesses against.
#[inline(always)]
pub fn l4_csum<const V6: bool>(proto: u8, csum_v6: bool) -> L4Csum {
    let ipv6 = V6 && csum_v6;
    match proto {
        PROTO_TCP => L4Csum {
            off: l4_off(V6) + 16,
            udp: false,
            ipv6,
        },
        PROTO_UDP => L4Csum {
            off: l4_off(V6) + 6,
            udp: true,
            ipv6,
        },
        _ => L4Csum::default(),
    }
}

#[classifier]
pub fn weir_tc_ingress(ctx: TcContext) -> i32 {
    let mut pkt = TcPkt(&ctx);
    match run(&mut pkt, false) {
        Verdict::Drop => TC_ACT_SHOT,
        Verdict::Pass => TCX_NEXT,
        Verdict::Redirect(action) => action as i32,
    }
}

/// Parses the frame and hands IP packets of ours to [`flow::handle`].
#[inline(always)]
pub fn run<P: Pkt>(pkt: &mut P, xdp: bool) -> Verdict {
    let Some(ether_type) = pkt.load::<u16>(12) else {
        count(prog_of(xdp), STAT_PASS, 0);
        return Verdict::Pass;
    };
    // Offsets below assume a 14-byte Ethernet header; anything else (a
    // tunnel or other L3 device seen by TC) is not ours to parse.
    if !pkt.is_ethernet(ether_type) {
        count(prog_of(xdp), STAT_PASS, 0);
        return Verdict::Pass;
    }
    match u16::from_be(ether_type) {
        ETH_P_IP => run_family::<P, false>(pkt, xdp),
        ETH_P_IPV6 => run_family::<P, true>(pkt, xdp),
        _ => {
            count(prog_of(xdp), STAT_PASS, 0);
            Verdict::Pass
        }
    }
}

#[inline(always)]
pub fn prog_of(xdp: bool) -> u32 {
    if xdp {
        STAT_PROG_XDP
    } else {
        STAT_PROG_TC_INGRESS
    }
}

// Not inlined: the IPv4 and IPv6 instances then get a stack frame each
// instead of sharing one that must hold both, which would exceed 512 bytes.
// The headers live in per-CPU scratch space for the same reason.
#[inline(never)]
fn run_family<P: Pkt, const V6: bool>(pkt: &mut P, xdp: bool) -> Verdict {
    let Some(scratch) = SCRATCH.get_ptr_mut(u32::from(xdp)) else {
        count(prog_of(xdp), STAT_PASS, 0);
        return Verdict::Pass;
    };
    // SAFETY: a per-CPU entry, and TC and XDP use different ones, so nothing
    // else uses it while this program runs. Fields are borrowed one by one
    // (here `h`, in `flow` the others) so no two references overlap.
    let h = unsafe { &mut (*scratch).h };
    *h = Hdr::default();
    if let Err(reason) = parse::<P, V6>(pkt, h) {
        count(prog_of(xdp), reason, h.bytes);
        return Verdict::Pass;
    }
    // Counted by XDP already.
    if !xdp && pkt.marked_by_xdp() {
        return flow::finish_xdp::<P, V6>(pkt, h, scratch);
    }
    flow::handle::<P, V6>(pkt, h, scratch, xdp)
}

/// Fills `h`, or says why the packet is not for us (a `STAT_*` pass reason).
#[inline(always)]
fn parse<P: Pkt, const V6: bool>(pkt: &P, h: &mut Hdr) -> Result<(), u32> {
    if V6 {
        let payload: u16 = pkt.load(ETH_HLEN + 4).ok_or(STAT_PASS)?;
        h.bytes = u64::from(u16::from_be(payload)) + 40;
        h.proto = pkt.load(ETH_HLEN + 6).ok_or(STAT_PASS)?;
    } else {
        let ver_ihl: u8 = pkt.load(ETH_HLEN).ok_or(STAT_PASS)?;
        let tot_len: u16 = pkt.load(ETH_HLEN + 2).ok_or(STAT_PASS)?;
        h.bytes = u64::from(u16::from_be(tot_len));
        if ver_ihl != 0x45 {
            return Err(STAT_PASS_UNSUPPORTED);
        }
        let frag: u16 = pkt.load(ETH_HLEN + 6).ok_or(STAT_PASS)?;
        // More-fragments set or a non-zero offset: only the first fragment
        // has ports, and translating it alone would break reassembly.
        if u16::from_be(frag) & 0x3fff != 0 {
            return Err(STAT_PASS_UNSUPPORTED);
        }
        h.proto = pkt.load(ETH_HLEN + 9).ok_or(STAT_PASS)?;
    }
    let l4 = l4_off(V6);
    match h.proto {
        PROTO_TCP => {
            h.tcp_flags = pkt.load(l4 + 13).ok_or(STAT_PASS_UNSUPPORTED)?;
            h.seq = pkt.load(l4 + 4).ok_or(STAT_PASS_UNSUPPORTED)?;
            h.ack = pkt.load(l4 + 8).ok_or(STAT_PASS_UNSUPPORTED)?;
        }
        PROTO_UDP | PROTO_SCTP => {}
        _ => return Err(STAT_PASS),
    }
    if V6 {
        h.saddr = pkt.load(saddr_off(true)).ok_or(STAT_PASS)?;
        h.daddr = pkt.load(daddr_off(true)).ok_or(STAT_PASS)?;
    } else {
        h.saddr = Addr::from_v4(pkt.load(saddr_off(false)).ok_or(STAT_PASS)?);
        h.daddr = Addr::from_v4(pkt.load(daddr_off(false)).ok_or(STAT_PASS)?);
    }
    h.sport = pkt.load(l4).ok_or(STAT_PASS_UNSUPPORTED)?;
    h.dport = pkt.load(l4 + 2).ok_or(STAT_PASS_UNSUPPORTED)?;
    Ok(())
}
