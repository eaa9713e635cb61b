//! `subPath` mounts that cannot leave their volume (CVE-2017-1002101's
//! class). A container may put a symlink anywhere in a volume it writes to
//! (an init container's `ln -s / $VOLUME/x`), so the subPath is never handed
//! to the runtime as a path: it is opened beneath the volume with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` (missing directories
//! made one at a time beneath it), and the opened file itself is bind-mounted
//! through `/proc/self/fd/N` onto a kubelet-owned path,
//! `<pod dir>/volume-subpaths/<volume>/<container>/<mount index>`, which is
//! what the runtime gets, as the kubelet does. Whatever happens in the volume
//! afterwards, the mount is the object that was checked.
use std::{
    ffi::CString,
    fs::File,
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Path, PathBuf},
};

use crate::safe_path;

/// Why a subPath could not be mounted.
#[derive(Debug, thiserror::Error)]
pub enum SubPathError {
    #[error(transparent)]
    Path(#[from] safe_path::PathError),
    /// RESOLVE_BENEATH refused a step: an absolute link, `..` above the
    /// volume, a /proc magic link or a link loop.
    #[error("leads outside its volume (through a symlink or '..')")]
    Escapes,
    #[error("{step} {}: {source}", path.display())]
    Io {
        step: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

fn io_err(step: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SubPathError {
    let path = path.to_owned();
    move |source| match source.raw_os_error() {
        // RESOLVE_BENEATH refuses absolute links and `..` above the root
        // with EXDEV; RESOLVE_NO_MAGICLINKS refuses /proc magic links with ELOOP.
        Some(libc::EXDEV | libc::ELOOP) => SubPathError::Escapes,
        _ => SubPathError::Io { step, path, source },
    }
}

fn cstring(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput.into())
}

/// `openat2(dir, rel, O_PATH | O_CLOEXEC, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`:
/// every step of `rel`, symlinks included, must stay below `dir`.
pub(super) fn open_beneath(dir: &OwnedFd, rel: &Path) -> io::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let c = cstring(rel)?;
    // SAFETY: open_how is plain old data; all-zero is its "no options" value.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    // The kernel asks for a retry (EAGAIN) when a rename raced a `..` lookup.
    for _ in 0..16 {
        // SAFETY: valid fd, NUL-terminated path and a live open_how of the
        // size passed; the returned fd is ours alone.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir.as_raw_fd(),
                c.as_ptr(),
                &raw mut how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: a new fd from the kernel, owned by nobody else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(e);
        }
    }
    Err(io::ErrorKind::Interrupted.into())
}

/// Opens `rel` beneath `root`, first creating what is missing of it as
/// directories, each with `mkdirat` in a directory already opened beneath
/// `root`: a link planted meanwhile is never followed out.
pub(super) fn open_or_create_beneath(root: &OwnedFd, rel: &str) -> Result<OwnedFd, SubPathError> {
    let parts = safe_path::descending("subPath", rel)?;
    let full: PathBuf = parts.iter().collect();
    match open_beneath(root, &full) {
        Ok(fd) => return Ok(fd),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("opening", &full)(e)),
    }
    let mut done = PathBuf::new();
    for part in parts {
        let next = done.join(part);
        match open_beneath(root, &next) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let parent = open_beneath(root, &done).map_err(io_err("opening", &done))?;
                let name = cstring(Path::new(part)).map_err(io_err("creating", &next))?;
                // SAFETY: valid fd and NUL-terminated single-component name.
                let rc = unsafe { libc::mkdirat(parent.as_raw_fd(), name.as_ptr(), 0o755) };
                if rc != 0 {
                    let e = io::Error::last_os_error();
                    if e.kind() != io::ErrorKind::AlreadyExists {
                        return Err(io_err("creating", &next)(e));
                    }
                }
            }
            Err(e) => return Err(io_err("opening", &next)(e)),
        }
        done = next;
    }
    open_beneath(root, &full).map_err(io_err("opening", &full))
}

/// Bind-mounts `sub_path` of the volume at `volume_root` onto `target` (a
/// kubelet-owned path), replacing an earlier mount there: every container
/// start resolves the subPath afresh.
pub(super) fn bind(volume_root: &Path, sub_path: &str, target: &Path) -> Result<(), SubPathError> {
    let root: OwnedFd = File::open(volume_root)
        .map_err(io_err("opening the volume", volume_root))?
        .into();
    let fd = open_or_create_beneath(&root, sub_path)?;
    // SAFETY: fstat on a valid fd into a zeroed stat we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &raw mut st) } != 0 {
        return Err(io_err("inspecting", Path::new(sub_path))(
            io::Error::last_os_error(),
        ));
    }
    let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
    unmount(target).map_err(io_err("unmounting", target))?;
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(io_err("creating", parent))?;
    }
    // The mount point must be of the source's kind; a previous instance may
    // have left the other one.
    match (std::fs::symlink_metadata(target), is_dir) {
        (Ok(m), true) if m.is_dir() => {}
        (Ok(m), false) if m.is_file() => {}
        (Ok(m), _) => {
            let r = if m.is_dir() {
                std::fs::remove_dir(target)
            } else {
                std::fs::remove_file(target)
            };
            r.map_err(io_err("replacing", target))?;
            make_mount_point(target, is_dir)?;
        }
        (Err(_), _) => make_mount_point(target, is_dir)?,
    }
    let source = cstring(Path::new(&format!("/proc/self/fd/{}", fd.as_raw_fd())))
        .map_err(io_err("mounting", target))?;
    let dest = cstring(target).map_err(io_err("mounting", target))?;
    // SAFETY: NUL-terminated paths; no data argument for a bind mount.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            dest.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io_err("bind-mounting onto", target)(
            io::Error::last_os_error(),
        ));
    }
    Ok(())
}

fn make_mount_point(target: &Path, is_dir: bool) -> Result<(), SubPathError> {
    let r = if is_dir {
        std::fs::create_dir(target)
    } else {
        std::fs::File::create(target).map(drop)
    };
    r.map_err(io_err("creating", target))
}

/// Detaches the mount at `path`, if there is one (the path itself, never a
/// link there).
pub(super) fn unmount(path: &Path) -> io::Result<()> {
    let c = cstring(path)?;
    // SAFETY: NUL-terminated path.
    let rc = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        // Not a mount point, or not there at all.
        Some(libc::EINVAL | libc::ENOENT) => Ok(()),
        _ => Err(e),
    }
}

/// Unmounts every `volume-subpaths/<volume>/<container>/<index>` below `dir`.
pub(super) fn unmount_all(dir: &Path) -> io::Result<()> {
    let entries = |d: &Path| -> io::Result<Vec<PathBuf>> {
        match std::fs::read_dir(d) {
            Ok(rd) => rd.map(|e| e.map(|e| e.path())).collect(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    };
    for volume in entries(dir)? {
        for container in entries(&volume)? {
            for index in entries(&container)? {
                unmount(&index)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "subpath_tests.rs"]
mod tests;
