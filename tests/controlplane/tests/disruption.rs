//! The disruption controller against the test API server: a budget's
//! status as evictions through the Eviction API spend and restore it.
mod common;

use common::{cluster, deployment, fake_kubelets};
use k8s_openapi::api::{core::v1::Pod, policy::v1::PodDisruptionBudget};
use kube::{
    Api,
    api::{EvictParams, ListParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::json;
use weir_test_apiserver::eventually;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_lets_evictions_through_one_at_a_time() {
    let (server, client, _control_plane) = cluster(&["n1", "n2"], Default::default()).await;
    let kubelets = fake_kubelets(server.client().await.unwrap(), &["n1", "n2"]);
    deployment(&client, 3, json!({})).await;
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}},
    }))
    .unwrap();
    budgets.create(&PostParams::default(), &pdb).await.unwrap();
    // (expected, desired healthy, current healthy, allowed)
    let status = || async {
        let s = budgets.get("web").await.ok()?.status?;
        Some((
            s.expected_pods,
            s.desired_healthy,
            s.current_healthy,
            s.disruptions_allowed,
        ))
    };
    eventually("the budget observed", || async {
        (status().await? == (3, 2, 3, 1)).then_some(())
    })
    .await;

    // kube-rs retries a 429 (up to 15 times, backing off to 1000 s), as
    // `kubectl drain` does in its own loop; this client shows the refusal.
    let kubeconfig = Kubeconfig::read_from(server.kubeconfig_path()).unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .unwrap();
    config.default_retry = false;
    let once = kube::Client::try_from(config).unwrap();
    let pods: Api<Pod> = Api::namespaced(once, "default");
    let names: Vec<String> = pods
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    // Replacements must not turn ready yet: the kubelets pause.
    kubelets.abort();
    pods.evict(&names[0], &EvictParams::default())
        .await
        .unwrap();
    let refused = pods
        .evict(&names[1], &EvictParams::default())
        .await
        .unwrap_err();
    let kube::Error::Api(e) = refused else {
        panic!("{refused}")
    };
    assert_eq!(e.code, 429, "{}", e.message);
    // The evicted pod is not healthy and its replacement not yet ready.
    eventually("the budget recounted", || async {
        (status().await? == (3, 2, 2, 0)).then_some(())
    })
    .await;

    // The replacement runs, the budget allows one again.
    let kubelets = fake_kubelets(server.client().await.unwrap(), &["n1", "n2"]);
    eventually("the budget restored", || async {
        (status().await? == (3, 2, 3, 1)).then_some(())
    })
    .await;
    pods.evict(&names[1], &EvictParams::default())
        .await
        .unwrap();
    kubelets.abort();
}
