//! Projected files (ConfigMap, Secret, downward API, projected volumes)
//! written as the kubelet's `AtomicWriter` (pkg/volume/util/atomic_writer.go)
//! writes them, so a running container never sees half an update:
//!
//! ```text
//! <volume>/..1796409600.000000001_77_0   the files of one version
//! <volume>/..data -> ..1796409600.…      swapped with one rename(2)
//! <volume>/token  -> ..data/token         what the container opens
//! ```
//!
//! A payload equal to what `..data` holds writes nothing (contents and the
//! set of paths are compared, as the kubelet does; a mode alone does not
//! rewrite). Payload paths were checked by `PodSpec::from_api` (relative,
//! no `..`, none starting with `..`), so no user file can take a name the
//! writer keeps for itself.
use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    os::unix::fs::{PermissionsExt as _, symlink},
    path::Path,
    sync::atomic::{AtomicU64, Ordering},
};

/// Relative path → (contents, mode).
pub type Payload = BTreeMap<String, (Vec<u8>, u32)>;

const DATA: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

/// Brings `dir` to `payload`; whether anything was written.
pub fn write(dir: &Path, payload: &Payload) -> io::Result<bool> {
    std::fs::create_dir_all(dir)?;
    let current = std::fs::read_link(dir.join(DATA))
        .ok()
        .and_then(|t| t.to_str().map(str::to_owned))
        .filter(|t| t.starts_with("..") && !t.contains('/'));
    if let Some(cur) = &current
        && holds(&dir.join(cur), payload)?
    {
        link_names(dir, payload)?;
        return Ok(false);
    }
    let version = new_version_name();
    let vdir = dir.join(&version);
    std::fs::create_dir(&vdir)?;
    for (rel, (bytes, mode)) in payload {
        let p = vdir.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, bytes)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode))?;
    }
    let tmp = dir.join(DATA_TMP);
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    symlink(&version, &tmp)?;
    std::fs::rename(&tmp, dir.join(DATA))?;
    link_names(dir, payload)?;
    // Old versions and links to names the payload no longer has.
    let wanted = top_names(payload);
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name == DATA || name == version {
            continue;
        }
        let ty = entry.file_type()?;
        if name.starts_with("..") && ty.is_dir() {
            // Never follows links: std's remove_dir_all removes a link
            // inside, not what it points to.
            std::fs::remove_dir_all(entry.path())?;
        } else if ty.is_symlink() && !wanted.contains(name) {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(true)
}

/// Whether `vdir` holds exactly `payload`'s paths with its contents.
fn holds(vdir: &Path, payload: &Payload) -> io::Result<bool> {
    let mut found = BTreeSet::new();
    if !collect_files(vdir, "", &mut found)? {
        return Ok(false);
    }
    if found.len() != payload.len() || !payload.keys().all(|k| found.contains(k)) {
        return Ok(false);
    }
    for (rel, (bytes, _)) in payload {
        match std::fs::read(vdir.join(rel)) {
            Ok(b) if b == *bytes => {}
            Ok(_) => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Regular files below `dir` as relative paths; false when `dir` is missing
/// or holds anything else (a link, a device): rewrite then.
fn collect_files(dir: &Path, prefix: &str, out: &mut BTreeSet<String>) -> io::Result<bool> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            return Ok(false);
        };
        let rel = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let ty = entry.file_type()?;
        if ty.is_dir() {
            if !collect_files(&entry.path(), &rel, out)? {
                return Ok(false);
            }
        } else if ty.is_file() {
            out.insert(rel);
        } else {
            return Ok(false);
        }
    }
    Ok(true)
}

fn top_names(payload: &Payload) -> BTreeSet<&str> {
    payload.keys().filter_map(|k| k.split('/').next()).collect()
}

/// `name -> ..data/name` for every top-level name of the payload. Anything
/// else in the way (a file an older layout wrote in place) is replaced.
fn link_names(dir: &Path, payload: &Payload) -> io::Result<()> {
    for name in top_names(payload) {
        let p = dir.join(name);
        let target = format!("{DATA}/{name}");
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                if std::fs::read_link(&p)?.as_os_str() == target.as_str() {
                    continue;
                }
                std::fs::remove_file(&p)?;
            }
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&p)?,
            Ok(_) => std::fs::remove_file(&p)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        symlink(&target, &p)?;
    }
    Ok(())
}

/// `..<Unix time>.<ns>_<pid>_<n>`: unique within the directory, and in
/// time order for someone looking (the kubelet writes a date instead).
fn new_version_name() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    format!(
        "..{}.{:09}_{}_{n}",
        now.as_secs(),
        now.subsec_nanos(),
        std::process::id()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("weir-atomic-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn payload(files: &[(&str, &str, u32)]) -> Payload {
        files
            .iter()
            .map(|(p, c, m)| ((*p).to_owned(), (c.as_bytes().to_vec(), *m)))
            .collect()
    }

    #[test]
    fn versions_are_swapped_whole_and_unchanged_payloads_write_nothing() {
        let d = tmp("swap");
        let v1 = payload(&[("token", "t1", 0o600), ("conf/app.yaml", "a: 1", 0o644)]);
        assert!(write(&d, &v1).unwrap());
        assert_eq!(std::fs::read_to_string(d.join("token")).unwrap(), "t1");
        assert_eq!(
            std::fs::read_to_string(d.join("conf/app.yaml")).unwrap(),
            "a: 1"
        );
        assert!(
            std::fs::symlink_metadata(d.join("token"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let mode = std::fs::metadata(d.join("token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let first = std::fs::read_link(d.join(DATA)).unwrap();
        assert!(!write(&d, &v1).unwrap(), "same payload, no write");
        assert_eq!(std::fs::read_link(d.join(DATA)).unwrap(), first);

        // A new token and a key gone: one new version, the old removed.
        let v2 = payload(&[("token", "t2", 0o600)]);
        assert!(write(&d, &v2).unwrap());
        assert_eq!(std::fs::read_to_string(d.join("token")).unwrap(), "t2");
        assert!(std::fs::symlink_metadata(d.join("conf")).is_err());
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 3, "..data, one version and token: {names:?}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_file_written_in_place_before_is_replaced_by_a_link() {
        let d = tmp("legacy");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("key"), "old").unwrap();
        assert!(write(&d, &payload(&[("key", "new", 0o644)])).unwrap());
        assert_eq!(std::fs::read_to_string(d.join("key")).unwrap(), "new");
        assert!(
            std::fs::symlink_metadata(d.join("key"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
