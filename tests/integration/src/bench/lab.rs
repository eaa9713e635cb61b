//! One contender's network: a client namespace (the pod that opens
//! connections), a node namespace that routes and holds the dataplane's rules,
//! and backend namespaces running `weir-benchsrv`. Each contender gets its own
//! lab, so rulesets never meet and every lab stays programmed while the bench
//! alternates between them. For `weir-tc` the agent runs in the node
//! namespace and attaches its TC program to `vc` and `br0`.
//!
//! ```text
//!  client 10.78.0.2 ── vc ── node (forwarding; rules here) ── br0 10.77.0.1 ── be1 10.77.0.11:8080
//!                                                                         └── be2 10.77.0.12:8080
//! ```
use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::Result;

use crate::{
    agent::{AgentProcess, agent_command},
    bin,
    topology::{
        Cgroup, ChildGuard, DIR_PREFIX, NETNS_PREFIX, Netns, cgroup2_root, spawn_ready, unique_id,
        veth, wire_backend,
    },
};

pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);
pub const BACKEND_PORT: u16 = 8080;
pub const BACKEND_UDP_PORT: u16 = 5353;
/// The node's devices whose ingress carries Service traffic, for the
/// per-packet datapath: `vc` (client → frontend) and `br0` (backend replies,
/// which arrive on a bridge port and reach the node through the bridge).
pub const NODE_DEVICES: &str = "vc,br0";

pub struct Lab {
    pub name: String,
    pub backends: Vec<Ipv4Addr>,
    /// Clients run in this cgroup; only the Weir socket lab attaches programs.
    pub cgroup: Cgroup,
    pub client: Netns,
    pub node: Netns,
    _servers: Vec<ChildGuard>,
    _backend_ns: Vec<Netns>,
}

impl Lab {
    pub fn new(tag: &str, backends: u32) -> Result<Self> {
        let id = unique_id("l");
        let cgroup = Cgroup::create(cgroup2_root()?.join(format!("{DIR_PREFIX}{id}-{tag}")))?;
        let node = Netns::create(format!("{NETNS_PREFIX}{id}-n"))?;
        let client = Netns::create(format!("{NETNS_PREFIX}{id}-c"))?;
        node.sh(
            "ip link set lo up && ip link add br0 type bridge && ip addr add 10.77.0.1/24 dev br0 \
             && ip link set br0 up && sysctl -qw net.ipv4.ip_forward=1",
        )?;
        veth(&node, "vc", &client, "eth0")?;
        node.sh("ip addr add 10.78.0.1/24 dev vc && ip link set vc up")?;
        client.sh(&format!(
            "ip link set lo up && ip addr add {CLIENT_IP}/24 dev eth0 && ip link set eth0 up \
             && ip route add default via 10.78.0.1"
        ))?;
        let mut lab = Self {
            name: tag.to_owned(),
            backends: Vec::new(),
            cgroup,
            client,
            node,
            _servers: Vec::new(),
            _backend_ns: Vec::new(),
        };
        for k in 1..=backends as usize {
            lab.add_backend(&id, k)?;
        }
        Ok(lab)
    }

    fn add_backend(&mut self, id: &str, k: usize) -> Result<()> {
        let ip = Ipv4Addr::new(10, 77, 0, 10 + u8::try_from(k)?);
        let ns = Netns::create(format!("{NETNS_PREFIX}{id}-b{k}"))?;
        wire_backend(&self.node, &ns, k, ip)?;
        self._servers
            .push(spawn_ready(ns.command(&bin("weir-benchsrv")).args([
                "--name",
                &format!("be{k}"),
                "--threads",
                "1",
            ]))?);
        self._backend_ns.push(ns);
        self.backends.push(ip);
        Ok(())
    }

    /// Full checksums on every packet the client and the backends send, as
    /// from a real NIC: a veth otherwise hands CHECKSUM_PARTIAL packets to the
    /// node's TC programs (the packet tests do the same).
    pub fn full_checksums(&self) -> Result<()> {
        for ns in std::iter::once(&self.client).chain(&self._backend_ns) {
            ns.sh("ethtool -K eth0 tx off >/dev/null").map_err(|e| {
                e.context("ethtool is needed (Debian package ethtool; cargo xtask setup)")
            })?;
        }
        Ok(())
    }

    /// `weir-loadgen` in the client namespace, inside the lab's cgroup.
    pub fn loadgen(&self) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", r#"echo $$ > "$0" && exec "$@""#])
            .arg(self.cgroup.path.join("cgroup.procs"))
            .arg("nsenter")
            .arg(format!("--net={}", self.client.path()))
            .arg(bin("weir-loadgen"));
        c
    }

    pub fn node_path(&self) -> PathBuf {
        PathBuf::from(self.node.path())
    }

    /// Starts `weir-agent ARGS` inside the node namespace, where the
    /// per-packet programs attach to the node's devices, and waits (up to
    /// `timeout`) for its first full sync. Its /metrics and /healthz listen on
    /// the node namespace's own loopback.
    pub fn start_node_agent(
        &self,
        args: &[&str],
        log: &Path,
        timeout: Duration,
    ) -> Result<NodeAgent> {
        let before = std::fs::metadata(log).map_or(0, |m| m.len() as usize);
        let node = self.node.path();
        let mut cmd = agent_command(Some(&node));
        cmd.args(["--metrics-addr", "127.0.0.1:10249"])
            .args(["--healthz-addr", "127.0.0.1:10256"])
            .args(args);
        let mut agent = NodeAgent::new(log.to_path_buf());
        agent.launch(cmd)?;
        agent.wait_for_log(before, "initial sync complete", timeout)?;
        Ok(agent)
    }
}

/// A `weir-agent` in a lab's node namespace; killed on drop.
pub type NodeAgent = AgentProcess;

impl Drop for Lab {
    fn drop(&mut self) {
        self.cgroup.kill_all();
    }
}

/// Writes `lines` to `path`, one per line, for `weir-loadgen --targets`.
pub fn write_targets(path: &Path, lines: impl Iterator<Item = String>) -> Result<()> {
    use std::io::Write as _;
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    for l in lines {
        writeln!(f, "{l}")?;
    }
    Ok(())
}
