use k8s_openapi::{
    api::{apps::v1::ReplicaSet, core::v1::Pod},
    jiff::Timestamp,
};
use serde_json::{Value, json};

use super::*;

fn rs(replicas: i32) -> ReplicaSet {
    serde_json::from_value(json!({
        "metadata": {"name": "web-abc", "namespace": "default", "uid": "rs-uid", "generation": 3},
        "spec": {
            "replicas": replicas,
            "minReadySeconds": 10,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web", "v": "1"}},
                         "spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    }))
    .unwrap()
}

/// `state`: "unscheduled", "pending", "running", "ready:<ready since>".
fn pod(name: &str, owner: Option<&str>, state: &str, created: &str) -> Pod {
    let mut p = json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web", "v": "1"},
                     "creationTimestamp": created},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Pending"},
    });
    if let Some(uid) = owner {
        p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "name": "x", "uid": uid, "controller": true}]);
    }
    if state != "unscheduled" {
        p["spec"]["nodeName"] = json!("n1");
    }
    if state == "running" || state.starts_with("ready") {
        p["status"]["phase"] = json!("Running");
    }
    if let Some(since) = state.strip_prefix("ready:") {
        p["status"]["conditions"] =
            json!([{"type": "Ready", "status": "True", "lastTransitionTime": since}]);
    }
    serde_json::from_value(p).unwrap()
}

fn now() -> Timestamp {
    "2026-12-04T10:00:00Z".parse().unwrap()
}

#[test]
fn creates_the_missing_and_adopts_orphans() {
    let mine = pod("a", Some("rs-uid"), "running", "2026-12-04T09:00:00Z");
    let orphan = pod("b", None, "running", "2026-12-04T09:00:00Z");
    let others = pod("c", Some("other"), "running", "2026-12-04T09:00:00Z");
    let mut unlabelled = pod("d", None, "running", "2026-12-04T09:00:00Z");
    unlabelled.metadata.labels = None;
    let d = decide(&rs(4), &[&mine, &orphan, &others, &unlabelled], now());
    assert_eq!(d.adopt, ["b"]);
    assert_eq!(d.create, 2);
    assert!(d.delete.is_empty());
    assert_eq!(d.status.replicas, 2);
}

#[test]
fn deletes_the_least_valuable_first() {
    let pods = [
        pod(
            "ready-old",
            Some("rs-uid"),
            "ready:2026-12-04T09:00:00Z",
            "2026-12-04T08:00:00Z",
        ),
        pod(
            "ready-new",
            Some("rs-uid"),
            "ready:2026-12-04T09:59:00Z",
            "2026-12-04T08:00:00Z",
        ),
        pod("running", Some("rs-uid"), "running", "2026-12-04T08:00:00Z"),
        pod("pending", Some("rs-uid"), "pending", "2026-12-04T08:00:00Z"),
        pod(
            "unscheduled",
            Some("rs-uid"),
            "unscheduled",
            "2026-12-04T08:00:00Z",
        ),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    let d = decide(&rs(1), &refs, now());
    assert_eq!(d.delete, ["unscheduled", "pending", "running", "ready-new"]);
    assert_eq!(d.create, 0);
}

#[test]
fn status_counts_ready_and_available_after_min_ready_seconds() {
    let pods = [
        pod(
            "a",
            Some("rs-uid"),
            "ready:2026-12-04T09:59:00Z",
            "2026-12-04T09:00:00Z",
        ),
        pod(
            "b",
            Some("rs-uid"),
            "ready:2026-12-04T09:59:55Z",
            "2026-12-04T09:00:00Z",
        ),
        pod("c", Some("rs-uid"), "running", "2026-12-04T09:00:00Z"),
    ];
    let refs: Vec<&Pod> = pods.iter().collect();
    let d = decide(&rs(3), &refs, now());
    assert_eq!(
        d.status,
        Status {
            replicas: 3,
            fully_labeled: 3,
            ready: 2,
            available: 1,
            observed_generation: 3
        }
    );
}

#[test]
fn deleting_and_finished_pods_do_not_count() {
    let mut going = pod("a", Some("rs-uid"), "running", "2026-12-04T09:00:00Z");
    going.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    let mut done = pod("b", Some("rs-uid"), "running", "2026-12-04T09:00:00Z");
    done.status.as_mut().unwrap().phase = Some("Failed".into());
    let d = decide(&rs(2), &[&going, &done], now());
    assert_eq!((d.create, d.status.replicas), (2, 0));
}

#[test]
fn new_pods_come_from_the_template_with_an_owner() {
    let p = pod_for(&rs(1));
    let v: Value = serde_json::to_value(&p).unwrap();
    assert_eq!(v["metadata"]["generateName"], "web-abc-");
    assert_eq!(v["metadata"]["labels"], json!({"app": "web", "v": "1"}));
    assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "rs-uid");
    assert_eq!(v["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(v["spec"]["containers"][0]["image"], "i");
}
