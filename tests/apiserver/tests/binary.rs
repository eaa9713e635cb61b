//! The `weir-test-apiserver` binary: serves until killed, and its kubeconfig
//! is all a separate process needs.
use std::{process::Stdio, time::Duration};

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api,
    api::ListParams,
    config::{KubeConfigOptions, Kubeconfig},
};

#[tokio::test]
async fn binary_serves_until_killed() {
    let dir = std::env::temp_dir().join(format!("weir-test-apiserver-bin-{}", std::process::id()));
    let kubeconfig = dir.join("kubeconfig");
    let _ = std::fs::remove_file(&kubeconfig);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_weir-test-apiserver"))
        .args(["--listen", "127.0.0.1:0", "--kubeconfig"])
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
    let namespaces: Api<Namespace> = Api::all(client);
    let list = namespaces.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 4);
    child.kill().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
