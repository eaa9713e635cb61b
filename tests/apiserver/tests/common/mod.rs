//! Pieces every test binary of this crate uses: a started server with a
//! client, the HTTP code of an API error, and a small ConfigMap.
// Each test binary compiles this module and uses a different part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;

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
