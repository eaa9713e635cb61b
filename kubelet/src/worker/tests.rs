//! The worker's decisions against [`FakeRuntime`]: one pod task driven sync
//! by sync, the test playing the processes.
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde_json::json;

use super::{Shared, View, WorkerConfig, pod_task::PodTask};
use crate::{
    cri::{ContainerFilter, ContainerState, ExecResult, FakeRuntime, Runtime as _},
    flow::{PodSource, StatusSink},
};

const IMAGE: &str = "busybox:1.36";

#[derive(Default)]
struct Sink {
    statuses: Mutex<Vec<PodStatus>>,
    terminated: Mutex<Vec<String>>,
    /// (reason, message) of each Warning Event.
    warnings: Mutex<Vec<(String, String)>>,
}

impl StatusSink for Sink {
    fn publish(&self, _: &Pod, _: &PodSource, status: &PodStatus) {
        self.statuses.lock().unwrap().push(status.clone());
    }
    fn terminated(&self, pod: &Pod, _: &PodSource) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.terminated.lock().unwrap().push(uid);
    }
    fn warning(&self, _: &Pod, reason: &str, message: &str) {
        self.warnings
            .lock()
            .unwrap()
            .push((reason.to_owned(), message.to_owned()));
    }
}

impl Sink {
    fn last(&self) -> PodStatus {
        self.statuses
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("a status")
    }
}

fn config() -> WorkerConfig {
    let dir = std::env::temp_dir().join(format!("weir-worker-unit-{}", std::process::id()));
    WorkerConfig {
        node_name: "node".into(),
        node_ip: None,
        cluster_dns: vec![],
        cluster_domain: None,
        pod_log_dir: dir.join("logs"),
        pods_dir: dir.join("pods"),
        seccomp_dir: dir.join("seccomp"),
        cgroup_root: "/kubepods".into(),
        resolv_conf: "/nonexistent".into(),
        relist_period: Duration::from_secs(1),
        sync_frequency: Duration::from_secs(60),
        memory_capacity: Some(1 << 30),
        objects: None,
        health: None,
    }
}

fn pod(uid: &str, spec: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": uid},
        "spec": spec,
    }))
    .unwrap()
}

fn c(name: &str) -> serde_json::Value {
    json!({"name": name, "image": IMAGE})
}

fn setup(pod: Pod) -> (Arc<FakeRuntime>, Arc<Sink>, PodTask<FakeRuntime>) {
    let rt = Arc::new(FakeRuntime::new());
    rt.add_image(IMAGE);
    let (sink, task) = task_on(&rt, pod);
    (rt, sink, task)
}

fn task_on(rt: &Arc<FakeRuntime>, pod: Pod) -> (Arc<Sink>, PodTask<FakeRuntime>) {
    let sink = Arc::new(Sink::default());
    let shared = Arc::new(Shared {
        runtime: rt.clone(),
        config: config(),
        sink: sink.clone(),
        view: Arc::new(View::default()),
    });
    (sink, PodTask::new(shared, pod, PodSource::Api))
}

/// One sync after the runtime changed: the PLEG would have reported it.
async fn step(t: &mut PodTask<FakeRuntime>) {
    t.state = None;
    t.step().await;
}

/// The newest container of each name: (id, state).
async fn containers(rt: &FakeRuntime) -> BTreeMap<String, (String, ContainerState)> {
    let mut all = rt
        .list_containers(&ContainerFilter::default())
        .await
        .unwrap();
    all.sort_by_key(|c| c.created_at);
    all.into_iter()
        .map(|c| (c.name.clone(), (c.id, c.state)))
        .collect()
}

fn creates(rt: &FakeRuntime) -> usize {
    rt.calls()
        .iter()
        .filter(|c| *c == "CreateContainer")
        .count()
}

fn phase(s: &PodStatus) -> &str {
    s.phase.as_deref().unwrap_or_default()
}

fn waiting_reason(s: &PodStatus, name: &str) -> Option<String> {
    s.container_statuses
        .iter()
        .flatten()
        .chain(s.init_container_statuses.iter().flatten())
        .find(|c| c.name == name)?
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .reason
        .clone()
}

fn restart_count(s: &PodStatus, name: &str) -> i32 {
    s.container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == name)
        .map_or(-1, |c| c.restart_count)
}

#[tokio::test]
async fn init_containers_run_in_order_before_the_app() {
    let (rt, sink, mut t) = setup(pod(
        "u1",
        json!({"initContainers": [c("a"), c("b")], "containers": [c("app")]}),
    ));
    step(&mut t).await;
    let cs = containers(&rt).await;
    assert_eq!(cs.keys().collect::<Vec<_>>(), ["a"]);
    assert_eq!(phase(&sink.last()), "Pending");
    // Still running: nothing else starts.
    step(&mut t).await;
    assert_eq!(containers(&rt).await.len(), 1);
    rt.exit_container(&cs["a"].0, 0);
    step(&mut t).await;
    let cs = containers(&rt).await;
    assert_eq!(cs.keys().collect::<Vec<_>>(), ["a", "b"]);
    rt.exit_container(&cs["b"].0, 0);
    step(&mut t).await;
    let cs = containers(&rt).await;
    assert_eq!(cs["app"].1, ContainerState::Running);
    let s = sink.last();
    assert_eq!(phase(&s), "Running");
    assert!(
        s.conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Initialized" && c.status == "True")
    );
}

#[tokio::test]
async fn failed_init_container_restarts_unless_never() {
    let (rt, _, mut t) = setup(pod(
        "u2",
        json!({"restartPolicy": "OnFailure", "initContainers": [c("a")], "containers": [c("app")]}),
    ));
    step(&mut t).await;
    rt.exit_container(&containers(&rt).await["a"].0, 1);
    step(&mut t).await;
    assert_eq!(creates(&rt), 2, "{:?}", rt.calls());
    assert!(!containers(&rt).await.contains_key("app"));

    let (rt, sink, mut t) = setup(pod(
        "u3",
        json!({"restartPolicy": "Never", "initContainers": [c("a")], "containers": [c("app")]}),
    ));
    step(&mut t).await;
    rt.exit_container(&containers(&rt).await["a"].0, 1);
    step(&mut t).await;
    step(&mut t).await;
    assert_eq!(creates(&rt), 1);
    assert_eq!(phase(&sink.last()), "Failed");
    // A finished pod's sandbox is stopped.
    assert!(rt.calls().contains(&"StopPodSandbox".to_owned()));
}

#[tokio::test]
async fn restart_policies_and_crash_loop_backoff() {
    // Never: an exit is final.
    let (rt, sink, mut t) = setup(pod(
        "n",
        json!({"restartPolicy": "Never", "containers": [c("c")]}),
    ));
    step(&mut t).await;
    rt.exit_container(&containers(&rt).await["c"].0, 1);
    step(&mut t).await;
    assert_eq!(creates(&rt), 1);
    assert_eq!(phase(&sink.last()), "Failed");

    // OnFailure: exit 0 is success.
    let (rt, sink, mut t) = setup(pod(
        "o",
        json!({"restartPolicy": "OnFailure", "containers": [c("c")]}),
    ));
    step(&mut t).await;
    rt.exit_container(&containers(&rt).await["c"].0, 0);
    step(&mut t).await;
    assert_eq!(creates(&rt), 1);
    assert_eq!(phase(&sink.last()), "Succeeded");

    // Always: the first exit restarts at once, the next one backs off.
    let (rt, sink, mut t) = setup(pod("a", json!({"containers": [c("c")]})));
    step(&mut t).await;
    rt.exit_container(&containers(&rt).await["c"].0, 0);
    step(&mut t).await;
    assert_eq!(creates(&rt), 2);
    assert_eq!(restart_count(&sink.last(), "c"), 1);
    rt.exit_container(&containers(&rt).await["c"].0, 2);
    step(&mut t).await;
    assert_eq!(creates(&rt), 2, "restarted inside the backoff");
    let s = sink.last();
    assert_eq!(waiting_reason(&s, "c").as_deref(), Some("CrashLoopBackOff"));
    assert_eq!(phase(&s), "Running");
}

#[tokio::test]
async fn image_pull_policies() {
    let rt = Arc::new(FakeRuntime::new());
    let spec = |policy: &str| json!({"containers": [{"name": "c", "image": "missing:1", "imagePullPolicy": policy}]});
    let (sink, mut t) = task_on(&rt, pod("never", spec("Never")));
    step(&mut t).await;
    assert_eq!(
        waiting_reason(&sink.last(), "c").as_deref(),
        Some("ErrImageNeverPull")
    );
    let (sink, mut t) = task_on(&rt, pod("ifnp", spec("IfNotPresent")));
    step(&mut t).await;
    assert_eq!(
        waiting_reason(&sink.last(), "c").as_deref(),
        Some("ErrImagePull")
    );
    let pulls = |rt: &FakeRuntime| rt.calls().iter().filter(|c| *c == "PullImage").count();
    let before = pulls(&rt);
    step(&mut t).await;
    assert_eq!(
        waiting_reason(&sink.last(), "c").as_deref(),
        Some("ImagePullBackOff")
    );
    assert_eq!(pulls(&rt), before, "pulled again inside the backoff");
    // A pullable image runs.
    rt.add_registry_image("pullable:1");
    let (sink, mut t) = task_on(
        &rt,
        pod(
            "pull",
            json!({"containers": [{"name": "c", "image": "pullable:1", "imagePullPolicy": "Always"}]}),
        ),
    );
    step(&mut t).await;
    assert_eq!(phase(&sink.last()), "Running");
}

#[tokio::test]
async fn a_new_task_adopts_what_runs() {
    let p = pod("adopt", json!({"containers": [c("c")]}));
    let (rt, _, mut t) = setup(p.clone());
    step(&mut t).await;
    rt.exit_container(&containers(&rt).await["c"].0, 1);
    step(&mut t).await;
    let running = containers(&rt).await["c"].clone();
    drop(t);
    let calls = rt.calls().len();
    let (sink, mut t2) = task_on(&rt, p);
    step(&mut t2).await;
    step(&mut t2).await;
    let mutating: Vec<_> = rt.calls()[calls..]
        .iter()
        .filter(|c| !c.starts_with("List") && !c.ends_with("Status"))
        .cloned()
        .collect();
    assert_eq!(mutating, Vec::<String>::new());
    let s = sink.last();
    assert_eq!(restart_count(&s, "c"), 1);
    let id = s.container_statuses.as_ref().unwrap()[0]
        .container_id
        .clone()
        .unwrap();
    assert_eq!(id, format!("containerd://{}", running.0));
}

#[tokio::test]
async fn bad_spec_reports_create_container_config_error() {
    let (rt, sink, mut t) = setup(pod("bad", json!({"containers": [c("x"), c("x")]})));
    step(&mut t).await;
    step(&mut t).await;
    assert!(rt.calls().is_empty(), "{:?}", rt.calls());
    let s = sink.last();
    assert_eq!(
        waiting_reason(&s, "x").as_deref(),
        Some("CreateContainerConfigError")
    );
    assert_eq!(
        sink.statuses.lock().unwrap().len(),
        1,
        "republished unchanged"
    );
}

#[tokio::test]
async fn standalone_reports_config_map_volumes_as_unsupported() {
    let (rt, sink, mut t) = setup(pod(
        "cm",
        json!({"volumes": [{"name": "v", "configMap": {"name": "m"}}],
               "containers": [{"name": "c", "image": IMAGE,
                   "volumeMounts": [{"name": "v", "mountPath": "/v"}]}]}),
    ));
    step(&mut t).await;
    assert_eq!(creates(&rt), 0);
    let s = sink.last();
    assert_eq!(
        waiting_reason(&s, "c").as_deref(),
        Some("CreateContainerConfigError")
    );
}

#[tokio::test]
async fn liveness_failure_kills_then_restarts() {
    let (rt, sink, mut t) = setup(pod(
        "live",
        json!({"containers": [{"name": "c", "image": IMAGE,
            "livenessProbe": {"exec": {"command": ["false"]}, "failureThreshold": 1}}]}),
    ));
    rt.on_exec(|_, cmd| ExecResult {
        exit_code: i32::from(cmd[0] == "false"),
        ..Default::default()
    });
    step(&mut t).await;
    let first = containers(&rt).await["c"].clone();
    // The probe ran on that sync and killed the container.
    assert!(rt.calls().contains(&"ExecSync".to_owned()));
    assert_eq!(
        rt.container_status(&first.0).await.unwrap().state,
        ContainerState::Exited
    );
    step(&mut t).await;
    assert_eq!(creates(&rt), 2);
    assert_eq!(restart_count(&sink.last(), "c"), 1);
}

#[tokio::test]
async fn termination_runs_pre_stop_and_removes_the_sandbox() {
    let (rt, sink, mut t) = setup(pod(
        "term",
        json!({"containers": [{"name": "c", "image": IMAGE,
            "lifecycle": {"preStop": {"exec": {"command": ["cleanup"]}}}}]}),
    ));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    rt.on_exec(move |_, cmd| {
        s2.lock().unwrap().push(cmd.to_vec());
        ExecResult::default()
    });
    step(&mut t).await;
    let (_tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    t.terminating(Duration::from_secs(5), &mut rx).await;
    assert_eq!(*seen.lock().unwrap(), [vec!["cleanup".to_owned()]]);
    let calls = rt.calls();
    let pos = |c: &str| calls.iter().position(|x| x == c).unwrap();
    assert!(pos("ExecSync") < pos("StopContainer"));
    assert!(pos("StopContainer") < pos("StopPodSandbox"));
    assert!(pos("StopPodSandbox") < pos("RemovePodSandbox"));
    assert_eq!(*sink.terminated.lock().unwrap(), ["term"]);
    assert!(containers(&rt).await.is_empty());
}

#[tokio::test]
async fn a_changed_static_pod_is_killed_before_its_successor_starts() {
    use crate::flow::{PodEvent, PodSource};
    let rt = Arc::new(FakeRuntime::new());
    rt.add_image(IMAGE);
    let sink = Arc::new(Sink::default());
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut cfg = config();
    cfg.relist_period = Duration::from_millis(50);
    let worker = super::Worker::spawn(rt.clone(), cfg, sink, rx);
    let view = worker.view();
    let source = PodSource::File("/etc/kubernetes/manifests/p.yaml".into());
    let running = |uid: &'static str| {
        let view = view.clone();
        async move {
            for _ in 0..200 {
                let ok = view.pods().iter().any(|p| {
                    p.metadata.uid.as_deref() == Some(uid)
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                });
                if ok {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("{uid} never ran");
        }
    };
    let upsert = |uid: &str| PodEvent::Upsert {
        pod: Box::new(pod(uid, json!({"containers": [c("c")]}))),
        source: source.clone(),
    };
    tx.send(upsert("old")).await.unwrap();
    running("old").await;
    tx.send(PodEvent::Remove {
        uid: "old".into(),
        grace: None,
    })
    .await
    .unwrap();
    tx.send(upsert("new")).await.unwrap();
    running("new").await;
    let calls = rt.calls();
    let runs: Vec<usize> = (0..calls.len())
        .filter(|&i| calls[i] == "RunPodSandbox")
        .collect();
    let removed = calls.iter().position(|c| c == "RemovePodSandbox").unwrap();
    assert_eq!(runs.len(), 2, "{calls:?}");
    assert!(runs[0] < removed && removed < runs[1], "{calls:?}");
    assert_eq!(view.pods().len(), 1);
}

#[tokio::test]
async fn orphans_of_unknown_pods_are_reaped_known_ones_kept() {
    use crate::flow::{PodEvent, PodSource};
    let rt = Arc::new(FakeRuntime::new());
    rt.add_image(IMAGE);
    // What a previous kubelet left: one pod still wanted, one not.
    for uid in ["kept", "orphan"] {
        let (_, mut t) = task_on(&rt, pod(uid, json!({"containers": [c("c")]})));
        step(&mut t).await;
    }
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let worker = super::Worker::spawn(rt.clone(), config(), Arc::new(Sink::default()), rx);
    tx.send(PodEvent::Upsert {
        pod: Box::new(pod("kept", json!({"containers": [c("c")]}))),
        source: PodSource::Api,
    })
    .await
    .unwrap();
    // Events before control: the manager has seen the pod by now.
    tokio::time::sleep(Duration::from_millis(50)).await;
    worker.reap_orphans();
    let uids = || async {
        let sbs = rt.list_pod_sandboxes(&Default::default()).await.unwrap();
        sbs.into_iter().map(|s| s.uid).collect::<Vec<_>>()
    };
    for _ in 0..100 {
        if uids().await == ["kept"] {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("sandboxes left: {:?}", uids().await);
}

#[tokio::test]
async fn a_pod_the_api_shows_finished_is_not_run_again() {
    let mut p = pod(
        "done",
        json!({"restartPolicy": "Never", "containers": [c("c")]}),
    );
    p.status = Some(PodStatus {
        phase: Some("Succeeded".into()),
        ..Default::default()
    });
    let (rt, sink, mut t) = setup(p);
    step(&mut t).await;
    assert_eq!(
        rt.calls().iter().filter(|c| *c == "RunPodSandbox").count(),
        0
    );
    assert_eq!(phase(&sink.last()), "Succeeded");
}

#[tokio::test]
async fn a_dead_sandbox_is_replaced_and_its_containers_restarted() {
    let (rt, sink, mut t) = setup(pod("sb", json!({"containers": [c("c")]})));
    step(&mut t).await;
    let sbs = rt.list_pod_sandboxes(&Default::default()).await.unwrap();
    rt.stop_pod_sandbox(&sbs[0].id).await.unwrap();
    step(&mut t).await;
    let mut sbs = rt.list_pod_sandboxes(&Default::default()).await.unwrap();
    sbs.sort_by_key(|s| s.attempt);
    assert_eq!(sbs.iter().map(|s| s.attempt).collect::<Vec<_>>(), [0, 1]);
    let cs = containers(&rt).await;
    assert_eq!(cs["c"].1, ContainerState::Running);
    let s = sink.last();
    assert_eq!(phase(&s), "Running");
    assert_eq!(restart_count(&s, "c"), 1);
}

/// Issue 12 item 3: `runAsNonRoot` is checked against the image's user
/// before anything is created for the container; a non-zero image uid
/// passes and is what the container runs as.
#[tokio::test]
async fn run_as_non_root_is_checked_against_the_image_user() {
    let non_root = json!({"securityContext": {"runAsNonRoot": true}, "containers": [c("c")]});
    let (rt, sink, mut t) = setup(pod("root-image", non_root.clone()));
    step(&mut t).await;
    step(&mut t).await;
    assert_eq!(creates(&rt), 0);
    let s = sink.last();
    assert_eq!(
        waiting_reason(&s, "c").as_deref(),
        Some("CreateContainerConfigError")
    );
    let message = s.container_statuses.as_ref().unwrap()[0]
        .state
        .as_ref()
        .and_then(|st| st.waiting.as_ref())
        .and_then(|w| w.message.clone())
        .unwrap();
    assert_eq!(
        message,
        "container has runAsNonRoot and image will run as root (pod: \"p_ns(root-image)\", container: c)"
    );

    let rt = Arc::new(FakeRuntime::new());
    rt.add_image(IMAGE);
    rt.set_image_user(IMAGE, Some(1000), "");
    let (sink, mut t) = task_on(&rt, pod("uid-image", non_root));
    step(&mut t).await;
    step(&mut t).await;
    assert_eq!(creates(&rt), 1, "{:?}", sink.last());
}

mod structure;
