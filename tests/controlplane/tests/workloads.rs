//! Workload controllers (Deployment, ReplicaSet, DaemonSet) and the
//! garbage collector against the test API server, with stand-in kubelets.
mod common;

use common::{cluster, deployment, endpoints, fake_kubelets, node, node_of, register, service};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use weir_test_apiserver::eventually;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_scale_roll_and_are_collected() {
    use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};

    let (_server, client, _control_plane) = cluster(&["n1", "n2"], Default::default()).await;
    let kubelets = fake_kubelets(client.clone(), &["n1", "n2"]);
    service(&client).await;
    deployment(&client, 3, json!({})).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
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

    let (_server, client, _control_plane) = cluster(&["n1", "n2"], Default::default()).await;
    let cordon = json!({"spec": {"unschedulable": true}});
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch("n2", &PatchParams::default(), &Patch::Merge(cordon))
        .await
        .unwrap();
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
