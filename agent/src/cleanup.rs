//! `weir-agent cleanup`: detach every program and remove every pin.
use std::{io, os::fd::AsFd as _, path::Path};

use tracing::{info, warn};

use crate::datapath::{
    links,
    lock::{self, LockError},
    pins::Pins,
};

#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    #[error(
        "{0}; stop it first (cleanup would detach the datapath it is serving), or pass --force"
    )]
    AgentRunning(LockError),
    #[error("cleaning up {}: {source}", .path.display())]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: io::Error,
    },
}

/// `weir-agent cleanup`: [`cleanup`] while holding the agent's lock, so no
/// agent starts half-way through. An agent that holds it is running on these
/// pins: refused, unless `force`.
pub fn cleanup_unless_running(pins: &Pins, force: bool) -> Result<Cleaned, CleanupError> {
    let io_err = |source| CleanupError::Io {
        path: pins.root().to_path_buf(),
        source,
    };
    let _lock = if pins.root().is_dir() {
        match lock::try_lock(pins.root()) {
            Ok(l) => Some(l),
            Err(e) if force => {
                warn!("{e}; cleaning up anyway (--force)");
                None
            }
            Err(e @ LockError::Held { .. }) => return Err(CleanupError::AgentRunning(e)),
            Err(LockError::Io { source, .. }) => return Err(io_err(source)),
            Err(e @ LockError::Prepare(_)) => return Err(io_err(io::Error::other(e))),
        }
    } else {
        None
    };
    cleanup(pins).map_err(io_err)
}

#[derive(Debug, Default)]
pub struct Cleaned {
    pub links: usize,
    pub pins: usize,
}

/// Detaches every link pinned under `<bpffs>/links` (socket hooks, tc and XDP
/// links of every device, and staging leftovers of a crashed agent) and
/// removes every pin, maps included.
pub fn cleanup(pins: &Pins) -> io::Result<Cleaned> {
    let mut done = Cleaned::default();
    match std::fs::read_dir(pins.links()) {
        Ok(entries) => {
            for entry in entries {
                let path = entry?.path();
                match links::open_pinned(&path) {
                    Ok(fd) => {
                        // A defunct link (its cgroup or device is gone) cannot
                        // be detached and needs no detaching.
                        if links::detach(fd.as_fd()).is_ok() {
                            done.links += 1;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    // Not a link (nothing else should be here): just unpin.
                    Err(_) => {}
                }
                remove(&path, &mut done)?;
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    if let Ok(entries) = std::fs::read_dir(pins.maps()) {
        for entry in entries {
            remove(&entry?.path(), &mut done)?;
        }
    }
    for dir in [pins.maps(), pins.links(), pins.root().to_path_buf()] {
        match std::fs::remove_dir(&dir) {
            Ok(()) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::DirectoryNotEmpty
                ) => {}
            Err(e) => return Err(e),
        }
    }
    info!(links = done.links, pins = done.pins, "cleanup done");
    Ok(done)
}

fn remove(path: &Path, done: &mut Cleaned) -> io::Result<()> {
    std::fs::remove_file(path)?;
    done.pins += 1;
    Ok(())
}
