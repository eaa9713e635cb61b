//! The server through kube-rs's own `Api` calls: CRUD, concurrency, patches,
//! subresources, selectors, pagination, authentication and deletion semantics.
use std::collections::BTreeMap;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use kube::{
    Api, Client,
    api::{
        DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
        WatchParams,
    },
};
use serde_json::json;
mod common;

use common::{cm, code, start};

#[tokio::test]
async fn configmap_crud_with_conflicts_and_preconditions() {
    let (_server, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let created = api
        .create(&PostParams::default(), &cm("a", "v", &[]))
        .await
        .unwrap();
    let rv1: u64 = created
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    assert_eq!(
        code(
            api.create(&PostParams::default(), &cm("a", "v", &[]))
                .await
                .unwrap_err()
        ),
        409
    );

    let mut stale = api.get("a").await.unwrap();
    let mut fresh = stale.clone();
    fresh.data = Some(BTreeMap::from([("k".into(), "v2".into())]));
    let replaced = api
        .replace("a", &PostParams::default(), &fresh)
        .await
        .unwrap();
    let rv2: u64 = replaced
        .metadata
        .resource_version
        .clone()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv1);
    stale.data = Some(BTreeMap::from([("k".into(), "v3".into())]));
    let err = api
        .replace("a", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));

    // generateName
    let mut gen_cm = cm("", "v", &[]);
    gen_cm.metadata.name = None;
    gen_cm.metadata.generate_name = Some("gen-".into());
    let g = api.create(&PostParams::default(), &gen_cm).await.unwrap();
    assert!(g.metadata.name.unwrap().starts_with("gen-"));

    // A namespace that does not exist.
    let missing: Api<ConfigMap> = Api::namespaced(client.clone(), "nope");
    let err = missing
        .create(&PostParams::default(), &cm("x", "v", &[]))
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!()
    };
    assert_eq!((status.code, status.reason.as_str()), (404, "NotFound"));
    assert!(
        status.message.contains("namespaces \"nope\" not found"),
        "{}",
        status.message
    );

    // Delete with a wrong then the right UID precondition.
    let wrong = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("not-it".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    assert_eq!(code(api.delete("a", &wrong).await.unwrap_err()), 409);
    let right = DeleteParams {
        preconditions: Some(Preconditions {
            uid: replaced.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    api.delete("a", &right).await.unwrap();
    assert_eq!(code(api.get("a").await.unwrap_err()), 404);
    assert!(api.get_opt("a").await.unwrap().is_none());
}

#[tokio::test]
async fn node_status_subresource_and_cluster_scope() {
    let (_server, client) = start().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1", "labels": {"role": "worker"}},
        "spec": {"podCIDR": "10.244.0.0/24"},
        "status": {"conditions": [{"type": "Ready", "status": "False"}]}
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    // Status through /status changes only status.
    let patched = nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Strategic(json!({
                "metadata": {"labels": {"ignored": "yes"}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "MemoryPressure", "status": "False"}]}
            })),
        )
        .await
        .unwrap();
    assert!(
        !patched
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key("ignored")
    );
    let conds = patched
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap();
    assert_eq!(conds.len(), 2);
    assert_eq!(conds[0].status, "True");
    // A main-resource update ignores status.
    let mut n = nodes.get("n1").await.unwrap();
    n.status = None;
    n.spec.as_mut().unwrap().unschedulable = Some(true);
    let updated = nodes
        .replace("n1", &PostParams::default(), &n)
        .await
        .unwrap();
    assert_eq!(updated.status.unwrap().conditions.unwrap().len(), 2);
    assert_eq!(
        nodes
            .get_status("n1")
            .await
            .unwrap()
            .spec
            .unwrap()
            .unschedulable,
        Some(true)
    );
    // Field selector on a cluster-scoped kind.
    let lp = ListParams::default().fields("spec.unschedulable=true");
    assert_eq!(nodes.list(&lp).await.unwrap().items.len(), 1);

    let namespaces: Api<Namespace> = Api::all(client);
    let names: Vec<String> = namespaces
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(names.contains(&ns.to_string()), "{names:?}");
    }
}

fn pod(name: &str, node: Option<&str>) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "a", "image": "nginx:1", "env": [{"name": "X", "value": "1"}]},
                {"name": "b", "image": "busybox:1"}
            ],
            "tolerations": [{"key": "t1", "operator": "Exists"}]
        }
    }))
    .unwrap()
}

#[tokio::test]
async fn pod_patches_of_every_type() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let created = pods
        .create(&PostParams::default(), &pod("p", Some("n1")))
        .await
        .unwrap();
    assert_eq!(
        created.status.as_ref().unwrap().phase.as_deref(),
        Some("Pending")
    );
    assert_eq!(created.metadata.generation, Some(1));

    // DefaultTolerationSeconds admitted two tolerations after the pod's own.
    let mut tolerations = serde_json::to_value(created.spec.unwrap().tolerations).unwrap();
    assert_eq!(
        tolerations.as_array().unwrap()[1..],
        [
            json!({"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}),
            json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}),
        ]
    );
    // Strategic: containers merge by name, tolerations are atomic (a patch
    // lists them all; the pod may only gain tolerations).
    let dropped =
        Patch::Strategic(json!({"spec": {"tolerations": [{"key": "t1", "operator": "Exists"}]}}));
    assert_eq!(
        code(
            pods.patch("p", &PatchParams::default(), &dropped)
                .await
                .unwrap_err()
        ),
        422
    );
    let all = tolerations.as_array_mut().unwrap();
    all.push(json!({"key": "t2", "operator": "Exists"}));
    let p = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {
                "containers": [{"name": "a", "image": "nginx:2"}],
                "tolerations": tolerations,
            }})),
        )
        .await
        .unwrap();
    let spec = p.spec.unwrap();
    assert_eq!(spec.containers.len(), 2);
    assert_eq!(spec.containers[0].image.as_deref(), Some("nginx:2"));
    assert_eq!(spec.containers[0].env.as_ref().unwrap().len(), 1);
    assert_eq!(spec.containers[1].name, "b");
    assert_eq!(spec.tolerations.unwrap().len(), 4);
    assert_eq!(p.metadata.generation, Some(2));
    // Other pod spec fields are immutable, as on a real server.
    let env = Patch::Strategic(
        json!({"spec": {"containers": [{"name": "a", "env": [{"name": "Y", "value": "2"}]}]}}),
    );
    assert_eq!(
        code(
            pods.patch("p", &PatchParams::default(), &env)
                .await
                .unwrap_err()
        ),
        422
    );

    // Conditions merge by type through the status subresource.
    pods.patch_status(
        "p",
        &PatchParams::default(),
        &Patch::Strategic(json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]}})),
    )
    .await
    .unwrap();
    let p = pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            ),
        )
        .await
        .unwrap();
    let status = p.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let conds = status.conditions.unwrap();
    assert_eq!(conds.len(), 2);
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    );

    // Status written through the main resource is ignored.
    let p = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"m": "1"}}, "status": {"phase": "Failed"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(p.metadata.labels.unwrap()["m"], "1");
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Running"));

    // JSON patch, including a failing test op.
    let p = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::<()>::Json(serde_json::from_value(json!([{"op": "replace", "path": "/spec/containers/1/image", "value": "busybox:2"}])).unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(
        p.spec.unwrap().containers[1].image.as_deref(),
        Some("busybox:2")
    );
    let bad: json_patch_ops::Ops =
        serde_json::from_value(json!([{"op": "test", "path": "/metadata/name", "value": "other"}]))
            .unwrap();
    assert!(
        pods.patch("p", &PatchParams::default(), &Patch::<()>::Json(bad))
            .await
            .is_err()
    );

    // Merge patch with a stale resourceVersion conflicts.
    let stale = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": "1", "labels": {"z": "1"}}})),
        )
        .await;
    assert_eq!(code(stale.unwrap_err()), 409);

    // Server-side apply: creates when absent, merges when present.
    let ssa = PatchParams::apply("weir-test").force();
    let applied = pods
        .patch("q", &ssa, &Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q"}, "spec": {"containers": [{"name": "c", "image": "x:1"}]}})))
        .await
        .unwrap();
    assert!(applied.metadata.uid.is_some());
    let applied = pods
        .patch("q", &ssa, &Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q", "labels": {"l": "1"}}, "spec": {"containers": [{"name": "c", "image": "x:2"}]}})))
        .await
        .unwrap();
    assert_eq!(applied.metadata.labels.unwrap()["l"], "1");
    assert_eq!(
        applied.spec.unwrap().containers[0].image.as_deref(),
        Some("x:2")
    );
    // Another writer's label survives; the label this manager stops applying goes.
    pods.patch(
        "q",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"other": "1"}}})),
    )
    .await
    .unwrap();
    let applied = pods
        .patch("q", &ssa, &Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q"}, "spec": {"containers": [{"name": "c", "image": "x:2"}]}})))
        .await
        .unwrap();
    let labels = applied.metadata.labels.unwrap_or_default();
    assert!(!labels.contains_key("l"), "{labels:?}");
    assert_eq!(labels["other"], "1");
}

mod json_patch_ops {
    pub type Ops = json_patch::Patch;
}

#[tokio::test]
async fn selectors_and_pagination() {
    let (_server, client) = start().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..7 {
        let tier = if i % 2 == 0 { "fe" } else { "be" };
        api.create(
            &PostParams::default(),
            &cm(&format!("c{i}"), "v", &[("app", "web"), ("tier", tier)]),
        )
        .await
        .unwrap();
    }
    api.create(&PostParams::default(), &cm("other", "v", &[("app", "db")]))
        .await
        .unwrap();
    // Like every namespace, default also holds kube-root-ca.crt (no labels),
    // between c6 and "other".
    let count = |lp: ListParams| {
        let api = api.clone();
        async move { api.list(&lp).await.unwrap().items.len() }
    };
    assert_eq!(count(ListParams::default().labels("app=web")).await, 7);
    assert_eq!(
        count(ListParams::default().labels("app==web,tier=fe")).await,
        4
    );
    assert_eq!(count(ListParams::default().labels("tier!=fe")).await, 5);
    assert_eq!(
        count(ListParams::default().labels("tier in (fe,be)")).await,
        7
    );
    assert_eq!(
        count(ListParams::default().labels("app notin (web)")).await,
        2
    );
    assert_eq!(count(ListParams::default().labels("!tier")).await, 2);
    assert_eq!(count(ListParams::default().labels("tier")).await, 7);
    assert_eq!(
        count(ListParams::default().fields("metadata.name=c3")).await,
        1
    );
    assert_eq!(
        count(ListParams::default().fields("metadata.name!=c3,metadata.namespace=default")).await,
        8
    );
    let err = api
        .list(&ListParams::default().fields("spec.nodeName=x"))
        .await
        .unwrap_err();
    assert_eq!(code(err), 400);

    // Pages of 3 over 9 objects.
    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(3);
    let mut pages = 0;
    let mut counts = Vec::new();
    loop {
        let page = api.list(&lp).await.unwrap();
        pages += 1;
        counts.push(page.metadata.remaining_item_count);
        assert!(page.items.len() <= 3);
        names.extend(page.items.into_iter().filter_map(|c| c.metadata.name));
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    // The later pages' counts come from the first page's, as etcd's come
    // from the list's snapshot.
    assert_eq!(counts, [Some(6), Some(3), None]);
    assert_eq!(names.len(), 9);
    let mut sorted = names.clone();
    sorted.dedup();
    assert_eq!(sorted.len(), 9);
    let first = api.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(first.metadata.remaining_item_count, Some(6));
    // On the wire, as from a real server: the list has type meta, its
    // items do not.
    let raw = client
        .request_text(
            http::Request::get("/api/v1/namespaces/default/configmaps?limit=3")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .unwrap();
    let raw: serde_json::Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(
        (raw["kind"].as_str(), raw["apiVersion"].as_str()),
        (Some("ConfigMapList"), Some("v1"))
    );
    let items = raw["items"].as_array().unwrap();
    assert_eq!(items.len(), 3);
    assert!(
        items
            .iter()
            .all(|i| i.get("kind").is_none() && i.get("apiVersion").is_none()),
        "{raw}"
    );
    assert_eq!(items[0]["metadata"]["name"], "c0");
    assert_eq!(items[0]["data"]["k"], "v");

    // With a selector: pages hold only matches and the count of the rest
    // is not given. As etcd's paging, a full page continues while any key
    // follows it, matching or not, so the last page may be empty.
    let pages_of = |limit: u32| {
        let api = api.clone();
        async move {
            let mut sizes = Vec::new();
            let mut lp = ListParams::default().labels("tier").limit(limit);
            loop {
                let page = api.list(&lp).await.unwrap();
                sizes.push(page.items.len());
                assert_eq!(page.metadata.remaining_item_count, None);
                match page.metadata.continue_ {
                    Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
                    _ => break,
                }
            }
            sizes
        }
    };
    assert_eq!(pages_of(3).await, [3, 3, 1]);
    // c6 is the last object with a tier; the two after it have none.
    assert_eq!(pages_of(7).await, [7, 0]);

    // Pod field selector.
    let pods: Api<Pod> = Api::namespaced(client, "default");
    pods.create(&PostParams::default(), &pod("on-n1", Some("n1")))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("on-n2", Some("n2")))
        .await
        .unwrap();
    let on_n1 = pods
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(on_n1.items.len(), 1);
    assert_eq!(on_n1.items[0].metadata.name.as_deref(), Some("on-n1"));
}

#[tokio::test]
async fn binding_dry_run_and_metadata_views() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("p", None))
        .await
        .unwrap();
    // The scheduler's way onto a node.
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}});
    let req = http_post("/api/v1/namespaces/default/pods/p/binding", &binding);
    client.request_text(req).await.unwrap();
    assert_eq!(
        pods.get("p")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .as_deref(),
        Some("n1")
    );
    let again = http_post("/api/v1/namespaces/default/pods/p/binding", &binding);
    assert!(client.request_text(again).await.is_err());

    // dryRun writes nothing.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    pods.create(&dry, &pod("ghost", None)).await.unwrap();
    assert!(pods.get_opt("ghost").await.unwrap().is_none());
    pods.delete(
        "p",
        &DeleteParams {
            dry_run: true,
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(pods.get_opt("p").await.unwrap().is_some());

    // PartialObjectMetadata for get, list and watch.
    let meta = pods.get_metadata("p").await.unwrap();
    assert_eq!(meta.metadata.name.as_deref(), Some("p"));
    let metas = pods.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(metas.items.len(), 1);
    assert!(metas.items[0].metadata.uid.is_some());
}

fn http_post(path: &str, body: &serde_json::Value) -> http::Request<Vec<u8>> {
    http::Request::post(path)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(body).unwrap())
        .unwrap()
}

#[tokio::test]
async fn pod_graceful_deletion() {
    let (_server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    pods.create(&PostParams::default(), &pod("bound", Some("n1")))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("unbound", None))
        .await
        .unwrap();

    // A pod on a node only gets a deletionTimestamp; the kubelet finishes it.
    let first = pods
        .delete("bound", &DeleteParams::default())
        .await
        .unwrap();
    let p = first.left().expect("pending deletion returns the pod");
    assert!(p.metadata.deletion_timestamp.is_some());
    assert_eq!(p.metadata.deletion_grace_period_seconds, Some(30));
    let still = pods.get("bound").await.unwrap();
    assert!(still.metadata.deletion_timestamp.is_some());
    // A shorter grace period shortens it; a longer one does not.
    pods.delete("bound", &DeleteParams::default().grace_period(10))
        .await
        .unwrap();
    assert_eq!(
        pods.get("bound")
            .await
            .unwrap()
            .metadata
            .deletion_grace_period_seconds,
        Some(10)
    );
    pods.delete("bound", &DeleteParams::default().grace_period(20))
        .await
        .unwrap();
    assert_eq!(
        pods.get("bound")
            .await
            .unwrap()
            .metadata
            .deletion_grace_period_seconds,
        Some(10)
    );
    // A force delete: watchers see the grace period become 0, then the
    // pod go, both carrying it.
    let rv = pods
        .get("bound")
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = pods
        .watch(&WatchParams::default().fields("metadata.name=bound"), &rv)
        .await
        .unwrap()
        .boxed();
    pods.delete("bound", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(pods.get_opt("bound").await.unwrap().is_none());
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match events.try_next().await.unwrap().expect("two events") {
            WatchEvent::Modified(p) => seen.push(("MODIFIED", p)),
            WatchEvent::Deleted(p) => seen.push(("DELETED", p)),
            other => panic!("unexpected {other:?}"),
        }
    }
    for (kind, p) in &seen {
        assert!(p.metadata.deletion_timestamp.is_some(), "{kind}");
        assert_eq!(p.metadata.deletion_grace_period_seconds, Some(0), "{kind}");
    }
    assert_eq!([seen[0].0, seen[1].0], ["MODIFIED", "DELETED"]);

    // A pod on no node goes at once.
    pods.delete("unbound", &DeleteParams::default())
        .await
        .unwrap();
    assert!(pods.get_opt("unbound").await.unwrap().is_none());
}

#[tokio::test]
async fn finalizers_hold_deletion_and_namespace_delete_cascades() {
    let (_server, client) = start().await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "t1"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "t1");
    let mut held = cm("held", "v", &[]);
    held.metadata.finalizers = Some(vec!["weir.dev/test".into()]);
    api.create(&PostParams::default(), &held).await.unwrap();
    api.delete("held", &DeleteParams::default()).await.unwrap();
    let got = api.get("held").await.unwrap();
    assert!(got.metadata.deletion_timestamp.is_some());
    api.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert!(api.get_opt("held").await.unwrap().is_none());

    api.create(&PostParams::default(), &cm("doomed", "v", &[]))
        .await
        .unwrap();
    namespaces
        .delete("t1", &DeleteParams::default())
        .await
        .unwrap();
    assert!(api.get_opt("doomed").await.unwrap().is_none());
    let err = namespaces
        .delete("default", &DeleteParams::default())
        .await
        .unwrap_err();
    assert_eq!(code(err), 403);
    assert_eq!(
        code(
            api.create(&PostParams::default(), &cm("late", "v", &[]))
                .await
                .unwrap_err()
        ),
        404
    );
}

#[tokio::test]
async fn token_authenticates_and_anonymous_is_refused() {
    let (server, _client) = start().await;
    let by_token = server.client_for_context("weir-test-token").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(by_token, "default");
    api.create(&PostParams::default(), &cm("t", "v", &[]))
        .await
        .unwrap();

    let mut config = kube::Config::new(server.url().parse().unwrap());
    config.root_cert = Some(vec![pem_to_der(server.ca_pem())]);
    let anonymous = Client::try_from(config).unwrap();
    let api: Api<ConfigMap> = Api::namespaced(anonymous, "default");
    assert_eq!(
        code(api.list(&ListParams::default()).await.unwrap_err()),
        401
    );
}

fn pem_to_der(pem: &str) -> Vec<u8> {
    use base64::Engine as _;
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap()
}
