//! One shared copy of each node name the endpoints carry.
//!
//! Every endpoint of a real EndpointSlice names its node, and a cluster has
//! hundreds of nodes but may have millions of endpoints: a copy per endpoint
//! was 32 bytes of heap each (glibc's smallest chunk), 32 MiB at 1 M.
//!
//! Names come from tenants' objects, so the table must not keep what nothing
//! uses: when it has doubled since the last sweep, names only it still holds
//! are dropped. Each sweep is paid for by as many inserts, so an insert stays
//! O(1) amortized and the table stays within twice the names in use.
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use crate::hash::HashSet;

/// Below this the table is never swept: a handful of names cost nothing.
const MIN_SWEEP: usize = 1024;

struct Table {
    names: HashSet<Arc<str>>,
    /// Size after the last sweep.
    kept: usize,
}

static NODE_NAMES: LazyLock<Mutex<Table>> = LazyLock::new(|| {
    Mutex::new(Table {
        names: HashSet::default(),
        kept: 0,
    })
});

/// The shared copy of `name`.
pub fn node_name(name: &str) -> Arc<str> {
    let mut table = NODE_NAMES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(n) = table.names.get(name) {
        return n.clone();
    }
    if table.names.len() >= MIN_SWEEP.max(2 * table.kept) {
        table.names.retain(|n| Arc::strong_count(n) > 1);
        table.kept = table.names.len();
    }
    let n: Arc<str> = Arc::from(name);
    table.names.insert(n.clone());
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_names_share_one_copy() {
        let a = node_name("intern-test-node-a");
        let b = node_name(&String::from("intern-test-node-a"));
        assert!(Arc::ptr_eq(&a, &b));
        assert_ne!(&*node_name("intern-test-node-b"), &*a);
    }

    #[test]
    fn names_nothing_holds_are_dropped_as_the_table_grows() {
        // A tenant churning through distinct names: none is kept, so the
        // table never holds more than a sweep's worth.
        for i in 0..50 * MIN_SWEEP {
            drop(node_name(&format!("intern-test-churn-{i}")));
        }
        let held = node_name("intern-test-held");
        for i in 0..4 * MIN_SWEEP {
            drop(node_name(&format!("intern-test-more-{i}")));
        }
        let len = NODE_NAMES.lock().unwrap().names.len();
        assert!(len <= 2 * MIN_SWEEP + 64, "{len} names kept");
        // A name still in use survives every sweep and stays shared.
        assert!(Arc::ptr_eq(&held, &node_name("intern-test-held")));
    }
}
