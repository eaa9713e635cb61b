//! `weir-agent` inside the topology's node namespace, on its devices.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, Result, bail};
use aya::maps::{HashMap, Map, MapData, PerCpuArray};
use serde::Deserialize;
use weir_abi::{CtKey, CtValue, StatValue};

use super::{DEVICES, NODE_NAME, NODE2_NAME, PacketTopology};
use crate::{
    agent::{AgentProcess, agent_command},
    bin,
};

/// Where the agent serves /metrics and /healthz: the node namespace's own
/// loopback, so kube-proxy's fixed ports never collide between tests.
pub const METRICS_ADDR: &str = "127.0.0.1:10249";
pub const HEALTHZ_ADDR: &str = "127.0.0.1:10256";

/// A running agent in the node namespace. Killed on drop (and by the kernel if
/// the test process dies first).
pub struct PacketAgent {
    process: AgentProcess,
    args: Vec<String>,
    netns: String,
    pub pin_dir: PathBuf,
}

impl PacketAgent {
    /// Starts the agent as node [`NODE_NAME`] on [`DEVICES`] with the
    /// topology's manifests, cgroup and bpffs, plus `extra` flags (which may
    /// replace `--devices`; `--devices=` drops it), and waits for its first
    /// full sync.
    pub fn start(topo: &PacketTopology, extra: &[&str]) -> Result<Self> {
        let mut agent = Self::new(topo, extra);
        agent.spawn()?;
        Ok(agent)
    }

    /// A second agent, as node [`NODE2_NAME`] in node2's namespace, with the
    /// same manifests and its own pins (`<bpffs>/node2`): maps only, no
    /// socket hooks and no devices, plus `extra` flags. What another node
    /// of the cluster would program, for comparing the two.
    pub fn start_node2(topo: &PacketTopology, extra: &[&str]) -> Result<Self> {
        let pin_dir = topo.bpffs.dir.join("node2");
        let mut args: Vec<String> = vec![
            "--manifests".into(),
            topo.manifests.display().to_string(),
            "--node-name".into(),
            NODE2_NAME.into(),
            "--socket-lb=false".into(),
            "--bpffs".into(),
            pin_dir.display().to_string(),
            "--metrics-addr".into(),
            METRICS_ADDR.into(),
            "--healthz-addr".into(),
            HEALTHZ_ADDR.into(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut agent = Self {
            process: AgentProcess::new(topo.dir.join("agent-node2.log")),
            args,
            netns: topo.node2.path(),
            pin_dir,
        };
        agent.spawn()?;
        Ok(agent)
    }

    /// As [`Self::start`], but returns as soon as the process runs.
    pub fn spawn_only(topo: &PacketTopology, extra: &[&str]) -> Result<Self> {
        let mut agent = Self::new(topo, extra);
        agent.launch()?;
        Ok(agent)
    }

    fn new(topo: &PacketTopology, extra: &[&str]) -> Self {
        let mut args: Vec<String> = vec![
            "--manifests".into(),
            topo.manifests.display().to_string(),
            "--node-name".into(),
            NODE_NAME.into(),
            "--cgroup".into(),
            topo.cgroup.path.display().to_string(),
            "--bpffs".into(),
            topo.pin_dir().display().to_string(),
            "--metrics-addr".into(),
            METRICS_ADDR.into(),
            "--healthz-addr".into(),
            HEALTHZ_ADDR.into(),
        ];
        if !extra.iter().any(|a| a.starts_with("--devices")) {
            args.extend(["--devices".into(), DEVICES.into()]);
        }
        // `--devices=` means none at all: the agent gets no `--devices` flag.
        args.extend(
            extra
                .iter()
                .filter(|a| **a != "--devices=")
                .map(|s| (*s).to_owned()),
        );
        Self {
            process: AgentProcess::new(topo.dir.join("agent.log")),
            args,
            netns: topo.node.path(),
            pin_dir: topo.pin_dir(),
        }
    }

    fn spawn(&mut self) -> Result<()> {
        let before = self.log_text().len();
        self.launch()?;
        self.wait_for_log(before, "initial sync complete", Duration::from_secs(120))
    }

    fn launch(&mut self) -> Result<()> {
        let mut cmd = agent_command(Some(&self.netns));
        cmd.args(&self.args);
        self.process.launch(cmd)
    }

    /// `weir-agent inspect WHAT -o json --bpffs PIN` (read from the pinned maps).
    pub fn inspect(&self, what: &str) -> Result<serde_json::Value> {
        let out = Command::new(bin("weir-agent"))
            .args(["inspect", what, "-o", "json", "--bpffs"])
            .arg(&self.pin_dir)
            .output()?;
        if !out.status.success() {
            bail!(
                "inspect {what} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "inspect {what} printed {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// The `(program, reason)` counter summed over CPUs, read straight from
    /// the pinned WEIR_STATS map. `prog` and `reason` are `weir_abi::STAT_*`.
    pub fn stat(&self, prog: u32, reason: u32) -> Result<u64> {
        let path = self.pin_dir.join("maps").join(weir_abi::MAP_STATS);
        let data =
            MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
        let map: PerCpuArray<_, StatValue> = PerCpuArray::try_from(Map::PerCpuArray(data))?;
        let values = map.get(&weir_abi::stat_index(prog, reason), 0)?;
        Ok(values.iter().map(|v| v.packets).sum())
    }

    /// The same counter as `weir-agent inspect stats -o json` reports it.
    pub fn inspect_stat(&self, prog: u32, reason: u32) -> Result<u64> {
        let rows = parse_stats(self.inspect("stats")?)?;
        let prog = weir_abi::STAT_PROG_NAMES[prog as usize];
        let reason = weir_abi::STAT_REASON_NAMES[reason as usize];
        find_stat(&rows, prog, reason)
            .map(|r| r.packets)
            .with_context(|| format!("no {prog}/{reason} in inspect stats: {rows:?}"))
    }

    /// Every conntrack entry of both tables, read straight from the pins.
    pub fn conntrack(&self) -> Result<Vec<(CtKey, CtValue)>> {
        let mut all = Vec::new();
        for name in [weir_abi::MAP_CT_TCP, weir_abi::MAP_CT_UDP] {
            let path = self.pin_dir.join("maps").join(name);
            let data =
                MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
            let map: HashMap<_, CtKey, CtValue> = HashMap::try_from(Map::LruHashMap(data))?;
            for kv in map.iter() {
                all.push(kv?);
            }
        }
        Ok(all)
    }

    /// `GET path` on an address in the node namespace: (status, body).
    pub fn node_get(&self, addr: &str, path: &str) -> Result<(u16, String)> {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.netns))
            .args([
                "curl",
                "-sS",
                "-g",
                "--max-time",
                "5",
                "-w",
                "\n%{http_code}",
            ])
            .arg(format!("http://{addr}{path}"))
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        Ok((code.trim().parse().unwrap_or(0), body.to_owned()))
    }

    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }
}

/// The process: its log, log waits, `is_running` and `stop`.
impl std::ops::Deref for PacketAgent {
    type Target = AgentProcess;
    fn deref(&self) -> &AgentProcess {
        &self.process
    }
}

impl std::ops::DerefMut for PacketAgent {
    fn deref_mut(&mut self) -> &mut AgentProcess {
        &mut self.process
    }
}

/// One row of `weir-agent inspect stats -o json`. Unknown or missing fields
/// fail the parse: a change of the format must show up here, not as a
/// counter silently read as missing.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StatRow {
    /// `weir_abi::STAT_PROG_NAMES`.
    pub program: String,
    /// `weir_abi::STAT_REASON_NAMES`.
    pub reason: String,
    pub packets: u64,
    pub bytes: u64,
}

/// Parses `inspect stats -o json`: an array of [`StatRow`], one per
/// (program, reason) of the ABI, each exactly once.
pub fn parse_stats(v: serde_json::Value) -> Result<Vec<StatRow>> {
    let text = v.to_string();
    let rows: Vec<StatRow> =
        serde_json::from_value(v).with_context(|| format!("inspect stats printed {text}"))?;
    let expected = weir_abi::STAT_PROG_NAMES.len() * weir_abi::STAT_REASON_NAMES.len();
    let mut keys: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r.program.as_str(), r.reason.as_str()))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    if rows.len() != expected || keys.len() != expected {
        bail!(
            "inspect stats has {} rows ({} distinct), expected one per program and reason ({expected}): {text}",
            rows.len(),
            keys.len()
        );
    }
    Ok(rows)
}

/// The `prog`/`reason` row of parsed `inspect stats`.
pub fn find_stat<'a>(rows: &'a [StatRow], prog: &str, reason: &str) -> Option<&'a StatRow> {
    rows.iter()
        .find(|r| r.program == prog && r.reason == reason)
}
