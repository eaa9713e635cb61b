//! A node that runs the Helm chart's pod the way a cluster does: weir-kubelet
//! in API mode on a private [`Containerd`], the agent image `cargo xtask
//! images` builds imported with `ctr`, the chart rendered by Helm's engine and
//! its DaemonSet pod template bound to the node as the DaemonSet controller
//! would bind it.
//!
//! ```text
//!   test API server (loopback) <── relay 127.0.0.1:6443 in the node netns
//!   ┌──────────── node netns ───────────────────────────────────────────┐
//!   │ weir-kubelet ── containerd ── pod weir-<n> (the chart's, hostNet) │
//!   │                            ├─ pod web (busybox httpd) 10.88.0.x  │
//!   │                            └─ pod client: readiness = wget VIP   │
//!   └───────────────────────────────────────────────────────────────────┘
//! ```
//! Paths the chart takes from values point into the test's own directories:
//! bpffs (`bpf.root`) is a private mount in the work dir, and the socket
//! programs attach to the pods' cgroup parent (`cgroup.hostRoot`), a child
//! cgroup the harness made, never the root one.
use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Api;
use serde_json::{Value, json};

use crate::{
    api::{Cluster, Ep, Relay, merge},
    containerd::Containerd,
    helm,
    images::{self, BUSYBOX},
    kubelet::{ConfigOptions, Kubelet, READ_ONLY_PORT, tail, until, write_config},
    manifest::READY,
    release_images,
    topology::{Bpffs, ChildGuard, DIR_PREFIX, cgroup2_root},
};

pub const NODE: &str = "node-chart";
/// The chart's `k8sServiceHost`: a DNS name only the node's own resolver
/// (dnsmasq in the node namespace, the kubelet's `resolvConf`) knows, as after
/// a reboot when no cluster DNS ClusterIP works yet.
pub const API_NAME: &str = "apiserver.weir.test";
pub const NAMESPACE: &str = "kube-system";
pub const API_PORT: u16 = 6443;
/// What the web pod answers, and the client's readiness probe expects.
pub const WEB_TEXT: &str = "served-by-web";

/// Fields drop in declaration order: the kubelet, then containerd (which
/// removes every pod, the agent's too), then the bpffs the agent pinned into.
pub struct ChartNode {
    pub kubelet: Kubelet,
    _relay: Relay,
    _dns: ChildGuard,
    pub cluster: Cluster,
    pub ctrd: Containerd,
    pub bpffs: Bpffs,
    kubeconfig: PathBuf,
    installs: u32,
}

/// Where `cargo xtask test` put the images (`WEIR_IMAGES_DIR`), else
/// target/images-test.
fn images_dir() -> PathBuf {
    std::env::var_os("WEIR_IMAGES_DIR").map_or_else(
        || helm::workspace_root().join("target/images-test"),
        PathBuf::from,
    )
}

/// The agent's image archive, rebuilt from `WEIR_BIN_DIR` when missing or
/// older than the agent binary (so a changed agent is never tested in an
/// old image).
pub fn agent_archive() -> Result<PathBuf> {
    let dir = images_dir();
    let file = release_images::archive_path(&dir, "weir-agent");
    let mtime = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let fresh = mtime(&file)
        .zip(mtime(&crate::bin("weir-agent")))
        .is_some_and(|(image, bin)| image >= bin);
    if !fresh {
        release_images::build_from_harness_bins(&dir)?;
    }
    Ok(file)
}

impl ChartNode {
    pub fn start() -> Result<Self> {
        let archive = agent_archive()?;
        // In a work directory of its own: the guard removes that directory.
        let bpffs = Bpffs::mount(
            std::env::temp_dir()
                .join(format!(
                    "{DIR_PREFIX}{}",
                    crate::topology::unique_id("chart")
                ))
                .join("bpf"),
        )?;
        let ctrd = Containerd::start()?;
        images::import_archive(&ctrd.socket, ctrd.snapshotter, &archive)?;
        // The chart mounts both HostToContainer, which needs shared mounts in
        // the node's (containerd's) mount namespace.
        let cgroup = pods_cgroup(&ctrd)?;
        std::fs::create_dir_all(&cgroup)?;
        ctrd.share_host_dir(&bpffs.dir)?;
        ctrd.share_host_dir(&cgroup)?;
        let cluster = Cluster::start_with_names(&[API_NAME])?;
        let NodeWiring {
            to_api,
            dns,
            kubeconfig,
            config,
        } = NodeWiring::new(&ctrd, &cluster, None)?;
        let kubelet = Kubelet::start(&ctrd, &config, Some(&kubeconfig), NODE)?;
        Ok(Self {
            kubelet,
            _relay: to_api,
            _dns: dns,
            cluster,
            ctrd,
            bpffs,
            kubeconfig,
            installs: 0,
        })
    }

    /// The values every install here needs: the test's bpffs and cgroup, the
    /// kubeconfig (no service-account tokens yet), socket LB only (the node
    /// has no external device), and no SYS_RESOURCE, which root here lacks
    /// in its bounding set (this machine's limit, not the chart's) and runc
    /// cannot grant. `extra` is merged over them.
    fn values(&self, extra: &Value) -> Result<PathBuf> {
        let cgroup = pods_cgroup(&self.ctrd)?;
        let mut v = json!({
            "k8sServiceHost": API_NAME,
            "k8sServicePort": API_PORT,
            "bpf": {"root": self.bpffs.dir},
            "cgroup": {"hostRoot": cgroup},
            "devices": [],
            "memlockCapability": false,
            "extraArgs": ["--kubeconfig=/etc/weir/kubeconfig"],
            "extraVolumes": [{"name": "kubeconfig",
                              "hostPath": {"path": self.kubeconfig, "type": "File"}}],
            "extraVolumeMounts": [{"name": "kubeconfig",
                                   "mountPath": "/etc/weir/kubeconfig", "readOnly": true}],
        });
        merge(&mut v, extra.clone());
        let path = self.ctrd.dir.join(format!("values-{}.yaml", self.installs));
        std::fs::write(&path, serde_json::to_string(&v)?)?;
        Ok(path)
    }

    /// `helm template` with `extra` values; the rendered objects.
    pub fn render(&self, extra: &Value) -> Result<Vec<Value>> {
        helm::template(NAMESPACE, &self.values(extra)?)
    }

    /// Renders the chart and creates its DaemonSet's pod on this node, as the
    /// DaemonSet controller does on install or on a template change. Returns
    /// the pod's name.
    pub fn install(&mut self, extra: &Value) -> Result<String> {
        let docs = self.render(extra)?;
        let ds = helm::object(&docs, "DaemonSet")?;
        // The pod runs as the chart's ServiceAccount, which the API server's
        // admission wants to exist, as `kubectl apply` of the chart makes it.
        let sa = helm::object(&docs, "ServiceAccount")?;
        self.cluster
            .upsert(&self.cluster.api::<ServiceAccount>(NAMESPACE), sa.clone())?;
        self.installs += 1;
        let name = format!("weir-{}", self.installs);
        let pod = pod_from_template(ds, &name)?;
        self.cluster.upsert(&self.pods(NAMESPACE), pod)?;
        Ok(name)
    }

    /// Deletes a pod and waits until the kubelet has removed it.
    pub fn remove_pod(&self, namespace: &str, name: &str) -> Result<()> {
        let pods = self.pods(namespace);
        self.cluster.delete(&pods, name)?;
        self.until(&format!("{name} gone"), Duration::from_secs(60), || {
            Ok(self
                .cluster
                .block_on(pods.get_opt(name))?
                .is_none()
                .then_some(()))
        })
    }

    pub fn pods(&self, namespace: &str) -> Api<Pod> {
        self.cluster.api(namespace)
    }

    pub fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>> {
        Ok(self.cluster.block_on(self.pods(namespace).get_opt(name))?)
    }

    /// Waits for a pod to be Running with its Ready condition True; on
    /// failure says what the pod's status and its containers' logs show.
    pub fn wait_ready(&self, namespace: &str, name: &str, within: Duration) -> Result<Pod> {
        self.until(&format!("{name} Running and Ready"), within, || {
            Ok(self
                .get_pod(namespace, name)?
                .filter(|p| phase(p) == "Running" && condition(p, "Ready")))
        })
        .map_err(|e| {
            let status = self
                .get_pod(namespace, name)
                .ok()
                .flatten()
                .and_then(|p| serde_json::to_string_pretty(&p.status).ok())
                .unwrap_or_default();
            e.context(format!(
                "{namespace}/{name} status: {status}\nits logs:\n{}",
                self.pod_logs(namespace, name)
            ))
        })
    }

    /// [`until`] with this node's kubelet.
    pub fn until<T>(
        &self,
        what: &str,
        within: Duration,
        f: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        until(&self.kubelet, what, within, f)
    }

    /// A busybox httpd pod and a Service `web` at `vip` in front of it, with
    /// the EndpointSlice a controller would write. Returns the pod's IP.
    pub fn web_service(&self, vip: &str) -> Result<String> {
        let pods = self.pods("default");
        self.cluster.upsert(
            &pods,
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
                   "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                            "containers": [{"name": "httpd", "image": BUSYBOX,
                                "imagePullPolicy": "IfNotPresent",
                                "command": ["sh", "-c", format!(
                                    "mkdir -p /www && echo {WEB_TEXT} > /www/index.html && exec httpd -f -p 8080 -h /www")]}]}}),
        )?;
        let ip = self.until("web Running", Duration::from_secs(60), || {
            Ok(self
                .get_pod("default", "web")?
                .filter(|p| phase(p) == "Running")
                .and_then(|p| p.status.and_then(|s| s.pod_ip)))
        })?;
        self.cluster
            .service("web", vip, json!({"selector": {"app": "web"}}))?;
        self.cluster.slice(
            "web-1",
            "web",
            &[Ep::new(ip.parse().context("pod IP")?, READY).on(NODE)],
        )?;
        Ok(ip)
    }

    /// A pod whose readiness is an HTTP request to `vip`, expecting the web
    /// pod's text: Ready means the ClusterIP worked from a pod on this node.
    pub fn client_reaches(&self, name: &str, vip: &str, within: Duration) -> Result<()> {
        // No -T: busybox 1.35's wget segfaults with it; the probe's timeout bounds it.
        let probe = format!("wget -qO- http://{vip}/ | grep -qx {WEB_TEXT}");
        self.cluster.upsert(
            &self.pods("default"),
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": "default"},
                   "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                            "containers": [{"name": "client", "image": BUSYBOX,
                                "imagePullPolicy": "IfNotPresent",
                                "command": ["sleep", "3600"],
                                "readinessProbe": {
                                    "exec": {"command": ["sh", "-c", probe]},
                                    "periodSeconds": 1, "timeoutSeconds": 3}}]}}),
        )?;
        self.wait_ready("default", name, within)
            .map(drop)
            .map_err(|e| {
                let agents: Vec<String> = self
                    .cluster
                    .block_on(self.pods(NAMESPACE).list(&Default::default()))
                    .map(|l| {
                        l.items
                            .into_iter()
                            .filter_map(|p| p.metadata.name)
                            .collect()
                    })
                    .unwrap_or_default();
                let logs: String = agents
                    .iter()
                    .map(|a| self.pod_logs(NAMESPACE, a))
                    .collect::<Vec<_>>()
                    .join("\n");
                e.context(format!(
                    "inspect services: {}\nagent logs:\n{logs}",
                    self.inspect_services().unwrap_or_else(|e| format!("{e:#}"))
                ))
            })
    }

    /// `weir-agent inspect services` on the pins the pod made on the host.
    pub fn inspect_services(&self) -> Result<String> {
        let out = std::process::Command::new(crate::bin("weir-agent"))
            .args(["inspect", "services", "--bpffs"])
            .arg(self.pin_dir())
            .output()?;
        ensure!(
            out.status.success(),
            "inspect services: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Where the chart's agent pins (`--bpffs=<bpf.root>/weir`).
    pub fn pin_dir(&self) -> PathBuf {
        self.bpffs.dir.join("weir")
    }

    /// Every attempt's log of a container of a pod, read where the kubelet
    /// writes them (`<pod-logs>/<ns>_<pod>_<uid>/<container>/<n>.log`).
    pub fn container_log(&self, namespace: &str, pod: &str, container: &str) -> String {
        self.log_files(namespace, pod, Some(container))
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap_or_default())
            .collect()
    }

    /// Every container's logs of a pod, each file headed by its path.
    fn pod_logs(&self, namespace: &str, pod: &str) -> String {
        self.log_files(namespace, pod, None)
            .iter()
            .map(|f| {
                let text = std::fs::read_to_string(f).unwrap_or_default();
                format!("--- {}\n{}", f.display(), tail(&text, 20))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn log_files(&self, namespace: &str, pod: &str, container: Option<&str>) -> Vec<PathBuf> {
        let prefix = format!("{namespace}_{pod}_");
        let mut files = Vec::new();
        for dir in std::fs::read_dir(self.ctrd.dir.join("pod-logs"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if !dir.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            for c in std::fs::read_dir(dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                if container.is_some_and(|want| c.file_name() != want) {
                    continue;
                }
                files.extend(
                    std::fs::read_dir(c.path())
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|e| e.path()),
                );
            }
        }
        files.sort();
        files
    }
}

/// What an API-mode node needs before its kubelet starts: the relay to the
/// API server at `127.0.0.1:6443` of the node namespace, a kubeconfig for
/// it, the node's resolver (which knows [`API_NAME`]) and the kubelet's
/// config, with `client_ca` as its client CA if the API server is to reach
/// the kubelet (logs, exec).
pub struct NodeWiring {
    pub to_api: Relay,
    pub dns: ChildGuard,
    pub kubeconfig: PathBuf,
    pub config: PathBuf,
}

impl NodeWiring {
    pub fn new(ctrd: &Containerd, cluster: &Cluster, client_ca: Option<PathBuf>) -> Result<Self> {
        let to_api = Relay::start_in_netns(&ctrd.node, API_PORT, cluster.server.addr())?;
        let kubeconfig = cluster.kubeconfig_via(
            &format!("https://127.0.0.1:{API_PORT}"),
            &ctrd.dir.join("kubeconfig"),
        )?;
        let dns = node_resolver(&ctrd.node)?;
        let resolv_conf = ctrd.dir.join("node-resolv.conf");
        std::fs::write(&resolv_conf, "nameserver 127.0.0.1\n")?;
        let config = write_config(
            ctrd,
            &ConfigOptions {
                read_only_port: Some(READ_ONLY_PORT),
                resolv_conf: Some(resolv_conf),
                client_ca_file: client_ca,
                ..ConfigOptions::default()
            },
        )?;
        Ok(Self {
            to_api,
            dns,
            kubeconfig,
            config,
        })
    }
}

/// dnsmasq on the node namespace's loopback: the node's resolver, which
/// knows [`API_NAME`] and nothing else.
pub fn node_resolver(node: &crate::topology::Netns) -> Result<ChildGuard> {
    let mut cmd = node.command(std::path::Path::new("dnsmasq"));
    cmd.args([
        "--keep-in-foreground",
        "--conf-file=/dev/null",
        "--no-resolv",
        "--no-hosts",
        "--listen-address=127.0.0.1",
        "--bind-interfaces",
        "--pid-file=",
    ])
    .arg(format!("--address=/{API_NAME}/127.0.0.1"))
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    let guard = ChildGuard(cmd.spawn().context("dnsmasq (dnsmasq-base)")?);
    for _ in 0..50 {
        let out = node
            .command(std::path::Path::new("dig"))
            .args(["+short", "+time=1", "+tries=1", "@127.0.0.1", API_NAME])
            .output()?;
        if String::from_utf8_lossy(&out.stdout).trim() == "127.0.0.1" {
            return Ok(guard);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("the node's dnsmasq does not answer for {API_NAME}")
}

/// The pods' cgroup parent in the cgroup2 hierarchy, where the chart's
/// socket programs attach: they see this node's pods and nothing else.
pub fn pods_cgroup(ctrd: &Containerd) -> Result<PathBuf> {
    Ok(cgroup2_root()?.join(ctrd.cgroup_parent().trim_start_matches('/')))
}

/// What the DaemonSet controller does with the template: a pod bound to one
/// node, every field as rendered.
pub fn pod_from_template(ds: &Value, name: &str) -> Result<Value> {
    let template = &ds["spec"]["template"];
    let mut spec = template["spec"].clone();
    spec["nodeName"] = json!(NODE);
    Ok(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE,
                     "labels": template["metadata"]["labels"].clone()},
        "spec": spec,
    }))
}

pub fn condition(pod: &Pod, kind: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == kind && c.status == "True"))
}

pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}
