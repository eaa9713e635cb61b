//! The `weir-test-apiserver` binary: serves until killed, and its kubeconfig
//! is all a separate process needs.
use std::{process::Stdio, time::Duration};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::{
    Api,
    api::{ListParams, LogParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::json;

#[tokio::test]
async fn binary_serves_until_killed() {
    let dir = std::env::temp_dir().join(format!("weir-test-apiserver-bin-{}", std::process::id()));
    let kubeconfig = dir.join("kubeconfig");
    let _ = std::fs::remove_file(&kubeconfig);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_weir-test-apiserver"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--kubelet-route",
            "node-x=127.0.0.1:1",
        ])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !kubeconfig.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no kubeconfig written"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&kubeconfig).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let list = namespaces.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 4);
    let ca = std::fs::read_to_string(dir.join("ca.crt")).unwrap();
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");

    // --kubelet-route: node-x's kubelet is dialled at 127.0.0.1:1, where
    // nothing listens, not at its address.
    let nodes: Api<Node> = Api::all(client.clone());
    let node = serde_json::from_value(json!({"metadata": {"name": "node-x"}})).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let status =
        json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.255.0.7"}]}});
    nodes
        .patch_status("node-x", &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::default_namespaced(client);
    let pod = serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {
        "nodeName": "node-x", "containers": [{"name": "c", "image": "busybox:1"}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    match pods.logs("p", &LogParams::default()).await.unwrap_err() {
        kube::Error::Api(s) => assert_eq!(
            s.message,
            "Get \"https://10.255.0.7:10250/containerLogs/default/p/c\": dial tcp 127.0.0.1:1: connect: connection refused"
        ),
        other => panic!("expected an API error, got {other:?}"),
    }
    child.kill().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
