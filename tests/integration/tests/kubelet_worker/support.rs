//! Shared pieces of the worker tests: a recording StatusSink, status
//! accessors, pod builders, and a worker running in the node namespace.
use std::{
    collections::BTreeMap,
    fs::File,
    future::Future,
    os::fd::AsRawFd as _,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Result, bail, ensure};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde_json::json;
use tokio::sync::mpsc;
use weir_integration::containerd::Containerd;
use weir_kubelet::{
    cri::{CriRuntime, Runtime as _, SandboxFilter},
    flow::{PodEvent, PodSource, StatusSink},
    worker::{POD_UID_LABEL, Worker, WorkerConfig, memory_capacity},
};

/// Every status the worker published, and the pods it reported terminated.
#[derive(Default)]
pub(crate) struct Recorder {
    pub(crate) statuses: Mutex<BTreeMap<String, Vec<(Instant, PodStatus)>>>,
    pub(crate) terminated: Mutex<BTreeMap<String, Instant>>,
}

pub(crate) fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

impl StatusSink for Recorder {
    fn publish(&self, pod: &Pod, _: &PodSource, status: &PodStatus) {
        self.statuses
            .lock()
            .unwrap()
            .entry(uid_of(pod))
            .or_default()
            .push((Instant::now(), status.clone()));
    }
    fn terminated(&self, pod: &Pod, _: &PodSource) {
        self.terminated
            .lock()
            .unwrap()
            .insert(uid_of(pod), Instant::now());
    }
}

impl Recorder {
    pub(crate) fn history(&self, uid: &str) -> Vec<(Instant, PodStatus)> {
        self.statuses
            .lock()
            .unwrap()
            .get(uid)
            .cloned()
            .unwrap_or_default()
    }

    pub(crate) fn latest(&self, uid: &str) -> Option<PodStatus> {
        self.history(uid).pop().map(|(_, s)| s)
    }

    /// Waits for a published status that satisfies `want`.
    pub(crate) async fn wait(
        &self,
        uid: &str,
        timeout: Duration,
        what: &str,
        want: impl Fn(&PodStatus) -> bool,
    ) -> Result<PodStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.latest(uid).filter(|s| want(s)) {
                return Ok(s);
            }
            if Instant::now() > deadline {
                bail!(
                    "pod {uid}: {what} not seen within {timeout:?}; last status: {}",
                    serde_json::to_string_pretty(&self.latest(uid)).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

pub(crate) fn phase(s: &PodStatus) -> &str {
    s.phase.as_deref().unwrap_or_default()
}

pub(crate) fn condition(s: &PodStatus, type_: &str) -> bool {
    s.conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == type_ && c.status == "True")
}

pub(crate) fn container<'a>(
    s: &'a PodStatus,
    name: &str,
) -> &'a k8s_openapi::api::core::v1::ContainerStatus {
    s.container_statuses
        .iter()
        .flatten()
        .chain(s.init_container_statuses.iter().flatten())
        .find(|c| c.name == name)
        .expect("container status")
}

pub(crate) fn restarts(s: &PodStatus, name: &str) -> i32 {
    s.container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)
        .map_or(-1, |c| c.restart_count)
}

pub(crate) fn cri_id(s: &PodStatus, name: &str) -> String {
    container(s, name)
        .container_id
        .clone()
        .unwrap_or_default()
        .trim_start_matches("containerd://")
        .to_owned()
}

pub(crate) fn sh(script: &str) -> serde_json::Value {
    json!(["sh", "-c", script])
}

pub(crate) fn pod(name: &str, spec: serde_json::Value) -> Pod {
    let uid = format!("{name}-{}", std::process::id());
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": spec,
    }))
    .expect("a valid Pod")
}

pub(crate) fn upsert(pod: &Pod) -> PodEvent {
    PodEvent::Upsert {
        pod: Box::new(pod.clone()),
        source: PodSource::Api,
    }
}

pub(crate) fn worker_config(ctrd: &Containerd) -> WorkerConfig {
    WorkerConfig {
        node_name: "node1".into(),
        node_ip: None,
        cluster_dns: vec!["10.96.0.10".parse().unwrap()],
        cluster_domain: Some("cluster.local".into()),
        pod_log_dir: ctrd.dir.join("pod-logs"),
        pods_dir: ctrd.dir.join("kubelet/pods"),
        seccomp_dir: ctrd.dir.join("kubelet/seccomp"),
        cgroup_root: ctrd.cgroup_parent(),
        resolv_conf: "/etc/resolv.conf".into(),
        relist_period: Duration::from_secs(1),
        sync_frequency: Duration::from_secs(60),
        memory_capacity: memory_capacity(),
        objects: None,
        health: None,
    }
}

/// A worker with its event channel and recorder.
pub(crate) struct Kubelet {
    pub(crate) worker: Worker,
    pub(crate) events: mpsc::Sender<PodEvent>,
    pub(crate) rec: Arc<Recorder>,
}

pub(crate) fn start_worker(ctrd: &Containerd) -> Kubelet {
    let rec = Arc::new(Recorder::default());
    let (events, rx) = mpsc::channel(64);
    let worker = Worker::spawn(
        Arc::new(ctrd.runtime()),
        worker_config(ctrd),
        rec.clone(),
        rx,
    );
    Kubelet {
        worker,
        events,
        rec,
    }
}

/// Runs `f` on a multi-threaded runtime whose threads live in the node
/// namespace (setns moves only the calling thread; threads it spawns inherit).
pub(crate) fn on_node<F: Future<Output = Result<()>>>(
    ctrd: &Containerd,
    f: impl FnOnce() -> F,
) -> Result<()> {
    let home = File::open("/proc/thread-self/ns/net")?;
    let node = File::open(ctrd.node.path())?;
    let enter = |fd: &File| -> Result<()> {
        // SAFETY: setns on an fd we own; it changes only this thread.
        let rc = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
        ensure!(rc == 0, "setns: {}", std::io::Error::last_os_error());
        Ok(())
    };
    enter(&node)?;
    let res = (|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        rt.block_on(f())
    })();
    enter(&home)?;
    if res.is_err() {
        eprintln!("containerd log (tail):");
        let log = ctrd.log();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        for l in tail.into_iter().rev() {
            eprintln!("{l}");
        }
    }
    res
}

pub(crate) async fn exec(cri: &CriRuntime, id: &str, script: &str) -> Result<(i32, String)> {
    let cmd = ["sh".to_owned(), "-c".to_owned(), script.to_owned()];
    let r = cri.exec_sync(id, &cmd, Duration::from_secs(10)).await?;
    Ok((r.exit_code, String::from_utf8_lossy(&r.stdout).into_owned()))
}

pub(crate) async fn sandboxes_of(cri: &CriRuntime, uid: &str) -> Result<usize> {
    let f = SandboxFilter {
        labels: BTreeMap::from([(POD_UID_LABEL.to_owned(), uid.to_owned())]),
        ..Default::default()
    };
    Ok(cri.list_pod_sandboxes(&f).await?.len())
}
