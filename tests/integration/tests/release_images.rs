//! The images `cargo xtask images` builds: OCI layouts with the annotations
//! users read, the tools the agent runs at run time working inside the image's
//! own root filesystem, and the same digest from the same inputs.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, ensure};
use serde_json::Value;
use weir_integration::{
    helm::workspace_root,
    release_images,
    topology::{DIR_PREFIX, unique_id},
};

fn bin_dir() -> PathBuf {
    weir_integration::bin("weir-agent")
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

fn scratch(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("{DIR_PREFIX}{}", unique_id(tag)))
}

/// Removes a scratch directory even when the test fails.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn read_blob(layout: &Path, digest: &str) -> Result<Vec<u8>> {
    let hex = digest.strip_prefix("sha256:").context("sha256 digest")?;
    Ok(std::fs::read(layout.join("blobs/sha256").join(hex))?)
}

/// The root filesystem of a one-layer archive, unpacked under `dir`.
fn unpack(archive: &Path, dir: &Path) -> Result<PathBuf> {
    let layout = dir.join("layout");
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(&layout)?;
    std::fs::create_dir_all(&rootfs)?;
    let untar = |file: &Path, into: &Path| -> Result<()> {
        let ok = Command::new("tar")
            .arg("-xf")
            .arg(file)
            .arg("-C")
            .arg(into)
            .status()?
            .success();
        ensure!(ok, "tar -x of {}", file.display());
        Ok(())
    };
    untar(archive, &layout)?;
    let index: Value = serde_json::from_slice(&std::fs::read(layout.join("index.json"))?)?;
    let manifest: Value = serde_json::from_slice(&read_blob(
        &layout,
        index["manifests"][0]["digest"].as_str().context("digest")?,
    )?)?;
    let layer = manifest["layers"][0]["digest"].as_str().context("layer")?;
    let hex = layer.strip_prefix("sha256:").context("sha256")?;
    untar(&layout.join("blobs/sha256").join(hex), &rootfs)?;
    Ok(rootfs)
}

#[test]
fn agent_image_is_an_annotated_layout_whose_tools_run() -> Result<()> {
    let work = Scratch(scratch("imgcheck"));
    let out = work.0.join("out");
    let built = release_images::build_all(&bin_dir(), &work.0.join("build"), &out)?;
    let agent = built
        .iter()
        .find(|b| b.name == release_images::reference("weir-agent"))
        .context("no agent image")?;

    let layout = work.0.join("layout");
    std::fs::create_dir_all(&layout)?;
    let status = Command::new("tar")
        .arg("-xf")
        .arg(&agent.file)
        .arg("-C")
        .arg(&layout)
        .status()?;
    ensure!(status.success(), "tar -x of {}", agent.file.display());
    ensure!(layout.join("oci-layout").exists(), "no oci-layout file");
    let index: Value = serde_json::from_slice(&std::fs::read(layout.join("index.json"))?)?;
    let entry = &index["manifests"][0];
    ensure!(
        entry["digest"] == agent.digest.as_str(),
        "index {entry} vs {}",
        agent.digest
    );
    ensure!(
        entry["annotations"]["io.containerd.image.name"] == agent.name.as_str(),
        "{entry}"
    );
    let manifest: Value = serde_json::from_slice(&read_blob(&layout, &agent.digest)?)?;
    let ann = &manifest["annotations"];
    ensure!(
        ann["org.opencontainers.image.version"] == env!("CARGO_PKG_VERSION"),
        "{ann}"
    );
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(workspace_root())
        .output()?;
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    ensure!(
        ann["org.opencontainers.image.revision"] == head.as_str(),
        "{ann}"
    );
    ensure!(
        ann["org.opencontainers.image.source"] == env!("CARGO_PKG_REPOSITORY"),
        "{ann}"
    );
    let config: Value = serde_json::from_slice(&read_blob(
        &layout,
        manifest["config"]["digest"].as_str().context("config")?,
    )?)?;
    ensure!(
        config["config"]["Entrypoint"][0] == "weir-agent",
        "{config}"
    );
    ensure!(
        config["config"]["Labels"] == *ann,
        "labels {} vs annotations {ann}",
        config["config"]["Labels"]
    );

    // The root filesystem, run as the container would see it.
    let rootfs = work.0.join("rootfs");
    std::fs::create_dir_all(&rootfs)?;
    let layer = manifest["layers"][0]["digest"].as_str().context("layer")?;
    let status = Command::new("tar")
        .arg("-xf")
        .arg(layout.join("blobs/sha256").join(&layer[7..]))
        .arg("-C")
        .arg(&rootfs)
        .status()?;
    ensure!(status.success(), "unpacking the layer");
    for (cmd, expect) in [
        (&["weir-agent", "--version"][..], "weir-agent"),
        (&["iptables-legacy-save", "--version"][..], "legacy"),
        (&["iptables-nft-save", "--version"][..], "nf_tables"),
        (&["ip6tables-legacy-restore", "--version"][..], "legacy"),
        (&["ip6tables-nft-restore", "--version"][..], "nf_tables"),
        (&["nft", "--version"][..], "nftables"),
        // The alternatives' choice, as on a new Debian system.
        (&["iptables", "--version"][..], "nf_tables"),
        (&["iptables-save", "--version"][..], "nf_tables"),
        (&["ip6tables-restore", "--version"][..], "nf_tables"),
        (
            // busybox's `command -v` looks up one name per call.
            &[
                "sh",
                "-c",
                "for t in mount nsenter stat; do command -v $t || exit 1; done",
            ][..],
            "nsenter",
        ),
    ] {
        let out = Command::new("chroot").arg(&rootfs).args(cmd).output()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ensure!(
            out.status.success() && text.contains(expect),
            "{cmd:?} in the image: {text}"
        );
    }
    let kubelet = built
        .iter()
        .find(|b| b.name == release_images::reference("weir-kubelet"))
        .context("no kubelet image")?;
    let kubelet_root = unpack(&kubelet.file, &work.0.join("kubelet"))?;
    let out = Command::new("chroot")
        .arg(&kubelet_root)
        .args(["weir-kubelet", "--version"])
        .output()?;
    ensure!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("weir-kubelet"),
        "weir-kubelet in its image: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let packages = std::fs::read_to_string(rootfs.join("usr/share/doc/weir/debian-packages.txt"))?;
    ensure!(
        packages.lines().any(|l| l.starts_with("iptables ")),
        "{packages}"
    );
    Ok(())
}

#[test]
fn same_inputs_give_the_same_digest() -> Result<()> {
    let work = Scratch(scratch("imgrepro"));
    let mut digests = Vec::new();
    for round in ["a", "b"] {
        let built = release_images::build_all(
            &bin_dir(),
            &work.0.join(format!("build-{round}")),
            &work.0.join(format!("out-{round}")),
        )?;
        digests.push(
            built
                .iter()
                .map(|b| (b.name.clone(), b.digest.clone()))
                .collect::<Vec<_>>(),
        );
    }
    ensure!(digests[0] == digests[1], "{digests:?}");
    Ok(())
}
