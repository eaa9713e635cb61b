//! The control-plane scale bench, run small: every metric comes back finite
//! and nothing of the run is left behind. Needs root.
use std::path::Path;

use anyhow::Result;
use weir_integration::{
    bench::{
        record::{Record, WEIR_SOCKET},
        scale::{self, COLD_SYNC, METRICS, RESTART_MAP_OPS, SERVER_CPU, ScaleOptions, Source},
    },
    topology::{DIR_PREFIX, cgroup2_root},
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

fn print(records: &[Record], notes: &[String]) {
    for r in records {
        println!("{:<20} {:>12.3} {}", r.metric, r.median, r.unit);
    }
    for n in notes {
        println!("note: {n}");
    }
}

#[test]
fn small_run_reports_every_metric_and_leaves_nothing() -> Result<()> {
    let (records, notes) = scale::run(&ScaleOptions {
        sources: vec![Source::Manifests, Source::Api, Source::ApiStreaming],
        // Over kube-rs's page of 500, so the API server's lists come in
        // pages, as at scale.
        services: 1000,
        endpoints: 2,
        changes: 5,
        burst: 20,
        idle: std::time::Duration::from_secs(1),
        gc_window: std::time::Duration::from_secs(6),
        // One repetition: its pins, cgroup and log go too (checked below).
        cold_starts: 2,
    })?;
    print(&records, &notes);
    for (metric, source) in METRICS
        .iter()
        .flat_map(|m| ["manifests", "api", "api-streaming"].map(|s| (*m, s)))
        .filter(|&(m, s)| m != SERVER_CPU || s != "manifests")
    {
        let found: Vec<_> = records
            .iter()
            .filter(|r| r.metric == metric && r.variant.as_deref() == Some(source))
            .collect();
        assert_eq!(
            found.len(),
            1,
            "{metric} recorded once for {source}: {records:#?}"
        );
        let r = found[0];
        assert_eq!(
            (r.dataplane.as_str(), r.services, r.endpoints),
            (WEIR_SOCKET, 1000, 2),
            "{r:?}"
        );
        if metric == RESTART_MAP_OPS {
            assert_eq!(
                r.median, 0.0,
                "a restart with nothing changed writes nothing"
            );
        }
        assert!(
            [r.median, r.min, r.max]
                .iter()
                .all(|v| v.is_finite() && *v >= 0.0),
            "{r:?}"
        );
        if metric == COLD_SYNC {
            assert!(r.min <= r.median && r.median <= r.max, "{r:?}");
        } else {
            assert!(r.min == r.median && r.median == r.max, "one run: {r:?}");
        }
    }
    assert!(
        notes.iter().any(|n| n.contains("cold sync over 2 starts")),
        "{notes:#?}"
    );
    assert!(
        !notes
            .iter()
            .any(|n| n.contains("did not reach the map") || n.contains("warnings or errors")),
        "{notes:#?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.contains("burst of 20") && n.contains("0 of the Services")),
        "{notes:#?}"
    );
    assert_eq!(ours(&std::env::temp_dir())?, Vec::<String>::new());
    assert_eq!(ours(&cgroup2_root()?)?, Vec::<String>::new());
    Ok(())
}

/// The full-size run: `WEIR_BIN_DIR=target/release cargo test --release -p
/// weir-integration --test bench_scale -- --ignored --nocapture`. Size from
/// `WEIR_SCALE_SERVICES`, `WEIR_SCALE_ENDPOINTS`, `WEIR_SCALE_CHANGES`,
/// `WEIR_SCALE_COLD_STARTS`.
#[test]
#[ignore = "100k Services × 10 endpoints: minutes, and wants release binaries"]
fn full_scale() -> Result<()> {
    let var = |name: &str, default: u32| -> Result<u32> {
        std::env::var(name).map_or(Ok(default), |v| Ok(v.parse()?))
    };
    let opts = ScaleOptions {
        sources: vec![Source::Manifests, Source::Api, Source::ApiStreaming],
        services: var("WEIR_SCALE_SERVICES", 100_000)?,
        endpoints: var("WEIR_SCALE_ENDPOINTS", 10)?,
        changes: var("WEIR_SCALE_CHANGES", 200)?,
        burst: var("WEIR_SCALE_BURST", 1000)?,
        idle: std::time::Duration::from_secs(var("WEIR_SCALE_IDLE_SECS", 60)?.into()),
        gc_window: std::time::Duration::from_secs(var("WEIR_SCALE_GC_SECS", 30)?.into()),
        cold_starts: var("WEIR_SCALE_COLD_STARTS", 5)?,
    };
    let (records, notes) = scale::run(&opts)?;
    print(&records, &notes);
    println!("{}", serde_json::to_string_pretty(&records)?);
    Ok(())
}
