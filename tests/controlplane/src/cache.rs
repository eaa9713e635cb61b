//! Informers: one reflector per kind, all feeding one change counter that
//! the controllers wait on. Controllers are level-triggered: a change to
//! anything re-runs their whole decision, which is cheap at the sizes a test
//! cluster has and cannot miss an edge.
use std::{fmt::Debug, time::Duration};

use futures::StreamExt as _;
use kube::{
    Api, Client, Resource,
    runtime::{WatchStreamExt as _, reflector, utils::Backoff, watcher},
};
use tokio::sync::watch;

use k8s_openapi::{
    api::{
        apps::v1::{DaemonSet, Deployment, ReplicaSet},
        coordination::v1::Lease,
        core::v1::{Node, Pod, Service},
        discovery::v1::EndpointSlice,
        policy::v1::PodDisruptionBudget,
    },
    serde::de::DeserializeOwned,
};

pub use reflector::Store;

/// The caches every controller reads.
#[derive(Clone)]
pub struct Caches {
    pub pods: Store<Pod>,
    pub nodes: Store<Node>,
    pub services: Store<Service>,
    pub slices: Store<EndpointSlice>,
    pub replicasets: Store<ReplicaSet>,
    pub deployments: Store<Deployment>,
    pub daemonsets: Store<DaemonSet>,
    pub budgets: Store<PodDisruptionBudget>,
    /// Node heartbeats (kube-node-lease).
    pub leases: Store<Lease>,
    changed: watch::Receiver<u64>,
}

impl Caches {
    /// Starts the reflectors; returns once each has listed.
    pub async fn start(client: &Client, tasks: &mut tokio::task::JoinSet<()>) -> Self {
        let (tx, changed) = watch::channel(0u64);
        let caches = Caches {
            pods: reflect(Api::all(client.clone()), &tx, tasks),
            nodes: reflect(Api::all(client.clone()), &tx, tasks),
            services: reflect(Api::all(client.clone()), &tx, tasks),
            slices: reflect(Api::all(client.clone()), &tx, tasks),
            replicasets: reflect(Api::all(client.clone()), &tx, tasks),
            deployments: reflect(Api::all(client.clone()), &tx, tasks),
            daemonsets: reflect(Api::all(client.clone()), &tx, tasks),
            budgets: reflect(Api::all(client.clone()), &tx, tasks),
            leases: reflect(
                Api::namespaced(client.clone(), "kube-node-lease"),
                &tx,
                tasks,
            ),
            changed,
        };
        // The writers live as long as the tasks: these cannot fail first.
        let _ = caches.pods.wait_until_ready().await;
        let _ = caches.nodes.wait_until_ready().await;
        let _ = caches.services.wait_until_ready().await;
        let _ = caches.slices.wait_until_ready().await;
        let _ = caches.replicasets.wait_until_ready().await;
        let _ = caches.deployments.wait_until_ready().await;
        let _ = caches.daemonsets.wait_until_ready().await;
        let _ = caches.leases.wait_until_ready().await;
        let _ = caches.budgets.wait_until_ready().await;
        caches
    }

    /// A receiver that wakes on any change after now.
    pub fn changes(&self) -> watch::Receiver<u64> {
        let mut rx = self.changed.clone();
        rx.mark_unchanged();
        rx
    }
}

fn reflect<K>(
    api: Api<K>,
    tx: &watch::Sender<u64>,
    tasks: &mut tokio::task::JoinSet<()>,
) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let tx = tx.clone();
    let stream = reflector(
        writer,
        watcher(api, watcher::Config::default()).backoff(Retry::default()),
    );
    tasks.spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(_) => tx.send_modify(|n| *n += 1),
                Err(e) => tracing::warn!("watch {}: {e}", K::plural(&())),
            }
        }
    });
    store
}

/// How a reflector waits between failed watches: doubling from 250 ms to
/// 2 s. client-go's (and kube's default) doubles to 30 s with up to 100%
/// jitter, so after the drills' 10 s API-server outage one kind's cache
/// could stay stale for another 20 s while the others had recovered: the
/// scheduler, its node watch still waiting, bound pods to a node `kubectl
/// drain` had just cordoned. A test cluster's controllers should be back
/// when the server is, as the agent's watches are (its reconnect probe).
#[derive(Clone, Copy, Debug)]
struct Retry(Duration);

const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(2);

impl Default for Retry {
    fn default() -> Self {
        Self(RETRY_FIRST)
    }
}

impl Iterator for Retry {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = self.0;
        self.0 = (wait * 2).min(RETRY_MAX);
        Some(wait)
    }
}

impl Backoff for Retry {
    fn reset(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_double_to_two_seconds_and_start_over_after_a_success() {
        let mut r = Retry::default();
        let waits: Vec<u64> = r.by_ref().take(6).map(|d| d.as_millis() as u64).collect();
        assert_eq!(waits, [250, 500, 1000, 2000, 2000, 2000]);
        r.reset();
        assert_eq!(r.next(), Some(RETRY_FIRST));
    }
}
