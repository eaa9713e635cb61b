//! `weir_xdp`: the forward direction of external frontends (NodePort,
//! externalIPs, load-balancer IPs) at the driver, before an skb exists.
//!
//! It runs the same flow logic as TC (`packet::flow`) but only for flows of
//! external frontends; replies, ClusterIP traffic and anything it cannot
//! finish (e.g. no route for SNAT) continue untouched to `weir_tc_ingress`.
use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};

use crate::packet::{self, ctx::XdpPkt, flow::Verdict};

#[xdp]
pub fn weir_xdp(ctx: XdpContext) -> u32 {
    let mut pkt = XdpPkt::new(&ctx);
    match packet::run(&mut pkt, true) {
        Verdict::Drop => xdp_action::XDP_DROP,
        Verdict::Pass => xdp_action::XDP_PASS,
        Verdict::Redirect(action) => action,
    }
}
