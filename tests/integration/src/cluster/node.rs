//! One node of a [`super::LocalCluster`]: weir-kubelet in API mode on a
//! containerd of its own, in a namespace on the underlay, with the host
//! paths the chart's agent uses mounted in the node's own mount namespace.
//!
//! ```text
//!   ┌──────────── node-<i> (netns + containerd's mount and PID namespaces) ───┐
//!   │ eth0 192.168.77.1<i> (underlay)    weir-cni0 10.88.<i>.1 ─ pods         │
//!   │ 127.0.0.1:6443  relay → test API server (root loopback)                 │
//!   │ 127.0.0.1:53    dnsmasq: apiserver.weir.test → 127.0.0.1                │
//!   │ 127.0.0.1:10250 weir-kubelet (relayed to for logs, exec, port-forward)  │
//!   │ <cluster>/host/bpf     a bpffs of this node's own                      │
//!   │ <cluster>/host/cgroup  bind of this node's pods' cgroup2 parent        │
//!   └─────────────────────────────────────────────────────────────────────────┘
//! ```
//! The chart is installed once for the cluster, so `bpf.root` and
//! `cgroup.hostRoot` are one path for every node; each node's mount
//! namespace puts its own bpffs and cgroup there, as every machine of a real
//! cluster has its own /sys/fs/bpf. The root namespace sees empty
//! directories, and nothing attaches to a cgroup the test did not make.
use std::{net::Ipv4Addr, path::Path, time::Duration};

use anyhow::{Context as _, Result};

use crate::{
    api::{Cluster, Relay},
    chart_node::{NodeWiring, pods_cgroup},
    containerd::{Containerd, PodNet},
    images,
    kubelet::Kubelet,
    topology::ChildGuard,
};

use super::underlay::{Underlay, node_ip};

/// The kubelet's port, on the node namespace's loopback.
pub const KUBELET_PORT: u16 = 10250;

/// Fields drop in order: the kubelet (SIGKILL), the relays and resolver,
/// then containerd, which removes every pod and takes the node's mount
/// namespace (and its bpffs) with it.
pub struct ClusterNode {
    pub name: String,
    pub index: u8,
    pub ip: Ipv4Addr,
    pub kubelet: Kubelet,
    _to_kubelet: Relay,
    _to_api: Relay,
    _dns: ChildGuard,
    pub ctrd: Containerd,
}

impl ClusterNode {
    /// Starts node `node-<index>`: containerd on pod subnet 10.88.<index>.0/24
    /// with `images` imported, the node's view of `host` (see the module
    /// doc), then the kubelet, which registers the Node.
    pub fn start(
        api: &Cluster,
        underlay: &Underlay,
        index: u8,
        host: &Path,
        archives: &[&Path],
    ) -> Result<Self> {
        let name = format!("node-{index}");
        let ctrd = Containerd::start_on(PodNet { index })?;
        underlay.attach(&ctrd.node, index)?;
        for archive in archives {
            images::import_archive(&ctrd.socket, ctrd.snapshotter, archive)
                .with_context(|| format!("{name}: importing {}", archive.display()))?;
        }
        mount_host_view(&ctrd, host)?;
        let NodeWiring {
            to_api,
            dns,
            kubeconfig,
            config,
        } = NodeWiring::new(&ctrd, api, Some(api.server.ca_path().to_path_buf()))?;
        let to_kubelet = Relay::start_into_netns(&ctrd.node, KUBELET_PORT)?;
        api.server.route_kubelet(&name, to_kubelet.addr);
        let ip = node_ip(index);
        let mut kubelet = Kubelet::start_at(&ctrd, &config, Some(&kubeconfig), &name, ip)?;
        kubelet.wait_serving(Duration::from_secs(60))?;
        Ok(Self {
            name,
            index,
            ip,
            kubelet,
            _to_kubelet: to_kubelet,
            _to_api: to_api,
            _dns: dns,
            ctrd,
        })
    }

    /// Runs `script` in the node's mount and PID namespaces and its network
    /// namespace: what a shell on the machine would see.
    pub fn sh(&self, script: &str) -> Result<String> {
        let out = std::process::Command::new("nsenter")
            .arg(format!("--target={}", self.ctrd.pid()))
            .args(["--mount", "--pid", "--net", "--", "sh", "-c", script])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "{}: {script}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `weir-agent inspect services` on this node's pins.
    pub fn inspect_services(&self, host: &Path) -> Result<String> {
        self.sh(&format!(
            "{} inspect services --bpffs {}",
            crate::bin("weir-agent").display(),
            host.join("bpf/weir").display()
        ))
    }
}

/// In the node's mount namespace: a bpffs of its own at `<host>/bpf` and
/// its pods' cgroup2 parent bound at `<host>/cgroup`, both shared mounts
/// (the chart mounts them HostToContainer).
fn mount_host_view(ctrd: &Containerd, host: &Path) -> Result<()> {
    let cgroup = pods_cgroup(ctrd)?;
    std::fs::create_dir_all(&cgroup)?;
    let (bpf, cg) = (host.join("bpf"), host.join("cgroup"));
    ctrd.node_mount_sh(&format!(
        "mount -t bpf bpf '{b}' && mount --make-rshared '{b}' && \
         mount --bind '{c}' '{g}' && mount --make-rshared '{g}'",
        b = bpf.display(),
        c = cgroup.display(),
        g = cg.display(),
    ))
    .map(drop)
    .with_context(|| format!("mounting the node's view of {}", host.display()))
}
