use serde_json::{Value, json};

use super::*;
use crate::store::Store;

fn pod(phase: &str, ready: bool, labels: Value) -> Value {
    json!({
        "metadata": {"name": "p", "namespace": "default", "labels": labels},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
    })
}

fn pdb(name: &str, selector: Value, status: Value) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "default", "generation": 1},
        "spec": {"minAvailable": 1, "selector": selector},
        "status": status,
    })
}

fn observed(allowed: i64, current: i64, desired: i64) -> Value {
    json!({"observedGeneration": 1, "disruptionsAllowed": allowed,
           "currentHealthy": current, "desiredHealthy": desired, "expectedPods": 2})
}

/// `(code, cause)` of a refusal, `(201, "delete"|"spend")` otherwise.
fn outcome(v: Verdict) -> (u16, String) {
    match v {
        Verdict::Delete => (201, "delete".into()),
        Verdict::Spend(name) => (201, format!("spend {name}")),
        Verdict::Refuse(e) => {
            let s = e.status();
            let cause = s["details"]["causes"][0]["message"]
                .as_str()
                .map(String::from)
                .unwrap_or_else(|| s["message"].as_str().unwrap_or_default().to_string());
            (e.code(), cause)
        }
    }
}

#[test]
fn decisions_follow_upstreams_order() {
    let app = json!({"app": "web"});
    let web = json!({"matchLabels": {"app": "web"}});
    let cases: Vec<(&str, Value, Vec<Value>, u16, &str)> = vec![
        (
            "no budget",
            pod("Running", true, app.clone()),
            vec![],
            201,
            "delete",
        ),
        (
            "a budget for other pods",
            pod("Running", true, app.clone()),
            vec![pdb(
                "db",
                json!({"matchLabels": {"app": "db"}}),
                observed(0, 1, 1),
            )],
            201,
            "delete",
        ),
        (
            "an empty selector selects nothing here",
            pod("Running", true, app.clone()),
            vec![pdb("all", json!({}), observed(0, 1, 1))],
            201,
            "delete",
        ),
        (
            "allowed: spends the budget",
            pod("Running", true, app.clone()),
            vec![pdb("web", web.clone(), observed(1, 2, 1))],
            201,
            "spend web",
        ),
        (
            "matchExpressions select too",
            pod("Running", true, app.clone()),
            vec![pdb(
                "web",
                json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "x"]}]}),
                observed(1, 2, 1),
            )],
            201,
            "spend web",
        ),
        (
            "nothing left: 429 with the budget's numbers",
            pod("Running", true, app.clone()),
            vec![pdb("web", web.clone(), observed(0, 1, 1))],
            429,
            "The disruption budget web needs 1 healthy pods and has 1 currently",
        ),
        (
            "not yet observed by the controller",
            pod("Running", true, app.clone()),
            vec![pdb("web", web.clone(), json!({"disruptionsAllowed": 5}))],
            429,
            "The disruption budget web is still being processed by the server.",
        ),
        (
            "negative allowance",
            pod("Running", true, app.clone()),
            vec![pdb("web", web.clone(), observed(-1, 0, 1))],
            403,
            "poddisruptionbudget.policy \"web\" is forbidden: pdb disruptions allowed is negative",
        ),
        (
            "two budgets",
            pod("Running", true, app.clone()),
            vec![
                pdb("a", web.clone(), observed(1, 2, 1)),
                pdb("b", web.clone(), observed(1, 2, 1)),
            ],
            500,
            "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
        ),
        (
            "pending pods cost nothing",
            pod("Pending", false, app.clone()),
            vec![pdb("web", web.clone(), observed(0, 1, 1))],
            201,
            "delete",
        ),
        (
            "finished pods cost nothing",
            pod("Succeeded", false, app.clone()),
            vec![pdb("web", web.clone(), observed(0, 1, 1))],
            201,
            "delete",
        ),
        (
            "unready while the budget is met (IfHealthyBudget)",
            pod("Running", false, app.clone()),
            vec![pdb("web", web.clone(), observed(0, 1, 1))],
            201,
            "delete",
        ),
        (
            "unready while the budget is not met",
            pod("Running", false, app.clone()),
            vec![pdb("web", web.clone(), observed(0, 0, 1))],
            429,
            "The disruption budget web needs 1 healthy pods and has 0 currently",
        ),
        (
            "unready with AlwaysAllow",
            pod("Running", false, app.clone()),
            vec![{
                let mut p = pdb("web", web.clone(), observed(0, 0, 1));
                p["spec"]["unhealthyPodEvictionPolicy"] = json!("AlwaysAllow");
                p
            }],
            201,
            "delete",
        ),
    ];
    for (what, pod, pdbs, code, cause) in cases {
        assert_eq!(
            outcome(decide(&pod, &pdbs)),
            (code, cause.to_string()),
            "{what}"
        );
    }
}

fn store_with(pods_ready: &[&str], budget: Option<Value>) -> Store {
    let store = Store::new(100);
    let mut inner = store.lock();
    semantics::bootstrap(&mut inner);
    let pods = resources::find("", "v1", "pods").unwrap();
    for name in pods_ready {
        let mut p = pod("Running", true, json!({"app": "web"}));
        p["metadata"]["name"] = json!(name);
        let status = p["status"].clone();
        let created = semantics::create(&mut inner, pods, "default", p).unwrap();
        let mut running = created.clone();
        running["status"] = status;
        semantics::update(&mut inner, pods, "default", name, running, true).unwrap();
    }
    if let Some(b) = budget {
        let res = budgets();
        let name = b["metadata"]["name"].as_str().unwrap().to_string();
        let status = b["status"].clone();
        let mut created = semantics::create(&mut inner, res, "default", b).unwrap();
        created["status"] = status;
        semantics::update(&mut inner, res, "default", &name, created, true).unwrap();
    }
    drop(inner);
    store
}

fn eviction(name: &str) -> Value {
    json!({"apiVersion": "policy/v1", "kind": "Eviction",
           "metadata": {"name": name, "namespace": "default"},
           "deleteOptions": {"gracePeriodSeconds": 0}})
}

#[test]
fn an_eviction_spends_the_budget_once_then_is_refused() {
    let budget = pdb(
        "web",
        json!({"matchLabels": {"app": "web"}}),
        observed(1, 2, 1),
    );
    let store = store_with(&["a", "b"], Some(budget));
    let mut inner = store.lock();
    let pods = resources::find("", "v1", "pods").unwrap();

    let ok = evict(&mut inner, pods, "default", "a", &eviction("a")).unwrap();
    assert_eq!(
        (ok["status"].as_str(), ok["code"].as_i64()),
        (Some("Success"), Some(201))
    );
    assert!(inner.get(pods, "default", "a").is_none(), "grace 0: gone");
    let b = inner.get(budgets(), "default", "web").unwrap().into_owned();
    assert_eq!(b["status"]["disruptionsAllowed"], 0);
    assert!(b["status"]["disruptedPods"]["a"].is_string(), "{b}");
    assert_eq!(b["status"]["conditions"][0]["reason"], "InsufficientPods");

    let e = evict(&mut inner, pods, "default", "b", &eviction("b")).unwrap_err();
    assert_eq!(e.code(), 429);
    assert_eq!(
        e.status()["details"]["causes"][0]["reason"],
        "DisruptionBudget"
    );
    assert!(
        inner.get(pods, "default", "b").is_some(),
        "a refused eviction deletes nothing"
    );
}

#[test]
fn a_graceful_eviction_marks_the_pod_a_disruption_target() {
    let store = store_with(&["a"], None);
    let mut inner = store.lock();
    let pods = resources::find("", "v1", "pods").unwrap();
    let mut body = eviction("a");
    body["deleteOptions"] = json!({});
    evict(&mut inner, pods, "default", "a", &body).unwrap();
    let p = inner.get(pods, "default", "a").unwrap().into_owned();
    assert!(p["metadata"]["deletionTimestamp"].is_string(), "{p}");
    let target = p["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "DisruptionTarget")
        .cloned()
        .unwrap_or_else(|| panic!("{p}"));
    assert_eq!(target["reason"], "EvictionByEvictionAPI");
}

#[test]
fn bad_evictions_are_refused_before_anything_changes() {
    let budget = pdb(
        "web",
        json!({"matchLabels": {"app": "web"}}),
        observed(1, 2, 1),
    );
    let store = store_with(&["a"], Some(budget));
    let mut inner = store.lock();
    let pods = resources::find("", "v1", "pods").unwrap();
    let e = evict(&mut inner, pods, "default", "a", &eviction("other")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "name in URL does not match name in Eviction object"
    );
    let mut stale = eviction("a");
    stale["deleteOptions"]["preconditions"] = json!({"uid": "not-the-pod"});
    assert_eq!(
        evict(&mut inner, pods, "default", "a", &stale)
            .unwrap_err()
            .code(),
        409
    );
    assert_eq!(
        evict(&mut inner, pods, "default", "nope", &eviction("nope"))
            .unwrap_err()
            .code(),
        404
    );
    let b = inner.get(budgets(), "default", "web").unwrap();
    assert_eq!(
        b["status"]["disruptionsAllowed"], 1,
        "the budget is untouched"
    );
}

#[test]
fn budgets_are_validated_and_start_unobserved() {
    let store = store_with(&[], None);
    let mut inner = store.lock();
    let both = json!({"metadata": {"name": "x"}, "spec": {"minAvailable": 1, "maxUnavailable": 1, "selector": {}}});
    let e = semantics::create(&mut inner, budgets(), "default", both).unwrap_err();
    assert_eq!(e.code(), 422);
    assert!(
        e.to_string()
            .contains("minAvailable and maxUnavailable cannot be both set"),
        "{e}"
    );
    let bad_op = json!({"metadata": {"name": "y"}, "spec": {"minAvailable": 1,
        "selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}}});
    let e = semantics::create(&mut inner, budgets(), "default", bad_op).unwrap_err();
    assert!(e.to_string().contains("spec.selector"), "{e}");
    let ok = json!({"metadata": {"name": "z"}, "spec": {"maxUnavailable": "50%", "selector": {}}});
    let created = semantics::create(&mut inner, budgets(), "default", ok).unwrap();
    assert_eq!(created["status"]["disruptionsAllowed"], 0);
    assert_eq!(created["metadata"]["generation"], 1);
    assert!(created["status"]["observedGeneration"].is_null());
}
