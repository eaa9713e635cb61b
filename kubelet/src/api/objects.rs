//! ConfigMaps and Secrets for volumes and env, read through the API server
//! with the kubelet's Watch strategy: one watch per object that a pod on this
//! node references (`fieldSelector=metadata.name=<name>` in its namespace),
//! reference-counted by those pods and dropped when the last one goes. The
//! node never lists or watches every Secret in the cluster, which the Node
//! authorizer forbids anyway. A lookup answers from the watch's cache; an
//! object not yet synced, missing or unreadable makes the container wait with
//! `CreateContainerConfigError` and the API's message, and the worker retries
//! on its next pass, as the kubelet does.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex},
};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt as _, watcher},
};

use crate::worker::ApiObjects;

/// Which kind of object a pod refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ObjectKind {
    ConfigMap,
    Secret,
}

/// One referenced object: kind, namespace, name.
pub type ObjectKey = (ObjectKind, String, String);

/// What a watch knows about its object.
#[derive(Debug, Clone, Default)]
enum State {
    /// No answer from the API server yet.
    #[default]
    Pending,
    /// The object's data, or `None` when it does not exist.
    Synced(Option<BTreeMap<String, Vec<u8>>>),
    /// The watch failed before it synced (e.g. forbidden): the API's message.
    Failed(String),
}

struct Watched {
    state: Arc<Mutex<State>>,
    task: tokio::task::AbortHandle,
}

#[derive(Default)]
struct Inner {
    /// The objects each pod (by UID) refers to.
    pods: HashMap<String, BTreeSet<ObjectKey>>,
    /// The live watches, with the number of pods referring to each.
    watches: HashMap<ObjectKey, (usize, Watched)>,
}

pub struct ApiObjectCache {
    client: Client,
    inner: Mutex<Inner>,
    tokens: super::tokens::TokenManager,
}

impl ApiObjectCache {
    /// A cache with no watches yet: they start as pods refer to objects.
    pub fn start(client: Client) -> Self {
        Self {
            tokens: super::tokens::TokenManager::new(client.clone()),
            client,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The objects being watched, for tests and diagnostics.
    pub fn watched(&self) -> Vec<ObjectKey> {
        let mut v: Vec<_> = self.lock().watches.keys().cloned().collect();
        v.sort();
        v
    }

    fn lookup(&self, key: ObjectKey) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
        let state = {
            let inner = self.lock();
            match inner.watches.get(&key) {
                Some((_, w)) => w.state.lock().unwrap_or_else(|e| e.into_inner()).clone(),
                None => State::Pending,
            }
        };
        match state {
            State::Synced(d) => Ok(d),
            State::Failed(msg) => Err(msg),
            State::Pending => Err(format!(
                "{} {:?} not registered or not yet synced",
                kind_name(key.0),
                key.2
            )),
        }
    }

    fn watch(&self, key: &ObjectKey) -> Watched {
        let state = Arc::new(Mutex::new(State::Pending));
        let (kind, ns, name) = key.clone();
        let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let task = match kind {
            ObjectKind::ConfigMap => tokio::spawn(run_watch(
                Api::<ConfigMap>::namespaced(self.client.clone(), &ns),
                cfg,
                state.clone(),
                config_map_data,
                key.clone(),
            )),
            ObjectKind::Secret => tokio::spawn(run_watch(
                Api::<Secret>::namespaced(self.client.clone(), &ns),
                cfg,
                state.clone(),
                secret_data,
                key.clone(),
            )),
        };
        Watched {
            state,
            task: task.abort_handle(),
        }
    }
}

fn kind_name(k: ObjectKind) -> &'static str {
    match k {
        ObjectKind::ConfigMap => "configmap",
        ObjectKind::Secret => "secret",
    }
}

async fn run_watch<K>(
    api: Api<K>,
    cfg: watcher::Config,
    state: Arc<Mutex<State>>,
    data: fn(&K) -> BTreeMap<String, Vec<u8>>,
    key: ObjectKey,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let set = |s: State| *state.lock().unwrap_or_else(|e| e.into_inner()) = s;
    let stream = watcher(api, cfg).default_backoff();
    futures::pin_mut!(stream);
    let mut init: Option<BTreeMap<String, Vec<u8>>> = None;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Init) => init = None,
            Ok(watcher::Event::InitApply(o)) => init = Some(data(&o)),
            Ok(watcher::Event::InitDone) => set(State::Synced(init.take())),
            Ok(watcher::Event::Apply(o)) => set(State::Synced(Some(data(&o)))),
            Ok(watcher::Event::Delete(_)) => set(State::Synced(None)),
            Err(e) => {
                let msg = match &e {
                    watcher::Error::InitialListFailed(kube::Error::Api(r))
                    | watcher::Error::WatchStartFailed(kube::Error::Api(r)) => r.message.clone(),
                    other => other.to_string(),
                };
                tracing::warn!(kind = kind_name(key.0), namespace = %key.1, name = %key.2,
                    error = %msg, "watch failed; retrying");
                // A synced object stays usable while the watch recovers.
                let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                if !matches!(*s, State::Synced(_)) {
                    *s = State::Failed(msg);
                }
            }
        }
    }
}

fn config_map_data(cm: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
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
    out
}

fn secret_data(s: &Secret) -> BTreeMap<String, Vec<u8>> {
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
    out
}

/// The ConfigMaps and Secrets a pod refers to: its configMap and secret
/// volumes and its containers' `valueFrom` and `envFrom` references.
pub fn pod_references(pod: &Pod) -> BTreeSet<ObjectKey> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let mut out = BTreeSet::new();
    let mut add = |kind, name: Option<&String>| {
        if let Some(n) = name.filter(|n| !n.is_empty()) {
            out.insert((kind, ns.clone(), n.clone()));
        }
    };
    let Some(spec) = &pod.spec else {
        return out;
    };
    for v in spec.volumes.iter().flatten() {
        add(
            ObjectKind::ConfigMap,
            v.config_map.as_ref().map(|c| &c.name),
        );
        add(
            ObjectKind::Secret,
            v.secret.as_ref().and_then(|s| s.secret_name.as_ref()),
        );
        for p in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            add(
                ObjectKind::ConfigMap,
                p.config_map.as_ref().map(|c| &c.name),
            );
            add(ObjectKind::Secret, p.secret.as_ref().map(|s| &s.name));
        }
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        for e in c.env.iter().flatten() {
            let Some(from) = &e.value_from else { continue };
            add(
                ObjectKind::ConfigMap,
                from.config_map_key_ref.as_ref().map(|r| &r.name),
            );
            add(
                ObjectKind::Secret,
                from.secret_key_ref.as_ref().map(|r| &r.name),
            );
        }
        for f in c.env_from.iter().flatten() {
            add(
                ObjectKind::ConfigMap,
                f.config_map_ref.as_ref().map(|r| &r.name),
            );
            add(ObjectKind::Secret, f.secret_ref.as_ref().map(|r| &r.name));
        }
    }
    out
}

impl ApiObjects for ApiObjectCache {
    fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
        self.lookup((ObjectKind::ConfigMap, namespace.into(), name.into()))
    }

    fn secret(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
        self.lookup((ObjectKind::Secret, namespace.into(), name.into()))
    }

    fn service_account_token(
        &self,
        pod: &crate::pod::PodSpec,
        projection: &crate::pod::TokenProjection,
    ) -> Result<String, String> {
        self.tokens
            .token(&super::tokens::TokenKey::for_pod(pod, projection))
    }

    fn register_pod(&self, pod: &Pod) {
        self.tokens.register_pod(pod);
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let refs = pod_references(pod);
        let mut inner = self.lock();
        let old = inner.pods.remove(&uid).unwrap_or_default();
        for key in refs.difference(&old) {
            if let Some((n, _)) = inner.watches.get_mut(key) {
                *n += 1;
            } else {
                let w = self.watch(key);
                inner.watches.insert(key.clone(), (1, w));
            }
        }
        for key in old.difference(&refs) {
            release(&mut inner, key);
        }
        if !refs.is_empty() {
            inner.pods.insert(uid, refs);
        }
    }

    fn unregister_pod(&self, uid: &str) {
        self.tokens.unregister_pod(uid);
        let mut inner = self.lock();
        for key in inner.pods.remove(uid).unwrap_or_default() {
            release(&mut inner, &key);
        }
    }
}

fn release(inner: &mut Inner, key: &ObjectKey) {
    if let Some((n, _)) = inner.watches.get_mut(key) {
        *n -= 1;
        if *n == 0
            && let Some((_, w)) = inner.watches.remove(key)
        {
            w.task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn references_cover_volumes_env_and_env_from() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {
                "volumes": [
                    {"name": "a", "secret": {"secretName": "s1"}},
                    {"name": "b", "configMap": {"name": "c1"}},
                    {"name": "e", "emptyDir": {}},
                ],
                "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "s2"}}]}],
                "containers": [{"name": "c", "env": [
                    {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c2", "key": "k"}}},
                    {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "s1", "key": "k"}}},
                    {"name": "Z", "value": "z"},
                ]}],
            },
        }))
        .unwrap();
        let got: Vec<_> = pod_references(&pod).into_iter().collect();
        let k = |kind, n: &str| (kind, "ns".to_owned(), n.to_owned());
        assert_eq!(
            got,
            vec![
                k(ObjectKind::ConfigMap, "c1"),
                k(ObjectKind::ConfigMap, "c2"),
                k(ObjectKind::Secret, "s1"),
                k(ObjectKind::Secret, "s2"),
            ]
        );
    }
}
