//! Running Helm's engine (helm/template.py on the tools venv's Python) and
//! splitting its output into documents.
use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use serde_json::Value;

use crate::parse::Rendered;

pub(crate) const NS: &str = "kube-system";
pub(crate) const RELEASE: &str = "weir";

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// Runs `helm/template.py MODE CHART args...` with the venv's Python.
pub(crate) fn helm(mode: &str, chart: &Path, args: &[&str]) -> Output {
    let python = weir_integration::helm::python();
    Command::new(&python)
        .arg(root().join("helm/template.py"))
        .arg(mode)
        .arg(chart)
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}): run `cargo xtask setup` (installs helm-python-sdk)",
                python.display()
            )
        })
}

/// One rendered document.
#[derive(Clone, Debug)]
pub(crate) struct Doc {
    pub(crate) source: String,
    pub(crate) kind: String,
    pub(crate) value: Value,
}

/// `helm template` of helm/weir with `args`; `Err` is its stderr.
pub(crate) fn render(args: &[&str]) -> Result<Vec<Doc>, String> {
    let mut all = vec!["--release-name", RELEASE, "--namespace", NS];
    all.extend_from_slice(args);
    let out = helm("template", &root().join("helm/weir"), &all);
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8(out.stdout).expect("utf-8 output");
    Ok(split(&text))
}

pub(crate) fn render_ok(args: &[&str]) -> Rendered {
    Rendered(render(args).unwrap_or_else(|e| panic!("render {args:?} failed:\n{e}")))
}

pub(crate) fn render_err(args: &[&str]) -> String {
    match render(args) {
        Ok(docs) => panic!(
            "render {args:?} succeeded with {} documents, expected an error",
            docs.len()
        ),
        Err(e) => e,
    }
}

/// Splits `helm template` output: "---\n# Source: weir/templates/x.yaml\n<doc>\n".
pub(crate) fn split(text: &str) -> Vec<Doc> {
    assert!(
        text.starts_with("---\n"),
        "output starts with ---: {text:.80}"
    );
    let mut docs = Vec::new();
    for chunk in text.split("---\n").skip(1) {
        let (first, body) = chunk.split_once('\n').expect("a Source line");
        let source = first
            .strip_prefix("# Source: ")
            .unwrap_or_else(|| panic!("document without a Source line: {chunk}"))
            .to_owned();
        assert!(
            source.starts_with("weir/templates/"),
            "source {source} outside weir/templates/"
        );
        let value: Value = serde_saphyr::from_str(body)
            .unwrap_or_else(|e| panic!("{source}: not YAML: {e}\n{body}"));
        let kind = value["kind"]
            .as_str()
            .unwrap_or_else(|| panic!("{source}: no kind"))
            .to_owned();
        docs.push(Doc {
            source,
            kind,
            value,
        });
    }
    docs
}
