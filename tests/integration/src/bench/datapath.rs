//! `cargo xtask bench datapath`: the same N Services × M endpoints programmed
//! into each dataplane, each in its own lab, measured in turns so machine drift
//! touches every dataplane alike.
use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use serde::Deserialize;

use super::{
    lab::{self, BACKEND_PORT, BACKEND_UDP_PORT, Lab},
    maps::ServicesMap,
    prog_stats,
    record::{self, Record},
    report::Plot,
    rules::{self, Ipv4Cidr, Proto, Svc, Sync, Variant},
};
use crate::{Agent, bin, topology::Bpffs};

mod manifests;

/// The plots `cargo xtask bench datapath` draws.
pub const PLOTS: &[Plot] = &[
    Plot {
        file: "crr-rate.svg",
        title: "New TCP connections per second (last Service)",
        metric: "crr_rate_last",
        y_label: "connections/s",
        log_y: false,
    },
    Plot {
        file: "crr-p99.svg",
        title: "p99 latency of a new connection and request (last Service)",
        metric: "crr_p99_last",
        y_label: "µs",
        log_y: false,
    },
    Plot {
        file: "update-latency.svg",
        title: "Applying one endpoint change",
        metric: "update_latency",
        y_label: "ms",
        log_y: true,
    },
];

#[derive(Clone, Debug)]
pub struct DatapathOptions {
    pub services: Vec<u32>,
    pub endpoints: u32,
    pub reps: u32,
    pub duration_ms: u64,
    pub warmup_ms: u64,
    pub threads: u32,
    /// Endpoint changes timed per dataplane and N.
    pub updates: u32,
    /// A ruleset that takes longer than this to load is reported as skipped.
    pub load_timeout: Duration,
    /// Program every lab at once: the loads overlap on the two cores, so
    /// `cold_sync` is an upper bound; only `--quick` does it, to stay short.
    pub parallel_programming: bool,
    /// The contenders by label ([`contender_labels`]); empty: all of them.
    pub contenders: Vec<String>,
}

impl DatapathOptions {
    pub fn full() -> Self {
        Self {
            services: vec![1, 1_000, 10_000, 50_000, 100_000],
            endpoints: 2,
            reps: 3,
            duration_ms: 2_000,
            warmup_ms: 500,
            threads: 4,
            updates: 5,
            // kube-proxy's nftables and iptables-nft loads grow much faster than
            // linearly; past this a ruleset is reported as not loadable.
            load_timeout: Duration::from_secs(120),
            parallel_programming: false,
            contenders: Vec::new(),
        }
    }

    /// Keeps only the contenders named (see [`contender_labels`]).
    pub fn only(mut self, labels: Vec<String>) -> Result<Self> {
        let known = contender_labels();
        if let Some(bad) = labels.iter().find(|l| !known.contains(l)) {
            bail!(
                "no contender {bad:?}; the contenders are {}",
                known.join(", ")
            );
        }
        self.contenders = labels;
        Ok(self)
    }

    pub fn quick() -> Self {
        Self {
            services: vec![1, 1_000, 10_000],
            // Three, so a median and a spread exist on two noisy cores.
            reps: 3,
            duration_ms: 700,
            warmup_ms: 200,
            updates: 3,
            parallel_programming: true,
            ..Self::full()
        }
    }

    /// For the harness's own test: every output, in seconds.
    pub fn tiny() -> Self {
        Self {
            services: vec![10],
            reps: 1,
            duration_ms: 300,
            warmup_ms: 100,
            updates: 2,
            load_timeout: Duration::from_secs(60),
            ..Self::full()
        }
    }
}

/// Every contender's label, as `--contenders` takes them.
pub fn contender_labels() -> Vec<String> {
    Kind::ALL.iter().map(|k| k.label()).collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Direct,
    WeirSocket,
    WeirTc,
    WeirTcExt,
    WeirTcMaglev,
    Iptables(Variant),
    Nftables,
}

impl Kind {
    const ALL: [Self; 8] = [
        Self::Direct,
        Self::WeirSocket,
        Self::WeirTc,
        Self::WeirTcExt,
        Self::WeirTcMaglev,
        Self::Iptables(Variant::Legacy),
        Self::Iptables(Variant::Nft),
        Self::Nftables,
    ];

    fn dataplane(self) -> (&'static str, Option<&'static str>) {
        match self {
            Self::Direct => (record::DIRECT, None),
            Self::WeirSocket => (record::WEIR_SOCKET, None),
            Self::WeirTc => (record::WEIR_TC, None),
            Self::WeirTcExt => (record::WEIR_TC_EXT, None),
            Self::WeirTcMaglev => (record::WEIR_TC_MAGLEV, None),
            Self::Iptables(Variant::Legacy) => (record::IPTABLES, Some("legacy")),
            Self::Iptables(Variant::Nft) => (record::IPTABLES, Some("nft")),
            Self::Nftables => (record::NFTABLES, None),
        }
    }

    fn is_weir(self) -> bool {
        matches!(
            self,
            Self::WeirSocket | Self::WeirTc | Self::WeirTcExt | Self::WeirTcMaglev
        )
    }

    /// How the Services' manifests present the VIP the clients use.
    fn frontend(self) -> manifests::Frontend {
        match self {
            Self::WeirTcExt => manifests::Frontend::ExternalIp { maglev: false },
            Self::WeirTcMaglev => manifests::Frontend::ExternalIp { maglev: true },
            _ => manifests::Frontend::ClusterIp,
        }
    }

    fn label(self) -> String {
        match self.dataplane() {
            (d, Some(v)) => format!("{d}-{v}"),
            (d, None) => d.to_owned(),
        }
    }
}

/// Weir's agent and its private bpffs, for the two Weir labs.
struct WeirState {
    bpffs: Bpffs,
    manifests: PathBuf,
    agent: Option<WeirAgent>,
}

/// The socket-LB agent runs beside the test (its programs hang on the lab's
/// cgroup); the TC agent runs in the lab's node namespace, on its devices.
enum WeirAgent {
    Socket(Agent),
    Tc(lab::NodeAgent),
}

impl WeirAgent {
    fn pid(&self) -> Option<u32> {
        match self {
            Self::Socket(a) => a.pid(),
            Self::Tc(a) => a.pid(),
        }
    }

    fn stop(&mut self, signal: i32) -> Result<()> {
        match self {
            Self::Socket(a) => a.stop(signal),
            Self::Tc(a) => a.stop(signal),
        }
    }
}

struct Contender {
    kind: Kind,
    lab: Lab,
    weir: Option<WeirState>,
    /// Why this dataplane has no numbers at the current N.
    skipped: Option<String>,
}

/// Samples of one (contender, N) pair, by metric.
type Samples = BTreeMap<(&'static str, &'static str), Vec<f64>>;

#[derive(Deserialize)]
struct LoadReport {
    requests: u64,
    #[serde(default)]
    errors: BTreeMap<String, u64>,
    rate_per_s: f64,
    latency_us: Latency,
    client_cpu_s: f64,
    softirq_s: Option<f64>,
}

#[derive(Deserialize)]
struct Latency {
    p50: f64,
    p99: f64,
}

/// The pod network: kube-proxy masquerades Service traffic from outside it,
/// and the labs' clients and backends are inside, as pods are.
fn cluster_cidr() -> Ipv4Cidr {
    Ipv4Cidr::new(Ipv4Addr::new(10, 64, 0, 0), 10).expect("valid prefix")
}

const UDP_VIP: Ipv4Addr = Ipv4Addr::new(10, 111, 255, 253);

pub fn run(opts: &DatapathOptions, work: &Path) -> Result<(Vec<Record>, Vec<String>)> {
    std::fs::create_dir_all(work)?;
    let mut notes = Vec::new();
    let mut contenders = Vec::new();
    let wanted = |k: &Kind| opts.contenders.is_empty() || opts.contenders.contains(&k.label());
    for kind in Kind::ALL.into_iter().filter(wanted) {
        let lab = Lab::new(&kind.label(), opts.endpoints)?;
        lab.full_checksums()?;
        let weir = if kind.is_weir() {
            let dir = work.join(kind.label());
            std::fs::create_dir_all(dir.join("manifests"))?;
            Some(WeirState {
                bpffs: Bpffs::mount(dir.join("bpf"))?,
                manifests: dir.join("manifests"),
                agent: None,
            })
        } else {
            None
        };
        contenders.push(Contender {
            kind,
            lab,
            weir,
            skipped: None,
        });
    }
    let endpoints: Vec<(Ipv4Addr, u16)> = contenders[0]
        .lab
        .backends
        .iter()
        .map(|&ip| (ip, BACKEND_PORT))
        .collect();

    // Direct UDP goes to every backend with the rule socket LB applies to
    // an unconnected socket: each loadgen worker's socket keeps one backend
    // drawn at random, so the servers share the load as they do behind a
    // Service.
    let direct_udp = work.join("targets-direct-udp");
    lab::write_targets(
        &direct_udp,
        endpoints
            .iter()
            .map(|&(ip, _)| format!("{ip}:{BACKEND_UDP_PORT}")),
    )?;
    // Programs' run time is counted only while this is held (BPF_ENABLE_STATS;
    // nothing global is left switched on).
    let _stats = prog_stats::enable()?;

    let mut records = Vec::new();
    for &n in &opts.services {
        let mut svcs = rules::synthetic(n as usize, &endpoints);
        let last = svcs.last().context("at least one Service")?.vip;
        svcs.push(Svc {
            namespace: "bench".into(),
            name: "dns".into(),
            port_name: "dns".into(),
            vip: UDP_VIP,
            port: 53,
            proto: Proto::Udp,
            endpoints: endpoints
                .iter()
                .map(|&(ip, _)| (ip, BACKEND_UDP_PORT))
                .collect(),
        });
        let random = work.join(format!("targets-{n}"));
        lab::write_targets(
            &random,
            svcs.iter()
                .filter(|s| s.proto == Proto::Tcp)
                .map(|s| format!("{}:{}", s.vip, s.port)),
        )?;

        let mut samples: Vec<Samples> = vec![Samples::new(); contenders.len()];
        let programmed: Vec<Result<Option<Duration>>> = if opts.parallel_programming {
            std::thread::scope(|scope| {
                let svcs = &svcs;
                let jobs: Vec<_> = contenders
                    .iter_mut()
                    .map(|c| {
                        // The agent stays on this thread: it is spawned with
                        // PDEATHSIG, which fires when the spawning thread ends.
                        if c.kind.is_weir() {
                            Job::Done(program(c, svcs, opts))
                        } else {
                            Job::Running(scope.spawn(move || program(c, svcs, opts)))
                        }
                    })
                    .collect();
                jobs.into_iter()
                    .map(|j| match j {
                        Job::Running(h) => {
                            h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
                        }
                        Job::Done(done) => done,
                    })
                    .collect()
            })
        } else {
            contenders
                .iter_mut()
                .map(|c| program(c, &svcs, opts))
                .collect()
        };
        for ((c, s), programmed) in contenders.iter_mut().zip(&mut samples).zip(programmed) {
            c.skipped = None;
            match programmed {
                Ok(Some(t)) => push(s, "cold_sync", "s", t.as_secs_f64()),
                Ok(None) => {}
                Err(e) => {
                    let why = format!("{} at {n} Services skipped: {e:#}", c.kind.label());
                    eprintln!("bench: {why}");
                    notes.push(why.clone());
                    c.skipped = Some(why);
                    continue;
                }
            }
            for u in 0..opts.updates {
                match update(c, &svcs, u) {
                    Ok(Some(t)) => push(s, "update_latency", "ms", t.as_secs_f64() * 1e3),
                    Ok(None) => break,
                    Err(e) => {
                        notes.push(format!("{} at {n}: update failed: {e:#}", c.kind.label()));
                        break;
                    }
                }
            }
        }

        // Warm every lab once (caches, conntrack, ARP), then measure in turns.
        for c in contenders.iter().filter(|c| c.skipped.is_none()) {
            let _ = loadgen(c, opts, "crr", &service_target(c, last), 300);
        }
        for rep in 0..opts.reps {
            for (c, s) in contenders.iter().zip(&mut samples) {
                if c.skipped.is_some() {
                    continue;
                }
                eprintln!(
                    "bench: N={n} rep {}/{} {}",
                    rep + 1,
                    opts.reps,
                    c.kind.label()
                );
                let pins = c.weir.as_ref().map(|w| w.bpffs.pin_dir());
                let before = prog_stats::read(pins.as_deref())?;
                measure(c, opts, n, last, (&random, &direct_udp), s, &mut notes)?;
                let after = prog_stats::read(pins.as_deref())?;
                for (metric, ns) in prog_stats::per_run(&before, &after) {
                    push(s, metric, "ns/run", ns);
                }
            }
        }
        for (c, s) in contenders.iter().zip(&samples) {
            if let Some(w) = &c.weir
                && let Some(pid) = w.agent.as_ref().and_then(WeirAgent::pid)
                && c.skipped.is_none()
            {
                let (rss, cpu) = proc_usage(pid)?;
                let mut s = s.clone();
                push(&mut s, "agent_rss", "MiB", rss);
                push(&mut s, "agent_cpu", "s", cpu);
                emit(&mut records, c.kind, n, opts.endpoints, &s);
            } else {
                emit(&mut records, c.kind, n, opts.endpoints, s);
            }
        }
    }
    for c in &mut contenders {
        if let Some(w) = &mut c.weir
            && let Some(mut a) = w.agent.take()
        {
            a.stop(libc::SIGTERM)?;
            cleanup_weir(w)?;
        }
    }
    notes.extend(udp_verdicts(&records));
    Ok((records, notes))
}

/// The target, from 10,000 Services up: weir-socket's unconnected
/// UDP request rate at least 0.95 of direct's at the same N.
const UDP_TARGET_RATIO: f64 = 0.95;
const UDP_TARGET_FROM: u32 = 10_000;

fn udp_verdicts(records: &[Record]) -> Vec<String> {
    let rate = |dataplane: &str, n: u32| {
        records
            .iter()
            .find(|r| r.dataplane == dataplane && r.services == n && r.metric == "udp_rate")
            .map(|r| r.median)
    };
    let mut ns: Vec<u32> = records.iter().map(|r| r.services).collect();
    ns.sort_unstable();
    ns.dedup();
    ns.into_iter()
        .filter(|&n| n >= UDP_TARGET_FROM)
        .filter_map(|n| {
            let (weir, direct) = (rate(record::WEIR_SOCKET, n)?, rate(record::DIRECT, n)?);
            let ratio = weir / direct;
            let verdict = if ratio >= UDP_TARGET_RATIO {
                "met"
            } else {
                "missed"
            };
            Some(format!(
                "udp_rate at {n} Services: weir-socket {weir:.0} req/s = {ratio:.2} × direct \
                 ({direct:.0}) vs ≥ {UDP_TARGET_RATIO}: {verdict}"
            ))
        })
        .collect()
}

/// A lab being programmed on its own thread, or already programmed.
enum Job<'scope, T> {
    Running(std::thread::ScopedJoinHandle<'scope, T>),
    Done(T),
}

fn push(s: &mut Samples, metric: &'static str, unit: &'static str, v: f64) {
    s.entry((metric, unit)).or_default().push(v);
}

fn emit(records: &mut Vec<Record>, kind: Kind, n: u32, m: u32, s: &Samples) {
    let (dataplane, variant) = kind.dataplane();
    for ((metric, unit), v) in s {
        let (median, min, max) = record::summarize(v);
        records.push(Record {
            dataplane: dataplane.to_owned(),
            variant: variant.map(str::to_owned),
            services: n,
            endpoints: m,
            metric: (*metric).to_owned(),
            unit: (*unit).to_owned(),
            median,
            min,
            max,
        });
    }
}

/// Programs `svcs` into the contender from scratch; returns how long that
/// took (`None` for direct, which has nothing to program).
fn program(c: &mut Contender, svcs: &[Svc], opts: &DatapathOptions) -> Result<Option<Duration>> {
    eprintln!(
        "bench: programming {} with {} Services",
        c.kind.label(),
        svcs.len() - 1
    );
    let netns = c.lab.node_path();
    match c.kind {
        Kind::Direct => Ok(None),
        Kind::Iptables(variant) => {
            rules::flush_iptables(&netns, variant)?;
            let input = rules::iptables_restore_input(svcs, cluster_cidr());
            timed(opts.load_timeout, &c.lab.node, || {
                Ok(rules::load_iptables(&netns, variant, &input)?)
            })
            .map(Some)
        }
        Kind::Nftables => {
            rules::flush_nft(&netns)?;
            let input = rules::nft_input(svcs, cluster_cidr());
            timed(opts.load_timeout, &c.lab.node, || {
                Ok(rules::load_nft(&netns, &input)?)
            })
            .map(Some)
        }
        Kind::WeirSocket | Kind::WeirTc | Kind::WeirTcExt | Kind::WeirTcMaglev => {
            let w = c.weir.as_mut().context("weir state")?;
            if let Some(mut a) = w.agent.take() {
                a.stop(libc::SIGTERM)?;
            }
            cleanup_weir(w)?;
            manifests::write_all(&w.manifests, svcs, c.kind.frontend())?;
            // An external-IP Service has two frontends, its cluster IP's and
            // the external IP's, each with its own entries.
            let per = if c.kind.frontend() == manifests::Frontend::ClusterIp {
                1
            } else {
                2
            };
            let m = per
                * svcs
                    .iter()
                    .map(|s| weir_abi::service_entries(s.endpoints.len()))
                    .sum::<usize>()
                + 1024;
            let b = per * svcs.iter().map(|s| s.endpoints.len()).sum::<usize>() + 1024;
            let (max_s, max_b) = (m.to_string(), b.to_string());
            let pins = w.bpffs.pin_dir();
            let log = w
                .bpffs
                .dir
                .parent()
                .unwrap_or(&w.bpffs.dir)
                .join("agent.log");
            let limits = ["--max-services", &max_s, "--max-backends", &max_b];
            let t = Instant::now();
            let agent = if c.kind == Kind::WeirSocket {
                WeirAgent::Socket(Agent::start_with(
                    &w.manifests,
                    &c.lab.cgroup.path,
                    &pins,
                    log,
                    &limits,
                )?)
            } else {
                // No socket hooks on the lab's cgroup: every Service
                // connection leaves the client as packets to the VIP and is
                // translated by TC on vc, its replies by TC on br0.
                let (m, cg, p) = (
                    w.manifests.display().to_string(),
                    c.lab.cgroup.path.display().to_string(),
                    pins.display().to_string(),
                );
                let mut args = vec!["--manifests", &m, "--cgroup", &cg, "--bpffs", &p];
                args.extend(["--socket-lb=false", "--devices", lab::NODE_DEVICES]);
                args.extend(limits);
                // A table per external frontend, one per Service.
                let tables = (svcs.len() + 1024).to_string();
                if c.kind.frontend() != manifests::Frontend::ClusterIp {
                    // SNAT keeps the client's port wherever the range holds
                    // it, and the lab's node has no sockets of its own to
                    // collide with: the default 4,536 ports per backend would
                    // run out within a second of connect-request-reply.
                    args.extend(["--snat-port-range", "1024-65535"]);
                    // 997 positions (≥ 100 × the 2 backends) fill one 4 KiB
                    // chunk: 400 MiB at 100,000 Services, where the default
                    // size would take 6.8 GiB.
                    args.extend(["--maglev-table-size", "997"]);
                    args.extend(["--max-maglev-tables", &tables]);
                }
                WeirAgent::Tc(
                    c.lab
                        .start_node_agent(&args, &log, Duration::from_secs(300))?,
                )
            };
            let took = t.elapsed();
            w.agent = Some(agent);
            Ok(Some(took))
        }
    }
}

/// Runs a ruleset load, giving up after `limit`: the loader is then killed
/// (it runs inside the lab's node namespace, where nothing else lives) and
/// the half-loaded ruleset flushed by the caller's next `program`.
fn timed(
    limit: Duration,
    node: &crate::topology::Netns,
    f: impl FnOnce() -> Result<()> + Send,
) -> Result<Duration> {
    let t = Instant::now();
    std::thread::scope(|scope| {
        let load = scope.spawn(f);
        while !load.is_finished() {
            if t.elapsed() > limit {
                kill_netns_processes(&node.name);
                let _ = load.join();
                bail!("loading did not finish within {limit:?} and was stopped");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        load.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
    })?;
    Ok(t.elapsed())
}

fn kill_netns_processes(netns: &str) {
    let Ok(out) = Command::new("ip").args(["netns", "pids", netns]).output() else {
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

fn cleanup_weir(w: &WeirState) -> Result<()> {
    let out = Command::new(bin("weir-agent"))
        .args(["cleanup", "--bpffs"])
        .arg(w.bpffs.pin_dir())
        .output()?;
    if !out.status.success() {
        bail!(
            "weir-agent cleanup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for e in std::fs::read_dir(&w.manifests)? {
        std::fs::remove_file(e?.path())?;
    }
    Ok(())
}

/// Times one endpoint change of the last TCP Service: the first endpoint is
/// dropped on even rounds and restored on odd ones. `None` when the dataplane
/// has no control plane to time.
fn update(c: &mut Contender, svcs: &[Svc], round: u32) -> Result<Option<Duration>> {
    let idx = svcs
        .iter()
        .rposition(|s| s.proto == Proto::Tcp)
        .context("a TCP Service")?;
    let full = &svcs[idx];
    let mut shrunk = full.clone();
    shrunk.endpoints.remove(0);
    let (old, new) = if round.is_multiple_of(2) {
        (full, &shrunk)
    } else {
        (&shrunk, full)
    };
    let mut after = svcs.to_vec();
    after[idx] = new.clone();
    let netns = c.lab.node_path();
    match c.kind {
        Kind::Direct => return Ok(None),
        Kind::Iptables(variant) => {
            // kube-proxy's default since 1.27: only the changed Service's
            // chains, but still every rule of KUBE-SERVICES.
            let input = rules::iptables_update_input(&after, cluster_cidr(), old, Sync::Partial);
            let started = Instant::now();
            rules::load_iptables(&netns, variant, &input)?;
            return Ok(Some(started.elapsed()));
        }
        Kind::Nftables => {
            let input = rules::nft_endpoint_update(old, new, cluster_cidr());
            let started = Instant::now();
            rules::load_nft(&netns, &input)?;
            return Ok(Some(started.elapsed()));
        }
        Kind::WeirSocket | Kind::WeirTc | Kind::WeirTcExt | Kind::WeirTcMaglev => {}
    }
    let w = c.weir.as_ref().context("weir state")?;
    let map = ServicesMap::open(&w.bpffs.pin_dir())?;
    let mut text = String::new();
    manifests::text(&mut text, new, &new.endpoints, c.kind.frontend());
    let file = w.manifests.join(format!("svc-{idx:06}.yaml"));
    let tmp = w.manifests.join(format!(".svc-{idx:06}.yaml.tmp"));
    std::fs::write(&tmp, &text)?;
    let started_write = Instant::now();
    std::fs::rename(&tmp, &file)?;
    let count = u16::try_from(new.endpoints.len())?;
    Ok(Some(map.wait_count(
        new.vip,
        new.port,
        count,
        started_write,
        Duration::from_secs(30),
    )?))
}

enum Target<'a> {
    One(Ipv4Addr, u16),
    Random(&'a Path),
    /// One target per loadgen worker, drawn at random from the file once.
    PerWorker(&'a Path),
}

fn loadgen(
    c: &Contender,
    opts: &DatapathOptions,
    mode: &str,
    target: &Target<'_>,
    ms: u64,
) -> Result<LoadReport> {
    let mut cmd = c.lab.loadgen();
    cmd.args(["--mode", mode, "--threads", &opts.threads.to_string()])
        .args([
            "--duration-ms",
            &ms.to_string(),
            "--warmup-ms",
            &opts.warmup_ms.to_string(),
        ]);
    match target {
        Target::One(ip, port) => cmd.args(["--target", &format!("{ip}:{port}")]),
        Target::Random(file) => cmd.arg("--targets").arg(file).args(["--pick", "random"]),
        Target::PerWorker(file) => cmd
            .arg("--targets")
            .arg(file)
            .args(["--pick", "per-worker"]),
    };
    let out = cmd.output()?;
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "weir-loadgen in {}: {}",
            c.kind.label(),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The last Service's VIP, or for direct, which has no Service, the backend
/// itself: the physical limit every ratio is taken against.
fn service_target(c: &Contender, last: Ipv4Addr) -> Target<'static> {
    if c.kind == Kind::Direct {
        Target::One(c.lab.backends[0], BACKEND_PORT)
    } else {
        Target::One(last, 80)
    }
}

/// One round of every traffic metric for one contender.
fn measure(
    c: &Contender,
    opts: &DatapathOptions,
    n: u32,
    last: Ipv4Addr,
    (random, direct_udp): (&Path, &Path),
    s: &mut Samples,
    notes: &mut Vec<String>,
) -> Result<()> {
    let d = opts.duration_ms;
    let direct_target = Target::One(c.lab.backends[0], BACKEND_PORT);
    let svc_last = service_target(c, last);
    let svc_random = (c.kind != Kind::Direct && n > 1).then_some(Target::Random(random));
    let mut check = |what: &str, r: &LoadReport| {
        let errors: u64 = r.errors.values().sum();
        if errors > 0 || r.requests == 0 {
            notes.push(format!(
                "{} at {n} Services, {what}: {} requests, errors {:?}",
                c.kind.label(),
                r.requests,
                r.errors
            ));
        }
    };
    let r = loadgen(c, opts, "crr", &svc_last, d)?;
    check("crr", &r);
    push(s, "crr_rate_last", "conn/s", r.rate_per_s);
    push(s, "crr_p50_last", "us", r.latency_us.p50);
    push(s, "crr_p99_last", "us", r.latency_us.p99);
    if r.requests > 0 {
        let cpu = r.client_cpu_s + r.softirq_s.unwrap_or(0.0);
        push(s, "cpu_per_conn", "us", cpu / r.requests as f64 * 1e6);
    }
    if let Some(t) = &svc_random {
        let r = loadgen(c, opts, "crr", t, d)?;
        check("crr random", &r);
        push(s, "crr_rate_random", "conn/s", r.rate_per_s);
        push(s, "crr_p99_random", "us", r.latency_us.p99);
    }
    let r = loadgen(c, opts, "rr", &svc_last, d)?;
    check("rr", &r);
    push(s, "rr_p50", "us", r.latency_us.p50);
    push(s, "rr_p99", "us", r.latency_us.p99);
    let udp = if c.kind == Kind::Direct {
        Target::PerWorker(direct_udp)
    } else {
        Target::One(UDP_VIP, 53)
    };
    let r = loadgen(c, opts, "udp", &udp, d)?;
    check("udp", &r);
    push(s, "udp_rate", "req/s", r.rate_per_s);
    push(s, "udp_p50", "us", r.latency_us.p50);
    push(s, "udp_p99", "us", r.latency_us.p99);
    push(
        s,
        "udp_errors",
        "count",
        r.errors.values().sum::<u64>() as f64,
    );
    let r = loadgen(c, opts, "crr", &direct_target, d)?;
    check("unrelated crr", &r);
    push(s, "unrelated_crr_rate", "conn/s", r.rate_per_s);
    Ok(())
}

/// RSS (MiB) and CPU time (s) of a process.
fn proc_usage(pid: u32) -> Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("VmRSS")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command: utime and stime are 14th and 15th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((rss_kb / 1024.0, ticks / hz))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contenders_are_chosen_by_label() {
        let two = vec!["direct".to_owned(), "weir-socket".to_owned()];
        let o = DatapathOptions::quick().only(two.clone()).unwrap();
        assert_eq!(o.contenders, two);
        let e = DatapathOptions::quick()
            .only(vec!["ipvs".into()])
            .unwrap_err();
        assert!(e.to_string().contains("iptables-legacy"), "{e}");
    }
}
