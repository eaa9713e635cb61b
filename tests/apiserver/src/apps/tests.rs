use serde_json::{Value, json};

use super::*;
use crate::{resources, store::Store};

fn deployments() -> &'static ResourceDef {
    resources::find("apps", "v1", "deployments").unwrap()
}

fn deployment(selector: Value, labels: Value) -> Value {
    json!({
        "metadata": {"name": "web"},
        "spec": {
            "selector": selector,
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "busybox:1"}]},
            },
        },
    })
}

#[test]
fn creation_defaults_like_upstream() {
    let store = Store::new(100);
    let mut inner = store.lock();
    semantics::bootstrap(&mut inner);
    let d = deployment(
        json!({"matchLabels": {"app": "web"}}),
        json!({"app": "web"}),
    );
    let created = semantics::create(&mut inner, deployments(), "default", d).unwrap();
    let spec = &created["spec"];
    assert_eq!(spec["replicas"], 1);
    assert_eq!(spec["revisionHistoryLimit"], 10);
    assert_eq!(spec["progressDeadlineSeconds"], 600);
    assert_eq!(
        spec["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
    );
    let pod = &spec["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Always");
    assert_eq!(pod["containers"][0]["imagePullPolicy"], "IfNotPresent");
    assert!(
        pod.get("priority").is_none(),
        "admission sets it on pods only"
    );
    assert_eq!(created["metadata"]["generation"], 1);
    assert_eq!(created["status"], json!({}));

    let ds = resources::find("apps", "v1", "daemonsets").unwrap();
    let mut d = deployment(json!({"matchLabels": {"app": "a"}}), json!({"app": "a"}));
    d["metadata"]["name"] = json!("agent");
    let created = semantics::create(&mut inner, ds, "default", d).unwrap();
    assert_eq!(
        created["spec"]["updateStrategy"]["rollingUpdate"],
        json!({"maxUnavailable": 1, "maxSurge": 0})
    );
    assert!(created["spec"].get("replicas").is_none());
}

#[test]
fn invalid_workloads_name_the_field() {
    let res = deployments();
    let cases = [
        (
            deployment(Value::Null, json!({"app": "web"})),
            "spec.selector",
        ),
        (
            deployment(json!({}), json!({"app": "web"})),
            "spec.selector",
        ),
        (
            deployment(json!({"matchLabels": {"app": "web"}}), json!({"app": "db"})),
            "spec.template.metadata.labels",
        ),
        (
            deployment(
                json!({"matchExpressions": [{"key": "app", "operator": "Maybe"}]}),
                json!({"app": "web"}),
            ),
            "spec.selector",
        ),
    ];
    for (obj, field) in cases {
        let e = validate(res, "web", &obj, None).unwrap_err();
        assert_eq!(e.code(), 422);
        assert_eq!(e.status()["details"]["causes"][0]["field"], field, "{e}");
    }
    let ok = deployment(
        json!({"matchLabels": {"app": "web"}}),
        json!({"app": "web", "v": "2"}),
    );
    validate(res, "web", &ok, None).unwrap();
    let mut moved = ok.clone();
    moved["spec"]["selector"] = json!({"matchLabels": {"v": "2"}});
    let e = validate(res, "web", &moved, Some(&ok)).unwrap_err();
    assert!(e.to_string().contains("field is immutable"), "{e}");
}

#[test]
fn scale_reads_and_writes_replicas() {
    let store = Store::new(100);
    let mut inner = store.lock();
    semantics::bootstrap(&mut inner);
    let d = deployment(
        json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]}),
        json!({"app": "web", "tier": "front"}),
    );
    let created = semantics::create(&mut inner, deployments(), "default", d).unwrap();
    let scale = scale_of(&created);
    assert_eq!(scale["spec"]["replicas"], 1);
    assert_eq!(scale["status"]["selector"], "app=web,tier notin (db)");

    let patch = json!({"spec": {"replicas": 5}});
    let write = ScaleWrite::Patch(PatchType::Merge, &patch);
    let scaled = write_scale(&mut inner, deployments(), "default", "web", write).unwrap();
    assert_eq!(scaled["spec"]["replicas"], 5);
    let d = inner
        .get(deployments(), "default", "web")
        .unwrap()
        .into_owned();
    assert_eq!(
        (
            d["spec"]["replicas"].as_i64(),
            d["metadata"]["generation"].as_i64()
        ),
        (Some(5), Some(2))
    );

    let stale = json!({"metadata": {"resourceVersion": "1"}, "spec": {"replicas": 2}});
    let e = write_scale(
        &mut inner,
        deployments(),
        "default",
        "web",
        ScaleWrite::Replace(&stale),
    )
    .unwrap_err();
    assert_eq!(e.code(), 409, "a stale resourceVersion is a conflict");
    let negative = json!({"spec": {"replicas": -1}});
    let e = write_scale(
        &mut inner,
        deployments(),
        "default",
        "web",
        ScaleWrite::Replace(&negative),
    )
    .unwrap_err();
    assert_eq!(e.code(), 422);
}
