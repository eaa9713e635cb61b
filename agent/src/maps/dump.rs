//! A stable text rendering of map contents, for golden tests and debugging.
use std::{fmt::Write as _, net::Ipv4Addr};

use weir_abi::BACKEND_STATE_TERMINATING;

use super::Snapshot;
use crate::model::Protocol;

pub fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    for (k, v) in &s.services {
        let fe = frontend(k.addr, k.port, k.proto);
        if k.slot == 0 {
            let _ = writeln!(
                out,
                "svc     {fe} slot=0 count={} qcount={} revnat={}",
                v.count, v.qcount, v.rev_nat_id
            );
        } else {
            let _ = writeln!(
                out,
                "svc     {fe} slot={} backend={} revnat={}",
                k.slot, v.backend_id, v.rev_nat_id
            );
        }
    }
    for (id, b) in &s.backends {
        let state = if b.state == BACKEND_STATE_TERMINATING {
            "terminating"
        } else {
            "active"
        };
        let _ = writeln!(
            out,
            "backend {id} {} {state}",
            frontend(b.addr, b.port, b.proto)
        );
    }
    for (id, r) in &s.revnat {
        let _ = writeln!(
            out,
            "revnat  {id} {}:{}",
            Ipv4Addr::from(u32::from_be(r.addr)),
            u16::from_be(r.port)
        );
    }
    out
}

fn frontend(addr: u32, port: u16, proto: u8) -> String {
    let proto = Protocol::from_ip_proto(proto).map_or_else(|| proto.to_string(), |p| p.to_string());
    format!(
        "{}:{}/{proto}",
        Ipv4Addr::from(u32::from_be(addr)),
        u16::from_be(port)
    )
}
