//! `cargo xtask helm-template`: render `helm/weir` with Helm's own engine, as
//! `helm template` does. No helm binary can be installed here, so
//! `helm/template.py` runs Helm v4's SDK from PyPI (`helm-python-sdk`) in the
//! venv `cargo xtask setup` makes.
use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result};

use crate::{tools, util::root};

#[derive(clap::Args)]
pub struct HelmTemplate {
    /// Values file merged over the chart's values.yaml (repeatable, later wins).
    #[arg(short = 'f', long = "values", value_name = "FILE")]
    values: Vec<PathBuf>,
    /// Set values on the command line, Helm's syntax (a.b=c,d={x,y}; repeatable).
    #[arg(long = "set", value_name = "K=V")]
    set: Vec<String>,
    /// Like --set, but the values stay strings.
    #[arg(long = "set-string", value_name = "K=V")]
    set_string: Vec<String>,
    /// .Release.Name.
    #[arg(long, default_value = "weir")]
    release_name: String,
    /// .Release.Namespace.
    #[arg(short = 'n', long, default_value = "kube-system")]
    namespace: String,
    /// .Capabilities.KubeVersion (default: the Kubernetes version Helm was built with).
    #[arg(long, value_name = "V")]
    kube_version: Option<String>,
}

pub fn run(args: HelmTemplate) -> Result<()> {
    let root = root();
    let python = tools::python();
    let mut cmd = Command::new(&python);
    cmd.arg(root.join("helm/template.py"))
        .arg("template")
        .arg(root.join("helm/weir"))
        .args(["--release-name", &args.release_name])
        .args(["--namespace", &args.namespace]);
    if let Some(v) = &args.kube_version {
        cmd.args(["--kube-version", v]);
    }
    for f in &args.values {
        // Relative to where the user ran cargo, as helm would read it.
        let f = std::path::absolute(f).with_context(|| format!("{}", f.display()))?;
        cmd.arg("--values").arg(f);
    }
    for s in &args.set {
        cmd.args(["--set", s]);
    }
    for s in &args.set_string {
        cmd.args(["--set-string", s]);
    }
    let status = cmd.status().with_context(|| {
        format!(
            "cannot run {}: `cargo xtask setup` installs Helm's engine (helm-python-sdk) there",
            python.display()
        )
    })?;
    if !status.success() {
        // The script has printed Helm's error; exit as helm would.
        std::process::exit(status.code().unwrap_or(1));
    }
    Ok(())
}
