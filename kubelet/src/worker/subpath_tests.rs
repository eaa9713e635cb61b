//! subPath resolution against planted links (no root needed: openat2 and
//! mkdirat only; the bind mount itself is tested on containerd in
//! tests/integration's kubelet_worker).
use std::os::{fd::AsRawFd as _, unix::fs::symlink};

use super::*;

/// A volume and a directory beside it that links must not reach.
struct Dirs {
    base: PathBuf,
    volume: PathBuf,
    outside: PathBuf,
}

impl Dirs {
    fn new(tag: &str) -> Self {
        let base = std::env::temp_dir().join(format!("weir-subpath-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let (volume, outside) = (base.join("volume"), base.join("outside"));
        std::fs::create_dir_all(volume.join("ok")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(volume.join("ok/f"), "inside").unwrap();
        symlink(&outside, volume.join("abs")).unwrap();
        symlink("../outside", volume.join("up")).unwrap();
        symlink("ok", volume.join("rel")).unwrap();
        symlink("/proc/self/root", volume.join("magic")).unwrap();
        Self {
            base,
            volume,
            outside,
        }
    }

    fn root(&self) -> OwnedFd {
        File::open(&self.volume).unwrap().into()
    }

    fn resolve(&self, sub: &str) -> Result<PathBuf, SubPathError> {
        let fd = open_or_create_beneath(&self.root(), sub)?;
        Ok(std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap())
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

#[test]
fn links_out_of_the_volume_are_refused() {
    let d = Dirs::new("escape");
    for sub in [
        "abs",
        "up",
        "magic",
        "abs/x",
        "up/new/dir",
        "ok/../../outside",
    ] {
        match d.resolve(sub) {
            Err(SubPathError::Escapes | SubPathError::Path(_)) => {}
            other => panic!("{sub}: {other:?}"),
        }
    }
    assert_eq!(
        std::fs::read_dir(&d.outside).unwrap().count(),
        0,
        "nothing was created through a link"
    );
}

#[test]
fn paths_inside_resolve_and_missing_ones_are_made() {
    let d = Dirs::new("inside");
    assert_eq!(d.resolve("ok").unwrap(), d.volume.join("ok"));
    assert_eq!(d.resolve("rel").unwrap(), d.volume.join("ok"));
    assert_eq!(d.resolve("ok/f").unwrap(), d.volume.join("ok/f"));
    assert_eq!(d.resolve("made/here").unwrap(), d.volume.join("made/here"));
    assert!(d.volume.join("made/here").is_dir());
    assert_eq!(d.resolve("rel/deeper").unwrap(), d.volume.join("ok/deeper"));
}

#[test]
fn unmounting_what_is_not_mounted_is_fine() {
    let d = Dirs::new("unmount");
    unmount(&d.volume.join("ok")).unwrap();
    unmount(&d.volume.join("missing")).unwrap();
    unmount_all(&d.volume.join("no-subpaths")).unwrap();
}
