//! `weir-agent inspect`: what the kernel is doing, read from the pinned maps and
//! not from any agent's memory, so it works while the agent is down.
use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr},
    path::Path,
};

use aya::maps::{Map, MapData, MapError, PerCpuArray};
use serde::Serialize;
use weir_abi::{
    BACKEND_STATE_ACTIVE, BACKEND_STATE_DRAINING, BACKEND_STATE_TERMINATING, SCOPE_EXTERNAL,
    SVC_F_AFFINITY, SVC_F_EXTERNAL, SVC_F_LOCAL, SVC_F_NODEPORT, SVC_F_SRC_RANGES, StatValue,
};

use crate::{maps::Snapshot, model::Protocol};

pub mod conntrack;
pub mod stats;

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("cannot read pinned map {map}")]
    Map {
        map: &'static str,
        #[source]
        source: MapError,
    },
}

#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct ServiceView {
    pub vip: IpAddr,
    pub port: u16,
    pub protocol: String,
    /// `all`: the frontend as in-cluster clients (and, without `local`,
    /// everyone) see it; `external`: the local-endpoints-only view the
    /// packet programs use for outside traffic to an
    /// `externalTrafficPolicy: Local` frontend (`weir_abi::SCOPE_*`).
    pub scope: &'static str,
    /// `external`, `nodeport`, `local`, `affinity`, `source-ranges`
    /// (the master entry's `SVC_F_*`).
    pub flags: Vec<&'static str>,
    /// `sessionAffinity: ClientIP` timeout, seconds; 0 without affinity.
    pub affinity_timeout: u32,
    pub backends: Vec<BackendView>,
}

/// Names of the `SVC_F_*` bits set in `flags`.
pub fn flag_names(flags: u16) -> Vec<&'static str> {
    [
        (SVC_F_EXTERNAL, "external"),
        (SVC_F_NODEPORT, "nodeport"),
        (SVC_F_LOCAL, "local"),
        (SVC_F_AFFINITY, "affinity"),
        (SVC_F_SRC_RANGES, "source-ranges"),
    ]
    .into_iter()
    .filter(|(bit, _)| flags & bit != 0)
    .map(|(_, name)| name)
    .collect()
}

/// Every conntrack entry, read from the pins in `maps_dir`.
pub fn read_conntrack(
    maps_dir: &Path,
) -> Result<Vec<(weir_abi::CtKey, weir_abi::CtValue)>, crate::ct_gc::CtGcError> {
    crate::ct_gc::CtGc::open(maps_dir)?.entries()
}

/// The per-CPU counters of the pinned stats map, summed.
pub fn read_stats(maps_dir: &Path) -> Result<Vec<stats::StatView>, InspectError> {
    let map = weir_abi::MAP_STATS;
    let err = |source| InspectError::Map { map, source };
    let data = MapData::from_pin(maps_dir.join(map)).map_err(err)?;
    let array: PerCpuArray<_, StatValue> =
        PerCpuArray::try_from(Map::from_map_data(data).map_err(err)?).map_err(err)?;
    Ok(stats::stats(|i| {
        array
            .get(&i, 0)
            .map(|v| v.iter().copied().collect())
            .unwrap_or_default()
    }))
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BackendView {
    pub ip: IpAddr,
    pub port: u16,
    pub state: &'static str,
}

/// `BACKEND_STATE_*` as `inspect` shows it.
const fn state_name(state: u8) -> &'static str {
    match state {
        BACKEND_STATE_ACTIVE => "active",
        BACKEND_STATE_TERMINATING => "terminating",
        BACKEND_STATE_DRAINING => "draining",
        _ => "unknown",
    }
}

/// Every frontend with its backends in slot order, then its draining ones. Slots whose backend is
/// missing show up as `missing`, which only a bug or a race can produce.
pub fn services(s: &Snapshot) -> Vec<ServiceView> {
    // Draining backends (terminating, no longer serving) are in no slot:
    // they only keep their tracked flows, and their rev-NAT id says whose
    // they are. Indexed once: a scan per frontend is quadratic at scale.
    let mut draining: HashMap<u32, Vec<BackendView>> = HashMap::new();
    for b in s
        .backends
        .values()
        .filter(|b| b.state == BACKEND_STATE_DRAINING)
    {
        draining.entry(b.rev_nat_id).or_default().push(BackendView {
            ip: IpAddr::from(b.addr),
            port: u16::from_be(b.port),
            state: state_name(b.state),
        });
    }
    let mut out = Vec::new();
    for (k, master) in s.services.iter().filter(|(k, _)| k.slot == 0) {
        let mut backends = Vec::new();
        let used = u32::from(master.count) + u32::from(master.qcount);
        for slot in 1..=used {
            let sk = weir_abi::ServiceKey {
                slot: u16::try_from(slot).unwrap_or(u16::MAX),
                ..*k
            };
            let b = s
                .services
                .get(&sk)
                .and_then(|v| s.backends.get(&v.backend_id));
            backends.push(match b {
                Some(b) => BackendView {
                    ip: IpAddr::from(b.addr),
                    port: u16::from_be(b.port),
                    state: state_name(b.state),
                },
                None => BackendView {
                    ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                    port: 0,
                    state: "missing",
                },
            });
        }
        // Listed after the slots.
        let mut draining = draining
            .get(&master.rev_nat_id)
            .cloned()
            .unwrap_or_default();
        draining.sort_by_key(|b| (b.ip, b.port));
        backends.extend(draining);
        out.push(ServiceView {
            vip: IpAddr::from(k.addr),
            port: u16::from_be(k.port),
            protocol: Protocol::from_ip_proto(k.proto)
                .map_or_else(|| k.proto.to_string(), |p| p.as_str().to_owned()),
            scope: if k.scope == SCOPE_EXTERNAL {
                "external"
            } else {
                "all"
            },
            flags: flag_names(master.flags),
            affinity_timeout: master.affinity_timeout,
            backends,
        });
    }
    out.sort_by(|a, b| {
        (a.vip, a.port, &a.protocol, a.scope).cmp(&(b.vip, b.port, &b.protocol, b.scope))
    });
    out
}

pub fn render_table(views: &[ServiceView]) -> String {
    use std::fmt::Write as _;
    let rows: Vec<(String, String, &ServiceView)> = views
        .iter()
        .map(|v| {
            let fe = match v.vip {
                IpAddr::V4(_) => format!("{}:{}/{}", v.vip, v.port, v.protocol),
                IpAddr::V6(_) => format!("[{}]:{}/{}", v.vip, v.port, v.protocol),
            };
            let mut flags = v.flags.join(",");
            if v.affinity_timeout > 0 {
                flags.push_str(&format!("({}s)", v.affinity_timeout));
            }
            if v.scope != "all" {
                flags.push_str(&format!(" scope={}", v.scope));
            }
            if flags.is_empty() {
                flags.push('-');
            }
            (fe, flags, v)
        })
        .collect();
    // Columns as wide as their widest cell, so IPv6 frontends and long flag
    // lists never push the backends out of line.
    let fw = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(8);
    let gw = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max(5);
    let mut out = String::new();
    let _ = writeln!(out, "{:<fw$} {:<gw$} BACKENDS", "FRONTEND", "FLAGS");
    for (fe, flags, v) in &rows {
        let lead = format!("{fe:<fw$} {flags:<gw$}");
        // Draining backends are listed but take no new connection.
        if !v.backends.iter().any(|b| b.state != "draining") {
            let _ = writeln!(out, "{lead} (none serving: connections are refused)");
        }
        for (i, b) in v.backends.iter().enumerate() {
            let lead = if i == 0 && v.backends.iter().any(|b| b.state != "draining") {
                lead.as_str()
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "{lead:<w$} {} ({})",
                std::net::SocketAddr::new(b.ip, b.port),
                b.state,
                w = fw + 1 + gw
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use weir_abi::{Addr, Backend, PROTO_TCP, ServiceKey, ServiceValue};

    use super::*;

    #[test]
    fn services_show_flags_and_v6_frontends() {
        let mut s = Snapshot::default();
        let fe = ServiceKey {
            addr: Addr::from("fd00::10".parse::<IpAddr>().unwrap()),
            port: 30080u16.to_be(),
            proto: PROTO_TCP,
            ..ServiceKey::default()
        };
        s.services.insert(
            fe,
            ServiceValue {
                count: 1,
                rev_nat_id: 1,
                flags: SVC_F_EXTERNAL | SVC_F_NODEPORT | SVC_F_LOCAL | SVC_F_AFFINITY,
                affinity_timeout: 300,
                ..ServiceValue::default()
            },
        );
        s.services.insert(
            ServiceKey { slot: 1, ..fe },
            ServiceValue {
                backend_id: 9,
                rev_nat_id: 1,
                ..ServiceValue::default()
            },
        );
        s.backends.insert(
            9,
            Backend {
                addr: Addr::from("fd00::99".parse::<IpAddr>().unwrap()),
                port: 8080u16.to_be(),
                proto: PROTO_TCP,
                rev_nat_id: 1,
                ..Backend::default()
            },
        );
        s.backends.insert(
            10,
            Backend {
                addr: Addr::from("fd00::98".parse::<IpAddr>().unwrap()),
                port: 8080u16.to_be(),
                proto: PROTO_TCP,
                state: weir_abi::BACKEND_STATE_DRAINING,
                rev_nat_id: 1,
            },
        );
        // Another frontend's draining backend is not listed here.
        s.backends.insert(
            11,
            Backend {
                state: weir_abi::BACKEND_STATE_DRAINING,
                rev_nat_id: 2,
                ..Backend::default()
            },
        );
        // The external-scope (local endpoints only) view of the same frontend.
        let ext = ServiceKey {
            scope: SCOPE_EXTERNAL,
            ..fe
        };
        s.services.insert(
            ext,
            ServiceValue {
                rev_nat_id: 3,
                flags: SVC_F_EXTERNAL | SVC_F_NODEPORT | SVC_F_LOCAL,
                ..ServiceValue::default()
            },
        );
        let views = services(&s);
        assert_eq!(views.len(), 2);
        assert_eq!((views[0].scope, views[1].scope), ("all", "external"));
        let json = serde_json::to_value(&views).unwrap();
        assert_eq!(json[1]["scope"], "external");
        assert!(render_table(&views).contains("scope=external"));
        assert_eq!(views[0].backends.len(), 2);
        assert_eq!(views[0].backends[1].state, "draining");
        assert_eq!(
            views[0].flags,
            vec!["external", "nodeport", "local", "affinity"]
        );
        assert_eq!(views[0].affinity_timeout, 300);
        assert_eq!(
            views[0].backends[0].ip,
            "fd00::99".parse::<IpAddr>().unwrap()
        );
        let table = render_table(&views);
        assert!(table.contains("[fd00::10]:30080/TCP"), "{table}");
        assert!(
            table.contains("external,nodeport,local,affinity(300s)"),
            "{table}"
        );
        assert!(table.contains("[fd00::99]:8080 (active)"), "{table}");
        assert_eq!(flag_names(SVC_F_SRC_RANGES), vec!["source-ranges"]);
    }
}
