//! Sources of desired state. Each one turns its own input into [`Change`]s for
//! the store and says when it has delivered a complete first view.
pub mod kube;
pub mod manifests;

use crate::store::Change;

#[derive(Debug)]
pub enum SourceMsg {
    Changes(Vec<Change>),
    /// When the changes that are about to arrive for these Services happened
    /// (the EndpointSlice trigger-time annotation), for the network
    /// programming latency metric.
    Triggers(Vec<(crate::model::ServiceId, std::time::SystemTime)>),
    /// Everything the source knew at start has been sent. When `complete`,
    /// frontends restored from the maps that nobody claimed belong to deleted
    /// Services. When not (some input failed to load, and may be what claims
    /// them), they stay until the source says `complete: true`.
    Synced {
        complete: bool,
    },
}

/// The messages a run of source events makes, built in place: changes
/// merge into the changes and triggers into the triggers sent since the last
/// `Synced`. Nothing crosses a `Synced`: the controller syncs what came
/// before it. Within that, triggers are only looked up when a Service
/// syncs, so their place among the changes does not matter.
///
/// In place: a message list per event, merged into the run's, was three
/// allocations for each of the 200k objects of a cold start.
#[derive(Debug, Default)]
pub struct Batch {
    sealed: Vec<SourceMsg>,
    triggers: Vec<Trigger>,
    changes: Vec<Change>,
}

/// When a Service's coming change happened (see [`SourceMsg::Triggers`]).
pub type Trigger = (crate::model::ServiceId, std::time::SystemTime);

impl Batch {
    pub fn changes(&mut self) -> &mut Vec<Change> {
        &mut self.changes
    }

    /// The changes and the triggers, to fill together.
    pub fn both(&mut self) -> (&mut Vec<Change>, &mut Vec<Trigger>) {
        (&mut self.changes, &mut self.triggers)
    }

    /// Ends the run of changes so far: `Synced` goes after them.
    pub fn synced(&mut self, complete: bool) {
        self.seal();
        self.sealed.push(SourceMsg::Synced { complete });
    }

    fn seal(&mut self) {
        if !self.triggers.is_empty() {
            self.sealed
                .push(SourceMsg::Triggers(std::mem::take(&mut self.triggers)));
        }
        if !self.changes.is_empty() {
            self.sealed
                .push(SourceMsg::Changes(std::mem::take(&mut self.changes)));
        }
    }

    pub fn into_messages(mut self) -> Vec<SourceMsg> {
        self.seal();
        self.sealed
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::model::{ServiceId, SliceId};

    fn changes(b: &mut Batch, names: &[&str]) {
        for n in names {
            b.changes()
                .push(Change::DeleteSlice(SliceId::new("ns", *n)));
        }
    }

    fn triggers(b: &mut Batch, names: &[&str]) {
        for n in names {
            b.both()
                .1
                .push((ServiceId::new("ns", *n), SystemTime::UNIX_EPOCH));
        }
    }

    fn shape(out: &[SourceMsg]) -> Vec<(char, usize)> {
        out.iter()
            .map(|m| match m {
                SourceMsg::Changes(c) => ('c', c.len()),
                SourceMsg::Triggers(t) => ('t', t.len()),
                SourceMsg::Synced { .. } => ('s', 0),
            })
            .collect()
    }

    #[test]
    fn a_batch_merges_by_kind_but_never_across_synced() {
        let mut b = Batch::default();
        changes(&mut b, &["a"]);
        triggers(&mut b, &["a"]);
        triggers(&mut b, &["b"]);
        changes(&mut b, &["b", "c", "d"]);
        b.synced(true);
        changes(&mut b, &["e"]);
        triggers(&mut b, &["e"]);
        assert_eq!(
            shape(&b.into_messages()),
            [('t', 2), ('c', 4), ('s', 0), ('t', 1), ('c', 1)]
        );
        let mut b = Batch::default();
        b.synced(false);
        assert_eq!(shape(&b.into_messages()), [('s', 0)]);
    }
}
