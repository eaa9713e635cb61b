//! How pods flow through the kubelet: sources (static files, the API server)
//! send [`PodEvent`]s to the pod worker; the worker publishes statuses through
//! a [`StatusSink`] (the API server in API mode) and answers the HTTP servers
//! through [`PodsView`].
//!
//! ```text
//!  static_pods ──┐                         ┌──▶ StatusSink (API: status patch, final delete)
//!                ├─PodEvent─▶ worker ──────┤
//!  API pod watch ┘            (CRI, PLEG)  └──▶ PodsView (/pods, /containerLogs)
//! ```
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Pod, PodStatus};

/// Where a desired pod comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodSource {
    /// A static pod manifest in `staticPodPath`.
    File(PathBuf),
    /// A pod bound to this node through the API server.
    Api,
}

/// A change to the set of pods this node should run.
#[derive(Clone, Debug)]
pub enum PodEvent {
    /// Run this pod. A pod whose UID is known but whose spec changed is killed
    /// and recreated (static pods change UID when their file changes). A pod
    /// with `metadata.deletionTimestamp` set is terminated gracefully and then
    /// reported through [`StatusSink::terminated`].
    Upsert { pod: Box<Pod>, source: PodSource },
    /// Stop the pod and remove it (its file is gone, or the API object was
    /// deleted). `grace` is the deleted object's `deletionGracePeriodSeconds`
    /// when it had one (0 for a force delete); otherwise the pod's own
    /// grace period applies.
    Remove {
        uid: String,
        grace: Option<std::time::Duration>,
    },
}

/// Receives what the worker learns about its pods. `source` is where the
/// pod came from, as its [`PodEvent::Upsert`] said: a static pod is one from
/// [`PodSource::File`], whatever its annotations claim.
pub trait StatusSink: Send + Sync + 'static {
    /// The pod's status changed (or is reported for the first time).
    fn publish(&self, pod: &Pod, source: &PodSource, status: &PodStatus);
    /// Every container is stopped and the sandbox removed: an API pod with a
    /// deletionTimestamp may now be deleted for good (UID precondition).
    fn terminated(&self, pod: &Pod, source: &PodSource);
    /// A Warning Event on the pod (`reason`, `message`), as the kubelet's
    /// recorder sends for a container it cannot create.
    fn warning(&self, _pod: &Pod, _reason: &str, _message: &str) {}
}

/// A container as the log and streaming endpoints reach it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerRef {
    /// The runtime's id of its newest instance.
    pub id: String,
    pub running: bool,
    /// The newest instance's CRI log file.
    pub log: Option<PathBuf>,
    /// The instance before it, if it exited: `previous=true`.
    pub previous_log: Option<PathBuf>,
}

/// What the kubelet's HTTP API shows.
pub trait PodsView: Send + Sync + 'static {
    /// Every pod the worker runs, each with its current status.
    fn pods(&self) -> Vec<Pod>;
    /// A container's newest instance, once it has one.
    fn container(&self, namespace: &str, pod: &str, container: &str) -> Option<ContainerRef>;
    /// The pod's Ready sandbox: what port forwarding enters.
    fn sandbox(&self, namespace: &str, pod: &str) -> Option<String>;
}
