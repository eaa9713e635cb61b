//! `helm lint`, by Helm's own linter: the chart's metadata, values.yaml against
//! values.schema.json, and every template rendered and parsed as YAML.
use std::path::Path;

use crate::render::{NS, helm, root};

struct Lint {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Lint {
    /// The report's `[SEVERITY] path: message` lines.
    fn messages(&self) -> Vec<&str> {
        self.stdout.lines().filter(|l| l.starts_with('[')).collect()
    }
}

fn lint(chart: &Path, args: &[&str]) -> Lint {
    let mut all = vec!["--namespace", NS];
    all.extend_from_slice(args);
    let out = helm("lint", chart, &all);
    Lint {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Passes with nothing above INFO, `--strict` included (warnings would fail
/// it). The one INFO helm gives is "icon is recommended": the chart has no
/// icon to point at, so none is made up.
fn assert_clean(chart: &Path, args: &[&str]) {
    for strict in [false, true] {
        let mut a = args.to_vec();
        if strict {
            a.push("--strict");
        }
        let l = lint(chart, &a);
        assert!(l.ok, "lint {a:?} failed:\n{}{}", l.stdout, l.stderr);
        assert!(
            l.stdout.ends_with("1 chart(s) linted, 0 chart(s) failed\n"),
            "{}",
            l.stdout
        );
        for m in l.messages() {
            assert!(m.starts_with("[INFO] "), "lint {a:?}: {m}");
            eprintln!("lint {a:?}: {m}");
        }
    }
}

#[test]
fn chart_lints_clean() {
    let chart = root().join("helm/weir");
    assert_clean(&chart, &[]);
    // The optional parts' templates too.
    assert_clean(
        &chart,
        &[
            "--set",
            "serviceMonitor.enabled=true,metrics.bindAddress=0.0.0.0",
            "--set",
            "cleanupKubeProxy.enabled=true,terminatePodUdpSockets=false",
            "--set",
            "k8sServiceHost=10.0.0.1,acceleration=native",
            "--set-json",
            "devices=[]",
        ],
    );
}

#[test]
fn lint_fails_on_values_the_schema_rejects_naming_the_field() {
    let chart = root().join("helm/weir");
    let l = lint(&chart, &["--set", "socketLB=yes"]);
    assert!(!l.ok, "lint passed:\n{}", l.stdout);
    assert_eq!(l.stderr, "Error: 1 chart(s) linted, 1 chart(s) failed\n");
    let msgs = l.messages();
    assert!(
        msgs.contains(&"[ERROR] values.yaml: - at '/socketLB': got string, want boolean"),
        "{}",
        l.stdout
    );
    // The template check runs as well, and fails on the same schema error.
    assert!(
        msgs.iter().any(|m| m.starts_with(
            "[ERROR] templates/: values don't meet the specifications of the schema(s)"
        )),
        "{}",
        l.stdout
    );
}

/// The chart's own defaults are linted against its schema: a values.yaml
/// that breaks it fails, naming the field.
#[test]
fn lint_fails_on_a_chart_whose_values_yaml_breaks_the_schema() {
    let dir = std::env::temp_dir().join(format!("weir-helm-lint-{}", std::process::id()));
    let chart = dir.join("weir");
    copy_dir(&root().join("helm/weir"), &chart);
    let values = chart.join("values.yaml");
    let text = std::fs::read_to_string(&values).unwrap();
    assert!(text.contains("\nlogFormat: text\n"), "values.yaml changed");
    std::fs::write(
        &values,
        text.replace("\nlogFormat: text\n", "\nlogFormat: xml\n"),
    )
    .unwrap();
    let l = lint(&chart, &[]);
    std::fs::remove_dir_all(&dir).ok();
    assert!(!l.ok, "lint passed:\n{}", l.stdout);
    assert!(
        l.messages().contains(
            &"[ERROR] values.yaml: - at '/logFormat': value must be one of 'text', 'json'"
        ),
        "{}",
        l.stdout
    );
}

/// Helm lints in its engine's lint mode, where a template's `fail` only logs:
/// the chart's own checks (port ranges, port clashes) are caught by `helm
/// template` and `helm install`, not by `helm lint`.
#[test]
fn lint_leaves_template_fail_checks_to_rendering() {
    let chart = root().join("helm/weir");
    let l = lint(&chart, &["--set", "metrics.port=10256"]);
    assert!(l.ok, "lint failed:\n{}{}", l.stdout, l.stderr);
    let e = crate::render::render_err(&["--set", "metrics.port=10256"]);
    assert!(e.contains("metrics.port and healthz.port"), "{e}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}
