//! The test images, built locally because no registry is reachable: busybox
//! from Debian's busybox-static and a pause of our own
//! (`tests/integration/images/pause/pause.c`). Each is written as an OCI image
//! layout in a tar archive, the form `ctr images import` takes, with one
//! uncompressed layer; entries, times and owners are fixed, so the same inputs
//! give the same digests.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, ensure};
use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::topology::run;

/// busybox with every applet as a symlink in /bin.
pub const BUSYBOX: &str = "weir.test/busybox:1";
/// The sandbox image containerd's `sandbox_image` points at.
pub const PAUSE: &str = "weir.test/pause:1";

const BUSYBOX_BIN: &str = "/bin/busybox";
const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// A fixed mtime for every entry: builds do not depend on when they ran.
const MTIME: u64 = 946_684_800;

/// One image to write: its reference, root filesystem and default command.
#[derive(Default)]
pub struct Image {
    pub name: String,
    pub layer: Vec<u8>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// OCI annotations (`org.opencontainers.image.*`) on the manifest, also
    /// set as the config's labels, as BuildKit does for `--label`.
    pub annotations: Vec<(String, String)>,
    /// The config's `User`; empty (run as root) is left out of the config.
    pub user: String,
}

pub fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A tar builder whose entries carry fixed owners and times.
pub struct Layer(tar::Builder<Vec<u8>>);

impl Default for Layer {
    fn default() -> Self {
        Self::new()
    }
}

impl Layer {
    pub fn new() -> Self {
        Self(tar::Builder::new(Vec::new()))
    }

    fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(size);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(MTIME);
        h
    }

    pub fn dir(&mut self, path: &str, mode: u32) -> Result<()> {
        let mut h = Self::header(tar::EntryType::Directory, mode, 0);
        Ok(self.0.append_data(&mut h, path, std::io::empty())?)
    }

    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) -> Result<()> {
        let size = u64::try_from(data.len())?;
        let mut h = Self::header(tar::EntryType::Regular, mode, size);
        Ok(self.0.append_data(&mut h, path, data)?)
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> Result<()> {
        let mut h = Self::header(tar::EntryType::Symlink, 0o777, 0);
        Ok(self.0.append_link(&mut h, path, target)?)
    }

    pub fn finish(self) -> Result<Vec<u8>> {
        Ok(self.0.into_inner()?)
    }

    /// Everything under `root`, in sorted order, with its mode but our fixed
    /// owner and time, so the layer depends only on the tree's contents.
    /// Hard links become copies; sockets, fifos and devices are left out (a
    /// runtime gives /dev its own).
    pub fn tree(&mut self, root: &Path) -> Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let dir = root.join(&rel);
            let mut entries: Vec<_> = std::fs::read_dir(&dir)
                .with_context(|| format!("reading {}", dir.display()))?
                .collect::<std::io::Result<_>>()?;
            entries.sort_by_key(std::fs::DirEntry::file_name);
            // Reversed onto the stack, so directories come out in order.
            let mut subdirs = Vec::new();
            for e in entries {
                let path = rel.join(e.file_name());
                let name = path.to_str().context("non-UTF-8 path in a rootfs")?;
                let meta = std::fs::symlink_metadata(e.path())?;
                let mode = meta.permissions().mode() & 0o7777;
                let ft = meta.file_type();
                if ft.is_symlink() {
                    let target = std::fs::read_link(e.path())?;
                    self.symlink(name, target.to_str().context("non-UTF-8 link")?)?;
                } else if ft.is_dir() {
                    self.dir(name, mode)?;
                    subdirs.push(path);
                } else if ft.is_file() {
                    self.file(name, mode, &std::fs::read(e.path())?)?;
                }
            }
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(())
    }
}

/// The directories a container runtime expects to mount over, and a minimal
/// /etc so `id`, `whoami` and runAsUser work.
pub fn base(layer: &mut Layer) -> Result<()> {
    for d in ["bin", "dev", "etc", "proc", "root", "sys", "usr", "var"] {
        layer.dir(d, 0o755)?;
    }
    layer.dir("tmp", 0o1777)?;
    layer.file(
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    )?;
    layer.file("etc/group", 0o644, b"root:x:0:\nnogroup:x:65534:\n")
}

/// busybox-static's binary with a /bin symlink per applet it lists.
pub fn busybox() -> Result<Image> {
    busybox_plus(BUSYBOX, &[])
}

/// [`busybox`] named `name`, with more files (path, mode, contents) in its
/// layer: a tool a test runs inside a pod.
pub fn busybox_plus(name: &str, files: &[(&str, u32, &[u8])]) -> Result<Image> {
    let bin = std::fs::read(BUSYBOX_BIN)
        .with_context(|| format!("reading {BUSYBOX_BIN} (apt-get install busybox-static)"))?;
    let out = Command::new(BUSYBOX_BIN).arg("--list").output()?;
    ensure!(out.status.success(), "busybox --list failed");
    let mut applets: Vec<String> = String::from_utf8(out.stdout)?
        .lines()
        .map(str::trim)
        .filter(|a| !a.is_empty() && *a != "busybox" && !a.contains('/'))
        .map(str::to_owned)
        .collect();
    applets.sort();
    applets.dedup();
    ensure!(
        ["sh", "httpd", "sleep", "wget"]
            .iter()
            .all(|a| applets.iter().any(|x| x == a)),
        "{BUSYBOX_BIN} lacks sh, httpd, sleep or wget"
    );
    let mut layer = Layer::new();
    base(&mut layer)?;
    layer.file("bin/busybox", 0o755, &bin)?;
    for a in &applets {
        layer.symlink(&format!("bin/{a}"), "busybox")?;
    }
    for (path, mode, data) in files {
        layer.file(path, *mode, data)?;
    }
    Ok(Image {
        name: name.into(),
        layer: layer.finish()?,
        cmd: vec!["sh".into()],
        ..Image::default()
    })
}

/// [`busybox`] as `name`, whose config runs it as `user` (a uid or a name),
/// as images built with a `USER` line do.
pub fn busybox_as(name: &str, user: &str) -> Result<Image> {
    Ok(Image {
        name: name.into(),
        user: user.into(),
        ..busybox()?
    })
}

/// Our pause, compiled statically into `work`, as the image's only program.
pub fn pause(work: &Path) -> Result<Image> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("images/pause/pause.c");
    let out = work.join("pause");
    run(Command::new("gcc")
        .args(["-static", "-Os", "-s", "-o"])
        .arg(&out)
        .arg(&src))
    .context("compiling the pause image's program (needs gcc and libc6-dev)")?;
    let mut layer = Layer::new();
    base(&mut layer)?;
    layer.file("pause", 0o755, &std::fs::read(&out)?)?;
    Ok(Image {
        name: PAUSE.into(),
        layer: layer.finish()?,
        entrypoint: vec!["/pause".into()],
        ..Image::default()
    })
}

/// The OCI image layout of `image` as a tar archive.
pub fn oci_archive(image: &Image) -> Result<Vec<u8>> {
    let layer_digest = format!("sha256:{}", sha256_hex(&image.layer));
    let annotations: serde_json::Map<String, serde_json::Value> = image
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), v.clone().into()))
        .collect();
    let mut image_config = json!({
        "Env": [PATH_ENV],
        "Entrypoint": image.entrypoint,
        "Cmd": image.cmd,
        "WorkingDir": "/",
        "Labels": annotations,
    });
    // Only when set: the other images' digests stay what they were.
    if !image.user.is_empty() {
        image_config["User"] = image.user.clone().into();
    }
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": image_config,
        // One uncompressed layer: its diff_id is its digest.
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created_by": "weir-integration images.rs"}],
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{}", sha256_hex(&config)),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": image.layer.len(),
        }],
        "annotations": annotations,
    }))?;
    let tag = image.name.rsplit_once(':').map_or("latest", |(_, t)| t);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{}", sha256_hex(&manifest)),
            "size": manifest.len(),
            // containerd names the image after the first; the OCI tag is the second.
            "annotations": {
                "io.containerd.image.name": image.name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    }))?;
    let mut out = Layer::new();
    out.file("oci-layout", 0o644, br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    out.file("index.json", 0o644, &index)?;
    out.dir("blobs", 0o755)?;
    out.dir("blobs/sha256", 0o755)?;
    for blob in [&image.layer, &config, &manifest] {
        out.file(&format!("blobs/sha256/{}", sha256_hex(blob)), 0o644, blob)?;
    }
    out.finish()
}

/// Writes `image`'s archive into `dir` and imports it into containerd's
/// `k8s.io` namespace (the CRI's), unpacked for `snapshotter`.
pub fn import(socket: &Path, snapshotter: &str, dir: &Path, image: &Image) -> Result<PathBuf> {
    let file = dir.join(format!("{}.oci.tar", image.name.replace(['/', ':'], "_")));
    std::fs::write(&file, oci_archive(image)?)?;
    import_archive(socket, snapshotter, &file)?;
    Ok(file)
}

/// `ctr -n k8s.io images import` of an OCI archive already on disk, as a
/// user loads an image built by `cargo xtask images`.
pub fn import_archive(socket: &Path, snapshotter: &str, file: &Path) -> Result<()> {
    run(Command::new("ctr")
        .arg("--address")
        .arg(socket)
        .args([
            "-n",
            "k8s.io",
            "images",
            "import",
            "--snapshotter",
            snapshotter,
        ])
        .arg(file))
    .with_context(|| format!("importing {}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archives_are_deterministic_layouts() {
        let image = Image {
            name: "weir.test/x:2".into(),
            layer: {
                let mut l = Layer::new();
                base(&mut l).unwrap();
                l.finish().unwrap()
            },
            entrypoint: vec!["/x".into()],
            ..Image::default()
        };
        let a = oci_archive(&image).unwrap();
        assert_eq!(a, oci_archive(&image).unwrap());
        let mut ar = tar::Archive::new(a.as_slice());
        let mut names = Vec::new();
        let mut index = String::new();
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let p = e.path().unwrap().display().to_string();
            if p == "index.json" {
                std::io::Read::read_to_string(&mut e, &mut index).unwrap();
            }
            names.push(p);
        }
        assert_eq!(names.len(), 7, "{names:?}");
        let index: serde_json::Value = serde_json::from_str(&index).unwrap();
        let m = &index["manifests"][0];
        assert_eq!(m["annotations"]["org.opencontainers.image.ref.name"], "2");
        let digest = m["digest"]
            .as_str()
            .unwrap()
            .strip_prefix("sha256:")
            .unwrap();
        assert!(names.contains(&format!("blobs/sha256/{digest}")));
    }
}
