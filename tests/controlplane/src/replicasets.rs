//! The ReplicaSet controller's decision, as upstream's
//! (`pkg/controller/replicaset`): the pods it owns, orphans its selector
//! adopts, how many to create or which to delete, and its status.
use k8s_openapi::{
    api::{apps::v1::ReplicaSet, core::v1::Pod},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};

use crate::{
    pods::{is_active, is_ready, ready_since},
    selector::Selector,
};

pub mod run;

/// What one pass does for one ReplicaSet.
#[derive(Debug, Default, PartialEq)]
pub struct Decision {
    /// Orphans the selector matches, to take over (name).
    pub adopt: Vec<String>,
    /// Pods to create from the template.
    pub create: usize,
    /// Pods to delete (name), least valuable first.
    pub delete: Vec<String>,
    pub status: Status,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Status {
    pub replicas: i32,
    pub fully_labeled: i32,
    pub ready: i32,
    pub available: i32,
    pub observed_generation: i64,
}

pub fn controller_of(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// Ready for `min_ready` seconds by `now`.
pub fn is_available(pod: &Pod, min_ready: i64, now: k8s_openapi::jiff::Timestamp) -> bool {
    match ready_since(pod) {
        None => false,
        Some(_) if min_ready <= 0 => true,
        Some(None) => false,
        Some(Some(t)) => now.as_second() - t.0.as_second() >= min_ready,
    }
}

/// Upstream's deletion rank (`ActivePodsWithRanks`), least valuable first:
/// unscheduled, then pending, then not ready, then ready the shortest,
/// then restarted the most, then newest.
fn rank(pod: &Pod) -> impl Ord {
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let scheduled = spec
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let phase = match status.and_then(|s| s.phase.as_deref()) {
        Some("Pending") | None => 0,
        Some("Unknown") => 1,
        _ => 2,
    };
    let restarts: i32 = status
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|c| c.restart_count)
        .sum();
    (
        scheduled,
        phase,
        is_ready(pod),
        // Ready longer is worth more: an older timestamp sorts later.
        std::cmp::Reverse(ready_since(pod).flatten()),
        std::cmp::Reverse(restarts),
        std::cmp::Reverse(pod.metadata.creation_timestamp.clone()),
    )
}

pub fn decide(rs: &ReplicaSet, pods: &[&Pod], now: k8s_openapi::jiff::Timestamp) -> Decision {
    let uid = rs.metadata.uid.as_deref().unwrap_or_default();
    let spec = rs.spec.as_ref();
    let selector = spec.map(|s| Selector::new(&s.selector)).unwrap_or_default();
    let mut adopt = Vec::new();
    let mut owned: Vec<&Pod> = Vec::new();
    for &pod in pods {
        match controller_of(&pod.metadata) {
            Some(o) if o.uid == uid => owned.push(pod),
            Some(_) => {}
            None if selector.matches(pod.metadata.labels.as_ref()) && is_active(pod) => {
                adopt.push(pod.metadata.name.clone().unwrap_or_default());
                owned.push(pod);
            }
            None => {}
        }
    }
    let mut active: Vec<&Pod> = owned.iter().copied().filter(|p| is_active(p)).collect();
    let want = spec.and_then(|s| s.replicas).unwrap_or(1).max(0) as usize;
    let (mut create, mut delete) = (0, Vec::new());
    if rs.metadata.deletion_timestamp.is_none() {
        if active.len() < want {
            create = want - active.len();
        } else if active.len() > want {
            active.sort_by_key(|p| rank(p));
            delete = active[..active.len() - want]
                .iter()
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect();
        }
    }
    let template_labels = spec
        .and_then(|s| s.template.as_ref())
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let min_ready = spec.and_then(|s| s.min_ready_seconds).unwrap_or(0).into();
    let count = |f: &dyn Fn(&Pod) -> bool| active.iter().filter(|p| f(p)).count() as i32;
    let status = Status {
        replicas: active.len() as i32,
        fully_labeled: count(&|p| {
            let labels = p.metadata.labels.clone().unwrap_or_default();
            template_labels
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v))
        }),
        ready: count(&is_ready),
        available: count(&|p| is_available(p, min_ready, now)),
        observed_generation: rs.metadata.generation.unwrap_or(0),
    };
    Decision {
        adopt,
        create,
        delete,
        status,
    }
}

/// A new pod from the template, owned by `rs`.
pub fn pod_for(rs: &ReplicaSet) -> Pod {
    let name = rs.metadata.name.clone().unwrap_or_default();
    let template = rs
        .spec
        .as_ref()
        .and_then(|s| s.template.clone())
        .unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}-")),
            namespace: rs.metadata.namespace.clone(),
            labels: meta.labels,
            annotations: meta.annotations,
            owner_references: Some(vec![owner(rs)]),
            ..ObjectMeta::default()
        },
        spec: template.spec,
        status: None,
    }
}

pub fn owner(rs: &ReplicaSet) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: rs.metadata.name.clone().unwrap_or_default(),
        uid: rs.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

#[cfg(test)]
mod tests;
