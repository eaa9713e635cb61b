use std::time::Duration;

use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Node, Pod, Taint},
    },
    jiff::Timestamp,
};
use serde_json::{Value, json};

use super::*;
use crate::testing::merge;

const GRACE: Duration = Duration::from_secs(40);

fn at(s: &str) -> Timestamp {
    format!("2026-12-04T10:{s}Z").parse().unwrap()
}

fn node(ready: &str, heartbeat: &str, extra: Value) -> Node {
    let mut n = json!({
        "metadata": {"name": "n1", "creationTimestamp": "2026-12-04T09:00:00Z"},
        "spec": {},
        "status": {"conditions": [{"type": "Ready", "status": ready,
            "lastHeartbeatTime": format!("2026-12-04T10:{heartbeat}Z")}]},
    });
    merge(&mut n, extra);
    serde_json::from_value(n).unwrap()
}

fn lease(renewed: &str) -> Lease {
    serde_json::from_value(json!({"metadata": {"name": "n1"},
        "spec": {"renewTime": format!("2026-12-04T10:{renewed}.000000Z")}}))
    .unwrap()
}

fn keys(d: &Decision) -> Option<Vec<String>> {
    d.taints.as_ref().map(|ts| {
        ts.iter()
            .map(|t| format!("{}:{}", t.key, t.effect))
            .collect()
    })
}

#[test]
fn silence_beyond_the_grace_period_makes_a_node_unknown() {
    // Heard 30 s ago by heartbeat: fine.
    let d = decide(&node("True", "00:00", json!({})), None, at("00:30"), GRACE);
    assert_eq!(d, Decision::default());
    // 41 s: Unknown, and unreachable taints.
    let d = decide(&node("True", "00:00", json!({})), None, at("00:41"), GRACE);
    assert!(d.mark_unknown);
    assert_eq!(
        keys(&d).unwrap(),
        [
            format!("{UNREACHABLE}:NoSchedule"),
            format!("{UNREACHABLE}:NoExecute")
        ]
    );
    // A renewed Lease is enough (the kubelet posts status rarely).
    let d = decide(
        &node("True", "00:00", json!({})),
        Some(&lease("00:35")),
        at("00:41"),
        GRACE,
    );
    assert!(!d.mark_unknown && d.taints.is_none());
}

#[test]
fn taints_follow_ready_and_cordon() {
    let now = at("00:10");
    let not_ready = decide(&node("False", "00:05", json!({})), None, now, GRACE);
    assert_eq!(
        keys(&not_ready).unwrap(),
        [
            format!("{NOT_READY}:NoSchedule"),
            format!("{NOT_READY}:NoExecute")
        ]
    );
    let cordoned = node(
        "True",
        "00:05",
        json!({"spec": {"unschedulable": true,
        "taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]}}),
    );
    assert_eq!(
        keys(&decide(&cordoned, None, now, GRACE)).unwrap(),
        [
            "dedicated:NoSchedule".to_string(),
            format!("{UNSCHEDULABLE}:NoSchedule")
        ]
    );
    // Back to Ready: the managed taints go, others stay.
    let recovered = node(
        "True",
        "00:05",
        json!({"spec": {"taints": [
        {"key": "dedicated", "effect": "NoSchedule"},
        {"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": "2026-12-04T10:00:00Z"}]}}),
    );
    assert_eq!(
        keys(&decide(&recovered, None, now, GRACE)).unwrap(),
        ["dedicated:NoSchedule"]
    );
    // Already right: nothing to write, and a kept taint keeps its time.
    let tainted = node(
        "False",
        "00:05",
        json!({"spec": {"taints": [
        {"key": NOT_READY, "effect": "NoSchedule"},
        {"key": NOT_READY, "effect": "NoExecute", "timeAdded": "2026-12-04T10:00:00Z"}]}}),
    );
    assert_eq!(decide(&tainted, None, now, GRACE), Decision::default());
}

#[test]
fn pressure_conditions_taint_no_schedule_until_they_clear() {
    let now = at("00:10");
    let pressed = |memory: &str, disk: &str, taints: Value| {
        let conditions = json!([
            {"type": "Ready", "status": "True",
             "lastHeartbeatTime": "2026-12-04T10:00:05Z"},
            {"type": "MemoryPressure", "status": memory},
            {"type": "DiskPressure", "status": disk},
        ]);
        node(
            "True",
            "00:05",
            json!({"spec": {"taints": taints}, "status": {"conditions": conditions}}),
        )
    };
    let d = decide(&pressed("False", "True", json!([])), None, now, GRACE);
    assert_eq!(
        keys(&d).unwrap(),
        ["node.kubernetes.io/disk-pressure:NoSchedule"]
    );
    let both = decide(&pressed("True", "True", json!([])), None, now, GRACE);
    assert_eq!(
        keys(&both).unwrap(),
        [
            "node.kubernetes.io/memory-pressure:NoSchedule",
            "node.kubernetes.io/disk-pressure:NoSchedule"
        ]
    );
    let cleared = pressed(
        "False",
        "False",
        json!([{"key": "node.kubernetes.io/disk-pressure", "effect": "NoSchedule"}]),
    );
    assert_eq!(
        keys(&decide(&cleared, None, now, GRACE)).unwrap(),
        Vec::<String>::new()
    );
}

fn pod(tolerations: Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c", "image": "i"}], "tolerations": tolerations}}))
    .unwrap()
}

#[test]
fn evictions_wait_for_the_shortest_toleration() {
    let unreachable: Taint = serde_json::from_value(json!(
        {"key": UNREACHABLE, "effect": "NoExecute", "timeAdded": "2026-12-04T10:00:00Z"}))
    .unwrap();
    let other: Taint =
        serde_json::from_value(json!({"key": "maintenance", "effect": "NoExecute"})).unwrap();
    let soft: Taint = serde_json::from_value(json!({"key": "x", "effect": "NoSchedule"})).unwrap();
    let now = at("00:05");
    let default = json!([{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]);
    let cases: Vec<(&str, Value, Vec<&Taint>, Option<Timestamp>)> = vec![
        (
            "the admitted 300 s",
            default.clone(),
            vec![&unreachable],
            Some(at("05:00")),
        ),
        (
            "no toleration: at once",
            json!([]),
            vec![&unreachable],
            Some(now),
        ),
        (
            "forever",
            json!([{"operator": "Exists"}]),
            vec![&unreachable, &other],
            None,
        ),
        (
            "an untolerated second taint",
            default.clone(),
            vec![&unreachable, &other],
            Some(now),
        ),
        ("NoSchedule never evicts", json!([]), vec![&soft], None),
        (
            "the shortest of the tolerations used",
            json!([{"key": UNREACHABLE, "operator": "Exists", "tolerationSeconds": 300},
                   {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}]),
            vec![&unreachable],
            Some("2026-12-04T10:00:02Z".parse().unwrap()),
        ),
    ];
    for (what, tolerations, taints, want) in cases {
        let taints: Vec<Taint> = taints.into_iter().cloned().collect();
        assert_eq!(
            eviction_time(&pod(tolerations), &taints, at("00:00"), now),
            want,
            "{what}"
        );
    }
}
