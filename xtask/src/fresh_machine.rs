//! Guards for the first command a new user runs. `cargo xtask setup` installs
//! protoc, bpf-linker and the rest, so xtask itself must build without any of
//! them, and every package setup asks apt for must exist in apt's sources: a
//! green CI on a machine that kept what was installed by hand proved neither.
use std::{ffi::OsString, path::Path, process::Command};

use crate::{setup::PACKAGES, util::root};

/// Crates whose build scripts run protoc, bpf-linker or clang.
const NEEDS_SETUP: &[&str] = &[
    "prost-build",
    "tonic-build",
    "tonic-prost-build",
    "protobuf-src",
    "aya-build",
    "bindgen",
    "k8s-cri",
];

/// The tools setup installs that a build script could pick up from PATH.
const SETUP_TOOLS: &[&str] = &["protoc", "bpf-linker", "clang"];

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

#[test]
fn xtask_links_nothing_whose_build_needs_setup() {
    let out = cargo()
        .args([
            "tree",
            "-p",
            "xtask",
            "-e",
            "normal,build",
            "--prefix",
            "none",
        ])
        .args(["--offline", "--locked"])
        .current_dir(root())
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    let bad: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| NEEDS_SETUP.contains(name) || name.starts_with("weir-"))
        .collect();
    assert!(
        bad.is_empty(),
        "xtask must build before setup has run, but links {bad:?}"
    );
}

/// A PATH on which each tool setup installs fails as if it were missing: a
/// directory of stand-ins that exit 127 goes first. Removing the real tools'
/// directories is not possible, since cargo shares ~/.cargo/bin with
/// bpf-linker and the C linker shares /usr/bin with protoc.
fn path_without_setup_tools(shims: &Path) -> OsString {
    std::fs::create_dir_all(shims).expect("shim dir");
    for tool in SETUP_TOOLS {
        let shim = shims.join(tool);
        std::fs::write(
            &shim,
            format!("#!/bin/sh\necho '{tool}: not on a fresh machine' >&2\nexit 127\n"),
        )
        .expect("write shim");
        std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod shim");
    }
    let mut path = shims.as_os_str().to_owned();
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    path
}

#[test]
fn xtask_builds_without_protoc_or_bpf_linker() {
    // Its own target dir: the workspace's already holds xtask, and a cached
    // build would prove nothing.
    let target = root().join("target/fresh-machine-guard");
    let path = path_without_setup_tools(&target.join("missing-tools"));
    // xtask itself always rebuilds; its dependencies are cached, and a new one
    // whose build needs a setup tool has never been built here, so it fails.
    let clean = cargo()
        .args(["clean", "-p", "xtask", "--offline"])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(root())
        .status()
        .expect("cargo clean runs");
    assert!(clean.success());
    let out = cargo()
        .args(["build", "-p", "xtask", "--offline", "--locked"])
        .env("CARGO_TARGET_DIR", &target)
        .env("PATH", &path)
        .env("PROTOC", "/nonexistent/protoc")
        .env_remove("RUSTC_WRAPPER")
        .current_dir(root())
        .output()
        .expect("cargo build runs");
    assert!(
        out.status.success(),
        "xtask does not build without the tools setup installs:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(target.join("debug/xtask").exists());
}

#[test]
fn every_setup_package_is_in_apts_sources() {
    let out = Command::new("apt-cache")
        .arg("policy")
        .args(PACKAGES)
        .env("LC_ALL", "C")
        .output()
        .expect("apt-cache runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let missing: Vec<&str> = PACKAGES
        .iter()
        .copied()
        .filter(|p| candidate(&text, p).is_none_or(|c| c == "(none)"))
        .collect();
    assert!(
        missing.is_empty(),
        "setup names packages apt cannot install from its sources: {missing:?} \
         (after `apt-get update`, `apt-cache policy NAME` shows no candidate)"
    );
}

/// The `Candidate:` line of one package's block in `apt-cache policy` output.
fn candidate<'a>(policy: &'a str, package: &str) -> Option<&'a str> {
    let header = format!("{package}:");
    let mut lines = policy.lines().skip_while(|l| l.trim_end() != header);
    lines.next()?;
    lines
        .take_while(|l| l.starts_with(' '))
        .find_map(|l| l.trim().strip_prefix("Candidate:"))
        .map(str::trim)
}

#[test]
fn candidate_reads_apt_cache_policy() {
    let policy = "kubectl:\n  Installed: 1.30\n  Candidate: (none)\n  Version table:\ncurl:\n  Installed: (none)\n  Candidate: 7.88.1-10\n";
    assert_eq!(candidate(policy, "kubectl"), Some("(none)"));
    assert_eq!(candidate(policy, "curl"), Some("7.88.1-10"));
    assert_eq!(candidate(policy, "golang"), None);
}
