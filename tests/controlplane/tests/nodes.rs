//! The node lifecycle controller against the test API server, with
//! stand-in kubelets that can go silent.
mod common;

use common::{cluster, deployment, endpoints, fake_kubelets, node_of, service};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, api::ListParams};
use serde_json::json;
use weir_test_apiserver::eventually;

/// Drill 4 in miniature: a node's kubelet goes silent; the node turns
/// Unknown after the grace period, its pod leaves the ready endpoints, is
/// evicted when its toleration runs out and replaced on the live node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_is_marked_unknown_and_its_pods_move() {
    use std::time::{Duration, Instant};

    use weir_test_controlplane::Options as ControlPlaneOptions;

    let grace = Duration::from_secs(2);
    let options = ControlPlaneOptions {
        node_monitor_grace_period: grace,
        node_monitor_period: Duration::from_millis(100),
    };
    let (_server, client, _control_plane) = cluster(&["n1", "n2"], options).await;
    let both = fake_kubelets(client.clone(), &["n1", "n2"]);
    service(&client).await;
    let tolerate_1s = json!([{"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                              "effect": "NoExecute", "tolerationSeconds": 1}]);
    deployment(&client, 2, json!({"tolerations": tolerate_1s})).await;
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
