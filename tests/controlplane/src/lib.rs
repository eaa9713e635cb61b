//! A minimal control plane for tests and demos, run against the test API
//! server through kube-rs. See the README for what it does and does not do.
//!
//! Each controller decides in a pure function (`scheduler::schedule`,
//! `endpointslices::desired`/`plan`) and acts in its `run` module.
use std::{future::Future, time::Duration};

use kube::Client;

pub mod cache;
pub mod daemonsets;
pub mod deployments;
pub mod endpointslices;
pub mod expectations;
pub mod gc;
pub mod pods;
pub mod quantity;
pub mod replicasets;
pub mod scheduler;
pub mod selector;
#[cfg(test)]
mod testing;

pub use cache::Caches;

/// A pass also runs this long after the last one with no change seen, as
/// informers resync.
const RESYNC: Duration = Duration::from_secs(30);
/// After a failed pass (a conflict, the API server away).
const RETRY: Duration = Duration::from_secs(1);
/// Changes that arrive together make one pass.
const DEBOUNCE: Duration = Duration::from_millis(20);

/// Runs `sync` on every change until the task is dropped.
pub async fn control_loop<F, Fut>(name: &str, caches: Caches, mut sync: F)
where
    F: FnMut(Caches) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let mut changes = caches.changes();
    loop {
        let wait = match sync(caches.clone()).await {
            Ok(()) => RESYNC,
            Err(e) => {
                tracing::warn!("{name}: {e:#}");
                RETRY
            }
        };
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            _ = tokio::time::sleep(wait) => {}
        }
        tokio::time::sleep(DEBOUNCE).await;
        changes.mark_unchanged();
    }
}

/// The running control plane; dropping it stops every controller.
pub struct ControlPlane {
    _tasks: tokio::task::JoinSet<()>,
}

impl ControlPlane {
    /// Lists everything, then starts the controllers.
    pub async fn start(client: Client) -> Self {
        let mut tasks = tokio::task::JoinSet::new();
        let caches = Caches::start(&client, &mut tasks).await;
        tasks.spawn(scheduler::run::run(client.clone(), caches.clone()));
        tasks.spawn(deployments::run::run(client.clone(), caches.clone()));
        tasks.spawn(daemonsets::run::run(client.clone(), caches.clone()));
        tasks.spawn(replicasets::run::run(client.clone(), caches.clone()));
        tasks.spawn(gc::run(client.clone(), caches.clone()));
        tasks.spawn(endpointslices::run::run(client, caches));
        ControlPlane { _tasks: tasks }
    }
}
