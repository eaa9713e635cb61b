//! A pod stopped by node-pressure eviction, as the kubelet's eviction
//! manager leaves it: its containers killed within the grace period it was
//! given, a Warning Event `Evicted`, phase Failed with reason `Evicted` and
//! the manager's message, the `DisruptionTarget` condition (reason
//! `TerminationByKubelet`), and its local volumes torn down so that the
//! space it held comes back. The pod object stays: its controller replaces
//! it, and the worker keeps reporting the final status.
use k8s_openapi::{
    api::core::v1::{PodCondition, PodStatus},
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};

use super::{Eviction, pod_task::PodTask};
use crate::cri::Runtime;

/// The phase, reason, message and condition an evicted pod shows.
pub(super) fn evicted_status(status: &mut PodStatus, message: &str, now: &Timestamp) {
    status.phase = Some("Failed".into());
    status.reason = Some("Evicted".into());
    status.message = Some(message.to_owned());
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    if !conditions.iter().any(|c| c.type_ == "DisruptionTarget") {
        conditions.push(PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("TerminationByKubelet".into()),
            message: Some(message.to_owned()),
            last_transition_time: Some(Time(*now)),
            ..Default::default()
        });
    }
}

impl<R: Runtime + 'static> PodTask<R> {
    /// Stops the pod for good; a second eviction changes nothing.
    pub(super) async fn evict(&mut self, e: Eviction) {
        if self.evicted.is_some() || self.pod.metadata.deletion_timestamp.is_some() {
            return;
        }
        tracing::warn!(pod = %self.full_name(), message = %e.message, "evicting pod");
        self.shared.sink.warning(&self.pod, "Evicted", &e.message);
        self.evicted = Some(e.message);
        self.teardown(e.grace).await;
        if let Err(err) = super::pod_dir::remove(&self.shared.config, &self.uid) {
            tracing::warn!(pod = %self.full_name(), error = %err, "evicted pod's volumes left in place");
        }
    }
}
