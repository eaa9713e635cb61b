//! The agent under the scale bench: a child process followed through its log
//! and `/proc`.
use std::{
    fs::File,
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::{
    bin,
    topology::{Bpffs, Cgroup, ChildGuard},
};

pub(super) struct Options<'a> {
    /// Where the Services come from (`--manifests DIR`, `--kubeconfig …`).
    pub source: &'a [std::ffi::OsString],
    pub cgroup: &'a Path,
    pub pins: &'a Path,
    pub max_services: u32,
    pub max_backends: u32,
    pub log: PathBuf,
}

/// What the first sync took.
pub(super) struct Synced {
    /// Spawn → the `initial sync complete` line.
    pub cold: Duration,
    /// When the earlier milestones appeared, for where the time went.
    pub phases: Vec<String>,
    /// The fields the agent logged with the sync (`services=… map_ops=…`).
    pub fields: String,
    /// Whether `perf record` ran over it, so its numbers include perf's cost.
    pub profiled: bool,
}

/// A cold start on a bpffs and a cgroup of its own, stopped once it synced:
/// a repetition of the measured one. `dir` is a new directory in the
/// bench's work directory, removed with the mount; the agent logs to
/// `dir.log`. Returns the cold sync and the warnings and errors logged.
pub(super) fn cold_start_alone(
    dir: &Path,
    cgroup: PathBuf,
    like: &Options<'_>,
    timeout: Duration,
) -> Result<(Duration, usize)> {
    // Dropped in reverse: the agent, the cgroup (which detaches its
    // programs), the bpffs (which frees the maps).
    let bpffs = Bpffs::mount(dir.join("bpf"))?;
    let cgroup = Cgroup::create(cgroup)?;
    let pins = bpffs.pin_dir();
    let mut agent = AgentProc::spawn(Options {
        source: like.source,
        cgroup: &cgroup.path,
        pins: &pins,
        max_services: like.max_services,
        max_backends: like.max_backends,
        log: dir.with_extension("log"),
    })?;
    let synced = agent.wait_sync(timeout)?;
    // An agent that does not stop cleanly counts as a problem too.
    let unclean = agent.stop()?.is_some();
    Ok((synced.cold, agent.problems()? + usize::from(unclean)))
}

/// `weir-agent` in standalone mode; killed on drop.
pub(super) struct AgentProc {
    // Declared first so it drops (stops recording) before the agent dies.
    perf: Option<ChildGuard>,
    child: ChildGuard,
    log: LogWatch,
    spawned: Instant,
}

impl AgentProc {
    pub fn spawn(opts: Options<'_>) -> Result<Self> {
        // The kernel kills the agent if the bench dies before its guards
        // run. Set by setpriv, not by a `pre_exec` hook: a hook makes std
        // fork this process, which holds the test API server's 100k
        // objects, instead of spawning with a shared address space. The
        // fork's copy of the page tables then counted in the cold sync, and
        // the server took a copy-on-write fault on each page it wrote to
        // during the very sync measured (on every object's reference count
        // in a streaming list: half of its CPU).
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "KILL", "--"])
            .arg(bin("weir-agent"))
            .args(opts.source)
            .arg("--cgroup")
            .arg(opts.cgroup)
            .arg("--bpffs")
            .arg(opts.pins)
            .args(["--max-services", &opts.max_services.to_string()])
            .args(["--max-backends", &opts.max_backends.to_string()])
            .args([
                "--ct-gc-interval",
                &format!("{}s", super::conntrack::SWEEP_EVERY.as_secs()),
            ])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(File::create(&opts.log)?);
        let log = LogWatch::open(&opts.log)?;
        let spawned = Instant::now();
        let child = ChildGuard(
            cmd.spawn()
                .context("starting weir-agent (build it: cargo build -p weir-agent)")?,
        );
        let perf = start_perf(child.0.id())?;
        Ok(Self {
            perf,
            child,
            log,
            spawned,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// Polls the log every 2 ms until the first sync completes.
    pub fn wait_sync(&mut self, timeout: Duration) -> Result<Synced> {
        const SYNCED: &str = "initial sync complete";
        let mut phases = Vec::new();
        loop {
            let now = self.spawned.elapsed();
            for line in self.log.poll()? {
                for milestone in [
                    "datapath attached",
                    "manifests loaded",
                    "initial list of Services and EndpointSlices complete",
                ] {
                    if line.contains(milestone) {
                        phases.push(format!("{milestone} at {:.3} s", now.as_secs_f64()));
                    }
                }
                if let Some((_, fields)) = line.split_once(SYNCED) {
                    let profiled = self.stop_perf()?;
                    return Ok(Synced {
                        cold: now,
                        phases,
                        fields: fields.trim().to_owned(),
                        profiled,
                    });
                }
            }
            if let Some(status) = self.child.0.try_wait()? {
                bail!("weir-agent exited with {status}:\n{}", self.tail());
            }
            ensure!(
                now < timeout,
                "weir-agent did not finish its first sync within {timeout:?}:\n{}",
                self.tail()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// VmRSS and VmHWM, in KiB.
    pub fn memory_kib(&self) -> Result<(u64, u64)> {
        let pid = self.pid();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let field = |name: &str| -> Result<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|kib| kib.parse().ok())
                .with_context(|| format!("no {name} in /proc/{pid}/status"))
        };
        Ok((field("VmRSS:")?, field("VmHWM:")?))
    }

    /// The kernel memory of the BPF maps the agent holds open, in KiB: the
    /// `memlock` of each map in `/proc/PID/fdinfo`, counted once per map.
    /// It is charged to the agent's memory cgroup on top of its RSS.
    pub fn maps_kib(&self) -> Result<u64> {
        let pid = self.pid();
        let mut seen = std::collections::HashSet::new();
        let mut bytes = 0u64;
        for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
            let fd = fd?;
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            if target.to_str() != Some("anon_inode:bpf-map") {
                continue;
            }
            let info = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))?;
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            };
            if let (Some(id), Some(memlock)) = (field("map_id:"), field("memlock:"))
                && seen.insert(id)
            {
                bytes += memlock;
            }
        }
        Ok(bytes / 1024)
    }

    /// utime + stime, in seconds.
    pub fn cpu_seconds(&self) -> Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))?;
        // The command name may hold spaces and parentheses; after the last ')'
        // come fields 3 (state) onwards, so utime and stime (14, 15) are 11 and 12.
        let rest = stat.rsplit_once(')').context("malformed /proc/PID/stat")?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = fields
            .get(11)
            .zip(fields.get(12))
            .and_then(|(u, s)| Some(u.parse::<u64>().ok()? + s.parse::<u64>().ok()?))
            .context("no utime/stime in /proc/PID/stat")?;
        // SAFETY: sysconf has no memory-safety preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        ensure!(hz > 0, "sysconf(_SC_CLK_TCK) failed");
        Ok(ticks as f64 / hz as f64)
    }

    /// SIGTERM, then SIGKILL after 10 s; returns what went wrong, if anything.
    pub fn stop(&mut self) -> Result<Option<String>> {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(i32::try_from(self.pid())?, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(status) = self.child.0.try_wait()? {
                return Ok((!status.success())
                    .then(|| format!("the agent exited with {status} on SIGTERM")));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.child.0.kill()?;
        self.child.0.wait()?;
        Ok(Some(
            "the agent ignored SIGTERM for 10 s and was killed".to_owned(),
        ))
    }

    /// The last lines of the log, for errors.
    pub fn tail(&mut self) -> String {
        let _ = self.log.poll();
        self.log.tail.join("\n")
    }

    /// How many warnings and errors the agent logged.
    pub fn problems(&self) -> Result<usize> {
        let text = std::fs::read_to_string(&self.log.path)?;
        Ok(text
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .count())
    }

    /// Stops `perf record` with SIGINT, which makes it write its data out
    /// (the guard's SIGKILL would not); whether one was running.
    fn stop_perf(&mut self) -> Result<bool> {
        let Some(mut perf) = self.perf.take() else {
            return Ok(false);
        };
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(i32::try_from(perf.0.id())?, libc::SIGINT) };
        let status = perf.0.wait()?;
        // perf re-raises the SIGINT once its data is written.
        use std::os::unix::process::ExitStatusExt as _;
        ensure!(
            status.success() || status.signal() == Some(libc::SIGINT),
            "perf record failed: {status}"
        );
        Ok(true)
    }
}

/// Where `perf record` writes (`WEIR_SCALE_PERF`), when the run profiles.
pub(super) fn perf_output() -> Option<std::ffi::OsString> {
    std::env::var_os("WEIR_SCALE_PERF")
}

/// `WEIR_SCALE_PERF=FILE`: `perf record` (arguments from
/// `WEIR_SCALE_PERF_ARGS`, default `-g`) attached right after the spawn. The
/// first agent (the cold start) records to FILE, later ones (the restart) to
/// FILE.2, FILE.3…: one file would keep only the last.
fn start_perf(pid: u32) -> Result<Option<ChildGuard>> {
    static SPAWNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let Some(mut out) = perf_output() else {
        return Ok(None);
    };
    let n = SPAWNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    if n > 1 {
        out.push(format!(".{n}"));
    }
    let args = std::env::var("WEIR_SCALE_PERF_ARGS").unwrap_or_else(|_| "-g".to_owned());
    let child = Command::new("perf")
        .arg("record")
        .args(args.split_whitespace())
        .arg("-o")
        .arg(out)
        .args(["-p", &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting perf record")?;
    Ok(Some(ChildGuard(child)))
}

/// Follows a log file as it grows, keeping its last lines.
struct LogWatch {
    path: PathBuf,
    file: File,
    partial: String,
    tail: Vec<String>,
}

impl LogWatch {
    fn open(path: &Path) -> Result<Self> {
        Ok(Self {
            path: path.to_owned(),
            file: File::open(path)?,
            partial: String::new(),
            tail: Vec::new(),
        })
    }

    /// The complete lines written since the last poll.
    fn poll(&mut self) -> Result<Vec<String>> {
        let mut buf = Vec::new();
        self.file.read_to_end(&mut buf)?;
        self.partial.push_str(&String::from_utf8_lossy(&buf));
        let Some(end) = self.partial.rfind('\n') else {
            return Ok(Vec::new());
        };
        let lines: Vec<String> = self.partial[..end].lines().map(str::to_owned).collect();
        self.partial.drain(..=end);
        self.tail.extend(lines.iter().cloned());
        let excess = self.tail.len().saturating_sub(40);
        self.tail.drain(..excess);
        Ok(lines)
    }
}
