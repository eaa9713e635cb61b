//! One shared copy of what many endpoints say alike.
//!
//! Every endpoint of a real EndpointSlice names its node, and a cluster has
//! hundreds of nodes but may have millions of endpoints: a copy per endpoint
//! was 32 bytes of heap each (glibc's smallest chunk), 32 MiB at 1 M; every
//! Service and slice names its ports, mostly `http` or `dns`. The
//! same holds one level up: an endpoint's node and hints
//! ([`EndpointMeta`]) repeat across every endpoint on that node, so each
//! endpoint holds one thin pointer to a shared copy.
//!
//! Names come from tenants' objects, so a table must not keep what nothing
//! uses: when it has doubled since the last sweep, values only it still
//! holds are dropped. Each sweep is paid for by as many inserts, so an
//! insert stays O(1) amortized and the table stays within twice the values
//! in use.
use std::{
    borrow::Borrow,
    hash::Hash,
    sync::{Arc, LazyLock, Mutex, PoisonError},
};

use crate::{hash::HashSet, model::EndpointMeta};

/// Below this a table is never swept: a handful of values cost nothing.
const MIN_SWEEP: usize = 1024;

struct Table<T: ?Sized> {
    values: HashSet<Arc<T>>,
    /// Size after the last sweep.
    kept: usize,
}

struct Interner<T: ?Sized>(LazyLock<Mutex<Table<T>>>);

impl<T: ?Sized + Hash + Eq> Interner<T> {
    const fn new() -> Self {
        Self(LazyLock::new(|| {
            Mutex::new(Table {
                values: HashSet::default(),
                kept: 0,
            })
        }))
    }

    /// The shared copy of `key`; `make` builds it the first time.
    fn get<Q>(&self, key: &Q, make: impl FnOnce() -> Arc<T>) -> Arc<T>
    where
        Arc<T>: Borrow<Q>,
        Q: ?Sized + Hash + Eq,
    {
        let mut table = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(v) = table.values.get(key) {
            return v.clone();
        }
        if table.values.len() >= MIN_SWEEP.max(2 * table.kept) {
            table.values.retain(|v| Arc::strong_count(v) > 1);
            table.kept = table.values.len();
        }
        let v = make();
        table.values.insert(v.clone());
        v
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap().values.len()
    }
}

/// Node names and port names: short texts many objects repeat.
static NAMES: Interner<str> = Interner::new();
static METAS: Interner<EndpointMeta> = Interner::new();

/// The shared copy of `name`.
pub fn name(name: &str) -> Arc<str> {
    NAMES.get(name, || Arc::from(name))
}

/// The shared copy of `meta`.
pub fn endpoint_meta(meta: EndpointMeta) -> Arc<EndpointMeta> {
    METAS.get(&meta, || Arc::new(meta.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_share_one_copy() {
        let a = name("intern-test-node-a");
        let b = name(&String::from("intern-test-node-a"));
        assert!(Arc::ptr_eq(&a, &b));
        assert_ne!(&*name("intern-test-node-b"), &*a);
        let meta = |node: &str| EndpointMeta {
            node_name: Some(name(node)),
            ..EndpointMeta::default()
        };
        let m = endpoint_meta(meta("intern-test-node-a"));
        assert!(Arc::ptr_eq(&m, &endpoint_meta(meta("intern-test-node-a"))));
        assert!(!Arc::ptr_eq(&m, &endpoint_meta(meta("intern-test-node-b"))));
    }

    #[test]
    fn values_nothing_holds_are_dropped_as_the_table_grows() {
        // A tenant churning through distinct names: none is kept, so the
        // table never holds more than a sweep's worth.
        for i in 0..50 * MIN_SWEEP {
            drop(name(&format!("intern-test-churn-{i}")));
        }
        let held = name("intern-test-held");
        for i in 0..4 * MIN_SWEEP {
            drop(name(&format!("intern-test-more-{i}")));
        }
        let len = NAMES.len();
        assert!(len <= 2 * MIN_SWEEP + 64, "{len} names kept");
        // A name still in use survives every sweep and stays shared.
        assert!(Arc::ptr_eq(&held, &name("intern-test-held")));
    }
}
