//! `cargo xtask helm-template`: render `helm/weir` the way `helm template` does,
//! with the Go renderer in `helm/render` (no helm binary can be installed here;
//! see helm/weir/README.md for what it does and does not reproduce).
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::util::root;

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
    /// .Capabilities.KubeVersion.
    #[arg(long, value_name = "V")]
    kube_version: Option<String>,
}

pub fn run(args: HelmTemplate) -> Result<()> {
    let root = root();
    let bin = build_renderer(&root)?;
    let mut cmd = Command::new(&bin);
    cmd.arg(root.join("helm/weir"))
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
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {}", bin.display()))?;
    if !status.success() {
        // The renderer has printed Helm's error; exit as helm would.
        std::process::exit(status.code().unwrap_or(1));
    }
    Ok(())
}

/// Builds `helm/render` offline in GOPATH mode against Debian's Go libraries
/// (sprig, ghodss/yaml, gojsonschema; `cargo xtask setup` installs them) into
/// `target/helm-render/`. Go's build cache makes a rebuild take well under a second.
pub fn build_renderer(root: &Path) -> Result<PathBuf> {
    let out_dir = root.join("target/helm-render");
    std::fs::create_dir_all(&out_dir)?;
    let bin = out_dir.join("weir-helm-render");
    // Built under a per-process name and renamed, so concurrent builds (the
    // render test, this command) never run a half-written binary.
    let tmp = out_dir.join(format!(".weir-helm-render.{}", std::process::id()));
    let status = Command::new("go")
        .args(["build", "-buildvcs=false", "-trimpath", "-o"])
        .arg(&tmp)
        .arg("./helm/render")
        .current_dir(root)
        .env("GO111MODULE", "off")
        .env("GOPATH", "/usr/share/gocode")
        .env("GOCACHE", out_dir.join("go-cache"))
        .env("GOFLAGS", "")
        // Pure Go (no C compiler needed), and no user go env file.
        .env("CGO_ENABLED", "0")
        .env("GOENV", "off")
        .status()
        .context(
            "cannot run `go`: install Go and the chart renderer's libraries with \
             `cargo xtask setup` (golang-go, golang-github-masterminds-sprig-dev, \
             golang-github-ghodss-yaml-dev, golang-github-xeipuuv-gojsonschema-dev)",
        )?;
    if !status.success() {
        let _ = std::fs::remove_file(&tmp);
        bail!(
            "building helm/render failed ({status}); are the Go libraries installed \
             (`cargo xtask setup`)?"
        );
    }
    std::fs::rename(&tmp, &bin)?;
    Ok(bin)
}
