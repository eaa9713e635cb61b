//! The scheduler and the EndpointSlice controller against the test API
//! server: nodes, pods and Services written as kubelets and users would,
//! and what the controllers make of them read back through the API.
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Event as CoreEvent, Node, Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use weir_test_apiserver::{Options, TestApiServer, eventually};
use weir_test_controlplane::ControlPlane;

fn node(name: &str, zone: &str, extra: Value) -> Node {
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

fn pod(name: &str, extra_spec: Value) -> Pod {
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
async fn register(client: &Client, n: Node) {
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
async fn running(pods: &Api<Pod>, name: &str, ip: &str) {
    let status = json!({"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-04T10:00:00Z"}]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(status))
        .await
        .unwrap();
}

fn node_of(p: &Pod) -> Option<String> {
    p.spec.as_ref()?.node_name.clone().filter(|n| !n.is_empty())
}

/// The slices of `svc`, their endpoints as (address, ready, serving, node, zone).
async fn endpoints(client: &Client, svc: &str) -> Vec<(String, bool, bool, String, String)> {
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

/// Plays the kubelets of `nodes`: renews their Leases; their bound pods
/// start at once with an address and turn Ready; their pods being deleted
/// are confirmed gone. Pods of other nodes are left as a dead node leaves
/// them.
fn fake_kubelets(client: Client, nodes: &[&str]) -> tokio::task::JoinHandle<()> {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_scale_roll_and_are_collected() {
    use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};

    let server = TestApiServer::start(Options::default()).await.unwrap();
    let client = server.client().await.unwrap();
    register(&client, node("n1", "zone-a", json!({}))).await;
    register(&client, node("n2", "zone-b", json!({}))).await;
    let _control_plane = ControlPlane::start(client.clone()).await;
    let kubelets = fake_kubelets(client.clone(), &["n1", "n2", "n3"]);

    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": "busybox:1"}]}}},
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &d)
        .await
        .unwrap();

    let available = |n: i32| {
        let deployments = deployments.clone();
        move || {
            let deployments = deployments.clone();
            async move {
                let s = deployments.get("web").await.ok()?.status?;
                let done = s.available_replicas == Some(n)
                    && s.updated_replicas == Some(n)
                    && s.replicas == Some(n);
                done.then_some(())
            }
        }
    };
    eventually("3 available", available(3)).await;
    let ready_endpoints = |n: usize| {
        let client = client.clone();
        move || {
            let client = client.clone();
            async move {
                let eps = endpoints(&client, "web").await;
                (eps.len() == n && eps.iter().all(|e| e.1)).then_some(())
            }
        }
    };
    eventually("3 ready endpoints", ready_endpoints(3)).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let first = pods.list(&ListParams::default()).await.unwrap().items;
    let hash = first[0].metadata.labels.as_ref().unwrap()["pod-template-hash"].clone();
    assert!(first.iter().all(|p| {
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        owner.kind == "ReplicaSet" && owner.name == format!("web-{hash}")
    }));

    // `kubectl scale` writes the Scale subresource.
    let scale = json!({"spec": {"replicas": 5}});
    deployments
        .patch_scale("web", &PatchParams::default(), &Patch::Merge(scale))
        .await
        .unwrap();
    eventually("5 available", available(5)).await;
    eventually("5 ready endpoints", ready_endpoints(5)).await;

    // A new image rolls out through a second ReplicaSet.
    let image = json!({"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "busybox:2"}]}}}});
    deployments
        .patch("web", &PatchParams::default(), &Patch::Strategic(image))
        .await
        .unwrap();
    let rss: Api<ReplicaSet> = Api::namespaced(client.clone(), "default");
    eventually("rolled out", || async {
        available(5)().await?;
        let list = rss.list(&ListParams::default()).await.ok()?.items;
        let sizes: Vec<i32> = list
            .iter()
            .filter_map(|rs| rs.spec.as_ref()?.replicas)
            .collect();
        let pods = pods.list(&ListParams::default()).await.ok()?.items;
        let new = pods
            .iter()
            .all(|p| p.spec.as_ref().unwrap().containers[0].image.as_deref() == Some("busybox:2"));
        (list.len() == 2 && sizes.contains(&0) && sizes.contains(&5) && pods.len() == 5 && new)
            .then_some(())
    })
    .await;
    eventually("5 ready endpoints after the rollout", ready_endpoints(5)).await;

    // Deleting the Deployment takes its ReplicaSets and pods with it.
    deployments
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("everything collected", || async {
        let left = rss.list(&ListParams::default()).await.ok()?.items.len()
            + pods.list(&ListParams::default()).await.ok()?.items.len();
        (left == 0).then_some(())
    })
    .await;
    kubelets.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemonset_runs_one_pod_per_node() {
    use k8s_openapi::api::apps::v1::DaemonSet;

    let server = TestApiServer::start(Options::default()).await.unwrap();
    let client = server.client().await.unwrap();
    register(&client, node("n1", "zone-a", json!({}))).await;
    register(
        &client,
        node("n2", "zone-b", json!({"unschedulable": true})),
    )
    .await;
    let _control_plane = ControlPlane::start(client.clone()).await;
    let kubelets = fake_kubelets(client.clone(), &["n1", "n2", "n3"]);

    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), "kube-system");
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "weir-agent", "namespace": "kube-system"},
        "spec": {"selector": {"matchLabels": {"app": "weir-agent"}},
                 "template": {"metadata": {"labels": {"app": "weir-agent"}},
                              "spec": {"hostNetwork": true, "containers": [{"name": "agent", "image": "weir-agent:dev"}]}}},
    }))
    .unwrap();
    daemonsets
        .create(&PostParams::default(), &ds)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    // The nodes each daemon pod is bound to, once all `n` are available.
    let spread = |n: i32| {
        let (daemonsets, pods) = (daemonsets.clone(), pods.clone());
        move || {
            let (daemonsets, pods) = (daemonsets.clone(), pods.clone());
            async move {
                let s = daemonsets.get("weir-agent").await.ok()?.status?;
                if s.number_available != Some(n) || s.desired_number_scheduled != n {
                    return None;
                }
                let list = pods.list(&ListParams::default()).await.ok()?.items;
                let mut nodes: Vec<String> = list
                    .iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter_map(node_of)
                    .collect();
                nodes.sort();
                (nodes.len() == n as usize).then_some(nodes)
            }
        }
    };
    // The cordoned node gets its daemon too (the controller tolerates it).
    assert_eq!(
        eventually("a daemon on each node", spread(2)).await,
        ["n1", "n2"]
    );

    register(&client, node("n3", "zone-a", json!({}))).await;
    assert_eq!(
        eventually("a daemon on the new node", spread(3)).await,
        ["n1", "n2", "n3"]
    );

    let victim = pods.list(&ListParams::default()).await.unwrap().items[0]
        .metadata
        .name
        .clone()
        .unwrap();
    pods.delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the deleted daemon replaced", || async {
        let nodes = spread(3)().await?;
        let names: Vec<String> = pods
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        (nodes.len() == 3 && !names.contains(&victim)).then_some(())
    })
    .await;

    daemonsets
        .delete("weir-agent", &DeleteParams::default())
        .await
        .unwrap();
    eventually("daemons collected", || async {
        pods.list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    kubelets.abort();
}

/// Drill 4 in miniature: a node's kubelet goes silent; the node turns
/// Unknown after the grace period, its pod leaves the ready endpoints, is
/// evicted when its toleration runs out and replaced on the live node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_is_marked_unknown_and_its_pods_move() {
    use std::time::{Duration, Instant};

    use k8s_openapi::api::apps::v1::Deployment;
    use weir_test_controlplane::Options as ControlPlaneOptions;

    let server = TestApiServer::start(Options::default()).await.unwrap();
    let client = server.client().await.unwrap();
    register(&client, node("n1", "zone-a", json!({}))).await;
    register(&client, node("n2", "zone-b", json!({}))).await;
    let grace = Duration::from_secs(2);
    let options = ControlPlaneOptions {
        node_monitor_grace_period: grace,
        node_monitor_period: Duration::from_millis(100),
    };
    let _control_plane = ControlPlane::start_with(client.clone(), options).await;
    let both = fake_kubelets(client.clone(), &["n1", "n2"]);

    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }))
    .unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let tolerate_1s = json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                              "effect": "NoExecute", "tolerationSeconds": 1}]);
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"tolerations": tolerate_1s,
                                       "containers": [{"name": "web", "image": "busybox:1"}]}}},
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    let ready_on = || async {
        let mut nodes: Vec<String> = endpoints(&client, "web")
            .await
            .into_iter()
            .filter(|e| e.1)
            .map(|e| e.3)
            .collect();
        nodes.sort();
        nodes
    };
    eventually("a ready endpoint on each node", || async {
        (ready_on().await == ["n1", "n2"]).then_some(())
    })
    .await;

    // n2's kubelet dies: only n1's keeps renewing.
    both.abort();
    let silent = Instant::now();
    let n1_only = fake_kubelets(client.clone(), &["n1"]);
    let nodes: Api<Node> = Api::all(client.clone());
    eventually("n2 Unknown and tainted", || async {
        let n = nodes.get("n2").await.ok()?;
        let ready = n
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        let tainted = n
            .spec?
            .taints?
            .iter()
            .any(|t| t.key == "node.kubernetes.io/unreachable" && t.effect == "NoExecute");
        (ready.status == "Unknown" && tainted).then_some(())
    })
    .await;
    let unknown_after = silent.elapsed();
    println!("n2 Unknown {unknown_after:?} after its kubelet went silent (grace {grace:?})");
    assert!(
        unknown_after >= grace - Duration::from_millis(300),
        "{unknown_after:?}"
    );
    let n1 = nodes.get("n1").await.unwrap();
    let n1_ready = n1.status.unwrap().conditions.unwrap();
    assert!(
        n1_ready
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "n1 stays Ready"
    );

    // Its pod is evicted after 1 s and replaced on n1.
    eventually("both ready endpoints on n1", || async {
        (ready_on().await == ["n1", "n1"]).then_some(())
    })
    .await;
    let moved = silent.elapsed();
    println!("pods moved {moved:?} after the silence began");
    assert!(
        moved >= unknown_after + Duration::from_millis(900),
        "evicted only when the 1 s toleration ran out: {moved:?}"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let on_n2: Vec<Pod> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| node_of(p).as_deref() == Some("n2"))
        .collect();
    assert!(
        on_n2
            .iter()
            .all(|p| p.metadata.deletion_timestamp.is_some()),
        "n2's pod was evicted (and waits, Terminating, for a kubelet that is gone)"
    );
    n1_only.abort();
}
