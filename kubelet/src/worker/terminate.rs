//! Termination as a state of the pod task, as the kubelet's pod workers keep
//! it: while the pod's containers stop, the task still reads its messages,
//! and a shorter grace period (a second `kubectl delete --grace-period`, a
//! force delete) cancels the stop in flight and starts it again with the
//! earlier deadline, as `UpdatePod` cancels `syncTerminatingPod`. preStop
//! hooks run once, whatever the restarts.
//!
//! ```text
//!  Remove / deletionTimestamp ─▶ terminating(grace)
//!      ├─ stop: preStop hooks, StopContainer(deadline - now), StopPodSandbox
//!      │     ▲ restarted with the earlier deadline
//!      ├─ message with a shorter grace ──┘
//!      └─ stopped ─▶ final status ─▶ RemovePodSandbox ─▶ pod dir ─▶ terminated
//! ```
use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::future::join_all;
use tokio::sync::mpsc;

use super::{
    PodMsg, lifecycle::MIN_GRACE, lifecycle::run_handler, lock, pod_task::PodTask, snapshot,
};
use crate::{
    cri::{CriError, Runtime},
    pod::PodSpec,
};

/// Containers whose preStop hook already ran (or runs) in this termination.
type Hooked = Arc<Mutex<HashSet<String>>>;

impl<R: Runtime + 'static> PodTask<R> {
    /// Stops the pod for good (its file is gone, or the API deleted it),
    /// then reports it terminated. Retries until the runtime lets it finish.
    pub(super) async fn terminating(
        &mut self,
        grace: Duration,
        rx: &mut mpsc::UnboundedReceiver<PodMsg>,
    ) {
        tracing::info!(pod = %self.full_name(), grace = ?grace, "terminating pod");
        for p in self.probes.values_mut() {
            p.set_deleting();
        }
        let hooked = Hooked::default();
        let mut deadline = Instant::now() + grace;
        loop {
            let stop = stop_pod(
                self.shared.runtime.clone(),
                self.uid.clone(),
                self.spec.as_ref().ok().cloned(),
                self.full_name(),
                deadline,
                hooked.clone(),
            );
            tokio::pin!(stop);
            let sooner = loop {
                tokio::select! {
                    () = &mut stop => break None,
                    msg = rx.recv() => {
                        let asked = match msg {
                            Some(PodMsg::Update(pod)) => {
                                let g = pod.metadata.deletion_grace_period_seconds;
                                self.pod = *pod;
                                g.map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0)))
                            }
                            Some(PodMsg::Remove { grace }) => grace,
                            Some(PodMsg::Relisted(_) | PodMsg::Evict(_)) => None,
                            // The worker is going away: the pod stays as it is.
                            None => return,
                        };
                        let at = asked.map(|g| Instant::now() + g);
                        if let Some(at) = at.filter(|at| *at < deadline) {
                            break Some(at);
                        }
                    }
                }
            };
            match sooner {
                None => break,
                Some(at) => {
                    tracing::info!(pod = %self.full_name(), grace = ?at.saturating_duration_since(Instant::now()), "grace period shortened");
                    deadline = at;
                }
            }
        }
        self.finish_teardown(false).await;
        self.shared.sink.terminated(&self.pod, &self.source);
        self.shared.view.remove(&self.uid);
        tracing::info!(pod = %self.full_name(), "pod terminated");
    }

    /// Kills the pod to recreate it (its spec changed): the status goes on.
    pub(super) async fn teardown(&mut self, grace: Duration) {
        for p in self.probes.values_mut() {
            p.set_deleting();
        }
        stop_pod(
            self.shared.runtime.clone(),
            self.uid.clone(),
            self.spec.as_ref().ok().cloned(),
            self.full_name(),
            Instant::now() + grace,
            Hooked::default(),
        )
        .await;
        self.finish_teardown(true).await;
    }

    /// After every container stopped: the final status, then the sandboxes
    /// removed, then (for good) the pod directory. `keep_status`: the pod
    /// lives on, so the status is not published as terminal.
    async fn finish_teardown(&mut self, keep_status: bool) {
        loop {
            match self.try_finish(keep_status).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(pod = %self.full_name(), error = %e, "teardown failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        self.state = None;
        if !keep_status && let Err(e) = super::pod_dir::remove(&self.shared.config, &self.uid) {
            tracing::warn!(pod = %self.full_name(), error = %e, "pod directory left in place");
        }
    }

    async fn try_finish(&mut self, keep_status: bool) -> Result<(), CriError> {
        let rt = self.shared.runtime.clone();
        // The containers' final states, before removal takes them away.
        let last = self.relist().await?;
        if let Ok(spec) = self.spec.clone() {
            if keep_status {
                self.publish_snapshot(&spec, &last);
            } else {
                self.publish_with(&spec, &last, true);
            }
        }
        for sb in &last.sandboxes {
            rt.remove_pod_sandbox(&sb.id)
                .await
                .or_else(ignore_not_found)?;
        }
        Ok(())
    }
}

/// preStop hooks, then every container stopped by `deadline` (at least
/// [`MIN_GRACE`] each), then the sandboxes; retried until the runtime lets it
/// finish. Owns what it needs, so that the task can read messages meanwhile.
async fn stop_pod<R: Runtime>(
    rt: Arc<R>,
    uid: String,
    spec: Option<PodSpec>,
    name: String,
    deadline: Instant,
    hooked: Hooked,
) {
    loop {
        match try_stop(&rt, &uid, spec.as_ref(), &name, deadline, &hooked).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(pod = %name, error = %e, "stopping the pod failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

async fn try_stop<R: Runtime>(
    rt: &Arc<R>,
    uid: &str,
    spec: Option<&PodSpec>,
    name: &str,
    deadline: Instant,
    hooked: &Hooked,
) -> Result<(), CriError> {
    let snap = snapshot::relist(&**rt, uid).await?.snapshot;
    let pod_ip = snap.ready.as_ref().and_then(|s| s.ip);
    // Every container at once, each with its preStop then its stop, as
    // the kubelet's killContainersWithSyncResult.
    let stops = snap.running().map(|inst| {
        let hook = spec
            .and_then(|s| s.container(&inst.status.name))
            .and_then(|c| c.pre_stop.clone())
            .filter(|_| lock(hooked).insert(inst.status.id.clone()));
        let (id, cname) = (inst.status.id.clone(), inst.status.name.clone());
        async move {
            if let (Some(h), Some(ip)) = (hook, pod_ip) {
                let left = deadline.saturating_duration_since(Instant::now());
                if let Err(message) = run_handler(&**rt, &h, &id, ip, left).await {
                    tracing::warn!(pod = %name, container = %cname, %message, "preStop hook failed");
                }
            }
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(MIN_GRACE);
            rt.stop_container(&id, left).await
        }
    });
    for r in join_all(stops).await {
        match r {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    for sb in &snap.sandboxes {
        rt.stop_pod_sandbox(&sb.id)
            .await
            .or_else(ignore_not_found)?;
    }
    Ok(())
}

fn ignore_not_found(e: CriError) -> Result<(), CriError> {
    if e.is_not_found() { Ok(()) } else { Err(e) }
}
