use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

use super::*;
use crate::testing::merge;

fn node(name: &str, extra: Value) -> Node {
    let mut n = json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    });
    merge(&mut n, extra);
    serde_json::from_value(n).unwrap()
}

fn pod(extra: Value) -> Pod {
    let mut p = json!({
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    });
    merge(&mut p, extra);
    serde_json::from_value(p).unwrap()
}

fn requesting(cpu: &str, memory: &str) -> Value {
    json!({"spec": {"containers": [{"name": "c", "image": "i",
        "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}})
}

#[test]
fn filters_and_their_messages() {
    let cordoned = node("a", json!({"spec": {"unschedulable": true}}));
    let tainted = node(
        "b",
        json!({"spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}),
    );
    let not_ready = node(
        "c",
        json!({"status": {"conditions": [{"type": "Ready", "status": "False"}]}}),
    );
    let unreachable = node(
        "d",
        json!({"spec": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]},
               "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}),
    );
    let zone_b = node("e", json!({"metadata": {"labels": {"zone": "b"}}}));
    let small = node(
        "f",
        json!({"status": {"allocatable": {"cpu": "500m", "memory": "128Mi", "pods": "110"}}}),
    );
    let full = node("g", json!({"status": {"allocatable": {"pods": "0"}}}));
    let soft = node(
        "h",
        json!({"spec": {"taints": [{"key": "k", "effect": "PreferNoSchedule"}]}}),
    );
    /// The node, or the FitError message.
    type Want = Result<&'static str, &'static str>;
    let cases: Vec<(&str, Pod, Vec<&Node>, Want)> = vec![
        ("a plain node", pod(json!({})), vec![&soft], Ok("h")),
        (
            "cordoned",
            pod(json!({})),
            vec![&cordoned],
            Err("0/1 nodes are available: 1 node(s) were unschedulable."),
        ),
        (
            "cordoned, but tolerated (as DaemonSet pods are)",
            pod(
                json!({"spec": {"tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]}}),
            ),
            vec![&cordoned],
            Ok("a"),
        ),
        (
            "tainted",
            pod(json!({})),
            vec![&tainted],
            Err("0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: db}."),
        ),
        (
            "taint tolerated by key and value",
            pod(
                json!({"spec": {"tolerations": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}),
            ),
            vec![&tainted],
            Ok("b"),
        ),
        (
            "a toleration with the wrong value",
            pod(json!({"spec": {"tolerations": [{"key": "dedicated", "value": "web"}]}})),
            vec![&tainted],
            Err("0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: db}."),
        ),
        (
            "Exists without a key tolerates everything",
            pod(json!({"spec": {"tolerations": [{"operator": "Exists"}]}})),
            vec![&tainted, &unreachable],
            Ok("b"),
        ),
        (
            "not ready and unreachable",
            pod(json!({})),
            vec![&not_ready, &unreachable],
            Err(
                "0/2 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, 1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }.",
            ),
        ),
        (
            "nodeSelector",
            pod(json!({"spec": {"nodeSelector": {"zone": "b"}}})),
            vec![&small, &zone_b],
            Ok("e"),
        ),
        (
            "nodeSelector matching nothing",
            pod(json!({"spec": {"nodeSelector": {"zone": "c"}}})),
            vec![&zone_b],
            Err("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."),
        ),
        (
            "requests beyond allocatable",
            pod(requesting("1", "64Mi")),
            vec![&small],
            Err("0/1 nodes are available: 1 Insufficient cpu."),
        ),
        (
            "memory beyond allocatable",
            pod(requesting("100m", "1Gi")),
            vec![&small],
            Err("0/1 nodes are available: 1 Insufficient memory."),
        ),
        (
            "no pod slots",
            pod(json!({})),
            vec![&full],
            Err("0/1 nodes are available: 1 Too many pods."),
        ),
        (
            "no nodes",
            pod(json!({})),
            vec![],
            Err("no nodes available to schedule pods"),
        ),
        (
            "pinned by name, as DaemonSet pods are",
            pod(
                json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["f"]}]}]}}}}}),
            ),
            vec![&zone_b, &small],
            Ok("f"),
        ),
        (
            "affinity terms are ORed, expressions ANDed",
            pod(
                json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["c"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "Exists"},
                                          {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["f"]}]},
                ]}}}}}),
            ),
            vec![&small, &zone_b],
            Ok("e"),
        ),
        (
            "no term matches",
            pod(
                json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}]}}}}}),
            ),
            vec![&zone_b],
            Err("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."),
        ),
        (
            "the first failing filter counts, one reason per node",
            pod(json!({"spec": {"nodeSelector": {"zone": "b"}}})),
            vec![&cordoned, &tainted, &small],
            Err(
                "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {dedicated: db}, 1 node(s) were unschedulable.",
            ),
        ),
    ];
    for (what, pod, nodes, want) in cases {
        let candidates: Vec<Candidate<'_>> = nodes.into_iter().map(Candidate::new).collect();
        let got = schedule(&pod, &candidates).map_err(|e| e.to_string());
        assert_eq!(got.as_deref().map_err(String::as_str), want, "{what}");
    }
}

#[test]
fn replicas_spread_over_the_least_allocated_nodes() {
    let (a, b) = (node("a", json!({})), node("b", json!({})));
    let mut nodes = vec![Candidate::new(&a), Candidate::new(&b)];
    let replica = pod(requesting("100m", "64Mi"));
    let mut placed = Vec::new();
    for _ in 0..5 {
        let name = schedule(&replica, &nodes).unwrap();
        nodes
            .iter_mut()
            .find(|c| c.name() == name)
            .unwrap()
            .assume(&replica);
        placed.push(name);
    }
    assert_eq!(placed, ["a", "b", "a", "b", "a"]);
}

#[test]
fn init_containers_count_when_larger() {
    let p = pod(json!({"spec": {
        "initContainers": [{"name": "i", "image": "i", "resources": {"requests": {"cpu": "1500m"}}}],
        "containers": [
            {"name": "a", "image": "i", "resources": {"requests": {"cpu": "200m", "memory": "1Gi"}}},
            {"name": "b", "image": "i", "resources": {"requests": {"cpu": "300m"}}},
        ],
    }}));
    assert_eq!(
        requests(&p),
        Resources {
            milli_cpu: 1500,
            memory: 1 << 30,
            pods: 1
        }
    );
}
