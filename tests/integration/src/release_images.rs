//! The product images, `weir-agent` and `weir-kubelet`, as OCI image-layout
//! tarballs (`ctr -n k8s.io images import` takes them) built from the release
//! binaries and a root filesystem of Debian packages ([`debian_rootfs`]): no
//! base image is pulled and no registry is needed. One uncompressed layer with
//! fixed owners and times, binaries stripped of debug info, and annotations
//! from the commit (not the clock), so the same inputs give the same digest.
//!
//! ```text
//!   release binaries ─┐
//!   apt-get download ─┴─> rootfs/ ─> layer.tar ─> config ─> manifest ─> index.json
//!                                                  (labels = OCI annotations)
//! ```
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, ensure};

use crate::{
    debian_rootfs::{self, Rootfs},
    images::{Image, Layer, oci_archive, sha256_hex},
    topology::run,
};

/// The repository both images are named under until pushed elsewhere; the
/// chart's `image.repository` default.
pub const REPOSITORY: &str = "localhost/weir";
const VERSION: &str = env!("CARGO_PKG_VERSION");
const SOURCE: &str = env!("CARGO_PKG_REPOSITORY");

/// What the agent runs besides itself: iptables (legacy and nft) and nft for
/// `cleanup-kube-proxy`; busybox for the chart's init container (sh, stat,
/// nsenter, mount of bpffs and cgroup2). Libraries are listed because
/// maintainer-script-free unpacking takes no dependencies;
/// [`debian_rootfs::check_libraries`] proves the list complete.
const AGENT_PACKAGES: &[&str] = &[
    "libc6",
    "libgcc-s1",
    "busybox-static",
    "netbase",
    "iptables",
    "libip4tc2",
    "libip6tc2",
    "libxtables12",
    "libnetfilter-conntrack3",
    "libnfnetlink0",
    "libnftnl11",
    "libmnl0",
    "nftables",
    "libnftables1",
    "libedit2",
    "libjansson4",
    "libgmp10",
    "libbsd0",
    "libmd0",
    "libtinfo6",
];

/// weir-kubelet needs only the C runtime; containerd, runc and CNI stay on
/// the host.
const KUBELET_PACKAGES: &[&str] = &["libc6", "libgcc-s1"];

/// The busybox applets the agent image links, for its init container and for
/// an operator's `kubectl exec`.
const AGENT_APPLETS: &[&str] = &[
    "sh", "cat", "ls", "stat", "mount", "umount", "nsenter", "mkdir", "rm", "echo", "grep", "ps",
    "id", "env", "sleep", "test", "[",
];

pub struct Built {
    pub name: String,
    pub file: PathBuf,
    /// The manifest's digest, `sha256:…`.
    pub digest: String,
}

/// The image reference for `component` at this version.
pub fn reference(component: &str) -> String {
    format!("{REPOSITORY}/{component}:{VERSION}")
}

/// Builds both images from the binaries in `bin_dir` into `out`, using
/// `work` for downloads and the rootfs.
pub fn build_all(bin_dir: &Path, work: &Path, out: &Path) -> Result<Vec<Built>> {
    std::fs::create_dir_all(out)?;
    let mut built = Vec::new();
    for component in ["weir-agent", "weir-kubelet"] {
        let image = build(component, bin_dir, &work.join(component))?;
        let file = archive_path(out, component);
        let archive = oci_archive(&image)?;
        // Renamed into place: a reader never takes a half-written archive.
        let tmp = out.join(format!(".{component}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, &archive)?;
        std::fs::rename(&tmp, &file)?;
        built.push(Built {
            digest: manifest_digest(&archive)?,
            name: image.name,
            file,
        });
    }
    Ok(built)
}

/// [`build_all`] from the binaries the harness runs (`WEIR_BIN_DIR`), with
/// a scratch work directory of its own.
pub fn build_from_harness_bins(out: &Path) -> Result<Vec<Built>> {
    let bin_dir = crate::bin("weir-agent")
        .parent()
        .map(Path::to_path_buf)
        .context("no bin dir")?;
    let work = std::env::temp_dir().join(format!(
        "{}{}",
        crate::topology::DIR_PREFIX,
        crate::topology::unique_id("img")
    ));
    let built = build_all(&bin_dir, &work, out);
    let _ = std::fs::remove_dir_all(&work);
    built
}

/// The archive [`build_all`] writes for `component` in `out`.
pub fn archive_path(out: &Path, component: &str) -> PathBuf {
    out.join(format!("{component}-{VERSION}.oci.tar"))
}

/// One image: the rootfs for `component`, its stripped binary, annotations.
pub fn build(component: &str, bin_dir: &Path, work: &Path) -> Result<Image> {
    let (packages, entrypoint) = match component {
        "weir-agent" => (AGENT_PACKAGES, "weir-agent"),
        "weir-kubelet" => (KUBELET_PACKAGES, "weir-kubelet"),
        other => anyhow::bail!("no image for {other}"),
    };
    let rootfs = debian_rootfs::assemble(work, packages)?;
    let dir = &rootfs.dir;
    let bin = dir.join("usr/bin").join(entrypoint);
    std::fs::create_dir_all(dir.join("usr/bin"))?;
    // Debug info stays in target/; it would be most of the image.
    run(Command::new("objcopy")
        .arg("--strip-debug")
        .arg(bin_dir.join(entrypoint))
        .arg(&bin))
    .with_context(|| format!("stripping {}", bin_dir.join(entrypoint).display()))?;
    if component == "weir-agent" {
        agent_layout(dir)?;
    }
    container_dirs(dir)?;
    write_manifest_of_packages(&rootfs)?;
    debian_rootfs::check_libraries(dir)?;

    let mut layer = Layer::new();
    layer.tree(dir)?;
    Ok(Image {
        name: reference(component),
        layer: layer.finish()?,
        entrypoint: vec![entrypoint.to_owned()],
        annotations: annotations(component)?,
        // Root, no Cmd: see agent/Dockerfile for why the agent runs as uid 0.
        ..Image::default()
    })
}

/// What the iptables and busybox maintainer scripts would have set up.
fn agent_layout(dir: &Path) -> Result<()> {
    for a in AGENT_APPLETS {
        debian_rootfs::link_if_absent(dir, "usr/bin", a, "busybox")?;
    }
    // update-alternatives' choice on a new Debian system: the nft backend.
    for (tool, target) in [
        ("iptables", "iptables-nft"),
        ("iptables-save", "iptables-nft-save"),
        ("iptables-restore", "iptables-nft-restore"),
        ("ip6tables", "ip6tables-nft"),
        ("ip6tables-save", "ip6tables-nft-save"),
        ("ip6tables-restore", "ip6tables-nft-restore"),
    ] {
        debian_rootfs::link_if_absent(dir, "usr/sbin", tool, target)?;
    }
    Ok(())
}

/// Mount points a runtime expects, a writable /tmp and /run for tools that
/// take locks there (iptables' /run/xtables.lock), and the users `id` shows.
fn container_dirs(dir: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    for d in ["dev", "proc", "sys", "run", "etc", "root", "var/lib"] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    std::fs::create_dir_all(dir.join("tmp"))?;
    std::fs::set_permissions(dir.join("tmp"), std::fs::Permissions::from_mode(0o1777))?;
    std::fs::write(
        dir.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    )?;
    std::fs::write(dir.join("etc/group"), "root:x:0:\nnogroup:x:65534:\n")?;
    Ok(())
}

/// The Debian packages and versions inside, for an operator's audit.
fn write_manifest_of_packages(rootfs: &Rootfs) -> Result<()> {
    let doc = rootfs.dir.join("usr/share/doc/weir");
    std::fs::create_dir_all(&doc)?;
    let text: String = rootfs
        .packages
        .iter()
        .map(|(p, v)| format!("{p} {v}\n"))
        .collect();
    std::fs::write(doc.join("debian-packages.txt"), text)?;
    Ok(())
}

/// OCI annotations from the commit, so rebuilding one commit gives one digest.
fn annotations(component: &str) -> Result<Vec<(String, String)>> {
    let git = |args: &[&str]| -> Result<String> {
        let out = Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()?;
        ensure!(out.status.success(), "git {args:?} failed");
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let revision = git(&["rev-parse", "HEAD"]).unwrap_or_else(|_| "unknown".into());
    let created = git(&["log", "-1", "--format=%cI"]).unwrap_or_default();
    let description = match component {
        "weir-agent" => "Weir's node agent: Services in BPF maps, in place of kube-proxy",
        _ => "weir-kubelet: a minimal kubelet on containerd's CRI",
    };
    let mut a = vec![
        ("org.opencontainers.image.title", component.to_owned()),
        (
            "org.opencontainers.image.description",
            description.to_owned(),
        ),
        ("org.opencontainers.image.version", VERSION.to_owned()),
        ("org.opencontainers.image.revision", revision),
        ("org.opencontainers.image.source", SOURCE.to_owned()),
        ("org.opencontainers.image.licenses", "Apache-2.0".to_owned()),
    ];
    if !created.is_empty() {
        a.push(("org.opencontainers.image.created", created));
    }
    Ok(a.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

/// The manifest digest `ctr images import` will show for an archive.
fn manifest_digest(archive: &[u8]) -> Result<String> {
    let mut ar = tar::Archive::new(archive);
    for e in ar.entries()? {
        let mut e = e?;
        if e.path()?.as_os_str() == "index.json" {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut e, &mut text)?;
            let index: serde_json::Value = serde_json::from_str(&text)?;
            return index["manifests"][0]["digest"]
                .as_str()
                .map(str::to_owned)
                .context("index.json has no manifest digest");
        }
    }
    anyhow::bail!(
        "no index.json in the archive (digest of the archive {})",
        sha256_hex(archive)
    )
}
