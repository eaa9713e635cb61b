//! One contender's network: a client namespace (the pod that opens
//! connections), a node namespace that routes and holds the dataplane's rules,
//! and backend namespaces running `weir-benchsrv`. Each contender gets its own
//! lab, so rulesets never meet and every lab stays programmed while the bench
//! alternates between them.
//!
//! ```text
//!  client 10.78.0.2 ── vc ── node (forwarding; rules here) ── br0 10.77.0.1 ── be1 10.77.0.11:8080
//!                                                                         └── be2 10.77.0.12:8080
//! ```
use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::Result;

use crate::{
    bin,
    topology::{
        Cgroup, ChildGuard, DIR_PREFIX, NETNS_PREFIX, Netns, cgroup2_root, spawn_ready, veth,
        wire_backend,
    },
};

pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 78, 0, 2);
pub const BACKEND_PORT: u16 = 8080;
pub const BACKEND_UDP_PORT: u16 = 5353;

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
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let id = format!(
            "{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
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
}

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
