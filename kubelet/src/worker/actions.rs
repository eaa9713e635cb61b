//! `computePodActions`: what one sync does to a pod, decided from its spec,
//! the runtime's [`Snapshot`] and the restart backoff alone. The pod task
//! carries it out (`PodTask::act`), as kuberuntime's `SyncPod` does.
//!
//! Init containers count only in the sandbox they ran in: when the sandbox
//! has to be recreated (its pause process died, the node rebooted), they run
//! again in the new one before any app container, as the kubelet purges and
//! reruns them. App containers keep their history across sandboxes: restart
//! counts go on, CrashLoopBackOff still applies, and a container that
//! succeeded under `OnFailure` stays done.
use std::time::{Duration, Instant};

use super::snapshot::{Instance, Snapshot, instant, run_state};
use crate::{
    cri::ContainerState,
    pod::{
        PodSpec, RestartPolicy,
        backoff::{CrashLoopBackoff, RestartGate},
        restart::{InitStep, RunState, next_init_container, should_restart},
    },
};

/// What to do, in this order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct PodActions {
    /// The pod is done for good: stop its Ready sandbox (pause process, IP).
    pub stop_sandbox: Option<String>,
    /// Running containers to stop at once, by id: their sandbox is dead or
    /// no longer the pod's.
    pub kill: Vec<String>,
    /// Create a sandbox with this attempt number; containers wait for it.
    pub create_sandbox: Option<u32>,
    /// Containers to start, at most one init container and then nothing
    /// else.
    pub start: Vec<Start>,
    /// Containers that should restart but are in CrashLoopBackOff.
    pub back_off: Vec<BackOff>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Start {
    pub name: String,
    /// When the instance it replaces finished: the restart is recorded in
    /// the backoff from there. `None` for a first start.
    pub replaces: Option<Instant>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct BackOff {
    pub name: String,
    pub remaining: Duration,
    pub message: String,
}

impl PodActions {
    pub fn is_empty(&self) -> bool {
        self.stop_sandbox.is_none()
            && self.kill.is_empty()
            && self.create_sandbox.is_none()
            && self.start.is_empty()
    }
}

/// The init-container step as seen in the newest sandbox (`None`: no
/// sandbox yet, so nothing ran).
fn init_step(spec: &PodSpec, snap: &Snapshot, sandbox: Option<&str>) -> InitStep {
    next_init_container(spec, |n| {
        sandbox
            .and_then(|sb| snap.latest_in(sb, n))
            .map(|i| run_state(&i.status))
    })
}

/// Whether the pod is done for good: nothing of it will run again.
pub(super) fn finished(spec: &PodSpec, snap: &Snapshot) -> bool {
    let newest = snap.sandboxes.first().map(|s| s.id.as_str());
    if let InitStep::Failed {
        pod_failed: true, ..
    } = init_step(spec, snap, newest)
    {
        return true;
    }
    spec.containers
        .iter()
        .all(|c| match snap.run_state(&c.name) {
            Some(s @ RunState::Exited { .. }) => {
                !should_restart(spec.restart_policy, false, false, Some(s))
            }
            _ => false,
        })
}

/// The pod's actions now. `api_terminal`: the API already shows the pod
/// Succeeded or Failed, so it never runs again, even when the runtime lost
/// its containers.
pub(super) fn compute_pod_actions(
    spec: &PodSpec,
    snap: &Snapshot,
    api_terminal: bool,
    crash: &CrashLoopBackoff,
    now: Instant,
) -> PodActions {
    let mut a = PodActions::default();
    if api_terminal || finished(spec, snap) {
        a.stop_sandbox = snap.ready.as_ref().map(|s| s.id.clone());
        return a;
    }
    let Some(sb) = &snap.ready else {
        // A dead sandbox takes its containers with it.
        a.kill = snap.running().map(|i| i.status.id.clone()).collect();
        // restartPolicy Never: containers that ran are not given a second
        // sandbox (computePodActions' `attempt != 0` rule); once killed
        // they leave the pod finished.
        if spec.restart_policy == RestartPolicy::Never
            && !snap.sandboxes.is_empty()
            && !snap.containers.is_empty()
        {
            return a;
        }
        let attempt = snap.sandboxes.iter().map(|s| s.attempt + 1).max();
        a.create_sandbox = Some(attempt.unwrap_or(0));
        return a;
    };
    a.kill = snap
        .running()
        .filter(|i| i.sandbox_id != sb.id)
        .map(|i| i.status.id.clone())
        .collect();
    if !a.kill.is_empty() {
        return a;
    }
    let restart = |name: &str, latest: &Instance, a: &mut PodActions| {
        let st = &latest.status;
        let finished_at = instant(st.finished_at.unwrap_or(st.created_at));
        match crash.gate(&spec.uid, &spec.full_name(), name, finished_at, now) {
            RestartGate::Start => a.start.push(Start {
                name: name.to_owned(),
                replaces: Some(finished_at),
            }),
            RestartGate::Wait { remaining, message } => a.back_off.push(BackOff {
                name: name.to_owned(),
                remaining,
                message,
            }),
        }
    };
    let first = |name: &str| Start {
        name: name.to_owned(),
        replaces: None,
    };
    match init_step(spec, snap, Some(&sb.id)) {
        InitStep::Done => {}
        InitStep::Wait
        | InitStep::Failed {
            pod_failed: true, ..
        } => return a,
        InitStep::Start(i) | InitStep::Failed { index: i, .. } => {
            let name = &spec.init_containers[i].name;
            match snap.latest_in(&sb.id, name) {
                Some(latest) => restart(name, latest, &mut a),
                None => a.start.push(first(name)),
            }
            return a;
        }
    }
    for c in &spec.containers {
        match snap.latest(&c.name) {
            None => a.start.push(first(&c.name)),
            Some(i) if i.status.state == ContainerState::Running => {}
            Some(i) => {
                let state = Some(run_state(&i.status));
                if should_restart(spec.restart_policy, spec.deleting, false, state) {
                    restart(&c.name, i, &mut a);
                }
            }
        }
    }
    a
}

#[cfg(test)]
#[path = "actions_tests.rs"]
mod tests;
