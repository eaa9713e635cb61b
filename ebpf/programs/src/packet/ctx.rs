//! Packet access for the TC and XDP programs behind one trait, so that the
//! flow logic in [`super::flow`] is written once.
//!
//! TC goes through the skb helpers: they cope with non-linear skbs and keep
//! `CHECKSUM_PARTIAL` / `CHECKSUM_COMPLETE` state right, which a hand-made
//! checksum update cannot. XDP frames are linear and carry no checksum
//! state, so XDP writes them directly and updates checksums by RFC 1624.
use core::{ffi::c_void, mem::size_of};

use aya_ebpf::{
    EbpfContext as _,
    bindings::{
        BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR, bpf_fib_lookup,
        bpf_hdr_start_off::BPF_HDR_START_NET, xdp_action,
    },
    helpers::generated::{bpf_redirect_neigh, bpf_skb_load_bytes_relative, bpf_xdp_adjust_meta},
    programs::{TcContext, XdpContext},
};

/// 0 when the kernel refuses `bpf_xdp_adjust_meta` to XDP programs (some
/// builds do; the loader probes it). It lives in `.rodata`, which the loader
/// freezes, so the verifier takes it as a constant and never walks the
/// helper call behind it: a program that merely contains a refused call is
/// refused whole. Without the mark, XDP passes the flows it would have
/// handed to TC, and TC translates them itself.
#[unsafe(no_mangle)]
static WEIR_XDP_META: u8 = 1;

/// Where the L4 checksum lives and how it behaves.
#[derive(Clone, Copy, Default)]
pub struct L4Csum {
    /// Offset of the checksum field from the start of the frame; 0 when the
    /// protocol has no checksum we maintain (SCTP: CRC32c, see `flow.rs`).
    pub off: usize,
    /// UDP: a zero checksum means "none" (IPv4) and a computed zero is sent
    /// as 0xffff.
    pub udp: bool,
    /// IPv6 address rewrite on a kernel that knows `BPF_F_IPV6`
    /// (`CFG_F_CSUM_IPV6`): without it, `bpf_l4_csum_replace` leaves
    /// `skb->csum` of a CHECKSUM_COMPLETE packet wrong for the 128-bit
    /// pseudo-header change, and the stack later drops the packet.
    pub ipv6: bool,
}

/// `BPF_F_IPV6` for `bpf_l4_csum_replace` (Linux 6.16); older kernels refuse
/// unknown flags, hence only when the agent says so.
const BPF_F_IPV6: u64 = 1 << 7;

pub trait Pkt {
    /// Reads a `T` at `off` bytes from the start of the frame.
    fn load<T: Copy>(&self, off: usize) -> Option<T>;
    /// Replaces the address word `old` at `off` by `new`, fixing the IPv4
    /// header checksum at `ip_csum` (0: IPv6, none) and the L4 checksum,
    /// which covers the address through the pseudo-header.
    fn set_word(
        &mut self,
        off: usize,
        old: u32,
        new: u32,
        ip_csum: usize,
        l4: L4Csum,
    ) -> Option<()>;
    /// Replaces the port `old` at `off` by `new`, fixing the L4 checksum.
    fn set_port(&mut self, off: usize, old: u16, new: u16, l4: L4Csum) -> Option<()>;
    /// Whether the frame starts with an Ethernet header carrying
    /// `ether_type` (read at offset 12). TC also sees devices without a
    /// link-layer header, whose packets start right at the IP header.
    fn is_ethernet(&self, ether_type: u16) -> bool;
    /// Index of the device the packet arrived on.
    fn ifindex(&self) -> u32;
    /// The program context, for helpers such as `bpf_fib_lookup`.
    fn raw(&self) -> *mut c_void;
    /// TC: sends the packet out of the egress device of the successful
    /// route lookup `fib`, bypassing the kernel's input routing; returns the
    /// program's verdict.
    fn redirect(&mut self, fib: &bpf_fib_lookup) -> u32;
    /// XDP: tags the packet for TC on the same device, which must send it
    /// out by [`Pkt::redirect`] (see [`XDP_MARK`]). False if the driver has
    /// no room for metadata.
    fn mark_for_tc(&mut self) -> bool;
    /// TC: whether XDP translated this packet and tagged it.
    fn marked_by_xdp(&self) -> bool;
}

/// Metadata `weir_xdp` puts in front of a packet it translated with a SNAT
/// source. Such a packet cannot take the kernel's input path (its source is
/// now a local address: a martian) and XDP cannot reliably transmit it
/// itself (redirecting into a veth needs XDP or GRO on the far end), so TC
/// on the same device redirects it with `bpf_redirect_neigh`.
pub const XDP_MARK: u32 = 0x5745_4952;

pub struct TcPkt<'a>(pub &'a TcContext);

impl Pkt for TcPkt<'_> {
    #[inline(always)]
    fn load<T: Copy>(&self, off: usize) -> Option<T> {
        self.0.load::<T>(off).ok()
    }

    #[inline(always)]
    fn set_word(
        &mut self,
        off: usize,
        old: u32,
        new: u32,
        ip_csum: usize,
        l4: L4Csum,
    ) -> Option<()> {
        if ip_csum != 0 {
            self.0
                .l3_csum_replace(ip_csum, u64::from(old), u64::from(new), 4)
                .ok()?;
        }
        if l4.off != 0 {
            let v6 = if l4.ipv6 { BPF_F_IPV6 } else { 0 };
            let flags = BPF_F_PSEUDO_HDR as u64 | 4 | mangled(l4) | v6;
            self.0
                .l4_csum_replace(l4.off, u64::from(old), u64::from(new), flags)
                .ok()?;
        }
        self.0.store(off, &new, 0).ok()
    }

    #[inline(always)]
    fn set_port(&mut self, off: usize, old: u16, new: u16, l4: L4Csum) -> Option<()> {
        if l4.off != 0 {
            let flags = 2 | mangled(l4);
            self.0
                .l4_csum_replace(l4.off, u64::from(old), u64::from(new), flags)
                .ok()?;
        }
        self.0.store(off, &new, 0).ok()
    }

    #[inline(always)]
    fn is_ethernet(&self, ether_type: u16) -> bool {
        let skb = self.0.skb.skb;
        // SAFETY: the kernel hands every classifier a valid __sk_buff.
        let proto = unsafe { (*skb).protocol } as u16;
        if proto != ether_type {
            return false;
        }
        // On a device without link-layer header the network header is at
        // offset 0, not 14; compare the first word there with offset 14.
        let mut net = 0u32;
        // SAFETY: reads 4 bytes into `net` from the skb.
        let rc = unsafe {
            bpf_skb_load_bytes_relative(
                self.0.as_ptr(),
                0,
                (&raw mut net).cast(),
                4,
                BPF_HDR_START_NET,
            )
        };
        rc == 0 && self.load::<u32>(14) == Some(net)
    }

    #[inline(always)]
    fn ifindex(&self) -> u32 {
        // SAFETY: the kernel hands every classifier a valid __sk_buff.
        unsafe { (*self.0.skb.skb).ifindex }
    }

    #[inline(always)]
    fn raw(&self) -> *mut c_void {
        self.0.as_ptr()
    }

    #[inline(always)]
    fn redirect(&mut self, fib: &bpf_fib_lookup) -> u32 {
        // No neighbour parameters: the kernel resolves the next hop of the
        // rewritten destination itself, as the normal output path would.
        // SAFETY: a null parameter block with length 0 is the documented form.
        let rc = unsafe { bpf_redirect_neigh(fib.ifindex, core::ptr::null_mut(), 0, 0) };
        rc as u32
    }

    #[inline(always)]
    fn mark_for_tc(&mut self) -> bool {
        false
    }

    #[inline(always)]
    fn marked_by_xdp(&self) -> bool {
        let skb = self.0.skb.skb;
        // SAFETY: the kernel hands every classifier a valid __sk_buff.
        let (meta, data) = unsafe { ((*skb).data_meta as usize, (*skb).data as usize) };
        if meta + 4 > data {
            return false;
        }
        // SAFETY: bounds-checked against the start of the packet data.
        unsafe { (meta as *const u32).read_unaligned() == XDP_MARK }
    }
}

/// Leaves a zero UDP checksum alone (IPv4 "no checksum") and turns a computed
/// zero into 0xffff, inside the helper.
#[inline(always)]
fn mangled(l4: L4Csum) -> u64 {
    if l4.udp {
        BPF_F_MARK_MANGLED_0 as u64
    } else {
        0
    }
}

/// Deepest header offset we touch: the end of a TCP header after IPv6.
const MAX_OFF: usize = 14 + 40 + 20;

pub struct XdpPkt<'a> {
    ctx: &'a XdpContext,
    data: usize,
    end: usize,
}

impl<'a> XdpPkt<'a> {
    #[inline(always)]
    pub fn new(ctx: &'a XdpContext) -> Self {
        Self {
            ctx,
            data: ctx.data(),
            end: ctx.data_end(),
        }
    }

    /// A pointer to a `T` at `off`, checked against the end of the frame as
    /// the verifier demands before every direct access.
    #[inline(always)]
    fn ptr<T>(&self, off: usize) -> Option<*mut T> {
        // Offsets are constants once inlined; the bound keeps the verifier
        // happy should the compiler ever turn one into a runtime value.
        if off > MAX_OFF {
            return None;
        }
        let start = self.data + off;
        if start + size_of::<T>() > self.end {
            return None;
        }
        Some(start as *mut T)
    }

    #[inline(always)]
    fn fix_l4(&self, l4: L4Csum, sum_of: impl FnOnce(u16) -> u16) -> Option<()> {
        if l4.off == 0 {
            return Some(());
        }
        let p = self.ptr::<u16>(l4.off)?;
        // SAFETY: bounds-checked above; frames need not be aligned.
        let cur = unsafe { p.read_unaligned() };
        if l4.udp && cur == 0 {
            return Some(());
        }
        let mut next = sum_of(cur);
        if l4.udp && next == 0 {
            next = 0xffff;
        }
        // SAFETY: as above.
        unsafe { p.write_unaligned(next) };
        Some(())
    }
}

impl Pkt for XdpPkt<'_> {
    #[inline(always)]
    fn load<T: Copy>(&self, off: usize) -> Option<T> {
        let p = self.ptr::<T>(off)?;
        // SAFETY: bounds-checked in `ptr`.
        Some(unsafe { p.read_unaligned() })
    }

    #[inline(always)]
    fn set_word(
        &mut self,
        off: usize,
        old: u32,
        new: u32,
        ip_csum: usize,
        l4: L4Csum,
    ) -> Option<()> {
        let word = self.ptr::<u32>(off)?;
        if ip_csum != 0 {
            let p = self.ptr::<u16>(ip_csum)?;
            // SAFETY: bounds-checked in `ptr`.
            unsafe { p.write_unaligned(csum_replace4(p.read_unaligned(), old, new)) };
        }
        self.fix_l4(l4, |c| csum_replace4(c, old, new))?;
        // SAFETY: bounds-checked in `ptr`.
        unsafe { word.write_unaligned(new) };
        Some(())
    }

    #[inline(always)]
    fn set_port(&mut self, off: usize, old: u16, new: u16, l4: L4Csum) -> Option<()> {
        let port = self.ptr::<u16>(off)?;
        self.fix_l4(l4, |c| csum_replace2(c, old, new))?;
        // SAFETY: bounds-checked in `ptr`.
        unsafe { port.write_unaligned(new) };
        Some(())
    }

    #[inline(always)]
    fn is_ethernet(&self, _ether_type: u16) -> bool {
        // XDP runs on Ethernet devices only (the agent refuses others).
        true
    }

    #[inline(always)]
    fn ifindex(&self) -> u32 {
        self.ctx.ingress_ifindex() as u32
    }

    #[inline(always)]
    fn raw(&self) -> *mut c_void {
        self.ctx.as_ptr()
    }

    #[inline(always)]
    fn redirect(&mut self, _fib: &bpf_fib_lookup) -> u32 {
        xdp_action::XDP_PASS
    }

    #[inline(always)]
    fn mark_for_tc(&mut self) -> bool {
        // Read through a volatile load, or the compiler folds the default in
        // and the loader's value never counts.
        // SAFETY: a plain static the loader may only set before the load.
        if unsafe { core::ptr::read_volatile(&raw const WEIR_XDP_META) } == 0 {
            return false;
        }
        // SAFETY: a valid xdp_md; the helper only moves data_meta.
        if unsafe { bpf_xdp_adjust_meta(self.ctx.ctx, -4) } != 0 {
            return false;
        }
        // The helper invalidates every packet pointer.
        self.data = self.ctx.data();
        self.end = self.ctx.data_end();
        let meta = self.ctx.metadata();
        if meta + 4 > self.data {
            return false;
        }
        // SAFETY: bounds-checked against the start of the packet data.
        unsafe { (meta as *mut u32).write_unaligned(XDP_MARK) };
        true
    }

    #[inline(always)]
    fn marked_by_xdp(&self) -> bool {
        false
    }
}

// The ones'-complement sum does not depend on byte order as long as every
// operand is taken in the same order, so fields are used exactly as loaded
// from the frame (network order in memory) with no swapping.

#[inline(always)]
fn fold(mut s: u32) -> u16 {
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s as u16
}

/// RFC 1624 eqn. 3, HC' = ~(~HC + ~m + m'), for a 32-bit field.
#[inline(always)]
fn csum_replace4(csum: u16, old: u32, new: u32) -> u16 {
    let s = u32::from(!csum) + (!old & 0xffff) + (!old >> 16) + (new & 0xffff) + (new >> 16);
    !fold(s)
}

/// RFC 1624 eqn. 3 for a 16-bit field.
#[inline(always)]
fn csum_replace2(csum: u16, old: u16, new: u16) -> u16 {
    let s = u32::from(!csum) + u32::from(!old) + u32::from(new);
    !fold(s)
}
