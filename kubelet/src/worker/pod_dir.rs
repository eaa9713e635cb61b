//! The pod's own directory, `<pods_dir>/<uid>`, and what lives in it:
//! `volumes/<plugin>/<volume>` and `volume-subpaths/<volume>/<container>/<i>`.
//! Every path is joined from checked identifiers ([`safe_path`]), so none
//! leaves `pods_dir`. Removal unmounts the subPath mounts first and refuses
//! while anything below is still mounted: `remove_dir_all` through a bind
//! mount would delete the volume's own files (a hostPath's, on the host).
use std::{
    io,
    path::{Path, PathBuf},
};

use super::{WorkerConfig, subpath};
use crate::safe_path::{self, PathError};

/// Why a pod directory was left in place.
#[derive(Debug, thiserror::Error)]
pub enum RemoveError {
    #[error(transparent)]
    Path(#[from] PathError),
    #[error("unmounting the subPath mounts of {}: {source}", dir.display())]
    Unmount { dir: PathBuf, source: io::Error },
    #[error("{} still has mounts below it: {mounts:?}", dir.display())]
    StillMounted { dir: PathBuf, mounts: Vec<PathBuf> },
    #[error("removing {}: {source}", dir.display())]
    Remove { dir: PathBuf, source: io::Error },
}

/// `<pods_dir>/<uid>`.
pub(crate) fn pod_dir(cfg: &WorkerConfig, uid: &str) -> Result<PathBuf, PathError> {
    Ok(cfg.pods_dir.join(safe_path::uid(uid)?))
}

/// `<pod dir>/volumes/<plugin>/<volume>`, the kubelet's layout.
pub(super) fn volume_dir(
    cfg: &WorkerConfig,
    uid: &str,
    plugin: &'static str,
    volume: &str,
) -> Result<PathBuf, PathError> {
    let plugins = pod_dir(cfg, uid)?.join("volumes").join(plugin);
    safe_path::join_name(&plugins, "volume name", volume)
}

/// `<pod dir>/volume-subpaths`.
fn subpaths_dir(cfg: &WorkerConfig, uid: &str) -> Result<PathBuf, PathError> {
    Ok(pod_dir(cfg, uid)?.join("volume-subpaths"))
}

/// Where the subPath of mount `index` of `container` is bind-mounted:
/// `<pod dir>/volume-subpaths/<volume>/<container>/<index>`, as the kubelet.
pub(super) fn subpath_target(
    cfg: &WorkerConfig,
    uid: &str,
    volume: &str,
    container: &str,
    index: usize,
) -> Result<PathBuf, PathError> {
    let v = safe_path::join_name(&subpaths_dir(cfg, uid)?, "volume name", volume)?;
    Ok(safe_path::join_name(&v, "container name", container)?.join(index.to_string()))
}

/// The plugin directory of Secret volumes, each of which is a tmpfs.
pub(super) const SECRET_PLUGIN: &str = "kubernetes.io~secret";
/// Projected volumes may hold Secrets and tokens: each is a tmpfs too.
pub(super) const PROJECTED_PLUGIN: &str = "kubernetes.io~projected";

/// The size limit of one Secret volume's tmpfs. A Secret holds at most
/// 1 MiB; the rest is room for rewrites and the tmpfs's own metadata.
const SECRET_TMPFS_SIZE: &str = "8m";

/// Makes `dir`, a Secret volume's directory, a tmpfs of its own (as the
/// kubelet's secret plugin does through a memory-backed emptyDir), so that
/// Secret data never reaches the node's disk. The directories above it
/// (`volumes`, `volumes/kubernetes.io~secret`) are made 0750: no one but
/// root reaches the volume on the host. The tmpfs root itself is 0755 so a
/// non-root container reads the files their modes allow, as on a kubelet.
/// Idempotent: a directory already a mount point is left as it is.
pub(super) fn secret_tmpfs(dir: &Path) -> io::Result<()> {
    use std::os::unix::{ffi::OsStrExt as _, fs::PermissionsExt as _};
    std::fs::create_dir_all(dir)?;
    for up in [dir.parent(), dir.parent().and_then(Path::parent)]
        .into_iter()
        .flatten()
    {
        std::fs::set_permissions(up, std::fs::Permissions::from_mode(0o750))?;
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    if mount_points(&info).any(|m| m == dir) {
        return Ok(());
    }
    let target = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let data = std::ffi::CString::new(format!("mode=0755,size={SECRET_TMPFS_SIZE}"))
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: every pointer is a NUL-terminated string alive for the call.
    let rc = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Unmounts every mount below `dir` (the pod's Secret tmpfs mounts),
/// deepest first; a busy one is detached.
fn unmount_below(dir: &Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let mut mounts = mounts_below(dir)?;
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    for m in mounts {
        let target = std::ffi::CString::new(m.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: a NUL-terminated path alive for the call.
        if unsafe { libc::umount2(target.as_ptr(), libc::UMOUNT_NOFOLLOW) } != 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINVAL | libc::ENOENT) => {}
                Some(libc::EBUSY) => {
                    // SAFETY: as above.
                    if unsafe {
                        libc::umount2(target.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW)
                    } != 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                }
                _ => return Err(e),
            }
        }
    }
    Ok(())
}

/// Unmounts the pod's subPath mounts and Secret tmpfs mounts, then removes
/// its directory unless something is still mounted below it. A missing
/// directory is fine.
pub(super) fn remove(cfg: &WorkerConfig, uid: &str) -> Result<(), RemoveError> {
    let dir = pod_dir(cfg, uid)?;
    subpath::unmount_all(&subpaths_dir(cfg, uid)?).map_err(|source| RemoveError::Unmount {
        dir: dir.clone(),
        source,
    })?;
    for plugin in [SECRET_PLUGIN, PROJECTED_PLUGIN] {
        unmount_below(&dir.join("volumes").join(plugin)).map_err(|source| {
            RemoveError::Unmount {
                dir: dir.clone(),
                source,
            }
        })?;
    }
    let mounts = mounts_below(&dir).map_err(|source| RemoveError::Unmount {
        dir: dir.clone(),
        source,
    })?;
    if !mounts.is_empty() {
        return Err(RemoveError::StillMounted { dir, mounts });
    }
    match std::fs::remove_dir_all(&dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            Err(RemoveError::Remove { dir, source: e })
        }
        _ => Ok(()),
    }
}

/// Mount points strictly below `dir` in this mount namespace.
fn mounts_below(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(mount_points(&info)
        .filter(|m| m.starts_with(dir) && m != dir)
        .collect())
}

/// The mount points of a mountinfo text (field 5, octal escapes undone).
fn mount_points(info: &str) -> impl Iterator<Item = PathBuf> + '_ {
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(unescape(m)))
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) if d[0] <= b'3' => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pods: &Path) -> WorkerConfig {
        let mut c = WorkerConfig::new(&crate::config::Config::default(), "node1");
        c.pods_dir = pods.to_owned();
        c
    }

    #[test]
    fn layout_is_the_kubelets_and_stays_below_pods_dir() {
        let c = cfg(Path::new("/var/lib/kubelet/pods"));
        assert_eq!(
            volume_dir(&c, "u-1", "kubernetes.io~empty-dir", "data").unwrap(),
            Path::new("/var/lib/kubelet/pods/u-1/volumes/kubernetes.io~empty-dir/data")
        );
        assert_eq!(
            subpath_target(&c, "u-1", "data", "app", 2).unwrap(),
            Path::new("/var/lib/kubelet/pods/u-1/volume-subpaths/data/app/2")
        );
        assert!(pod_dir(&c, "../../..").is_err());
        assert!(volume_dir(&c, "u-1", "kubernetes.io~empty-dir", "..").is_err());
        assert!(subpath_target(&c, "u-1", "data", "../x", 0).is_err());
    }

    /// Issue 12 item 1 at the worker: removal with a UID that walks up
    /// refuses, and the directory it named survives.
    #[test]
    fn removal_never_leaves_the_pods_dir() {
        let base = std::env::temp_dir().join(format!("weir-pod-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let pods = base.join("root/pods");
        let victim = base.join("victim");
        std::fs::create_dir_all(pods.join("u-1/volumes")).unwrap();
        std::fs::create_dir_all(&victim).unwrap();
        let c = cfg(&pods);
        for uid in ["../../victim", "../..", "/", ""] {
            assert!(
                matches!(remove(&c, uid), Err(RemoveError::Path(_))),
                "{uid:?}"
            );
        }
        assert!(victim.is_dir());
        remove(&c, "u-1").unwrap();
        assert!(!pods.join("u-1").exists() && pods.is_dir());
        remove(&c, "u-1").unwrap();
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// Issue 12 item 7: a Secret volume is a tmpfs below 0750 directories,
    /// mounted once, and removal unmounts it before removing the pod dir.
    #[test]
    fn secret_volumes_are_tmpfs_and_unmounted_on_removal() {
        use std::os::unix::fs::PermissionsExt as _;
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root");
            return;
        }
        let base = std::env::temp_dir().join(format!("weir-secret-tmpfs-{}", std::process::id()));
        let c = cfg(&base.join("pods"));
        let dir = volume_dir(&c, "u-1", SECRET_PLUGIN, "s").unwrap();
        // Unmounts whatever the test left behind, even when it fails.
        struct Cleanup(PathBuf);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                let _ = unmount_below(&self.0);
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _cleanup = Cleanup(base.clone());
        secret_tmpfs(&dir).unwrap();
        secret_tmpfs(&dir).unwrap();
        assert_eq!(mounts_below(&base).unwrap(), vec![dir.clone()]);
        for d in [
            dir.parent().unwrap(),
            dir.parent().unwrap().parent().unwrap(),
        ] {
            let mode = std::fs::metadata(d).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o750, "{}", d.display());
        }
        remove(&c, "u-1").unwrap();
        assert!(mounts_below(&base).unwrap().is_empty());
        assert!(!pod_dir(&c, "u-1").unwrap().exists());
    }

    #[test]
    fn mountinfo_paths_are_unescaped() {
        let info = "36 35 98:0 /mnt1 /mnt/a\\040b rw,noatime master:1 - ext3 /dev/root rw\n\
                    37 35 98:0 / /var/lib/kubelet/pods/u/volume-subpaths/v/c/0 rw - ext4 /dev/vda rw\n";
        let m: Vec<PathBuf> = mount_points(info).collect();
        assert_eq!(m[0], Path::new("/mnt/a b"));
        assert_eq!(
            m[1],
            Path::new("/var/lib/kubelet/pods/u/volume-subpaths/v/c/0")
        );
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
    }
}
