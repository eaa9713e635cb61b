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
