//! The disruption controller's decision, as upstream's
//! (`pkg/controller/disruption`): a PodDisruptionBudget's status, which
//! the API server's Eviction reads and spends.
use std::collections::BTreeMap;

use k8s_openapi::{
    api::{core::v1::Pod, policy::v1::PodDisruptionBudget},
    apimachinery::pkg::{apis::meta::v1::Time, util::intstr::IntOrString},
    jiff::{SignedDuration, Timestamp},
};

use crate::{
    pods::{is_ready, is_terminal},
    selector::Selector,
};

pub mod run;

/// An eviction not followed by the pod's deletion within this long is
/// assumed not to happen (upstream's DeletionTimeout).
const DELETION_TIMEOUT: SignedDuration = SignedDuration::from_secs(120);

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Status {
    pub expected: i32,
    pub desired_healthy: i32,
    pub current_healthy: i32,
    pub disruptions_allowed: i32,
    /// Evicted pods not yet gone, by name, with the eviction's time.
    pub disrupted: BTreeMap<String, Time>,
    pub observed_generation: i64,
}

/// Whether `pdb` covers `pod`: policy/v1 reads an empty selector as every
/// pod of the namespace (the Eviction API reads it as none).
pub fn covers(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    let sel = pdb.spec.as_ref().and_then(|s| s.selector.as_ref());
    sel.is_some_and(|s| Selector::new(s).matches(pod.metadata.labels.as_ref()))
}

/// An int, or a percentage of `of` rounded up (upstream rounds both
/// minAvailable and maxUnavailable up).
fn scaled(v: &IntOrString, of: i32) -> i32 {
    match v {
        IntOrString::Int(n) => *n,
        IntOrString::String(s) => s
            .strip_suffix('%')
            .and_then(|p| p.parse::<i64>().ok())
            .map_or(0, |p| ((p * i64::from(of) + 99) / 100) as i32),
    }
}

/// `pods` are the namespace's; `scale` is the total desired replicas of the
/// controllers of the covered pods (`None` when a pod has none, when only
/// an integer `minAvailable` can be honoured and the pods are counted).
pub fn decide(
    pdb: &PodDisruptionBudget,
    pods: &[&Pod],
    scale: Option<i32>,
    now: Timestamp,
) -> Status {
    let spec = pdb.spec.clone().unwrap_or_default();
    let covered: Vec<&Pod> = pods
        .iter()
        .copied()
        .filter(|p| covers(pdb, p) && !is_terminal(p))
        .collect();
    let count = covered.len() as i32;
    let (expected, desired) = match (&spec.min_available, &spec.max_unavailable) {
        (Some(IntOrString::Int(n)), _) => (count, *n),
        (Some(pct), _) => {
            let e = scale.unwrap_or(count);
            (e, scaled(pct, e))
        }
        (None, Some(max)) => {
            let e = scale.unwrap_or(count);
            (e, (e - scaled(max, e)).max(0))
        }
        // policy/v1 defaults an empty spec to minAvailable 1.
        (None, None) => (count, 1),
    };
    let old = pdb
        .status
        .as_ref()
        .and_then(|s| s.disrupted_pods.clone())
        .unwrap_or_default();
    // An eviction counts until its pod is going, or it timed out.
    let disrupted: BTreeMap<String, Time> = old
        .into_iter()
        .filter(|(name, at)| {
            let pod = covered
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(name));
            pod.is_some_and(|p| p.metadata.deletion_timestamp.is_none())
                && at.0 + DELETION_TIMEOUT > now
        })
        .collect();
    let healthy = covered
        .iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && is_ready(p)
                && !disrupted.contains_key(p.metadata.name.as_deref().unwrap_or_default())
        })
        .count() as i32;
    Status {
        expected,
        desired_healthy: desired,
        current_healthy: healthy,
        disruptions_allowed: (healthy - desired).max(0),
        disrupted,
        observed_generation: pdb.metadata.generation.unwrap_or(0),
    }
}

#[cfg(test)]
mod tests;
