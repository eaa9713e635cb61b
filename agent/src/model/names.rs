//! Object ids: a namespace and name in one shared allocation.
use std::fmt;

use triomphe::ThinArc;

/// A namespaced object's namespace and name, in one allocation shared by
/// every clone: the store, its indexes, the reconciler, the controller and
/// the sources each key something by Service or slice, and at 100k Services
/// two owned `String`s per copy cost more than the Services themselves.
///
/// The handle is one pointer (a thin `Arc` with the split in its header):
/// ids are hash-map keys and fields of every index, so each of those holds
/// 8 bytes per object where a fat `Arc<str>` and its split took 24.
#[derive(Clone)]
pub struct QualifiedName(
    /// Bytes: `namespace` then `name`, without separator (a `/` would sort
    /// `a-b/x` before `a/x`, and the order must be that of (namespace,
    /// name)); always UTF-8.
    ThinArc<Header, u8>,
);

#[derive(Clone, Copy)]
struct Header {
    /// Where the name starts.
    split: u32,
    /// The text's hash, taken once: an id is hashed each time it is looked
    /// up in one of the store's, the reconciler's or a source's maps, and
    /// hashing the text each time was 3–5% of a cold sync's controller.
    /// It sits in what was the header's padding, so it costs no memory.
    hash: u32,
}

/// Seeded at random per process, as the maps' own hashers are: a tenant
/// cannot pick names whose hashes collide.
static SEED: std::sync::LazyLock<foldhash::quality::RandomState> =
    std::sync::LazyLock::new(foldhash::quality::RandomState::default);

impl QualifiedName {
    fn new(namespace: &str, name: &str) -> Self {
        // Kubernetes names and namespaces are at most 253 bytes.
        use std::hash::{BuildHasher as _, Hasher as _};
        let split = u32::try_from(namespace.len()).expect("namespace under 4 GiB");
        let mut h = SEED.build_hasher();
        h.write_u32(split);
        h.write(namespace.as_bytes());
        h.write(name.as_bytes());
        // The high half: foldhash mixes its output, so either half will do.
        let hash = (h.finish() >> 32) as u32;
        let bytes = namespace.bytes().chain(name.bytes());
        Self(ThinArc::from_header_and_iter(
            Header { split, hash },
            NamedBytes(bytes, namespace.len() + name.len()),
        ))
    }

    fn text(&self) -> &str {
        // SAFETY: the bytes were copied from two `&str`s in `new` and are
        // never changed, so they are UTF-8.
        unsafe { std::str::from_utf8_unchecked(&self.0.slice) }
    }

    fn split(&self) -> usize {
        self.0.header.header.split as usize
    }

    pub fn namespace(&self) -> &str {
        &self.text()[..self.split()]
    }

    pub fn name(&self) -> &str {
        &self.text()[self.split()..]
    }

    fn parts(&self) -> (&str, &str) {
        (self.namespace(), self.name())
    }

    /// The two are clones of one name, not only equal.
    #[cfg(test)]
    pub fn is_shared_with(&self, other: &Self) -> bool {
        self.0.as_ptr() == other.0.as_ptr()
    }
}

// Every index holds ids by value: keep them one pointer.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<QualifiedName>() == 8);
// The hash fills the padding before the header's length.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(
    std::mem::size_of::<triomphe::HeaderWithLength<Header>>()
        == std::mem::size_of::<triomphe::HeaderWithLength<u32>>()
);

/// The bytes of namespace and name with their total length, which
/// `ThinArc` needs up front (`Chain` does not know it).
struct NamedBytes<I>(I, usize);

impl<I: Iterator<Item = u8>> Iterator for NamedBytes<I> {
    type Item = u8;

    fn next(&mut self) -> Option<u8> {
        let b = self.0.next()?;
        self.1 -= 1;
        Some(b)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.1, Some(self.1))
    }
}

impl<I: Iterator<Item = u8>> ExactSizeIterator for NamedBytes<I> {}

impl Default for QualifiedName {
    fn default() -> Self {
        Self::new("", "")
    }
}

impl PartialEq for QualifiedName {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.0.header.header, other.0.header.header);
        self.0.as_ptr() == other.0.as_ptr()
            || (a.hash == b.hash && a.split == b.split && self.text() == other.text())
    }
}

impl Eq for QualifiedName {}

impl std::hash::Hash for QualifiedName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // Equal ids have equal texts, and so equal hashes.
        state.write_u32(self.0.header.header.hash);
    }
}

impl PartialOrd for QualifiedName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for QualifiedName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Ids are shared clones, so a search in an index by id ends on this.
        if self.0.as_ptr() == other.0.as_ptr() {
            return std::cmp::Ordering::Equal;
        }
        self.parts().cmp(&other.parts())
    }
}

impl fmt::Debug for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}/{:?}", self.namespace(), self.name())
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace(), self.name())
    }
}

/// Namespace and name of a Service.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceId(QualifiedName);

/// Namespace and name of an EndpointSlice.
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SliceId(QualifiedName);

impl ServiceId {
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        Self(QualifiedName::new(namespace.as_ref(), name.as_ref()))
    }
}

impl SliceId {
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        Self(QualifiedName::new(namespace.as_ref(), name.as_ref()))
    }
}

// Both ids read as the name they hold (`namespace()`, `name()`, `{}` as
// `namespace/name`); the two types only keep Services and slices apart.
impl std::ops::Deref for ServiceId {
    type Target = QualifiedName;
    fn deref(&self) -> &QualifiedName {
        &self.0
    }
}

impl std::ops::Deref for SliceId {
    type Target = QualifiedName;
    fn deref(&self) -> &QualifiedName {
        &self.0
    }
}

impl fmt::Debug for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServiceId({:?})", self.0)
    }
}

impl fmt::Debug for SliceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SliceId({:?})", self.0)
    }
}

impl fmt::Display for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for SliceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_order_hash_and_compare_as_namespace_then_name() {
        use std::hash::BuildHasher as _;
        // Without a separator in the shared text, `a-b` + `x` must still
        // sort after `a` + `x`, as the tuple does.
        let (a, ab) = (ServiceId::new("a", "x"), ServiceId::new("a-b", "x"));
        assert!(a < ab);
        assert_eq!(("a", "x").cmp(&("a-b", "x")), a.cmp(&ab));
        // Same text, other split: other ids.
        assert_ne!(ServiceId::new("ab", "c"), ServiceId::new("a", "bc"));
        // Separately built ids are equal and hash alike; clones share.
        let again = ServiceId::new(String::from("a"), "x");
        assert_eq!(a, again);
        let h = std::collections::hash_map::RandomState::new();
        assert_eq!(h.hash_one(&a), h.hash_one(&again));
        assert_eq!((a.namespace(), a.name()), ("a", "x"));
        assert_eq!(SliceId::new("ns", "s-1").to_string(), "ns/s-1");
    }
}
