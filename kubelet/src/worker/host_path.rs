//! `hostPath` volumes' `type` checks, as the kubelet's hostPath plugin makes
//! them (`checkTypeInternal`) before the container is created: `…OrCreate`
//! creates what is missing (a directory 0755 with its parents, a file 0644
//! but never its parent), everything else only checks, following symlinks.
use std::{
    os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use super::spec::{ContainerConfigError, io_err};
use crate::pod::HostPathType;

pub(super) fn check(
    volume: &str,
    p: &Path,
    kind: HostPathType,
) -> Result<PathBuf, ContainerConfigError> {
    let bad = |reason| ContainerConfigError::HostPath {
        volume: volume.to_owned(),
        path: p.to_owned(),
        reason,
    };
    let ft = std::fs::metadata(p).ok().map(|m| m.file_type());
    let is = |f: fn(&std::fs::FileType) -> bool| ft.as_ref().is_some_and(f);
    match kind {
        // No check: the runtime creates a missing source as a directory.
        HostPathType::Unset => {}
        HostPathType::DirectoryOrCreate if ft.is_none() => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(p)
                .map_err(io_err(volume, p))?;
        }
        HostPathType::DirectoryOrCreate | HostPathType::Directory => {
            if !is(std::fs::FileType::is_dir) {
                return Err(bad("is not a directory"));
            }
        }
        HostPathType::FileOrCreate if ft.is_none() => {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o644)
                .open(p)
                .map_err(io_err(volume, p))?;
        }
        HostPathType::FileOrCreate | HostPathType::File => {
            if !is(std::fs::FileType::is_file) {
                return Err(bad("is not a file"));
            }
        }
        HostPathType::Socket if !is(std::fs::FileType::is_socket) => {
            return Err(bad("is not a socket file"));
        }
        HostPathType::CharDevice if !is(std::fs::FileType::is_char_device) => {
            return Err(bad("is not a character device"));
        }
        HostPathType::BlockDevice if !is(std::fs::FileType::is_block_device) => {
            return Err(bad("is not a block device"));
        }
        HostPathType::Socket | HostPathType::CharDevice | HostPathType::BlockDevice => {}
    }
    Ok(p.to_owned())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;
    use HostPathType::*;

    struct TempDir(PathBuf);

    impl TempDir {
        fn new(tag: &str) -> Self {
            let d =
                std::env::temp_dir().join(format!("weir-hostpath-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Self(d)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    /// Every type against every kind of file, as `checkTypeInternal` answers.
    #[test]
    fn types_against_what_is_there() {
        let t = TempDir::new("types");
        let dir = t.0.join("dir");
        let file = t.0.join("file");
        let sock = t.0.join("sock");
        let link = t.0.join("link-to-dir");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(&file, "x").unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let null = Path::new("/dev/null");
        let missing = t.0.join("missing");
        let ok = |k, p: &Path| check("v", p, k).is_ok();
        #[rustfmt::skip]
        let table: [(HostPathType, &Path, bool); 20] = [
            (Unset, &missing, true),
            (Directory, &dir, true),
            (Directory, &link, true),
            (Directory, &file, false),
            (Directory, &missing, false),
            (DirectoryOrCreate, &dir, true),
            (DirectoryOrCreate, &file, false),
            (File, &file, true),
            (File, &dir, false),
            (File, &sock, false),
            (File, &missing, false),
            (FileOrCreate, &file, true),
            (FileOrCreate, &dir, false),
            (Socket, &sock, true),
            (Socket, &file, false),
            (Socket, &missing, false),
            (CharDevice, null, true),
            (CharDevice, &file, false),
            (BlockDevice, null, false),
            (BlockDevice, &missing, false),
        ];
        for (kind, path, want) in table {
            assert_eq!(ok(kind, path), want, "{kind:?} {}", path.display());
        }
        assert!(!missing.exists(), "only the …OrCreate types create");
        let e = check("v", &file, Directory).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "volume \"v\": hostPath type check failed: {} is not a directory",
                file.display()
            )
        );
    }

    #[test]
    fn or_create_makes_what_is_missing_with_the_kubelets_modes() {
        let t = TempDir::new("create");
        let d = t.0.join("a/b/c");
        check("v", &d, DirectoryOrCreate).unwrap();
        assert!(d.is_dir());
        assert_eq!(mode(&d) & !0o022, 0o755 & !0o022, "umask aside, 0755");
        let f = t.0.join("a/lock");
        check("v", &f, FileOrCreate).unwrap();
        assert!(f.is_file());
        assert_eq!(mode(&f) & 0o133, 0, "at most 0644");
        // An existing file keeps its content.
        std::fs::write(&f, "held").unwrap();
        check("v", &f, FileOrCreate).unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "held");
        // The kubelet never creates a file's parent.
        let orphan = t.0.join("no/such/dir/file");
        let e = check("v", &orphan, FileOrCreate).unwrap_err();
        assert!(matches!(e, ContainerConfigError::Io { .. }), "{e}");
        assert!(!t.0.join("no").exists());
    }
}
