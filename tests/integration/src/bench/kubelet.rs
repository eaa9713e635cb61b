//! `cargo xtask bench kubelet`: weir-kubelet standalone on the harness's
//! private containerd, with images already imported (no pull in any number).
//! Measures pod start latency (static pod file renamed into place → the pod
//! Running with an IP in `/pods` on the read-only port, polled every 20 ms)
//! over pods started one at a time, the time until a burst of pods written at
//! once are all Running, and the kubelet's CPU and RSS while idle with them.
use std::{
    fmt::Write as _,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use serde_json::json;

use super::{progress::Phase, record::Record};
use crate::{
    containerd::Containerd,
    images::BUSYBOX,
    kubelet::{self, ConfigOptions, Kubelet, READ_ONLY_PORT, write_config, write_static_pod},
};

/// The `dataplane` of every record; `services` holds the pod count and
/// `endpoints` is 0.
pub const KUBELET: &str = "weir-kubelet";
pub const START_P50: &str = "pod_start_p50";
pub const START_P99: &str = "pod_start_p99";
pub const BURST_ALL_RUNNING: &str = "burst_all_running";
pub const IDLE_CPU: &str = "idle_cpu";
pub const IDLE_RSS: &str = "idle_rss";
/// Every metric a run records, in order.
pub const METRICS: [&str; 5] = [START_P50, START_P99, BURST_ALL_RUNNING, IDLE_CPU, IDLE_RSS];

const NODE: &str = "bench";
const POLL: Duration = Duration::from_millis(20);
const POD_TIMEOUT: Duration = Duration::from_secs(60);

pub struct KubeletOptions {
    /// Pods started one after the other, each removed before the next.
    pub sequential: u32,
    /// Pods written at once.
    pub burst: u32,
    /// How long the kubelet's CPU is sampled while idle with the burst's pods.
    pub idle: Duration,
}

impl Default for KubeletOptions {
    fn default() -> Self {
        Self {
            sequential: 20,
            burst: 100,
            idle: Duration::from_secs(20),
        }
    }
}

/// Runs the bench once; returns one record per metric and notes.
pub fn run(opts: &KubeletOptions) -> Result<(Vec<Record>, Vec<String>)> {
    ensure!(
        opts.sequential > 0 && opts.burst > 0,
        "need at least one pod of each kind"
    );
    let mut records = Vec::new();
    let mut notes = Vec::new();
    let mut record = |metric: &str, pods: u32, unit: &str, (median, min, max): (f64, f64, f64)| {
        records.push(Record {
            dataplane: KUBELET.to_owned(),
            variant: None,
            services: pods,
            endpoints: 0,
            metric: metric.to_owned(),
            unit: unit.to_owned(),
            median,
            min,
            max,
        });
    };

    // Guards drop in reverse: the kubelet (SIGKILL; its pods stay), then
    // containerd, which removes every sandbox and its own work directory.
    let ctrd = Containerd::start()?;
    let static_dir = ctrd.dir.join("manifests");
    std::fs::create_dir_all(&static_dir)?;
    let config = write_config(
        &ctrd,
        &ConfigOptions {
            static_dir: Some(static_dir.clone()),
            read_only_port: Some(READ_ONLY_PORT),
            ..ConfigOptions::default()
        },
    )?;
    let mut k = Kubelet::start(&ctrd, &config, None, NODE)?;
    k.wait_serving(Duration::from_secs(30))?;
    let pid = k.pid().context("kubelet pid")?;
    // A baseline without pods, so the idle number below can be read as the
    // cost of the pods rather than of the process.
    let baseline = opts.idle.min(Duration::from_secs(5));
    std::thread::sleep(Duration::from_secs(1));
    let before = kubelet::cpu_seconds(pid)?;
    std::thread::sleep(baseline);
    let empty_cpu = kubelet::cpu_seconds(pid)? - before;
    let empty_rss = kubelet::rss_kib(pid)? as f64 / 1024.0;

    // 1. One pod at a time.
    let mut samples = Vec::new();
    let progress = Phase::counted("pods started one at a time", u64::from(opts.sequential));
    for i in 0..opts.sequential {
        progress.inc();
        let name = format!("seq-{i}");
        let took = start_and_wait(&mut k, &static_dir, &name)?;
        samples.push(took.as_secs_f64() * 1e3);
        std::fs::remove_file(static_dir.join(format!("{name}.json")))?;
        let full = format!("{name}-{NODE}");
        k.poll(&format!("{full} gone"), POD_TIMEOUT, POLL, |pods| {
            kubelet::find(pods, &full).is_none().then_some(())
        })?;
    }
    let (p50, p99) = (percentile(&samples, 0.50), percentile(&samples, 0.99));
    let (min, max) = (percentile(&samples, 0.0), percentile(&samples, 1.0));
    record(START_P50, opts.sequential, "ms", (p50, min, max));
    record(START_P99, opts.sequential, "ms", (p99, min, max));
    notes.push(format!(
        "pod start over {} sequential pods: min {min:.0} ms, p50 {p50:.0} ms, p99 {p99:.0} ms, max {max:.0} ms; the first pod, containerd's first sandbox of the run, took {:.0} ms",
        samples.len(),
        samples[0]
    ));

    // 2. A burst written at once.
    drop(progress);
    let names: Vec<String> = (0..opts.burst).map(|i| format!("burst-{i}")).collect();
    let phase = Phase::start(format!("{} pods at once, until all run", opts.burst));
    let started = Instant::now();
    for n in &names {
        write_static_pod(&static_dir, &format!("{n}.json"), &pod(n).to_string())?;
    }
    let written = started.elapsed();
    let mut first_running: Vec<Option<Duration>> = vec![None; names.len()];
    let budget = POD_TIMEOUT + Duration::from_secs(2) * opts.burst;
    k.poll("the burst Running", budget, POLL, |pods| {
        let now = started.elapsed();
        for (seen, n) in first_running.iter_mut().zip(&names) {
            let full = format!("{n}-{NODE}");
            if seen.is_none()
                && kubelet::find(pods, &full)
                    .and_then(kubelet::running_ip)
                    .is_some()
            {
                *seen = Some(now);
            }
        }
        first_running.iter().all(Option::is_some).then_some(())
    })?;
    drop(phase);
    let all = started.elapsed().as_secs_f64();
    record(BURST_ALL_RUNNING, opts.burst, "s", (all, all, all));
    let mut each: Vec<f64> = first_running
        .iter()
        .flatten()
        .map(Duration::as_secs_f64)
        .collect();
    each.sort_by(f64::total_cmp);
    notes.push(format!(
        "{} pods written at once (all files in {:.0} ms): first Running after {:.2} s, half after {:.2} s, all after {all:.2} s",
        opts.burst,
        written.as_secs_f64() * 1e3,
        percentile(&each, 0.0),
        percentile(&each, 0.50),
    ));

    // 3. Idle with the burst's pods: nothing polls /pods during the window,
    // so what is measured is the kubelet's own relisting and probing.
    std::thread::sleep(Duration::from_secs(2));
    let before = kubelet::cpu_seconds(pid)?;
    // containerd answers every CRI call the kubelet makes: its share is the
    // other half of what relisting costs the node.
    let ctrd_before = kubelet::cpu_seconds(ctrd.pid())?;
    let phase = Phase::start(format!(
        "idle with {} pods over {:?}",
        opts.burst, opts.idle
    ));
    std::thread::sleep(opts.idle);
    drop(phase);
    let cpu = kubelet::cpu_seconds(pid)? - before;
    let ctrd_cpu = kubelet::cpu_seconds(ctrd.pid())? - ctrd_before;
    let rss = kubelet::rss_kib(pid)? as f64 / 1024.0;
    let window = opts.idle.as_secs_f64();
    let share = 100.0 * cpu / window;
    record(IDLE_CPU, opts.burst, "% core", (share, share, share));
    record(IDLE_RSS, opts.burst, "MiB", (rss, rss, rss));
    notes.push(format!(
        "idle with {} pods: {cpu:.2} s CPU (utime+stime) over {window:.0} s = {share:.2} % of one core; VmRSS {rss:.1} MiB",
        opts.burst
    ));
    notes.push(format!(
        "containerd over the same window: {ctrd_cpu:.2} s CPU = {:.2} % of one core (the CRI calls' other side)",
        100.0 * ctrd_cpu / window
    ));
    notes.push(format!(
        "for comparison, with no pods: {empty_cpu:.2} s CPU over {:.0} s = {:.2} % of one core; VmRSS {empty_rss:.1} MiB",
        baseline.as_secs_f64(),
        100.0 * empty_cpu / baseline.as_secs_f64()
    ));

    let log = k.log_text();
    let problems = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .count();
    if problems > 0 {
        notes.push(format!("the kubelet logged {problems} warnings or errors"));
    }
    notes.push(
        "a noisy 2-core machine: containerd, runc, the shims and the kubelet share it, so \
         expect run-to-run spread of tens of percent"
            .to_owned(),
    );
    drop(k);
    drop(ctrd);
    Ok((records, notes))
}

/// A pod that stops at once on SIGTERM: removing one must not wait out a
/// grace period, or the sequential pods would measure termination too.
fn pod(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
            }],
        },
    })
}

/// Writes `name`'s file and returns how long until `/pods` shows it Running
/// with an IP.
fn start_and_wait(k: &mut Kubelet, dir: &Path, name: &str) -> Result<Duration> {
    let full = format!("{name}-{NODE}");
    let started = Instant::now();
    write_static_pod(dir, &format!("{name}.json"), &pod(name).to_string())?;
    k.poll(&format!("{full} Running"), POD_TIMEOUT, POLL, |pods| {
        kubelet::find(pods, &full)
            .and_then(kubelet::running_ip)
            .map(|_| started.elapsed())
    })
}

/// Nearest rank; `p` 0 is the minimum, 1 the maximum (NaN for no samples).
fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// One table: what was measured, over how many pods, the value.
pub fn markdown(records: &[Record], notes: &[String]) -> String {
    let mut out =
        String::from("# weir-kubelet bench\n\n| measurement | pods | value |\n|---|---:|---:|\n");
    for r in records {
        let what = match r.metric.as_str() {
            START_P50 => "pod start, file → Running (p50)",
            START_P99 => "pod start, file → Running (p99)",
            BURST_ALL_RUNNING => "pods written at once → all Running",
            IDLE_CPU => "kubelet CPU while idle (utime+stime)",
            IDLE_RSS => "kubelet RSS while idle (VmRSS)",
            other => other,
        };
        let value = match r.unit.as_str() {
            "ms" => format!("{:.0} ms", r.median),
            "s" => format!("{:.2} s", r.median),
            "% core" => format!("{:.2} % of a core", r.median),
            unit => format!("{:.1} {unit}", r.median),
        };
        let _ = writeln!(out, "| {what} | {} | {value} |", r.services);
    }
    if !notes.is_empty() {
        out.push_str("\n## Notes\n\n");
        for n in notes {
            let _ = writeln!(out, "- {n}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.50), 10.0);
        assert_eq!(percentile(&v, 0.99), 20.0);
        assert_eq!(percentile(&v, 0.0), 1.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn table_has_a_row_per_record() {
        let r = Record {
            dataplane: KUBELET.into(),
            variant: None,
            services: 20,
            endpoints: 0,
            metric: START_P50.into(),
            unit: "ms".into(),
            median: 812.4,
            min: 700.0,
            max: 900.0,
        };
        let md = markdown(&[r], &["noisy".into()]);
        assert!(
            md.contains("| pod start, file → Running (p50) | 20 | 812 ms |"),
            "{md}"
        );
        assert!(md.contains("- noisy"), "{md}");
    }
}
