//! One pod's worker: every relist period it reads the pod's runtime state
//! (its PLEG), decides what to start or restart (kuberuntime's
//! `computePodActions`), runs the due probes and publishes the status when it
//! changed. Nothing it decides depends on memory it could lose, except
//! backoffs and probe results, which the kubelet also starts afresh.
use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use k8s_openapi::{
    api::core::v1::{Pod, PodStatus},
    jiff::Timestamp,
};
use tokio::sync::mpsc;

use super::{
    PodMsg, Shared,
    run_as::{ImageUser, apply_image_user, verify_run_as_non_root},
    spec::{self, CONTAINER_NAME_LABEL, RESTART_COUNT_ANNOTATION},
};
use crate::{
    cri::{
        ContainerFilter, ContainerState, ContainerStatus, CriError, ImageInfo, Runtime,
        SandboxFilter, SandboxInfo, SandboxState, SandboxStatus,
    },
    flow::{ContainerRef, PodSource},
    pod::{
        ContainerSpec, InvalidPod, PodSpec, PullPolicy,
        backoff::{CrashLoopBackoff, ImagePullBackoff, PullGate, RestartGate, instant_of},
        probe::{ContainerProbes, Observed},
        restart::{InitStep, RunState, next_init_container, should_restart},
        status::{
            ContainerView, PodView, RuntimeContainer, RuntimeState, Terminated, Waiting,
            WaitingReason, invalid_pod_status, pod_status,
        },
        timestamp_from_unix_nanos, timestamp_now,
    },
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

impl Snapshot {
    pub fn latest(&self, name: &str) -> Option<&Instance> {
        self.containers.get(name).and_then(|v| v.first())
    }

    pub fn run_state(&self, name: &str) -> Option<RunState> {
        self.latest(name).map(|i| run_state(&i.status))
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

fn terminated(s: &ContainerStatus) -> Terminated {
    let text = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    Terminated {
        exit_code: s.exit_code,
        signal: None,
        reason: text(&s.reason),
        message: text(&s.message),
        started_at: s.started_at.map(timestamp),
        finished_at: s.finished_at.map(timestamp),
        container_id: Some(s.id.clone()),
    }
}

fn runtime_container(s: &ContainerStatus) -> RuntimeContainer {
    RuntimeContainer {
        id: s.id.clone(),
        image_ref: s.image_ref.clone(),
        state: match s.state {
            ContainerState::Created => RuntimeState::Created,
            ContainerState::Running => RuntimeState::Running {
                started_at: timestamp(s.started_at.unwrap_or(s.created_at)),
            },
            ContainerState::Exited => RuntimeState::Exited(terminated(s)),
            ContainerState::Unknown => RuntimeState::Unknown,
        },
    }
}

/// Whether the API already shows the pod finished (a status an earlier
/// kubelet reported).
fn api_terminal(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed")
}

/// Whether the pod is done for good: nothing of it will run again.
pub(super) fn finished(spec: &PodSpec, snap: &Snapshot) -> bool {
    if let InitStep::Failed {
        pod_failed: true, ..
    } = next_init_container(spec, |n| snap.run_state(n))
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

fn waiting(reason: WaitingReason, message: impl Into<String>) -> Waiting {
    Waiting {
        reason,
        message: Some(message.into()),
    }
}

pub(super) struct PodTask<R> {
    pub(super) shared: Arc<Shared<R>>,
    pub(super) pod: Pod,
    /// Where the pod came from: what makes it static, never its annotations.
    pub(super) source: PodSource,
    pub(super) uid: String,
    pub(super) spec: Result<PodSpec, InvalidPod>,
    pub(super) probes: BTreeMap<String, ContainerProbes>,
    crash: CrashLoopBackoff,
    pulls: ImagePullBackoff,
    /// Why containers are held back, as decided on this sync.
    waiting: BTreeMap<String, Waiting>,
    /// The last config error per container that an Event was sent for.
    config_errors: BTreeMap<String, String>,
    start_time: Option<Timestamp>,
    /// When the projected volumes were last brought up to date.
    projected_at: Option<tokio::time::Instant>,
    /// The last error of that, logged once.
    projection_error: Option<String>,
    /// Kept once the sandbox is gone: a finished pod still shows its IP.
    pod_ips: Vec<IpAddr>,
    pub(super) last_status: Option<PodStatus>,
    last_error: Option<String>,
    sandbox_error: Option<String>,
}

impl<R: Runtime + 'static> PodTask<R> {
    pub(super) fn new(shared: Arc<Shared<R>>, pod: Pod, source: PodSource) -> Self {
        let spec = PodSpec::from_api(&pod);
        Self {
            shared,
            source,
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            pod,
            spec,
            probes: BTreeMap::new(),
            crash: CrashLoopBackoff::default(),
            pulls: ImagePullBackoff::default(),
            waiting: BTreeMap::new(),
            config_errors: BTreeMap::new(),
            start_time: None,
            projected_at: None,
            projection_error: None,
            pod_ips: Vec::new(),
            last_status: None,
            last_error: None,
            sandbox_error: None,
        }
    }

    pub(super) fn full_name(&self) -> String {
        format!(
            "{}/{}",
            self.pod.metadata.namespace.as_deref().unwrap_or("default"),
            self.pod.metadata.name.as_deref().unwrap_or_default()
        )
    }

    pub(super) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<PodMsg>) {
        tracing::info!(pod = %self.full_name(), uid = %self.uid, "pod worker started");
        let mut next = tokio::time::Instant::now();
        loop {
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some(PodMsg::Update(pod)) => self.update(*pod).await,
                    Some(PodMsg::Remove) => {
                        let grace = self.grace_period(false);
                        self.terminate(grace).await;
                        return;
                    }
                    // The worker is going away: the pod stays as it is.
                    None => return,
                },
                () = tokio::time::sleep_until(next) => {}
            }
            if self.pod.metadata.deletion_timestamp.is_some() {
                let grace = self.grace_period(true);
                self.terminate(grace).await;
                return;
            }
            self.step().await;
            let relist = tokio::time::Instant::now() + self.shared.config.relist_period;
            let probe = self
                .probes
                .values()
                .filter_map(ContainerProbes::next_due)
                .min()
                .map(tokio::time::Instant::from_std);
            next = probe.map_or(relist, |p| p.min(relist));
        }
    }

    /// `deletionGracePeriodSeconds` when the API set one, else the spec's.
    pub(super) fn grace_period(&self, deleting: bool) -> Duration {
        let from_meta = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .filter(|_| deleting)
            .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0)));
        let from_spec = match &self.spec {
            Ok(s) => s.termination_grace_period,
            Err(_) => Duration::from_secs(30),
        };
        from_meta.unwrap_or(from_spec)
    }

    /// A new version of the pod. A changed spec (beyond the deletion mark)
    /// kills what runs; the next sync starts the new spec's containers.
    async fn update(&mut self, pod: Pod) {
        let new = PodSpec::from_api(&pod);
        let changed = match (&self.spec, &new) {
            (Ok(old), Ok(new)) => {
                let mut new = new.clone();
                new.deleting = old.deleting;
                *old != new
            }
            (Ok(_), Err(_)) => true,
            _ => false,
        };
        if changed {
            tracing::info!(pod = %self.full_name(), "pod spec changed: killing it to recreate");
            let grace = self.grace_period(false);
            self.teardown(grace, true).await;
            self.probes.clear();
        }
        self.pod = pod;
        self.spec = new;
    }

    pub(super) async fn step(&mut self) {
        let spec = match &self.spec {
            Ok(s) => s.clone(),
            Err(e) => {
                // Against the status last published, so condition times hold.
                let mut pod = self.pod.clone();
                pod.status = self.last_status.clone();
                let status = invalid_pod_status(&pod, e, timestamp_now());
                if self.last_status.is_none() {
                    tracing::warn!(pod = %self.full_name(), error = %e, "invalid pod spec");
                }
                self.publish(status, BTreeMap::new(), None);
                return;
            }
        };
        match self.sync(&spec).await {
            Ok(snap) => {
                self.last_error = None;
                self.publish_snapshot(&spec, &snap);
            }
            Err(e) => {
                let msg = e.to_string();
                if self.last_error.as_ref() != Some(&msg) {
                    tracing::warn!(pod = %spec.full_name(), error = %msg, "pod sync failed; retrying");
                }
                self.last_error = Some(msg);
            }
        }
    }

    pub(super) async fn relist(&self) -> Result<Snapshot, CriError> {
        let rt = &self.shared.runtime;
        let labels = spec::uid_filter(&self.uid);
        let mut sandboxes = rt
            .list_pod_sandboxes(&SandboxFilter {
                labels: labels.clone(),
                ..Default::default()
            })
            .await?;
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
        let infos = rt
            .list_containers(&ContainerFilter {
                labels,
                ..Default::default()
            })
            .await?;
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

    /// Acts until nothing more can be done on this sync (a new sandbox lets
    /// containers start at once), then probes.
    async fn sync(&mut self, spec: &PodSpec) -> Result<Snapshot, CriError> {
        self.waiting.clear();
        let mut snap = self.relist().await?;
        for _ in 0..3 {
            if !self.act(spec, &snap).await? {
                break;
            }
            snap = self.relist().await?;
        }
        self.observe_probes(spec, &snap);
        if let Some(ip) = self.pod_ip(&snap) {
            self.run_probes(spec, &snap, ip).await;
        }
        self.gc(&snap).await;
        self.refresh_projections(spec, &snap);
        Ok(snap)
    }

    /// Rewrites the ConfigMap, Secret, downwardAPI and projected volumes of a
    /// running pod every `syncFrequency`, as the kubelet's volume manager
    /// remounts them: edits and rotated tokens reach running containers. A
    /// volume whose contents did not change is not written.
    fn refresh_projections(&mut self, spec: &PodSpec, snap: &Snapshot) {
        let now = tokio::time::Instant::now();
        let every = self.shared.config.sync_frequency;
        if snap.running().next().is_none()
            || !spec.volumes.iter().any(|v| v.source.is_projection())
            || self.projected_at.is_some_and(|at| now < at + every)
        {
            return;
        }
        self.projected_at = Some(now);
        let errors = spec::refresh_projections(&self.shared.config, spec);
        let msg = (!errors.is_empty()).then(|| errors.join("; "));
        if msg.is_some() && msg != self.projection_error {
            tracing::warn!(pod = %spec.full_name(), error = msg.as_deref().unwrap_or_default(), "cannot update projected volumes; keeping their previous contents");
        }
        self.projection_error = msg;
    }

    fn pod_ip(&self, snap: &Snapshot) -> Option<IpAddr> {
        let sb = snap.ready.as_ref()?;
        sb.ip.or(self.shared.config.node_ip)
    }

    /// One round of `computePodActions`; true when the runtime changed.
    async fn act(&mut self, spec: &PodSpec, snap: &Snapshot) -> Result<bool, CriError> {
        let rt = self.shared.runtime.clone();
        // A pod the API already shows finished never runs again, even when
        // the runtime lost its containers (a node reboot).
        if api_terminal(&self.pod) || finished(spec, snap) {
            // Done for good: the sandbox (pause process, IP) goes.
            if let Some(sb) = &snap.ready {
                tracing::info!(pod = %spec.full_name(), "pod finished; stopping its sandbox");
                rt.stop_pod_sandbox(&sb.id).await?;
                return Ok(true);
            }
            return Ok(false);
        }
        let Some(sb) = &snap.ready else {
            // A dead sandbox takes its containers with it.
            for i in snap.running() {
                rt.stop_container(&i.status.id, Duration::ZERO).await?;
            }
            let attempt = snap
                .sandboxes
                .iter()
                .map(|s| s.attempt + 1)
                .max()
                .unwrap_or(0);
            let cfg = spec::sandbox_config(&self.shared.config, spec, attempt);
            return match rt.run_pod_sandbox(&cfg).await {
                Ok(id) => {
                    tracing::info!(pod = %spec.full_name(), sandbox = %id, attempt, "sandbox started");
                    self.sandbox_error = None;
                    Ok(true)
                }
                // Reported, and retried on the next sync: the pod stays
                // Pending with its containers ContainerCreating.
                Err(e) => {
                    let msg = e.to_string();
                    if self.sandbox_error.as_ref() != Some(&msg) {
                        tracing::warn!(pod = %spec.full_name(), error = %msg, "cannot create the pod sandbox");
                    }
                    self.sandbox_error = Some(msg);
                    Ok(false)
                }
            };
        };
        let mut acted = false;
        // Containers left in an older sandbox are dead to this one.
        for i in snap.running().filter(|i| i.sandbox_id != sb.id) {
            rt.stop_container(&i.status.id, Duration::ZERO).await?;
            acted = true;
        }
        if acted {
            return Ok(true);
        }
        match next_init_container(spec, |n| snap.run_state(n)) {
            InitStep::Done => {}
            InitStep::Wait => return Ok(false),
            InitStep::Start(i) => {
                let c = &spec.init_containers[i];
                return match snap.latest(&c.name) {
                    Some(_) => self.restart(spec, c, snap, sb).await,
                    None => self.start(spec, c, snap, sb).await,
                };
            }
            InitStep::Failed { index, pod_failed } => {
                if pod_failed {
                    return Ok(false);
                }
                return self
                    .restart(spec, &spec.init_containers[index], snap, sb)
                    .await;
            }
        }
        for c in &spec.containers {
            let changed = match snap.run_state(&c.name) {
                None => self.start(spec, c, snap, sb).await?,
                Some(RunState::Running) => false,
                Some(s) if should_restart(spec.restart_policy, spec.deleting, false, Some(s)) => {
                    self.restart(spec, c, snap, sb).await?
                }
                Some(_) => false,
            };
            acted |= changed;
        }
        Ok(acted)
    }

    /// Restarts an exited (or never started) container once CrashLoopBackOff allows.
    async fn restart(
        &mut self,
        spec: &PodSpec,
        c: &ContainerSpec,
        snap: &Snapshot,
        sb: &SandboxStatus,
    ) -> Result<bool, CriError> {
        let Some(latest) = snap.latest(&c.name) else {
            return self.start(spec, c, snap, sb).await;
        };
        let st = &latest.status;
        let finished_at = instant(st.finished_at.unwrap_or(st.created_at));
        match self.crash.check(
            &spec.uid,
            &spec.full_name(),
            &c.name,
            finished_at,
            Instant::now(),
        ) {
            RestartGate::Start => self.start(spec, c, snap, sb).await,
            RestartGate::Wait { message, .. } => {
                self.waiting.insert(
                    c.name.clone(),
                    waiting(WaitingReason::CrashLoopBackOff, message),
                );
                Ok(false)
            }
        }
    }

    /// Pulls the image, creates and starts a new instance of `c`. Problems
    /// become the container's waiting reason; only runtime outages are errors.
    async fn start(
        &mut self,
        spec: &PodSpec,
        c: &ContainerSpec,
        snap: &Snapshot,
        sb: &SandboxStatus,
    ) -> Result<bool, CriError> {
        let rt = self.shared.runtime.clone();
        let image = match self.ensure_image(spec, c).await {
            Ok(image) => image,
            Err(w) => {
                self.waiting.insert(c.name.clone(), w);
                return Ok(false);
            }
        };
        // Decided before anything is created for the container (volumes,
        // env), as generateContainerConfig does first.
        let user = ImageUser::of(image.as_ref());
        if let Err(e) = verify_run_as_non_root(spec, &c.name, &c.security, &user) {
            self.waiting.insert(
                c.name.clone(),
                waiting(WaitingReason::CreateContainerConfigError, e.to_string()),
            );
            return Ok(false);
        }
        let restart_count = snap
            .latest(&c.name)
            .map_or(0, |l| restart_count(&l.status) + 1);
        let inputs = spec::ContainerInputs {
            cfg: &self.shared.config,
            pod: spec,
            container: c,
            restart_count,
            pod_ip: self.pod_ip(snap),
        };
        let mut config = match spec::container_config(&inputs) {
            Ok(config) => {
                self.config_errors.remove(&c.name);
                config
            }
            Err(e) => {
                let msg = format!("Error: {e}");
                if self.config_errors.get(&c.name) != Some(&msg) {
                    tracing::warn!(pod = %spec.full_name(), container = %c.name, error = %e, "container config");
                    self.shared.sink.warning(&self.pod, "Failed", &msg);
                    self.config_errors.insert(c.name.clone(), msg);
                }
                self.waiting.insert(
                    c.name.clone(),
                    waiting(WaitingReason::CreateContainerConfigError, e.to_string()),
                );
                return Ok(false);
            }
        };
        apply_image_user(&mut config.security, &user);
        let sandbox_config = spec::sandbox_config(&self.shared.config, spec, sb.attempt);
        let id = match rt.create_container(&sb.id, &config, &sandbox_config).await {
            Ok(id) => id,
            Err(e) => {
                tracing::warn!(pod = %spec.full_name(), container = %c.name, error = %e, "create failed");
                self.waiting.insert(
                    c.name.clone(),
                    waiting(WaitingReason::CreateContainerError, e.to_string()),
                );
                return Ok(false);
            }
        };
        if let Err(e) = rt.start_container(&id).await {
            tracing::warn!(pod = %spec.full_name(), container = %c.name, error = %e, "start failed");
            self.waiting.insert(
                c.name.clone(),
                waiting(WaitingReason::RunContainerError, e.to_string()),
            );
            return Ok(true);
        }
        tracing::info!(pod = %spec.full_name(), container = %c.name, id = %id, restart_count, "container started");
        if let (Some(h), Some(ip)) = (&c.post_start, self.pod_ip(snap)) {
            let timeout = spec.termination_grace_period.max(Duration::from_secs(2));
            if let Err(message) = super::lifecycle::run_handler(&*rt, h, &id, ip, timeout).await {
                tracing::warn!(pod = %spec.full_name(), container = %c.name, %message, "postStart hook failed");
                rt.stop_container(&id, spec.termination_grace_period)
                    .await?;
                self.waiting.insert(
                    c.name.clone(),
                    waiting(WaitingReason::PostStartHookError, message),
                );
            }
        }
        Ok(true)
    }

    /// The image pull policy, with ErrImagePull → ImagePullBackOff. Returns
    /// the image's status (its user), read again after a pull.
    async fn ensure_image(
        &mut self,
        spec: &PodSpec,
        c: &ContainerSpec,
    ) -> Result<Option<ImageInfo>, Waiting> {
        let rt = &self.shared.runtime;
        let status = match rt.image_status(&c.image).await {
            Ok(i) => i,
            Err(e) => {
                return Err(waiting(
                    WaitingReason::ErrImagePull,
                    format!("image status of {:?}: {e}", c.image),
                ));
            }
        };
        let present = status.is_some();
        match c.image_pull_policy {
            PullPolicy::Never if present => return Ok(status),
            PullPolicy::Never => {
                return Err(waiting(
                    WaitingReason::ErrImageNeverPull,
                    format!(
                        "Container image {:?} is not present with pull policy of Never",
                        c.image
                    ),
                ));
            }
            PullPolicy::IfNotPresent if present => return Ok(status),
            PullPolicy::IfNotPresent | PullPolicy::Always => {}
        }
        let now = Instant::now();
        if let PullGate::Wait { message, .. } = self.pulls.check(&spec.uid, &c.image, now) {
            return Err(waiting(WaitingReason::ImagePullBackOff, message));
        }
        match rt.pull_image(&c.image).await {
            Ok(_) => {
                self.pulls.succeeded(&spec.uid, &c.image);
                // The user is the pulled image's: ask again, as
                // getImageUser does. An error here reaches the container as
                // a config error, not a pull error.
                rt.image_status(&c.image).await.map_err(|e| {
                    waiting(
                        WaitingReason::CreateContainerConfigError,
                        format!("image status of {:?}: {e}", c.image),
                    )
                })
            }
            Err(e) => {
                tracing::warn!(pod = %spec.full_name(), image = %c.image, error = %e, "image pull failed");
                self.pulls.failed(&spec.uid, &c.image, now);
                Err(waiting(
                    WaitingReason::ErrImagePull,
                    format!("Failed to pull image {:?}: {e}", c.image),
                ))
            }
        }
    }

    fn observe_probes(&mut self, spec: &PodSpec, snap: &Snapshot) {
        for c in &spec.containers {
            let p = self
                .probes
                .entry(c.name.clone())
                .or_insert_with(|| ContainerProbes::new(c));
            match snap.latest(&c.name).map(|i| &i.status) {
                Some(s) if s.state == ContainerState::Running => p.observe(Observed::Running {
                    container_id: &s.id,
                    started_at: instant(s.started_at.unwrap_or(s.created_at)),
                }),
                _ => p.observe(Observed::NotRunning),
            }
        }
    }

    /// Old instances beyond the last two of each container go: the newest
    /// gives the state, the one before it `lastState`.
    async fn gc(&self, snap: &Snapshot) {
        for i in snap.containers.values().flat_map(|v| v.iter().skip(2)) {
            if i.status.state == ContainerState::Exited
                && let Err(e) = self.shared.runtime.remove_container(&i.status.id).await
            {
                tracing::debug!(id = %i.status.id, error = %e, "container gc");
            }
        }
    }

    /// The status from a snapshot, published when it changed.
    pub(super) fn publish_snapshot(&mut self, spec: &PodSpec, snap: &Snapshot) {
        let terminal = api_terminal(&self.pod) || finished(spec, snap) || spec.deleting;
        self.publish_with(spec, snap, terminal);
    }

    pub(super) fn publish_with(&mut self, spec: &PodSpec, snap: &Snapshot, terminal: bool) {
        let now = timestamp_now();
        let mut views = BTreeMap::new();
        let mut refs = BTreeMap::new();
        for c in spec.all_containers() {
            let instances = snap.containers.get(&c.name);
            let latest = instances.and_then(|v| v.first()).map(|i| &i.status);
            let hold = self.waiting.get(&c.name).cloned();
            if let Some(r) = instances.and_then(|v| super::container_ref(v)) {
                refs.insert(c.name.clone(), r);
            }
            if latest.is_none() && hold.is_none() {
                continue;
            }
            let running = latest.is_some_and(|l| l.state == ContainerState::Running);
            let init = spec.is_init_container(&c.name);
            let probes = self.probes.get(&c.name).filter(|_| !init);
            views.insert(
                c.name.clone(),
                ContainerView {
                    latest: latest.map(runtime_container),
                    previous: instances
                        .and_then(|v| v.get(1))
                        .filter(|i| i.status.state == ContainerState::Exited)
                        .map(|i| terminated(&i.status)),
                    restart_count: latest.map_or(0, restart_count),
                    waiting: hold,
                    ready: !init && probes.map_or(running, ContainerProbes::ready),
                    started: probes.map_or(running, ContainerProbes::started),
                },
            );
        }
        if let Some(sb) = &snap.ready {
            let ips: Vec<IpAddr> = sb.ip.iter().chain(&sb.additional_ips).copied().collect();
            if !ips.is_empty() {
                self.pod_ips = ips;
            } else if let Some(ip) = self.shared.config.node_ip {
                self.pod_ips = vec![ip];
            }
        }
        let start_time = *self.start_time.get_or_insert_with(|| {
            snap.sandboxes
                .iter()
                .map(|s| s.created_at)
                .min()
                .map_or(now, timestamp)
        });
        let view = PodView {
            spec,
            containers: &views,
            sandbox_ready: snap.ready.is_some() && !terminal,
            pod_ips: self.pod_ips.clone(),
            host_ips: self.shared.config.node_ip.into_iter().collect(),
            start_time: Some(start_time),
            terminal,
            // The API's copy carries what an earlier kubelet reported.
            previous: self.last_status.as_ref().or(self.pod.status.as_ref()),
            now,
        };
        let status = pod_status(&view);
        let sandbox = snap
            .ready
            .as_ref()
            .filter(|_| !terminal)
            .map(|s| s.id.clone());
        self.publish(status, refs, sandbox);
    }

    fn publish(
        &mut self,
        status: PodStatus,
        refs: BTreeMap<String, ContainerRef>,
        sandbox: Option<String>,
    ) {
        if self.last_status.as_ref() != Some(&status) {
            self.shared.sink.publish(&self.pod, &self.source, &status);
            self.last_status = Some(status.clone());
        }
        let mut pod = self.pod.clone();
        pod.status = Some(status);
        self.shared.view.set(&self.uid, pod, refs, sandbox);
    }
}
