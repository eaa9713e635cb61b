//! Probes, lifecycle hooks and termination of one pod.
use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use futures::future::join_all;

use super::pod_task::PodTask;
use crate::{
    cri::{CriError, Runtime},
    pod::{
        Handler, PodSpec,
        probe::{ProbeOutcome, ProbeVerdict},
        prober::{self, ExecOutcome, ExecRunner, ProbeTarget},
    },
};

/// The kubelet never gives a container less than this to stop
/// (`minimumGracePeriodInSeconds`).
const MIN_GRACE: Duration = Duration::from_secs(2);

/// Exec probes and hooks through CRI `ExecSync`.
pub(super) struct Exec<'a, R>(pub &'a R);

impl<R: Runtime> ExecRunner for Exec<'_, R> {
    type Error = CriError;

    async fn exec_sync(
        &self,
        container_id: &str,
        command: &[String],
        timeout: Duration,
    ) -> Result<ExecOutcome, CriError> {
        match self.0.exec_sync(container_id, command, timeout).await {
            Ok(r) => {
                let mut out = String::from_utf8_lossy(&r.stdout).into_owned();
                out.push_str(&String::from_utf8_lossy(&r.stderr));
                Ok(ExecOutcome::Exited {
                    exit_code: r.exit_code,
                    output: out.trim_end().to_owned(),
                })
            }
            Err(e) if e.is_timeout() => Ok(ExecOutcome::TimedOut),
            Err(e) => Err(e),
        }
    }
}

/// Runs a postStart or preStop hook; `Err` carries the kubelet's message.
pub(super) async fn run_handler<R: Runtime>(
    rt: &R,
    h: &Handler,
    container_id: &str,
    pod_ip: IpAddr,
    timeout: Duration,
) -> Result<(), String> {
    match h {
        Handler::Exec { command } => {
            match Exec(rt).exec_sync(container_id, command, timeout).await {
                Ok(ExecOutcome::Exited { exit_code: 0, .. }) => Ok(()),
                Ok(ExecOutcome::Exited { exit_code, output }) => Err(format!(
                    "command {command:?} exited with {exit_code}: {output}"
                )),
                Ok(ExecOutcome::TimedOut) => Err(format!("command {command:?} timed out")),
                Err(e) => Err(e.to_string()),
            }
        }
        Handler::HttpGet(g) => match prober::http_get(g, pod_ip, timeout).await {
            ProbeOutcome::Success => Ok(()),
            ProbeOutcome::Failure { message } | ProbeOutcome::Unknown { message } => Err(message),
        },
        Handler::Sleep(d) => {
            tokio::time::sleep((*d).min(timeout)).await;
            Ok(())
        }
    }
}

impl<R: Runtime + 'static> PodTask<R> {
    /// Runs the probes that are due; a liveness or startup failure kills the
    /// container, and the restart policy decides on the next sync.
    pub(super) async fn run_probes(
        &mut self,
        spec: &PodSpec,
        snap: &super::pod_task::Snapshot,
        pod_ip: IpAddr,
    ) {
        let rt = self.shared.runtime.clone();
        for c in &spec.containers {
            let Some(inst) = snap.latest(&c.name) else {
                continue;
            };
            let Some(probes) = self.probes.get(&c.name) else {
                continue;
            };
            let due: Vec<_> = probes
                .due(Instant::now())
                .into_iter()
                .map(|(k, p)| (k, p.clone()))
                .collect();
            for (kind, probe) in due {
                let target = ProbeTarget {
                    pod_ip,
                    container_id: &inst.status.id,
                };
                let outcome = prober::run(&probe.action, target, probe.timeout, &Exec(&*rt)).await;
                tracing::debug!(pod = %spec.full_name(), container = %c.name, kind = kind.as_str(), ?outcome, "probe");
                let Some(probes) = self.probes.get_mut(&c.name) else {
                    break;
                };
                let verdict = probes.record(kind, outcome, Instant::now());
                if let Some(ProbeVerdict::Restart { kind, message }) = verdict {
                    tracing::info!(
                        pod = %spec.full_name(), container = %c.name, %message,
                        "container failed {} probe, will be restarted", kind.as_str()
                    );
                    let grace = spec.termination_grace_period.max(MIN_GRACE);
                    if let Err(e) = rt.stop_container(&inst.status.id, grace).await {
                        tracing::warn!(pod = %spec.full_name(), container = %c.name, error = %e, "kill failed");
                    }
                    break;
                }
            }
        }
    }

    /// Stops the pod for good (its file is gone, or the API deleted it),
    /// then reports it terminated. Retries until the runtime lets it finish.
    pub(super) async fn terminate(&mut self, grace: Duration) {
        tracing::info!(pod = %self.full_name(), grace = ?grace, "terminating pod");
        self.teardown(grace, false).await;
        self.shared.sink.terminated(&self.pod, &self.source);
        self.shared.view.remove(&self.uid);
        tracing::info!(pod = %self.full_name(), "pod terminated");
    }

    /// preStop hooks, then every container stopped within `grace`, then the
    /// sandboxes stopped and removed. `keep_status`: the pod lives on (its
    /// spec changed), so the final status is not published as terminal.
    pub(super) async fn teardown(&mut self, grace: Duration, keep_status: bool) {
        for p in self.probes.values_mut() {
            p.set_deleting();
        }
        let deadline = Instant::now() + grace;
        loop {
            match self.try_teardown(deadline, keep_status).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(pod = %self.full_name(), error = %e, "teardown failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        if !keep_status && let Err(e) = super::pod_dir::remove(&self.shared.config, &self.uid) {
            tracing::warn!(pod = %self.full_name(), error = %e, "pod directory left in place");
        }
    }

    async fn try_teardown(&mut self, deadline: Instant, keep_status: bool) -> Result<(), CriError> {
        let rt = self.shared.runtime.clone();
        let snap = self.relist().await?;
        let spec = self.spec.as_ref().ok().cloned();
        let pod_ip = snap.ready.as_ref().and_then(|s| s.ip);
        let name = self.full_name();
        // Every container at once, each with its preStop then its stop, as
        // the kubelet's killContainersWithSyncResult.
        let stops = snap.running().map(|inst| {
            let rt = rt.clone();
            let hook = spec
                .as_ref()
                .and_then(|s| s.container(&inst.status.name))
                .and_then(|c| c.pre_stop.clone());
            let (id, cname, name) = (inst.status.id.clone(), inst.status.name.clone(), &name);
            async move {
                if let (Some(h), Some(ip)) = (hook, pod_ip) {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if let Err(message) = run_handler(&*rt, &h, &id, ip, left).await {
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
        if let Some(spec) = &spec {
            // The containers' final states, before removal takes them away.
            let last = self.relist().await?;
            if keep_status {
                self.publish_snapshot(spec, &last);
            } else {
                self.publish_with(spec, &last, true);
            }
        }
        for sb in &snap.sandboxes {
            rt.remove_pod_sandbox(&sb.id)
                .await
                .or_else(ignore_not_found)?;
        }
        Ok(())
    }
}

fn ignore_not_found(e: CriError) -> Result<(), CriError> {
    if e.is_not_found() { Ok(()) } else { Err(e) }
}
