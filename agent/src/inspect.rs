//! `weir-agent inspect`: what the kernel is doing, read from the pinned maps and
//! not from any agent's memory, so it works while the agent is down.
use std::net::Ipv4Addr;

use serde::Serialize;
use weir_abi::BACKEND_STATE_TERMINATING;

use crate::{maps::Snapshot, model::Protocol};

#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct ServiceView {
    pub vip: Ipv4Addr,
    pub port: u16,
    pub protocol: String,
    pub backends: Vec<BackendView>,
}

#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct BackendView {
    pub ip: Ipv4Addr,
    pub port: u16,
    pub state: &'static str,
}

/// Every frontend with its backends in slot order. Slots whose backend is
/// missing show up as `missing`, which only a bug or a race can produce.
pub fn services(s: &Snapshot) -> Vec<ServiceView> {
    let mut out = Vec::new();
    for (k, master) in s.services.iter().filter(|(k, _)| k.slot == 0) {
        let mut backends = Vec::new();
        let used = u32::from(master.count) + u32::from(master.qcount);
        for slot in 1..=used {
            let sk = weir_abi::Service4Key {
                slot: u16::try_from(slot).unwrap_or(u16::MAX),
                ..*k
            };
            let b = s
                .services
                .get(&sk)
                .and_then(|v| s.backends.get(&v.backend_id));
            backends.push(match b {
                Some(b) => BackendView {
                    ip: Ipv4Addr::from(u32::from_be(b.addr)),
                    port: u16::from_be(b.port),
                    state: if b.state == BACKEND_STATE_TERMINATING {
                        "terminating"
                    } else {
                        "active"
                    },
                },
                None => BackendView {
                    ip: Ipv4Addr::UNSPECIFIED,
                    port: 0,
                    state: "missing",
                },
            });
        }
        out.push(ServiceView {
            vip: Ipv4Addr::from(u32::from_be(k.addr)),
            port: u16::from_be(k.port),
            protocol: Protocol::from_ip_proto(k.proto)
                .map_or_else(|| k.proto.to_string(), |p| p.as_str().to_owned()),
            backends,
        });
    }
    out.sort_by(|a, b| (a.vip, a.port, &a.protocol).cmp(&(b.vip, b.port, &b.protocol)));
    out
}

pub fn render_table(views: &[ServiceView]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "{:<24} BACKENDS", "FRONTEND");
    for v in views {
        let fe = format!("{}:{}/{}", v.vip, v.port, v.protocol);
        if v.backends.is_empty() {
            let _ = writeln!(out, "{fe:<24} (none: connections are refused)");
        }
        for (i, b) in v.backends.iter().enumerate() {
            let lead = if i == 0 { fe.as_str() } else { "" };
            let _ = writeln!(out, "{lead:<24} {}:{} ({})", b.ip, b.port, b.state);
        }
    }
    out
}
