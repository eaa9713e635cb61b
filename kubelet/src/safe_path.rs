//! Paths the kubelet builds from what a pod says (UIDs, names, volume names,
//! `items[].path`) provably stay under the directory they are joined to: every
//! join goes through [`join_name`] or [`join_relative`], which refuse `..`,
//! `/`, NUL and empty strings, so the result only ever gains normal
//! components. A static pod with `uid: ../../..` once made teardown remove `/`.
use std::path::{Component, Path, PathBuf};

/// A string that must not become part of a path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:?} cannot be used in a path: {reason}")]
pub struct PathError {
    /// What the string is: "pod UID", "volume name", "items path".
    pub what: &'static str,
    pub value: String,
    pub reason: &'static str,
}

fn refuse(what: &'static str, value: &str, reason: &'static str) -> PathError {
    PathError {
        what,
        value: value.to_owned(),
        reason,
    }
}

/// Checks that `s` is exactly one normal path component.
pub fn component<'a>(what: &'static str, s: &'a str) -> Result<&'a str, PathError> {
    let reason = if s.is_empty() {
        "is empty"
    } else if s.contains('\0') {
        "contains NUL"
    } else if s.contains('/') {
        "contains '/'"
    } else if s == "." || s == ".." {
        "is '.' or '..'"
    } else {
        return Ok(s);
    };
    Err(refuse(what, s, reason))
}

/// `root/name`, where `name` must be one normal component.
pub fn join_name(root: &Path, what: &'static str, name: &str) -> Result<PathBuf, PathError> {
    Ok(root.join(component(what, name)?))
}

/// `root/rel`, where `rel` is a relative path that only descends (the API's
/// `validateLocalDescendingPath`): not absolute, no `..`, no NUL, not empty.
/// `.` and empty components (`a//b`) are dropped.
pub fn join_relative(root: &Path, what: &'static str, rel: &str) -> Result<PathBuf, PathError> {
    let mut out = root.to_path_buf();
    for c in descending(what, rel)? {
        out.push(c);
    }
    Ok(out)
}

/// The normal components of a descending relative path, or why it is not one.
pub fn descending<'a>(what: &'static str, rel: &'a str) -> Result<Vec<&'a str>, PathError> {
    if rel.contains('\0') {
        return Err(refuse(what, rel, "contains NUL"));
    }
    if rel.starts_with('/') {
        return Err(refuse(what, rel, "is absolute"));
    }
    let mut parts = Vec::new();
    for c in Path::new(rel).components() {
        match c {
            Component::Normal(n) => parts.push(n.to_str().unwrap_or_default()),
            Component::CurDir => {}
            Component::ParentDir => return Err(refuse(what, rel, "contains '..'")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(refuse(what, rel, "is absolute"));
            }
        }
    }
    if parts.is_empty() {
        return Err(refuse(what, rel, "names no file"));
    }
    Ok(parts)
}

/// The longest UID accepted: an API UID is a 36-character UUID, a static
/// pod's a 32-digit hash, and a static pod file may set its own.
pub const MAX_UID_LEN: usize = 128;

/// A pod UID becomes a directory name, a cgroup name and part of the log
/// directory's `<ns>_<name>_<uid>`: ASCII letters, digits and '-' only.
pub fn uid(s: &str) -> Result<&str, PathError> {
    let reason = if s.is_empty() {
        "is empty"
    } else if s.len() > MAX_UID_LEN {
        "is longer than 128 characters"
    } else if !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        "may only hold ASCII letters, digits and '-'"
    } else {
        return Ok(s);
    };
    Err(refuse("pod UID", s, reason))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_single_normal_components() {
        let root = Path::new("/var/lib/kubelet/pods");
        assert_eq!(
            join_name(root, "volume name", "data").unwrap(),
            root.join("data")
        );
        for bad in ["", ".", "..", "a/b", "../x", "/", "a\0b"] {
            let e = join_name(root, "volume name", bad).unwrap_err();
            assert_eq!((e.what, e.value.as_str()), ("volume name", bad), "{e}");
        }
    }

    #[test]
    fn relative_paths_only_descend() {
        let root = Path::new("/p/volumes/cm");
        let ok = |rel: &str| join_relative(root, "items path", rel).unwrap();
        assert_eq!(ok("a/b.txt"), root.join("a/b.txt"));
        assert_eq!(ok("./a//b"), root.join("a/b"));
        for bad in ["", ".", "/etc/passwd", "../x", "a/../../x", "a/..", "a\0"] {
            let e = join_relative(root, "items path", bad).unwrap_err();
            assert!(e.to_string().starts_with("items path"), "{e}");
        }
        // Whatever is accepted stays below the root.
        for rel in ["x", "a/b/c", "././/d"] {
            assert!(ok(rel).starts_with(root) && ok(rel) != root);
        }
    }

    #[test]
    fn uids() {
        assert!(uid("0f4e9c1a-5c5b-4f7e-9a43-0b1f6b4b2a10").is_ok());
        assert!(uid("d41d8cd98f00b204e9800998ecf8427e").is_ok());
        for bad in ["", "../../..", "a/b", "a_b", "a.b", ".", "x\0"] {
            assert!(uid(bad).is_err(), "{bad:?}");
        }
        assert!(uid(&"a".repeat(MAX_UID_LEN)).is_ok());
        assert!(uid(&"a".repeat(MAX_UID_LEN + 1)).is_err());
    }
}
