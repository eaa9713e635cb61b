//! The node-wide PLEG, as the kubelet's `GenericPLEG`: one relist of every
//! sandbox and container per period (two CRI calls, however many pods run),
//! compared with the last one; only a pod whose sandboxes or containers
//! changed state is inspected (its statuses read) and its worker woken with
//! the new [`Snapshot`]. An idle node therefore costs two calls a period,
//! where one relist per pod worker cost four plus one per container.
//!
//! ```text
//!  every relist_period: ListPodSandbox + ListContainers (all)
//!        │ group by io.kubernetes.pod.uid, compare with the last records
//!        ▼
//!  changed pod ─▶ inspect (sandbox + container statuses) ─▶ Relisted ─▶ manager ─▶ its worker
//!        └─ a failed inspect keeps the old record: retried next period
//!  successful relist ─▶ NodeHealth (PLEG is not healthy after 3 min without one)
//! ```
use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use tokio::{sync::mpsc, time::Instant};

use super::{
    POD_UID_LABEL,
    snapshot::{Stamped, inspect},
};
use crate::{
    cri::{ContainerInfo, ContainerState, Runtime, SandboxInfo, SandboxState},
    health::NodeHealth,
};

/// A pod whose runtime state changed, as read at `state.at`.
#[derive(Debug)]
pub(super) struct Relisted {
    pub uid: String,
    pub state: Stamped,
}

/// What the comparison looks at: each sandbox's and container's state, by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Record {
    sandboxes: BTreeMap<String, SandboxState>,
    containers: BTreeMap<String, ContainerState>,
}

#[derive(Default)]
struct Listed {
    sandboxes: Vec<SandboxInfo>,
    containers: Vec<ContainerInfo>,
}

impl Listed {
    fn record(&self) -> Record {
        Record {
            sandboxes: self
                .sandboxes
                .iter()
                .map(|s| (s.id.clone(), s.state))
                .collect(),
            containers: self
                .containers
                .iter()
                .map(|c| (c.id.clone(), c.state))
                .collect(),
        }
    }
}

pub(super) struct Pleg<R> {
    runtime: Arc<R>,
    health: Option<Arc<NodeHealth>>,
    records: HashMap<String, Record>,
    /// The last relist error, logged once.
    error: Option<String>,
}

impl<R: Runtime> Pleg<R> {
    pub fn new(runtime: Arc<R>, health: Option<Arc<NodeHealth>>) -> Self {
        Self {
            runtime,
            health,
            records: HashMap::new(),
            error: None,
        }
    }

    /// One relist: the pods whose state changed since the last one, each
    /// with its new state. A pod with nothing left in the runtime gets an
    /// empty snapshot, once.
    pub async fn relist(&mut self) -> Vec<Relisted> {
        let at = Instant::now();
        let rt = &*self.runtime;
        let listed = match rt.list_pod_sandboxes(&Default::default()).await {
            Ok(s) => match rt.list_containers(&Default::default()).await {
                Ok(c) => Ok((s, c)),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        let (sandboxes, containers) = match listed {
            Ok(l) => l,
            Err(e) => {
                let msg = e.to_string();
                if self.error.as_ref() != Some(&msg) {
                    tracing::warn!(error = %msg, "PLEG relist failed");
                }
                self.error = Some(msg);
                return Vec::new();
            }
        };
        if self.error.take().is_some() {
            tracing::info!("PLEG relists again");
        }
        if let Some(h) = &self.health {
            h.record_relist(at);
        }
        let mut pods: HashMap<String, Listed> = HashMap::new();
        for s in sandboxes {
            if let Some(uid) = s.labels.get(POD_UID_LABEL) {
                pods.entry(uid.clone()).or_default().sandboxes.push(s);
            }
        }
        for c in containers {
            if let Some(uid) = c.labels.get(POD_UID_LABEL) {
                pods.entry(uid.clone()).or_default().containers.push(c);
            }
        }
        let gone: Vec<String> = self
            .records
            .keys()
            .filter(|uid| !pods.contains_key(*uid))
            .cloned()
            .collect();
        let mut changed = Vec::new();
        for uid in gone {
            self.records.remove(&uid);
            changed.push(Relisted {
                uid,
                state: Stamped {
                    at,
                    snapshot: Default::default(),
                },
            });
        }
        for (uid, listed) in pods {
            let record = listed.record();
            if self.records.get(&uid) == Some(&record) {
                continue;
            }
            match inspect(rt, listed.sandboxes, listed.containers).await {
                Ok(snapshot) => {
                    self.records.insert(uid.clone(), record);
                    changed.push(Relisted {
                        uid,
                        state: Stamped { at, snapshot },
                    });
                }
                // The old record stays, so the pod counts as changed again
                // on the next relist (the kubelet's podsToReinspect).
                Err(e) => tracing::debug!(%uid, error = %e, "PLEG cannot inspect a pod; retrying"),
            }
        }
        changed
    }

    /// Relists every `period` until the receiver goes.
    pub async fn run(mut self, period: Duration, tx: mpsc::UnboundedSender<Vec<Relisted>>) {
        let mut tick = tokio::time::interval(period);
        // A slow relist is not made up for with a burst.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let changed = self.relist().await;
            if !changed.is_empty() && tx.send(changed).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::{ContainerConfig, FakeRuntime, Labels, SandboxConfig};

    const IMAGE: &str = "busybox";

    fn labels(uid: &str) -> Labels {
        Labels::from([(POD_UID_LABEL.to_owned(), uid.to_owned())])
    }

    async fn pod(rt: &FakeRuntime, uid: &str) -> (String, String) {
        let sb = SandboxConfig {
            name: format!("p-{uid}"),
            namespace: "ns".into(),
            uid: uid.into(),
            labels: labels(uid),
            ..Default::default()
        };
        let id = rt.run_pod_sandbox(&sb).await.unwrap();
        let c = ContainerConfig {
            name: "c".into(),
            image: IMAGE.into(),
            labels: labels(uid),
            ..Default::default()
        };
        let cid = rt.create_container(&id, &c, &sb).await.unwrap();
        rt.start_container(&cid).await.unwrap();
        (id, cid)
    }

    fn unavailable(operation: &'static str, message: &str) -> crate::cri::CriError {
        crate::cri::CriError::Status {
            operation,
            code: tonic::Code::Unavailable,
            message: message.into(),
        }
    }

    fn uids(r: &[Relisted]) -> Vec<&str> {
        let mut v: Vec<&str> = r.iter().map(|r| r.uid.as_str()).collect();
        v.sort_unstable();
        v
    }

    fn status_calls(rt: &FakeRuntime, from: usize) -> Vec<String> {
        rt.calls()[from..]
            .iter()
            .filter(|c| c.ends_with("Status"))
            .cloned()
            .collect()
    }

    #[tokio::test]
    async fn only_pods_that_changed_are_inspected_and_reported() {
        let rt = Arc::new(FakeRuntime::new());
        rt.add_image(IMAGE);
        let (_, a) = pod(&rt, "a").await;
        pod(&rt, "b").await;
        let health = NodeHealth::new();
        let mut pleg = Pleg::new(rt.clone(), Some(health.clone()));

        let first = pleg.relist().await;
        assert_eq!(uids(&first), ["a", "b"]);
        let snap = &first.iter().find(|r| r.uid == "a").unwrap().state.snapshot;
        assert!(snap.ready.is_some());
        assert_eq!(snap.latest("c").unwrap().status.id, a);
        assert!(health.state().last_relist.is_some());

        // Nothing changed: two list calls and no status read.
        let before = rt.calls().len();
        assert!(pleg.relist().await.is_empty());
        assert_eq!(rt.calls()[before..], ["ListPodSandbox", "ListContainers"]);

        // A's container exits: only A is inspected, and only A is reported.
        rt.exit_container(&a, 3);
        let before = rt.calls().len();
        let changed = pleg.relist().await;
        assert_eq!(uids(&changed), ["a"]);
        let st = &changed[0].state.snapshot.latest("c").unwrap().status;
        assert_eq!((st.state, st.exit_code), (ContainerState::Exited, 3));
        assert_eq!(
            status_calls(&rt, before),
            ["PodSandboxStatus", "ContainerStatus"]
        );
    }

    #[tokio::test]
    async fn a_failed_inspect_is_retried_and_a_vanished_pod_reported_once() {
        let rt = Arc::new(FakeRuntime::new());
        rt.add_image(IMAGE);
        let (sb, c) = pod(&rt, "a").await;
        let mut pleg = Pleg::new(rt.clone(), None);
        rt.fail_next("ContainerStatus", unavailable("ContainerStatus", "busy"));
        assert!(pleg.relist().await.is_empty());
        assert_eq!(uids(&pleg.relist().await), ["a"]);

        rt.stop_container(&c, Duration::ZERO).await.unwrap();
        rt.remove_container(&c).await.unwrap();
        rt.stop_pod_sandbox(&sb).await.unwrap();
        rt.remove_pod_sandbox(&sb).await.unwrap();
        let gone = pleg.relist().await;
        assert_eq!(uids(&gone), ["a"]);
        assert!(gone[0].state.snapshot.sandboxes.is_empty());
        assert!(pleg.relist().await.is_empty());
    }

    #[tokio::test]
    async fn a_failed_relist_is_not_recorded_as_healthy() {
        let rt = Arc::new(FakeRuntime::new());
        let health = NodeHealth::new();
        let mut pleg = Pleg::new(rt.clone(), Some(health.clone()));
        rt.fail_next("ListContainers", unavailable("ListContainers", "down"));
        assert!(pleg.relist().await.is_empty());
        assert_eq!(health.state().last_relist, None);
        pleg.relist().await;
        assert!(health.state().last_relist.is_some());
    }
}
