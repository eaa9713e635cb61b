//! A private containerd for the CRI tests, confined to what the test owns:
//!
//! ```text
//!   root namespace: only the harness; /var/lib/containerd and /run/containerd untouched
//!   ┌──────────── wt-<pid>-c<n> (node netns) ──────────────────────────────────┐
//!   │ containerd --config /tmp/weir-test-<pid>-c<n>/config.toml (own mount ns)  │
//!   │ weir-cni0 10.88.0.1/24 ─┬─ veth ─ pod netns: eth0 10.88.0.x              │
//!   │                         └─ veth ─ …                                      │
//!   └──────────────────────────────────────────────────────────────────────────┘
//! ```
//! Root, state, socket, CNI config, host-local IPAM state, runc's state and
//! the pods' network namespaces all live in the work directory. containerd
//! runs in a mount namespace of its own (propagation slave), so the overlay,
//! shm and netns mounts it makes never appear on the host and die with it.
//! Pods should use [`Containerd::cgroup_parent`], which lets cleanup and
//! [`sweep_orphans`] find their processes. Outside it, and removed by cleanup:
//! the shims' sockets in /run/containerd/s/ (a path containerd 1.6 hard-codes),
//! libcni's cached results in /var/lib/cni/results, and the pods' cgroups.
//!
//! This machine has a hybrid cgroup layout (v1 controllers plus cgroup2 at
//! /sys/fs/cgroup/unified): runc 1.1's cgroupfs driver uses the v1 hierarchies
//! and mirrors each container into the unified one, so `SystemdCgroup = false`
//! and no other setting is needed; containerd itself stays in the test's cgroup.
//! Root here lacks CAP_SYS_RESOURCE, so the config sets `restrict_oom_score_adj`.
use std::{
    future::Future,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use weir_kubelet::cri::{CriRuntime, Runtime as _, SandboxFilter};

use crate::{
    images,
    topology::{DIR_PREFIX, NETNS_PREFIX, Netns, unique_id},
};

/// The pods' subnet, on a bridge in the node namespace, of a lone node.
pub const POD_SUBNET: &str = "10.88.0.0/24";
/// The bridge's address: the node side of every pod's default route.
pub const POD_GATEWAY: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 88, 0, 1);

/// A node's pod network: `10.88.<index>.0/24` on its bridge, gateway `.1`.
/// A lone node is index 0 ([`POD_SUBNET`], [`POD_GATEWAY`]); the nodes of a
/// [`crate::cluster`] get one each, so their pods can route to each other.
#[derive(Clone, Copy, Debug, Default)]
pub struct PodNet {
    pub index: u8,
}

impl PodNet {
    pub fn subnet(self) -> String {
        format!("10.88.{}.0/24", self.index)
    }

    pub fn gateway(self) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(10, 88, self.index, 1)
    }
}
pub const BRIDGE: &str = "weir-cni0";
const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// Where libcni caches ADD results; containerd 1.6 offers no setting for it.
const CNI_CACHE: &str = "/var/lib/cni/results";
const START_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Containerd {
    pub id: String,
    /// The work directory: everything containerd writes.
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// `overlayfs` where the kernel has it, else `native`.
    pub snapshotter: &'static str,
    /// The node namespace containerd, the CNI bridge and its clients run in.
    pub node: Netns,
    /// The pods' subnet and the bridge's address.
    pub pod_net: PodNet,
    /// The node's init: PID 1 of the node's PID namespace (our pause), in
    /// the node's mount namespace, under `unshare --fork`.
    init: Option<Child>,
    /// The init's pid (in the root PID namespace): containerd is started
    /// into its namespaces, again after [`Containerd::stop_runtime`].
    init_pid: u32,
    /// `nsenter` into the node's namespaces, whose only child is containerd.
    child: Option<Child>,
    /// containerd's pid (in the root PID namespace).
    pid: u32,
}

impl Containerd {
    /// Starts containerd in a new node namespace, imports [`images::BUSYBOX`]
    /// and [`images::PAUSE`], and returns once the CRI answers `Version`.
    /// containerd dies with the thread that calls this (PR_SET_PDEATHSIG): keep
    /// the guard on that thread, as a test's local.
    pub fn start() -> Result<Self> {
        Self::start_on(PodNet::default())
    }

    /// Like [`Self::start`], its pods on `pod_net`.
    pub fn start_on(pod_net: PodNet) -> Result<Self> {
        let id = unique_id("c");
        let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{id}"));
        std::fs::create_dir_all(dir.join("net.d"))?;
        let node = Netns::create(format!("{NETNS_PREFIX}{id}"))?;
        let mut c = Self {
            socket: dir.join("containerd.sock"),
            snapshotter: snapshotter(),
            id,
            dir,
            node,
            pod_net,
            init: None,
            init_pid: 0,
            child: None,
            pid: 0,
        };
        // The node's address (the kubelet's --node-ip) exists before any pod:
        // host-network pods are probed there, and the first pod may well be
        // one. The CNI bridge plugin adopts the bridge and its address.
        c.node.sh(&format!(
            "ip link set lo up && ip link add {BRIDGE} type bridge && \
             ip addr add {}/24 dev {BRIDGE} && ip link set {BRIDGE} up",
            pod_net.gateway()
        ))?;
        c.share_kubelet_dir()?;
        std::fs::write(c.dir.join("config.toml"), c.config())?;
        std::fs::write(c.dir.join("net.d/10-weir.conflist"), c.cni_config())?;
        let images_dir = c.dir.join("images");
        std::fs::create_dir_all(&images_dir)?;
        // Compiled first: its binary is also the node's init.
        let pause = images::pause(&images_dir)?;
        c.spawn(&images_dir.join("pause"))?;
        c.wait_ready()?;
        for image in [pause, images::busybox()?] {
            images::import(&c.socket, c.snapshotter, &images_dir, &image)?;
        }
        Ok(c)
    }

    /// `containerRuntimeEndpoint` for this containerd.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// A CRI client. Like every tonic channel, create it inside the Tokio
    /// runtime that will use it.
    pub fn runtime(&self) -> CriRuntime {
        CriRuntime::new(&self.endpoint()).expect("a unix endpoint")
    }

    /// The cgroupfs parent pods must use: cleanup kills what runs below it.
    pub fn cgroup_parent(&self) -> String {
        format!("/{DIR_PREFIX}{}", self.id)
    }

    /// Name of the CNI network, also the prefix of libcni's cached results.
    pub fn network_name(&self) -> String {
        format!("{DIR_PREFIX}{}", self.id)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// Runs `script` in containerd's mount namespace: the node's, as its
    /// pods' hostPath volumes see it. The root namespace's `/` is private
    /// here, so nothing mounted there later reaches containerd; a hostPath
    /// with HostToContainer or Bidirectional propagation must be a shared
    /// mount in this namespace, and is made one here. Mounts made here die
    /// with containerd.
    pub fn node_mount_sh(&self, script: &str) -> Result<String> {
        anyhow::ensure!(self.child.is_some(), "containerd is not running");
        node_sh(self.pid, script)
    }

    /// containerd's pid: a process in the node's mount and PID namespaces.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Makes `dir` a shared mount in the node's mount namespace, bind-mounting
    /// it onto itself first unless it is a mount point there already.
    pub fn share_host_dir(&self, dir: &Path) -> Result<()> {
        let d = dir.display();
        self.node_mount_sh(&format!(
            "mountpoint -q '{d}' || mount --bind '{d}' '{d}'; mount --make-rshared '{d}'"
        ))
        .map(drop)
    }

    /// The kubelet's root dir for these tests (`--root-dir`, and the parent
    /// of [`WorkerConfig::pods_dir`](weir_kubelet::worker::WorkerConfig)).
    pub fn kubelet_dir(&self) -> PathBuf {
        self.dir.join("kubelet")
    }

    /// Makes [`Self::kubelet_dir`] a shared mount (a bind mount onto itself,
    /// in the test's work directory) before containerd copies the mount
    /// table: containerd's copy is then its slave, so the subPath bind mounts
    /// the kubelet makes below it reach containerd, as /var/lib/kubelet's do
    /// on a node. [`remove_leftovers`] unmounts it with the rest.
    fn share_kubelet_dir(&self) -> Result<()> {
        let d = self.kubelet_dir();
        std::fs::create_dir_all(&d)?;
        let d = d.display();
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "mount --bind '{d}' '{d}' && mount --make-shared '{d}'"
            ))
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "sharing {d}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    fn config(&self) -> String {
        let d = self.dir.display();
        let cri = r#"plugins."io.containerd.grpc.v1.cri""#;
        format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
# Snapshotters that cannot work here only add noise to the log.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

# Its default is /opt/containerd.
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"

[{cri}]
  sandbox_image = "{pause}"
  stream_server_address = "127.0.0.1"
  # Pod netns pins under state/, not /var/run/netns.
  netns_mounts_under_state_dir = true
  # Root may lack CAP_SYS_RESOURCE (it does on this machine), and then runc
  # cannot lower oom_score_adj (the sandbox's -998, Guaranteed pods' -997):
  # clamp to containerd's own instead of failing every sandbox.
  restrict_oom_score_adj = true
  [{cri}.containerd]
    snapshotter = "{snap}"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        # runc's state, by default under /run/containerd/runc.
        Root = "{d}/runc"
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{d}/net.d"
    max_conf_num = 1
"#,
            pause = images::PAUSE,
            snap = self.snapshotter,
        )
    }

    fn cni_config(&self) -> String {
        serde_json::json!({
            "cniVersion": "0.4.0",
            "name": self.network_name(),
            "plugins": [{
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                // Pods are reached from the node namespace only: no NAT rules.
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": self.pod_net.subnet(),
                                 "gateway": self.pod_net.gateway().to_string()}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    // Its default is /var/lib/cni/networks.
                    "dataDir": self.dir.join("ipam"),
                },
            }],
        })
        .to_string()
    }

    /// Starts the node: an init of its own (PID 1 of a new PID namespace, in
    /// a new mount namespace whose /proc shows that PID namespace, so a pod's
    /// hostPath /proc sees this node's processes, as on a machine), then
    /// containerd inside both. Propagation slave keeps the overlay, shm and
    /// netns mounts containerd makes off the host.
    fn spawn(&mut self, init: &Path) -> Result<()> {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.node.path()))
            .args(["unshare", "--mount", "--propagation", "slave"])
            // --kill-child: the node's PID 1, and with it every process of
            // the node, dies with unshare.
            .args(["--pid", "--fork", "--kill-child", "--mount-proc"])
            .arg(init)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        die_with_parent(&mut cmd);
        let unshare = cmd.spawn().context("starting the node's init (unshare)")?;
        let unshare_pid = unshare.id();
        self.init = Some(unshare);
        self.init_pid = only_child(unshare_pid, "the node's init")?;
        self.spawn_containerd()
    }

    /// containerd, in the namespaces of the node's init. Its log is
    /// appended to: a restarted containerd's follows the first one's.
    fn spawn_containerd(&mut self) -> Result<()> {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("containerd.log"))?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--target={}", self.init_pid))
            .args(["--mount", "--pid", "--net", "--", "containerd", "--config"])
            .arg(self.dir.join("config.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        // nsenter forks containerd into the PID namespace and waits for it;
        // if the test dies, nsenter does, and the node's init with unshare,
        // which ends every process of the node, containerd included.
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .context("starting containerd (cargo xtask setup)")?;
        let nsenter_pid = child.id();
        self.child = Some(child);
        self.pid = only_child(nsenter_pid, "containerd")
            .with_context(|| format!("containerd.log:\n{}", self.log()))?;
        Ok(())
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let endpoint = self.endpoint();
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("containerd exited with {status}:\n{}", self.log());
            }
            let ep = endpoint.clone();
            let version = block_on(async move {
                let rt = CriRuntime::new(&ep)?.with_timeout(Duration::from_secs(2));
                rt.version().await
            });
            match version {
                Ok(v) if v.runtime_name == "containerd" => return Ok(()),
                Ok(v) => bail!("the CRI socket answered as {v:?}"),
                Err(e) if Instant::now() > deadline => {
                    bail!("containerd's CRI did not answer: {e}\n{}", self.log())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Stops and removes every sandbox through the CRI, so containerd tears
    /// down containers, CNI attachments and mounts itself.
    fn remove_pods(&self) {
        let ep = self.endpoint();
        let res = block_on(async move {
            let rt = CriRuntime::new(&ep)?.with_timeout(Duration::from_secs(30));
            for sb in rt.list_pod_sandboxes(&SandboxFilter::default()).await? {
                rt.stop_pod_sandbox(&sb.id).await?;
                rt.remove_pod_sandbox(&sb.id).await?;
            }
            Ok::<_, weir_kubelet::cri::CriError>(())
        });
        if let Err(e) = res {
            eprintln!("containerd {}: removing pods: {e}", self.id);
        }
    }

    /// Stops containerd alone, as `systemctl stop containerd` does: the
    /// shims, and so the pods' processes, live on (they are children of the
    /// node's init, not of containerd), and the node's namespaces stay.
    /// [`Self::restart_runtime`] starts it again; dropping the guard cleans
    /// up either way.
    pub fn stop_runtime(&mut self) -> Result<()> {
        anyhow::ensure!(self.child.is_some(), "containerd is not running");
        self.stop();
        Ok(())
    }

    /// Starts containerd again after [`Self::stop_runtime`], on the same
    /// root and state, and returns once its CRI answers. It finds the pods
    /// that kept running through their shims.
    pub fn restart_runtime(&mut self) -> Result<()> {
        anyhow::ensure!(self.child.is_none(), "containerd is running");
        self.spawn_containerd()?;
        self.wait_ready()
    }

    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // 0 (containerd never appeared) would signal our own process group.
        if let Ok(pid @ 1..) = i32::try_from(self.pid) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // nsenter only waits for containerd: killing it alone would leave
        // containerd holding the socket (and a restart would fail).
        if let Ok(pid @ 1..) = i32::try_from(self.pid) {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.remove_pods();
        }
        self.stop();
        if let Some(mut init) = self.init.take() {
            // unshare's --kill-child takes the node's PID 1, and the kernel
            // every process left in the node's PID namespace.
            let _ = init.kill();
            let _ = init.wait();
        }
        remove_leftovers(&self.dir, &format!("{DIR_PREFIX}{}", self.id));
        // The node namespace goes with its guard.
    }
}

/// Runs `script` with sh in the mount and PID namespaces of process `pid`
/// (both, so the node's /proc/self is the shell's); its stdout.
pub fn node_sh(pid: u32, script: &str) -> Result<String> {
    let out = Command::new("nsenter")
        .arg(format!("--target={pid}"))
        .args(["--mount", "--pid", "--", "sh", "-c", script])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// SIGKILL for the process when the thread that spawned it dies, so a killed
/// test run leaves no node behind.
fn die_with_parent(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The one child `pid` forks (unshare's and nsenter's): its pid, once it
/// exists.
fn only_child(pid: u32, what: &str) -> Result<u32> {
    let path = format!("/proc/{pid}/task/{pid}/children");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if let Some(child) = text.split_whitespace().next().and_then(|p| p.parse().ok()) {
            return Ok(child);
        }
        if Instant::now() > deadline {
            bail!("{what} did not start (no child of {pid})");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `fut` to completion on a runtime of its own thread, so it works from
/// sync code and from inside another runtime alike (drops included).
pub fn block_on<F>(fut: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a Tokio runtime")
            .block_on(fut)
    })
    .join()
    .expect("block_on thread")
}

fn snapshotter() -> &'static str {
    let fs = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if fs
        .lines()
        .any(|l| l.split_whitespace().last() == Some("overlay"))
    {
        "overlayfs"
    } else {
        "native"
    }
}

/// Every process whose command line names `dir` (containerd and its shims)
/// or that runs in a `name` cgroup (the containers), killed; then those
/// cgroups, the host mounts under `dir`, `dir` and libcni's cached results
/// for network `name` removed.
pub fn remove_leftovers(dir: &Path, name: &str) {
    // The slash keeps `…-c1` from matching `…-c10`.
    let needle = format!("{}/", dir.display());
    let mut sockets = Vec::new();
    for _ in 0..3 {
        let mut pids = cgroup_pids(name);
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for e in entries.flatten() {
                let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                    continue;
                };
                let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline);
                if cmdline.contains(&needle) {
                    pids.push(pid);
                    sockets.extend(shim_socket(&cmdline));
                }
            }
        }
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // A shim removes its socket when it exits, but not when it is killed.
    for s in sockets {
        let _ = std::fs::remove_file(s);
    }
    remove_cgroups(name);
    unmount_under(dir);
    let _ = std::fs::remove_dir_all(dir);
    // Files are `<network>-<sandbox id>-<ifname>`; containerd's built-in
    // loopback network caches its own under `cni-loopback`.
    let ours = format!("{name}-");
    let files: Vec<String> = std::fs::read_dir(CNI_CACHE)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for f in &files {
        let Some(sandbox) = f.strip_prefix(&ours).and_then(|r| r.split('-').next()) else {
            continue;
        };
        for file in [f.clone(), format!("cni-loopback-{sandbox}-lo")] {
            let _ = std::fs::remove_file(Path::new(CNI_CACHE).join(file));
        }
    }
}

/// The socket of the shim with NUL-separated `cmdline`: containerd 1.6 puts it
/// at /run/containerd/s/hex(sha256(`<address>/<namespace>/<id>`)) whatever its
/// root and state.
fn shim_socket(cmdline: &str) -> Option<PathBuf> {
    let args: Vec<&str> = cmdline.split('\0').collect();
    if !args.first()?.ends_with("containerd-shim-runc-v2") {
        return None;
    }
    let flag = |f: &str| {
        let i = args.iter().position(|a| *a == f)?;
        args.get(i + 1).copied()
    };
    let key = format!(
        "{}/{}/{}",
        flag("-address")?,
        flag("-namespace")?,
        flag("-id")?
    );
    Some(PathBuf::from("/run/containerd/s").join(images::sha256_hex(key.as_bytes())))
}

/// The cgroup hierarchies: each v1 controller's and the unified one.
fn hierarchies() -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let fstype = post.split_whitespace().next()?;
            ["cgroup", "cgroup2"]
                .contains(&fstype)
                .then(|| pre.split_whitespace().nth(4).map(PathBuf::from))?
        })
        .collect()
}

/// Directories of the `name` cgroups, children first.
fn cgroup_dirs(name: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
        out.push(dir.to_owned());
    }
    let mut out = Vec::new();
    for h in hierarchies() {
        let top = h.join(name);
        if top.is_dir() {
            walk(&top, &mut out);
        }
    }
    out
}

fn cgroup_pids(name: &str) -> Vec<i32> {
    cgroup_dirs(name)
        .iter()
        .flat_map(|d| {
            std::fs::read_to_string(d.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

fn remove_cgroups(name: &str) {
    for d in cgroup_dirs(name) {
        for _ in 0..20 {
            if std::fs::remove_dir(&d).is_ok() || !d.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Lazily unmounts every host mount below `dir`, deepest first.
fn unmount_under(dir: &Path) {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<&str> = info
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        let _ = Command::new("umount").args(["-l", m]).status();
    }
}

/// Mounts below `dir` as the host sees them: none, while containerd keeps its
/// own mount namespace.
pub fn host_mounts_under(dir: &Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .map(str::to_owned)
        .collect()
}

/// What killed runs of [`Containerd`] left: their containerd, shims,
/// containers, cgroups and cached CNI results. [`crate::sweep::sweep`] calls it
/// before it removes their namespaces and work directories.
pub fn sweep_orphans() {
    let tmp = std::env::temp_dir();
    let Ok(entries) = std::fs::read_dir(&tmp) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(DIR_PREFIX)
            .and_then(|rest| rest.split_once("-c"))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            eprintln!("sweep: removing leftover containerd {}", e.path().display());
            remove_leftovers(&e.path(), &name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shim_sockets_are_where_containerd_puts_them() {
        let id = "6e3b7d66ad9158e8ad6a69bc0d3b57b9df1fbe5babbee2d0a9c8693796c03508";
        let cmdline = format!(
            "/usr/bin/containerd-shim-runc-v2\0-namespace\0k8s.io\0-id\0{id}\0-address\0/tmp/weir-test-14494-c0/containerd.sock\0"
        );
        assert_eq!(
            shim_socket(&cmdline).unwrap(),
            Path::new(
                "/run/containerd/s/ea5a7154c0882525104952301f35455f3cc37c6dcd56675141510c62e24e77f2"
            )
        );
        assert_eq!(shim_socket("containerd\0--config\0x"), None);
    }
}
