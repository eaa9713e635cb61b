//! The Deployment controller's decision, as upstream's
//! (`pkg/controller/deployment`): a ReplicaSet per pod template, named by
//! the template's hash and labelled `pod-template-hash`; a rolling update
//! bounded by `maxSurge`/`maxUnavailable` (or Recreate); old ReplicaSets
//! beyond `revisionHistoryLimit` removed; the Deployment's status.
use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, ReplicaSet, ReplicaSetSpec},
        core::v1::PodTemplateSpec,
    },
    apimachinery::pkg::{
        apis::meta::v1::{ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
};

use crate::replicasets::controller_of;

pub mod run;

pub const HASH_LABEL: &str = "pod-template-hash";
pub const REVISION: &str = "deployment.kubernetes.io/revision";

/// What one pass does for one Deployment.
#[derive(Debug, Default, PartialEq)]
pub struct Decision {
    pub create: Option<ReplicaSet>,
    /// (ReplicaSet name, new `spec.replicas`).
    pub scale: Vec<(String, i32)>,
    pub delete: Vec<String>,
    pub status: Status,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Status {
    pub replicas: i32,
    pub updated: i32,
    pub ready: i32,
    pub available: i32,
    pub unavailable: i32,
    pub observed_generation: i64,
    /// The Available condition: at least `replicas - maxUnavailable`.
    pub minimum_available: bool,
    /// The Progressing condition's reason.
    pub progress: &'static str,
}

/// apimachinery's `rand.SafeEncodeString` of FNV-1a over the template's
/// JSON: the shape of upstream's hash (its input is Go's deep-hash dump,
/// so the values differ).
pub fn template_hash(template: &PodTemplateSpec) -> String {
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let json = serde_json::to_vec(template).unwrap_or_default();
    let mut h: u32 = 0x811c_9dc5;
    for b in json {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h.to_string()
        .bytes()
        .map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char)
        .collect()
}

/// An int, or a percentage of `total` rounded up (surge) or down.
fn resolve(v: Option<&IntOrString>, total: i32, default_pct: i32, round_up: bool) -> i32 {
    let pct = |p: i32| {
        let x = i64::from(p) * i64::from(total);
        (if round_up { (x + 99) / 100 } else { x / 100 }) as i32
    };
    match v {
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(s)) => s
            .strip_suffix('%')
            .and_then(|p| p.parse().ok())
            .map_or(pct(default_pct), pct),
        None => pct(default_pct),
    }
}

/// A template without the hash label, to compare with the Deployment's.
fn unhashed(template: &PodTemplateSpec) -> PodTemplateSpec {
    let mut t = template.clone();
    if let Some(labels) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        labels.remove(HASH_LABEL);
    }
    t
}

fn spec_replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
}

fn available(rs: &ReplicaSet) -> i32 {
    rs.status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
}

fn revision(rs: &ReplicaSet) -> i64 {
    rs.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REVISION))
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

pub fn decide(d: &Deployment, all: &[&ReplicaSet]) -> Decision {
    let uid = d.metadata.uid.as_deref().unwrap_or_default();
    let spec = d.spec.clone().unwrap_or_default();
    let want = spec.replicas.unwrap_or(1).max(0);
    let mut owned: Vec<&ReplicaSet> = all
        .iter()
        .copied()
        .filter(|rs| controller_of(&rs.metadata).is_some_and(|o| o.uid == uid))
        .collect();
    owned.sort_by_key(|rs| (revision(rs), rs.metadata.creation_timestamp.clone()));
    let new = owned.iter().copied().find(|rs| {
        rs.spec
            .as_ref()
            .and_then(|s| s.template.as_ref())
            .map(unhashed)
            == Some(spec.template.clone())
    });
    let old: Vec<&ReplicaSet> = owned
        .iter()
        .copied()
        .filter(|rs| new.is_none_or(|n| !std::ptr::eq(*rs, n)))
        .collect();
    let strategy = spec.strategy.clone().unwrap_or_default();
    let rolling = strategy.rolling_update.clone().unwrap_or_default();
    let recreate = strategy.type_.as_deref() == Some("Recreate");
    let mut surge = resolve(rolling.max_surge.as_ref(), want, 25, true);
    let mut unavailable = resolve(rolling.max_unavailable.as_ref(), want, 25, false);
    if recreate {
        (surge, unavailable) = (0, want);
    } else if surge == 0 && unavailable == 0 {
        unavailable = 1;
    }
    let mut out = Decision::default();
    let old_total: i32 = old.iter().map(|rs| spec_replicas(rs)).sum();
    let old_active: i32 = old
        .iter()
        .map(|rs| rs.status.as_ref().map_or(0, |s| s.replicas))
        .sum();
    let new_replicas = new.map_or(0, spec_replicas);
    let total = old_total + new_replicas;
    // Scale the new ReplicaSet up within the surge (Recreate: once the old
    // pods are gone); scale old ones down only in a pass that did not.
    let target = if recreate {
        if old_total == 0 && old_active == 0 {
            want
        } else {
            0
        }
    } else if new_replicas >= want {
        want
    } else {
        (new_replicas + (want + surge - total).max(0)).min(want)
    };
    match new {
        None => {
            let revision = owned.iter().map(|rs| revision(rs)).max().unwrap_or(0) + 1;
            out.create = Some(new_replica_set(d, target, revision, want + surge));
        }
        Some(rs) if target != new_replicas => {
            out.scale
                .push((rs.metadata.name.clone().unwrap_or_default(), target));
        }
        Some(_) => {}
    }
    let scaled_up = out.create.is_some() || !out.scale.is_empty();
    if !scaled_up && old_total > 0 {
        out.scale
            .extend(scale_down_old(&old, new, want, unavailable, recreate));
    }
    // Old ReplicaSets beyond the history limit, oldest first, once empty.
    let limit = spec.revision_history_limit.unwrap_or(10).max(0) as usize;
    let empty: Vec<&ReplicaSet> = old
        .iter()
        .copied()
        .filter(|rs| spec_replicas(rs) == 0 && rs.status.as_ref().is_none_or(|s| s.replicas == 0))
        .collect();
    out.delete = empty
        .iter()
        .take(empty.len().saturating_sub(limit))
        .map(|rs| rs.metadata.name.clone().unwrap_or_default())
        .collect();
    out.status = status(d, &owned, new, want, unavailable);
    out
}

/// Upstream's `reconcileOldReplicaSets`: first the old pods that are not
/// available, then available ones down to `want - maxUnavailable`.
fn scale_down_old(
    old: &[&ReplicaSet],
    new: Option<&ReplicaSet>,
    want: i32,
    max_unavailable: i32,
    recreate: bool,
) -> Vec<(String, i32)> {
    let name = |rs: &ReplicaSet| rs.metadata.name.clone().unwrap_or_default();
    if recreate {
        return old
            .iter()
            .filter(|rs| spec_replicas(rs) > 0)
            .map(|rs| (name(rs), 0))
            .collect();
    }
    let mut sizes: Vec<i32> = old.iter().map(|rs| spec_replicas(rs)).collect();
    let new_size = new.map_or(0, spec_replicas);
    let new_unavailable = (new_size - new.map_or(0, available)).max(0);
    let min_available = want - max_unavailable;
    let all: i32 = sizes.iter().sum::<i32>() + new_size;
    let mut budget = all - min_available - new_unavailable;
    for (i, rs) in old.iter().enumerate() {
        let unhealthy = (sizes[i] - available(rs)).max(0);
        let n = unhealthy.min(budget.max(0));
        sizes[i] -= n;
        budget -= n;
    }
    let all_available: i32 =
        old.iter().map(|rs| available(rs)).sum::<i32>() + new.map_or(0, available);
    let mut scale_down = (all_available - min_available).max(0);
    for size in sizes.iter_mut() {
        let n = (*size).min(scale_down);
        *size -= n;
        scale_down -= n;
    }
    old.iter()
        .zip(sizes)
        .filter(|(rs, size)| spec_replicas(rs) != *size)
        .map(|(rs, size)| (name(rs), size))
        .collect()
}

fn status(
    d: &Deployment,
    owned: &[&ReplicaSet],
    new: Option<&ReplicaSet>,
    want: i32,
    max_unavailable: i32,
) -> Status {
    let sum = |f: &dyn Fn(&ReplicaSet) -> i32| owned.iter().map(|rs| f(rs)).sum::<i32>();
    let replicas = sum(&|rs| rs.status.as_ref().map_or(0, |s| s.replicas));
    let ready = sum(&|rs| {
        rs.status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0)
    });
    let avail = sum(&available);
    let updated = new
        .and_then(|rs| rs.status.as_ref())
        .map_or(0, |s| s.replicas);
    let complete = updated == want && replicas == want && avail == want;
    Status {
        replicas,
        updated,
        ready,
        available: avail,
        unavailable: (want - avail).max(0),
        observed_generation: d.metadata.generation.unwrap_or(0),
        minimum_available: avail >= want - max_unavailable,
        progress: if complete {
            "NewReplicaSetAvailable"
        } else {
            "ReplicaSetUpdated"
        },
    }
}

fn new_replica_set(d: &Deployment, replicas: i32, revision: i64, max: i32) -> ReplicaSet {
    let spec = d.spec.clone().unwrap_or_default();
    let hash = template_hash(&spec.template);
    let name = d.metadata.name.clone().unwrap_or_default();
    let mut template = spec.template.clone();
    let meta = template.metadata.get_or_insert_default();
    meta.labels
        .get_or_insert_default()
        .insert(HASH_LABEL.into(), hash.clone());
    let mut selector = spec.selector.clone();
    selector
        .match_labels
        .get_or_insert_default()
        .insert(HASH_LABEL.into(), hash.clone());
    ReplicaSet {
        metadata: ObjectMeta {
            name: Some(format!("{name}-{hash}")),
            namespace: d.metadata.namespace.clone(),
            labels: meta.labels.clone(),
            annotations: Some(BTreeMap::from([
                (REVISION.into(), revision.to_string()),
                (
                    "deployment.kubernetes.io/desired-replicas".into(),
                    spec.replicas.unwrap_or(1).to_string(),
                ),
                (
                    "deployment.kubernetes.io/max-replicas".into(),
                    max.to_string(),
                ),
            ])),
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                name,
                uid: d.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(replicas),
            min_ready_seconds: spec.min_ready_seconds,
            selector,
            template: Some(template),
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests;
