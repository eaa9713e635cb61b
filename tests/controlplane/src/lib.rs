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
pub mod disruption;
pub mod endpointslices;
pub mod expectations;
pub mod gc;
pub mod nodes;
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
pub async fn control_loop<F, Fut>(name: &str, caches: Caches, sync: F)
where
    F: FnMut(Caches) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    control_loop_every(name, caches, RESYNC, sync).await;
}

/// [`control_loop`], also run `resync` after a pass with nothing new.
pub async fn control_loop_every<F, Fut>(name: &str, caches: Caches, resync: Duration, mut sync: F)
where
    F: FnMut(Caches) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let mut changes = caches.changes();
    loop {
        let wait = match sync(caches.clone()).await {
            Ok(()) => resync,
            Err(e) => {
                tracing::warn!("{name}: {e:#}");
                RETRY.min(resync)
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

/// Timing of the node lifecycle controller, as kube-controller-manager's
/// flags of the same names.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// How long a silent kubelet's node stays Ready (40 s upstream).
    pub node_monitor_grace_period: Duration,
    /// How often nodes are checked without any change (5 s upstream).
    pub node_monitor_period: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            node_monitor_grace_period: Duration::from_secs(40),
            node_monitor_period: Duration::from_secs(5),
        }
    }
}

/// The running control plane; dropping it stops every controller.
pub struct ControlPlane {
    _tasks: tokio::task::JoinSet<()>,
}

impl ControlPlane {
    /// Lists everything, then starts the controllers.
    pub async fn start(client: Client) -> Self {
        Self::start_with(client, Options::default()).await
    }

    pub async fn start_with(client: Client, options: Options) -> Self {
        let mut tasks = tokio::task::JoinSet::new();
        let caches = Caches::start(&client, &mut tasks).await;
        tasks.spawn(scheduler::run::run(client.clone(), caches.clone()));
        tasks.spawn(deployments::run::run(client.clone(), caches.clone()));
        tasks.spawn(daemonsets::run::run(client.clone(), caches.clone()));
        tasks.spawn(replicasets::run::run(client.clone(), caches.clone()));
        tasks.spawn(gc::run(client.clone(), caches.clone()));
        tasks.spawn(disruption::run::run(client.clone(), caches.clone()));
        tasks.spawn(nodes::run::run(
            client.clone(),
            caches.clone(),
            options.node_monitor_grace_period,
            options.node_monitor_period,
        ));
        tasks.spawn(endpointslices::run::run(client, caches));
        ControlPlane { _tasks: tasks }
    }
}
