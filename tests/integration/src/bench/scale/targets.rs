//! The targets as a table: each source's figure, met or missed, and
//! kube-proxy's where the datapath bench measured one.
use std::fmt::Write as _;

use super::{
    AGENT_RSS, CHANGE_LATENCY_P99, COLD_SYNC, CT_GC_CPU, IDLE_CPU, INSPECT_TIME, RESTART_MAP_OPS,
    TARGET_CHANGE_P99_MS, TARGET_COLD_SYNC_S, TARGET_CT_GC_PCT, TARGET_IDLE_CPU_PCT,
    TARGET_INSPECT_S, TARGET_RSS_MB,
};
use crate::bench::record::Record;

/// kube-proxy in iptables mode at 100k Services × 10 endpoints, from the
/// datapath bench's reference run (docs/bench/datapath.json, 2026-11-30):
/// a full `iptables-restore` of every rule, at start and for one update.
const KUBE_PROXY_COLD_SYNC_S: f64 = 73.9;
const KUBE_PROXY_UPDATE_MS: f64 = 10_935.0;

struct Row {
    label: &'static str,
    metric: &'static str,
    /// Turns the record's value into the target's unit.
    scale: f64,
    unit: &'static str,
    target: f64,
    kube_proxy: Option<f64>,
}

const ROWS: [Row; 7] = [
    Row {
        label: "cold sync (start → every entry in the maps)",
        metric: COLD_SYNC,
        scale: 1.0,
        unit: "s",
        target: TARGET_COLD_SYNC_S,
        kube_proxy: Some(KUBE_PROXY_COLD_SYNC_S),
    },
    Row {
        label: "agent RSS after the sync",
        metric: AGENT_RSS,
        // MiB → MB.
        scale: 1.048_576,
        unit: "MB",
        target: TARGET_RSS_MB,
        kube_proxy: None,
    },
    Row {
        label: "one endpoint change → kernel map, p99",
        metric: CHANGE_LATENCY_P99,
        scale: 1.0,
        unit: "ms",
        target: TARGET_CHANGE_P99_MS,
        kube_proxy: Some(KUBE_PROXY_UPDATE_MS),
    },
    Row {
        label: "`inspect services -o json`",
        metric: INSPECT_TIME,
        scale: 1.0,
        unit: "s",
        target: TARGET_INSPECT_S,
        kube_proxy: None,
    },
    Row {
        label: "CPU while idle",
        metric: IDLE_CPU,
        scale: 1.0,
        unit: "% of a core",
        target: TARGET_IDLE_CPU_PCT,
        kube_proxy: None,
    },
    Row {
        label: "conntrack GC at full tables",
        metric: CT_GC_CPU,
        scale: 1.0,
        unit: "% of a core",
        target: TARGET_CT_GC_PCT,
        kube_proxy: None,
    },
    Row {
        label: "map writes on a restart with nothing changed",
        metric: RESTART_MAP_OPS,
        scale: 1.0,
        unit: "",
        target: 0.0,
        kube_proxy: None,
    },
];

/// A Markdown section: one row per target, one column per source found in
/// `records`. The targets are set for 100k × 10; other sizes say so.
pub fn markdown(records: &[Record]) -> String {
    let mut sources: Vec<&str> = Vec::new();
    for s in records.iter().filter_map(|r| r.variant.as_deref()) {
        if !sources.contains(&s) {
            sources.push(s);
        }
    }
    let mut out = String::from("\n## Targets\n\n");
    if let Some(r) = records.first()
        && (r.services, r.endpoints) != (100_000, 10)
    {
        let _ = writeln!(
            out,
            "This run is {} × {}; the targets are set for 100,000 × 10.\n",
            r.services, r.endpoints
        );
    }
    out.push_str("| at 100k Services × 10 endpoints | target |");
    for s in &sources {
        let _ = write!(out, " {s} |");
    }
    out.push_str(" kube-proxy (iptables) |\n|---|---:|");
    out.push_str(&"---:|".repeat(sources.len() + 1));
    out.push('\n');
    for row in &ROWS {
        let unit = if row.unit.is_empty() {
            String::new()
        } else {
            format!(" {}", row.unit)
        };
        let _ = write!(out, "| {} | ≤ {}{unit} |", row.label, fmt(row.target));
        for s in &sources {
            let value = records
                .iter()
                .find(|r| r.metric == row.metric && r.variant.as_deref() == Some(*s))
                .map(|r| r.median * row.scale);
            match value {
                Some(v) => {
                    let verdict = if v <= row.target { "met" } else { "missed" };
                    let _ = write!(out, " {}{unit}: {verdict} |", fmt(v));
                }
                None => out.push_str(" – |"),
            }
        }
        match row.kube_proxy {
            Some(v) => {
                let _ = writeln!(out, " {}{unit} |", fmt(v));
            }
            None => out.push_str(" – |\n"),
        }
    }
    out
}

/// Three significant digits, no exponent.
fn fmt(v: f64) -> String {
    if v == 0.0 || v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::record::WEIR_SOCKET;

    fn rec(metric: &str, source: &str, value: f64) -> Record {
        Record {
            dataplane: WEIR_SOCKET.to_owned(),
            variant: Some(source.to_owned()),
            services: 100_000,
            endpoints: 10,
            metric: metric.to_owned(),
            unit: String::new(),
            median: value,
            min: value,
            max: value,
        }
    }

    #[test]
    fn one_column_per_source_with_verdicts() {
        let md = markdown(&[
            rec(COLD_SYNC, "manifests", 14.2),
            rec(COLD_SYNC, "api", 1.5),
            rec(RESTART_MAP_OPS, "manifests", 0.0),
        ]);
        assert!(
            md.contains("| manifests | api | kube-proxy (iptables) |"),
            "{md}"
        );
        assert!(
            md.contains("| ≤ 2.00 s | 14.2 s: missed | 1.50 s: met | 73.9 s |"),
            "{md}"
        );
        assert!(md.contains("| ≤ 0 | 0: met | – | – |"), "{md}");
        assert!(!md.contains("This run is"), "{md}");
    }
}
