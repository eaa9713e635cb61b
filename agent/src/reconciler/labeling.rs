//! The labels map, written behind the plans: which Service port each rev-NAT
//! id serves, so that `inspect` names frontends when only the maps remain.
//!
//! No program reads a label, so labels need none of the plans' ordering or
//! rollback. They are gathered by id and written in batches: one more write
//! per frontend in every plan would cost a syscall each (the rev-NAT entry
//! is a run of one), 100k of them in a cold sync. The reconciler keeps only
//! a fingerprint of each frontend's written label, not the label: at 100k
//! frontends a copy would be megabytes.
use std::{collections::BTreeMap, hash::BuildHasher as _};

use tracing::warn;
use weir_abi::SvcLabel;

use crate::maps::{LbMaps, MapError};

/// Pending writes beyond this are flushed at once: a cold sync would
/// otherwise hold a label per frontend until its end.
const FLUSH_AT: usize = 4096;

/// Pending writes kept while flushes fail (a labels map pinned smaller than
/// the rev-NAT map); beyond this they are dropped and the frontends keep
/// whatever their labels say until they change.
const KEEP_FAILED: usize = 65_536;

pub struct Labels {
    /// Writes not yet made, by rev-NAT id: `None` deletes. One per id, the
    /// last asked for: an id freed and reused is written once, as reused.
    pending: BTreeMap<u32, Option<SvcLabel>>,
    /// Seeded per process: fingerprints are only compared within one.
    hasher: foldhash::quality::RandomState,
    /// A flush failed and no flush has succeeded since: warn once.
    failing: bool,
}

impl Labels {
    pub fn new() -> Self {
        Self {
            pending: BTreeMap::new(),
            hasher: foldhash::quality::RandomState::default(),
            failing: false,
        }
    }

    /// What the reconciler's `Held::label` records for `label` written under
    /// `rev_nat_id`; never 0, which means no label.
    pub fn fingerprint(&self, rev_nat_id: u32, label: &SvcLabel) -> u64 {
        self.hasher.hash_one((rev_nat_id, label)).max(1)
    }

    /// Writes `label` under `rev_nat_id` unless `written` (a fingerprint)
    /// says it is there; returns the new fingerprint.
    pub fn set(&mut self, rev_nat_id: u32, label: SvcLabel, written: u64) -> u64 {
        let fp = self.fingerprint(rev_nat_id, &label);
        if fp != written {
            self.pending.insert(rev_nat_id, Some(label));
        }
        fp
    }

    pub fn delete(&mut self, rev_nat_id: u32) {
        self.pending.insert(rev_nat_id, None);
    }

    /// Flushes when enough writes wait.
    pub fn flush_if_full(&mut self, maps: &mut impl LbMaps) {
        if self.pending.len() >= FLUSH_AT {
            self.flush(maps);
        }
    }

    /// Writes what waits. A failure is logged once and retried at the next
    /// flush: a label is for people reading `inspect`, and the datapath
    /// works without it.
    pub fn flush(&mut self, maps: &mut impl LbMaps) {
        if self.pending.is_empty() {
            return;
        }
        let writes: Vec<(u32, Option<SvcLabel>)> =
            self.pending.iter().map(|(id, l)| (*id, *l)).collect();
        match maps.write_labels(&writes) {
            Ok(()) => {
                self.pending.clear();
                self.failing = false;
            }
            Err(e) => self.failed(&e),
        }
    }

    fn failed(&mut self, e: &MapError) {
        if !self.failing {
            warn!(
                pending = self.pending.len(),
                "cannot write frontend labels, `inspect` may show frontends without their Service: {}",
                crate::controller::chain(e)
            );
            self.failing = true;
        }
        if self.pending.len() > KEEP_FAILED {
            self.pending.clear();
        }
    }

    #[cfg(test)]
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}
