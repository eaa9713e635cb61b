//! The scheduler and the EndpointSlice controller against the test API
//! server: nodes, pods and Services written as kubelets and users would,
//! and what the controllers make of them read back through the API.
mod common;

use common::{endpoints, node, node_of, pod, register, running};
use k8s_openapi::api::{
    core::v1::{Event as CoreEvent, Node, Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use weir_test_apiserver::{Options, TestApiServer, eventually};
use weir_test_controlplane::ControlPlane;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_scheduled_and_their_endpoints_published() {
    let server = TestApiServer::start(Options::default()).await.unwrap();
    let client = server.client().await.unwrap();
    register(&client, node("n1", "zone-a", json!({}))).await;
    register(&client, node("n2", "zone-b", json!({}))).await;
    register(
        &client,
        node("n3", "zone-a", json!({"unschedulable": true})),
    )
    .await;
    let _control_plane = ControlPlane::start(client.clone()).await;

    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for name in ["web-1", "web-2", "web-3"] {
        pods.create(&PostParams::default(), &pod(name, json!({})))
            .await
            .unwrap();
    }

    // Spread over the two schedulable nodes, none on the cordoned one.
    let placed = eventually("three pods bound", || async {
        let list = pods.list(&ListParams::default()).await.ok()?.items;
        let nodes: Vec<String> = list.iter().filter_map(node_of).collect();
        (nodes.len() == 3).then_some(nodes)
    })
    .await;
    let on = |n: &str| placed.iter().filter(|p| p.as_str() == n).count();
    assert_eq!((on("n1"), on("n2"), on("n3")), (2, 1, 0), "{placed:?}");
    let p1 = pods.get("web-1").await.unwrap();
    let scheduled = p1.status.unwrap().conditions.unwrap_or_default();
    assert!(
        scheduled
            .iter()
            .any(|c| c.type_ == "PodScheduled" && c.status == "True"),
        "{scheduled:?}"
    );

    // No endpoint before an address; a placeholder slice exists at once.
    let placeholder = eventually("the placeholder slice", || async {
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
        let lp = ListParams::default().labels("kubernetes.io/service-name=web");
        let items = slices.list(&lp).await.ok()?.items;
        (items.len() == 1).then(|| items[0].clone())
    })
    .await;
    assert!(placeholder.endpoints.is_empty());
    let owner = &placeholder.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Service", "web")
    );

    for (name, ip) in [
        ("web-1", "10.244.1.10"),
        ("web-2", "10.244.2.10"),
        ("web-3", "10.244.1.11"),
    ] {
        running(&pods, name, ip).await;
    }
    let want: Vec<(String, bool, bool, String, String)> = {
        let mut v = Vec::new();
        for name in ["web-1", "web-2", "web-3"] {
            let p = pods.get(name).await.unwrap();
            let n = node_of(&p).unwrap();
            let zone = if n == "n1" { "zone-a" } else { "zone-b" };
            let ip = p.status.unwrap().pod_ip.unwrap();
            v.push((ip, true, true, n, zone.to_string()));
        }
        v.sort();
        v
    };
    eventually("three ready endpoints", || async {
        (endpoints(&client, "web").await == want).then_some(())
    })
    .await;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let slice = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
        .await
        .unwrap()
        .items
        .remove(0);
    let port = &slice.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.name.as_deref(), port.port),
        (Some("http"), Some(8080)),
        "named targetPort resolved"
    );
    let annotations = slice.metadata.annotations.unwrap_or_default();
    assert!(annotations.contains_key("endpoints.kubernetes.io/last-change-trigger-time"));

    // A graceful delete leaves a terminating, still serving endpoint.
    pods.delete("web-2", &DeleteParams::default())
        .await
        .unwrap();
    eventually("web-2 terminating", || async {
        let eps = endpoints(&client, "web").await;
        eps.iter()
            .any(|e| e.0 == "10.244.2.10" && !e.1 && e.2)
            .then_some(())
    })
    .await;

    // A pod no node can take says why, in its condition and an Event.
    let picky = pod("picky", json!({"nodeSelector": {"disk": "ssd"}}));
    pods.create(&PostParams::default(), &picky).await.unwrap();
    let message = eventually("PodScheduled=False", || async {
        let p = pods.get("picky").await.ok()?;
        let c = p
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "PodScheduled")?;
        (c.status == "False").then_some(c.message.unwrap_or_default())
    })
    .await;
    assert_eq!(
        message,
        "0/3 nodes are available: 1 node(s) were unschedulable, 2 node(s) didn't match Pod's node affinity/selector."
    );
    let events: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    eventually("a FailedScheduling event", || async {
        let lp = ListParams::default().fields("involvedObject.name=picky");
        let items = events.list(&lp).await.ok()?.items;
        items
            .iter()
            .any(|e| e.reason.as_deref() == Some("FailedScheduling"))
            .then_some(())
    })
    .await;
    // Labelling a node lets it in.
    let nodes: Api<Node> = Api::all(client.clone());
    let label = json!({"metadata": {"labels": {"disk": "ssd"}}});
    nodes
        .patch("n2", &PatchParams::default(), &Patch::Merge(label))
        .await
        .unwrap();
    eventually("picky bound to n2", || async {
        (node_of(&pods.get("picky").await.ok()?).as_deref() == Some("n2")).then_some(())
    })
    .await;

    // Deleting the Service removes its slices.
    services
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("no slices left", || async {
        let lp = ListParams::default().labels("kubernetes.io/service-name=web");
        slices.list(&lp).await.ok()?.items.is_empty().then_some(())
    })
    .await;
}
