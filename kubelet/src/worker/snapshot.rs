//! One pod's runtime state as a relist reads it (the kubelet's
//! `kubecontainer.PodStatus`): its sandboxes, the Ready one's status, and
//! every container instance with its CRI status. The node-wide PLEG builds
//! it for pods whose state changed; a pod worker builds it itself right
//! after it changed the runtime.
use std::{
    collections::BTreeMap,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use k8s_openapi::jiff::Timestamp;

use super::spec::{self, CONTAINER_NAME_LABEL, RESTART_COUNT_ANNOTATION};
use crate::{
    cri::{
        ContainerFilter, ContainerInfo, ContainerState, ContainerStatus, CriError, Runtime,
        SandboxFilter, SandboxInfo, SandboxState, SandboxStatus,
    },
    pod::{backoff::instant_of, restart::RunState, timestamp_from_unix_nanos, timestamp_now},
};

/// One container instance as the relist saw it.
#[derive(Clone, Debug)]
pub(super) struct Instance {
    pub sandbox_id: String,
    pub status: ContainerStatus,
}

/// The pod's runtime state at one relist.
#[derive(Clone, Debug, Default)]
pub(super) struct Snapshot {
    /// Newest first.
    pub sandboxes: Vec<SandboxInfo>,
    /// The newest sandbox that is Ready.
    pub ready: Option<SandboxStatus>,
    /// By container name, newest first.
    pub containers: BTreeMap<String, Vec<Instance>>,
}

/// A snapshot with the time its relist started: of two, the later one wins.
#[derive(Clone, Debug)]
pub(super) struct Stamped {
    pub at: tokio::time::Instant,
    pub snapshot: Snapshot,
}

impl Snapshot {
    pub fn latest(&self, name: &str) -> Option<&Instance> {
        self.containers.get(name).and_then(|v| v.first())
    }

    pub fn run_state(&self, name: &str) -> Option<RunState> {
        self.latest(name).map(|i| run_state(&i.status))
    }

    /// The newest instance of `name` in sandbox `sandbox_id`: init containers
    /// count only in the sandbox they prepared.
    pub fn latest_in(&self, sandbox_id: &str, name: &str) -> Option<&Instance> {
        self.containers
            .get(name)?
            .iter()
            .find(|i| i.sandbox_id == sandbox_id)
    }

    pub fn running(&self) -> impl Iterator<Item = &Instance> {
        self.containers
            .values()
            .filter_map(|v| v.first())
            .filter(|i| i.status.state == ContainerState::Running)
    }
}

pub(super) fn run_state(s: &ContainerStatus) -> RunState {
    match s.state {
        ContainerState::Created => RunState::Created,
        ContainerState::Running => RunState::Running,
        ContainerState::Exited => RunState::Exited {
            exit_code: s.exit_code,
        },
        ContainerState::Unknown => RunState::Unknown,
    }
}

/// The restart count a container instance carries (0 when it has none).
pub(super) fn restart_count(s: &ContainerStatus) -> u32 {
    s.annotations
        .get(RESTART_COUNT_ANNOTATION)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub(super) fn timestamp(t: SystemTime) -> Timestamp {
    let nanos = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    timestamp_from_unix_nanos(nanos)
}

/// A wall-clock time of the runtime as a monotonic instant (backoff, probes).
pub(super) fn instant(t: SystemTime) -> Instant {
    instant_of(timestamp(t), timestamp_now(), Instant::now())
}

/// One pod's state, from its own listing (three CRI calls plus one per
/// container).
pub(super) async fn relist<R: Runtime>(rt: &R, uid: &str) -> Result<Stamped, CriError> {
    let at = tokio::time::Instant::now();
    let labels = spec::uid_filter(uid);
    let sandboxes = rt
        .list_pod_sandboxes(&SandboxFilter {
            labels: labels.clone(),
            ..Default::default()
        })
        .await?;
    let containers = rt
        .list_containers(&ContainerFilter {
            labels,
            ..Default::default()
        })
        .await?;
    let snapshot = inspect(rt, sandboxes, containers).await?;
    Ok(Stamped { at, snapshot })
}

/// The statuses behind one pod's listed sandboxes and containers (the
/// kubelet's `GetPodStatus`): the Ready sandbox's, and each container's.
/// Something removed meanwhile is left out.
pub(super) async fn inspect<R: Runtime>(
    rt: &R,
    mut sandboxes: Vec<SandboxInfo>,
    infos: Vec<ContainerInfo>,
) -> Result<Snapshot, CriError> {
    sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let mut ready = None;
    if let Some(s) = sandboxes.iter().find(|s| s.state == SandboxState::Ready) {
        match rt.pod_sandbox_status(&s.id).await {
            Ok(st) if st.state == SandboxState::Ready => ready = Some(st),
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    let mut containers: BTreeMap<String, Vec<Instance>> = BTreeMap::new();
    for info in infos {
        let name = info
            .labels
            .get(CONTAINER_NAME_LABEL)
            .cloned()
            .unwrap_or_else(|| info.name.clone());
        match rt.container_status(&info.id).await {
            Ok(status) => containers.entry(name).or_default().push(Instance {
                sandbox_id: info.sandbox_id,
                status,
            }),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    for v in containers.values_mut() {
        v.sort_by_key(|i| std::cmp::Reverse((i.status.created_at, restart_count(&i.status))));
    }
    Ok(Snapshot {
        sandboxes,
        ready,
        containers,
    })
}
