//! The pod worker: turns [`PodEvent`]s into sandboxes and containers, as the
//! kubelet's pod workers and PLEG do, kept small.
//!
//! ```text
//!  PodEvent ─▶ manager ─┬─▶ pod task (uid A): decide ─▶ act (CRI calls) ─▶ status ─▶ StatusSink + PodsView
//!                ▲      └─▶ pod task (uid B)
//!                │ Relisted (changed pods only)
//!  PLEG: every 1 s, ListPodSandbox + ListContainers for the whole node
//! ```
//!
//! One task per pod UID, so a slow stop (a grace period) of one pod never
//! holds another back. A task syncs when the PLEG reports its pod changed,
//! when the pod changes, when a probe or backoff is due, and every
//! `syncFrequency`. Each task is stateless towards the runtime: the state
//! it acts on is read by the `io.kubernetes.pod.uid` label, and restart
//! counts live in container annotations. That is what makes a new worker
//! adopt what an old (killed) one started, without restarts.
//! Dropping the [`Worker`] aborts every task and leaves the containers running,
//! as a killed kubelet would.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::IpAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use tokio::{
    sync::{mpsc, watch},
    task::JoinSet,
};

use crate::{
    config::Config,
    cri::Runtime,
    flow::{ContainerRef, PodEvent, PodSource, PodsView, StatusSink},
    health::NodeHealth,
};

mod actions;
mod atomic_writer;
mod evicted;
mod host_path;
mod lifecycle;
mod log_rotation;
mod ownership;
mod pleg;
mod pod_dir;
mod pod_task;
mod projection;
#[cfg(test)]
mod projection_tests;
mod run_as;
mod snapshot;
mod spec;
mod subpath;
mod terminate;
#[cfg(test)]
mod tests;

pub use log_rotation::{LogRotation, rotate_logs, rotate_once};
pub use run_as::NonRootError;
pub use spec::{
    ApiObjects, CONTAINER_NAME_LABEL, ContainerConfigError, GRACE_ANNOTATION, POD_NAME_LABEL,
    POD_NAMESPACE_LABEL, POD_UID_LABEL, RESTART_COUNT_ANNOTATION,
};
pub use subpath::SubPathError;

/// How the worker runs pods on this node.
#[derive(Clone)]
pub struct WorkerConfig {
    pub node_name: String,
    /// `status.hostIP`, and the pod IP of host-network pods.
    pub node_ip: Option<IpAddr>,
    pub cluster_dns: Vec<IpAddr>,
    pub cluster_domain: Option<String>,
    /// Where container logs go: `<pod_log_dir>/<ns>_<name>_<uid>/<container>/<n>.log`.
    pub pod_log_dir: PathBuf,
    /// Per-pod directories (emptyDir, projected configMap/secret files).
    pub pods_dir: PathBuf,
    /// Localhost seccomp profiles live below it (`<root-dir>/seccomp`).
    pub seccomp_dir: PathBuf,
    /// Pod cgroups go under `<cgroup_root>[/burstable|/besteffort]/pod<uid>`.
    pub cgroup_root: String,
    /// The node's resolver config, for pods that do not use the cluster's;
    /// empty as the kubelet's `resolvConf: ""`.
    pub resolv_conf: PathBuf,
    /// PLEG: how often the runtime state is relisted.
    pub relist_period: Duration,
    /// How often a running pod's projected files are rewritten
    /// (`syncFrequency`).
    pub sync_frequency: Duration,
    /// Memory of the node, for Burstable containers' `oom_score_adj`.
    pub memory_capacity: Option<i64>,
    /// ConfigMaps and Secrets (API-server mode); `None` reports such volumes
    /// and env sources as unsupported.
    pub objects: Option<Arc<dyn ApiObjects>>,
    /// Where the PLEG records its relists (the Node's Ready condition).
    pub health: Option<Arc<NodeHealth>>,
}

impl WorkerConfig {
    /// The kubelet's defaults for the paths and periods.
    pub fn new(config: &Config, node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            node_ip: None,
            cluster_dns: config.cluster_dns.clone(),
            cluster_domain: config.cluster_domain.clone(),
            pod_log_dir: "/var/log/pods".into(),
            pods_dir: "/var/lib/kubelet/pods".into(),
            seccomp_dir: "/var/lib/kubelet/seccomp".into(),
            cgroup_root: "/kubepods".into(),
            resolv_conf: config.resolv_conf.clone(),
            relist_period: Duration::from_secs(1),
            sync_frequency: config.sync_frequency,
            memory_capacity: memory_capacity(),
            objects: None,
            health: None,
        }
    }
}

/// `MemTotal` of /proc/meminfo in bytes.
pub fn memory_capacity() -> Option<i64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: i64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What the HTTP servers read: every pod with its last status.
#[derive(Default)]
pub struct View {
    pods: Mutex<BTreeMap<String, ViewEntry>>,
}

#[derive(Clone)]
struct ViewEntry {
    pod: Pod,
    /// From a static pod file: never evicted (the kubelet's critical pods).
    static_pod: bool,
    /// By container name.
    containers: BTreeMap<String, ContainerRef>,
    /// The Ready sandbox's id.
    sandbox: Option<String>,
}

impl View {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, ViewEntry>> {
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(
        &self,
        uid: &str,
        pod: Pod,
        static_pod: bool,
        containers: BTreeMap<String, ContainerRef>,
        sandbox: Option<String>,
    ) {
        self.lock().insert(
            uid.to_owned(),
            ViewEntry {
                pod,
                static_pod,
                containers,
                sandbox,
            },
        );
    }

    fn entry<T>(
        &self,
        namespace: &str,
        pod: &str,
        f: impl FnOnce(&ViewEntry) -> Option<T>,
    ) -> Option<T> {
        self.lock()
            .values()
            .find(|e| {
                e.pod.metadata.namespace.as_deref() == Some(namespace)
                    && e.pod.metadata.name.as_deref() == Some(pod)
            })
            .and_then(f)
    }

    fn remove(&self, uid: &str) {
        self.lock().remove(uid);
    }
}

/// What the HTTP API needs of a container's instances (newest first).
fn container_ref(instances: &[snapshot::Instance]) -> Option<ContainerRef> {
    let latest = &instances.first()?.status;
    Some(ContainerRef {
        id: latest.id.clone(),
        running: latest.state == crate::cri::ContainerState::Running,
        log: latest.log_path.clone(),
        previous_log: instances
            .get(1)
            .filter(|i| i.status.state == crate::cri::ContainerState::Exited)
            .and_then(|i| i.status.log_path.clone()),
    })
}

impl PodsView for View {
    fn pods(&self) -> Vec<Pod> {
        self.lock().values().map(|e| e.pod.clone()).collect()
    }

    fn container(&self, namespace: &str, pod: &str, container: &str) -> Option<ContainerRef> {
        self.entry(namespace, pod, |e| e.containers.get(container).cloned())
    }

    fn sandbox(&self, namespace: &str, pod: &str) -> Option<String> {
        self.entry(namespace, pod, |e| e.sandbox.clone())
    }
}

/// What every pod task shares.
struct Shared<R> {
    runtime: Arc<R>,
    config: WorkerConfig,
    sink: Arc<dyn StatusSink>,
    view: Arc<View>,
}

/// A running worker. Dropping it stops the worker (not the pods).
pub struct Worker {
    view: Arc<View>,
    config: WorkerConfig,
    control: mpsc::UnboundedSender<Control>,
    manager: tokio::task::JoinHandle<()>,
}

/// Requests to the manager besides pod events.
enum Control {
    ReapOrphans,
    Evict { uid: String, eviction: Eviction },
}

/// Why and how the eviction manager stops a pod for good.
#[derive(Clone, Debug)]
pub struct Eviction {
    /// The status message and Event, as the kubelet words it.
    pub message: String,
    pub grace: Duration,
}

/// A running pod as the eviction manager ranks it.
#[derive(Clone, Debug)]
pub struct EvictionTarget {
    pub pod: Pod,
    /// Static pods are never evicted.
    pub static_pod: bool,
    /// Where the pod's local storage lives: its directory (emptyDir) and
    /// its containers' logs.
    pub dirs: Vec<PathBuf>,
    /// The pod's cgroupfs path, for its memory use.
    pub cgroup: Option<String>,
}

impl Worker {
    /// Starts the worker on the current Tokio runtime. It runs until dropped;
    /// when `events` closes, the pods it runs keep running.
    pub fn spawn<R: Runtime + 'static>(
        runtime: Arc<R>,
        config: WorkerConfig,
        sink: Arc<dyn StatusSink>,
        events: mpsc::Receiver<PodEvent>,
    ) -> Self {
        let view = Arc::new(View::default());
        let shared = Arc::new(Shared {
            runtime,
            config: config.clone(),
            sink,
            view: view.clone(),
        });
        let (control, control_rx) = mpsc::unbounded_channel();
        let manager = tokio::spawn(manage(shared, events, control_rx));
        Self {
            view,
            config,
            control,
            manager,
        }
    }

    /// Stops and removes every sandbox this kubelet labelled whose pod it
    /// does not run now: pods whose source dropped them while no kubelet was
    /// running. Call once every source delivered its first full state.
    pub fn reap_orphans(&self) {
        let _ = self.control.send(Control::ReapOrphans);
    }

    /// [`Self::reap_orphans`] once `ready` resolves true (the sources
    /// delivered their first complete state); never if it resolves false.
    pub fn reap_orphans_when(&self, ready: impl Future<Output = bool> + Send + 'static) {
        let control = self.control.clone();
        tokio::spawn(async move {
            if ready.await {
                let _ = control.send(Control::ReapOrphans);
            }
        });
    }

    /// The pods and their statuses, for `/pods` and `/containerLogs`.
    pub fn view(&self) -> Arc<dyn PodsView> {
        self.view.clone()
    }

    /// What the eviction manager needs of the worker.
    pub fn eviction_handle(&self) -> EvictionHandle {
        EvictionHandle {
            view: self.view.clone(),
            config: self.config.clone(),
            control: self.control.clone(),
        }
    }
}

/// The pods as the eviction manager reads them, and the way to evict one.
#[derive(Clone)]
pub struct EvictionHandle {
    view: Arc<View>,
    config: WorkerConfig,
    control: mpsc::UnboundedSender<Control>,
}

impl EvictionHandle {
    /// The pods that run, with where their usage can be read.
    pub fn eviction_targets(&self) -> Vec<EvictionTarget> {
        let entries: Vec<ViewEntry> = self.view.lock().values().cloned().collect();
        let cfg = &self.config;
        entries
            .into_iter()
            .filter(|e| e.sandbox.is_some())
            .filter_map(|e| {
                let spec = crate::pod::PodSpec::from_api(&e.pod).ok()?;
                let mut dirs: Vec<PathBuf> =
                    pod_dir::pod_dir(cfg, &spec.uid).ok().into_iter().collect();
                dirs.extend(spec::log_directory(cfg, &spec));
                Some(EvictionTarget {
                    cgroup: spec::pod_cgroup(cfg, &spec),
                    static_pod: e.static_pod,
                    pod: e.pod,
                    dirs,
                })
            })
            .collect()
    }

    /// Stops pod `uid` for good and reports it Failed with reason Evicted.
    pub fn evict(&self, uid: &str, eviction: Eviction) {
        let _ = self.control.send(Control::Evict {
            uid: uid.to_owned(),
            eviction,
        });
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // The manager owns the pod tasks' JoinSet: aborting it aborts them.
        self.manager.abort();
    }
}

/// A message to one pod task.
#[derive(Debug)]
enum PodMsg {
    Update(Box<Pod>),
    /// The PLEG saw the pod's runtime state change.
    Relisted(Box<snapshot::Stamped>),
    /// Stop the pod for good, within `grace` when its source gave one.
    Remove {
        grace: Option<Duration>,
    },
    /// Stop the pod's containers and report it evicted; it stays known.
    Evict(Box<Eviction>),
}

struct PodHandle {
    tx: mpsc::UnboundedSender<PodMsg>,
    /// Becomes true once the pod is torn down.
    done: watch::Receiver<bool>,
    source: PodSource,
    generation: u64,
    removing: bool,
}

async fn manage<R: Runtime + 'static>(
    shared: Arc<Shared<R>>,
    mut events: mpsc::Receiver<PodEvent>,
    mut control: mpsc::UnboundedReceiver<Control>,
) {
    let mut pods: HashMap<String, PodHandle> = HashMap::new();
    // The UIDs in `pods`, for a reap running meanwhile: a pod added after
    // the reap started is there before its task can create a sandbox.
    let live: Arc<Mutex<HashSet<String>>> = Arc::default();
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut task_ids: HashMap<tokio::task::Id, (String, u64)> = HashMap::new();
    let mut generation = 0u64;
    // Pods whose task finished a deletion before their source said Remove:
    // an update the deletion itself causes (the API server writes the final
    // delete's grace period 0 before the object goes) must not start them
    // again, as the kubelet's pod workers remember terminated pods.
    let mut terminated: HashSet<String> = HashSet::new();
    let mut open = true;
    // The PLEG lives in the JoinSet, so it stops with the manager.
    let (pleg_tx, mut relisted) = mpsc::unbounded_channel();
    let pleg = pleg::Pleg::new(shared.runtime.clone(), shared.config.health.clone());
    tasks.spawn(pleg.run(shared.config.relist_period, pleg_tx));
    loop {
        tokio::select! {
            // Events first: a reap must see every pod sent before it.
            biased;
            ev = events.recv(), if open => match ev {
                None => open = false,
                Some(PodEvent::Remove { uid, grace }) => {
                    if let Some(h) = pods.get_mut(&uid) {
                        h.removing = true;
                        let _ = h.tx.send(PodMsg::Remove { grace });
                    } else {
                        terminated.remove(&uid);
                    }
                }
                Some(PodEvent::Upsert { pod, source }) => {
                    let uid = pod.metadata.uid.clone().unwrap_or_default();
                    // Watches for the ConfigMaps and Secrets it refers to
                    // start now, before its containers need them.
                    if let Some(o) = &shared.config.objects {
                        o.register_pod(&pod);
                    }
                    if let Some(h) = pods.get(&uid).filter(|h| !h.removing) {
                        let _ = h.tx.send(PodMsg::Update(pod));
                        continue;
                    }
                    if terminated.contains(&uid) {
                        continue;
                    }
                    // Kill before create: a new pod waits for the teardown of
                    // the pod it replaces (same UID being removed, or an
                    // older version of the same static pod file).
                    let wait_for: Vec<watch::Receiver<bool>> = pods
                        .iter()
                        .filter(|(u, h)| {
                            **u == uid
                                || (h.source == source && matches!(source, PodSource::File(_)))
                        })
                        .map(|(_, h)| h.done.clone())
                        .collect();
                    for (u, h) in pods.iter_mut() {
                        if *u != uid && h.source == source && matches!(source, PodSource::File(_)) && !h.removing {
                            h.removing = true;
                            let _ = h.tx.send(PodMsg::Remove { grace: None });
                        }
                    }
                    generation += 1;
                    let (tx, rx) = mpsc::unbounded_channel();
                    let (done_tx, done) = watch::channel(false);
                    let task = pod_task::PodTask::new(shared.clone(), *pod, source.clone());
                    let g = generation;
                    let key = uid.clone();
                    let handle = tasks.spawn(async move {
                        for mut w in wait_for {
                            let _ = w.wait_for(|d| *d).await;
                        }
                        task.run(rx).await;
                        let _ = done_tx.send(true);
                    });
                    task_ids.insert(handle.id(), (key, g));
                    // A replaced handle (same UID, removing) keeps running
                    // until its task ends; only its entry goes.
                    lock(&live).insert(uid.clone());
                    pods.insert(uid, PodHandle { tx, done, source, generation: g, removing: false });
                }
            },
            Some(changed) = relisted.recv() => {
                for r in changed {
                    if let Some(h) = pods.get(&r.uid) {
                        let _ = h.tx.send(PodMsg::Relisted(Box::new(r.state)));
                    }
                }
            }
            Some(c) = control.recv() => match c {
                Control::ReapOrphans => {
                    tasks.spawn(reap_orphans(shared.clone(), live.clone()));
                }
                Control::Evict { uid, eviction } => {
                    if let Some(h) = pods.get(&uid).filter(|h| !h.removing) {
                        let _ = h.tx.send(PodMsg::Evict(Box::new(eviction)));
                    }
                }
            },
            Some(res) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                let (id, failed) = match &res {
                    Ok((id, ())) => (*id, false),
                    Err(e) => {
                        tracing::error!(error = %e, "pod worker task failed");
                        (e.id(), true)
                    }
                };
                // A failed task's pod is forgotten: its next update starts it afresh.
                if let Some((uid, g)) = task_ids.remove(&id)
                    && let Some(h) = pods.get(&uid).filter(|h| h.generation == g)
                {
                    if !failed && !h.removing {
                        terminated.insert(uid.clone());
                    }
                    pods.remove(&uid);
                    lock(&live).remove(&uid);
                    if let Some(o) = &shared.config.objects {
                        o.unregister_pod(&uid);
                    }
                }
            }
            else => std::future::pending::<()>().await,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Tears down labelled sandboxes of pods not in `live`, each container with
/// the grace period it was started with, and removes their pod directories
/// (the kubelet's `HandlePodCleanups` and `cleanupOrphanedPodDirs`).
async fn reap_orphans<R: Runtime + 'static>(
    shared: Arc<Shared<R>>,
    live: Arc<Mutex<HashSet<String>>>,
) {
    let rt = &shared.runtime;
    let sandboxes = match rt.list_pod_sandboxes(&Default::default()).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list sandboxes to find orphans");
            return;
        }
    };
    for sb in sandboxes {
        let Some(uid) = sb.labels.get(POD_UID_LABEL) else {
            continue;
        };
        if lock(&live).contains(uid) {
            continue;
        }
        tracing::info!(pod = %format!("{}/{}", sb.namespace, sb.name), %uid, "removing orphaned pod");
        let filter = crate::cri::ContainerFilter {
            sandbox_id: Some(sb.id.clone()),
            state: Some(crate::cri::ContainerState::Running),
            ..Default::default()
        };
        let running = rt.list_containers(&filter).await.unwrap_or_default();
        let stops = running.iter().map(|c| {
            let grace = c
                .annotations
                .get(GRACE_ANNOTATION)
                .and_then(|g| g.parse().ok())
                .map_or(Duration::from_secs(30), Duration::from_secs);
            rt.stop_container(&c.id, grace)
        });
        for r in futures::future::join_all(stops).await {
            if let Err(e) = r {
                tracing::warn!(error = %e, "stopping an orphaned container");
            }
        }
        if let Err(e) = rt.stop_pod_sandbox(&sb.id).await {
            tracing::warn!(sandbox = %sb.id, error = %e, "stopping an orphaned sandbox");
            continue;
        }
        if let Err(e) = rt.remove_pod_sandbox(&sb.id).await {
            tracing::warn!(sandbox = %sb.id, error = %e, "removing an orphaned sandbox");
            continue;
        }
        if let Err(e) = pod_dir::remove(&shared.config, uid) {
            tracing::warn!(%uid, error = %e, "cannot remove an orphaned pod's directory");
        }
    }
}
