//! The scheduler's decision: which node a pending pod goes to, or why none
//! fits. Filters run in the default profile's order (NodeUnschedulable,
//! TaintToleration, NodeAffinity's nodeSelector, NodeResourcesFit) and a
//! node fails at its first; the score prefers the least allocated node, so
//! replicas spread. `run` binds what this decides.
use std::{collections::BTreeMap, fmt};

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, Pod, PodSpec, Taint, Toleration};

use crate::quantity;

pub mod run;

/// What a pod asks for, or what a node has left.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Resources {
    pub milli_cpu: u64,
    pub memory: u64,
    pub pods: u64,
}

impl Resources {
    fn add(&mut self, other: Resources) {
        self.milli_cpu += other.milli_cpu;
        self.memory += other.memory;
        self.pods += other.pods;
    }
}

/// A node and what its bound pods already request.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    pub node: &'a Node,
    pub requested: Resources,
}

impl<'a> Candidate<'a> {
    pub fn new(node: &'a Node) -> Self {
        Candidate {
            node,
            requested: Resources::default(),
        }
    }

    /// Counts a pod bound to this node.
    pub fn assume(&mut self, pod: &Pod) {
        self.requested.add(requests(pod));
    }

    fn name(&self) -> &str {
        self.node.metadata.name.as_deref().unwrap_or_default()
    }
}

/// A pod's requests: its containers' sum, or its largest init container if
/// larger (they run one at a time, before the rest), plus one pod.
pub fn requests(pod: &Pod) -> Resources {
    let Some(spec) = &pod.spec else {
        return Resources {
            pods: 1,
            ..Resources::default()
        };
    };
    let of = |c: &k8s_openapi::api::core::v1::Container, name: &str| -> u64 {
        c.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(name))
            .and_then(|q| {
                if name == "cpu" {
                    quantity::milli(&q.0)
                } else {
                    quantity::units(&q.0)
                }
            })
            .unwrap_or(0)
    };
    let sum = |name: &str| spec.containers.iter().map(|c| of(c, name)).sum::<u64>();
    let init = |name: &str| {
        spec.init_containers
            .iter()
            .flatten()
            .map(|c| of(c, name))
            .max()
            .unwrap_or(0)
    };
    Resources {
        milli_cpu: sum("cpu").max(init("cpu")),
        memory: sum("memory").max(init("memory")),
        pods: 1,
    }
}

fn allocatable(node: &Node) -> Resources {
    let get = |name: &str| {
        node.status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get(name))
            .map(|q| q.0.as_str())
    };
    Resources {
        milli_cpu: get("cpu").and_then(quantity::milli).unwrap_or(0),
        memory: get("memory").and_then(quantity::units).unwrap_or(0),
        // A node that reports no pod capacity takes the kubelet's default.
        pods: get("pods").and_then(quantity::units).unwrap_or(110),
    }
}

/// Why no node fits: per reason, how many nodes failed with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unschedulable {
    pub nodes: usize,
    pub reasons: BTreeMap<String, usize>,
}

/// Upstream's FitError message, reasons sorted as it sorts them.
impl fmt::Display for Unschedulable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nodes == 0 {
            return write!(f, "no nodes available to schedule pods");
        }
        let mut parts: Vec<String> = self
            .reasons
            .iter()
            .map(|(reason, n)| format!("{n} {reason}"))
            .collect();
        parts.sort();
        write!(
            f,
            "0/{} nodes are available: {}.",
            self.nodes,
            parts.join(", ")
        )
    }
}

/// Upstream's `ToleratesTaint`, over a pod's tolerations.
pub fn tolerates(tolerations: &[Toleration], taint: &Taint) -> bool {
    tolerations.iter().any(|t| {
        let effect = t.effect.as_deref().unwrap_or_default();
        if !effect.is_empty() && effect != taint.effect {
            return false;
        }
        let key = t.key.as_deref().unwrap_or_default();
        if !key.is_empty() && key != taint.key {
            return false;
        }
        match t.operator.as_deref().unwrap_or("Equal") {
            "Exists" => true,
            _ => {
                t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
            }
        }
    })
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The taints a node has for the scheduler: its own, plus the ones the node
/// lifecycle controller derives from its conditions (TaintNodesByCondition)
/// when they are not there yet.
fn taints(node: &Node) -> Vec<Taint> {
    let mut out: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let implied = |key: &str| Taint {
        key: key.into(),
        effect: "NoSchedule".into(),
        ..Taint::default()
    };
    if !is_ready(node) && !out.iter().any(|t| t.key.starts_with("node.kubernetes.io/")) {
        out.push(implied("node.kubernetes.io/not-ready"));
    }
    out
}

/// `nodeSelector` and required node affinity (NodeAffinity's filter):
/// terms are ORed, a term's expressions and fields ANDed; only
/// `metadata.name` is a field, which DaemonSet pods are pinned with.
pub fn selects_node(spec: &PodSpec, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let selector = spec.node_selector.clone().unwrap_or_default();
    if !selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
        return false;
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let Some(required) = required else {
        return true;
    };
    let name = node.metadata.name.clone().unwrap_or_default();
    let fields = BTreeMap::from([("metadata.name".to_string(), name)]);
    required.node_selector_terms.iter().any(|term| {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let field_exprs = term.match_fields.as_deref().unwrap_or_default();
        !(exprs.is_empty() && field_exprs.is_empty())
            && exprs.iter().all(|e| requirement(e, &labels))
            && field_exprs.iter().all(|e| requirement(e, &fields))
    })
}

fn requirement(e: &NodeSelectorRequirement, values: &BTreeMap<String, String>) -> bool {
    let have = values.get(&e.key);
    let want = e.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match e.operator.as_str() {
        "In" => have.is_some_and(|v| want.contains(v)),
        "NotIn" => have.is_none_or(|v| !want.contains(v)),
        "Exists" => have.is_some(),
        "DoesNotExist" => have.is_none(),
        "Gt" | "Lt" => {
            let (Some(h), Some(w)) = (
                have.and_then(|v| number(v)),
                want.first().and_then(|v| number(v)),
            ) else {
                return false;
            };
            if e.operator == "Gt" { h > w } else { h < w }
        }
        _ => false,
    }
}

/// The first filter `c` fails for `pod`, as upstream words it.
fn filter(pod: &Pod, want: Resources, c: &Candidate<'_>) -> Result<(), String> {
    let spec = pod.spec.clone().unwrap_or_default();
    let tolerations = spec.tolerations.clone().unwrap_or_default();
    let unschedulable = c.node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    let cordon = Taint {
        key: "node.kubernetes.io/unschedulable".into(),
        effect: "NoSchedule".into(),
        ..Taint::default()
    };
    if unschedulable && !tolerates(&tolerations, &cordon) {
        return Err("node(s) were unschedulable".into());
    }
    for taint in taints(c.node) {
        let blocking = matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute");
        if blocking && !tolerates(&tolerations, &taint) {
            return Err(format!(
                "node(s) had untolerated taint {{{}: {}}}",
                taint.key,
                taint.value.unwrap_or_default()
            ));
        }
    }
    if !selects_node(&spec, c.node) {
        return Err("node(s) didn't match Pod's node affinity/selector".into());
    }
    let has = allocatable(c.node);
    let used = c.requested;
    if used.pods + want.pods > has.pods {
        return Err("Too many pods".into());
    }
    if used.milli_cpu + want.milli_cpu > has.milli_cpu && want.milli_cpu > 0 {
        return Err("Insufficient cpu".into());
    }
    if used.memory + want.memory > has.memory && want.memory > 0 {
        return Err("Insufficient memory".into());
    }
    Ok(())
}

/// LeastAllocated over CPU, memory and pods, 0–100 each: higher is emptier.
fn score(want: Resources, c: &Candidate<'_>) -> u64 {
    let has = allocatable(c.node);
    let free = |used: u64, cap: u64| {
        (cap.saturating_sub(used) * 100)
            .checked_div(cap)
            .unwrap_or(0)
    };
    free(c.requested.milli_cpu + want.milli_cpu, has.milli_cpu)
        + free(c.requested.memory + want.memory, has.memory)
        + free(c.requested.pods + want.pods, has.pods)
}

/// The node for `pod` among `nodes`: the best scored of those that pass
/// every filter, ties to the first by name.
pub fn schedule(pod: &Pod, nodes: &[Candidate<'_>]) -> Result<String, Unschedulable> {
    let want = requests(pod);
    let mut reasons = BTreeMap::new();
    let mut best: Option<(&Candidate<'_>, u64)> = None;
    for c in nodes {
        match filter(pod, want, c) {
            Err(reason) => *reasons.entry(reason).or_insert(0) += 1,
            Ok(()) => {
                let s = score(want, c);
                let better = best.is_none_or(|(b, bs)| s > bs || (s == bs && c.name() < b.name()));
                if better {
                    best = Some((c, s));
                }
            }
        }
    }
    best.map(|(c, _)| c.name().to_string())
        .ok_or(Unschedulable {
            nodes: nodes.len(),
            reasons,
        })
}

#[cfg(test)]
mod tests;
