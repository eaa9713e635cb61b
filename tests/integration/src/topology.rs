use std::{
    io::{BufRead as _, BufReader},
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use anyhow::{Context as _, Result, bail, ensure};
use serde::Deserialize;

use crate::bin;

/// Prefix of every network namespace the harness creates.
pub const NETNS_PREFIX: &str = "wt-";
/// Prefix of every cgroup and work directory the harness creates.
pub const DIR_PREFIX: &str = "weir-test-";
/// Where cgroup v2 is mounted: `/sys/fs/cgroup` on unified hosts,
/// `/sys/fs/cgroup/unified` on hybrid ones.
pub fn cgroup2_root() -> Result<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    info.lines()
        .find_map(|l| {
            // Fields: … mount-point … " - " fstype source options.
            let (pre, post) = l.split_once(" - ")?;
            if post.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            pre.split_whitespace().nth(4).map(PathBuf::from)
        })
        .context("no cgroup2 mount: Weir's socket programs need cgroup v2")
}
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

pub const BACKEND_TCP_PORT: u16 = 8080;
pub const BACKEND_UDP_PORT: u16 = 5353;

/// One backend host: a namespace running `weir-testsrv` under its name.
pub struct Backend {
    pub name: String,
    pub ip: Ipv4Addr,
    pub ns: Netns,
}

pub struct Topology {
    pub id: String,
    pub dir: PathBuf,
    pub manifests: PathBuf,
    pub node: Netns,
    pub backends: Vec<Backend>,
    pub cgroup: Cgroup,
    pub bpffs: Bpffs,
    servers: Vec<ChildGuard>,
}

/// `{pid}-{tag}{n}`, unique within the run: names of the namespaces,
/// cgroups and work directories of one test environment. The pid first lets
/// `sweep` tell a dead run's leftovers from a live run's.
pub fn unique_id(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "{}-{tag}{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// What a test topology owns besides its namespaces, named
/// `{DIR_PREFIX}{id}` so that `sweep` finds them: a work directory with an
/// empty `manifests/`, a private bpffs mount below it and a child cgroup. The
/// topology keeps them as its own fields, in its drop order.
pub struct Workspace {
    pub id: String,
    pub dir: PathBuf,
    pub manifests: PathBuf,
    pub bpffs: Bpffs,
    pub cgroup: Cgroup,
}

impl Workspace {
    pub fn create(tag: &str) -> Result<Self> {
        let id = unique_id(tag);
        let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{id}"));
        let manifests = dir.join("manifests");
        std::fs::create_dir_all(&manifests)?;
        let bpffs = Bpffs::mount(dir.join("bpf"))?;
        let cgroup = Cgroup::create(cgroup2_root()?.join(format!("{DIR_PREFIX}{id}")))?;
        Ok(Self {
            id,
            dir,
            manifests,
            bpffs,
            cgroup,
        })
    }
}

impl Topology {
    /// A node namespace with `n` backends on a bridge, a child cgroup, a private
    /// bpffs mount and an empty manifests directory.
    pub fn new(n: usize) -> Result<Self> {
        let Workspace {
            id,
            dir,
            manifests,
            bpffs,
            cgroup,
        } = Workspace::create("")?;
        let node = Netns::create(format!("{NETNS_PREFIX}{id}-n"))?;
        node.sh("ip link set lo up && ip link add br0 type bridge && ip addr add 10.77.0.1/24 dev br0 && ip link set br0 up")?;
        let mut topo = Self {
            manifests,
            id,
            dir,
            node,
            backends: Vec::new(),
            cgroup,
            bpffs,
            servers: Vec::new(),
        };
        for _ in 0..n {
            topo.add_backend()?;
        }
        Ok(topo)
    }

    /// Adds a backend namespace `be<k>` at 10.77.0.(10+k) and starts its server.
    pub fn add_backend(&mut self) -> Result<&Backend> {
        let k = self.backends.len() + 1;
        let name = format!("be{k}");
        let ip = Ipv4Addr::new(10, 77, 0, 10 + u8::try_from(k)?);
        let ns = Netns::create(format!("{NETNS_PREFIX}{}-b{k}", self.id))?;
        wire_backend(&self.node, &ns, k, ip)?;
        let server = spawn_ready(ns.command(&bin("weir-testsrv")).args(["--name", &name]))?;
        self.servers.push(server);
        self.backends.push(Backend { name, ip, ns });
        Ok(self.backends.last().expect("just pushed"))
    }

    /// Every backend as a ready endpoint, for [`crate::manifest::slice`].
    pub fn ready_endpoints(&self) -> Vec<(Ipv4Addr, crate::manifest::Cond)> {
        self.backends
            .iter()
            .map(|b| (b.ip, crate::manifest::READY))
            .collect()
    }

    pub fn backend(&self, name: &str) -> &Backend {
        self.backends
            .iter()
            .find(|b| b.name == name)
            .expect("known backend")
    }

    /// A command run in the node namespace inside the agent's cgroup, so the
    /// socket programs apply to it.
    pub fn client(&self, program: impl AsRef<Path>) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", r#"echo $$ > "$0" && exec "$@""#])
            .arg(self.cgroup.path.join("cgroup.procs"))
            .arg("nsenter")
            .arg(format!("--net={}", self.node.path()))
            .arg(program.as_ref());
        c
    }

    /// Runs `weir-testclient` in the cgroup and returns its report.
    pub fn probe(&self, mode: &str, target: &str, count: u32) -> Result<Probe> {
        self.probe_with(mode, target, count, &[])
    }

    /// [`Self::probe`] with more `weir-testclient` arguments.
    pub fn probe_with(
        &self,
        mode: &str,
        target: &str,
        count: u32,
        extra: &[&str],
    ) -> Result<Probe> {
        let out = self
            .client(bin("weir-testclient"))
            .args([mode, "--target", target, "--count", &count.to_string()])
            .args(extra)
            .output()?;
        Probe::parse(&out)
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
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.servers.clear();
        self.cgroup.kill_all();
        // Namespaces, the cgroup and the bpffs mount go with their guards; the
        // work directory last, once the mount below it is gone.
        self.backends.clear();
    }
}

/// Joins backend namespace `ns` to the node's bridge as veth `vb<k>`, gives it
/// `ip` on 10.77.0.0/24 and a default route through the node.
pub fn wire_backend(node: &Netns, ns: &Netns, k: usize, ip: Ipv4Addr) -> Result<()> {
    veth(node, &format!("vb{k}"), ns, "eth0")?;
    node.sh(&format!(
        "ip link set vb{k} master br0 && ip link set vb{k} up"
    ))?;
    ns.sh(&format!(
        "ip link set lo up && ip addr add {ip}/24 dev eth0 && ip link set eth0 up \
         && ip route add default via {NODE_IP}"
    ))
}

/// A veth pair from `a_name` in `a` to `b_name` in `b`. Both ends are created
/// inside their namespaces: no name ever exists in the root namespace.
pub fn veth(a: &Netns, a_name: &str, b: &Netns, b_name: &str) -> Result<()> {
    run(Command::new("ip").args([
        "link", "add", a_name, "netns", &a.name, "type", "veth", "peer", "name", b_name, "netns",
        &b.name,
    ]))
}

/// Starts a server that prints `ready` once it listens, and waits for that.
/// The guard owns it before anything can fail, so it never outlives a test.
pub fn spawn_ready(cmd: &mut Command) -> Result<ChildGuard> {
    let child = cmd.stdout(Stdio::piped()).spawn().with_context(|| {
        format!("starting {cmd:?} (build it: cargo build -p weir-integration --bins)")
    })?;
    let mut guard = ChildGuard(child);
    let mut line = String::new();
    BufReader::new(guard.0.stdout.take().context("server stdout")?).read_line(&mut line)?;
    ensure!(line.trim() == "ready", "{cmd:?} did not start");
    Ok(guard)
}

/// A child process killed on drop, for servers a test starts itself.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What `weir-testclient` reported.
#[derive(Debug, Default, Deserialize)]
pub struct Probe {
    pub attempts: u32,
    pub ok: u32,
    pub backends: std::collections::BTreeMap<String, u32>,
    pub errors: std::collections::BTreeMap<String, u32>,
    pub peer_mismatch: u32,
    pub max_error_ms: u64,
}

impl Probe {
    pub fn parse(out: &Output) -> Result<Self> {
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.trim()).with_context(|| {
            format!(
                "weir-testclient output {text:?}, stderr {:?}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }
}

/// Runs `f` on a thread of its own inside the network namespace at `path`
/// (`/run/netns/<name>`). setns(2) moves only the calling thread, and a
/// socket or a device lookup belongs to the namespace of the thread that
/// makes it: cheaper than an nsenter process, and nothing else moves. A
/// panic in `f` (a failed assertion) goes on in the caller.
pub fn in_netns<T: Send + 'static>(
    path: &str,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let path = path.to_owned();
    std::thread::spawn(move || -> Result<T> {
        let ns = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
        // SAFETY: setns on an fd we own; it changes only this thread.
        let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&ns), libc::CLONE_NEWNET) };
        ensure!(rc == 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// A network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn create(name: String) -> Result<Self> {
        run(Command::new("ip").args(["netns", "add", &name]))?;
        Ok(Self { name })
    }

    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// `nsenter --net`, not `ip netns exec`, which remounts /sys and hides cgroup2.
    pub fn command(&self, program: &Path) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.path())).arg(program);
        c
    }

    pub fn sh(&self, script: &str) -> Result<()> {
        run(self.command(Path::new("sh")).args(["-c", script]))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// A child cgroup of the cgroup2 mount; its processes are killed on drop.
pub struct Cgroup {
    pub path: PathBuf,
}

impl Cgroup {
    pub fn create(path: PathBuf) -> Result<Self> {
        std::fs::create_dir(&path)
            .with_context(|| format!("creating cgroup {}", path.display()))?;
        Ok(Self { path })
    }

    pub fn kill_all(&self) {
        for _ in 0..50 {
            let procs = std::fs::read_to_string(self.path.join("cgroup.procs")).unwrap_or_default();
            if procs.trim().is_empty() {
                return;
            }
            for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: kill has no memory-safety preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.kill_all();
        for _ in 0..50 {
            if std::fs::remove_dir(&self.path).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A private bpffs instance: pins in it vanish with the mount. It is mounted
/// at `<work>/bpf`, and its guard removes `<work>` once unmounted; `<work>` must
/// lie in a harness directory (named with [`DIR_PREFIX`]), so no guard can
/// remove anything the test does not own (a bpffs at /tmp/x once took /tmp).
pub struct Bpffs {
    pub dir: PathBuf,
}

impl Bpffs {
    pub fn mount(dir: PathBuf) -> Result<Self> {
        // Below a harness directory in the temp dir, with no `..` to climb
        // back out of it.
        let owned = dir.parent().is_some_and(|p| {
            let below = p.strip_prefix(std::env::temp_dir()).ok();
            below.is_some_and(|b| {
                b.components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)))
                    && b.components().next().is_some_and(|c| {
                        c.as_os_str()
                            .to_str()
                            .is_some_and(|n| n.starts_with(DIR_PREFIX))
                    })
            })
        });
        anyhow::ensure!(
            owned,
            "bpffs at {}: its parent must be in a {DIR_PREFIX}* work directory, since its guard \
             removes the parent",
            dir.display()
        );
        std::fs::create_dir_all(&dir)?;
        run(Command::new("mount").args(["-t", "bpf", "bpf"]).arg(&dir))?;
        Ok(Self { dir })
    }

    /// Where the agent under test pins its maps and links.
    pub fn pin_dir(&self) -> PathBuf {
        self.dir.join("weir")
    }
}

/// Writes a manifest into the agent's manifest directory `dir` atomically: a
/// dotfile the agent ignores, renamed in place.
pub fn write_manifest_in(dir: &Path, file: &str, content: &str) -> Result<()> {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, dir.join(file))?;
    Ok(())
}

pub fn remove_manifest_in(dir: &Path, file: &str) -> Result<()> {
    Ok(std::fs::remove_file(dir.join(file))?)
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        if let Some(work) = self.dir.parent() {
            let _ = std::fs::remove_dir_all(work);
        }
    }
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}
