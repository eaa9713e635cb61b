//! The datapath bench's own test: a tiny run (N = 10) completes for every
//! dataplane and yields every metric. It asserts what was measured exists and
//! is sane, never how fast anything was.
use anyhow::Result;
use weir_integration::bench::{
    datapath::{self, DatapathOptions},
    record, report,
};

#[test]
fn a_tiny_run_measures_every_dataplane_and_metric() -> Result<()> {
    let work = std::env::temp_dir().join(format!("weir-test-{}-bench", std::process::id()));
    let (records, notes) = datapath::run(&DatapathOptions::tiny(), &work)?;
    // Every output file a real run writes.
    let out = work.join("out");
    std::fs::create_dir_all(&out)?;
    let md = report::markdown("tiny", &records, &notes);
    // Shown with --nocapture.
    eprintln!("{md}");
    assert!(
        md.contains("crr_rate_last") && md.contains("weir-socket") && md.contains("weir-tc"),
        "{md}"
    );
    report::write_json(&out.join("datapath.json"), &records)?;
    let back: Vec<record::Record> =
        serde_json::from_slice(&std::fs::read(out.join("datapath.json"))?)?;
    assert_eq!(back.len(), records.len());
    let svgs = report::write_svgs(&out, &records, datapath::PLOTS)?;
    assert_eq!(svgs.len(), datapath::PLOTS.len(), "{svgs:?}");
    for svg in &svgs {
        assert!(
            std::fs::read_to_string(svg)?.contains("<svg"),
            "{}",
            svg.display()
        );
    }
    let _ = std::fs::remove_dir_all(&work);
    for label in [
        "direct",
        "weir-socket",
        "weir-tc",
        "iptables-legacy",
        "iptables-nft",
        "nftables",
    ] {
        let mine: Vec<_> = records.iter().filter(|r| r.label() == label).collect();
        let metrics: Vec<&str> = mine.iter().map(|r| r.metric.as_str()).collect();
        for m in [
            "crr_rate_last",
            "crr_p99_last",
            "rr_p99",
            "udp_rate",
            "unrelated_crr_rate",
            "cpu_per_conn",
        ] {
            assert!(
                metrics.contains(&m),
                "{label} lacks {m}: {metrics:?}; notes {notes:?}"
            );
        }
        if label != "direct" {
            for m in ["crr_rate_random", "cold_sync", "update_latency"] {
                assert!(
                    metrics.contains(&m),
                    "{label} lacks {m}: {metrics:?}; notes {notes:?}"
                );
            }
        }
        for r in &mine {
            assert!(
                r.median.is_finite() && r.min <= r.median && r.median <= r.max,
                "{r:?}"
            );
            assert_eq!((r.services, r.endpoints), (10, 2));
        }
    }
    for weir in [record::WEIR_SOCKET, record::WEIR_TC] {
        assert!(
            records
                .iter()
                .any(|r| r.dataplane == weir && r.metric == "agent_rss"),
            "{weir} lacks agent_rss"
        );
    }
    // Every request of the run was answered: no dataplane dropped traffic.
    let failures: Vec<_> = notes.iter().filter(|n| n.contains("errors")).collect();
    assert!(failures.is_empty(), "{failures:?}");
    Ok(())
}
