//! One agent per bpffs directory: an exclusive `flock` on the directory for
//! the agent's whole life.
//!
//! A second agent on the same pins would take over the first one's links
//! (`BPF_LINK_UPDATE` with its own programs) and both would write the same
//! maps from different views of the cluster; `weir-agent cleanup` against a
//! live agent would detach the datapath under it. The lock is the kernel's:
//! it goes with the process however it ends (SIGKILL included), so a crashed
//! agent never leaves a stale lock. bpffs holds only BPF objects, so the
//! holder's pid cannot be written next to the pins; it is read back from
//! `/proc/locks`, which names the process holding each lock.
use std::{
    fs::File,
    io,
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
};

/// Held for as long as it lives.
#[derive(Debug)]
pub struct PinLock {
    _dir: File,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The directory could not be made (bpffs not mounted, …).
    #[error(transparent)]
    Prepare(#[from] super::loader::LoadError),
    #[error(
        "{} is in use by another weir-agent ({}): two agents on one --bpffs directory would take over each other's programs and overwrite each other's maps",
        .path.display(), holder(.pid)
    )]
    Held { path: PathBuf, pid: Option<u32> },
    #[error("cannot lock {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn holder(pid: &Option<u32>) -> String {
    match pid {
        Some(pid) => format!("pid {pid}"),
        None => "its pid is not visible from this PID namespace".to_owned(),
    }
}

impl LockError {
    /// The holder's pid, when the lock is held and the holder visible.
    pub const fn holder(&self) -> Option<u32> {
        match self {
            Self::Held { pid, .. } => *pid,
            Self::Prepare(_) | Self::Io { .. } => None,
        }
    }
}

/// The agent's lock: makes the pin directories (mounting bpffs at its usual
/// place if needed, as loading would) and locks their root without waiting.
pub fn lock_pins(pins: &super::pins::Pins) -> Result<PinLock, LockError> {
    super::loader::prepare_dirs(pins)?;
    try_lock(pins.root())
}

/// Takes the lock on `dir` (which must exist) without waiting.
pub fn try_lock(dir: &Path) -> Result<PinLock, LockError> {
    let io_err = |source| LockError::Io {
        path: dir.to_path_buf(),
        source,
    };
    // Read-only suffices for flock; the descriptor is close-on-exec, so no
    // child process inherits the lock.
    let file = File::open(dir).map_err(io_err)?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(PinLock { _dir: file });
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
        return Err(io_err(e));
    }
    let pid = file.metadata().ok().and_then(|m| {
        let locks = std::fs::read_to_string("/proc/locks").ok()?;
        flock_holder(&locks, m.dev(), m.ino())
    });
    Err(LockError::Held {
        path: dir.to_path_buf(),
        pid,
    })
}

/// The pid holding a `flock` on inode `ino` of device `dev`, from
/// `/proc/locks` text: `1: FLOCK  ADVISORY  WRITE 4242 00:2a:1234 0 EOF`
/// (the device as hex major:minor). Waiters (`1: -> FLOCK …`) are skipped,
/// and so is a pid of 0, which a holder outside our PID namespace gets.
pub fn flock_holder(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let want = format!("{major:02x}:{minor:02x}:{ino}");
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.get(1) != Some(&"FLOCK") || f.get(5) != Some(&want.as_str()) {
            return None;
        }
        f.get(4)?.parse().ok().filter(|&p: &u32| p > 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_is_read_from_proc_locks_for_the_right_inode_only() {
        // dev 0:42 (bpffs mounts get anonymous devices), inode 1234.
        let dev = 42;
        let locks = "1: POSIX  ADVISORY  WRITE 99 00:2a:1234 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 7 00:2a:999 0 EOF\n\
                     3: -> FLOCK  ADVISORY  WRITE 8 00:2a:1234 0 EOF\n\
                     4: FLOCK  ADVISORY  WRITE 4242 00:2a:1234 0 EOF\n";
        assert_eq!(flock_holder(locks, dev, 1234), Some(4242));
        assert_eq!(flock_holder(locks, dev, 5), None);
        // A large device number (glibc's makedev): major 259, minor 65536,
        // whose low byte is 0.
        let (major, minor): (u64, u64) = (259, 65536);
        let dev = (major << 8) | ((minor & !0xff) << 12);
        let locks = "1: FLOCK  ADVISORY  WRITE 5 103:10000:77 0 EOF\n";
        assert_eq!(flock_holder(locks, dev, 77), Some(5));
    }

    #[test]
    fn a_second_lock_fails_naming_this_process() {
        let dir = std::env::temp_dir().join(format!("weir-lock-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let first = try_lock(&dir).unwrap();
        // flock locks belong to the open file: a second open conflicts even
        // within one process, as a second agent's would.
        let e = try_lock(&dir).unwrap_err();
        assert_eq!(e.holder(), Some(std::process::id()));
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        assert!(msg.contains(&dir.display().to_string()), "{msg}");
        drop(first);
        let again = try_lock(&dir).unwrap();
        drop(again);
        std::fs::remove_dir(&dir).unwrap();
    }
}
