//! What the API source has told the controller about one kind. A watcher that
//! restarts (after an outage, or a `410 Gone`) relists; objects the controller
//! has but the relist lacks were deleted meanwhile. The relist's changes go out
//! as one batch at its end, so the datapath moves from the old view to the new
//! one without ever being flushed.
use std::hash::Hash;

use crate::hash::HashSet;
use crate::store::Change;

/// What one object means for the controller.
#[derive(Debug)]
pub enum Outcome {
    Upsert(Change),
    /// Valid but not for this datapath (e.g. an FQDN slice): take back any
    /// earlier version.
    Withdraw,
    /// Invalid: the last good version stays in force.
    Keep,
}

#[derive(Debug)]
pub struct Tracker<K> {
    present: HashSet<K>,
    relist: Option<Relist<K>>,
    synced: bool,
    delete: fn(&K) -> Change,
}

#[derive(Debug)]
struct Relist<K> {
    seen: HashSet<K>,
    upserted: HashSet<K>,
    withdrawn: HashSet<K>,
    changes: Vec<Change>,
}

impl<K> Default for Relist<K> {
    fn default() -> Self {
        Self {
            seen: HashSet::default(),
            upserted: HashSet::default(),
            withdrawn: HashSet::default(),
            changes: Vec::new(),
        }
    }
}

impl<K: Clone + Eq + Hash> Tracker<K> {
    pub fn new(delete: fn(&K) -> Change) -> Self {
        Self {
            present: HashSet::default(),
            relist: None,
            synced: false,
            delete,
        }
    }

    /// Has finished at least one full list.
    pub const fn synced(&self) -> bool {
        self.synced
    }

    pub fn init(&mut self) {
        // The first list goes out as it arrives, so the controller indexes
        // it while the rest is decoded: it programs nothing until both kinds
        // have listed (as kube-proxy waits for both informers). A relist
        // replaces a view the datapath serves, so it goes out as one batch;
        // so does a first list that restarted, to drop what it lost.
        self.relist = (self.synced || !self.present.is_empty()).then(Relist::default);
    }

    /// An object added or changed; returns what to send now (nothing while a
    /// relist is being collected).
    pub fn apply(&mut self, key: K, outcome: Outcome) -> Vec<Change> {
        if let Some(r) = &mut self.relist {
            r.seen.insert(key.clone());
            match outcome {
                Outcome::Upsert(c) => {
                    r.withdrawn.remove(&key);
                    r.upserted.insert(key);
                    r.changes.push(c);
                }
                Outcome::Withdraw => {
                    r.upserted.remove(&key);
                    r.changes.push((self.delete)(&key));
                    r.withdrawn.insert(key);
                }
                Outcome::Keep => {}
            }
            return Vec::new();
        }
        match outcome {
            Outcome::Upsert(c) => {
                self.present.insert(key);
                vec![c]
            }
            Outcome::Withdraw if self.present.remove(&key) => vec![(self.delete)(&key)],
            Outcome::Withdraw | Outcome::Keep => Vec::new(),
        }
    }

    /// The copy of `key` held here, to share rather than keep another.
    pub fn shared(&self, key: K) -> K {
        self.present.get(&key).cloned().unwrap_or(key)
    }

    pub fn delete(&mut self, key: &K) -> Vec<Change> {
        if self.present.remove(key) {
            vec![(self.delete)(key)]
        } else {
            Vec::new()
        }
    }

    /// The relist is complete: its changes, plus deletions of everything it
    /// no longer has.
    pub fn init_done(&mut self) -> Vec<Change> {
        self.synced = true;
        // A streamed first list has sent everything already.
        let Some(r) = self.relist.take() else {
            return Vec::new();
        };
        let mut changes = r.changes;
        let gone: Vec<K> = self
            .present
            .iter()
            .filter(|k| !r.seen.contains(*k))
            .cloned()
            .collect();
        for k in &gone {
            self.present.remove(k);
            changes.push((self.delete)(k));
        }
        for k in &r.withdrawn {
            self.present.remove(k);
        }
        self.present.extend(r.upserted);
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ServiceId;

    fn del(id: &ServiceId) -> Change {
        Change::DeleteService(id.clone())
    }

    fn id(n: &str) -> ServiceId {
        ServiceId::new("default", n)
    }

    fn up(n: &str) -> Outcome {
        // Any Change works as a payload; the tracker never looks inside.
        Outcome::Upsert(Change::DeleteSlice(crate::model::SliceId::new(
            "default", n,
        )))
    }

    #[test]
    fn relist_deletes_what_vanished_and_keeps_invalid_objects_last_good_version() {
        let mut t = Tracker::new(del);
        t.init();
        assert_eq!(t.apply(id("a"), up("a")).len(), 1, "the first list streams");
        assert_eq!(t.apply(id("b"), up("b")).len(), 1);
        assert_eq!(t.apply(id("c"), up("c")).len(), 1);
        assert!(!t.synced());
        assert_eq!(t.init_done(), []);
        assert!(t.synced());

        // Outage; meanwhile a is deleted and b turns invalid.
        t.init();
        t.apply(id("b"), Outcome::Keep);
        t.apply(id("c"), up("c"));
        let out = t.init_done();
        assert_eq!(out.len(), 2);
        assert!(out.contains(&Change::DeleteService(id("a"))));

        // b's last good version is still in force, so deleting b deletes it.
        assert_eq!(t.delete(&id("b")), vec![Change::DeleteService(id("b"))]);
        assert!(t.delete(&id("a")).is_empty(), "a was already deleted");
    }

    #[test]
    fn a_first_list_that_restarts_is_collected_and_drops_what_it_lost() {
        let mut t = Tracker::new(del);
        t.init();
        t.apply(id("a"), up("a"));
        t.apply(id("b"), up("b"));
        // The list fails half way (its continue token expired); meanwhile a
        // was deleted.
        t.init();
        assert!(t.apply(id("b"), up("b")).is_empty());
        assert!(t.apply(id("c"), up("c")).is_empty());
        assert!(!t.synced());
        let out = t.init_done();
        assert_eq!(out.len(), 3);
        assert!(out.contains(&Change::DeleteService(id("a"))));
        assert!(t.synced());
    }

    #[test]
    fn names_are_shared_with_the_tracked_copy() {
        let mut t = Tracker::new(del);
        t.init();
        let a = id("a");
        t.apply(a.clone(), up("a"));
        let again = t.shared(id("a"));
        assert!(again.is_shared_with(&a));
        let b = id("b");
        assert!(
            t.shared(b.clone()).is_shared_with(&b),
            "unknown: kept as given"
        );
    }

    #[test]
    fn withdraw_takes_back_only_what_was_sent() {
        let mut t = Tracker::new(del);
        t.init();
        t.init_done();
        assert!(t.apply(id("x"), Outcome::Withdraw).is_empty());
        assert_eq!(t.apply(id("x"), up("x")).len(), 1);
        assert_eq!(
            t.apply(id("x"), Outcome::Withdraw),
            vec![Change::DeleteService(id("x"))]
        );
        assert!(t.delete(&id("x")).is_empty());
    }
}
