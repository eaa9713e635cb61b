//! Shared by the control plane's API-level tests: nodes and pods as
//! kubelets would register and report them, and the slices' endpoints.
#![allow(dead_code)] // each test file uses its own part

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Pod},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use weir_test_apiserver::{Options, TestApiServer};
use weir_test_controlplane::{ControlPlane, Options as ControlPlaneOptions};

/// A test API server with `nodes` registered (zones alternate a, b) and the
/// control plane running against it.
pub async fn cluster(
    nodes: &[&str],
    options: ControlPlaneOptions,
) -> (TestApiServer, Client, ControlPlane) {
    let server = TestApiServer::start(Options::default()).await.unwrap();
    let client = server.client().await.unwrap();
    for (i, n) in nodes.iter().enumerate() {
        let zone = if i % 2 == 0 { "zone-a" } else { "zone-b" };
        register(&client, node(n, zone, json!({}))).await;
    }
    let control_plane = ControlPlane::start_with(client.clone(), options).await;
    (server, client, control_plane)
}

/// Deployment `web` (pods labelled app=web, image busybox:1), with `spec`
/// merged into its pod spec, created.
pub async fn deployment(client: &Client, replicas: i32, pod_spec: Value) {
    let mut spec = json!({"containers": [{"name": "web", "image": "busybox:1"}]});
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), pod_spec.as_object()) {
        s.extend(extra.clone());
    }
    let d: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": spec}},
    }))
    .unwrap();
    let api: Api<k8s_openapi::api::apps::v1::Deployment> =
        Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &d).await.unwrap();
}

/// Service `web` selecting app=web, port 80 to 8080.
pub async fn service(client: &Client) {
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }))
    .unwrap();
    let api: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &svc).await.unwrap();
}

pub fn node(name: &str, zone: &str, extra: Value) -> Node {
    let mut n = json!({
        "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}},
        "spec": extra,
    });
    n["status"] = json!({
        "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True"}],
    });
    serde_json::from_value(n).unwrap()
}

pub fn pod(name: &str, extra_spec: Value) -> Pod {
    let mut spec = json!({"containers": [{"name": "web", "image": "busybox",
        "ports": [{"name": "http", "containerPort": 8080}],
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]});
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        s.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
        "spec": spec,
    }))
    .unwrap()
}

/// Nodes are created, then given a status, as a kubelet registers.
pub async fn register(client: &Client, n: Node) {
    let nodes: Api<Node> = Api::all(client.clone());
    let name = n.metadata.name.clone().unwrap();
    let status = json!({"status": n.status});
    nodes.create(&PostParams::default(), &n).await.unwrap();
    nodes
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}

/// What a kubelet reports once the pod runs.
pub async fn running(pods: &Api<Pod>, name: &str, ip: &str) {
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-04T10:00:00Z"}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(status))
        .await
        .unwrap();
}

pub fn node_of(p: &Pod) -> Option<String> {
    p.spec.as_ref()?.node_name.clone().filter(|n| !n.is_empty())
}

/// The slices of `svc`, their endpoints as (address, ready, serving, node, zone).
pub async fn endpoints(client: &Client, svc: &str) -> Vec<(String, bool, bool, String, String)> {
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={svc}"));
    let mut out: Vec<_> = slices
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .flat_map(|s| s.endpoints)
        .map(|e| {
            let c = e.conditions.unwrap_or_default();
            (
                e.addresses[0].clone(),
                c.ready == Some(true),
                c.serving == Some(true),
                e.node_name.unwrap_or_default(),
                e.zone.unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Plays the kubelets of `nodes`: renews their Leases; their bound pods
/// start at once with an address and turn Ready; their pods being deleted
/// are confirmed gone. Pods of other nodes are left as a dead node leaves
/// them.
pub fn fake_kubelets(client: Client, nodes: &[&str]) -> tokio::task::JoinHandle<()> {
    let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::all(client.clone());
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
        let mut next_ip = 10u32;
        loop {
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            for n in &nodes {
                let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": n, "namespace": "kube-node-lease"},
                    "spec": {"holderIdentity": n, "leaseDurationSeconds": 40, "renewTime": now}});
                let pp = PatchParams::apply("kubelet").force();
                let _ = leases.patch(n, &pp, &Patch::Apply(lease)).await;
            }
            let list = pods.list(&ListParams::default()).await.map(|l| l.items);
            for p in list.unwrap_or_default() {
                if !node_of(&p).is_some_and(|n| nodes.contains(&n)) {
                    continue;
                }
                let ns = p.metadata.namespace.clone().unwrap_or_default();
                let name = p.metadata.name.clone().unwrap_or_default();
                let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
                if p.metadata.deletion_timestamp.is_some() {
                    let _ = api
                        .delete(&name, &DeleteParams::default().grace_period(0))
                        .await;
                } else if p.status.as_ref().and_then(|s| s.pod_ip.as_ref()).is_none() {
                    next_ip += 1;
                    let ip = format!("10.244.{}.{}", next_ip / 250, next_ip % 250 + 1);
                    let status = json!({"status": {"phase": "Running", "podIP": ip,
                        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}});
                    let _ = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(status))
                        .await;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
}
