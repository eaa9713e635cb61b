//! The [`StatusSink`] of API mode: what the worker learns goes to the API
//! server from one task, so `publish` and `terminated` never block the worker
//! on the network. Work is coalesced per pod (only the newest status of a pod
//! is sent) and retried with backoff until it lands.
//!
//! Every write is tied to a UID: status patches carry `metadata.uid`, which the
//! API server treats as a precondition (as pkg/kubelet/status/status_manager.go
//! does), and deletes carry `preconditions.uid`. A pod recreated under the same
//! name therefore never gets the old pod's status, nor is deleted for it
//! (virtual-kubelet#867).
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::{ApiError, Backoff, Shared, status_code};
use crate::{
    flow::{PodSource, StatusSink},
    static_pods::{self, CONFIG_MIRROR, StaticPod},
};

/// Publishes statuses, mirror pods and final deletes to the API server.
pub struct ApiStatusSink {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    state: Mutex<State>,
    wake: Notify,
}

#[derive(Default)]
struct State {
    /// API pods with something to send, by UID.
    pending: BTreeMap<String, Work>,
    /// The status the API holds for a pod (API or mirror) UID, as we last
    /// wrote it: an unchanged status is not sent again.
    published: HashMap<String, PodStatus>,
    /// Static pods running now, by their (static) UID.
    statics: BTreeMap<String, StaticEntry>,
    /// Mirror pods of terminated static pods: static UID → (namespace, name).
    mirror_deletes: BTreeMap<String, (String, String)>,
}

struct Work {
    pod: Pod,
    status: Option<PodStatus>,
    /// Delete the pod (grace 0, UID precondition) once the status is sent.
    delete: bool,
}

struct StaticEntry {
    pod: Pod,
    status: Option<PodStatus>,
    /// Published since the mirror was last brought up to date.
    dirty: bool,
}

fn meta(p: &Pod) -> (String, String, String) {
    (
        p.metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned()),
        p.metadata.name.clone().unwrap_or_default(),
        p.metadata.uid.clone().unwrap_or_default(),
    )
}

/// Static pods are the file source's. An API pod may carry any annotation,
/// `kubernetes.io/config.source: file` included: it must not stop its status
/// updates or its final delete.
fn is_static(source: &PodSource) -> bool {
    matches!(source, PodSource::File(_))
}

/// The merge patch for a pod's status. Lists are replaced whole (the kubelet
/// owns every container status); the optional fields this kubelet sets are
/// sent as `null` when unset so that a stale message or IP is cleared.
pub(crate) fn status_patch(uid: &str, status: &PodStatus) -> Value {
    let mut s = serde_json::to_value(status).unwrap_or_else(|_| json!({}));
    if let Some(obj) = s.as_object_mut() {
        for k in ["message", "reason", "podIP", "podIPs"] {
            obj.entry(k).or_insert(Value::Null);
        }
    }
    json!({"metadata": {"uid": uid}, "status": s})
}

fn delete_params(uid: &str) -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    }
}

/// What became of a write.
enum Outcome {
    Done,
    /// The pod is gone or is another pod now (404, UID precondition): drop
    /// the work, retrying would never succeed.
    Gone,
}

impl ApiStatusSink {
    /// Turns true once the first complete list of this node's pods has been
    /// sent to the worker (`sourcesReady` for the API source).
    pub fn pods_listed(&self) -> tokio::sync::watch::Receiver<bool> {
        self.inner.shared.pods_listed.subscribe()
    }

    pub(crate) fn start(shared: Arc<Shared>) -> Arc<Self> {
        let inner = Arc::new(Inner {
            shared,
            state: Mutex::default(),
            wake: Notify::new(),
        });
        tokio::spawn(run(inner.clone()));
        Arc::new(Self { inner })
    }
}

/// Now as an RFC 3339 timestamp with second precision, as Events carry.
fn event_time() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

impl StatusSink for ApiStatusSink {
    fn warning(&self, pod: &Pod, reason: &str, message: &str) {
        let (ns, name, uid) = meta(pod);
        let shared = self.inner.shared.clone();
        let now = event_time();
        let event = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": format!("{name}."), "namespace": ns},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": ns,
                               "name": name, "uid": uid},
            "reason": reason, "message": message, "type": "Warning",
            "source": {"component": "kubelet", "host": shared.node_name},
            "reportingComponent": "kubelet", "reportingInstance": shared.node_name,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        });
        tokio::spawn(async move {
            let api: Api<k8s_openapi::api::core::v1::Event> =
                Api::namespaced(shared.client.clone(), &ns);
            let ev = match serde_json::from_value(event) {
                Ok(ev) => ev,
                Err(e) => return tracing::warn!(error = %e, "event not built"),
            };
            if let Err(e) = api.create(&PostParams::default(), &ev).await {
                tracing::warn!(pod = %name, error = %e, "event not recorded");
            }
        });
    }

    fn publish(&self, pod: &Pod, source: &PodSource, status: &PodStatus) {
        let (ns, name, uid) = meta(pod);
        let mut st = self.inner.lock();
        if is_static(source) {
            // A changed file is a new UID under the same name; should the old
            // pod never be reported terminated, two entries would fight over
            // one mirror pod. The newest report wins.
            st.statics.retain(|u, e| {
                let (n, m, _) = meta(&e.pod);
                *u == uid || n != ns || m != name
            });
            let entry = st.statics.entry(uid).or_insert_with(|| StaticEntry {
                pod: pod.clone(),
                status: None,
                dirty: true,
            });
            if entry.status.as_ref() == Some(status) && !entry.dirty {
                return;
            }
            entry.pod = pod.clone();
            entry.status = Some(status.clone());
            entry.dirty = true;
        } else {
            if st.published.get(&uid) == Some(status) && !st.pending.contains_key(&uid) {
                return;
            }
            let work = st.pending.entry(uid).or_insert_with(|| Work {
                pod: pod.clone(),
                status: None,
                delete: false,
            });
            work.status = Some(status.clone());
        }
        drop(st);
        self.inner.wake.notify_one();
    }

    fn terminated(&self, pod: &Pod, source: &PodSource) {
        let (ns, name, uid) = meta(pod);
        let mut st = self.inner.lock();
        if is_static(source) {
            st.statics.remove(&uid);
            st.mirror_deletes.insert(uid, (ns, name));
        } else {
            // Only a pod the API asked to delete is deleted: a pod that merely
            // ran to completion stays, with its final status.
            let deleting = pod.metadata.deletion_timestamp.is_some()
                || self.inner.shared.cached(&ns, &name).is_some_and(|c| {
                    c.metadata.uid.as_deref() == Some(uid.as_str())
                        && c.metadata.deletion_timestamp.is_some()
                });
            if !deleting {
                return;
            }
            st.pending
                .entry(uid)
                .or_insert_with(|| Work {
                    pod: pod.clone(),
                    status: None,
                    delete: false,
                })
                .delete = true;
        }
        drop(st);
        self.inner.wake.notify_one();
    }
}

async fn run(inner: Arc<Inner>) {
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    let mut all_mirrors = true;
    loop {
        let ok = inner.round(all_mirrors).await;
        all_mirrors = false;
        if ok {
            backoff.reset();
        } else {
            // New work waits too: during an outage every publish would
            // otherwise be one more failing request.
            tokio::time::sleep(backoff.next_delay()).await;
            all_mirrors = true;
            continue;
        }
        tokio::select! {
            () = inner.wake.notified() => {}
            () = inner.shared.mirrors_changed.notified() => all_mirrors = true,
            () = tokio::time::sleep(inner.shared.options.mirror_resync) => all_mirrors = true,
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends everything pending; false if something must be retried.
    async fn round(&self, all_mirrors: bool) -> bool {
        let mut ok = true;
        let pending = std::mem::take(&mut self.lock().pending);
        for (uid, work) in pending {
            if let Err(e) = self.api_pod(&uid, &work).await {
                tracing::warn!(error = %e, "pod status not sent, retrying");
                ok = false;
                let mut st = self.lock();
                // Newer work queued meanwhile wins; a delete is never forgotten.
                let w = st.pending.entry(uid).or_insert(Work {
                    pod: work.pod,
                    status: None,
                    delete: false,
                });
                if w.status.is_none() {
                    w.status = work.status;
                }
                w.delete |= work.delete;
            }
        }
        let deletes = std::mem::take(&mut self.lock().mirror_deletes);
        for (static_uid, (ns, name)) in deletes {
            if let Err(e) = self.delete_mirror(&static_uid, &ns, &name).await {
                tracing::warn!(error = %e, "mirror pod not deleted, retrying");
                ok = false;
                self.lock().mirror_deletes.insert(static_uid, (ns, name));
            }
        }
        let statics: Vec<(String, Pod, Option<PodStatus>)> = self
            .lock()
            .statics
            .iter()
            .filter(|(_, e)| all_mirrors || e.dirty)
            .map(|(u, e)| (u.clone(), e.pod.clone(), e.status.clone()))
            .collect();
        for (static_uid, pod, status) in statics {
            match self.ensure_mirror(&static_uid, &pod, status.as_ref()).await {
                Ok(()) => {
                    if let Some(e) = self.lock().statics.get_mut(&static_uid)
                        && e.status == status
                    {
                        e.dirty = false;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "mirror pod not in sync, retrying");
                    ok = false;
                }
            }
        }
        self.prune();
        ok
    }

    /// Forgets what was published for pods no longer on the node.
    fn prune(&self) {
        let live: HashSet<String> = self
            .shared
            .pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        let mut st = self.lock();
        let State {
            published, pending, ..
        } = &mut *st;
        published.retain(|uid, _| live.contains(uid) || pending.contains_key(uid));
    }

    async fn api_pod(&self, uid: &str, work: &Work) -> Result<(), ApiError> {
        let (ns, name, _) = meta(&work.pod);
        if let Some(status) = &work.status {
            let already = self.lock().published.get(uid) == Some(status);
            if !already {
                match self.patch_status(&ns, &name, uid, status).await? {
                    Outcome::Done => {
                        self.lock().published.insert(uid.to_owned(), status.clone());
                    }
                    Outcome::Gone => return Ok(()),
                }
            }
        }
        if work.delete {
            self.delete_pod(&ns, &name, uid).await?;
            self.lock().published.remove(uid);
        }
        Ok(())
    }

    async fn patch_status(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        status: &PodStatus,
    ) -> Result<Outcome, ApiError> {
        // The watch already shows another pod under this name: no request.
        if let Some(c) = self.shared.cached(ns, name)
            && c.metadata.uid.as_deref() != Some(uid)
        {
            return Ok(Outcome::Gone);
        }
        let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), ns);
        let patch = status_patch(uid, status);
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(Outcome::Done),
            Err(e) if matches!(status_code(&e), Some(404 | 409)) => {
                tracing::debug!(pod = %name, %uid, error = %e, "status not sent: pod gone or replaced");
                Ok(Outcome::Gone)
            }
            Err(e) => Err(ApiError::call("patch status", "pod", name)(e)),
        }
    }

    /// Deletes the pod for good, only if it still is pod `uid`.
    async fn delete_pod(&self, ns: &str, name: &str, uid: &str) -> Result<(), ApiError> {
        let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), ns);
        match api.delete(name, &delete_params(uid)).await {
            Ok(_) => {
                tracing::info!(pod = %format!("{ns}/{name}"), %uid, "pod deleted");
                Ok(())
            }
            Err(e) if status_code(&e) == Some(404) => Ok(()),
            Err(e) if status_code(&e) == Some(409) => {
                tracing::info!(pod = %format!("{ns}/{name}"), %uid, "not deleted: the name now belongs to another pod");
                Ok(())
            }
            Err(e) => Err(ApiError::call("delete", "pod", name)(e)),
        }
    }

    /// Makes the mirror pod of a static pod exist, current, with its status
    /// (pkg/kubelet/kubelet.go `syncPod`: a missing or outdated mirror is
    /// (re)created, one being deleted is deleted for good first).
    async fn ensure_mirror(
        &self,
        static_uid: &str,
        pod: &Pod,
        status: Option<&PodStatus>,
    ) -> Result<(), ApiError> {
        let node = self.shared.node_name.clone();
        let node_uid = self
            .shared
            .node_uid()
            .ok_or_else(|| ApiError::NotRegistered { node: node.clone() })?;
        let (ns, name, _) = meta(pod);
        let sp = StaticPod {
            path: PathBuf::new(),
            uid: static_uid.to_owned(),
            namespace: ns.clone(),
            name: name.clone(),
            pod: pod.clone(),
        };
        let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), &ns);
        let mut mirror = self
            .shared
            .cached(&ns, &name)
            .filter(|m| static_pods::is_mirror_of(m, &sp));
        if mirror.is_none() {
            // The watch may lag behind our own writes: ask the API.
            mirror = match api
                .get_opt(&name)
                .await
                .map_err(ApiError::call("get", "pod", &name))?
            {
                Some(m) if static_pods::is_mirror_of(&m, &sp) => Some(m),
                Some(m) if super::pods::is_mirror(&m) => {
                    let old = m.metadata.uid.clone().unwrap_or_default();
                    tracing::info!(pod = %format!("{ns}/{name}"), "replacing an outdated mirror pod");
                    self.delete_pod(&ns, &name, &old).await?;
                    None
                }
                Some(_) => {
                    // A pod someone else created holds the name: it is not
                    // ours to delete.
                    tracing::warn!(pod = %format!("{ns}/{name}"), "a non-mirror pod holds the static pod's name");
                    return Ok(());
                }
                None => None,
            };
        }
        let mirror = match mirror {
            Some(m) => m,
            None => {
                let created = api
                    .create(
                        &PostParams::default(),
                        &static_pods::mirror_pod(&sp, &node, &node_uid),
                    )
                    .await
                    .map_err(ApiError::call("create", "mirror pod", &name))?;
                tracing::info!(pod = %format!("{ns}/{name}"), "mirror pod created");
                created
            }
        };
        let Some(status) = status else {
            return Ok(());
        };
        let mirror_uid = mirror.metadata.uid.clone().unwrap_or_default();
        if self.lock().published.get(&mirror_uid) == Some(status) {
            return Ok(());
        }
        if let Outcome::Done = self.patch_status(&ns, &name, &mirror_uid, status).await? {
            self.lock().published.insert(mirror_uid, status.clone());
        } else {
            // Replaced while we looked: the next round sees the new one.
            self.shared.mirrors_changed.notify_one();
        }
        Ok(())
    }

    /// Deletes the mirror of a terminated static pod, if it still mirrors it.
    async fn delete_mirror(&self, static_uid: &str, ns: &str, name: &str) -> Result<(), ApiError> {
        let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), ns);
        let Some(m) = api
            .get_opt(name)
            .await
            .map_err(ApiError::call("get", "pod", name))?
        else {
            return Ok(());
        };
        let mirrors_it = m
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(CONFIG_MIRROR))
            .is_some_and(|h| h == static_uid);
        if mirrors_it {
            self.delete_pod(ns, name, m.metadata.uid.as_deref().unwrap_or_default())
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_patch_carries_uid_and_clears() {
        let s = PodStatus {
            phase: Some("Running".to_owned()),
            ..Default::default()
        };
        let p = status_patch("u1", &s);
        assert_eq!(p["metadata"]["uid"], "u1");
        assert_eq!(p["status"]["phase"], "Running");
        assert!(p["status"]["podIP"].is_null());
        assert!(p["status"].as_object().unwrap().contains_key("message"));
    }

    #[test]
    fn delete_is_grace_zero_with_uid() {
        let d = delete_params("u2");
        assert_eq!(d.grace_period_seconds, Some(0));
        assert_eq!(d.preconditions.and_then(|p| p.uid).as_deref(), Some("u2"));
    }
}
