//! The pods bound to this node (pkg/kubelet/config/apiserver.go watches
//! `spec.nodeName=<node>`), turned into [`PodEvent`]s. kube-runtime's watcher
//! relists after an outage or a 410; the relist is diffed against what we
//! had, so a pod deleted meanwhile still becomes a `Remove`.
use std::{collections::BTreeMap, pin::pin, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    api::Api,
    runtime::watcher::{self, Event, watcher},
};
use tokio::sync::mpsc;

use super::{Backoff, Shared};
use crate::{
    flow::{PodEvent, PodSource},
    static_pods::CONFIG_MIRROR,
};

type Key = (String, String);

fn key(p: &Pod) -> Key {
    (
        p.metadata.namespace.clone().unwrap_or_default(),
        p.metadata.name.clone().unwrap_or_default(),
    )
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

/// Mirror pods stand for static pods the kubelet already runs from their
/// files; running them again would start every static pod twice.
pub(crate) fn is_mirror(p: &Pod) -> bool {
    p.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CONFIG_MIRROR))
}

/// Runs until the worker drops its receiver.
pub(crate) async fn run(shared: Arc<Shared>, events: mpsc::Sender<PodEvent>) {
    let api: Api<Pod> = Api::all(shared.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={}", shared.node_name));
    let mut stream = pin!(watcher(api, config));
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    let mut tracker = Tracker {
        shared: shared.clone(),
        relist: None,
    };
    loop {
        let next = tokio::select! {
            next = stream.next() => next,
            () = events.closed() => return,
        };
        let (out, listed) = match next {
            None => return,
            Some(Err(e)) => {
                let d = backoff.next_delay();
                tracing::warn!(error = %e, retry_in = ?d, "pod watch failed");
                tokio::time::sleep(d).await;
                continue;
            }
            Some(Ok(ev)) => {
                backoff.reset();
                let listed = matches!(ev, Event::InitDone);
                (tracker.handle(ev), listed)
            }
        };
        for ev in out {
            if events.send(ev).await.is_err() {
                return;
            }
        }
        // After the events: the worker has them queued before anyone reaps.
        if listed {
            shared.pods_listed.send_replace(true);
        }
    }
}

/// Keeps [`Shared::pods`] in step with the watch and says what the worker
/// must hear.
pub(crate) struct Tracker {
    pub(crate) shared: Arc<Shared>,
    /// Objects of a relist in progress (between `Init` and `InitDone`).
    pub(crate) relist: Option<BTreeMap<Key, Pod>>,
}

impl Tracker {
    pub(crate) fn handle(&mut self, ev: Event<Pod>) -> Vec<PodEvent> {
        match ev {
            Event::Init => {
                self.relist = Some(BTreeMap::new());
                Vec::new()
            }
            Event::InitApply(p) => {
                self.relist.get_or_insert_default().insert(key(&p), p);
                Vec::new()
            }
            Event::InitDone => {
                let listed = self.relist.take().unwrap_or_default();
                let mut cache = self.shared.pods.lock().unwrap_or_else(|e| e.into_inner());
                let mut out = Vec::new();
                let gone: Vec<Pod> = cache
                    .iter()
                    .filter(|(k, p)| listed.get(*k).is_none_or(|l| uid(l) != uid(p)))
                    .map(|(_, p)| p.clone())
                    .collect();
                for p in gone {
                    cache.remove(&key(&p));
                    self.removed(&p, &mut out);
                }
                for p in listed.into_values() {
                    self.applied(&mut cache, p, &mut out);
                }
                out
            }
            Event::Apply(p) => {
                let mut cache = self.shared.pods.lock().unwrap_or_else(|e| e.into_inner());
                let mut out = Vec::new();
                self.applied(&mut cache, p, &mut out);
                out
            }
            Event::Delete(p) => {
                let mut cache = self.shared.pods.lock().unwrap_or_else(|e| e.into_inner());
                let k = key(&p);
                if cache.get(&k).is_some_and(|c| uid(c) == uid(&p)) {
                    cache.remove(&k);
                }
                let mut out = Vec::new();
                self.removed(&p, &mut out);
                out
            }
        }
    }

    fn applied(&self, cache: &mut BTreeMap<Key, Pod>, p: Pod, out: &mut Vec<PodEvent>) {
        let k = key(&p);
        match cache.get(&k) {
            Some(c)
                if uid(c) == uid(&p)
                    && c.metadata.resource_version == p.metadata.resource_version =>
            {
                return;
            }
            // Recreated under the same name while we were not watching: the
            // old pod is gone, whatever the new one is.
            Some(c) if uid(c) != uid(&p) => {
                let old = c.clone();
                self.removed(&old, out);
            }
            _ => {}
        }
        cache.insert(k, p.clone());
        if is_mirror(&p) {
            self.shared.mirrors_changed.notify_one();
        } else {
            out.push(PodEvent::Upsert {
                pod: Box::new(p),
                source: PodSource::Api,
            });
        }
    }

    fn removed(&self, p: &Pod, out: &mut Vec<PodEvent>) {
        if is_mirror(p) {
            self.shared.mirrors_changed.notify_one();
        } else {
            out.push(PodEvent::Remove {
                uid: uid(p),
                grace: deletion_grace(p),
            });
        }
    }
}

/// The grace period a deleted pod was given: 0 for a force delete. `None`
/// when the object vanished without a graceful delete.
fn deletion_grace(p: &Pod) -> Option<std::time::Duration> {
    p.metadata.deletion_timestamp.as_ref()?;
    let secs = p.metadata.deletion_grace_period_seconds?;
    Some(std::time::Duration::from_secs(
        u64::try_from(secs).unwrap_or(0),
    ))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod(name: &str, uid: &str, rv: &str, mirror: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                resource_version: Some(rv.into()),
                annotations: mirror.then(|| [(CONFIG_MIRROR.to_owned(), "h".to_owned())].into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn summary(evs: &[PodEvent]) -> Vec<String> {
        evs.iter()
            .map(|e| match e {
                PodEvent::Upsert { pod, .. } => format!("+{}", uid(pod)),
                PodEvent::Remove { uid, .. } => format!("-{uid}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn relist_diffs_against_the_cache() {
        let mut t = Tracker {
            shared: crate::api::tests::shared(),
            relist: None,
        };
        let mut run = |evs: Vec<Event<Pod>>| {
            evs.into_iter()
                .flat_map(|e| t.handle(e))
                .collect::<Vec<_>>()
        };
        let first = run(vec![
            Event::Init,
            Event::InitApply(pod("a", "ua", "1", false)),
            Event::InitApply(pod("b", "ub", "2", false)),
            Event::InitApply(pod("m", "um", "3", true)),
            Event::InitDone,
        ]);
        assert_eq!(summary(&first), ["+ua", "+ub"], "mirror pods are not run");
        // Unchanged objects are not sent again.
        assert!(run(vec![Event::Apply(pod("a", "ua", "1", false))]).is_empty());
        // After an outage: a deleted, b unchanged, a new pod under a's name.
        let relist = run(vec![
            Event::Init,
            Event::InitApply(pod("b", "ub", "2", false)),
            Event::InitApply(pod("a", "ua2", "7", false)),
            Event::InitApply(pod("m", "um", "3", true)),
            Event::InitDone,
        ]);
        assert_eq!(summary(&relist), ["-ua", "+ua2"]);
        assert_eq!(
            summary(&run(vec![Event::Delete(pod("b", "ub", "8", false))])),
            ["-ub"]
        );
        // Missed delete and recreate between two watch events.
        assert_eq!(
            summary(&run(vec![Event::Apply(pod("a", "ua3", "9", false))])),
            ["-ua2", "+ua3"]
        );
        assert!(run(vec![Event::Delete(pod("m", "um", "10", true))]).is_empty());
        let cache = t.shared.pods.lock().unwrap();
        assert_eq!(cache.len(), 1);
    }
}
