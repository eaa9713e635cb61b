//! Hash maps for the hot paths: the store, the reconciler, the controller
//! and the API source, keyed by Services, slices, frontends and addresses.
//!
//! SipHash, std's default, was 6% of the cold sync at 100k Services.
//! foldhash is several times faster and still seeded at random per process,
//! so names a tenant picks to collide cannot be computed in advance.
pub type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
pub type HashSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
/// Hashed, and iterated in the order of insertion: for sets whose order
/// shows (the changes a manifest scan sends come in the order it read them).
pub type IndexMap<K, V> = indexmap::IndexMap<K, V, foldhash::fast::RandomState>;
pub type IndexSet<K> = indexmap::IndexSet<K, foldhash::fast::RandomState>;
