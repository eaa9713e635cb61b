use std::{
    fs::OpenOptions,
    net::{IpAddr, SocketAddr, TcpListener},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;

use crate::{bin, topology::Topology};

/// A running `weir-agent` on a topology. Killed on drop.
pub struct Agent {
    process: AgentProcess,
    args: Vec<String>,
    pin_dir: std::path::PathBuf,
    /// Where it serves /metrics and /healthz: free loopback ports picked per
    /// agent, so agents never collide on kube-proxy's fixed ports.
    pub metrics_addr: SocketAddr,
    pub healthz_addr: SocketAddr,
}

/// One frontend as `weir-agent inspect services -o json` prints it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct ServiceView {
    /// The Service port and type, from the labels map; `None` when the
    /// frontend has no label.
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub port_name: Option<String>,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    pub vip: IpAddr,
    pub port: u16,
    pub protocol: String,
    pub backends: Vec<BackendView>,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct BackendView {
    pub ip: IpAddr,
    pub port: u16,
    pub state: String,
}

impl Agent {
    /// Starts the agent on a topology and waits for its first full sync.
    pub fn start(topo: &Topology, extra: &[&str]) -> Result<Self> {
        Self::start_with(
            &topo.manifests,
            &topo.cgroup.path,
            &topo.pin_dir(),
            topo.dir.join("agent.log"),
            extra,
        )
    }

    /// Starts the agent on explicit paths and waits for its first full sync.
    pub fn start_with(
        manifests: &std::path::Path,
        cgroup: &std::path::Path,
        pin_dir: &std::path::Path,
        log: std::path::PathBuf,
        extra: &[&str],
    ) -> Result<Self> {
        let source = ["--manifests".to_owned(), manifests.display().to_string()];
        Self::launch(&source, cgroup, pin_dir, log, extra, true)
    }

    /// Starts the agent against an API server, as node `node`, and waits for
    /// its first full sync.
    pub fn start_api(
        topo: &Topology,
        kubeconfig: &std::path::Path,
        node: &str,
        extra: &[&str],
    ) -> Result<Self> {
        Self::launch_api(topo, kubeconfig, node, extra, true)
    }

    /// As [`Self::start_api`], but returns as soon as the process runs: for an
    /// API server that is down at start.
    pub fn spawn_api(
        topo: &Topology,
        kubeconfig: &std::path::Path,
        node: &str,
        extra: &[&str],
    ) -> Result<Self> {
        Self::launch_api(topo, kubeconfig, node, extra, false)
    }

    fn launch_api(
        topo: &Topology,
        kubeconfig: &std::path::Path,
        node: &str,
        extra: &[&str],
        wait: bool,
    ) -> Result<Self> {
        Self::launch(
            &Self::api_args(kubeconfig, node),
            &topo.cgroup.path,
            &topo.pin_dir(),
            topo.dir.join("agent.log"),
            extra,
            wait,
        )
    }

    fn api_args(kubeconfig: &std::path::Path, node: &str) -> [String; 6] {
        [
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--node-name".into(),
            node.into(),
            "--namespace".into(),
            "kube-system".into(),
        ]
    }

    fn launch(
        source: &[String],
        cgroup: &std::path::Path,
        pin_dir: &std::path::Path,
        log: std::path::PathBuf,
        extra: &[&str],
        wait: bool,
    ) -> Result<Self> {
        let metrics_addr = free_port()?;
        let healthz_addr = free_port()?;
        let mut args: Vec<String> = source.to_vec();
        args.extend([
            "--cgroup".into(),
            cgroup.display().to_string(),
            "--bpffs".into(),
            pin_dir.display().to_string(),
        ]);
        if !extra.iter().any(|a| a.starts_with("--metrics-addr")) {
            args.extend(["--metrics-addr".into(), metrics_addr.to_string()]);
        }
        if !extra.iter().any(|a| a.starts_with("--healthz-addr")) {
            args.extend(["--healthz-addr".into(), healthz_addr.to_string()]);
        }
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut agent = Self {
            process: AgentProcess::new(log),
            args,
            pin_dir: pin_dir.to_path_buf(),
            metrics_addr,
            healthz_addr,
        };
        if wait {
            agent.spawn()?;
        } else {
            agent.spawn_only()?;
        }
        Ok(agent)
    }

    /// `GET path` on the metrics or healthz address with curl: the HTTP
    /// status and the body.
    pub fn get(&self, addr: SocketAddr, path: &str) -> Result<(u16, String)> {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "5", "-w", "\n%{http_code}"])
            .arg(format!("http://{addr}{path}"))
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        Ok((code.trim().parse().unwrap_or(0), body.to_owned()))
    }

    /// One sample from the agent's /metrics, by exact series name (with labels).
    pub fn metric(&self, series: &str) -> Result<Option<f64>> {
        let (code, body) = self.get(self.metrics_addr, "/metrics")?;
        anyhow::ensure!(code == 200, "/metrics answered {code}");
        Ok(body.lines().find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok())?
        }))
    }

    fn spawn(&mut self) -> Result<()> {
        let before = self.log_text().len();
        self.spawn_only()?;
        self.wait_for_log(before, "initial sync complete", Duration::from_secs(300))
    }

    fn spawn_only(&mut self) -> Result<()> {
        let mut cmd = agent_command(None);
        cmd.args(&self.args);
        self.process.launch(cmd)
    }

    /// A graceful stop followed by a fresh start, as a rolling upgrade does.
    pub fn restart(&mut self) -> Result<()> {
        self.stop(libc::SIGTERM)?;
        self.spawn()
    }

    /// The pinned maps as `weir-agent inspect services -o json` reads them.
    pub fn inspect(&self) -> Result<Vec<ServiceView>> {
        inspect(&self.pin_dir)
    }

    /// Polls the pinned maps until `pred` holds; returns how long that took.
    pub fn wait_for(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&[ServiceView]) -> bool,
    ) -> Result<Duration> {
        let start = Instant::now();
        loop {
            let views = self.inspect()?;
            if pred(&views) {
                return Ok(start.elapsed());
            }
            if start.elapsed() > timeout {
                bail!(
                    "condition not met within {timeout:?}; maps hold {views:#?}\nagent log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The process: its log, log waits, `is_running`, `pid` and `stop`.
impl std::ops::Deref for Agent {
    type Target = AgentProcess;
    fn deref(&self) -> &AgentProcess {
        &self.process
    }
}

impl std::ops::DerefMut for Agent {
    fn deref_mut(&mut self) -> &mut AgentProcess {
        &mut self.process
    }
}

/// A loopback address with a port nobody listens on right now.
fn free_port() -> Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

pub fn inspect(pin_dir: &std::path::Path) -> Result<Vec<ServiceView>> {
    let out = Command::new(bin("weir-agent"))
        .args(["inspect", "services", "-o", "json", "--bpffs"])
        .arg(pin_dir)
        .output()?;
    if !out.status.success() {
        bail!("inspect failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The backends `views` list for `vip:port/protocol`, as `ip:port` strings.
pub fn backends_of(
    views: &[ServiceView],
    vip: &str,
    port: u16,
    protocol: &str,
) -> Option<Vec<String>> {
    views
        .iter()
        .find(|v| v.vip.to_string() == vip && v.port == port && v.protocol == protocol)
        .map(|v| {
            v.backends
                .iter()
                .map(|b| format!("{}:{}", b.ip, b.port))
                .collect()
        })
}

/// `weir-agent`, run in the network namespace at `netns` (a `/run/netns/…`
/// path) when given: nsenter execs the agent, so the child's pid is the
/// agent's.
pub fn agent_command(netns: Option<&str>) -> Command {
    match netns {
        Some(ns) => {
            let mut cmd = Command::new("nsenter");
            cmd.arg(format!("--net={ns}")).arg(bin("weir-agent"));
            cmd
        }
        None => Command::new(bin("weir-agent")),
    }
}

/// Starts `cmd` (from [`agent_command`], arguments added) with its log
/// appended to `log`, killed by the kernel if the spawning thread dies
/// before the caller's guards run.
pub fn spawn_agent(mut cmd: Command, log: &std::path::Path) -> Result<Child> {
    let log = OpenOptions::new().create(true).append(true).open(log)?;
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        use std::os::unix::process::CommandExt as _;
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting weir-agent (build it: cargo build -p weir-agent)")
}

/// A `weir-agent` process and the log it appends to, shared by the socket,
/// packet and bench harnesses. Killed on drop (and by the kernel if the test
/// process dies first, see [`spawn_agent`]).
pub struct AgentProcess {
    child: Option<Child>,
    pub log: PathBuf,
}

impl AgentProcess {
    /// Not running yet; [`Self::launch`] starts it.
    pub fn new(log: PathBuf) -> Self {
        Self { child: None, log }
    }

    /// Starts `cmd` (from [`agent_command`], arguments added).
    pub fn launch(&mut self, cmd: Command) -> Result<()> {
        self.child = Some(spawn_agent(cmd, &self.log)?);
        Ok(())
    }

    /// Everything logged to this process's log file, by it and by earlier
    /// agents that appended to the same file.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the agent logs `needle` after byte `from` of its log.
    pub fn wait_for_log(&mut self, from: usize, needle: &str, timeout: Duration) -> Result<()> {
        self.wait_for_log_line(from, &[needle], timeout)
    }

    /// Waits until one line after byte `from` contains every one of
    /// `needles`; fails early if the agent exits.
    pub fn wait_for_log_line(
        &mut self,
        from: usize,
        needles: &[&str],
        timeout: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let text = self.log_text();
            let tail = text.get(from..).unwrap_or("");
            if tail.lines().any(|l| needles.iter().all(|n| l.contains(n))) {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("weir-agent exited with {status}:\n{tail}");
            }
            if Instant::now() > deadline {
                bail!(
                    "weir-agent logged no line with all of {needles:?} within {timeout:?}:\n{tail}"
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the agent with `signal` and waits for it to exit.
    pub fn stop(&mut self, signal: i32) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(i32::try_from(c.id())?, signal) };
            c.wait()?;
        }
        Ok(())
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
