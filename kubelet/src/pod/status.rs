//! The API `PodStatus` from the kubelet's view of a pod, as
//! pkg/kubelet/kubelet_pods.go (`generateAPIPodStatus`,
//! `convertToAPIContainerStatuses`) and pkg/kubelet/status/generate.go (the
//! conditions) build it. Conditions keep their `lastTransitionTime` while
//! their status does not change, and a terminal phase never goes back, as the
//! status manager enforces.
use std::{collections::BTreeMap, net::IpAddr};

use k8s_openapi::{api::core::v1 as api, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};

use super::{
    InvalidPod, PodSpec,
    restart::{PhaseInput, PodPhase, RunState, pod_phase},
};

/// How a container ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Terminated {
    pub exit_code: i32,
    pub signal: Option<i32>,
    /// The runtime's reason (containerd: "Completed", "Error", "OOMKilled");
    /// `None` derives it from the exit code.
    pub reason: Option<String>,
    pub message: Option<String>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub container_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuntimeState {
    Created,
    Running { started_at: Timestamp },
    Exited(Terminated),
    Unknown,
}

impl RuntimeState {
    /// The same state as the restart decisions ([`super::restart`]) read it.
    pub fn run_state(&self) -> RunState {
        match self {
            Self::Created => RunState::Created,
            Self::Running { .. } => RunState::Running,
            Self::Exited(t) => RunState::Exited {
                exit_code: t.exit_code,
            },
            Self::Unknown => RunState::Unknown,
        }
    }
}

/// The latest runtime container of a spec container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeContainer {
    /// The CRI container ID (without the `containerd://` prefix).
    pub id: String,
    /// The image as the runtime resolved it (`docker.io/library/busybox@sha256:…`).
    pub image_ref: String,
    pub state: RuntimeState,
}

/// Why a container is not running, as the pod worker last decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub reason: WaitingReason,
    pub message: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitingReason {
    ContainerCreating,
    PodInitializing,
    CrashLoopBackOff,
    ErrImagePull,
    ImagePullBackOff,
    ErrImageNeverPull,
    CreateContainerConfigError,
    CreateContainerError,
    RunContainerError,
    PostStartHookError,
}

impl WaitingReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ContainerCreating => "ContainerCreating",
            Self::PodInitializing => "PodInitializing",
            Self::CrashLoopBackOff => "CrashLoopBackOff",
            Self::ErrImagePull => "ErrImagePull",
            Self::ImagePullBackOff => "ImagePullBackOff",
            Self::ErrImageNeverPull => "ErrImageNeverPull",
            Self::CreateContainerConfigError => "CreateContainerConfigError",
            Self::CreateContainerError => "CreateContainerError",
            Self::RunContainerError => "RunContainerError",
            Self::PostStartHookError => "PostStartHookError",
        }
    }
}

/// Everything the status of one container is made of.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerView {
    pub latest: Option<RuntimeContainer>,
    /// How the container before `latest` ended (for `lastState`).
    pub previous: Option<Terminated>,
    pub restart_count: u32,
    /// Set when the worker holds the container back (backoff, pull error):
    /// an exited `latest` then shows as waiting with this reason.
    pub waiting: Option<Waiting>,
    /// From [`super::probe::ContainerProbes`]; forced false unless running.
    pub ready: bool,
    pub started: bool,
}

/// The kubelet's view of a pod, for one status computation.
#[derive(Clone, Debug)]
pub struct PodView<'a> {
    pub spec: &'a PodSpec,
    /// By container name, init and app containers alike. A missing name
    /// means the kubelet knows nothing about that container yet.
    pub containers: &'a BTreeMap<String, ContainerView>,
    /// The sandbox exists and its network is set up.
    pub sandbox_ready: bool,
    pub pod_ips: Vec<IpAddr>,
    pub host_ips: Vec<IpAddr>,
    pub start_time: Option<Timestamp>,
    /// The pod's containers will not run again (deleted, or finished for good).
    pub terminal: bool,
    /// The status last reported: conditions keep their transition times.
    pub previous: Option<&'a api::PodStatus>,
    pub now: Timestamp,
}

/// The pod status, ready to send to the API server or serve on `/pods`.
pub fn pod_status(v: &PodView<'_>) -> api::PodStatus {
    let spec = v.spec;
    let app_created = spec.containers.iter().any(|c| {
        v.containers
            .get(&c.name)
            .and_then(|c| c.latest.as_ref())
            .is_some()
    });
    let default_reason = |init: bool| {
        if !init && !spec.init_containers.is_empty() && !app_created {
            WaitingReason::PodInitializing
        } else {
            WaitingReason::ContainerCreating
        }
    };
    let statuses = |list: &[super::ContainerSpec], init: bool| -> Vec<api::ContainerStatus> {
        list.iter()
            .map(|c| {
                let view = v.containers.get(&c.name).cloned().unwrap_or_default();
                container_status(&c.name, &c.image, &view, default_reason(init))
            })
            .collect()
    };
    let init_statuses = statuses(&spec.init_containers, true);
    let app_statuses = statuses(&spec.containers, false);
    let known = |name: &str| v.containers.contains_key(name);
    let input = |name: &str| -> PhaseInput {
        let s = init_statuses
            .iter()
            .chain(&app_statuses)
            .find(|s| s.name == name);
        match s {
            Some(s) if known(name) => phase_input(s),
            _ => PhaseInput::Missing,
        }
    };
    let mut phase = pod_phase(spec, input, v.terminal);
    let prev_phase = v
        .previous
        .and_then(|p| p.phase.as_deref())
        .and_then(parse_phase);
    if let Some(p) = prev_phase.filter(|p| p.is_terminal()) {
        phase = p;
    }
    let has_initialized = spec.containers.iter().any(|c| {
        v.containers.get(&c.name).is_some_and(|c| {
            c.previous.is_some()
                || matches!(
                    c.latest.as_ref().map(|l| &l.state),
                    Some(RuntimeState::Running { .. } | RuntimeState::Exited(_))
                )
        })
    });

    let mut conditions = Vec::new();
    let cond = |type_: &str, ok: bool, reason: Option<&str>, message: Option<String>| Cond {
        type_: type_.to_owned(),
        ok,
        reason: reason.map(str::to_owned),
        message,
    };
    conditions.push(cond(
        "PodReadyToStartContainers",
        v.sandbox_ready,
        None,
        None,
    ));
    conditions.push(initialized(
        spec,
        v.containers,
        &init_statuses,
        phase,
        has_initialized,
        cond,
    ));
    let ready = containers_ready(spec, v.containers, &app_statuses, phase, cond);
    conditions.push(Cond {
        type_: "Ready".to_owned(),
        ..ready.clone()
    });
    conditions.push(ready);
    conditions.push(cond("PodScheduled", true, None, None));
    let previous = v.previous.and_then(|p| p.conditions.as_ref());
    let conditions = conditions
        .into_iter()
        .map(|c| c.into_api(previous, v.now))
        .collect();

    let ips = |ips: &[IpAddr]| -> Option<Vec<api::PodIP>> {
        (!ips.is_empty()).then(|| {
            ips.iter()
                .map(|ip| api::PodIP { ip: ip.to_string() })
                .collect()
        })
    };
    let host_ips = ips(&v.host_ips).map(|l| {
        l.into_iter()
            .map(|p| api::HostIP { ip: p.ip })
            .collect::<Vec<_>>()
    });
    api::PodStatus {
        phase: Some(phase.as_str().to_owned()),
        conditions: Some(conditions),
        pod_ip: v.pod_ips.first().map(ToString::to_string),
        pod_ips: ips(&v.pod_ips),
        host_ip: v.host_ips.first().map(ToString::to_string),
        host_ips,
        start_time: v.start_time.map(Time),
        qos_class: Some(spec.qos_class().as_str().to_owned()),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        container_statuses: Some(app_statuses),
        ..Default::default()
    }
}

/// The status of a pod whose spec the kubelet refused: every container waits
/// with `CreateContainerConfigError` and the full list of problems.
pub fn invalid_pod_status(pod: &api::Pod, err: &InvalidPod, now: Timestamp) -> api::PodStatus {
    let spec = pod.spec.clone().unwrap_or_default();
    let message = err.to_string();
    let waiting = |c: &api::Container| api::ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone().unwrap_or_default(),
        state: Some(api::ContainerState {
            waiting: Some(api::ContainerStateWaiting {
                reason: Some(super::CREATE_CONTAINER_CONFIG_ERROR.to_owned()),
                message: Some(message.clone()),
            }),
            ..Default::default()
        }),
        started: Some(false),
        ..Default::default()
    };
    let init: Vec<_> = spec.init_containers.iter().flatten().map(waiting).collect();
    let previous = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    let not_ready = |type_: &str| Cond {
        type_: type_.to_owned(),
        ok: false,
        reason: Some("ContainersNotReady".to_owned()),
        message: Some(message.clone()),
    };
    let conditions = [
        not_ready("ContainersReady"),
        not_ready("Ready"),
        Cond {
            type_: "PodScheduled".to_owned(),
            ok: true,
            reason: None,
            message: None,
        },
    ];
    api::PodStatus {
        phase: Some(PodPhase::Pending.as_str().to_owned()),
        conditions: Some(
            conditions
                .into_iter()
                .map(|c| c.into_api(previous, now))
                .collect(),
        ),
        init_container_statuses: (!init.is_empty()).then_some(init),
        container_statuses: Some(spec.containers.iter().map(waiting).collect()),
        ..Default::default()
    }
}

#[derive(Clone, Debug)]
struct Cond {
    type_: String,
    ok: bool,
    reason: Option<String>,
    message: Option<String>,
}

impl Cond {
    fn into_api(
        self,
        previous: Option<&Vec<api::PodCondition>>,
        now: Timestamp,
    ) -> api::PodCondition {
        let status = if self.ok { "True" } else { "False" };
        let last = previous
            .into_iter()
            .flatten()
            .find(|c| c.type_ == self.type_ && c.status == status)
            .and_then(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        api::PodCondition {
            type_: self.type_,
            status: status.to_owned(),
            reason: self.reason,
            message: self.message,
            last_transition_time: Some(last),
            ..Default::default()
        }
    }
}

/// Go's `%s` of a string slice: "[a b]".
fn go_list(names: &[&str]) -> String {
    format!("[{}]", names.join(" "))
}

fn initialized(
    spec: &PodSpec,
    views: &BTreeMap<String, ContainerView>,
    statuses: &[api::ContainerStatus],
    phase: PodPhase,
    has_initialized: bool,
    cond: impl Fn(&str, bool, Option<&str>, Option<String>) -> Cond,
) -> Cond {
    const T: &str = "Initialized";
    let mut unknown = vec![];
    let mut incomplete = vec![];
    for (c, s) in spec.init_containers.iter().zip(statuses) {
        if !views.contains_key(&c.name) {
            unknown.push(c.name.as_str());
        } else if s
            .state
            .as_ref()
            .and_then(|st| st.terminated.as_ref())
            .is_none_or(|t| t.exit_code != 0)
        {
            incomplete.push(c.name.as_str());
        }
    }
    if phase == PodPhase::Succeeded && unknown.is_empty() {
        return cond(T, true, Some("PodCompleted"), None);
    }
    if has_initialized {
        return cond(T, true, None, None);
    }
    let mut msgs = vec![];
    if !unknown.is_empty() {
        msgs.push(format!(
            "containers with unknown status: {}",
            go_list(&unknown)
        ));
    }
    if !incomplete.is_empty() {
        msgs.push(format!(
            "containers with incomplete status: {}",
            go_list(&incomplete)
        ));
    }
    if msgs.is_empty() {
        cond(T, true, None, None)
    } else {
        cond(
            T,
            false,
            Some("ContainersNotInitialized"),
            Some(msgs.join(", ")),
        )
    }
}

fn containers_ready(
    spec: &PodSpec,
    views: &BTreeMap<String, ContainerView>,
    statuses: &[api::ContainerStatus],
    phase: PodPhase,
    cond: impl Fn(&str, bool, Option<&str>, Option<String>) -> Cond,
) -> Cond {
    const T: &str = "ContainersReady";
    let mut unknown = vec![];
    let mut unready = vec![];
    for (c, s) in spec.containers.iter().zip(statuses) {
        if !views.contains_key(&c.name) {
            unknown.push(c.name.as_str());
        } else if !s.ready {
            unready.push(c.name.as_str());
        }
    }
    match phase {
        PodPhase::Succeeded if unknown.is_empty() => {
            return cond(T, false, Some("PodCompleted"), None);
        }
        PodPhase::Failed => return cond(T, false, Some("PodFailed"), None),
        _ => {}
    }
    let mut msgs = vec![];
    if !unknown.is_empty() {
        msgs.push(format!(
            "containers with unknown status: {}",
            go_list(&unknown)
        ));
    }
    if !unready.is_empty() {
        msgs.push(format!(
            "containers with unready status: {}",
            go_list(&unready)
        ));
    }
    if msgs.is_empty() {
        cond(T, true, None, None)
    } else {
        cond(T, false, Some("ContainersNotReady"), Some(msgs.join(", ")))
    }
}

fn parse_phase(s: &str) -> Option<PodPhase> {
    Some(match s {
        "Pending" => PodPhase::Pending,
        "Running" => PodPhase::Running,
        "Succeeded" => PodPhase::Succeeded,
        "Failed" => PodPhase::Failed,
        _ => return None,
    })
}

fn phase_input(s: &api::ContainerStatus) -> PhaseInput {
    let state = s.state.clone().unwrap_or_default();
    if state.running.is_some() {
        PhaseInput::Running
    } else if let Some(t) = state.terminated {
        PhaseInput::Terminated {
            exit_code: t.exit_code,
        }
    } else {
        PhaseInput::Waiting {
            last_exit_code: s
                .last_state
                .as_ref()
                .and_then(|l| l.terminated.as_ref())
                .map(|t| t.exit_code),
        }
    }
}

fn container_id(id: &str) -> String {
    format!("containerd://{id}")
}

fn terminated(t: &Terminated) -> api::ContainerState {
    let reason = t.reason.clone().unwrap_or_else(|| {
        if t.exit_code == 0 {
            "Completed"
        } else {
            "Error"
        }
        .to_owned()
    });
    api::ContainerState {
        terminated: Some(api::ContainerStateTerminated {
            exit_code: t.exit_code,
            signal: t.signal,
            reason: Some(reason),
            message: t.message.clone(),
            started_at: t.started_at.map(Time),
            finished_at: t.finished_at.map(Time),
            container_id: t.container_id.as_deref().map(container_id),
        }),
        ..Default::default()
    }
}

fn waiting(w: &Waiting) -> api::ContainerState {
    api::ContainerState {
        waiting: Some(api::ContainerStateWaiting {
            reason: Some(w.reason.as_str().to_owned()),
            message: w.message.clone(),
        }),
        ..Default::default()
    }
}

fn container_status(
    name: &str,
    image: &str,
    v: &ContainerView,
    default: WaitingReason,
) -> api::ContainerStatus {
    let default_waiting = Waiting {
        reason: default,
        message: None,
    };
    let hold = v.waiting.as_ref();
    let last = |t: Option<&Terminated>| t.map(terminated);
    let (state, last_state, running) = match (v.latest.as_ref().map(|l| &l.state), hold) {
        (Some(RuntimeState::Running { started_at }), _) => (
            api::ContainerState {
                running: Some(api::ContainerStateRunning {
                    started_at: Some(Time(*started_at)),
                }),
                ..Default::default()
            },
            last(v.previous.as_ref()),
            true,
        ),
        // Going to restart: the exit becomes lastState.
        (Some(RuntimeState::Exited(t)), Some(w)) => (waiting(w), last(Some(t)), false),
        (Some(RuntimeState::Exited(t)), None) => (terminated(t), last(v.previous.as_ref()), false),
        (Some(RuntimeState::Created | RuntimeState::Unknown) | None, _) => (
            waiting(hold.unwrap_or(&default_waiting)),
            last(v.previous.as_ref()),
            false,
        ),
    };
    let latest = v.latest.as_ref();
    api::ContainerStatus {
        name: name.to_owned(),
        image: image.to_owned(),
        image_id: latest.map(|l| l.image_ref.clone()).unwrap_or_default(),
        container_id: latest.map(|l| container_id(&l.id)),
        state: Some(state),
        last_state: Some(last_state.unwrap_or_default()),
        restart_count: i32::try_from(v.restart_count).unwrap_or(i32::MAX),
        ready: running && v.ready,
        started: Some(running && v.started),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
