//! One pod's worker, as the kubelet's pod worker: it syncs when the PLEG
//! reports a change of the pod's runtime state, when the pod changes, when a
//! probe or a backoff is due, and every `syncFrequency`. A sync decides
//! ([`compute_pod_actions`], pure) and then acts, reads the pod's state again
//! after acting, runs the due probes and publishes the status when it
//! changed. Nothing it decides depends on memory it could lose, except
//! backoffs and probe results, which the kubelet also starts afresh.
use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::{Pod, PodStatus},
    jiff::Timestamp,
};
use tokio::sync::mpsc;

use super::{
    PodMsg, Shared,
    actions::{PodActions, compute_pod_actions, finished},
    run_as::{ImageUser, apply_image_user, verify_run_as_non_root},
    snapshot::{self, Snapshot, Stamped, instant, restart_count, timestamp},
    spec,
};
use crate::{
    cri::{ContainerState, ContainerStatus, CriError, ImageInfo, Runtime, SandboxStatus},
    flow::{ContainerRef, PodSource},
    pod::{
        ContainerSpec, InvalidPod, PodSpec, PullPolicy,
        backoff::{CrashLoopBackoff, ImagePullBackoff, PullGate},
        probe::{ContainerProbes, Observed},
        status::{
            ContainerView, PodView, RuntimeContainer, RuntimeState, Terminated, Waiting,
            WaitingReason, invalid_pod_status, pod_status,
        },
        timestamp_now,
    },
};

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
    /// The pod's newest known runtime state: the PLEG's, or this task's own
    /// relist after it acted. `None` makes the next sync relist.
    pub(super) state: Option<Stamped>,
    /// The earliest a sync must run again besides the PLEG and the resync:
    /// a backoff's end, or a retry of something that failed.
    wake: Option<tokio::time::Instant>,
    /// Set once node-pressure eviction stopped the pod: its status message.
    pub(super) evicted: Option<String>,
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
            state: None,
            wake: None,
            evicted: None,
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
            let mut msg = tokio::select! {
                msg = rx.recv() => Some(msg),
                () = tokio::time::sleep_until(next) => None,
            };
            // Everything queued is taken before one sync covers it all.
            while let Some(m) = msg {
                let grace = match m {
                    Some(PodMsg::Update(pod)) => {
                        self.update(*pod).await;
                        None
                    }
                    Some(PodMsg::Relisted(state)) => {
                        self.relisted(*state);
                        None
                    }
                    Some(PodMsg::Evict(e)) => {
                        self.evict(*e).await;
                        None
                    }
                    Some(PodMsg::Remove { grace }) => {
                        Some(grace.unwrap_or_else(|| self.grace_period(false)))
                    }
                    // The worker is going away: the pod stays as it is.
                    None => return,
                };
                if let Some(grace) = grace {
                    self.terminating(grace, &mut rx).await;
                    return;
                }
                msg = rx.try_recv().ok().map(Some);
            }
            if self.pod.metadata.deletion_timestamp.is_some() {
                let grace = self.grace_period(true);
                self.terminating(grace, &mut rx).await;
                return;
            }
            self.step().await;
            next = self.next_sync();
        }
    }

    /// A state the PLEG read; older than what this task knows, it is dropped.
    pub(super) fn relisted(&mut self, state: Stamped) {
        if self.state.as_ref().is_none_or(|s| s.at <= state.at) {
            self.state = Some(state);
        }
    }

    /// When the next sync is due without a message: the resync, a due probe,
    /// or what the last sync asked for.
    fn next_sync(&self) -> tokio::time::Instant {
        let resync = tokio::time::Instant::now() + self.shared.config.sync_frequency;
        let probe = self
            .probes
            .values()
            .filter_map(ContainerProbes::next_due)
            .min()
            .map(tokio::time::Instant::from_std);
        [Some(resync), probe, self.wake]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(resync)
    }

    /// The next sync comes no later than `after` from now.
    fn wake_within(&mut self, after: Duration) {
        let at = tokio::time::Instant::now() + after;
        self.wake = Some(self.wake.map_or(at, |w| w.min(at)));
    }

    /// The runtime changed under this task's hands: read it again, soon.
    pub(super) fn invalidate(&mut self) {
        self.state = None;
        self.wake_within(Duration::ZERO);
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
            self.teardown(grace).await;
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
                self.state = None;
                self.wake_within(self.shared.config.relist_period);
            }
        }
    }

    /// Reads the pod's state itself (after it acted, or before its first
    /// sync) and keeps it as the newest.
    pub(super) async fn relist(&mut self) -> Result<Snapshot, CriError> {
        let state = snapshot::relist(&*self.shared.runtime, &self.uid).await?;
        let snap = state.snapshot.clone();
        self.state = Some(state);
        Ok(snap)
    }

    /// Acts until nothing more can be done on this sync (a new sandbox lets
    /// containers start at once), then probes.
    async fn sync(&mut self, spec: &PodSpec) -> Result<Snapshot, CriError> {
        self.waiting.clear();
        self.wake = None;
        let mut snap = match &self.state {
            Some(s) => s.snapshot.clone(),
            None => self.relist().await?,
        };
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
        // Held back without a timer of its own (a config error, a failed
        // create): tried again after a relist period, as the kubelet's pod
        // workers requeue a failed sync.
        let retry = self.sandbox_error.is_some()
            || self.waiting.values().any(|w| {
                !matches!(
                    w.reason,
                    WaitingReason::CrashLoopBackOff | WaitingReason::ImagePullBackOff
                )
            });
        if retry {
            self.wake_within(self.shared.config.relist_period);
        }
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

    /// Carries out one round of [`compute_pod_actions`]; true when the
    /// runtime changed.
    async fn act(&mut self, spec: &PodSpec, snap: &Snapshot) -> Result<bool, CriError> {
        let rt = self.shared.runtime.clone();
        let now = Instant::now();
        let done = api_terminal(&self.pod) || self.evicted.is_some();
        let actions = compute_pod_actions(spec, snap, done, &self.crash, now);
        for b in &actions.back_off {
            self.waiting.insert(
                b.name.clone(),
                waiting(WaitingReason::CrashLoopBackOff, b.message.clone()),
            );
            self.wake_within(b.remaining);
        }
        if actions.is_empty() {
            return Ok(false);
        }
        let PodActions {
            stop_sandbox,
            kill,
            create_sandbox,
            start,
            ..
        } = actions;
        if let Some(id) = stop_sandbox {
            tracing::info!(pod = %spec.full_name(), "pod finished; stopping its sandbox");
            rt.stop_pod_sandbox(&id).await?;
        }
        for id in &kill {
            rt.stop_container(id, Duration::ZERO).await?;
        }
        if let Some(attempt) = create_sandbox {
            let cfg = spec::sandbox_config(&self.shared.config, spec, attempt);
            match rt.run_pod_sandbox(&cfg).await {
                Ok(id) => {
                    tracing::info!(pod = %spec.full_name(), sandbox = %id, attempt, "sandbox started");
                    self.sandbox_error = None;
                }
                // Reported, and retried: the pod stays Pending with its
                // containers ContainerCreating.
                Err(e) => {
                    let msg = e.to_string();
                    if self.sandbox_error.as_ref() != Some(&msg) {
                        tracing::warn!(pod = %spec.full_name(), error = %msg, "cannot create the pod sandbox");
                    }
                    self.sandbox_error = Some(msg);
                    return Ok(!kill.is_empty());
                }
            }
            return Ok(true);
        }
        let Some(sb) = &snap.ready else {
            return Ok(true);
        };
        let mut acted = !kill.is_empty();
        for s in start {
            let Some(c) = spec.container(&s.name) else {
                continue;
            };
            if let Some(finished_at) = s.replaces {
                self.crash.restarted(&spec.uid, &c.name, finished_at, now);
            }
            acted |= self.start(spec, c, snap, sb).await?;
        }
        Ok(acted)
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
        if let PullGate::Wait { message, remaining } = self.pulls.check(&spec.uid, &c.image, now) {
            self.wake_within(remaining);
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
        let terminal = api_terminal(&self.pod)
            || finished(spec, snap)
            || spec.deleting
            || self.evicted.is_some();
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
        let mut status = pod_status(&view);
        if let Some(message) = &self.evicted {
            super::evicted::evicted_status(&mut status, message, &now);
        }
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
        let static_pod = matches!(self.source, PodSource::File(_));
        self.shared
            .view
            .set(&self.uid, pod, static_pod, refs, sandbox);
    }
}
