//! `weir-agent inspect conntrack`: every flow the packet programs track.
use std::{
    fmt::Write as _,
    net::{IpAddr, SocketAddr},
};

use serde::Serialize;
use weir_abi::{
    CT_DIR_FORWARD, CT_F_CLUSTERIP, CT_F_SNAT, CT_F_XDP, CT_TCP_CLOSING, CT_TCP_ESTABLISHED,
    CT_TCP_SYN_SENT, CtKey, CtValue,
};

use crate::model::Protocol;

/// One conntrack entry, as an operator reads it.
#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct CtView {
    pub protocol: String,
    /// `forward` (client → frontend) or `reply` (backend → client or SNAT address).
    pub direction: &'static str,
    /// The packet tuple the entry matches.
    pub src: SocketAddr,
    pub dst: SocketAddr,
    /// What the tuple is rewritten to.
    pub nat_src: SocketAddr,
    pub nat_dst: SocketAddr,
    pub backend_id: u32,
    pub rev_nat_id: u32,
    /// TCP only: `syn-sent`, `established` or `closing`.
    pub tcp_state: Option<&'static str>,
    /// Seconds until the collector may remove it; `None` once expired.
    pub remaining_seconds: Option<u32>,
    pub flags: Vec<&'static str>,
    pub packets: u64,
    pub bytes: u64,
}

/// Every entry, sorted by protocol, then flow, forward before reply.
pub fn conntrack(entries: &[(CtKey, CtValue)], now: u32) -> Vec<CtView> {
    let mut out: Vec<CtView> = entries.iter().map(|(k, v)| view(k, v, now)).collect();
    out.sort_by(|a, b| {
        (&a.protocol, a.src, a.dst, a.direction).cmp(&(&b.protocol, b.src, b.dst, b.direction))
    });
    out
}

fn view(k: &CtKey, v: &CtValue, now: u32) -> CtView {
    let sa = |addr, port: u16| SocketAddr::new(IpAddr::from(addr), u16::from_be(port));
    let mut flags = Vec::new();
    for (bit, name) in [
        (CT_F_SNAT, "snat"),
        (CT_F_XDP, "xdp"),
        (CT_F_CLUSTERIP, "clusterip"),
    ] {
        if v.flags & bit != 0 {
            flags.push(name);
        }
    }
    CtView {
        protocol: Protocol::from_ip_proto(k.proto)
            .map_or_else(|| k.proto.to_string(), |p| p.as_str().to_owned()),
        direction: if k.dir == CT_DIR_FORWARD {
            "forward"
        } else {
            "reply"
        },
        src: sa(k.saddr, k.sport),
        dst: sa(k.daddr, k.dport),
        nat_src: sa(v.nat_saddr, v.nat_sport),
        nat_dst: sa(v.nat_daddr, v.nat_dport),
        backend_id: v.backend_id,
        rev_nat_id: v.rev_nat_id,
        tcp_state: (k.proto == weir_abi::PROTO_TCP).then_some(match v.tcp_state {
            CT_TCP_SYN_SENT => "syn-sent",
            CT_TCP_ESTABLISHED => "established",
            CT_TCP_CLOSING => "closing",
            _ => "none",
        }),
        // The collector deletes once `expires < now`: an entry at `expires ==
        // now` still has this second.
        remaining_seconds: (v.expires >= now).then(|| v.expires - now),
        flags,
        packets: v.packets,
        bytes: v.bytes,
    }
}

pub fn render_table(views: &[CtView]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<5} {:<7} {:<47} {:<47} {:>7} {:>6} {:<11} {:>8} {:<14} {:>8} {:>10}",
        "PROTO",
        "DIR",
        "TUPLE (SRC → DST)",
        "REWRITTEN TO (SRC → DST)",
        "BACKEND",
        "REVNAT",
        "STATE",
        "EXPIRES",
        "FLAGS",
        "PACKETS",
        "BYTES"
    );
    for v in views {
        let expires = v
            .remaining_seconds
            .map_or_else(|| "expired".to_owned(), |s| format!("{s}s"));
        let flags = if v.flags.is_empty() {
            "-".to_owned()
        } else {
            v.flags.join(",")
        };
        let _ = writeln!(
            out,
            "{:<5} {:<7} {:<47} {:<47} {:>7} {:>6} {:<11} {:>8} {:<14} {:>8} {:>10}",
            v.protocol,
            v.direction,
            format!("{} → {}", v.src, v.dst),
            format!("{} → {}", v.nat_src, v.nat_dst),
            v.backend_id,
            v.rev_nat_id,
            v.tcp_state.unwrap_or("-"),
            expires,
            flags,
            v.packets,
            v.bytes
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use weir_abi::{Addr, CT_DIR_REPLY, PROTO_TCP, PROTO_UDP};

    use super::*;

    fn v4(a: [u8; 4]) -> Addr {
        Addr::from_v4(u32::from_ne_bytes(a))
    }

    #[test]
    fn shows_tuple_nat_state_and_lifetime() {
        let k = CtKey {
            saddr: v4([10, 0, 0, 1]),
            daddr: v4([192, 168, 50, 1]),
            sport: 40000u16.to_be(),
            dport: 30080u16.to_be(),
            proto: PROTO_TCP,
            dir: CT_DIR_FORWARD,
            ..CtKey::default()
        };
        let v = CtValue {
            nat_daddr: v4([10, 244, 1, 5]),
            nat_saddr: v4([192, 168, 50, 1]),
            nat_dport: 8080u16.to_be(),
            nat_sport: 40000u16.to_be(),
            backend_id: 7,
            rev_nat_id: 3,
            expires: 110,
            tcp_state: CT_TCP_ESTABLISHED,
            flags: CT_F_SNAT | CT_F_XDP,
            packets: 4,
            bytes: 300,
            ..CtValue::default()
        };
        let reply = (
            CtKey {
                dir: CT_DIR_REPLY,
                proto: PROTO_UDP,
                ..k
            },
            CtValue { expires: 90, ..v },
        );
        let views = conntrack(&[(k, v), reply], 100);
        assert_eq!(views[0].protocol, "TCP");
        assert_eq!(views[0].src, "10.0.0.1:40000".parse().unwrap());
        assert_eq!(views[0].nat_dst, "10.244.1.5:8080".parse().unwrap());
        assert_eq!(views[0].tcp_state, Some("established"));
        assert_eq!(views[0].remaining_seconds, Some(10));
        assert_eq!(views[0].flags, vec!["snat", "xdp"]);
        assert_eq!(views[1].direction, "reply");
        assert_eq!(views[1].tcp_state, None);
        assert_eq!(views[1].remaining_seconds, None);
        let table = render_table(&views);
        assert!(table.contains("expired"), "{table}");
        assert!(
            table.contains("10.0.0.1:40000 → 192.168.50.1:30080"),
            "{table}"
        );
        let json = serde_json::to_string(&views).unwrap();
        assert!(json.contains("\"10.244.1.5:8080\""), "{json}");
    }

    #[test]
    fn v6_tuples_render_bracketed() {
        let a: std::net::Ipv6Addr = "fd00::1".parse().unwrap();
        let k = CtKey {
            saddr: Addr::from(IpAddr::from(a)),
            sport: 1u16.to_be(),
            proto: PROTO_UDP,
            ..CtKey::default()
        };
        let views = conntrack(&[(k, CtValue::default())], 0);
        assert_eq!(views[0].src.to_string(), "[fd00::1]:1");
    }
}
