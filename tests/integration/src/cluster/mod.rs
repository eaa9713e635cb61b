//! A whole cluster on one machine: the test API server, the test control
//! plane, and N nodes that each run weir-kubelet on a containerd of their
//! own, with weir-agent installed the way users install it (the chart
//! rendered by Helm, `kubectl apply`, the DaemonSet controller's pods run by
//! weir-kubelet from the locally built image). `cargo xtask cluster up`
//! serves one until `down`; the drills build one per test.
//!
//! ```text
//!   root namespace: test API server 127.0.0.1:<port> + control plane + kubectl
//!        ▲ relays (loopback at both ends)
//!   ┌────┴──── node-1 ───────────┐   ┌──────── node-2 ───────────┐
//!   │ weir-kubelet ─ containerd  │   │ weir-kubelet ─ containerd │
//!   │ pods 10.88.1.0/24          │   │ pods 10.88.2.0/24         │
//!   │ weir-agent (DaemonSet pod) │   │ weir-agent                │
//!   └──── eth0 192.168.77.11 ────┘   └──── eth0 192.168.77.12 ───┘
//!              └──────── ul0 (underlay netns) ──────┴── outside 192.168.77.2
//! ```
//! Every part is a guard: dropping the cluster stops the control plane,
//! the kubelets, every pod and containerd, and deletes the namespaces,
//! mounts, cgroups and the work directory.
mod node;
pub mod underlay;
mod workload;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, Result, ensure};
use serde_json::json;
use weir_test_controlplane::ControlPlane;

pub use node::{ClusterNode, KUBELET_PORT};
pub use underlay::{OUTSIDE_IP, Underlay};
pub use workload::Tally;

use crate::{
    api::Cluster,
    chart_node::{API_NAME, agent_archive},
    helm,
    images::{self, Image},
    topology::{DIR_PREFIX, unique_id},
};

/// The namespace the chart goes into.
pub const AGENT_NAMESPACE: &str = "kube-system";
/// The sample workload image every node has: busybox whose default command
/// serves its hostname (the pod's name) over HTTP on port 8080.
pub const SAMPLE_IMAGE: &str = "weir.test/sample:1";
/// The port the sample image serves on.
pub const SAMPLE_PORT: u16 = 8080;

#[derive(Clone, Debug)]
pub struct Options {
    pub nodes: u8,
    /// The control plane's `nodeMonitorGracePeriod`.
    pub node_monitor_grace_period: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            nodes: 2,
            node_monitor_grace_period: Duration::from_secs(40),
        }
    }
}

pub struct LocalCluster {
    control_plane: Option<ControlPlane>,
    pub nodes: Vec<ClusterNode>,
    pub underlay: Underlay,
    pub api: Cluster,
    /// The work directory; `host/` holds the paths the chart uses.
    pub dir: PathBuf,
}

impl LocalCluster {
    /// Starts everything, installs the chart and returns once every node is
    /// Ready and runs a Ready agent pod. `progress` hears each step.
    pub fn up(options: &Options, mut progress: impl FnMut(&str)) -> Result<Self> {
        ensure!(
            (1..=9).contains(&options.nodes),
            "--nodes {}: from 1 to 9",
            options.nodes
        );
        let id = unique_id("k");
        let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{id}"));
        let host = dir.join("host");
        for d in ["bpf", "cgroup"] {
            std::fs::create_dir_all(host.join(d))?;
        }
        progress("building the agent image");
        let agent = agent_archive()?;
        let sample = sample_archive(&dir)?;
        progress("starting the API server");
        let api = Cluster::start_with_names(&[API_NAME])?;
        let underlay = Underlay::create(&id)?;
        let mut cluster = Self {
            control_plane: None,
            nodes: Vec::new(),
            underlay,
            api,
            dir,
        };
        for index in 1..=options.nodes {
            progress(&format!("starting node-{index}"));
            let node = ClusterNode::start(
                &cluster.api,
                &cluster.underlay,
                index,
                &host,
                &[&agent, &sample],
            )?;
            cluster.nodes.push(node);
        }
        let all: Vec<u8> = cluster.nodes.iter().map(|n| n.index).collect();
        for n in &cluster.nodes {
            Underlay::route_pods(&n.ctrd.node, n.index, &all)?;
        }
        progress("starting the control plane");
        let cp_options = weir_test_controlplane::Options {
            node_monitor_grace_period: options.node_monitor_grace_period,
            ..Default::default()
        };
        cluster.control_plane = Some(cluster.api.block_on(ControlPlane::start_with(
            cluster.api.client.clone(),
            cp_options,
        )));
        crate::eventually("every node Ready", Duration::from_secs(60), || {
            let out = cluster.kubectl_ok(&[
                "get",
                "nodes",
                "-o",
                "jsonpath={range .items[*]}{.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
            ])?;
            Ok((out.lines().filter(|l| *l == "True").count() == cluster.nodes.len()).then_some(()))
        })?;
        progress("installing weir-agent: helm template | kubectl apply");
        cluster.install_agent()?;
        progress("waiting for the agent pods");
        cluster.wait_agents_ready(Duration::from_secs(120))?;
        Ok(cluster)
    }

    /// The kubeconfig for kubectl on the root namespace.
    pub fn kubeconfig(&self) -> &Path {
        self.api.kubeconfig()
    }

    /// `kubectl --kubeconfig …`, with a request timeout.
    pub fn kubectl(&self) -> Command {
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(["--request-timeout", "30s"]);
        c
    }

    /// Runs kubectl with `args`; its stdout, or an error with its stderr.
    pub fn kubectl_ok(&self, args: &[&str]) -> Result<String> {
        let out = self.kubectl().args(args).output()?;
        ensure!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The chart's values for this cluster: the per-node host paths (see
    /// [`node`]), the API server by the name every node resolves, and no
    /// SYS_RESOURCE, which root here cannot grant (kernel 6.18 charges BPF
    /// maps to the memory cgroup, so the agent does not need it).
    fn values(&self) -> serde_json::Value {
        let host = self.dir.join("host");
        json!({
            "k8sServiceHost": API_NAME,
            "k8sServicePort": crate::chart_node::API_PORT,
            "bpf": {"root": host.join("bpf")},
            "cgroup": {"hostRoot": host.join("cgroup")},
            "memlockCapability": false,
            // A bridge CNI: replies from a local pod to NodePort traffic
            // SNATed to the bridge's address are translated on the bridge
            // (the route's device), as helm/weir/README.md says.
            "devices": ["auto", crate::containerd::BRIDGE],
        })
    }

    /// `helm template` of helm/weir, then `kubectl apply -f` of what it
    /// printed.
    pub fn install_agent(&self) -> Result<()> {
        let values = self.dir.join("values.yaml");
        std::fs::write(&values, serde_json::to_string_pretty(&self.values())?)?;
        let rendered = self.dir.join("weir.yaml");
        std::fs::write(&rendered, helm::render(AGENT_NAMESPACE, &values)?)?;
        let file = rendered.display().to_string();
        self.kubectl_ok(&["apply", "-f", &file]).map(drop)
    }

    /// Waits until the DaemonSet has a Ready, up-to-date pod on every node.
    pub fn wait_agents_ready(&self, within: Duration) -> Result<()> {
        let want = self.nodes.len().to_string();
        crate::eventually("weir-agent Ready on every node", within, || {
            let out = self.kubectl_ok(&[
                "-n",
                AGENT_NAMESPACE,
                "get",
                "daemonset",
                "weir",
                "-o",
                "jsonpath={.status.numberReady} {.status.updatedNumberScheduled}",
            ])?;
            Ok(
                (out.split_whitespace().all(|n| n == want) && out.split_whitespace().count() == 2)
                    .then_some(()),
            )
        })
        .map_err(|e| e.context(self.diagnose()))
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Result<&ClusterNode> {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .with_context(|| format!("no node {name}"))
    }

    pub fn node_mut(&mut self, name: &str) -> Result<&mut ClusterNode> {
        self.nodes
            .iter_mut()
            .find(|n| n.name == name)
            .with_context(|| format!("no node {name}"))
    }

    /// The directory whose `bpf/` and `cgroup/` each node sees as its own.
    pub fn host_dir(&self) -> PathBuf {
        self.dir.join("host")
    }

    /// What a failed wait should show: pods everywhere, and each agent's
    /// log tail.
    pub fn diagnose(&self) -> String {
        let pods = self
            .kubectl_ok(&["get", "pods", "-A", "-o", "wide"])
            .unwrap_or_else(|e| format!("{e:#}"));
        let logs = self
            .kubectl_ok(&[
                "-n",
                AGENT_NAMESPACE,
                "logs",
                "-l",
                "app.kubernetes.io/name=weir",
                "--tail",
                "30",
                "--prefix",
            ])
            .unwrap_or_else(|e| format!("{e:#}"));
        let kubelets: String = self
            .nodes
            .iter()
            .map(|n| {
                format!(
                    "--- {} kubelet\n{}\n",
                    n.name,
                    crate::kubelet::tail(&n.kubelet.log_text(), 15)
                )
            })
            .collect();
        format!("pods:\n{pods}\nagent logs:\n{logs}\n{kubelets}")
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        // The control plane first, so nothing recreates what goes next;
        // then the nodes, whose containerds remove every pod; the API
        // server and namespaces with their fields.
        self.control_plane = None;
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// [`SAMPLE_IMAGE`] as an OCI archive in `dir`.
fn sample_archive(dir: &Path) -> Result<PathBuf> {
    let mut image: Image = images::busybox_plus(SAMPLE_IMAGE, &[])?;
    image.cmd = vec![
        "sh".into(),
        "-c".into(),
        format!(
            "mkdir -p /tmp/www && hostname > /tmp/www/index.html && \
             exec httpd -f -p {SAMPLE_PORT} -h /tmp/www"
        ),
    ];
    let file = dir.join("sample.oci.tar");
    std::fs::write(&file, images::oci_archive(&image)?)?;
    Ok(file)
}
