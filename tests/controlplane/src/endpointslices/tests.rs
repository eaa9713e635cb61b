use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
};
use serde_json::{Value, json};

use super::*;
use crate::testing::merge;

fn service(extra: Value) -> Service {
    let mut s = json!({
        "metadata": {"name": "web", "namespace": "default", "uid": "svc-uid", "labels": {"team": "a"}},
        "spec": {"selector": {"app": "web"}, "ports": [
            {"name": "http", "port": 80, "targetPort": "http"},
            {"name": "metrics", "port": 9090, "targetPort": 9090, "appProtocol": "http"},
        ]},
    });
    merge(&mut s, extra);
    serde_json::from_value(s).unwrap()
}

fn pod(name: &str, ip: &str, ready: bool, extra: Value) -> Pod {
    let mut p = json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("{name}-uid"), "labels": {"app": "web"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i",
            "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": ip,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
    });
    merge(&mut p, extra);
    serde_json::from_value(p).unwrap()
}

fn zones() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("n1".into(), "zone-a".into()),
        ("n2".into(), "zone-b".into()),
    ])
}

/// (address, ready, serving, terminating) of each endpoint, per slice.
fn summary(contents: &[Content]) -> Vec<Vec<(String, bool, bool, bool)>> {
    contents
        .iter()
        .map(|c| {
            c.endpoints
                .iter()
                .map(|e| {
                    let cond = e.conditions.clone().unwrap_or_default();
                    (
                        e.addresses[0].clone(),
                        cond.ready.unwrap_or(false),
                        cond.serving.unwrap_or(false),
                        cond.terminating.unwrap_or(false),
                    )
                })
                .collect()
        })
        .collect()
}

#[test]
fn endpoint_conditions_follow_upstream() {
    let svc = service(json!({}));
    let deleting = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}});
    /// (address, ready, serving, terminating) per endpoint, per slice.
    type Want = Vec<Vec<(&'static str, bool, bool, bool)>>;
    let cases: Vec<(&str, Pod, Want)> = vec![
        (
            "ready",
            pod("a", "10.0.0.1", true, json!({})),
            vec![vec![("10.0.0.1", true, true, false)]],
        ),
        (
            "not ready",
            pod("a", "10.0.0.1", false, json!({})),
            vec![vec![("10.0.0.1", false, false, false)]],
        ),
        (
            "terminating, still serving",
            pod("a", "10.0.0.1", true, deleting.clone()),
            vec![vec![("10.0.0.1", false, true, true)]],
        ),
        (
            "no IP yet: placeholder only",
            pod("a", "", true, json!({})),
            vec![vec![]],
        ),
        (
            "finished for good (restartPolicy Never)",
            pod(
                "a",
                "10.0.0.1",
                false,
                json!({"spec": {"restartPolicy": "Never"}, "status": {"phase": "Succeeded"}}),
            ),
            vec![vec![]],
        ),
        (
            "failed but restarting (Always) keeps its address",
            pod(
                "a",
                "10.0.0.1",
                false,
                json!({"status": {"phase": "Failed"}}),
            ),
            vec![vec![("10.0.0.1", false, false, false)]],
        ),
    ];
    for (what, p, want) in cases {
        let got = summary(&desired(&svc, &[&p], &zones()));
        let want: Vec<Vec<(String, bool, bool, bool)>> = want
            .into_iter()
            .map(|s| {
                s.into_iter()
                    .map(|(a, r, s, t)| (a.to_string(), r, s, t))
                    .collect()
            })
            .collect();
        assert_eq!(got, want, "{what}");
    }
    let publish = service(json!({"spec": {"publishNotReadyAddresses": true}}));
    let got = summary(&desired(
        &publish,
        &[&pod("a", "10.0.0.1", false, deleting)],
        &zones(),
    ));
    assert_eq!(
        got,
        vec![vec![("10.0.0.1".to_string(), true, true, true)]],
        "publishNotReadyAddresses"
    );
}

#[test]
fn named_ports_resolve_per_pod_and_group_slices() {
    let svc = service(json!({}));
    let a = pod("a", "10.0.0.1", true, json!({}));
    let other_port = json!({"spec": {"containers": [{"name": "c", "image": "i",
        "ports": [{"name": "http", "containerPort": 8081}]}]}});
    let b = pod("b", "10.0.0.2", true, other_port);
    let no_name = json!({"spec": {"containers": [{"name": "c", "image": "i"}]}});
    let c = pod("c", "10.0.0.3", true, no_name);
    let got = desired(&svc, &[&a, &b, &c], &zones());
    let ports: Vec<Vec<(Option<String>, Option<i32>)>> = got
        .iter()
        .map(|c| c.ports.iter().map(|p| (p.name.clone(), p.port)).collect())
        .collect();
    // Grouped by resolved ports; a pod without the named port keeps the rest.
    assert_eq!(
        ports,
        vec![
            vec![
                (Some("http".into()), Some(8080)),
                (Some("metrics".into()), Some(9090))
            ],
            vec![
                (Some("http".into()), Some(8081)),
                (Some("metrics".into()), Some(9090))
            ],
            vec![(Some("metrics".into()), Some(9090))],
        ]
    );
    assert_eq!(got[0].ports[1].app_protocol.as_deref(), Some("http"));
    assert_eq!(got[0].ports[0].protocol.as_deref(), Some("TCP"));
    let e = &got[0].endpoints[0];
    assert_eq!(
        (e.node_name.as_deref(), e.zone.as_deref()),
        (Some("n1"), Some("zone-a"))
    );
    assert_eq!(
        e.target_ref.as_ref().and_then(|r| r.uid.as_deref()),
        Some("a-uid")
    );
    assert!(e.hints.is_none(), "no trafficDistribution, no hints");
}

#[test]
fn a_hundred_endpoints_per_slice_and_zone_hints() {
    let svc = service(json!({"spec": {"trafficDistribution": "PreferClose"}}));
    let pods: Vec<Pod> = (0..250)
        .map(|i| {
            pod(
                &format!("p{i}"),
                &format!("10.0.{}.{}", i / 200, i % 200 + 1),
                true,
                json!({}),
            )
        })
        .collect();
    let refs: Vec<&Pod> = pods.iter().collect();
    let got = desired(&svc, &refs, &zones());
    assert_eq!(
        got.iter().map(|c| c.endpoints.len()).collect::<Vec<_>>(),
        [100, 100, 50]
    );
    let hint = got[0].endpoints[0]
        .hints
        .as_ref()
        .and_then(|h| h.for_zones.clone());
    assert_eq!(hint.unwrap()[0].name, "zone-a");

    // One endpoint without a zone: no hints at all, as upstream.
    let mut unknown = pod("x", "10.1.0.1", true, json!({}));
    unknown.spec.as_mut().unwrap().node_name = Some("n9".into());
    let mut refs = refs;
    refs.push(&unknown);
    assert!(
        desired(&svc, &refs, &zones())
            .iter()
            .flat_map(|c| &c.endpoints)
            .all(|e| e.hints.is_none())
    );
}

fn existing(name: &str, svc: &Service, content: Content) -> EndpointSlice {
    let mut s = new_slice(svc, &labels(svc), content, "t0");
    s.metadata.name = Some(name.into());
    s.metadata.generate_name = None;
    s.metadata.resource_version = Some("7".into());
    s
}

fn kinds(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .map(|a| match a {
            Action::Create(s) => format!("create {}", s.endpoints.len()),
            Action::Update(s) => format!(
                "update {} {}",
                s.metadata.name.as_deref().unwrap(),
                s.endpoints.len()
            ),
            Action::Delete(n) => format!("delete {n}"),
        })
        .collect()
}

#[test]
fn plans_touch_only_what_changed() {
    let svc = service(json!({}));
    let a = pod("a", "10.0.0.1", true, json!({}));
    let b = pod("b", "10.0.0.2", true, json!({}));
    let one = desired(&svc, &[&a], &zones());
    let two = desired(&svc, &[&a, &b], &zones());
    let s1 = existing("web-1", &svc, one[0].clone());

    assert_eq!(kinds(&plan(&svc, &[], one.clone(), "t1")), ["create 1"]);
    assert!(
        plan(&svc, &[&s1], one.clone(), "t1").is_empty(),
        "in sync: no writes"
    );
    let update = plan(&svc, &[&s1], two.clone(), "t1");
    assert_eq!(kinds(&update), ["update web-1 2"]);
    let Action::Update(s) = &update[0] else {
        unreachable!()
    };
    assert_eq!(
        s.metadata.resource_version.as_deref(),
        Some("7"),
        "a precondition"
    );
    assert_eq!(s.metadata.annotations.as_ref().unwrap()[TRIGGER_TIME], "t1");

    let s2 = existing("web-2", &svc, two[0].clone());
    assert_eq!(
        kinds(&plan(&svc, &[&s1, &s2], two.clone(), "t1")),
        ["delete web-1"]
    );
    let placeholder = desired(&svc, &[], &zones());
    assert_eq!(
        kinds(&plan(&svc, &[&s1, &s2], placeholder, "t1")),
        ["update web-1 0", "delete web-2"]
    );

    // The Service's labels follow it.
    let relabelled = service(json!({"metadata": {"labels": {"team": "b"}}}));
    assert_eq!(
        kinds(&plan(&relabelled, &[&s1], one, "t1")),
        ["update web-1 1"]
    );
}

#[test]
fn new_slices_name_and_own_like_upstreams() {
    let svc = service(json!({"spec": {"clusterIP": "None"}}));
    let Action::Create(s) = plan(&svc, &[], desired(&svc, &[], &zones()), "t1").remove(0) else {
        panic!("a create")
    };
    assert_eq!(s.metadata.generate_name.as_deref(), Some("web-"));
    assert_eq!(s.address_type, "IPv4");
    let l = s.metadata.labels.unwrap();
    assert_eq!(l[SERVICE_NAME_LABEL], "web");
    assert_eq!(l[MANAGED_BY_LABEL], MANAGED_BY);
    assert_eq!(l["team"], "a");
    assert_eq!(l["service.kubernetes.io/headless"], "");
    let owner = &s.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
        ("Service", "svc-uid", Some(true))
    );
}
