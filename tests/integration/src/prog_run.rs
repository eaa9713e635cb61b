//! `BPF_PROG_TEST_RUN` on the packet programs an agent attached: a crafted
//! frame in, the program's verdict and the frame it leaves out.
//!
//! The program is the agent's own, found behind its pinned link, and the
//! maps it reads are the agent's, written by its reconciler from the
//! manifests. Runs happen on a thread inside the node's namespace
//! ([`crate::topology::in_netns`]): the kernel resolves the context's
//! ifindex there, so the device a frame "arrives" on, and the program's
//! route and neighbour lookups, are the node's.
//!
//! ```text
//!  frame (etherparse) ─▶ BPF_PROG_TEST_RUN(prog, ctx.ifindex = dev) ─▶ verdict
//!                                   │ agent's pinned maps               + frame out
//!                                   ▼                                      │
//!                              conntrack, SNAT ports           [`decode`]: every checksum
//! ```
use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};
use aya::programs::{SchedClassifier, TestRun as _, TestRunOptions, Xdp};
use aya_obj::programs::XdpAttachType;
use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};

/// `weir_tc_ingress`'s verdicts: tcx's "next" (-1, pass to whatever runs
/// after us), `TC_ACT_SHOT` and `TC_ACT_REDIRECT`.
pub const TC_NEXT: i32 = -1;
pub const TC_SHOT: i32 = 2;
pub const TC_REDIRECT: i32 = 7;
/// `enum xdp_action`.
pub const XDP_DROP: i32 = 1;
pub const XDP_PASS: i32 = 2;

/// The agent's packet programs on one device, opened from the ids behind
/// its pinned links (`links/tc-<dev>`, `links/xdp-<dev>`).
pub struct Programs {
    tc: SchedClassifier,
    xdp: Option<Xdp>,
}

impl Programs {
    /// `scratch` is a directory on a bpffs of the test's own: each program
    /// is pinned there by id for aya to open, and unpinned at once.
    pub fn of_device(pin_dir: &Path, dev: &str, scratch: &Path) -> Result<Self> {
        let open_tc = |p: &Path| Ok(SchedClassifier::from_pin(p)?);
        let tc = behind(
            &pin_dir.join("links").join(format!("tc-{dev}")),
            scratch,
            open_tc,
        )?
        .context("no TC link")?;
        let open_xdp = |p: &Path| Ok(Xdp::from_pin(p, XdpAttachType::Interface)?);
        let xdp = behind(
            &pin_dir.join("links").join(format!("xdp-{dev}")),
            scratch,
            open_xdp,
        )?;
        Ok(Self { tc, xdp })
    }

    /// Runs `weir_tc_ingress` on `frame` as if it arrived on device
    /// `ifindex` (of the calling thread's namespace).
    pub fn tc(&self, ifindex: u32, frame: &[u8]) -> Result<Outcome> {
        // `struct __sk_buff`: the kernel takes ingress_ifindex (offset 36)
        // and ifindex (40) from it; everything else it allows is left 0.
        let mut ctx = [0u8; 192];
        ctx[36..40].copy_from_slice(&ifindex.to_ne_bytes());
        ctx[40..44].copy_from_slice(&ifindex.to_ne_bytes());
        let mut out = vec![0u8; frame.len() + 256];
        let r = self.tc.test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            ..TestRunOptions::default()
        })?;
        out.truncate(r.data_size_out as usize);
        Ok(Outcome {
            verdict: r.return_value as i32,
            frame: out,
            meta: Vec::new(),
        })
    }

    /// Runs `weir_xdp` on `frame` as received on `ifindex`'s queue 0. The
    /// kernel returns the metadata the program reserved in front of the
    /// frame; `struct xdp_md`'s `data` says how long it is.
    pub fn xdp(&self, ifindex: u32, frame: &[u8]) -> Result<Outcome> {
        let xdp = self.xdp.as_ref().context("no XDP link on the device")?;
        let len = u32::try_from(frame.len())?;
        // data, data_end, data_meta, ingress_ifindex, rx_queue_index,
        // egress_ifindex: data_end must be the frame's length.
        let md = [0, len, 0, ifindex, 0, 0];
        let ctx: Vec<u8> = md.iter().flat_map(|w: &u32| w.to_ne_bytes()).collect();
        let mut ctx_out = [0u8; 24];
        let mut out = vec![0u8; frame.len() + 256];
        let r = xdp.test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            ctx_out: Some(&mut ctx_out),
            ..TestRunOptions::default()
        })?;
        out.truncate(r.data_size_out as usize);
        let meta_len = u32::from_ne_bytes(ctx_out[0..4].try_into()?) as usize;
        ensure!(meta_len <= out.len(), "metadata past the frame");
        let frame = out.split_off(meta_len);
        Ok(Outcome {
            verdict: r.return_value as i32,
            frame,
            meta: out,
        })
    }
}

/// The program behind the link pinned at `link`, if there is one.
fn behind<T>(link: &Path, scratch: &Path, open: impl Fn(&Path) -> Result<T>) -> Result<Option<T>> {
    if !link.exists() {
        return Ok(None);
    }
    let id = crate::linked_program(link)?;
    let pin = scratch.join(format!("test-run-{id}"));
    let out = Command::new("bpftool")
        .args(["prog", "pin", "id", &id.to_string()])
        .arg(&pin)
        .output()?;
    ensure!(
        out.status.success(),
        "bpftool prog pin id {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let prog = open(&pin);
    std::fs::remove_file(&pin).with_context(|| format!("unpinning {}", pin.display()))?;
    prog.map(Some)
}

/// What a run returned.
#[derive(Debug)]
pub struct Outcome {
    pub verdict: i32,
    /// The frame as the program left it.
    pub frame: Vec<u8>,
    /// XDP metadata in front of the frame (empty for TC).
    pub meta: Vec<u8>,
}

impl Outcome {
    /// The frame, parsed, each checksum verified (see [`decode`]).
    pub fn packet(&self) -> Result<Packet> {
        decode(&self.frame)
    }
}

/// The MAC address of `dev` in network namespace `netns` (its path).
pub fn mac_of(netns: &str, dev: &str) -> Result<[u8; 6]> {
    // nsenter --net keeps the root namespace's /sys: ask ip.
    let out = Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .args(["ip", "-j", "link", "show", "dev", dev])
        .output()?;
    ensure!(out.status.success(), "ip link show {dev} in {netns}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let mac = v[0]["address"].as_str().context("no address")?;
    let bytes: Vec<u8> = mac
        .split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<_, _>>()?;
    bytes.try_into().map_err(|_| anyhow::anyhow!("MAC {mac}"))
}

/// Ethernet addresses of a crafted frame.
#[derive(Clone, Copy, Debug)]
pub struct Macs {
    pub src: [u8; 6],
    pub dst: [u8; 6],
}

/// The TCP segment kinds the fixtures send.
#[derive(Clone, Copy, Debug)]
pub enum Tcp {
    Syn { seq: u32 },
    SynAck { seq: u32, ack: u32 },
}

/// An Ethernet frame carrying a TCP segment from `src` to `dst`, with
/// correct checksums, as a NIC without offloads would hand it over.
pub fn tcp_frame(macs: Macs, src: SocketAddr, dst: SocketAddr, seg: Tcp) -> Result<Vec<u8>> {
    let (seq, ack) = match seg {
        Tcp::Syn { seq } => (seq, None),
        Tcp::SynAck { seq, ack } => (seq, Some(ack)),
    };
    let b = ip(macs, src.ip(), dst.ip())?.tcp(src.port(), dst.port(), seq, 64_240);
    let b = b.syn();
    let b = match ack {
        Some(a) => b.ack(a),
        None => b,
    };
    let mut v = Vec::with_capacity(b.size(0));
    b.write(&mut v, &[])?;
    Ok(v)
}

/// An Ethernet frame carrying a UDP datagram.
pub fn udp_frame(macs: Macs, src: SocketAddr, dst: SocketAddr, payload: &[u8]) -> Result<Vec<u8>> {
    let b = ip(macs, src.ip(), dst.ip())?.udp(src.port(), dst.port());
    let mut v = Vec::with_capacity(b.size(payload.len()));
    b.write(&mut v, payload)?;
    Ok(v)
}

/// An ICMP (v4) or ICMPv6 echo request.
pub fn echo_frame(macs: Macs, src: IpAddr, dst: IpAddr) -> Result<Vec<u8>> {
    let b = ip(macs, src, dst)?;
    let mut v = Vec::new();
    if src.is_ipv4() {
        b.icmpv4_echo_request(7, 1).write(&mut v, b"weir-run")?;
    } else {
        b.icmpv6_echo_request(7, 1).write(&mut v, b"weir-run")?;
    }
    Ok(v)
}

fn ip(
    macs: Macs,
    src: IpAddr,
    dst: IpAddr,
) -> Result<etherparse::PacketBuilderStep<etherparse::IpHeaders>> {
    let eth = PacketBuilder::ethernet2(macs.src, macs.dst);
    Ok(match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => eth.ipv4(s.octets(), d.octets(), 64),
        (IpAddr::V6(s), IpAddr::V6(d)) => eth.ipv6(s.octets(), d.octets(), 64),
        _ => bail!("{src} and {dst} are of two families"),
    })
}

/// The headers of a frame a program emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    pub src: SocketAddr,
    pub dst: SocketAddr,
    /// IP protocol (next header).
    pub proto: u8,
}

/// Parses an Ethernet frame carrying IPv4 or IPv6 with TCP, UDP or ICMP,
/// and fails unless every checksum in it holds: the IPv4 header's, and the
/// transport's over its pseudo-header. The sums are computed here, not by
/// the parser, so that a bug in one cannot hide a bug in the other. Ports
/// are 0 for ICMP.
pub fn decode(frame: &[u8]) -> Result<Packet> {
    let p = SlicedPacket::from_ethernet(frame).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (src, dst, proto, pseudo) = match p.net.context("no IP")? {
        NetSlice::Ipv4(v4) => {
            let h = v4.header();
            ensure!(
                fold(sum(h.slice())) == 0xffff,
                "IPv4 header checksum {:#06x} is wrong",
                h.header_checksum()
            );
            let (s, d) = (h.source_addr(), h.destination_addr());
            let proto = h.protocol().0;
            let len = v4.payload().payload.len() as u32;
            let pseudo = sum(&s.octets()) + sum(&d.octets()) + u32::from(proto) + len;
            (IpAddr::V4(s), IpAddr::V4(d), proto, pseudo)
        }
        NetSlice::Ipv6(v6) => {
            let h = v6.header();
            let (s, d) = (h.source_addr(), h.destination_addr());
            let proto = v6.payload().ip_number.0;
            let len = v6.payload().payload.len() as u32;
            let pseudo = sum(&s.octets()) + sum(&d.octets()) + u32::from(proto) + len;
            (IpAddr::V6(s), IpAddr::V6(d), proto, pseudo)
        }
        NetSlice::Arp(_) => bail!("ARP"),
    };
    let (ports, l4, with_pseudo) = match p.transport.context("no transport header")? {
        TransportSlice::Tcp(t) => ((t.source_port(), t.destination_port()), t.slice(), true),
        TransportSlice::Udp(u) => {
            // An IPv4 UDP checksum of 0 means none was computed.
            if src.is_ipv4() && u.checksum() == 0 {
                let ports = (u.source_port(), u.destination_port());
                return Ok(packet(src, dst, ports, proto));
            }
            ((u.source_port(), u.destination_port()), u.slice(), true)
        }
        TransportSlice::Icmpv4(i) => ((0, 0), i.slice(), false),
        TransportSlice::Icmpv6(i) => ((0, 0), i.slice(), true),
        TransportSlice::Igmp(_) => bail!("IGMP"),
    };
    let total = sum(l4) + if with_pseudo { pseudo } else { 0 };
    ensure!(
        fold(total) == 0xffff,
        "the protocol {proto} checksum of {src} → {dst} is wrong"
    );
    Ok(packet(src, dst, ports, proto))
}

fn packet(src: IpAddr, dst: IpAddr, (sport, dport): (u16, u16), proto: u8) -> Packet {
    Packet {
        src: SocketAddr::new(src, sport),
        dst: SocketAddr::new(dst, dport),
        proto,
    }
}

/// The ones' complement sum of `b` as 16-bit big-endian words, unfolded.
fn sum(b: &[u8]) -> u32 {
    b.chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum()
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    const MACS: Macs = Macs {
        src: [2, 0, 0, 0, 0, 1],
        dst: [2, 0, 0, 0, 0, 2],
    };

    #[test]
    fn the_decoder_accepts_built_frames_and_catches_one_flipped_bit() {
        let a: SocketAddr = "192.168.50.2:40000".parse().unwrap();
        let b: SocketAddr = "192.168.70.50:80".parse().unwrap();
        let a6: SocketAddr = "[fd00:50::2]:40000".parse().unwrap();
        let b6: SocketAddr = "[fd00:50::1]:30500".parse().unwrap();
        let frames = [
            tcp_frame(MACS, a, b, Tcp::Syn { seq: 1 }).unwrap(),
            tcp_frame(MACS, a6, b6, Tcp::SynAck { seq: 1, ack: 2 }).unwrap(),
            udp_frame(MACS, a, b, b"x").unwrap(),
            udp_frame(MACS, a6, b6, b"xyz").unwrap(),
            echo_frame(MACS, a.ip(), b.ip()).unwrap(),
            echo_frame(MACS, a6.ip(), b6.ip()).unwrap(),
        ];
        for f in &frames {
            let p = decode(f).unwrap();
            assert!(p.src.ip() == a.ip() || p.src.ip() == a6.ip(), "{p:?}");
            // A flipped bit anywhere past the Ethernet header (the
            // addresses, the ports, the payload) breaks a checksum.
            for at in [14 + 9, f.len() - 1, f.len() - 3] {
                let mut bad = f.clone();
                bad[at] ^= 0x10;
                assert!(decode(&bad).is_err(), "byte {at} of {p:?}");
            }
        }
    }
}
