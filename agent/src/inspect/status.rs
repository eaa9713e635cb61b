//! `weir-agent inspect status`: one screen on the node's Weir datapath.
//!
//! The pins say what the kernel does (hooks, devices, map pressure) whether
//! or not an agent runs; the agent's `/statusz` adds what only it knows
//! (health, the last sync, the API server's last answer). An agent that
//! does not answer is itself the first thing the screen says.
use std::{
    fmt::Write as _,
    mem::size_of,
    net::SocketAddr,
    os::fd::AsFd as _,
    path::Path,
    time::{Duration, SystemTime},
};

use aya::maps::MapData;
use serde::Serialize;
use weir_abi::{
    AffinityKey, AffinityValue, Backend, CtKey, CtValue, RevNat, RevSockKey, RevSockValue,
    ServiceKey, ServiceValue, SvcLabel,
    maglev::{MaglevChunk, MaglevKey},
};

use crate::{
    datapath::pins::{self, Hook, Pins},
    maps::batch::Batch,
    telemetry::status::{AgentStatus, SourceInfo, unix},
};

/// How long the agent gets to answer: it serves `/statusz` from memory.
const AGENT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Serialize)]
pub struct StatusView {
    /// This binary's version; the agent's is in `agent`.
    pub inspect_version: &'static str,
    pub agent_address: SocketAddr,
    /// `None` when the agent did not answer; `agent_error` says why.
    pub agent: Option<AgentStatus>,
    pub agent_error: Option<String>,
    /// Socket hooks with a pinned link, in `Hook::ALL` order.
    pub socket_hooks: Vec<&'static str>,
    pub devices: Vec<DeviceView>,
    pub maps: Vec<MapUsage>,
}

#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct DeviceView {
    pub name: String,
    pub tc: bool,
    pub xdp: bool,
    /// The interface exists in this network namespace; a pin outliving
    /// its device is a link the next agent start removes.
    pub present: bool,
}

#[derive(Debug, PartialEq, Eq, Serialize)]
pub struct MapUsage {
    pub name: &'static str,
    pub entries: u64,
    pub capacity: u32,
}

/// Where to ask the agent, from `--agent` (`ip:port`, or an IP and the
/// metrics port): an unspecified address, as the agent binds by default,
/// is asked on loopback.
pub fn agent_address(arg: &str) -> Option<SocketAddr> {
    let mut addr = crate::telemetry::http::parse_bind_addr(arg, 10249)
        .ok()
        .flatten()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    Some(addr)
}

/// Everything but the agent's answer, read from the pins under `pins`.
pub fn read(pins: &Pins, agent_address: SocketAddr) -> StatusView {
    let (agent, agent_error) = match fetch(agent_address) {
        Ok(s) => (Some(s), None),
        Err(e) => (None, Some(e)),
    };
    StatusView {
        inspect_version: env!("CARGO_PKG_VERSION"),
        agent_address,
        agent,
        agent_error,
        socket_hooks: Hook::ALL
            .iter()
            .filter(|h| pins.link(**h).exists())
            .map(|h| h.pin_name())
            .collect(),
        devices: devices(&pins.links()),
        maps: map_usage(&pins.maps()),
    }
}

/// The devices with a TC or XDP link pinned in `links`.
fn devices(links: &Path) -> Vec<DeviceView> {
    let mut out: Vec<DeviceView> = Vec::new();
    let names = std::fs::read_dir(links)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok());
    for (kind, name) in names.filter_map(|n| pins::dev_of_pin_name(&n)) {
        let i = match out.iter().position(|d| d.name == name) {
            Some(i) => i,
            None => {
                let present = Path::new("/sys/class/net").join(&name).exists();
                out.push(DeviceView {
                    name,
                    tc: false,
                    xdp: false,
                    present,
                });
                out.len() - 1
            }
        };
        match kind {
            pins::DevLink::Tc => out[i].tc = true,
            pins::DevLink::Xdp => out[i].xdp = true,
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Entries and capacity of each pinned map with a size that fills. The
/// hash maps are counted with batch lookups (about 0.3 s per million).
fn map_usage(dir: &Path) -> Vec<MapUsage> {
    let counts: [(&'static str, Counter); 10] = [
        (weir_abi::MAP_SERVICES, count::<ServiceKey, ServiceValue>),
        (weir_abi::MAP_BACKENDS, count_backends),
        (weir_abi::MAP_REVNAT, count::<u32, RevNat>),
        (weir_abi::MAP_SVC_LABELS, count::<u32, SvcLabel>),
        (weir_abi::MAP_MAGLEV, count::<MaglevKey, MaglevChunk>),
        (weir_abi::MAP_SRC_RANGES, count_trie),
        (weir_abi::MAP_CT_TCP, count::<CtKey, CtValue>),
        (weir_abi::MAP_CT_UDP, count::<CtKey, CtValue>),
        (weir_abi::MAP_AFFINITY, count::<AffinityKey, AffinityValue>),
        (weir_abi::MAP_REVSOCK, count::<RevSockKey, RevSockValue>),
    ];
    counts
        .into_iter()
        .filter_map(|(name, count)| {
            let (entries, capacity) = count(&dir.join(name))?;
            Some(MapUsage {
                name,
                entries,
                capacity,
            })
        })
        .collect()
}

/// Entries and capacity of the map pinned at a path, if it is one.
type Counter = fn(&Path) -> Option<(u64, u32)>;

/// A hash map's entries and capacity; `None` if it is not pinned or its
/// layout is not `K`, `V` (the batch reads rely on the sizes).
fn count<K: aya::Pod, V: aya::Pod>(pin: &Path) -> Option<(u64, u32)> {
    let data = MapData::from_pin(pin).ok()?;
    let info = data.info().ok()?;
    let sizes = (info.key_size() as usize, info.value_size() as usize);
    if sizes != (size_of::<K>(), size_of::<V>()) {
        return None;
    }
    let fd = data.fd().as_fd().try_clone_to_owned().ok()?;
    let batch: Batch<K, V> = Batch::new(fd);
    let mut n = 0u64;
    for entry in batch.iter() {
        entry.ok()?;
        n += 1;
    }
    Some((n, info.max_entries()))
}

/// The backends array: its backends, and its capacity without id 0.
fn count_backends(pin: &Path) -> Option<(u64, u32)> {
    let a = crate::maps::array::MmapArray::<Backend>::open(pin).ok()?;
    let n = a.entries().ok()?.len();
    Some((n as u64, a.max_entries().saturating_sub(1)))
}

/// The source-range trie has no batch commands: walked key by key.
fn count_trie(pin: &Path) -> Option<(u64, u32)> {
    let data = MapData::from_pin(pin).ok()?;
    let capacity = data.info().ok()?.max_entries();
    let trie: aya::maps::LpmTrie<MapData, weir_abi::SrcRangeKey, u8> =
        aya::maps::LpmTrie::try_from(aya::maps::Map::LpmTrie(data)).ok()?;
    let n = trie.keys().take_while(Result::is_ok).count();
    Some((n as u64, capacity))
}

/// The agent's `/statusz`, or why it could not be had.
fn fetch(addr: SocketAddr) -> Result<AgentStatus, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        tokio::time::timeout(AGENT_TIMEOUT, get_statusz(addr))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {AGENT_TIMEOUT:?}")))
    })
}

async fn get_statusz(addr: SocketAddr) -> Result<AgentStatus, String> {
    use http_body_util::BodyExt as _;
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = hyper::Request::get("/statusz")
        .header(hyper::header::HOST, addr.to_string())
        .body(http_body_util::Empty::<hyper::body::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if !status.is_success() {
        // An agent from before /statusz answers 404.
        return Err(format!("/statusz answered {status}"));
    }
    serde_json::from_slice(&body).map_err(|e| format!("/statusz: {e}"))
}

/// The screen.
pub fn render(v: &StatusView) -> String {
    render_at(v, unix(SystemTime::now()))
}

fn render_at(v: &StatusView, now: f64) -> String {
    let mut out = String::new();
    let ago = |t: f64| age(now - t);
    let mut line = |k: &str, text: String| {
        let _ = writeln!(out, "{:<12}{text}", format!("{k}:"));
    };
    match (&v.agent, &v.agent_error) {
        (Some(a), _) => {
            line(
                "Agent",
                format!(
                    "running, weir-agent {} on node {}, up {}, at {}",
                    a.version,
                    a.node,
                    age(now - a.started),
                    v.agent_address
                ),
            );
            let health = match (a.healthy, a.node_eligible) {
                (true, true) => "healthy".to_owned(),
                (true, false) => "healthy; node not eligible for new traffic".to_owned(),
                (false, _) => "NOT healthy: changes are not reaching the datapath".to_owned(),
            };
            line("Health", health);
            line(
                "Last sync",
                a.last_sync
                    .map_or_else(|| "none yet".to_owned(), |t| format!("{} ago", ago(t))),
            );
            line("Source", source(a, &ago));
        }
        (None, e) => line(
            "Agent",
            format!(
                "not answering at {} ({}); below is what the pins hold",
                v.agent_address,
                e.as_deref().unwrap_or("unknown")
            ),
        ),
    }
    line(
        "Socket LB",
        if v.socket_hooks.is_empty() {
            "off (no socket hook pinned)".to_owned()
        } else {
            format!(
                "{} of {} hooks ({})",
                v.socket_hooks.len(),
                Hook::ALL.len(),
                v.socket_hooks.join(" ")
            )
        },
    );
    line("Per-packet", devices_line(&v.devices));
    let _ = writeln!(out, "Maps:");
    let _ = writeln!(
        out,
        "  {:<16} {:>12} {:>12} {:>6}",
        "MAP", "ENTRIES", "CAPACITY", "USED"
    );
    for m in &v.maps {
        let used = if m.capacity == 0 {
            0.0
        } else {
            100.0 * m.entries as f64 / f64::from(m.capacity)
        };
        let _ = writeln!(
            out,
            "  {:<16} {:>12} {:>12} {:>5.1}%",
            m.name, m.entries, m.capacity, used
        );
    }
    let _ = writeln!(out, "{:<12}weir-agent {}", "Inspect:", v.inspect_version);
    out
}

fn source(a: &AgentStatus, ago: &dyn Fn(f64) -> String) -> String {
    match (&a.source, &a.api) {
        (SourceInfo::Manifests { dir }, _) => format!("manifests in {dir}"),
        (SourceInfo::Api, None) => "API server".to_owned(),
        (SourceInfo::Api, Some(c)) => {
            let server = c.server.as_deref().unwrap_or("(not contacted yet)");
            let mut s = format!("API server {server}");
            match c.last_answer {
                Some(t) => {
                    let _ = write!(s, ", last answer {} ago", ago(t));
                }
                None => s.push_str(", no answer yet"),
            }
            // A failure older than the last answer is history, not state.
            if let Some(e) = c
                .last_error
                .as_ref()
                .filter(|e| c.last_answer.is_none_or(|t| e.at > t))
            {
                let _ = write!(s, "; FAILING since at least {} ago ({})", ago(e.at), e.code);
            }
            s
        }
    }
}

fn devices_line(devices: &[DeviceView]) -> String {
    if devices.is_empty() {
        return "off (no device link pinned)".to_owned();
    }
    let list = |pick: fn(&DeviceView) -> bool| -> String {
        let names: Vec<String> = devices
            .iter()
            .filter(|d| pick(d))
            .map(|d| {
                if d.present {
                    d.name.clone()
                } else {
                    format!("{} (gone)", d.name)
                }
            })
            .collect();
        names.join(", ")
    };
    let mut s = format!("tc on {}", list(|d| d.tc));
    let xdp = list(|d| d.xdp);
    if !xdp.is_empty() {
        let _ = write!(s, "; XDP on {xdp}");
    }
    s
}

/// `3s`, `4m`, `2h5m`, `3d4h`: an age at a glance.
fn age(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86_400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86_400, s % 86_400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::status::{ApiError, Contact};

    #[test]
    fn the_agent_is_asked_on_loopback_when_it_binds_everywhere() {
        let at = |s: &str| s.parse::<SocketAddr>().ok();
        assert_eq!(agent_address("0.0.0.0:10249"), at("127.0.0.1:10249"));
        assert_eq!(agent_address("[::]:9"), at("[::1]:9"));
        assert_eq!(agent_address("10.0.0.1"), at("10.0.0.1:10249"));
        assert_eq!(agent_address("nope"), None);
    }

    fn view(agent: Option<AgentStatus>) -> StatusView {
        StatusView {
            inspect_version: "9.9.9",
            agent_address: "127.0.0.1:10249".parse().unwrap(),
            agent_error: agent.is_none().then(|| "connection refused".to_owned()),
            agent,
            socket_hooks: vec!["connect4", "connect6"],
            devices: vec![
                DeviceView {
                    name: "eth0".into(),
                    tc: true,
                    xdp: true,
                    present: true,
                },
                DeviceView {
                    name: "veth9".into(),
                    tc: true,
                    xdp: false,
                    present: false,
                },
            ],
            maps: vec![MapUsage {
                name: "WEIR_SVC",
                entries: 512,
                capacity: 2048,
            }],
        }
    }

    #[test]
    fn a_running_agent_in_api_mode_with_a_failing_server() {
        let now = 1_000_000.0;
        let agent = AgentStatus {
            version: "0.1.0".into(),
            started: now - 7_500.0,
            node: "n1".into(),
            source: SourceInfo::Api,
            healthy: true,
            node_eligible: true,
            last_sync: Some(now - 4.0),
            api: Some(Contact {
                server: Some("10.0.0.1:6443".into()),
                last_answer: Some(now - 90.0),
                last_error: Some(ApiError {
                    at: now - 2.0,
                    code: "<error>".into(),
                }),
            }),
        };
        let text = render_at(&view(Some(agent)), now);
        for want in [
            "Agent:      running, weir-agent 0.1.0 on node n1, up 2h5m, at 127.0.0.1:10249",
            "Health:     healthy",
            "Last sync:  4s ago",
            "Source:     API server 10.0.0.1:6443, last answer 1m ago; FAILING since at least 2s ago (<error>)",
            "Socket LB:  2 of 9 hooks (connect4 connect6)",
            "Per-packet: tc on eth0, veth9 (gone); XDP on eth0",
            "  WEIR_SVC                  512         2048  25.0%",
            "Inspect:    weir-agent 9.9.9",
        ] {
            assert!(
                text.lines().any(|l| l == want),
                "missing {want:?} in\n{text}"
            );
        }
    }

    #[test]
    fn an_agent_that_does_not_answer_leaves_the_pins_to_speak() {
        let text = render_at(&view(None), 0.0);
        assert!(
            text.starts_with(
                "Agent:      not answering at 127.0.0.1:10249 (connection refused); below is what the pins hold\nSocket LB:"
            ),
            "{text}"
        );
        let json = serde_json::to_value(view(None)).unwrap();
        assert_eq!(json["agent"], serde_json::Value::Null);
        assert_eq!(json["devices"][1]["present"], false);
    }

    #[test]
    fn ages_read_at_a_glance() {
        assert_eq!(
            [0.4, 59.0, 61.0, 3_700.0, 90_000.0, -5.0].map(age),
            ["0s", "59s", "1m", "1h1m", "1d1h", "0s"]
        );
    }
}
