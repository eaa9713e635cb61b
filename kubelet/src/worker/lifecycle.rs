//! Probes and lifecycle hooks of one pod.
use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

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
pub(super) const MIN_GRACE: Duration = Duration::from_secs(2);

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
        snap: &super::snapshot::Snapshot,
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
                    self.invalidate();
                    break;
                }
            }
        }
    }
}
