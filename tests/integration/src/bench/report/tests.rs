use super::*;
use crate::bench::record::IPTABLES;

fn rec(label: &str, n: u32, metric: &str, unit: &str, [median, min, max]: [f64; 3]) -> Record {
    let (dataplane, variant) = match label.split_once('-') {
        Some((IPTABLES, v)) => (IPTABLES, Some(v.to_owned())),
        _ => (label, None),
    };
    let (metric, unit) = (metric.to_owned(), unit.to_owned());
    let dataplane = dataplane.to_owned();
    Record {
        dataplane,
        variant,
        services: n,
        endpoints: 2,
        metric,
        unit,
        median,
        min,
        max,
    }
}

/// Rates at N = 1, 1000 and 100,000, nftables missing at the largest size;
/// update latencies without any baseline, one of them without samples.
fn sample() -> Vec<Record> {
    let rates = [
        ("weir-tc", [40_500.0, 40_000.0, 41_000.0]),
        ("iptables-legacy", [30_000.0, 29_500.0, 30_500.0]),
        ("nftables", [35_000.0; 3]),
        ("direct", [50_000.0, 49_000.0, 51_000.0]),
    ];
    let latencies = [
        ("weir-tc", 1000, [0.8123, 0.8, 0.9]),
        ("nftables", 1000, [12.345, 12.0, 13.5]),
        ("nftables", 10, [f64::NAN; 3]),
    ];
    let mut v = Vec::new();
    for n in [1, 1000, 100_000] {
        for (label, m) in rates
            .into_iter()
            .filter(|r| r.0 != "nftables" || n < 100_000)
        {
            v.push(rec(label, n, "crr_rate", "conn/s", m));
        }
    }
    for (label, n, m) in latencies {
        v.push(rec(label, n, "update_latency", "ms", m));
    }
    v
}

fn plot(file: &'static str, metric: &'static str, log_y: bool) -> Plot {
    let (title, y_label) = (file, metric);
    Plot {
        file,
        title,
        metric,
        y_label,
        log_y,
    }
}

/// Removed on drop, panics included.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("weir-report-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn numbers_are_grouped_and_rounded_per_unit() {
    assert_eq!(group(1_234_567.0, 0), "1,234,567");
    assert_eq!(group(-1234.56, 1), "-1,234.6");
    assert_eq!(group(-0.0001, 2), "0.00");
    assert_eq!(fmt_value(52_345.6, "conn/s"), "52,346");
    assert_eq!(fmt_value(9.41, "Gbit/s"), "9.41");
    assert_eq!(fmt_value(1234.5, "us"), "1,234.5");
    assert_eq!(fmt_value(0.04567, "ms"), "0.046");
    assert_eq!(fmt_value(12.0, "ms"), "12.0");
    assert_eq!(fmt_value(512.0, "MiB"), "512");
    assert_eq!(fmt_value(f64::NAN, "ms"), "n/a");
    assert_eq!(ratio(1.0, 0.0), None);
    assert_eq!(ratio(250.0, 2.0).as_deref(), Some("125"));
    assert_eq!(axis_number(0.5), "0.5");
    assert_eq!(axis_number(100_000.0), "100,000");
}

#[test]
fn markdown_has_cells_ratios_and_gaps() {
    let mut records = sample();
    // The same metric in another unit: a table of its own, as its numbers
    // neither compare nor divide.
    records.push(rec(
        "weir-socket",
        1000,
        "update_latency",
        "us",
        [850.0, 700.5, 1234.5],
    ));
    let notes = ["nftables at 100,000 Services skipped: load took longer than 600 s".into()];
    let md = markdown("Datapath bench", &records, &notes);
    assert!(md.starts_with("# Datapath bench\n"), "{md}");
    // Rows ascend by N; nftables' range collapses, its measurement having
    // no spread; the baselines carry no ratio to themselves.
    let rate_row = |n| {
        let nft = if n == "100,000" {
            "—"
        } else {
            "35,000 ×0.70 ÷ipt 1.17"
        };
        format!(
            "| {n} | 2 | 40,500 (40,000–41,000) ×0.81 ÷ipt 1.35 | 30,000 (29,500–30,500) ×0.60 \
             | {nft} | 50,000 (49,000–51,000) ÷ipt 1.67 |\n"
        )
    };
    let (r1, r2, r3) = (rate_row("1"), rate_row("1,000"), rate_row("100,000"));
    let tables = [
        format!(
            "## crr_rate (conn/s)\n\n| N | M | weir-tc | iptables-legacy | nftables | direct |\n\
             |---:|---:|---:|---:|---:|---:|\n{r1}{r2}{r3}\n"
        ),
        "## update_latency (ms)\n\n| N | M | weir-tc | nftables |\n|---:|---:|---:|---:|\n\
         | 10 | 2 | — | n/a |\n| 1,000 | 2 | 0.812 (0.800–0.900) | 12.3 (12.0–13.5) |\n\n"
            .into(),
        "## update_latency (µs)\n\n| N | M | weir-socket |\n|---:|---:|---:|\n\
         | 1,000 | 2 | 850.0 (700.5–1,234.5) |\n\n"
            .into(),
        format!("## Notes\n\n- {}\n", notes[0]),
    ];
    let at: Vec<Option<usize>> = tables.iter().map(|t| md.find(t.as_str())).collect();
    assert!(
        at.iter().all(Option::is_some) && at.is_sorted(),
        "{at:?} in\n{md}"
    );
    assert!(md.ends_with(&tables[3]), "{md}");
}

#[test]
fn json_round_trips() {
    let tmp = TempDir::new("json");
    let path = tmp.0.join("bench.json");
    let (finite, nan): (Vec<Record>, _) = sample().into_iter().partition(|r| r.median.is_finite());
    write_json(&path, &finite).unwrap();
    let text = fs::read_to_string(&path).unwrap();
    assert!(
        text.starts_with("[\n  {\n") && text.ends_with("}\n]\n"),
        "{text}"
    );
    assert_eq!(text.matches("\"variant\": \"legacy\"").count(), 3);
    assert_eq!(serde_json::from_str::<Vec<Record>>(&text).unwrap(), finite);
    // JSON has no NaN: serde_json writes null, which no f64 reads back.
    write_json(&path, &nan).unwrap();
    assert!(
        fs::read_to_string(&path)
            .unwrap()
            .contains("\"median\": null")
    );
}

/// The text of every `<text>` element, after checking that the tags nest:
/// enough to tell a truncated or garbled file from a well-formed one.
fn check_well_formed(svg: &str) -> Vec<String> {
    let (mut stack, mut texts, mut rest) = (Vec::new(), Vec::new(), svg);
    while let Some(start) = rest.find('<') {
        let end = start + rest[start..].find('>').expect("unclosed tag");
        let tag = &rest[start + 1..end];
        let name = tag.split_whitespace().next().unwrap_or("");
        if let Some(closing) = tag.strip_prefix('/') {
            assert_eq!(stack.pop(), Some(closing), "mismatched </{closing}>");
        } else if !(tag.starts_with(['?', '!']) || tag.ends_with('/')) {
            stack.push(name);
            if name == "text" {
                let body = &rest[end + 1..];
                texts.push(body[..body.find('<').unwrap()].trim().to_owned());
            }
        }
        rest = &rest[end + 1..];
    }
    assert!(stack.is_empty(), "unclosed {stack:?}");
    texts
}

#[test]
fn svgs_render_without_fonts() {
    let tmp = TempDir::new("svg");
    let dir = tmp.0.join("plots");
    let plots = [
        plot("rate.svg", "crr_rate", false),
        plot("update.svg", "update_latency", true),
        plot("none.svg", "absent", false),
    ];
    let written = write_svgs(&dir, &sample(), &plots).unwrap();
    assert_eq!(written, [dir.join("rate.svg"), dir.join("update.svg")]);
    assert!(!dir.join("none.svg").exists());

    let rate_legend = ["weir-tc", "iptables-legacy", "nftables", "direct"];
    let legends: [&[&str]; 2] = [&rate_legend, &["weir-tc", "nftables"]];
    for ((file, plot), legend) in written.iter().zip(&plots).zip(legends) {
        let svg = fs::read_to_string(file).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        let texts = check_well_formed(&svg);
        // Legend, title, axis descriptions, and a tick at a measured N.
        let others = [plot.title, plot.y_label, "Services (N)", "1,000"];
        for want in legend.iter().chain(&others) {
            assert!(texts.iter().any(|t| t == want), "{want} not in {texts:?}");
        }
    }
}

#[test]
fn several_endpoint_counts_make_separate_lines() {
    let mut records = sample();
    records.push(Record {
        endpoints: 100,
        ..records[0].clone()
    });
    let series = series(&records, &plot("x.svg", "crr_rate", true), &[]);
    let keys: Vec<&str> = series.iter().map(|s| s.key.as_str()).collect();
    let labels = ["weir-tc", "iptables-legacy", "nftables", "direct"];
    let mut want: Vec<String> = labels.iter().map(|l| format!("{l} M=2")).collect();
    want.push("weir-tc M=100".into());
    assert_eq!(keys, want);
}
