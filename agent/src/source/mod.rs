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

impl SourceMsg {
    /// Appends `more` to `out`, merging changes into the changes and
    /// triggers into the triggers sent since the last `Synced`. Nothing
    /// crosses a `Synced`: the controller syncs what came before it. Within
    /// that, triggers are only looked up when a Service syncs, so their
    /// place among the changes does not matter.
    pub fn coalesce(out: &mut Vec<Self>, more: Vec<Self>) {
        for msg in more {
            let since = out
                .iter()
                .rposition(|m| matches!(m, Self::Synced { .. }))
                .map_or(0, |i| i + 1);
            let into = out[since..].iter_mut().find(|m| {
                matches!(
                    (m, &msg),
                    (Self::Changes(_), Self::Changes(_)) | (Self::Triggers(_), Self::Triggers(_))
                )
            });
            match (into, msg) {
                (Some(Self::Changes(a)), Self::Changes(b)) => a.extend(b),
                (Some(Self::Triggers(a)), Self::Triggers(b)) => a.extend(b),
                (_, msg) => out.push(msg),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::model::{ServiceId, SliceId};

    fn changes(names: &[&str]) -> SourceMsg {
        SourceMsg::Changes(
            names
                .iter()
                .map(|n| Change::DeleteSlice(SliceId::new("ns", *n)))
                .collect(),
        )
    }

    fn triggers(names: &[&str]) -> SourceMsg {
        SourceMsg::Triggers(
            names
                .iter()
                .map(|n| (ServiceId::new("ns", *n), SystemTime::UNIX_EPOCH))
                .collect(),
        )
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
    fn coalesce_merges_by_kind_but_never_across_synced() {
        let mut out = Vec::new();
        SourceMsg::coalesce(&mut out, vec![triggers(&["a"]), changes(&["a"])]);
        SourceMsg::coalesce(&mut out, vec![triggers(&["b"]), changes(&["b"])]);
        SourceMsg::coalesce(&mut out, vec![changes(&["c"])]);
        assert_eq!(shape(&out), [('t', 2), ('c', 3)]);
        SourceMsg::coalesce(
            &mut out,
            vec![changes(&["d"]), SourceMsg::Synced { complete: true }],
        );
        SourceMsg::coalesce(&mut out, vec![changes(&["e"]), triggers(&["e"])]);
        assert_eq!(
            shape(&out),
            [('t', 2), ('c', 4), ('s', 0), ('c', 1), ('t', 1)]
        );
    }
}
