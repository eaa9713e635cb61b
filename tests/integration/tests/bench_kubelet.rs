//! The kubelet bench, run small: every metric comes back once with a sane
//! value, and nothing of the run is left behind. Needs root.
use std::{path::Path, time::Duration};

use anyhow::Result;
use weir_integration::{
    bench::kubelet::{self, BURST_ALL_RUNNING, IDLE_RSS, KUBELET, KubeletOptions, METRICS},
    topology::DIR_PREFIX,
};

/// Names under `dir` that this process's harness created.
fn ours(dir: &Path) -> Result<Vec<String>> {
    let prefix = format!("{DIR_PREFIX}{}-", std::process::id());
    Ok(std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(&prefix))
        .collect())
}

#[test]
fn small_run_reports_every_metric_and_leaves_nothing() -> Result<()> {
    let (records, notes) = kubelet::run(&KubeletOptions {
        sequential: 3,
        burst: 5,
        idle: Duration::from_secs(3),
    })?;
    print!("{}", kubelet::markdown(&records, &notes));
    for metric in METRICS {
        let found: Vec<_> = records.iter().filter(|r| r.metric == metric).collect();
        assert_eq!(found.len(), 1, "{metric} recorded once: {records:#?}");
        let r = found[0];
        assert_eq!(r.dataplane, KUBELET, "{r:?}");
        assert!(
            [r.median, r.min, r.max]
                .iter()
                .all(|v| v.is_finite() && *v >= 0.0),
            "{r:?}"
        );
        assert!(r.min <= r.median && r.median <= r.max, "{r:?}");
    }
    let get = |m: &str| records.iter().find(|r| r.metric == m).map(|r| r.median);
    // A pod cannot be Running before a sandbox and a container exist, and
    // with local images none should take a minute.
    let p50 = get(kubelet::START_P50).unwrap_or_default();
    let p99 = get(kubelet::START_P99).unwrap_or_default();
    assert!(p50 > 10.0 && p50 <= p99 && p99 < 60_000.0, "{p50} {p99}");
    let burst = get(BURST_ALL_RUNNING).unwrap_or_default();
    assert!(burst > 0.01 && burst < 120.0, "{burst}");
    let rss = get(IDLE_RSS).unwrap_or_default();
    assert!(rss > 1.0 && rss < 1024.0, "RSS {rss} MiB");
    assert!(notes.iter().any(|n| n.contains("noisy")), "{notes:#?}");
    assert_eq!(ours(&std::env::temp_dir())?, Vec::<String>::new());
    Ok(())
}
