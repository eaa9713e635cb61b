//! Pure restart decisions: whether a container restarts
//! (pkg/kubelet/container/helpers.go `ShouldContainerBeRestarted`), which init
//! container runs next (kuberuntime `findNextInitContainerToRun`), and the pod
//! phase (pkg/kubelet/kubelet_pods.go `getPhase`).
use super::{PodSpec, RestartPolicy};

/// The latest runtime state of one container, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    Created,
    Running,
    Exited { exit_code: i32 },
    Unknown,
}

/// What `getPhase` reads of a container's API status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PhaseInput {
    /// No status yet.
    Missing,
    Running,
    Terminated {
        exit_code: i32,
    },
    /// Waiting (creating, backing off); `last_exit_code` when it ran before.
    Waiting {
        last_exit_code: Option<i32>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl PodPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// Whether an exited (or never started) container should be (re)started.
/// `state` is `None` when the container was never created.
pub fn should_restart(
    policy: RestartPolicy,
    deleting: bool,
    is_init: bool,
    state: Option<RunState>,
) -> bool {
    if deleting {
        return false;
    }
    match state {
        None | Some(RunState::Created) | Some(RunState::Unknown) => true,
        Some(RunState::Running) => false,
        Some(RunState::Exited { exit_code }) => {
            // Init containers restart on failure unless the pod says Never:
            // with Always they behave as OnFailure, and a success is final.
            let policy = if is_init && policy == RestartPolicy::Always {
                RestartPolicy::OnFailure
            } else {
                policy
            };
            match policy {
                RestartPolicy::Never => false,
                RestartPolicy::OnFailure => exit_code != 0,
                RestartPolicy::Always => true,
            }
        }
    }
}

/// What to do about init containers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitStep {
    /// All init containers succeeded (or there are none): run the app containers.
    Done,
    /// Start this init container (index into `spec.init_containers`).
    Start(usize),
    /// One is running: wait for it.
    Wait,
    /// This init container failed: restart it (with backoff), unless the pod's
    /// restart policy is Never, in which case the pod has failed.
    Failed { index: usize, pod_failed: bool },
}

/// The next init container to run, looking at the latest state of each by
/// name (`state(name)`).
pub fn next_init_container(pod: &PodSpec, state: impl Fn(&str) -> Option<RunState>) -> InitStep {
    if pod.init_containers.is_empty() {
        return InitStep::Done;
    }
    // A running app container means initialization finished before (a kubelet
    // restart, or init containers garbage-collected): never run them again.
    if pod
        .containers
        .iter()
        .any(|c| state(&c.name) == Some(RunState::Running))
    {
        return InitStep::Done;
    }
    let failed = |s: Option<RunState>| match s {
        Some(RunState::Exited { exit_code }) => exit_code != 0,
        Some(RunState::Unknown) => true,
        _ => false,
    };
    for (i, c) in pod.init_containers.iter().enumerate().rev() {
        if failed(state(&c.name)) {
            return InitStep::Failed {
                index: i,
                pod_failed: pod.restart_policy == RestartPolicy::Never,
            };
        }
    }
    for (i, c) in pod.init_containers.iter().enumerate().rev() {
        match state(&c.name) {
            None => continue,
            Some(RunState::Running) => return InitStep::Wait,
            Some(RunState::Exited { .. }) => {
                return if i + 1 == pod.init_containers.len() {
                    InitStep::Done
                } else {
                    InitStep::Start(i + 1)
                };
            }
            // Created but not started: start it again.
            Some(RunState::Created) | Some(RunState::Unknown) => return InitStep::Start(i),
        }
    }
    InitStep::Start(0)
}

/// `getPhase`. `status(name)` is each container's API-level state;
/// `terminal` says the pod was already decided to be finished (deleted,
/// or killed for good) so its containers will not restart whatever the policy.
pub fn pod_phase(pod: &PodSpec, status: impl Fn(&str) -> PhaseInput, terminal: bool) -> PodPhase {
    let mut pending_init = 0;
    let mut failed_init = 0;
    for c in &pod.init_containers {
        match status(&c.name) {
            PhaseInput::Terminated { exit_code } => failed_init += usize::from(exit_code != 0),
            PhaseInput::Waiting {
                last_exit_code: Some(code),
            } => failed_init += usize::from(code != 0),
            PhaseInput::Missing | PhaseInput::Running | PhaseInput::Waiting { .. } => {
                pending_init += 1
            }
        }
    }
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for c in &pod.containers {
        match status(&c.name) {
            PhaseInput::Missing => unknown += 1,
            PhaseInput::Running => running += 1,
            PhaseInput::Terminated { exit_code } => {
                stopped += 1;
                succeeded += usize::from(exit_code == 0);
            }
            PhaseInput::Waiting {
                last_exit_code: Some(_),
            } => stopped += 1,
            PhaseInput::Waiting {
                last_exit_code: None,
            } => waiting += 1,
        }
    }
    if failed_init > 0 && pod.restart_policy == RestartPolicy::Never {
        return PodPhase::Failed;
    }
    if pending_init > 0 || waiting > 0 {
        return PodPhase::Pending;
    }
    if running > 0 && unknown == 0 {
        return PodPhase::Running;
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        if terminal {
            return if stopped == succeeded {
                PodPhase::Succeeded
            } else {
                PodPhase::Failed
            };
        }
        if pod.restart_policy == RestartPolicy::Always {
            // Every container is on its way to a restart.
            return PodPhase::Running;
        }
        if stopped == succeeded {
            return PodPhase::Succeeded;
        }
        if pod.restart_policy == RestartPolicy::Never {
            return PodPhase::Failed;
        }
        // OnFailure, at least one failed and restarting.
        return PodPhase::Running;
    }
    PodPhase::Pending
}

#[cfg(test)]
mod tests;
