//! The network between a [`super::LocalCluster`]'s nodes: a bridge in a
//! namespace of its own, each node's `eth0` on it, routes to every other
//! node's pod subnet, and an outside namespace on the same wire, for
//! NodePort clients that are no node at all.
//!
//! ```text
//!   wt-<id>-u:  ul0 192.168.77.1/24 ─┬─ n1 ── eth0 192.168.77.11  node-1 (pods 10.88.1.0/24)
//!                                    ├─ n2 ── eth0 192.168.77.12  node-2 (pods 10.88.2.0/24)
//!                                    └─ x0 ── eth0 192.168.77.2   wt-<id>-x (outside client)
//! ```
//! Nothing here touches the root namespace: every veth is created with both
//! ends inside their namespaces, and the nodes' default route ends at
//! `ul0`, which forwards nowhere.
use std::net::Ipv4Addr;

use anyhow::Result;

use crate::{
    containerd::PodNet,
    topology::{NETNS_PREFIX, Netns, veth},
};

const BRIDGE: &str = "ul0";
/// The bridge's address, every node's default gateway.
const GATEWAY: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 1);
/// The outside client's address.
pub const OUTSIDE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 77, 2);

/// Node `index` (1-based)'s address on the underlay.
pub fn node_ip(index: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 77, 10 + index)
}

/// The underlay's namespace and the outside client's; deleting them takes
/// every veth with it.
pub struct Underlay {
    pub wire: Netns,
    /// A host on the underlay that is no node: NodePort clients run here.
    pub outside: Netns,
}

impl Underlay {
    pub fn create(id: &str) -> Result<Self> {
        let wire = Netns::create(format!("{NETNS_PREFIX}{id}-u"))?;
        wire.sh(&format!(
            "ip link set lo up && ip link add {BRIDGE} type bridge && \
             ip addr add {GATEWAY}/24 dev {BRIDGE} && ip link set {BRIDGE} up"
        ))?;
        let outside = Netns::create(format!("{NETNS_PREFIX}{id}-x"))?;
        veth(&wire, "x0", &outside, "eth0")?;
        wire.sh(&format!(
            "ip link set x0 master {BRIDGE} && ip link set x0 up"
        ))?;
        outside.sh(&format!(
            "ip link set lo up && ip addr add {OUTSIDE_IP}/24 dev eth0 && ip link set eth0 up"
        ))?;
        Ok(Self { wire, outside })
    }

    /// Puts node `index`'s namespace on the wire as `eth0` with its default
    /// route there, and makes it forward: its pods' packets to other nodes,
    /// and NodePort traffic to pods elsewhere, leave through `eth0`.
    pub fn attach(&self, node: &Netns, index: u8) -> Result<()> {
        let port = format!("n{index}");
        veth(&self.wire, &port, node, "eth0")?;
        self.wire.sh(&format!(
            "ip link set {port} master {BRIDGE} && ip link set {port} up"
        ))?;
        node.sh(&format!(
            "ip addr add {}/24 dev eth0 && ip link set eth0 up && \
             ip route add default via {GATEWAY} && sysctl -qw net.ipv4.ip_forward=1",
            node_ip(index)
        ))
    }

    /// Routes from node `index` to the pod subnet of every node in `all`.
    pub fn route_pods(node: &Netns, index: u8, all: &[u8]) -> Result<()> {
        for &peer in all.iter().filter(|&&p| p != index) {
            node.sh(&format!(
                "ip route add {} via {}",
                PodNet { index: peer }.subnet(),
                node_ip(peer)
            ))?;
        }
        Ok(())
    }
}
