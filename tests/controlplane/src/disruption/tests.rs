use k8s_openapi::{
    api::{core::v1::Pod, policy::v1::PodDisruptionBudget},
    jiff::Timestamp,
};
use serde_json::{Value, json};

use super::*;

fn pdb(spec: Value, disrupted: Value) -> PodDisruptionBudget {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default", "generation": 2},
        "spec": spec,
        "status": {"disruptedPods": disrupted, "disruptionsAllowed": 0, "currentHealthy": 0,
                   "desiredHealthy": 0, "expectedPods": 0},
    }))
    .unwrap()
}

fn pod(name: &str, ready: bool, deleting: bool) -> Pod {
    let mut p = json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
    });
    if deleting {
        p["metadata"]["deletionTimestamp"] = json!("2026-12-04T10:00:00Z");
    }
    serde_json::from_value(p).unwrap()
}

fn now() -> Timestamp {
    "2026-12-04T10:01:00Z".parse().unwrap()
}

fn summary(s: &Status) -> (i32, i32, i32, i32, usize) {
    (
        s.expected,
        s.desired_healthy,
        s.current_healthy,
        s.disruptions_allowed,
        s.disrupted.len(),
    )
}

#[test]
fn budgets_from_min_available_and_max_unavailable() {
    let sel = json!({"matchLabels": {"app": "web"}});
    let pods = [
        pod("a", true, false),
        pod("b", true, false),
        pod("c", false, false),
        pod("d", true, true),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    /// (expected, desired healthy, current healthy, allowed, disrupted).
    type Want = (i32, i32, i32, i32, usize);
    let cases: Vec<(&str, Value, Option<i32>, Want)> = vec![
        (
            "minAvailable 2 of 4 pods, 2 healthy",
            json!({"minAvailable": 2, "selector": sel}),
            None,
            (4, 2, 2, 0, 0),
        ),
        (
            "minAvailable 1",
            json!({"minAvailable": 1, "selector": sel}),
            None,
            (4, 1, 2, 1, 0),
        ),
        (
            "maxUnavailable 1 of scale 3",
            json!({"maxUnavailable": 1, "selector": sel}),
            Some(3),
            (3, 2, 2, 0, 0),
        ),
        (
            "minAvailable 50% of scale 3 rounds up",
            json!({"minAvailable": "50%", "selector": sel}),
            Some(3),
            (3, 2, 2, 0, 0),
        ),
        (
            "an empty selector covers the namespace",
            json!({"minAvailable": 1, "selector": {}}),
            None,
            (4, 1, 2, 1, 0),
        ),
        (
            "no selector covers nothing",
            json!({"minAvailable": 1}),
            None,
            (0, 1, 0, 0, 0),
        ),
    ];
    for (what, spec, scale, want) in cases {
        let s = decide(&pdb(spec, json!({})), &refs, scale, now());
        assert_eq!(summary(&s), want, "{what}");
        assert_eq!(s.observed_generation, 2);
    }
}

#[test]
fn an_eviction_counts_until_its_pod_goes() {
    let spec = json!({"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}});
    let (a, b) = (pod("a", true, false), pod("b", true, false));
    // Just evicted, not yet deleting: not healthy, still listed.
    let fresh = pdb(spec.clone(), json!({"a": "2026-12-04T10:00:30Z"}));
    assert_eq!(
        summary(&decide(&fresh, &[&a, &b], None, now())),
        (2, 1, 1, 0, 1)
    );
    // Deleting now: dropped from the list (and not healthy either).
    let going = pod("a", true, true);
    assert_eq!(
        summary(&decide(&fresh, &[&going, &b], None, now())),
        (2, 1, 1, 0, 0)
    );
    // Two minutes without a delete: the eviction is assumed lost.
    let stale = pdb(spec, json!({"a": "2026-12-04T09:58:00Z"}));
    assert_eq!(
        summary(&decide(&stale, &[&a, &b], None, now())),
        (2, 1, 2, 1, 0)
    );
}
