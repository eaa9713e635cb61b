//! The chart rendered by Helm's own engine (helm/template.py on the tools
//! venv `cargo xtask setup` makes), for tests that run what it renders.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, ensure};
use serde_json::Value;

/// The venv with `helm-python-sdk`; `WEIR_TOOLS_VENV` moves it. The source of
/// truth is xtask/src/tools.rs (xtask links nothing of this crate, nor this of
/// xtask).
const VENV: &str = "/opt/weir-dev/venv";

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The venv's Python, which runs helm/template.py.
pub fn python() -> PathBuf {
    std::env::var_os("WEIR_TOOLS_VENV")
        .map_or_else(|| PathBuf::from(VENV), PathBuf::from)
        .join("bin/python")
}

/// `helm template weir helm/weir -n NAMESPACE -f VALUES`, parsed: one JSON
/// value per rendered object.
pub fn template(namespace: &str, values: &Path) -> Result<Vec<Value>> {
    let text = render(namespace, values)?;
    text.split("\n---")
        .map(|d| d.trim_start_matches("---"))
        .filter(|d| {
            d.lines()
                .any(|l| !l.trim().is_empty() && !l.starts_with('#'))
        })
        .map(|d| serde_saphyr::from_str::<Value>(d).context("parsing a rendered document"))
        .collect()
}

/// `helm template` as it prints: the YAML stream `kubectl apply -f` takes.
pub fn render(namespace: &str, values: &Path) -> Result<String> {
    let root = workspace_root();
    let out = Command::new(python())
        .arg(root.join("helm/template.py"))
        .arg("template")
        .arg(root.join("helm/weir"))
        .args(["--release-name", "weir", "--namespace", namespace, "-f"])
        .arg(values)
        .output()
        .context("running helm/template.py (cargo xtask setup installs its engine)")?;
    ensure!(
        out.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// The one rendered object of `kind`.
pub fn object<'a>(docs: &'a [Value], kind: &str) -> Result<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .with_context(|| format!("no {kind} rendered"))
}
