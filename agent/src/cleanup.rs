//! `weir-agent cleanup`: detach every program and remove every pin.
use std::{io, path::Path};

use tracing::info;

use crate::datapath::{
    links,
    pins::{Hook, Pins},
};

#[derive(Debug, Default)]
pub struct Cleaned {
    pub links: usize,
    pub pins: usize,
}

pub fn cleanup(pins: &Pins) -> io::Result<Cleaned> {
    let mut done = Cleaned::default();
    for hook in Hook::ALL {
        for path in [pins.link(hook), pins.staging_link(hook)] {
            match links::open_pinned(&path) {
                Ok(fd) => {
                    use std::os::fd::AsFd as _;
                    // A defunct link (its cgroup is gone) cannot be detached and
                    // needs no detaching.
                    if links::detach(fd.as_fd()).is_ok() {
                        done.links += 1;
                    }
                    remove(&path, &mut done)?;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
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
