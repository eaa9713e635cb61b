//! weir-kubelet as a process on a [`Containerd`] node: launched in the node
//! namespace with nsenter (so its ports and its pods' traffic never touch the
//! root namespace), standalone or against an API server, and read back through
//! its read-only port.
use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;

use crate::{bin, containerd::Containerd, topology::ChildGuard};

/// The read-only port the tests, the demo and the bench use: kubelet's usual one.
pub const READ_ONLY_PORT: u16 = 10255;

/// A running weir-kubelet. SIGKILLed on drop, so its pods keep running until
/// the [`Containerd`] guard removes them.
pub struct Kubelet {
    child: Option<ChildGuard>,
    args: Vec<String>,
    log: PathBuf,
    netns: String,
    /// The node name it runs as (`--hostname-override`).
    pub node: String,
    /// The Node's InternalIP, and the pod IP of its host-network pods.
    pub node_ip: std::net::Ipv4Addr,
    read_only_port: Option<u16>,
}

/// One node in API-server mode: weir-kubelet on its own containerd, reaching
/// the test API server through a relay at `127.0.0.1:6443` of the node
/// namespace. Fields drop in order: the kubelet (SIGKILL), the relay, the
/// API server, then containerd, which takes the pods with it.
pub struct ApiNode {
    pub kubelet: Kubelet,
    pub relay: crate::api::Relay,
    pub cluster: crate::api::Cluster,
    pub ctrd: Containerd,
}

impl ApiNode {
    /// The API server's port inside the node namespace.
    pub const API_PORT: u16 = 6443;

    pub fn start(node: &str, opts: &ConfigOptions) -> Result<Self> {
        Self::start_with(node, opts, |_| Ok(()))
    }

    /// Like [`Self::start`], running `prepare` on containerd's node before
    /// the kubelet starts (a tmpfs as its root directory, say).
    pub fn start_with(
        node: &str,
        opts: &ConfigOptions,
        prepare: impl FnOnce(&Containerd) -> Result<()>,
    ) -> Result<Self> {
        let ctrd = Containerd::start()?;
        prepare(&ctrd)?;
        let cluster = crate::api::Cluster::start()?;
        let relay =
            crate::api::Relay::start_in_netns(&ctrd.node, Self::API_PORT, cluster.server.addr())?;
        let kubeconfig = cluster.kubeconfig_via(
            &format!("https://127.0.0.1:{}", Self::API_PORT),
            &ctrd.dir.join("kc"),
        )?;
        let config = write_config(&ctrd, opts)?;
        let kubelet = Kubelet::start(&ctrd, &config, Some(&kubeconfig), node)?;
        Ok(Self {
            kubelet,
            relay,
            cluster,
            ctrd,
        })
    }
}

/// What goes into the KubeletConfiguration [`write_config`] writes.
#[derive(Clone, Debug, Default)]
pub struct ConfigOptions {
    pub static_dir: Option<PathBuf>,
    /// Served on 127.0.0.1 of the node namespace; `None` leaves it off.
    pub read_only_port: Option<u16>,
    /// The node's resolv.conf (`resolvConf`); `None` keeps the kubelet's
    /// default, the machine's /etc/resolv.conf.
    pub resolv_conf: Option<PathBuf>,
    /// `authentication.x509.clientCAFile`: the CA of the API server's
    /// kubelet client certificate, so that it may proxy logs and streams.
    pub client_ca_file: Option<PathBuf>,
    /// The eviction settings, as YAML lines. `None` writes what kind does:
    /// the default memory threshold and disk eviction off, because the
    /// build machines' disks run fuller than the kubelet's 10% default;
    /// disk eviction is tested on a tmpfs of its own.
    pub eviction: Option<String>,
}

impl Kubelet {
    /// Starts the kubelet as node `node`; API-server mode with a kubeconfig,
    /// standalone without. Returns once the process runs: use
    /// [`Self::wait_serving`] to wait for its read-only port.
    pub fn start(
        ctrd: &Containerd,
        config: &Path,
        kubeconfig: Option<&Path>,
        node: &str,
    ) -> Result<Self> {
        Self::start_at(ctrd, config, kubeconfig, node, ctrd.pod_net.gateway())
    }

    /// Like [`Self::start`], with `node_ip` as the node's address (a
    /// cluster node's underlay address rather than its bridge's).
    pub fn start_at(
        ctrd: &Containerd,
        config: &Path,
        kubeconfig: Option<&Path>,
        node: &str,
        node_ip: std::net::Ipv4Addr,
    ) -> Result<Self> {
        let dir = &ctrd.dir;
        let mut args = vec!["--config".into(), config.display().to_string()];
        if let Some(kc) = kubeconfig {
            args.extend(["--kubeconfig".into(), kc.display().to_string()]);
        }
        args.extend([
            "--hostname-override".into(),
            node.into(),
            "--root-dir".into(),
            dir.join("kubelet").display().to_string(),
            "--pod-logs-dir".into(),
            dir.join("pod-logs").display().to_string(),
            // Under the harness's parent, so containerd's cleanup finds the pods.
            "--cgroup-root".into(),
            ctrd.cgroup_parent(),
        ]);
        let mut k = Self {
            child: None,
            args,
            log: dir.join("kubelet.log"),
            netns: ctrd.node.path(),
            node: node.to_owned(),
            node_ip,
            read_only_port: read_only_port_of(config),
        };
        k.spawn()?;
        Ok(k)
    }

    /// Starts (or restarts, after [`Self::kill9`]) the process, appending to
    /// the same log.
    pub fn spawn(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.netns))
            .arg(bin("weir-kubelet"))
            .args(&self.args)
            .env("WEIR_KUBELET_NODE_IP", self.node_ip.to_string())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        // SAFETY: prctl is async-signal-safe; the kernel kills the kubelet if
        // the test dies before its guards run. nsenter --net execs without
        // forking, so the kubelet itself keeps the death signal.
        unsafe {
            use std::os::unix::process::CommandExt as _;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        self.child = Some(ChildGuard(cmd.spawn().context("starting weir-kubelet")?));
        Ok(())
    }

    pub fn kill9(&mut self) {
        // Dropping the guard SIGKILLs and reaps it: the kubelet gets no chance
        // to clean anything up, as after an OOM kill.
        self.child = None;
    }

    /// SIGTERM, then waits for the exit; the pods keep running.
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut guard) = self.child.take() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(i32::try_from(guard.0.id())?, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while guard.0.try_wait()?.is_none() {
                if Instant::now() > deadline {
                    // The guard's drop SIGKILLs it.
                    bail!("weir-kubelet ignored SIGTERM for 10 s");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// The kubelet's own pid (nsenter has exec'd into it).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.0.id())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Fails with the log if the process has exited.
    fn ensure_running(&mut self) -> Result<()> {
        if let Some(status) = self
            .child
            .as_mut()
            .and_then(|c| c.0.try_wait().ok().flatten())
        {
            bail!("weir-kubelet exited with {status}:\n{}", self.log_text());
        }
        Ok(())
    }

    /// `GET /pods` on the read-only port, inside the node namespace.
    pub fn pods(&self) -> Result<Vec<Pod>> {
        let port = self
            .read_only_port
            .context("the kubelet's config has no readOnlyPort")?;
        let (code, body) = http_get_in(&self.netns, port, "/pods")?;
        ensure!(code == 200, "/pods answered {code}: {body}");
        #[derive(Deserialize)]
        struct PodList {
            #[serde(default)]
            items: Vec<Pod>,
        }
        Ok(serde_json::from_str::<PodList>(&body)
            .context("/pods is not a PodList")?
            .items)
    }

    /// Waits until the read-only port answers `/pods`.
    pub fn wait_serving(&mut self, within: Duration) -> Result<()> {
        let start = Instant::now();
        loop {
            self.ensure_running()?;
            if self.pods().is_ok() {
                return Ok(());
            }
            if start.elapsed() > within {
                bail!(
                    "the read-only port did not answer within {within:?}\nkubelet log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls `/pods` every `every` until `f` picks something, or fails with
    /// the kubelet's log.
    pub fn poll<T>(
        &mut self,
        what: &str,
        within: Duration,
        every: Duration,
        mut f: impl FnMut(&[Pod]) -> Option<T>,
    ) -> Result<T> {
        let start = Instant::now();
        loop {
            self.ensure_running()?;
            if let Ok(pods) = self.pods()
                && let Some(v) = f(&pods)
            {
                return Ok(v);
            }
            if start.elapsed() > within {
                bail!(
                    "{what}: not within {within:?}\nkubelet log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(every);
        }
    }
}

/// [`crate::eventually`], failing with the tail of the kubelet's log too:
/// the kubelet tests' one `eventually`.
pub fn until<T>(
    kubelet: &Kubelet,
    what: &str,
    within: Duration,
    f: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    crate::eventually(what, within, f).map_err(|e| {
        anyhow::anyhow!(
            "{e:#}\nkubelet log tail:\n{}",
            tail(&kubelet.log_text(), 60)
        )
    })
}

/// The last `n` lines of a log.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `readOnlyPort` as [`write_config`] writes it, so the launcher knows where
/// to ask for `/pods`.
fn read_only_port_of(config: &Path) -> Option<u16> {
    let text = std::fs::read_to_string(config).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("readOnlyPort:"))
        .and_then(|p| p.trim().parse().ok())
        .filter(|p| *p != 0)
}

/// Writes `kubelet.yaml` in the harness's work directory: the runtime
/// endpoint of `ctrd`, the API on 127.0.0.1 of the node namespace, short
/// rescan and status periods so tests do not wait on defaults.
pub fn write_config(ctrd: &Containerd, opts: &ConfigOptions) -> Result<PathBuf> {
    let path = ctrd.dir.join("kubelet.yaml");
    let mut text = String::from(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
",
    );
    if let Some(port) = opts.read_only_port {
        text.push_str(&format!("readOnlyPort: {port}\n"));
    }
    if let Some(dir) = &opts.static_dir {
        text.push_str(&format!("staticPodPath: {}\n", dir.display()));
    }
    if let Some(file) = &opts.resolv_conf {
        text.push_str(&format!("resolvConf: {}\n", file.display()));
    }
    if let Some(file) = &opts.client_ca_file {
        text.push_str(&format!(
            "authentication:\n  x509:\n    clientCAFile: {}\n",
            file.display()
        ));
    }
    text.push_str(opts.eviction.as_deref().unwrap_or(
        "evictionHard: {memory.available: 100Mi, nodefs.available: \"0%\", \
         nodefs.inodesFree: \"0%\", imagefs.available: \"0%\"}\n",
    ));
    text.push_str(&format!(
        "fileCheckFrequency: 2s
syncFrequency: 2s
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
nodeStatusUpdateFrequency: 2s
containerRuntimeEndpoint: {}
",
        ctrd.endpoint()
    ));
    std::fs::write(&path, text)?;
    Ok(path)
}

/// Writes a static pod file as an editor's "save" does: a dotfile the kubelet
/// ignores, renamed into place, so it never reads half a pod.
pub fn write_static_pod(dir: &Path, file: &str, pod: &str) -> Result<()> {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, pod)?;
    std::fs::rename(&tmp, dir.join(file))?;
    Ok(())
}

/// The pod's IP once it is Running.
pub fn running_ip(pod: &Pod) -> Option<String> {
    let st = pod.status.as_ref()?;
    (st.phase.as_deref() == Some("Running")).then(|| st.pod_ip.clone())?
}

/// A pod by name, as `/pods` lists it.
pub fn find<'a>(pods: &'a [Pod], name: &str) -> Option<&'a Pod> {
    pods.iter()
        .find(|p| p.metadata.name.as_deref() == Some(name))
}

/// `GET path` on 127.0.0.1:`port` inside network namespace `netns`: the
/// status code and body. A thread of its own joins the namespace (setns moves
/// only the calling thread), which costs far less than an nsenter + curl
/// process at the bench's 20 ms polling.
pub fn http_get_in(netns: &str, port: u16, path: &str) -> Result<(u16, String)> {
    let path = path.to_owned();
    crate::topology::in_netns(netns, move || -> Result<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        // HTTP/1.0: the server closes after one response and sends no chunks.
        write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf)?;
        let text = String::from_utf8_lossy(&buf);
        let (head, body) = text.split_once("\r\n\r\n").context("no HTTP header")?;
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .context("no HTTP status")?;
        Ok((code, body.to_owned()))
    })
}

/// utime + stime of `pid`, in seconds.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command may contain spaces: fields count from after its ')'.
    let rest = stat.rsplit_once(')').context("malformed stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 =
        f.get(11).context("utime")?.parse::<u64>()? + f.get(12).context("stime")?.parse::<u64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Ok(ticks as f64 / hz.max(1) as f64)
}

/// VmRSS of `pid`, in KiB.
pub fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_rss_of_this_process() {
        let me = std::process::id();
        assert!(cpu_seconds(me).unwrap() >= 0.0);
        assert!(rss_kib(me).unwrap() > 0);
    }
}
