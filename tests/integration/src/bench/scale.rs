//! `cargo xtask bench scale`: the control plane at scale. N Services × M
//! endpoints as manifest files, `weir-agent` in standalone mode on a private
//! bpffs and a child cgroup; no traffic is sent. Measures the cold sync, the
//! latency of single endpoint changes (file rename → master entry in the
//! pinned map), the agent's memory and CPU, and `inspect services`.
//!
//! Setting `WEIR_SCALE_PERF=FILE` attaches `perf record` (arguments from
//! `WEIR_SCALE_PERF_ARGS`, default `-g`) to the agent from spawn to the end of
//! the first sync (the restart's agent records to FILE.2); the numbers of such
//! a run include perf's overhead.
mod agent;
mod conntrack;
mod feed;
pub mod targets;

use std::{
    collections::HashMap,
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};

pub use self::feed::Source;
use self::{agent::AgentProc, feed::Feed};
use super::{
    maps::ServicesMap,
    progress::Phase,
    record::{Record, WEIR_SOCKET, summarize},
    rules::{self, Svc},
};
use crate::{
    bin,
    topology::{Bpffs, Cgroup, ChildGuard, DIR_PREFIX, cgroup2_root, unique_id},
};

pub const COLD_SYNC: &str = "cold_sync";
pub const CHANGE_LATENCY_P50: &str = "change_latency_p50";
pub const CHANGE_LATENCY_P99: &str = "change_latency_p99";
pub const CHANGE_LATENCY_MAX: &str = "change_latency_max";
pub const AGENT_RSS: &str = "agent_rss";
/// The BPF maps' kernel memory, charged to the agent's cgroup besides RSS.
pub const MAPS_MEMORY: &str = "maps_memory";
pub const AGENT_CPU: &str = "agent_cpu";
pub const INSPECT_TIME: &str = "inspect_time";
pub const IDLE_CPU: &str = "idle_cpu";
pub const CT_GC_CPU: &str = "ct_gc_cpu";
pub const BURST_CPU: &str = "burst_cpu";
pub const BURST_CONVERGED: &str = "burst_converged";
pub const RESTART_SYNC: &str = "restart_sync";
pub const RESTART_MAP_OPS: &str = "restart_map_ops";
/// API mode only: the test API server's CPU during the cold sync.
pub const SERVER_CPU: &str = "server_cpu";
/// Every metric a run records, in order.
pub const METRICS: [&str; 15] = [
    COLD_SYNC,
    CHANGE_LATENCY_P50,
    CHANGE_LATENCY_P99,
    CHANGE_LATENCY_MAX,
    AGENT_RSS,
    MAPS_MEMORY,
    AGENT_CPU,
    IDLE_CPU,
    BURST_CPU,
    BURST_CONVERGED,
    CT_GC_CPU,
    INSPECT_TIME,
    RESTART_SYNC,
    RESTART_MAP_OPS,
    SERVER_CPU,
];

/// Targets the notes compare against (100k Services × 10 endpoints).
const TARGET_COLD_SYNC_S: f64 = 2.0;
const TARGET_CHANGE_P99_MS: f64 = 5.0;
const TARGET_RSS_MB: f64 = 200.0;
const TARGET_INSPECT_S: f64 = 1.0;
/// "Nothing measurable": under 1% of one core, with no file touched.
const TARGET_IDLE_CPU_PCT: f64 = 1.0;
/// The conntrack collector at full tables, at its default interval.
const TARGET_CT_GC_PCT: f64 = 5.0;

/// A change that has not reached the map by then counts as failed.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(5);
/// Endpoint addresses come from 10.128.0.0/9: Service `i` owns
/// `POD_BASE + i*M .. + M`, endpoints added later take the addresses after all
/// of those, so no two endpoints ever share an address.
const POD_BASE: u32 = u32::from_be_bytes([10, 128, 0, 0]);
const POD_SPACE: u64 = 1 << 23;
const SERVICE_PORT: u16 = 80;

pub struct ScaleOptions {
    /// Each source is a run of its own, one after the other.
    pub sources: Vec<Source>,
    pub services: u32,
    pub endpoints: u32,
    pub changes: u32,
    /// EndpointSlice updates written within one second, after the changes.
    pub burst: u32,
    /// How long the idle agent is watched after the sync: a periodic cost
    /// (a rescan every 10 s) only shows over a window many times its period.
    pub idle: Duration,
    /// How long the collector is watched at full conntrack tables (it
    /// sweeps every 5 s in the bench).
    pub gc_window: Duration,
    /// Cold starts per source; the cold sync is their median. On two
    /// shared cores one start is no measurement: the same binary synced in
    /// 1.95 s and in 2.48 s an hour apart.
    pub cold_starts: u32,
}

/// Runs the bench once per source; returns one record per metric and notes
/// on the targets.
pub fn run(opts: &ScaleOptions) -> Result<(Vec<Record>, Vec<String>)> {
    let (mut records, mut notes) = (Vec::new(), Vec::new());
    for &source in &opts.sources {
        let (r, n) = run_one(opts, source)?;
        records.extend(r);
        notes.extend(n.into_iter().map(|n| format!("{}: {n}", source.as_str())));
    }
    Ok((records, notes))
}

fn run_one(opts: &ScaleOptions, source: Source) -> Result<(Vec<Record>, Vec<String>)> {
    let (n, m) = (opts.services, opts.endpoints);
    ensure!(n > 0 && m > 0, "need at least one Service and one endpoint");
    let extra = u64::from(opts.changes) + u64::from(opts.burst);
    ensure!(
        u64::from(n) * u64::from(m) + extra <= POD_SPACE,
        "{n} × {m} endpoints do not fit 10.128.0.0/9"
    );
    ensure!(
        u64::from(m) + extra < u64::from(u16::MAX),
        "{m} endpoints plus {extra} changes may not fit a master entry's count"
    );
    let mut notes = Vec::new();
    let mut records = Vec::new();
    // One value, or the values of repetitions as their median and spread.
    let mut record = |metric: &str, unit: &str, values: &[f64]| {
        let (median, min, max) = summarize(values);
        records.push(Record {
            dataplane: WEIR_SOCKET.to_owned(),
            variant: Some(source.as_str().to_owned()),
            services: n,
            endpoints: m,
            metric: metric.to_owned(),
            unit: unit.to_owned(),
            median,
            min,
            max,
        });
    };

    // Guards drop in reverse: the agent, the cgroup, the bpffs (which removes
    // the work directory once unmounted), the feed (the API server), the
    // work directory if no mount was.
    let work = WorkDir::create()?;
    let svcs = rules::synthetic(n as usize, &[]);
    let phase = Phase::start(format!(
        "{}: writing {n} Services × {m} endpoints",
        source.as_str()
    ));
    let (feed, note) = Feed::create(source, &work.path, &svcs, m)?;
    drop(phase);
    notes.push(note);
    let bpffs = Bpffs::mount(work.path.join("bpf"))?;
    let pins = bpffs.pin_dir();
    let cgroup = Cgroup::create(cgroup2_root()?.join(&work.name))?;

    // Room for the endpoints the changes add, and hash-map headroom.
    let slack = extra + 1024;
    let capacity = |per_service: u32| {
        u32::try_from(u64::from(n) * u64::from(per_service) * 17 / 16 + slack)
            .context("map capacity overflows u32")
    };
    let service_entries = weir_abi::service_entries(m as usize) as u32;
    let source_args = feed.agent_args();
    let agent_opts = || -> Result<agent::Options<'_>> {
        Ok(agent::Options {
            source: &source_args,
            cgroup: &cgroup.path,
            pins: &pins,
            max_services: capacity(service_entries)?,
            max_backends: capacity(m)?,
            log: work.path.join("agent.log"),
        })
    };
    let sync_timeout = Duration::from_secs(60) + Duration::from_millis(u64::from(n) * 2);

    // 1. Cold starts: the repetitions first, each alone on its own pins,
    // then the one the other measurements follow. `perf record` follows
    // that one only.
    let profiling = agent::perf_output().is_some();
    let repetitions = if profiling {
        1
    } else {
        opts.cold_starts.max(1)
    };
    let (mut colds, mut problems) = (Vec::new(), 0);
    for i in 1..repetitions {
        let phase = Phase::start(format!("cold start {i} of {repetitions}"));
        let (cold, logged) = agent::cold_start_alone(
            &work.path.join(format!("start-{i}")),
            cgroup2_root()?.join(format!("{}-{i}", work.name)),
            &agent_opts()?,
            sync_timeout,
        )?;
        drop(phase);
        colds.push(cold.as_secs_f64());
        problems += logged;
    }
    let lab_cpu = own_cpu_seconds()?;
    let mut agent = AgentProc::spawn(agent_opts()?)?;

    let phase = Phase::start(format!("cold start {repetitions} of {repetitions}"));
    let sync = agent.wait_sync(sync_timeout)?;
    drop(phase);
    let lab_cpu = own_cpu_seconds()? - lab_cpu;
    let (rss_kib, hwm_kib) = agent.memory_kib()?;
    let maps = agent.maps_kib()? as f64 / 1024.0;
    let cpu = agent.cpu_seconds()?;
    let cold = sync.cold.as_secs_f64();
    let rss = rss_kib as f64 / 1024.0;
    colds.push(cold);
    record(COLD_SYNC, "s", &colds);
    let (cold_median, ..) = summarize(&colds);
    if colds.len() > 1 {
        let each: Vec<String> = colds.iter().map(|c| format!("{c:.3}")).collect();
        notes.push(format!(
            "cold sync over {} starts, each on fresh pins: median {cold_median:.3} s ({} s, the last the start measured below)",
            colds.len(),
            each.join(", ")
        ));
    }
    record(AGENT_RSS, "MiB", &[rss]);
    record(MAPS_MEMORY, "MiB", &[maps]);
    record(AGENT_CPU, "s", &[cpu]);
    let mut phases = sync.phases;
    phases.push(format!(
        "initial sync complete at {cold:.3} s ({})",
        sync.fields
    ));
    notes.push(format!("agent cold start: {}", phases.join(", ")));
    notes.push(format!(
        "agent after sync: VmRSS {rss:.1} MiB, VmHWM {:.1} MiB, {cpu:.2} s CPU (user+system); its BPF maps hold {maps:.1} MiB of kernel memory (--max-services {}, --max-backends {}), charged to its memory cgroup too",
        hwm_kib as f64 / 1024.0,
        capacity(service_entries)?,
        capacity(m)?
    ));
    if source != Source::Manifests {
        // The server runs in this process, which otherwise only polls the
        // agent's log: its CPU over the sync is the server's share.
        record(SERVER_CPU, "s", &[lab_cpu]);
        notes.push(format!(
            "the test API server (and this bench's log polling) used {lab_cpu:.2} s of CPU during the cold sync, against the agent's {cpu:.2} s"
        ));
    }
    if sync.profiled {
        notes.push(
            "perf record ran over the cold start: these numbers include its overhead".to_owned(),
        );
    }

    let map = ServicesMap::open(&pins)?;
    let wrong = masters_not_at(&map, &svcs, m);
    ensure!(
        wrong == 0,
        "after the first sync {wrong} of {n} Services lack a master with {m} backends; agent log:\n{}",
        agent.tail()
    );

    // An agent that keeps working with nothing to do delays every change and
    // costs CPU on every node, so say how much an idle second costs.
    let (before, started) = (agent.cpu_seconds()?, Instant::now());
    let phase = Phase::start(format!("idle CPU over {:?}", opts.idle));
    std::thread::sleep(opts.idle);
    drop(phase);
    let idle_cpu = agent.cpu_seconds()? - before;
    let idle_pct = 100.0 * idle_cpu / started.elapsed().as_secs_f64();
    record(IDLE_CPU, "% of a core", &[idle_pct]);
    notes.push(format!(
        "agent CPU while idle (nothing written for {:?} after the sync): {idle_cpu:.2} s, {idle_pct:.2}% of a core",
        opts.idle
    ));

    // 2. Single changes, then a burst.
    let mut edits = Edits::new(n, m);
    let (before, started) = (agent.cpu_seconds()?, Instant::now());
    let (samples, failures) = changes(&map, &feed, &svcs, &mut edits, opts.changes)?;
    notes.push(format!(
        "agent CPU during the changes: {:.2} s over {:.2} s",
        agent.cpu_seconds()? - before,
        started.elapsed().as_secs_f64()
    ));
    let (p50, p99, max) = percentiles(&samples);
    record(CHANGE_LATENCY_P50, "ms", &[p50]);
    record(CHANGE_LATENCY_P99, "ms", &[p99]);
    record(CHANGE_LATENCY_MAX, "ms", &[max]);
    notes.push(format!(
        "single changes ({} → master count in the map): p50 {p50:.3} ms, p99 {p99:.3} ms, max {max:.3} ms over {}",
        match source {
            Source::Manifests => "rename",
            Source::Api | Source::ApiStreaming => "PATCH of the EndpointSlice",
        },
        samples.len()
    ));
    if failures > 0 {
        notes.push(format!(
            "{failures} of {} changes did not reach the map within {CHANGE_TIMEOUT:?}; the percentiles cover only the other {}",
            opts.changes,
            samples.len()
        ));
    }
    if opts.burst > 0 {
        let _phase = Phase::start(format!("a burst of {} updates", opts.burst));
        let b = burst(&map, &feed, &agent, &svcs, &mut edits, opts.burst)?;
        record(BURST_CPU, "s", &[b.cpu]);
        record(BURST_CONVERGED, "s", &[b.converged]);
        notes.push(format!(
            "a burst of {} EndpointSlice updates over 1 s (written in {:.2} s): every one in the map {:.3} s after the first write, {:.2} s of agent CPU; {} of the Services not at their last count",
            opts.burst, b.written, b.converged, b.cpu, b.missing
        ));
    }

    // 3. The conntrack collector at full tables.
    let phase = Phase::start("conntrack collection at full tables");
    let gc = conntrack::measure(&pins, &agent, opts.gc_window)?;
    drop(phase);
    let gc_pct = gc.pct_of_core_at_default();
    record(CT_GC_CPU, "% of a core", &[gc_pct]);
    notes.push(format!(
        "conntrack collection at full tables ({} entries in the two maps): {:.2} s of CPU over {} sweeps, {:.0} ms a sweep, {gc_pct:.2}% of a core at the default 30 s interval vs ≤ {TARGET_CT_GC_PCT}%: {}",
        gc.entries,
        gc.cpu,
        gc.sweeps,
        gc.per_sweep() * 1000.0,
        if gc_pct <= TARGET_CT_GC_PCT { "met" } else { "missed" }
    ));

    // 4. `inspect services` over the full maps.
    let phase = Phase::start("inspect services -o json");
    let (inspect_time, bytes) = inspect(&pins)?;
    drop(phase);
    record(INSPECT_TIME, "s", &[inspect_time]);
    notes.push(format!(
        "inspect services -o json: {inspect_time:.2} s, {:.1} MiB of output",
        bytes as f64 / 1_048_576.0
    ));

    // 5. A restart with nothing changed: the maps are taken over as they are.
    notes.extend(agent.stop()?);
    problems += agent.problems()?;
    drop(agent);
    let mut agent = AgentProc::spawn(agent_opts()?)?;
    let phase = Phase::start("restart with nothing changed");
    let again = agent.wait_sync(sync_timeout)?;
    drop(phase);
    let restart = again.cold.as_secs_f64();
    let writes = map_ops(&again.fields);
    record(RESTART_SYNC, "s", &[restart]);
    record(
        RESTART_MAP_OPS,
        "writes",
        &[writes.map_or(f64::NAN, |w| w as f64)],
    );
    notes.push(format!(
        "restart with nothing changed: synced at {restart:.3} s with {} map writes ({})",
        writes.map_or_else(|| "?".to_owned(), |w| w.to_string()),
        again.fields
    ));
    let wrong = svcs
        .iter()
        .enumerate()
        .filter(|&(i, s)| map.count(s.vip, SERVICE_PORT) != Some(edits.count(i)))
        .count();
    ensure!(
        wrong == 0,
        "after the restart {wrong} of {n} Services lack a master with their last count; agent log:\n{}",
        agent.tail()
    );

    // 6. Stop gracefully, then remove what the agent leaves in place on purpose.
    notes.extend(agent.stop()?);
    problems += agent.problems()?;
    if problems > 0 {
        notes.push(format!("the agent logged {problems} warnings or errors"));
    }
    let out = Command::new(bin("weir-agent"))
        .args(["cleanup", "--bpffs"])
        .arg(&pins)
        .output()?;
    ensure!(
        out.status.success(),
        "weir-agent cleanup failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop((map, agent, cgroup, bpffs, feed, work));

    notes.extend(verdicts(opts, cold_median, p99, failures, rss_kib));
    notes.push(format!(
        "idle CPU {idle_pct:.2}% of a core over {:?} vs ≤ {TARGET_IDLE_CPU_PCT}%: {}",
        opts.idle,
        if idle_pct <= TARGET_IDLE_CPU_PCT {
            "met"
        } else {
            "missed"
        }
    ));
    Ok((records, notes))
}

/// `map_ops=N` in the agent's `initial sync complete` fields.
fn map_ops(fields: &str) -> Option<u64> {
    fields
        .split_whitespace()
        .find_map(|f| f.strip_prefix("map_ops="))
        .and_then(|v| v.parse().ok())
}

/// This process's utime + stime, in seconds.
fn own_cpu_seconds() -> Result<f64> {
    // SAFETY: getrusage writes into the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    ensure!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &raw mut ru) } == 0);
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(secs(ru.ru_utime) + secs(ru.ru_stime))
}

/// Runs `weir-agent inspect services -o json`; its time in seconds and how
/// many bytes it printed.
fn inspect(pins: &Path) -> Result<(f64, u64)> {
    let started = Instant::now();
    let mut child = ChildGuard(
        Command::new(bin("weir-agent"))
            .args(["inspect", "services", "-o", "json", "--bpffs"])
            .arg(pins)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?,
    );
    let mut stdout = child.0.stdout.take().context("inspect stdout")?;
    let bytes = std::io::copy(&mut stdout, &mut std::io::sink())?;
    let status = child.0.wait()?;
    let elapsed = started.elapsed().as_secs_f64();
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.0.stderr.take() {
            e.read_to_string(&mut err)?;
        }
        bail!("weir-agent inspect services failed ({status}): {err}");
    }
    Ok((elapsed, bytes))
}

/// Met or missed, with the numbers; the targets are set for 100k × 10, so a
/// smaller run only reports against them.
fn verdicts(opts: &ScaleOptions, cold: f64, p99: f64, failures: u32, rss_kib: u64) -> Vec<String> {
    let at_target = opts.services >= 100_000 && opts.endpoints >= 10;
    let scale = if at_target {
        String::new()
    } else {
        format!(
            " (this run is {} × {}; the target is for 100k × 10)",
            opts.services, opts.endpoints
        )
    };
    let verdict = |ok: bool| if ok { "met" } else { "missed" };
    let rss_mb = rss_kib as f64 * 1024.0 / 1e6;
    let p99_ok = failures == 0 && p99 <= TARGET_CHANGE_P99_MS;
    vec![
        format!(
            "cold sync {cold:.3} s vs ≤ {TARGET_COLD_SYNC_S} s: {}{scale}",
            verdict(cold <= TARGET_COLD_SYNC_S)
        ),
        format!(
            "single change p99 {p99:.3} ms{} vs ≤ {TARGET_CHANGE_P99_MS} ms: {}",
            if failures > 0 {
                format!(" ({failures} timed out)")
            } else {
                String::new()
            },
            verdict(p99_ok)
        ),
        format!(
            "agent RSS {rss_mb:.1} MB vs ≤ {TARGET_RSS_MB} MB: {}{scale}",
            verdict(rss_mb <= TARGET_RSS_MB)
        ),
    ]
}

/// `weir-test-<pid>-scale-<k>` under the temp directory, so `sweep` can tell
/// whose it is; removed on drop.
struct WorkDir {
    name: String,
    path: PathBuf,
}

impl WorkDir {
    fn create() -> Result<Self> {
        let name = format!("{DIR_PREFIX}{}", unique_id("scale-"));
        let path = std::env::temp_dir().join(&name);
        std::fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { name, path })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn file_name(svc: &Svc) -> String {
    format!("{}.yaml", svc.name)
}

/// The first `m` endpoint addresses of Service `i`.
fn initial_endpoints(i: u32, m: u32) -> Vec<u32> {
    let first = POD_BASE + i * m;
    (first..first + m).collect()
}

/// Writes one file per Service, on every core: at 100k files the file
/// system, not the formatting, is what costs.
fn generate(dir: &Path, svcs: &[Svc], m: u32) -> Result<()> {
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get().min(8));
    let chunk = svcs.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let workers: Vec<_> = svcs
            .chunks(chunk)
            .enumerate()
            .map(|(c, part)| {
                s.spawn(move || -> Result<()> {
                    let mut text = String::with_capacity(1024 + m as usize * 32);
                    for (k, svc) in part.iter().enumerate() {
                        let i = u32::try_from(c * chunk + k)?;
                        text.clear();
                        push_manifest(&mut text, svc, (POD_BASE + i * m..).take(m as usize));
                        std::fs::write(dir.join(file_name(svc)), &text)?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("generator thread panicked"))
    })
}

/// A Service with one TCP port and its EndpointSlice, built from pieces
/// rather than `format!`, as the rulesets are, to keep 100k files fast.
fn push_manifest(out: &mut String, svc: &Svc, endpoints: impl Iterator<Item = u32>) {
    let name = svc.name.as_str();
    let ns = svc.namespace.as_str();
    out.push_str("apiVersion: v1\nkind: Service\nmetadata:\n  name: ");
    out.push_str(name);
    out.push_str("\n  namespace: ");
    out.push_str(ns);
    out.push_str("\nspec:\n  clusterIP: ");
    push_ip(out, u32::from(svc.vip));
    out.push_str("\n  ports:\n  - {name: http, port: 80, protocol: TCP, targetPort: 8080}\n");
    out.push_str("---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: ");
    out.push_str(name);
    out.push_str("-1\n  namespace: ");
    out.push_str(ns);
    out.push_str("\n  labels:\n    kubernetes.io/service-name: ");
    out.push_str(name);
    out.push_str(
        "\naddressType: IPv4\nports:\n- {name: http, port: 8080, protocol: TCP}\nendpoints:\n",
    );
    for ip in endpoints {
        let pod = Pod::of(svc, ip);
        out.push_str("- addresses: [\"");
        push_ip(out, ip);
        out.push_str(
            "\"]\n  conditions: {ready: true, serving: true, terminating: false}\n  nodeName: ",
        );
        out.push_str(&pod.node);
        out.push_str("\n  targetRef: {kind: Pod, namespace: ");
        out.push_str(ns);
        out.push_str(", name: ");
        out.push_str(&pod.name);
        out.push_str(", uid: ");
        out.push_str(&pod.uid);
        out.push_str("}\n");
    }
}

/// Nodes the bench's pods run on: a cluster with 100k Services has hundreds.
const NODES: u32 = 500;

/// What the EndpointSlice controller writes about the pod behind an
/// endpoint, besides its address: real slices carry it, and the agent
/// decodes and keeps part of it.
struct Pod {
    pub node: String,
    pub name: String,
    pub uid: String,
}

impl Pod {
    pub fn of(svc: &Svc, ip: u32) -> Self {
        Self {
            node: format!("node-{}", ip % NODES),
            name: format!("{}-{ip:08x}", svc.name),
            uid: format!("00000000-0000-4000-8000-{ip:012x}"),
        }
    }
}

fn push_ip(out: &mut String, ip: u32) {
    for (k, octet) in ip.to_be_bytes().into_iter().enumerate() {
        if k > 0 {
            out.push('.');
        }
        if octet >= 100 {
            out.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            out.push(char::from(b'0' + octet / 10 % 10));
        }
        out.push(char::from(b'0' + octet % 10));
    }
}

/// How many Services lack a master entry with `m` active backends: the bench
/// measures nothing if the agent did not program what it was given.
fn masters_not_at(map: &ServicesMap, svcs: &[Svc], m: u32) -> usize {
    svcs.iter()
        .filter(|s| map.count(s.vip, SERVICE_PORT).map(u32::from) != Some(m))
        .count()
}

/// SplitMix64: deterministic, so every run changes the same Services.
fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Each Service's endpoints as the changes left them, and the addresses
/// for new ones: after all initial endpoints, so none is ever reused.
struct Edits {
    m: u32,
    current: HashMap<u32, Vec<u32>>,
    next_extra: u32,
    rng: u64,
    k: u32,
}

impl Edits {
    fn new(n: u32, m: u32) -> Self {
        Self {
            m,
            current: HashMap::new(),
            next_extra: POD_BASE + n * m,
            rng: 0x5eed,
            k: 0,
        }
    }

    /// A random Service's next endpoints: one added and one removed in turn,
    /// never down to zero (that may remove its master rather than change its
    /// count). Returns its index and the new list.
    fn next(&mut self, n: u32) -> (u32, Vec<u32>) {
        let i = (next_random(&mut self.rng) % u64::from(n)) as u32;
        let m = self.m;
        let eps = self
            .current
            .entry(i)
            .or_insert_with(|| initial_endpoints(i, m));
        if self.k.is_multiple_of(2) || eps.len() <= 1 {
            eps.push(self.next_extra);
            self.next_extra += 1;
        } else {
            eps.pop();
        }
        self.k += 1;
        (i, eps.clone())
    }

    /// Service `i`'s current endpoint count.
    fn count(&self, i: usize) -> u16 {
        let n = self
            .current
            .get(&(i as u32))
            .map_or(self.m as usize, Vec::len);
        u16::try_from(n).unwrap_or(u16::MAX)
    }
}

/// One change at a time, each timed from its write (rename or PATCH) to the
/// new count in its master entry. Returns the latencies in ms of the changes
/// that landed and how many did not.
fn changes(
    map: &ServicesMap,
    feed: &Feed,
    svcs: &[Svc],
    edits: &mut Edits,
    count: u32,
) -> Result<(Vec<f64>, u32)> {
    let n = u32::try_from(svcs.len())?;
    let mut samples = Vec::with_capacity(count as usize);
    let mut failures = 0;
    let progress = Phase::counted("single changes", u64::from(count));
    for _ in 0..count {
        progress.inc();
        let (i, eps) = edits.next(n);
        let svc = &svcs[i as usize];
        let want = u16::try_from(eps.len())?;
        let written = feed.write(svc, &eps)?;
        match map.wait_count(svc.vip, SERVICE_PORT, want, written, CHANGE_TIMEOUT) {
            Ok(latency) => samples.push(latency.as_secs_f64() * 1e3),
            Err(_) => failures += 1,
        }
    }
    Ok((samples, failures))
}

struct Burst {
    /// Seconds to issue every write.
    written: f64,
    /// Seconds from the first write until every Service shows its last count.
    converged: f64,
    /// Agent CPU seconds over the burst and its convergence.
    cpu: f64,
    /// Services not at their last count when the bench gave up.
    missing: usize,
}

/// `count` updates spread over one second, then waits until each changed
/// Service's master holds its last count: how changes coalesce under load.
fn burst(
    map: &ServicesMap,
    feed: &Feed,
    agent: &AgentProc,
    svcs: &[Svc],
    edits: &mut Edits,
    count: u32,
) -> Result<Burst> {
    let n = u32::try_from(svcs.len())?;
    let mut last: HashMap<u32, u16> = HashMap::new();
    let writes: Vec<(Svc, Vec<u32>)> = (0..count)
        .map(|_| {
            let (i, eps) = edits.next(n);
            last.insert(i, u16::try_from(eps.len()).unwrap_or(u16::MAX));
            (svcs[i as usize].clone(), eps)
        })
        .collect();
    let cpu = agent.cpu_seconds()?;
    let started = Instant::now();
    let done = feed.burst(writes, Duration::from_secs(1))?;
    let written = done.duration_since(started).as_secs_f64();
    let deadline = Instant::now() + CHANGE_TIMEOUT * 6;
    let mut pending: Vec<(u32, u16)> = last.into_iter().collect();
    loop {
        pending.retain(|&(i, want)| map.count(svcs[i as usize].vip, SERVICE_PORT) != Some(want));
        if pending.is_empty() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(Burst {
        written,
        converged: started.elapsed().as_secs_f64(),
        cpu: agent.cpu_seconds()? - cpu,
        missing: pending.len(),
    })
}

/// Nearest-rank p50, p99 and the maximum (NaN for no samples).
fn percentiles(samples: &[f64]) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    (rank(0.50), rank(0.99), v[v.len() - 1])
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn addresses_format_like_std() {
        for ip in [
            0,
            1,
            0x0a80_0009,
            0x0a80_6463,
            0xffff_ffff,
            POD_BASE + 1_000_007,
        ] {
            let mut s = String::new();
            push_ip(&mut s, ip);
            assert_eq!(s, Ipv4Addr::from(ip).to_string());
        }
    }

    #[test]
    fn manifest_lists_the_endpoints() {
        let svc = &rules::synthetic(1, &[])[0];
        let mut s = String::new();
        push_manifest(&mut s, svc, initial_endpoints(3, 2).into_iter());
        assert!(s.contains("clusterIP: 10.96.0.10\n"), "{s}");
        assert!(
            s.contains("\"10.128.0.6\"") && s.contains("\"10.128.0.7\""),
            "{s}"
        );
        assert_eq!(s.matches("- addresses").count(), 2);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentiles(&v), (50.0, 99.0, 100.0));
        assert_eq!(percentiles(&[7.0]), (7.0, 7.0, 7.0));
        assert!(percentiles(&[]).0.is_nan());
    }
}
