use k8s_openapi::{
    api::{
        apps::v1::DaemonSet,
        core::v1::{Node, Pod},
    },
    jiff::Timestamp,
};
use serde_json::{Value, json};

use super::*;
use crate::testing::merge;

fn ds(extra: Value) -> DaemonSet {
    let mut d = json!({
        "metadata": {"name": "agent", "namespace": "kube-system", "uid": "ds-uid", "generation": 1},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {"metadata": {"labels": {"app": "agent"}},
                         "spec": {"hostNetwork": true, "containers": [{"name": "a", "image": "agent:1"}]}},
        },
    });
    merge(&mut d, extra);
    serde_json::from_value(d).unwrap()
}

fn node(name: &str, extra: Value) -> Node {
    let mut n = json!({"metadata": {"name": name, "labels": {"os": "linux"}}, "spec": {}});
    merge(&mut n, extra);
    serde_json::from_value(n).unwrap()
}

/// A running, ready daemon pod for `node` from `d`'s template (or an old one).
fn daemon(d: &DaemonSet, name: &str, node: &str, current: bool, ready: bool) -> Pod {
    let mut p = pod_for(d, node);
    p.metadata.name = Some(name.into());
    p.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        format!("2026-12-04T09:00:0{}Z", name.len() % 10)
            .parse()
            .unwrap(),
    ));
    if !current {
        p.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(HASH_LABEL.into(), "old".into());
    }
    p.spec.as_mut().unwrap().node_name = Some(node.into());
    p.status = Some(
        serde_json::from_value(json!({"phase": "Running",
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                        "lastTransitionTime": "2026-12-04T09:00:00Z"}]}))
        .unwrap(),
    );
    p
}

fn now() -> Timestamp {
    "2026-12-04T10:00:00Z".parse().unwrap()
}

#[test]
fn eligibility_follows_selectors_and_taints() {
    let d = ds(json!({}));
    let cases = [
        ("plain", node("a", json!({})), (true, true)),
        (
            "cordoned: tolerated",
            node(
                "a",
                json!({"spec": {"unschedulable": true,
            "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}}),
            ),
            (true, true),
        ),
        (
            "unreachable: tolerated",
            node(
                "a",
                json!({"spec": {"taints": [
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]}}),
            ),
            (true, true),
        ),
        (
            "NoSchedule taint: stays, no new",
            node(
                "a",
                json!({"spec": {"taints": [
            {"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}),
            ),
            (false, true),
        ),
        (
            "NoExecute taint: evicted",
            node(
                "a",
                json!({"spec": {"taints": [
            {"key": "dedicated", "effect": "NoExecute"}]}}),
            ),
            (false, false),
        ),
    ];
    for (what, n, want) in cases {
        assert_eq!(eligibility(&d, &n), want, "{what}");
    }
    let picky = ds(json!({"spec": {"template": {"spec": {"nodeSelector": {"os": "windows"}}}}}));
    assert_eq!(eligibility(&picky, &node("a", json!({}))), (false, false));
}

#[test]
fn one_pod_per_eligible_node() {
    let d = ds(json!({}));
    let (a, b, c) = (
        node("a", json!({})),
        node("b", json!({})),
        node("c", json!({})),
    );
    let on_a = daemon(&d, "agent-1", "a", true, true);
    let dup = daemon(&d, "agent-22", "a", true, true);
    let stray = daemon(&d, "agent-3", "gone", true, true);
    let out = decide(&d, &[&a, &b, &c], &[&on_a, &dup, &stray], now());
    assert_eq!(out.create, ["b", "c"]);
    assert_eq!(
        out.delete,
        ["agent-22", "agent-3"],
        "the newer duplicate, the pod of a gone node"
    );
    assert_eq!(
        (out.status.desired, out.status.current, out.status.ready),
        (3, 1, 1)
    );
    assert_eq!(out.status.unavailable, 2);
}

#[test]
fn new_pods_are_pinned_and_tolerate_node_trouble() {
    let p = pod_for(&ds(json!({})), "node-2");
    assert_eq!(node_of(&p).as_deref(), Some("node-2"));
    assert!(
        p.spec.as_ref().unwrap().node_name.is_none(),
        "the scheduler binds it"
    );
    let keys: Vec<String> = p
        .spec
        .unwrap()
        .tolerations
        .unwrap()
        .into_iter()
        .map(|t| format!("{}:{}", t.key.unwrap(), t.effect.unwrap()))
        .collect();
    for want in [
        "node.kubernetes.io/not-ready:NoExecute",
        "node.kubernetes.io/unreachable:NoExecute",
        "node.kubernetes.io/unschedulable:NoSchedule",
        "node.kubernetes.io/network-unavailable:NoSchedule",
    ] {
        assert!(keys.iter().any(|k| k == want), "{want} in {keys:?}");
    }
    assert_eq!(p.metadata.owner_references.unwrap()[0].kind, "DaemonSet");
}

#[test]
fn a_rolling_update_replaces_one_at_a_time() {
    let d = ds(json!({}));
    let (a, b, c) = (
        node("a", json!({})),
        node("b", json!({})),
        node("c", json!({})),
    );
    let old = |n: &str, ready| daemon(&d, &format!("old-{n}"), n, false, ready);
    let (pa, pb, pc) = (old("a", true), old("b", true), old("c", true));
    let out = decide(&d, &[&a, &b, &c], &[&pa, &pb, &pc], now());
    assert_eq!(out.delete, ["old-a"], "maxUnavailable 1");
    assert_eq!(out.status.updated, 0);
    // One node without a pod (being replaced): nothing more goes down.
    let out = decide(&d, &[&a, &b, &c], &[&pb, &pc], now());
    assert_eq!(
        (out.create.as_slice(), out.delete.len()),
        (["a".to_string()].as_slice(), 0)
    );
    // An unavailable old pod is replaced regardless.
    let sick = old("c", false);
    let new_a = daemon(&d, "new-a", "a", true, true);
    let out = decide(&d, &[&a, &b, &c], &[&new_a, &pb, &sick], now());
    assert_eq!(out.delete, ["old-c"]);
    assert_eq!(out.status.updated, 1);
    let on_delete =
        ds(json!({"spec": {"updateStrategy": {"type": "OnDelete", "rollingUpdate": null}}}));
    assert!(decide(&on_delete, &[&a], &[&pa], now()).delete.is_empty());
}
