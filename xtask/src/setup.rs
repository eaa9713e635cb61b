//! `cargo xtask setup`: bring a fresh Debian machine to the point where Weir
//! builds and its tests run. Every step checks before it acts, so a second run
//! costs well under two seconds.
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, Result, bail};

use crate::{
    tools,
    util::{cargo, exec, output},
};

/// Debian packages: iproute2/util-linux for namespaces and nsenter, ethtool and
/// ping for the packet-datapath topology, curl and dig as real clients, dnsmasq
/// as a real DNS backend, bpftool to look at maps and links from the outside,
/// iptables (legacy and nft) and nftables to program kube-proxy's rulesets for
/// the datapath bench; Python's venv for the tools that come from PyPI (Helm's
/// engine, and kubectl where the machine has none). Every name must exist in
/// Debian's archive: `fresh_machine` tests check them against apt's sources.
pub const PACKAGES: &[&str] = &[
    "iproute2",
    "util-linux",
    "curl",
    "dnsutils",
    "dnsmasq-base",
    "bpftool",
    "iptables",
    "nftables",
    // weir-kubelet's runtime: the tests start their own containerd (Debian's 1.6).
    "containerd",
    // The OCI runtime containerd's runc v2 shim executes.
    "runc",
    // bridge + host-local in /usr/lib/cni: the test pods' network.
    "containernetworking-plugins",
    // /bin/busybox: the root filesystem of the test image weir.test/busybox:1.
    "busybox-static",
    // protoc: k8s-cri generates the CRI v1 gRPC types at build time.
    "protobuf-compiler",
    // The packet-datapath tests: `ethtool -K tx off` gives veth packets full
    // checksums as from a NIC; ping checks the topology's routes.
    "ethtool",
    "iputils-ping",
    // Debian's own Python (not whatever python3 is first on PATH) makes the
    // tools venv, so the venv does not depend on a user's Python install.
    "python3",
    "python3-venv",
];

const BPF_LINKER_VERSION: &str = "0.13.0";
/// Runs fuzz/'s targets (`cargo xtask fuzz`, and briefly `cargo xtask test`);
/// it builds libFuzzer from source with the machine's g++.
const CARGO_FUZZ_VERSION: &str = "0.13.2";
const NIGHTLY: &str = "nightly";

pub fn run() -> Result<()> {
    let start = Instant::now();
    check_platform()?;
    apt_packages()?;
    let sysroot = nightly_sysroot()?;
    rust_src(&sysroot)?;
    bpf_linker(&sysroot)?;
    cargo_fuzz()?;
    tools::python_tools()?;
    eprintln!("setup: ready ({:.2}s)", start.elapsed().as_secs_f64());
    Ok(())
}

fn check_platform() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "setup needs root: it installs Debian packages, and Weir's tests create network \
             namespaces, cgroups and bpffs mounts. Run it as root (e.g. `sudo -E cargo xtask setup`)."
        );
    }
    if !Path::new("/etc/debian_version").exists() {
        bail!(
            "setup only knows Debian's apt. On another distribution install by hand: \
             {} , rust-src for the nightly toolchain, and bpf-linker {BPF_LINKER_VERSION}.",
            PACKAGES.join(" ")
        );
    }
    Ok(())
}

fn apt_packages() -> Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .is_none_or(|s| !s.contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("setup: installing {}", missing.join(" "));
    exec(Command::new("apt-get").args(["update", "-qq"]))?;
    exec(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
    .context("apt-get could not install the packages Weir needs")
}

fn nightly_sysroot() -> Result<PathBuf> {
    let out = output(Command::new("rustc").args([&format!("+{NIGHTLY}"), "--print", "sysroot"]))
        .context(
            "no nightly toolchain: the eBPF programs build with nightly \
             (`rustup toolchain install nightly`)",
        )?;
    Ok(PathBuf::from(out.trim()))
}

fn rust_src(sysroot: &Path) -> Result<()> {
    if sysroot.join("lib/rustlib/src/rust/library/core").exists() {
        return Ok(());
    }
    exec(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", NIGHTLY]))
}

/// bpf-linker links the eBPF crate. It has no prebuilt download here, so it is
/// built against the nightly toolchain's own libLLVM. Its runtime search path
/// points into `LLVM_PREFIX`, so the prefix lives beside cargo's home, not in /tmp.
fn bpf_linker(sysroot: &Path) -> Result<()> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .context("neither CARGO_HOME nor HOME is set")?;
    let prefix = cargo_home.join("weir-llvm-prefix");
    let llvm = find_libllvm(sysroot)?;
    let lib = prefix.join("lib");
    std::fs::create_dir_all(&lib)?;
    let versioned = llvm.file_name().context("libLLVM has no file name")?;
    for name in [std::ffi::OsStr::new("libLLVM.so"), versioned] {
        let link = lib.join(name);
        if std::fs::read_link(&link).ok().as_deref() != Some(llvm.as_path()) {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&llvm, &link)
                .with_context(|| format!("cannot link {}", link.display()))?;
        }
    }

    let installed = output(Command::new("bpf-linker").arg("--version"))
        .or_else(|| output(Command::new(cargo_home.join("bin/bpf-linker")).arg("--version")));
    if installed.is_some_and(|v| v.contains(BPF_LINKER_VERSION)) {
        return Ok(());
    }
    eprintln!(
        "setup: building bpf-linker {BPF_LINKER_VERSION} against {}",
        llvm.display()
    );
    exec(
        cargo()
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
                "--force",
                "--no-default-features",
                "--features",
                "llvm-22",
            ])
            .env("LLVM_PREFIX", &prefix),
    )
    .context("building bpf-linker failed")
}

fn cargo_fuzz() -> Result<()> {
    let have = output(cargo().args(["fuzz", "--version"]));
    if have.is_some_and(|v| v.split_whitespace().any(|w| w == CARGO_FUZZ_VERSION)) {
        return Ok(());
    }
    eprintln!("setup: installing cargo-fuzz {CARGO_FUZZ_VERSION} (cargo install)");
    exec(cargo().args([
        "install",
        "cargo-fuzz",
        "--version",
        CARGO_FUZZ_VERSION,
        "--locked",
        "--force",
    ]))
    .context("installing cargo-fuzz failed")
}

/// The real shared library, not the `libLLVM-22-…so` linker script beside it.
fn find_libllvm(sysroot: &Path) -> Result<PathBuf> {
    let dir = sysroot.join("lib");
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("libLLVM.so.") {
            return Ok(path);
        }
    }
    bail!(
        "no libLLVM.so.* in {}: is the nightly toolchain complete?",
        dir.display()
    )
}
