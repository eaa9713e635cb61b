//! The node lifecycle controller's decisions, as upstream's
//! (`pkg/controller/nodelifecycle` with its taint manager): a node whose
//! kubelet has not renewed its Lease (nor posted status) within the grace
//! period turns Unknown; nodes carry the taints their Ready condition,
//! pressure conditions (TaintNodesByCondition) and cordon imply; pods on a node tainted NoExecute are evicted once their
//! tolerations run out.
use std::time::Duration;

use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Node, Pod, Taint},
    },
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};

use crate::scheduler::tolerates;

pub mod run;

pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";
pub const UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
/// TaintNodesByCondition: a condition that is True, and its NoSchedule taint.
pub const CONDITION_TAINTS: [(&str, &str); 4] = [
    ("MemoryPressure", "node.kubernetes.io/memory-pressure"),
    ("DiskPressure", "node.kubernetes.io/disk-pressure"),
    ("PIDPressure", "node.kubernetes.io/pid-pressure"),
    (
        "NetworkUnavailable",
        "node.kubernetes.io/network-unavailable",
    ),
];
const MANAGED: [&str; 7] = [
    NOT_READY,
    UNREACHABLE,
    UNSCHEDULABLE,
    CONDITION_TAINTS[0].1,
    CONDITION_TAINTS[1].1,
    CONDITION_TAINTS[2].1,
    CONDITION_TAINTS[3].1,
];

#[derive(Debug, Default, PartialEq)]
pub struct Decision {
    /// The kubelet stopped posting: set its conditions Unknown.
    pub mark_unknown: bool,
    /// The node's new taints, when they change.
    pub taints: Option<Vec<Taint>>,
}

/// The status of the node's condition `kind`.
pub fn condition<'a>(node: &'a Node, kind: &str) -> Option<&'a str> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| c.status.as_str())
}

fn ready(node: &Node) -> Option<&str> {
    condition(node, "Ready")
}

/// When the kubelet was last heard of: its Lease, its Ready heartbeat, or
/// the node's creation (a new node gets the grace period to report).
pub fn last_heard(node: &Node, lease: Option<&Lease>) -> Option<Timestamp> {
    let renewed = lease
        .and_then(|l| l.spec.as_ref())
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| t.0);
    let heartbeat = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.type_ == "Ready")
        .filter_map(|c| c.last_heartbeat_time.as_ref().map(|t| t.0))
        .max();
    let created = node.metadata.creation_timestamp.as_ref().map(|t| t.0);
    [renewed, heartbeat, created].into_iter().flatten().max()
}

pub fn decide(node: &Node, lease: Option<&Lease>, now: Timestamp, grace: Duration) -> Decision {
    let stale = last_heard(node, lease)
        .is_none_or(|t| now.duration_since(t).as_secs_f64() > grace.as_secs_f64());
    let mut status = ready(node);
    let mark_unknown = stale && status.is_some_and(|s| s != "Unknown");
    if mark_unknown {
        status = Some("Unknown");
    }
    let mut wanted: Vec<(&str, &str)> = match status {
        Some("False") => vec![(NOT_READY, "NoSchedule"), (NOT_READY, "NoExecute")],
        Some("Unknown") => vec![(UNREACHABLE, "NoSchedule"), (UNREACHABLE, "NoExecute")],
        _ => Vec::new(),
    };
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        wanted.push((UNSCHEDULABLE, "NoSchedule"));
    }
    // A node marked Unknown has every condition Unknown: none of these.
    if !mark_unknown {
        for (kind, key) in CONDITION_TAINTS {
            if condition(node, kind) == Some("True") {
                wanted.push((key, "NoSchedule"));
            }
        }
    }
    let current: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let mut next: Vec<Taint> = current
        .iter()
        .filter(|t| !MANAGED.contains(&t.key.as_str()))
        .cloned()
        .collect();
    for (key, effect) in wanted {
        // A taint that stays keeps its timeAdded: evictions count from it.
        let kept = current.iter().find(|t| t.key == key && t.effect == effect);
        next.push(kept.cloned().unwrap_or_else(|| Taint {
            key: key.into(),
            effect: effect.into(),
            time_added: (effect == "NoExecute").then_some(Time(now)),
            value: None,
        }));
    }
    let same = next.len() == current.len() && next.iter().all(|t| current.contains(t));
    Decision {
        mark_unknown,
        taints: (!same).then_some(next),
    }
}

/// When the taint manager evicts `pod` from a node with `taints`: at once
/// for an untolerated NoExecute taint; otherwise after the shortest
/// `tolerationSeconds` among the tolerations used (upstream's
/// `getMinTolerationTime`), counted from `since`, when the node's NoExecute
/// taints were first seen (upstream counts from its processing time too;
/// `timeAdded` has only whole seconds); never when none has a limit.
pub fn eviction_time(
    pod: &Pod,
    taints: &[Taint],
    since: Timestamp,
    now: Timestamp,
) -> Option<Timestamp> {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default();
    let mut limit: Option<i64> = None;
    for taint in taints.iter().filter(|t| t.effect == "NoExecute") {
        let used: Vec<_> = tolerations
            .iter()
            .filter(|t| tolerates(std::slice::from_ref(t), taint))
            .collect();
        if used.is_empty() {
            return Some(now);
        }
        for secs in used.iter().filter_map(|t| t.toleration_seconds) {
            limit = Some(limit.map_or(secs, |l| l.min(secs)));
        }
    }
    let secs = limit?;
    Some(since + k8s_openapi::jiff::SignedDuration::from_secs(secs.max(0)))
}

#[cfg(test)]
mod tests;
