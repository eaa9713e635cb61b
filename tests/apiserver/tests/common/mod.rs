//! Pieces every test binary of this crate uses: a started server with a
//! client, the HTTP code of an API error, a small ConfigMap, and the real
//! kubectl against a server.
// Each test binary compiles this module and uses a different part of it.
#![allow(dead_code)]

use std::{collections::BTreeMap, process::Stdio, time::Duration};

use k8s_openapi::{api::core::v1::ConfigMap, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::Client;
use weir_test_apiserver::{Options, TestApiServer};

pub async fn start_with(options: Options) -> (TestApiServer, Client) {
    let server = TestApiServer::start(options).await.expect("server starts");
    let client = server.client().await.expect("client");
    (server, client)
}

pub async fn start() -> (TestApiServer, Client) {
    start_with(Options::default()).await
}

pub fn code(e: kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A ConfigMap `{k: value}` with these labels.
pub fn cm(name: &str, value: &str, labels: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("k".to_string(), value.to_string())])),
        ..Default::default()
    }
}

/// Where the tests expect kubectl; those that need it skip, loudly, without.
pub const KUBECTL: &str = "/usr/bin/kubectl";

/// kubectl against `server`, with a cache of its own and no stdin.
pub fn kubectl_cmd(server: &TestApiServer, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(KUBECTL);
    cmd.arg("--kubeconfig")
        .arg(server.kubeconfig_path())
        .arg("--cache-dir")
        .arg(server.kubeconfig_path().with_file_name("kubectl-cache"))
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Runs kubectl to completion: (success, stdout, stderr).
pub async fn kubectl(server: &TestApiServer, args: &[&str]) -> (bool, String, String) {
    let out = tokio::time::timeout(Duration::from_secs(60), kubectl_cmd(server, args).output())
        .await
        .expect("kubectl finishes")
        .expect("kubectl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
