//! `weir-agent inspect`: what the kernel is doing, read from the pinned maps and
//! not from any agent's memory, so it works while the agent is down.
use std::{
    net::{IpAddr, Ipv4Addr},
    path::Path,
};

use aya::maps::{Map, MapData, MapError, PerCpuArray};
use serde::Serialize;
use weir_abi::{
    BACKEND_STATE_ACTIVE, BACKEND_STATE_DRAINING, BACKEND_STATE_TERMINATING, Backend,
    SCOPE_EXTERNAL, SVC_F_AFFINITY, SVC_F_EXTERNAL, SVC_F_LOCAL, SVC_F_NODEPORT, SVC_F_SRC_RANGES,
    ServiceKey, ServiceValue, StatValue, SvcLabel,
};

use crate::{
    hash::HashMap,
    maps::{self, array::is_zero, labels::LabelView, pinned::PinnedMaps},
    model::Protocol,
    parallel,
};

pub mod conntrack;
pub mod json;
pub mod stats;
pub mod status;

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
    /// The Service port it serves and its type (`namespace`, `name`,
    /// `port_name`, `type`), from the labels map; absent for a frontend
    /// whose label is missing (written by an agent that had none).
    #[serde(flatten)]
    pub service: Option<LabelView>,
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

impl BackendView {
    const MISSING: Self = Self {
        ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        port: 0,
        state: "missing",
    };

    fn of(b: &Backend) -> Self {
        Self {
            ip: IpAddr::from(b.addr),
            port: u16::from_be(b.port),
            state: state_name(b.state),
        }
    }
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

/// Every frontend in the pinned maps with its backends in slot order, then
/// its draining ones. Slots whose backend is missing show up as `missing`,
/// which only a bug or a race can produce.
///
/// At 100k Services the services map holds a million entries, and the
/// kernel's walk of it takes half a second of CPU: it is read and ordered on
/// one thread, while the other copies the backends array out (a few
/// milliseconds), indexes its draining backends and reads the labels.
pub fn read_services(maps: &PinnedMaps) -> Result<Vec<ServiceView>, maps::MapError> {
    let (entries, backends) = parallel::both(
        || maps.service_entries().map(sort_entries),
        || {
            let mut index = index_backends(maps.backend_table()?);
            index.labels = maps.label_entries()?.into_iter().collect();
            Ok::<_, maps::MapError>(index)
        },
    );
    Ok(views(&entries?, &backends?))
}

/// One sort by the key's integers puts each frontend's master before its
/// slots, which a walk then takes in turn; only the frontends are sorted
/// into the order shown ([`FrontendOrder`]). At 100k Services a lookup per
/// slot, or a sort of every entry in that order, costs as much as the rest.
fn sort_entries(mut entries: Vec<(ServiceKey, ServiceValue)>) -> Vec<(ServiceKey, ServiceValue)> {
    entries.sort_unstable_by_key(|(k, _)| raw_order(k));
    entries
}

/// Backends by id, and the draining ones by rev-NAT id.
struct BackendIndex {
    /// The backends array as read: indexed by id, zeros for a free id.
    by_id: Vec<Backend>,
    /// Draining backends (terminating, no longer serving) are in no slot:
    /// they only keep their tracked flows, and their rev-NAT id says whose
    /// they are. Indexed once: a scan per frontend is quadratic at scale.
    draining: HashMap<u32, Vec<BackendView>>,
    /// Labels by rev-NAT id, decoded per frontend shown.
    labels: HashMap<u32, SvcLabel>,
}

/// The frontends among `entries` (from [`sort_entries`]) in the order
/// shown, with their backends; built in two halves, split between
/// frontends.
fn views(entries: &[(ServiceKey, ServiceValue)], backends: &BackendIndex) -> Vec<ServiceView> {
    let mut mid = entries.len() / 2;
    while mid > 0
        && mid < entries.len()
        && frontend(&entries[mid].0) == frontend(&entries[mid - 1].0)
    {
        mid += 1;
    }
    let (first, second) = entries.split_at(mid);
    let (mut out, rest) = parallel::both(
        || frontends(first, backends),
        || frontends(second, backends),
    );
    out.extend(rest);
    out.sort_by_cached_key(FrontendOrder::of);
    out
}

/// The frontends among `entries` (from [`sort_entries`]), with their
/// backends.
fn frontends(entries: &[(ServiceKey, ServiceValue)], index: &BackendIndex) -> Vec<ServiceView> {
    let mut out = Vec::new();
    for group in entries.chunk_by(|a, b| frontend(&a.0) == frontend(&b.0)) {
        // A frontend is its master entry; slots without one are not shown.
        let Some(&(k, master)) = group.first().filter(|(k, _)| k.slot == 0) else {
            continue;
        };
        let used = usize::from(master.count) + usize::from(master.qcount);
        let mut backends: Vec<BackendView> = (0..used)
            .map(|position| {
                let (slot, at) = weir_abi::position_slot(position)?;
                let i = group.binary_search_by_key(&slot, |(k, _)| k.slot).ok()?;
                index.backend(group[i].1.ids[at])
            })
            .map(|b| b.map_or(BackendView::MISSING, BackendView::of))
            .collect();
        // Listed after the slots.
        let mut draining = index
            .draining
            .get(&master.rev_nat_id)
            .cloned()
            .unwrap_or_default();
        draining.sort_by_key(|b| (b.ip, b.port));
        backends.extend(draining);
        out.push(ServiceView {
            service: index
                .labels
                .get(&master.rev_nat_id)
                .and_then(LabelView::decode),
            vip: IpAddr::from(k.addr),
            port: u16::from_be(k.port),
            protocol: Protocol::from_ip_proto(k.proto)
                .map_or_else(|| k.proto.to_string(), |p| p.as_str().to_owned()),
            scope: scope_name(k.scope),
            flags: flag_names(master.flags),
            affinity_timeout: master.affinity_timeout,
            backends,
        });
    }
    out
}

/// A services-map key without its slot: the frontend it belongs to.
fn frontend(k: &ServiceKey) -> ServiceKey {
    ServiceKey { slot: 0, ..*k }
}

impl BackendIndex {
    fn backend(&self, id: u32) -> Option<&Backend> {
        self.by_id.get(id as usize).filter(|b| !is_zero(*b))
    }
}

fn index_backends(backends: Vec<Backend>) -> BackendIndex {
    let mut draining: HashMap<u32, Vec<BackendView>> = HashMap::default();
    for b in backends
        .iter()
        .filter(|b| b.state == BACKEND_STATE_DRAINING)
    {
        draining
            .entry(b.rev_nat_id)
            .or_default()
            .push(BackendView::of(b));
    }
    BackendIndex {
        by_id: backends,
        draining,
        labels: HashMap::default(),
    }
}

/// The order frontends are shown in: by address (IPv4 first), port,
/// protocol name and scope name.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct FrontendOrder {
    addr: IpAddr,
    port: u16,
    /// Protocols the agent never writes sort by number before the named ones.
    proto: (u8, u8),
    scope: &'static str,
}

impl FrontendOrder {
    fn of(v: &ServiceView) -> Self {
        let proto = match Protocol::from_k8s(&v.protocol) {
            None => (0, v.protocol.parse().unwrap_or(u8::MAX)),
            Some(Protocol::Sctp) => (1, 0),
            Some(Protocol::Tcp) => (2, 0),
            Some(Protocol::Udp) => (3, 0),
        };
        Self {
            addr: v.vip,
            port: v.port,
            proto,
            scope: v.scope,
        }
    }
}

/// A services-map key as two integers: the frontend, then the slot.
fn raw_order(k: &ServiceKey) -> (u128, u64) {
    let [a, b, c, d] = k.addr.0;
    let addr = u128::from(a) << 96 | u128::from(b) << 64 | u128::from(c) << 32 | u128::from(d);
    let rest = u64::from(k.port) << 32
        | u64::from(k.proto) << 24
        | u64::from(k.scope) << 16
        | u64::from(k.slot);
    (addr, rest)
}

const fn scope_name(scope: u8) -> &'static str {
    if scope == SCOPE_EXTERNAL {
        "external"
    } else {
        "all"
    }
}

pub fn render_table(views: &[ServiceView]) -> String {
    use std::fmt::Write as _;
    let rows: Vec<(String, String, String, &ServiceView)> = views
        .iter()
        .map(|v| {
            let service = v.service.as_ref().map_or_else(
                || "-".to_owned(),
                |l| format!("{} {}", l.service_port(), l.kind),
            );
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
            (service, fe, flags, v)
        })
        .collect();
    // Columns as wide as their widest cell, so IPv6 frontends and long flag
    // lists never push the backends out of line.
    let sw = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(7);
    let fw = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max(8);
    let gw = rows.iter().map(|r| r.2.len()).max().unwrap_or(0).max(5);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<sw$} {:<fw$} {:<gw$} BACKENDS",
        "SERVICE", "FRONTEND", "FLAGS"
    );
    for (service, fe, flags, v) in &rows {
        let lead = format!("{service:<sw$} {fe:<fw$} {flags:<gw$}");
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
                w = sw + 1 + fw + 1 + gw
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use weir_abi::{Addr, PROTO_SCTP, PROTO_TCP, PROTO_UDP, SVC_IDS};

    use super::*;
    use crate::maps::Snapshot;

    /// [`read_services`] of `s`.
    fn views(s: Snapshot) -> Vec<ServiceView> {
        labelled(s, HashMap::default())
    }

    /// [`read_services`] of `s` with a labels map holding `labels`.
    fn labelled(s: Snapshot, labels: HashMap<u32, SvcLabel>) -> Vec<ServiceView> {
        // The backends array as the kernel holds it: by id, zeros between.
        let len = s.backends.keys().max().map_or(0, |&m| m as usize + 1);
        let mut table = vec![Backend::default(); len];
        for (id, b) in s.backends {
            table[id as usize] = b;
        }
        let mut index = index_backends(table);
        index.labels = labels;
        super::views(
            &sort_entries(s.services.into_iter().rev().collect()),
            &index,
        )
    }

    #[test]
    fn frontends_show_their_service_port_and_type_and_unlabelled_ones_a_dash() {
        let mut s = Snapshot::default();
        for (last, rev_nat_id) in [(1, 1), (2, 2)] {
            s.services.insert(
                key(&format!("10.96.0.{last}"), 80, PROTO_TCP, 0),
                ServiceValue {
                    rev_nat_id,
                    ..ServiceValue::default()
                },
            );
        }
        let svc = crate::model::ServiceId::new("shop", "web");
        let labels = HashMap::from_iter([(
            2,
            crate::maps::labels::encode(&svc, "http", crate::model::FrontendKind::ExternalIp),
        )]);
        let views = labelled(s, labels);
        let table = render_table(&views);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("SERVICE "), "{table}");
        assert!(lines[1].starts_with("- "), "{table}");
        assert!(
            lines[2].starts_with("shop/web:http ExternalIP 10.96.0.2:80/TCP"),
            "{table}"
        );
        let json = serde_json::to_value(&views).unwrap();
        assert_eq!(json[0].get("namespace"), None);
        assert_eq!(
            (&json[1]["namespace"], &json[1]["name"]),
            (&"shop".into(), &"web".into())
        );
        assert_eq!(
            (&json[1]["port_name"], &json[1]["type"]),
            (&"http".into(), &"ExternalIP".into())
        );
    }

    fn key(addr: &str, port: u16, proto: u8, slot: u16) -> ServiceKey {
        ServiceKey {
            addr: Addr::from(addr.parse::<IpAddr>().unwrap()),
            port: port.to_be(),
            proto,
            slot,
            ..ServiceKey::default()
        }
    }

    #[test]
    fn frontends_in_address_port_protocol_order_with_slots_in_order() {
        let mut s = Snapshot::default();
        let frontends = [
            ("fd00::1", 53, PROTO_UDP),
            ("10.0.0.2", 53, PROTO_UDP),
            ("10.0.0.2", 53, PROTO_TCP),
            ("10.0.0.2", 53, PROTO_SCTP),
            ("10.0.0.10", 80, PROTO_TCP),
            ("10.0.0.2", 443, PROTO_TCP),
        ];
        // 13 backends each: 11 in the master, 2 in slot 1.
        for (i, (addr, port, proto)) in frontends.into_iter().enumerate() {
            let rev_nat_id = u32::try_from(i).unwrap() + 1;
            let ids: Vec<u32> = (0..13).map(|p| rev_nat_id * 100 + p).collect();
            let mut values = [0, 1].map(|_| ServiceValue {
                rev_nat_id,
                ..ServiceValue::default()
            });
            for (v, chunk) in values.iter_mut().zip(ids.chunks(SVC_IDS)) {
                v.ids[..chunk.len()].copy_from_slice(chunk);
            }
            values[0].count = 13;
            for (slot, v) in values.into_iter().enumerate() {
                s.services
                    .insert(key(addr, port, proto, u16::try_from(slot).unwrap()), v);
            }
            for id in ids {
                s.backends.insert(
                    id,
                    Backend {
                        addr: Addr::from(IpAddr::from([10, 1, (id / 100) as u8, (id % 100) as u8])),
                        port: 8000u16.to_be(),
                        proto,
                        rev_nat_id,
                        ..Backend::default()
                    },
                );
            }
        }
        // A slot past the count and one without a master are not shown.
        s.services
            .insert(key("10.0.0.2", 53, PROTO_TCP, 2), ServiceValue::default());
        s.services
            .insert(key("10.0.0.3", 53, PROTO_TCP, 1), ServiceValue::default());
        let got: Vec<(String, Vec<String>)> = views(s)
            .iter()
            .map(|v| {
                (
                    format!("{}:{}/{}", v.vip, v.port, v.protocol),
                    v.backends.iter().map(|b| b.ip.to_string()).collect(),
                )
            })
            .collect();
        let want = [
            ("10.0.0.2:53/SCTP", 4),
            ("10.0.0.2:53/TCP", 3),
            ("10.0.0.2:53/UDP", 2),
            ("10.0.0.2:443/TCP", 6),
            ("10.0.0.10:80/TCP", 5),
            ("fd00::1:53/UDP", 1),
        ]
        .map(|(fe, rev_nat_id)| {
            (
                fe.to_owned(),
                (0..13)
                    .map(|p| format!("10.1.{rev_nat_id}.{p}"))
                    .collect::<Vec<_>>(),
            )
        });
        assert_eq!(got, want);
    }

    #[test]
    fn services_show_flags_and_v6_frontends() {
        let mut s = Snapshot::default();
        let fe = ServiceKey {
            addr: Addr::from("fd00::10".parse::<IpAddr>().unwrap()),
            port: 30080u16.to_be(),
            proto: PROTO_TCP,
            ..ServiceKey::default()
        };
        let mut ids = [0; SVC_IDS];
        ids[0] = 9;
        s.services.insert(
            fe,
            ServiceValue {
                count: 1,
                rev_nat_id: 1,
                flags: SVC_F_EXTERNAL | SVC_F_NODEPORT | SVC_F_LOCAL | SVC_F_AFFINITY,
                affinity_timeout: 300,
                ids,
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
        let views = views(s);
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
