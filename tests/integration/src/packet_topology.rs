//! The packet-datapath topology: an external client, a node with the agent's
//! devices, a local pod, and a pod on a second node, dual-stack throughout.
//!
//! ```text
//!  wt-<id>-c client                wt-<id>-n node (agent, cgroup clients)         wt-<id>-m node2
//!  eth0 192.168.50.2,.3/24 ─── wext 192.168.50.1/24      wnode2 172.16.0.1/30 ─── eth0 172.16.0.2/30
//!       fd00:50::2,::3/64           fd00:50::1/64               fd00:16::1/64          fd00:16::2/64
//!                                   wpod 10.0.1.1/24, fd00:1::1/64                wrpod 10.0.2.1/24, fd00:2::1/64
//!                                     │                                              │
//!                          wt-<id>-l lpod eth0 10.0.1.2/24         wt-<id>-r rpod eth0 10.0.2.2/24
//!                                          fd00:1::2/64                                fd00:2::2/64
//! ```
//! Every pod runs `weir-testsrv` (HTTP on 8080, UDP on 5353 and 5354, v4 and v6) and
//! dnsmasq on port 53 answering `weir.test` with the pod's own addresses, so
//! every answer names the backend that served it. Transmit checksum offload is
//! off on every veth end, so packets carry full checksums as on a wire and the
//! XDP and TC programs see what a NIC would hand them. Names follow the
//! harness's prefixes, so [`crate::sweep::sweep`] removes what a killed run left.
pub mod agent;
pub mod clients;
pub mod manifests;

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Result, bail};

pub use self::agent::PacketAgent;
use crate::{
    bin,
    topology::{
        Bpffs, Cgroup, ChildGuard, NETNS_PREFIX, Netns, Workspace, remove_manifest_in, spawn_ready,
        veth, write_manifest_in,
    },
};

/// The agent's `--node-name`; endpoints of the local pod carry it.
pub const NODE_NAME: &str = "node1";
/// The `nodeName` of the remote pod's endpoints.
pub const NODE2_NAME: &str = "node2";

pub const CLIENT4: &str = "192.168.50.2";
pub const CLIENT6: &str = "fd00:50::2";
/// The client's second address, for source ranges that admit only the first.
pub const CLIENT4_B: &str = "192.168.50.3";
pub const CLIENT6_B: &str = "fd00:50::3";
/// The node's address on the client's network: NodePort frontends live here.
pub const NODE_EXT4: &str = "192.168.50.1";
pub const NODE_EXT6: &str = "fd00:50::1";
/// The node's address towards its local pod.
pub const NODE_POD4: &str = "10.0.1.1";
pub const NODE_POD6: &str = "fd00:1::1";
/// The node's address towards node2: the SNAT address for the remote pod.
pub const NODE_LINK4: &str = "172.16.0.1";
pub const NODE_LINK6: &str = "fd00:16::1";
pub const NODE2_LINK4: &str = "172.16.0.2";
pub const NODE2_LINK6: &str = "fd00:16::2";
pub const LPOD4: &str = "10.0.1.2";
pub const LPOD6: &str = "fd00:1::2";
pub const RPOD4: &str = "10.0.2.2";
pub const RPOD6: &str = "fd00:2::2";

/// The node's bridge without native XDP and the client's port on it
/// ([`PacketTopology::add_device_without_xdp`]).
pub const BRIDGE_NODE4: &str = "198.18.0.1";
pub const BRIDGE_NODE6: &str = "fd00:18::1";
pub const BRIDGE_CLIENT4: &str = "198.18.0.2";
pub const BRIDGE_CLIENT6: &str = "fd00:18::2";

/// Ports the pods serve on.
pub const POD_TCP_PORT: u16 = 8080;
pub const POD_UDP_PORT: u16 = 5353;
/// A second UDP port of weir-testsrv, for the one test that needs pod UDP
/// backends no other test ever removes.
pub const POD_UDP_PORT_PRIVATE: u16 = 5354;
pub const POD_DNS_PORT: u16 = 53;

/// The node's devices, as `--devices` takes them.
pub const DEVICES: &str = "wext,wpod,wnode2";

/// One of the topology's namespaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ns {
    Client,
    Node,
    Lpod,
    Node2,
    Rpod,
}

/// A pod: its namespace, name (what its servers answer), addresses and the
/// node its endpoints name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pod {
    pub ns: Ns,
    pub name: &'static str,
    pub v4: &'static str,
    pub v6: &'static str,
    pub node: &'static str,
}

pub const LPOD: Pod = Pod {
    ns: Ns::Lpod,
    name: "lpod",
    v4: LPOD4,
    v6: LPOD6,
    node: NODE_NAME,
};
pub const RPOD: Pod = Pod {
    ns: Ns::Rpod,
    name: "rpod",
    v4: RPOD4,
    v6: RPOD6,
    node: NODE2_NAME,
};

impl Pod {
    pub fn addr(&self, v6: bool) -> &'static str {
        if v6 { self.v6 } else { self.v4 }
    }

    /// The pod whose servers answer `name`.
    pub fn named(name: &str) -> Option<Pod> {
        [LPOD, RPOD].into_iter().find(|p| p.name == name)
    }

    /// The topology's other pod.
    pub fn other(&self) -> Pod {
        if *self == LPOD { RPOD } else { LPOD }
    }
}

pub struct PacketTopology {
    pub id: String,
    pub dir: PathBuf,
    pub manifests: PathBuf,
    servers: Vec<ChildGuard>,
    pub client: Netns,
    pub node: Netns,
    pub lpod: Netns,
    pub node2: Netns,
    pub rpod: Netns,
    pub cgroup: Cgroup,
    /// Last: its drop removes the work directory.
    pub bpffs: Bpffs,
}

impl PacketTopology {
    /// Builds the five namespaces, their links, addresses and routes, starts
    /// the pods' servers and waits until each answers.
    pub fn new() -> Result<Self> {
        let Workspace {
            id,
            dir,
            manifests,
            bpffs,
            cgroup,
        } = Workspace::create("p")?;
        let ns = |s: &str| Netns::create(format!("{NETNS_PREFIX}{id}-{s}"));
        let mut topo = Self {
            manifests,
            dir,
            servers: Vec::new(),
            client: ns("c")?,
            node: ns("n")?,
            lpod: ns("l")?,
            node2: ns("m")?,
            rpod: ns("r")?,
            cgroup,
            bpffs,
            id,
        };
        topo.wire()?;
        topo.start_servers()?;
        Ok(topo)
    }

    fn wire(&self) -> Result<()> {
        // Before any link exists, so every device inherits them: no reverse-path
        // filter (asymmetric test routes), no DAD delay, no ICMP redirects.
        for ns in [
            &self.client,
            &self.node,
            &self.lpod,
            &self.node2,
            &self.rpod,
        ] {
            ns.sh(
                "ip link set lo up \
                 && sysctl -qw net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0 \
                 && sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0 \
                 && sysctl -qw net.ipv4.conf.all.send_redirects=0 net.ipv4.conf.default.send_redirects=0",
            )?;
        }
        for ns in [&self.node, &self.node2] {
            ns.sh("sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1")?;
        }
        veth(&self.node, "wext", &self.client, "eth0")?;
        veth(&self.node, "wpod", &self.lpod, "eth0")?;
        veth(&self.node, "wnode2", &self.node2, "eth0")?;
        veth(&self.node2, "wrpod", &self.rpod, "eth0")?;
        // `nodad`: usable at once, not after a second of duplicate detection.
        // The second addresses are never picked as a source unless bound: v4
        // makes them secondary, v6 deprecates them (`preferred_lft 0`).
        self.client.sh(
            "ip addr add 192.168.50.2/24 dev eth0 && ip addr add 192.168.50.3/24 dev eth0 \
             && ip addr add fd00:50::2/64 dev eth0 nodad && ip addr add fd00:50::3/64 dev eth0 nodad preferred_lft 0 \
             && ip link set eth0 up \
             && ip route add default via 192.168.50.1 && ip -6 route add default via fd00:50::1",
        )?;
        self.node.sh(
            "ip addr add 192.168.50.1/24 dev wext && ip addr add fd00:50::1/64 dev wext nodad \
             && ip addr add 10.0.1.1/24 dev wpod && ip addr add fd00:1::1/64 dev wpod nodad \
             && ip addr add 172.16.0.1/30 dev wnode2 && ip addr add fd00:16::1/64 dev wnode2 nodad \
             && ip link set wext up && ip link set wpod up && ip link set wnode2 up \
             && ip route add 10.0.2.0/24 via 172.16.0.2 && ip -6 route add fd00:2::/64 via fd00:16::2",
        )?;
        self.lpod.sh(
            "ip addr add 10.0.1.2/24 dev eth0 && ip addr add fd00:1::2/64 dev eth0 nodad \
             && ip link set eth0 up \
             && ip route add default via 10.0.1.1 && ip -6 route add default via fd00:1::1",
        )?;
        self.node2.sh(
            "ip addr add 172.16.0.2/30 dev eth0 && ip addr add fd00:16::2/64 dev eth0 nodad \
             && ip addr add 10.0.2.1/24 dev wrpod && ip addr add fd00:2::1/64 dev wrpod nodad \
             && ip link set eth0 up && ip link set wrpod up \
             && ip route add 192.168.50.0/24 via 172.16.0.1 && ip route add 10.0.1.0/24 via 172.16.0.1 \
             && ip -6 route add fd00:50::/64 via fd00:16::1 && ip -6 route add fd00:1::/64 via fd00:16::1",
        )?;
        self.rpod.sh(
            "ip addr add 10.0.2.2/24 dev eth0 && ip addr add fd00:2::2/64 dev eth0 nodad \
             && ip link set eth0 up \
             && ip route add default via 10.0.2.1 && ip -6 route add default via fd00:2::1",
        )?;
        // Full checksums on every packet, as from a real NIC: a veth otherwise
        // hands CHECKSUM_PARTIAL packets to the XDP and TC programs.
        for (ns, devs) in [
            (&self.client, &["eth0"][..]),
            (&self.node, &["wext", "wpod", "wnode2"][..]),
            (&self.lpod, &["eth0"][..]),
            (&self.node2, &["eth0", "wrpod"][..]),
            (&self.rpod, &["eth0"][..]),
        ] {
            for dev in devs {
                ns.sh(&format!("ethtool -K {dev} tx off >/dev/null"))
                    .map_err(|e| {
                        e.context("ethtool is needed (Debian package ethtool; cargo xtask setup)")
                    })?;
            }
        }
        Ok(())
    }

    fn start_servers(&mut self) -> Result<()> {
        let mut servers = Vec::new();
        let res = self.spawn_servers(&mut servers);
        self.servers = servers;
        res
    }

    fn spawn_servers(&self, servers: &mut Vec<ChildGuard>) -> Result<()> {
        for pod in [LPOD, RPOD] {
            let ns = self.ns(pod.ns);
            let srv = spawn_ready(ns.command(&bin("weir-testsrv")).args([
                "--name",
                pod.name,
                "--udp",
                &POD_UDP_PORT.to_string(),
                "--udp",
                &POD_UDP_PORT_PRIVATE.to_string(),
            ]))?;
            servers.push(srv);
            let dns = ns
                .command(Path::new("dnsmasq"))
                .args([
                    "--no-daemon",
                    "--conf-file=/dev/null",
                    "--no-resolv",
                    "--no-hosts",
                    "--pid-file=",
                    "--user=root",
                    "--port=53",
                    "--bind-interfaces",
                ])
                .arg(format!("--listen-address={},{}", pod.v4, pod.v6))
                .arg(format!("--address=/weir.test/{}", pod.v4))
                .arg(format!("--address=/weir.test/{}", pod.v6))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?;
            servers.push(ChildGuard(dns));
        }
        // Each pod's servers answer its own namespace before any test relies on them.
        let deadline = Instant::now() + Duration::from_secs(10);
        for pod in [LPOD, RPOD] {
            for ip in [pod.v4, pod.v6] {
                loop {
                    let got = clients::dig(self, pod.ns, ip, POD_DNS_PORT, "A")?;
                    if got.as_deref() == Some(pod.v4) {
                        break;
                    }
                    if Instant::now() > deadline {
                        bail!("dnsmasq in {} does not answer on {ip}: {got:?}", pod.name);
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
        Ok(())
    }

    pub fn ns(&self, ns: Ns) -> &Netns {
        match ns {
            Ns::Client => &self.client,
            Ns::Node => &self.node,
            Ns::Lpod => &self.lpod,
            Ns::Node2 => &self.node2,
            Ns::Rpod => &self.rpod,
        }
    }

    /// `program` run in namespace `ns`.
    pub fn command(&self, ns: Ns, program: impl AsRef<Path>) -> Command {
        self.ns(ns).command(program.as_ref())
    }

    /// `program` run in namespace `ns` inside the agent's cgroup, so the socket
    /// programs apply to it.
    pub fn cgroup_command(&self, ns: Ns, program: impl AsRef<Path>) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", r#"echo $$ > "$0" && exec "$@""#])
            .arg(self.cgroup.path.join("cgroup.procs"))
            .arg("nsenter")
            .arg(format!("--net={}", self.ns(ns).path()))
            .arg(program.as_ref());
        c
    }

    /// Adds a device without native XDP to the node: a bridge (this kernel,
    /// like many, has no `dummy` module; a bridge has no XDP driver hook
    /// either) at [`BRIDGE_NODE4`]/[`BRIDGE_NODE6`], with one port whose peer
    /// is the client's `eth1` ([`BRIDGE_CLIENT4`]/[`BRIDGE_CLIENT6`]), so
    /// real traffic can enter the node through it.
    pub fn add_device_without_xdp(&self, name: &str) -> Result<()> {
        let port = format!("{name}p");
        self.node.sh(&format!(
            "ip link add {name} type bridge && ip addr add {BRIDGE_NODE4}/24 dev {name} \
             && ip addr add {BRIDGE_NODE6}/64 dev {name} nodad && ip link set {name} up"
        ))?;
        veth(&self.node, &port, &self.client, "eth1")?;
        self.node.sh(&format!(
            "ip link set {port} master {name} && ip link set {port} up \
             && ethtool -K {port} tx off >/dev/null"
        ))?;
        self.client.sh(&format!(
            "ip addr add {BRIDGE_CLIENT4}/24 dev eth1 && ip addr add {BRIDGE_CLIENT6}/64 dev eth1 nodad \
             && ip link set eth1 up && ethtool -K eth1 tx off >/dev/null"
        ))
    }

    /// Removes a device made by [`Self::add_device_without_xdp`], named
    /// `name` now, with its bridge port `port` (and so the client's `eth1`).
    pub fn remove_device_without_xdp(&self, name: &str, port: &str) -> Result<()> {
        self.node
            .sh(&format!("ip link del {port} && ip link del {name}"))
    }

    pub fn write_manifest(&self, file: &str, content: &str) -> Result<()> {
        write_manifest_in(&self.manifests, file, content)
    }

    pub fn remove_manifest(&self, file: &str) -> Result<()> {
        remove_manifest_in(&self.manifests, file)
    }

    pub fn pin_dir(&self) -> PathBuf {
        self.bpffs.pin_dir()
    }

    /// The node's addresses on its devices, as the agent should find them.
    pub fn node_addrs() -> Vec<IpAddr> {
        [
            NODE_EXT4, NODE_EXT6, NODE_POD4, NODE_POD6, NODE_LINK4, NODE_LINK6,
        ]
        .iter()
        .map(|a| a.parse().expect("valid"))
        .collect()
    }

    /// The names of the topology's network namespaces.
    pub fn all_names(&self) -> Vec<String> {
        self.all_ns().iter().map(|n| n.name.clone()).collect()
    }

    fn all_ns(&self) -> [&Netns; 5] {
        [
            &self.client,
            &self.node,
            &self.lpod,
            &self.node2,
            &self.rpod,
        ]
    }
}

impl Drop for PacketTopology {
    fn drop(&mut self) {
        self.servers.clear();
        self.cgroup.kill_all();
        // Whatever else a test started in the namespaces (clients, a stray agent).
        for ns in self.all_ns() {
            kill_ns_pids(&ns.name);
        }
        // Namespaces, the cgroup and the bpffs mount go with their guards, the
        // work directory with the mount.
    }
}

/// SIGKILLs every process in network namespace `name` (only ever one of ours).
fn kill_ns_pids(name: &str) {
    let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() else {
        return;
    };
    for pid in String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|p| p.trim().parse::<i32>().ok())
    {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}
