//! The DaemonSet controller's decision, as upstream's
//! (`pkg/controller/daemon`): one pod per eligible node, pinned to it by
//! node affinity and placed by the scheduler, with the tolerations the
//! controller adds; a rolling update within `maxUnavailable`; status.
use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        apps::v1::DaemonSet,
        core::v1::{
            Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
            Pod, PodSpec, Taint, Toleration,
        },
    },
    apimachinery::pkg::{
        apis::meta::v1::{ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
    jiff::Timestamp,
};

use crate::{
    deployments::template_hash,
    pods::{is_ready, is_terminal},
    replicasets::is_available,
    scheduler::{selects_node, tolerates},
};

pub mod run;

pub const HASH_LABEL: &str = "controller-revision-hash";

/// Upstream's `AddOrUpdateDaemonPodTolerations`: daemons ride out node
/// trouble and cordons.
pub fn daemon_tolerations(spec: &PodSpec) -> Vec<Toleration> {
    let mut out = spec.tolerations.clone().unwrap_or_default();
    let mut add = |key: &str, effect: &str| {
        let t = Toleration {
            key: Some(format!("node.kubernetes.io/{key}")),
            operator: Some("Exists".into()),
            effect: Some(effect.into()),
            ..Toleration::default()
        };
        if !out.iter().any(|o| o.key == t.key && o.effect == t.effect) {
            out.push(t);
        }
    };
    add("not-ready", "NoExecute");
    add("unreachable", "NoExecute");
    for key in [
        "disk-pressure",
        "memory-pressure",
        "pid-pressure",
        "unschedulable",
    ] {
        add(key, "NoSchedule");
    }
    if spec.host_network == Some(true) {
        add("network-unavailable", "NoSchedule");
    }
    out
}

/// Whether a daemon pod should be on `node`, and whether one already there
/// may stay (a NoSchedule taint keeps new ones off, NoExecute evicts).
pub fn eligibility(ds: &DaemonSet, node: &Node) -> (bool, bool) {
    let mut spec = template(ds).spec.unwrap_or_default();
    spec.tolerations = Some(daemon_tolerations(&spec));
    if !selects_node(&spec, node) {
        return (false, false);
    }
    let tolerations = spec.tolerations.unwrap_or_default();
    let taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let untolerated = |effect: &str| {
        taints
            .iter()
            .any(|t| t.effect == effect && !tolerates(&tolerations, t))
    };
    if untolerated("NoExecute") {
        return (false, false);
    }
    (!untolerated("NoSchedule"), true)
}

fn template(ds: &DaemonSet) -> k8s_openapi::api::core::v1::PodTemplateSpec {
    ds.spec
        .as_ref()
        .map(|s| s.template.clone())
        .unwrap_or_default()
}

/// The node a daemon pod is for: its binding, or its affinity pin.
pub fn node_of(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    if let Some(n) = spec.node_name.as_ref().filter(|n| !n.is_empty()) {
        return Some(n.clone());
    }
    spec.affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_fields.iter().flatten())
        .find(|f| f.key == "metadata.name" && f.operator == "In")
        .and_then(|f| f.values.as_ref()?.first().cloned())
}

#[derive(Debug, Default, PartialEq)]
pub struct Decision {
    /// Nodes to create a daemon pod for.
    pub create: Vec<String>,
    /// Pods to delete (name).
    pub delete: Vec<String>,
    pub status: Status,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Status {
    pub desired: i32,
    pub current: i32,
    pub misscheduled: i32,
    pub ready: i32,
    pub updated: i32,
    pub available: i32,
    pub unavailable: i32,
    pub observed_generation: i64,
}

fn hash_of(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()?
        .get(HASH_LABEL)
        .map(String::as_str)
}

/// `pods` are the DaemonSet's own, not being deleted.
pub fn decide(ds: &DaemonSet, nodes: &[&Node], pods: &[&Pod], now: Timestamp) -> Decision {
    let hash = template_hash(&template(ds));
    let min_ready = ds
        .spec
        .as_ref()
        .and_then(|s| s.min_ready_seconds)
        .unwrap_or(0)
        .into();
    let mut by_node: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    for &p in pods {
        by_node
            .entry(node_of(p).unwrap_or_default())
            .or_default()
            .push(p);
    }
    let mut out = Decision::default();
    let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
    // (node has a current-template pod that is available, old pods there)
    let mut old: Vec<(&Pod, bool)> = Vec::new();
    for node in nodes {
        let node_name = node.metadata.name.clone().unwrap_or_default();
        let mut here: Vec<&Pod> = by_node.remove(&node_name).unwrap_or_default();
        here.sort_by(|a, b| {
            a.metadata
                .creation_timestamp
                .cmp(&b.metadata.creation_timestamp)
        });
        let (run, stay) = eligibility(ds, node);
        // A failed daemon is replaced, as upstream does.
        let (failed, live): (Vec<&Pod>, Vec<&Pod>) = here.into_iter().partition(|p| is_terminal(p));
        out.delete.extend(failed.iter().map(|p| name(p)));
        if !stay {
            if !live.is_empty() {
                out.status.misscheduled += 1;
            }
            out.delete.extend(live.iter().map(|p| name(p)));
            continue;
        }
        if !run && !live.is_empty() {
            out.status.misscheduled += 1;
        }
        if run {
            out.status.desired += 1;
            if live.is_empty() {
                out.create.push(node_name);
                continue;
            }
            out.status.current += 1;
        }
        let Some(&pod) = live.first() else { continue };
        out.delete.extend(live[1..].iter().map(|p| name(p)));
        let available = is_available(pod, min_ready, now);
        out.status.ready += i32::from(is_ready(pod));
        out.status.available += i32::from(available);
        if hash_of(pod) == Some(hash.as_str()) {
            out.status.updated += 1;
        } else {
            old.push((pod, available));
        }
    }
    // Pods on nodes that are gone.
    out.delete
        .extend(by_node.values().flatten().map(|p| name(p)));
    out.status.unavailable = out.status.desired - out.status.available;
    out.status.observed_generation = ds.metadata.generation.unwrap_or(0);
    out.delete
        .extend(roll(ds, &old, out.status.desired, out.status.unavailable));
    out
}

/// Old-template pods to replace now: the unavailable ones, then available
/// ones while fewer than `maxUnavailable` are unavailable.
fn roll(ds: &DaemonSet, old: &[(&Pod, bool)], desired: i32, unavailable: i32) -> Vec<String> {
    let strategy = ds
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.clone())
        .unwrap_or_default();
    if strategy.type_.as_deref() == Some("OnDelete") {
        return Vec::new();
    }
    let max = match strategy.rolling_update.and_then(|r| r.max_unavailable) {
        Some(IntOrString::Int(n)) => n,
        Some(IntOrString::String(s)) => s
            .strip_suffix('%')
            .and_then(|p| p.parse::<i64>().ok())
            .map_or(1, |p| ((p * i64::from(desired) + 99) / 100) as i32),
        None => 1,
    };
    let mut budget = max - unavailable;
    let mut out = Vec::new();
    for (pod, available) in old {
        if !available {
            out.push(pod.metadata.name.clone().unwrap_or_default());
        } else if budget > 0 {
            budget -= 1;
            out.push(pod.metadata.name.clone().unwrap_or_default());
        }
    }
    out
}

/// A daemon pod for `node`: the template, the controller's tolerations, a
/// node-affinity pin (the scheduler binds it), the revision label.
pub fn pod_for(ds: &DaemonSet, node: &str) -> Pod {
    let t = template(ds);
    let hash = template_hash(&t);
    let meta = t.metadata.unwrap_or_default();
    let mut labels = meta.labels.unwrap_or_default();
    labels.insert(HASH_LABEL.into(), hash);
    let mut spec = t.spec.unwrap_or_default();
    spec.tolerations = Some(daemon_tolerations(&spec));
    let pin = NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_fields: Some(vec![NodeSelectorRequirement {
                key: "metadata.name".into(),
                operator: "In".into(),
                values: Some(vec![node.into()]),
            }]),
            ..NodeSelectorTerm::default()
        }],
    };
    let affinity = spec.affinity.get_or_insert_with(Affinity::default);
    affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default)
        .required_during_scheduling_ignored_during_execution = Some(pin);
    let name = ds.metadata.name.clone().unwrap_or_default();
    Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}-")),
            namespace: ds.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: meta.annotations,
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".into(),
                kind: "DaemonSet".into(),
                name,
                uid: ds.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    }
}

#[cfg(test)]
mod tests;
