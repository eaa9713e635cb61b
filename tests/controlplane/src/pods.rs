//! Pod states the controllers share, as upstream's `podutil` reads them.
use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::Time};

/// Finished for good: its resources are free.
pub fn is_terminal(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// Upstream's `IsPodActive`: neither finished nor being deleted.
pub fn is_active(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && !is_terminal(pod)
}

/// Since when the pod is Ready (`Some(None)`: ready, time unknown).
pub fn ready_since(pod: &Pod) -> Option<Option<Time>> {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .map(|c| c.last_transition_time.clone())
}

pub fn is_ready(pod: &Pod) -> bool {
    ready_since(pod).is_some()
}
