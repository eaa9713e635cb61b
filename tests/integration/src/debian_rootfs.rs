//! A container root filesystem assembled from Debian packages, for images built
//! where no base image can be pulled. The packages are fetched with
//! `apt-get download` (the machine's own apt sources) and unpacked with
//! `dpkg-deb -x`; maintainer scripts do not run, so what they would do for a
//! container (merged /usr, the iptables alternatives) is done here, in code
//! that says so. Every ELF file in the result is checked with the rootfs's own
//! dynamic loader, so a library missing from a package list fails the build,
//! not the pod.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::topology::run;

/// Top-level directories Debian merges into /usr; packages built before the
/// merge still ship files under them.
const MERGED: &[&str] = &["bin", "sbin", "lib", "lib64"];

/// An unpacked tree and the package versions it came from.
pub struct Rootfs {
    pub dir: PathBuf,
    pub packages: BTreeMap<String, String>,
}

/// Unpacks `packages` (each named explicitly, dependencies included: apt's
/// closure would drag in dpkg, debconf and perl, which nothing here runs) into
/// `work/rootfs`.
pub fn assemble(work: &Path, packages: &[&str]) -> Result<Rootfs> {
    let debs = work.join("debs");
    let staging = work.join("staging");
    let dir = work.join("rootfs");
    for d in [&debs, &staging, &dir] {
        if d.exists() {
            std::fs::remove_dir_all(d)?;
        }
        std::fs::create_dir_all(d)?;
    }
    run(Command::new("apt-get")
        .args(["download", "-qq"])
        .args(packages)
        .current_dir(&debs))
    .context("apt-get download (run `apt-get update` if a package is not found)")?;
    let mut versions = BTreeMap::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&debs)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.sort();
    for deb in &files {
        let out = Command::new("dpkg-deb")
            .arg("-f")
            .arg(deb)
            .args(["Package", "Version"])
            .output()?;
        ensure!(out.status.success(), "dpkg-deb -f {} failed", deb.display());
        let fields = String::from_utf8_lossy(&out.stdout);
        let get = |k: &str| {
            fields
                .lines()
                .find_map(|l| l.strip_prefix(k).map(|v| v.trim().to_owned()))
        };
        let (Some(name), Some(version)) = (get("Package:"), get("Version:")) else {
            bail!("{}: no Package/Version", deb.display());
        };
        versions.insert(name, version);
        run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&staging))?;
    }
    for p in packages {
        ensure!(versions.contains_key(*p), "apt-get download fetched no {p}");
    }
    merge_usr(&staging, &dir)?;
    std::fs::remove_dir_all(&staging)?;
    Ok(Rootfs {
        dir,
        packages: versions,
    })
}

/// Moves `staging` into `dir` with /bin, /sbin, /lib and /lib64 folded into
/// /usr and linked back, as Debian's usrmerge lays a system out.
fn merge_usr(staging: &Path, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir.join("usr"))?;
    for top in std::fs::read_dir(staging)? {
        let top = top?;
        let name = top.file_name();
        let dest = if MERGED.iter().any(|m| name == *m) {
            dir.join("usr").join(&name)
        } else {
            dir.join(&name)
        };
        copy_tree(&top.path(), &dest)?;
    }
    for m in MERGED {
        std::fs::create_dir_all(dir.join("usr").join(m))?;
        std::os::unix::fs::symlink(format!("usr/{m}"), dir.join(m))?;
    }
    Ok(())
}

/// `cp -a` that merges into directories already there.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let meta = std::fs::symlink_metadata(from)?;
    if meta.is_dir() {
        std::fs::create_dir_all(to)?;
        std::fs::set_permissions(to, meta.permissions())?;
        for e in std::fs::read_dir(from)? {
            let e = e?;
            copy_tree(&e.path(), &to.join(e.file_name()))?;
        }
    } else if meta.file_type().is_symlink() {
        let _ = std::fs::remove_file(to);
        std::os::unix::fs::symlink(std::fs::read_link(from)?, to)?;
    } else {
        std::fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    }
    Ok(())
}

/// Links `name` to `target` in `dir` (relative to the rootfs), unless a
/// package already ships it.
pub fn link_if_absent(rootfs: &Path, dir: &str, name: &str, target: &str) -> Result<()> {
    let path = rootfs.join(dir).join(name);
    if std::fs::symlink_metadata(&path).is_err() {
        std::fs::create_dir_all(rootfs.join(dir))?;
        std::os::unix::fs::symlink(target, &path)?;
    }
    Ok(())
}

/// Fails naming every ELF file whose libraries the rootfs's loader cannot
/// find. Runs the loader inside a chroot, so only the rootfs's own libraries
/// count.
pub fn check_libraries(rootfs: &Path) -> Result<()> {
    let loader = "/lib64/ld-linux-x86-64.so.2";
    ensure!(
        rootfs.join(loader.trim_start_matches('/')).exists(),
        "the rootfs has no {loader} (libc6 missing from the package list?)"
    );
    let mut missing = Vec::new();
    let mut stack = vec![rootfs.join("usr")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            let ft = e.file_type()?;
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() && is_elf(&e.path()) && needs_libraries(&e.path())? {
                let inside = Path::new("/").join(e.path().strip_prefix(rootfs)?);
                let out = Command::new("chroot")
                    .arg(rootfs)
                    .args([loader, "--list"])
                    .arg(&inside)
                    .output()?;
                let text = String::from_utf8_lossy(&out.stdout);
                let err = String::from_utf8_lossy(&out.stderr);
                // A refusal would otherwise look like "nothing missing".
                if !out.status.success() {
                    missing.push(format!(
                        "{}: the loader failed: {}",
                        inside.display(),
                        err.trim()
                    ));
                }
                for l in text.lines().filter(|l| l.contains("not found")) {
                    missing.push(format!("{}: {}", inside.display(), l.trim()));
                }
            }
        }
    }
    ensure!(
        missing.is_empty(),
        "libraries missing from the image:\n{}",
        missing.join("\n")
    );
    Ok(())
}

/// Whether an ELF file names shared libraries (`DT_NEEDED`). Static
/// binaries name none, and the loader is not asked about them: it crashes
/// on a static-pie one (busybox-static).
fn needs_libraries(path: &Path) -> Result<bool> {
    let out = Command::new("readelf")
        .args(["--dynamic", "--wide"])
        .arg(path)
        .output()
        .context("readelf (binutils)")?;
    ensure!(out.status.success(), "readelf {}", path.display());
    Ok(String::from_utf8_lossy(&out.stdout).contains("(NEEDED)"))
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read as _;
    let mut magic = [0u8; 4];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && magic == *b"\x7fELF"
}
