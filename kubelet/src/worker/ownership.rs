//! `fsGroup`: a pod's own volumes (emptyDir, configMap, secret) belong to
//! the group, as the kubelet's `SetVolumeOwnership` makes them, so a
//! non-root container can use them: every entry gets the group, files
//! group read-write (read-only volumes: read), directories also group
//! search and setgid so that new files inherit the group. hostPath volumes
//! are the node's and are never touched.
use std::{
    io,
    os::unix::fs::{MetadataExt as _, PermissionsExt as _, lchown},
    path::Path,
};

const RW: u32 = 0o660;
const RO: u32 = 0o440;
const EXEC: u32 = 0o110;
const SETGID: u32 = 0o2000;

/// The permission bits an entry with `mode` gets (`changeFilePermission`).
pub(super) fn owned_mode(mode: u32, is_dir: bool, readonly: bool) -> u32 {
    let mut mask = if readonly { RO } else { RW };
    if is_dir {
        mask |= SETGID | EXEC;
    }
    (mode & 0o7777) | mask
}

/// Whether `dir` already is as [`set_volume_ownership`] leaves it: the
/// kubelet's emptyDir is set up (and owned) once per pod, and a root that is
/// right stands for the tree below it (the `OnRootMismatch` shortcut).
pub(super) fn root_owned(dir: &Path, gid: u32, readonly: bool) -> bool {
    std::fs::symlink_metadata(dir).is_ok_and(|m| {
        m.is_dir() && m.gid() == gid && owned_mode(m.mode(), true, readonly) == m.mode() & 0o7777
    })
}

/// Gives `dir` and everything below it to group `gid`. Symlinks are
/// re-grouped themselves (lchown) but never followed, nor chmod-ed (that
/// would follow them): a container cannot point the walk at the node.
pub(super) fn set_volume_ownership(dir: &Path, gid: u32, readonly: bool) -> io::Result<()> {
    let md = std::fs::symlink_metadata(dir)?;
    lchown(dir, None, Some(gid))?;
    if md.file_type().is_symlink() {
        return Ok(());
    }
    std::fs::set_permissions(
        dir,
        std::fs::Permissions::from_mode(owned_mode(md.mode(), md.is_dir(), readonly)),
    )?;
    if md.is_dir() {
        for e in std::fs::read_dir(dir)? {
            set_volume_ownership(&e?.path(), gid, readonly)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn modes_as_the_kubelet_sets_them() {
        assert_eq!(owned_mode(0o755, true, false), 0o2775);
        assert_eq!(owned_mode(0o644, false, false), 0o664);
        assert_eq!(owned_mode(0o400, false, true), 0o440);
        assert_eq!(owned_mode(0o100_755, true, true), 0o2755);
    }

    #[test]
    fn a_tree_is_given_to_the_group_without_following_symlinks() {
        let dir = std::env::temp_dir().join(format!("weir-ownership-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/f"), "x").unwrap();
        std::fs::set_permissions(dir.join("sub/f"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        // Outside the tree: must keep its group and mode.
        let outside = dir.with_extension("outside");
        std::fs::write(&outside, "y").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
        symlink(&outside, dir.join("link")).unwrap();
        let before = std::fs::metadata(&outside).unwrap();
        // Our own group: chgrp to it needs no privilege.
        let gid = std::fs::metadata(&dir).unwrap().gid();
        assert!(!root_owned(&dir, gid, false));
        set_volume_ownership(&dir, gid, false).unwrap();
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&dir.join("sub")) & 0o2070, 0o2070);
        assert_eq!(mode(&dir.join("sub/f")), 0o660);
        let after = std::fs::metadata(&outside).unwrap();
        assert_eq!(
            (after.mode(), after.gid()),
            (before.mode(), before.gid()),
            "followed the symlink"
        );
        assert!(root_owned(&dir, gid, false));
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_file(&outside).unwrap();
    }
}
