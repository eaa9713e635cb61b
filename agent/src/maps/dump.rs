//! A stable text rendering of map contents, for golden tests and debugging.
use std::{
    fmt::Write as _,
    net::{IpAddr, SocketAddr},
};

use weir_abi::{Addr, BACKEND_STATE_ACTIVE, BACKEND_STATE_DRAINING, BACKEND_STATE_TERMINATING};

use super::Snapshot;
use crate::model::Protocol;

/// An entry's backend ids, without the zeros that end them.
fn ids(ids: &[u32]) -> String {
    let end = ids.iter().rposition(|&id| id != 0).map_or(0, |i| i + 1);
    let named: Vec<String> = ids[..end].iter().map(u32::to_string).collect();
    named.join(",")
}

pub fn render(s: &Snapshot) -> String {
    let mut out = String::new();
    for (k, v) in &s.services {
        let mut fe = frontend(k.addr, k.port, k.proto);
        // Only for the other scopes, so dumps without eTP=Local stay as they
        // were.
        match k.scope {
            weir_abi::SCOPE_ALL => {}
            weir_abi::SCOPE_EXTERNAL => fe.push_str(" scope=external"),
            other => {
                let _ = write!(fe, " scope={other}");
            }
        }
        if k.slot == 0 {
            let _ = write!(
                out,
                "svc     {fe} slot=0 count={} qcount={} revnat={}",
                v.count, v.qcount, v.rev_nat_id
            );
            // Only when set, so dumps of ClusterIP frontends stay as they were.
            if v.flags != 0 {
                let _ = write!(out, " flags={}", flag_names(v.flags));
            }
            if v.affinity_timeout != 0 {
                let _ = write!(out, " affinity={}s", v.affinity_timeout);
            }
            if v.table_size != 0 {
                let _ = write!(out, " table={}", v.table_size);
            }
            if v.ids != [0; weir_abi::SVC_IDS] {
                let _ = write!(out, " backends={}", ids(&v.ids));
            }
            out.push('\n');
        } else {
            let _ = writeln!(
                out,
                "svc     {fe} slot={} backends={} revnat={}",
                k.slot,
                ids(&v.ids),
                v.rev_nat_id
            );
        }
    }
    for (id, b) in &s.backends {
        let state = match b.state {
            BACKEND_STATE_ACTIVE => "active".to_owned(),
            BACKEND_STATE_TERMINATING => "terminating".to_owned(),
            // In no slot: only its tracked flows reach it. The owner is
            // shown because no slot line leads to it.
            BACKEND_STATE_DRAINING => format!("draining revnat={}", b.rev_nat_id),
            other => format!("state={other}"),
        };
        let _ = writeln!(
            out,
            "backend {id} {} {state}",
            frontend(b.addr, b.port, b.proto)
        );
    }
    for r in &s.src_ranges {
        let range = r
            .cidr()
            .map_or_else(|| format!("?/{}", r.prefix_len), |c| c.to_string());
        let _ = writeln!(out, "srcrng  revnat={} {range}", r.rev_nat_id());
    }
    // A table as the positions each backend holds: the whole table would
    // be thousands of lines, and its shares are what a reader checks. The
    // map pads the last chunk with 0; a 0 before the end is a missing chunk.
    for (id, t) in &s.maglev {
        let t = &t[..t.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)];
        let mut shares = std::collections::BTreeMap::<u32, usize>::new();
        for b in t.iter() {
            *shares.entry(*b).or_default() += 1;
        }
        let shares: Vec<String> = shares.iter().map(|(b, n)| format!("{b}:{n}")).collect();
        let _ = writeln!(
            out,
            "maglev  revnat={id} size={} {}",
            t.len(),
            shares.join(" ")
        );
    }
    for (id, r) in &s.revnat {
        let _ = writeln!(
            out,
            "revnat  {id} {}",
            SocketAddr::new(IpAddr::from(r.addr), u16::from_be(r.port))
        );
    }
    out
}

fn frontend(addr: Addr, port: u16, proto: u8) -> String {
    let proto = Protocol::from_ip_proto(proto).map_or_else(|| proto.to_string(), |p| p.to_string());
    format!(
        "{}/{proto}",
        SocketAddr::new(IpAddr::from(addr), u16::from_be(port))
    )
}

fn flag_names(flags: u16) -> String {
    let names = [
        (weir_abi::SVC_F_EXTERNAL, "external"),
        (weir_abi::SVC_F_NODEPORT, "nodeport"),
        (weir_abi::SVC_F_LOCAL, "local"),
        (weir_abi::SVC_F_AFFINITY, "affinity"),
        (weir_abi::SVC_F_SRC_RANGES, "src-ranges"),
        (weir_abi::SVC_F_MAGLEV, "maglev"),
    ];
    let mut out: Vec<String> = names
        .iter()
        .filter(|(bit, _)| flags & bit != 0)
        .map(|(_, n)| (*n).to_owned())
        .collect();
    let known = names.iter().fold(0, |a, (bit, _)| a | bit);
    if flags & !known != 0 {
        out.push(format!("{:#x}", flags & !known));
    }
    out.join("|")
}
