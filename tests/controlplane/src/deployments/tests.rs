use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use serde_json::{Value, json};

use super::*;

fn deployment(replicas: i32, image: &str, strategy: Value) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "d-uid", "generation": 2},
        "spec": {
            "replicas": replicas,
            "revisionHistoryLimit": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": strategy,
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "c", "image": image}]}},
        },
    }))
    .unwrap()
}

fn rolling() -> Value {
    json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}})
}

/// The ReplicaSet the controller would make for `d`, at `replicas`, all
/// of them available.
fn rs_of(d: &Deployment, replicas: i32, available: i32, revision: i64) -> ReplicaSet {
    let mut rs = new_replica_set(d, replicas, revision, replicas);
    rs.metadata.uid = Some(format!("rs-{revision}"));
    rs.status = Some(
        serde_json::from_value(json!({
            "replicas": replicas, "readyReplicas": available, "availableReplicas": available,
        }))
        .unwrap(),
    );
    rs
}

#[test]
fn a_new_deployment_gets_its_replica_set() {
    let d = deployment(3, "a:1", rolling());
    let out = decide(&d, &[]);
    let rs = out.create.expect("created");
    let hash = template_hash(&d.spec.as_ref().unwrap().template);
    assert_eq!(
        rs.metadata.name.as_deref(),
        Some(format!("web-{hash}").as_str())
    );
    assert!(
        hash.bytes()
            .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)),
        "{hash}"
    );
    let spec = rs.spec.unwrap();
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(spec.selector.match_labels.unwrap()[HASH_LABEL], hash);
    assert_eq!(
        spec.template.unwrap().metadata.unwrap().labels.unwrap()[HASH_LABEL],
        hash
    );
    assert_eq!(rs.metadata.annotations.unwrap()[REVISION], "1");
    assert_eq!(rs.metadata.owner_references.unwrap()[0].uid, "d-uid");
}

#[test]
fn scaling_sets_the_new_replica_set() {
    let d = deployment(5, "a:1", rolling());
    let current = rs_of(&deployment(3, "a:1", rolling()), 3, 3, 1);
    let out = decide(&d, &[&current]);
    assert_eq!(out.create, None);
    assert_eq!(out.scale, [(current.metadata.name.clone().unwrap(), 5)]);
    let down = decide(&deployment(1, "a:1", rolling()), &[&current]);
    assert_eq!(down.scale, [(current.metadata.name.clone().unwrap(), 1)]);
}

#[test]
fn a_rolling_update_stays_within_surge_and_unavailability() {
    let v1 = rs_of(&deployment(4, "a:1", rolling()), 4, 4, 1);
    let d = deployment(4, "a:2", rolling());
    // Surge 1 (25% of 4): the new ReplicaSet starts at 1, the old keeps 4.
    let first = decide(&d, &[&v1]);
    let new = first.create.expect("new template, new ReplicaSet");
    assert_eq!(new.spec.as_ref().unwrap().replicas, Some(1));
    assert_eq!(new.metadata.annotations.as_ref().unwrap()[REVISION], "2");
    assert!(first.scale.is_empty());

    // Its pod not yet available: one old pod may go (maxUnavailable 1).
    let mut v2 = new.clone();
    v2.metadata.uid = Some("rs-2".into());
    v2.status =
        Some(serde_json::from_value(json!({"replicas": 1, "availableReplicas": 0})).unwrap());
    let second = decide(&d, &[&v1, &v2]);
    assert_eq!(second.scale, [(v1.metadata.name.clone().unwrap(), 3)]);

    // With 3 old and 1 new all available, the new one grows by the surge.
    let mut v1b = v1.clone();
    v1b.spec.as_mut().unwrap().replicas = Some(3);
    v1b.status =
        Some(serde_json::from_value(json!({"replicas": 3, "availableReplicas": 3})).unwrap());
    v2.status =
        Some(serde_json::from_value(json!({"replicas": 1, "availableReplicas": 1})).unwrap());
    let third = decide(&d, &[&v1b, &v2]);
    assert_eq!(third.scale, [(v2.metadata.name.clone().unwrap(), 2)]);
    assert_eq!(third.status.updated, 1);
    assert!(third.status.minimum_available);
    assert_eq!(third.status.progress, "ReplicaSetUpdated");
}

#[test]
fn recreate_empties_the_old_before_the_new_grows() {
    let recreate = json!({"type": "Recreate"});
    let v1 = rs_of(&deployment(3, "a:1", recreate.clone()), 3, 3, 1);
    let d = deployment(3, "a:2", recreate);
    let first = decide(&d, &[&v1]);
    assert_eq!(first.create.unwrap().spec.unwrap().replicas, Some(0));
    let mut v2 = new_replica_set(&d, 0, 2, 0);
    v2.metadata.uid = Some("rs-2".into());
    assert_eq!(
        decide(&d, &[&v1, &v2]).scale,
        [(v1.metadata.name.clone().unwrap(), 0)]
    );
    let mut gone = v1.clone();
    gone.spec.as_mut().unwrap().replicas = Some(0);
    gone.status = Some(serde_json::from_value(json!({"replicas": 0})).unwrap());
    assert_eq!(
        decide(&d, &[&gone, &v2]).scale,
        [(v2.metadata.name.clone().unwrap(), 3)]
    );
}

#[test]
fn old_replica_sets_beyond_the_history_limit_go() {
    let d = deployment(2, "a:4", rolling());
    let empty = |image: &str, rev: i64| {
        let mut rs = rs_of(&deployment(2, image, rolling()), 0, 0, rev);
        rs.metadata.name = Some(format!("web-{rev}"));
        rs
    };
    let (r1, r2, r3) = (empty("a:1", 1), empty("a:2", 2), empty("a:3", 3));
    let current = rs_of(&d, 2, 2, 4);
    let out = decide(&d, &[&r3, &r1, &current, &r2]);
    assert_eq!(
        out.delete,
        ["web-1", "web-2"],
        "limit 1: the newest old one stays"
    );
    assert_eq!(out.status.progress, "NewReplicaSetAvailable");
    assert_eq!(
        (
            out.status.replicas,
            out.status.available,
            out.status.observed_generation
        ),
        (2, 2, 2)
    );
}

#[test]
fn percentages_round_like_upstream() {
    let pct = |s: &str| Some(IntOrString::String(s.into()));
    assert_eq!(
        resolve(pct("25%").as_ref(), 3, 25, true),
        1,
        "surge rounds up"
    );
    assert_eq!(
        resolve(pct("25%").as_ref(), 3, 25, false),
        0,
        "unavailable rounds down"
    );
    assert_eq!(resolve(Some(&IntOrString::Int(2)), 3, 25, false), 2);
    assert_eq!(resolve(None, 10, 25, true), 3);
}
