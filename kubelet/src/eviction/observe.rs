//! What the eviction manager measures: the node's signals (the kubelet's
//! `makeSignalObservations`) and each pod's use of memory and local storage.
//!
//! - `memory.available`: `MemAvailable` of /proc/meminfo against `MemTotal`.
//!   The kubelet takes the root cgroup's working set (usage less inactive
//!   file pages) from cAdvisor; `MemAvailable` is the kernel's own estimate
//!   of the same reclaimable remainder.
//! - `nodefs.*`: statvfs of the kubelet's root directory; `imagefs.available`:
//!   statvfs of the runtime's image filesystem (CRI `ImageFsInfo`), the
//!   nodefs when the runtime names none.
//! - A pod's storage: the bytes and inodes below its directory (emptyDir,
//!   written files) and its log directory, on their own filesystem only;
//!   its memory: the working set of its cgroup (v2 `memory.current`, v1
//!   `memory.usage_in_bytes`, less inactive file pages).
use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use super::{
    decide::{Observations, Observed},
    thresholds::Signal,
};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsStats {
    pub capacity: u64,
    pub available: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

/// statvfs of the filesystem holding `path`.
pub fn fs_stats(path: &Path) -> Option<FsStats> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` is writable memory of the
    // right type; statvfs only writes into it.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled the struct.
    let st = unsafe { st.assume_init() };
    let frsize = st.f_frsize;
    Some(FsStats {
        capacity: st.f_blocks * frsize,
        available: st.f_bavail * frsize,
        inodes: st.f_files,
        inodes_free: st.f_favail,
    })
}

/// The image filesystem as the runtime reports it (containerd: its
/// snapshotter's directory); `None` makes imagefs the root directory's.
pub async fn image_fs<R: crate::cri::Runtime>(rt: &R) -> Option<PathBuf> {
    match rt.image_fs_mountpoint().await {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(error = %e, "no image filesystem from the runtime; imagefs is the root directory's");
            None
        }
    }
}

/// The node's signals now. A signal that cannot be read is left out, so it
/// can never evict.
pub fn node(root_dir: &Path, image_fs: Option<&Path>) -> Observations {
    let mut obs = Observations::new();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let (total, available) = crate::api::machine::parse_meminfo(&meminfo);
    if total > 0 {
        obs.insert(
            Signal::MemoryAvailable,
            Observed {
                available,
                capacity: total,
            },
        );
    }
    if let Some(fs) = fs_stats(root_dir) {
        obs.insert(
            Signal::NodeFsAvailable,
            Observed {
                available: fs.available,
                capacity: fs.capacity,
            },
        );
        obs.insert(
            Signal::NodeFsInodesFree,
            Observed {
                available: fs.inodes_free,
                capacity: fs.inodes,
            },
        );
    }
    if let Some(fs) = fs_stats(image_fs.unwrap_or(root_dir)) {
        obs.insert(
            Signal::ImageFsAvailable,
            Observed {
                available: fs.available,
                capacity: fs.capacity,
            },
        );
    }
    obs
}

/// Bytes (in blocks allocated) and inodes below `dir`, without leaving its
/// filesystem or following links. Missing or unreadable parts count as 0.
pub fn dir_usage(dir: &Path) -> (u64, u64) {
    let Ok(root) = std::fs::symlink_metadata(dir) else {
        return (0, 0);
    };
    let dev = root.dev();
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let mut stack: Vec<PathBuf> = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            if m.dev() != dev {
                continue;
            }
            bytes += m.blocks() * 512;
            inodes += 1;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    (bytes, inodes)
}

/// The working set of cgroup `path` (a cgroupfs path such as
/// `/kubepods/besteffort/pod<uid>`), v2 first, then v1's memory hierarchy.
pub fn cgroup_memory(path: &str) -> Option<u64> {
    let rel = path.trim_start_matches('/');
    let read = |p: PathBuf| std::fs::read_to_string(p).ok();
    let stat_field = |text: &str, key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse::<u64>().ok())
    };
    let v2 = Path::new("/sys/fs/cgroup").join(rel);
    if let Some(cur) = read(v2.join("memory.current")) {
        let usage: u64 = cur.trim().parse().ok()?;
        let inactive = read(v2.join("memory.stat"))
            .and_then(|s| stat_field(&s, "inactive_file "))
            .unwrap_or(0);
        return Some(usage.saturating_sub(inactive));
    }
    let v1 = Path::new("/sys/fs/cgroup/memory").join(rel);
    let usage: u64 = read(v1.join("memory.usage_in_bytes"))?
        .trim()
        .parse()
        .ok()?;
    let inactive = read(v1.join("memory.stat"))
        .and_then(|s| stat_field(&s, "total_inactive_file "))
        .unwrap_or(0);
    Some(usage.saturating_sub(inactive))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_usage_counts_files_below_and_follows_no_link() {
        let d = std::env::temp_dir().join(format!("weir-evict-usage-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        std::fs::write(d.join("a/b/f"), vec![1u8; 64 * 1024]).unwrap();
        std::os::unix::fs::symlink("/usr", d.join("a/link")).unwrap();
        let (bytes, inodes) = dir_usage(&d);
        // a, a/b, a/b/f, a/link
        assert_eq!(inodes, 4);
        assert!(
            (64 * 1024..64 * 1024 + 64 * 1024).contains(&bytes),
            "{bytes}"
        );
        assert_eq!(dir_usage(&d.join("missing")), (0, 0));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_node_signals_are_read() {
        let obs = node(&std::env::temp_dir(), None);
        for s in Signal::ALL {
            let o = obs[&s];
            assert!(o.capacity > 0 && o.available <= o.capacity, "{s:?} {o:?}");
        }
    }
}
