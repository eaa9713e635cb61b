//! ConfigMaps and Secrets for volumes and env, read through the API server.
//! Reflector caches answer the worker's synchronous lookups; a pod that
//! arrives before its ConfigMap is cached gets `CreateContainerConfigError`
//! and the worker retries on its next relist, as the kubelet does.
use std::collections::BTreeMap;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api, Client,
    runtime::{
        WatchStreamExt as _,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};

use crate::worker::ApiObjects;

pub struct ApiObjectCache {
    config_maps: Store<ConfigMap>,
    secrets: Store<Secret>,
}

impl ApiObjectCache {
    /// Starts watching ConfigMaps and Secrets in every namespace; the
    /// watchers back off and relist on their own when the API server is away.
    pub fn start(client: Client) -> Self {
        Self {
            config_maps: reflect(Api::<ConfigMap>::all(client.clone())),
            secrets: reflect(Api::<Secret>::all(client)),
        }
    }
}

fn reflect<K>(api: Api<K>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                tracing::debug!(error = %e, "ConfigMap/Secret watch failed; retrying");
            }
        }
    });
    reader
}

impl ApiObjects for ApiObjectCache {
    fn config_map(&self, namespace: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        let cm = self
            .config_maps
            .get(&ObjectRef::new(name).within(namespace))?;
        let mut out: BTreeMap<String, Vec<u8>> = cm
            .data
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect();
        for (k, v) in cm.binary_data.clone().unwrap_or_default() {
            out.insert(k, v.0);
        }
        Some(out)
    }

    fn secret(&self, namespace: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        let s = self.secrets.get(&ObjectRef::new(name).within(namespace))?;
        let mut out: BTreeMap<String, Vec<u8>> = s
            .data
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect();
        // stringData is write-only in a real API server; honour it anyway for
        // servers (and tests) that hand it back.
        for (k, v) in s.string_data.clone().unwrap_or_default() {
            out.entry(k).or_insert_with(|| v.into_bytes());
        }
        Some(out)
    }
}
