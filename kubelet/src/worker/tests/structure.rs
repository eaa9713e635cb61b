//! The worker's structure as the kubelet has it: one node-wide PLEG, init
//! containers rerun in a recreated sandbox, and termination as a state that
//! a shorter grace period cuts short. Tokio's clock is paused: the fake
//! runtime answers at once, so virtual time is what the worker waits.
use std::time::Duration;

use tokio::{sync::mpsc, time::Instant};

use super::*;
use crate::{
    cri::SandboxFilter,
    flow::{PodEvent, PodSource, PodsView},
    worker::{PodMsg, Worker},
};

/// The pod's phase in the view, when it has one.
fn view_phase(view: &dyn PodsView, uid: &str) -> Option<String> {
    view.pods()
        .into_iter()
        .find(|p| p.metadata.uid.as_deref() == Some(uid))
        .and_then(|p| p.status?.phase)
}

async fn eventually(what: &str, mut ok: impl FnMut() -> bool) {
    for _ in 0..600 {
        if ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never: {what}");
}

#[tokio::test(start_paused = true)]
async fn an_idle_node_costs_one_relist_a_period_and_changes_still_arrive() {
    let rt = Arc::new(FakeRuntime::new());
    rt.add_image(IMAGE);
    let (tx, rx) = mpsc::channel(8);
    let worker = Worker::spawn(rt.clone(), config(), Arc::new(Sink::default()), rx);
    let view = worker.view();
    let uids = ["p1", "p2", "p3"];
    for uid in uids {
        let pod = pod(uid, json!({"containers": [c("a"), c("b")]}));
        let ev = PodEvent::Upsert {
            pod: Box::new(pod),
            source: PodSource::Api,
        };
        tx.send(ev).await.unwrap();
    }
    eventually("every pod Running", || {
        uids.iter()
            .all(|u| view_phase(&*view, u).as_deref() == Some("Running"))
    })
    .await;
    // Settled: a relist of the whole node each second, and nothing else
    // (no probes, no backoff; the resync is a minute away).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = rt.calls().len();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle = rt.calls()[before..].to_vec();
    let relists = idle.iter().filter(|c| *c == "ListPodSandbox").count();
    assert!((9..=11).contains(&relists), "{relists} relists in 10 s");
    assert!(
        idle.iter()
            .all(|c| c == "ListPodSandbox" || c == "ListContainers"),
        "an idle node only relists: {idle:?}"
    );

    // One container exits: the PLEG reports it, and only its pod syncs.
    let all = rt.list_containers(&Default::default()).await.unwrap();
    let a1 = all
        .iter()
        .find(|c| {
            c.labels
                .get(super::super::POD_UID_LABEL)
                .map(String::as_str)
                == Some("p1")
                && c.name == "a"
        })
        .unwrap();
    rt.exit_container(&a1.id, 1);
    let before = rt.calls().len();
    let exited = Instant::now();
    eventually("a restarted", || {
        rt.calls()[before..].iter().any(|c| c == "StartContainer")
    })
    .await;
    assert!(
        exited.elapsed() <= Duration::from_millis(1100),
        "{:?}",
        exited.elapsed()
    );
    let creates = rt.calls()[before..]
        .iter()
        .filter(|c| *c == "CreateContainer")
        .count();
    assert_eq!(creates, 1);
    drop(worker);
}

#[tokio::test]
async fn init_containers_run_again_in_a_recreated_sandbox() {
    let (rt, sink, mut t) = setup(pod(
        "reinit",
        json!({"initContainers": [c("i1"), c("i2")], "containers": [c("app")]}),
    ));
    for name in ["i1", "i2"] {
        step(&mut t).await;
        rt.exit_container(&containers(&rt).await[name].0, 0);
    }
    step(&mut t).await;
    assert_eq!(containers(&rt).await["app"].1, ContainerState::Running);
    assert_eq!(creates(&rt), 3);

    // The pause process dies: the app is killed, a new sandbox made, and
    // both init containers run in it, one after the other, before the app.
    let sbs = rt
        .list_pod_sandboxes(&SandboxFilter::default())
        .await
        .unwrap();
    rt.stop_pod_sandbox(&sbs[0].id).await.unwrap();
    step(&mut t).await;
    let cs = containers(&rt).await;
    assert_eq!(cs["i1"].1, ContainerState::Running, "{cs:?}");
    assert_eq!(cs["app"].1, ContainerState::Exited);
    assert_eq!(phase(&sink.last()), "Pending");
    rt.exit_container(&cs["i1"].0, 0);
    step(&mut t).await;
    let cs = containers(&rt).await;
    assert_eq!(cs["i2"].1, ContainerState::Running);
    assert_eq!(cs["app"].1, ContainerState::Exited);
    rt.exit_container(&cs["i2"].0, 0);
    step(&mut t).await;
    assert_eq!(containers(&rt).await["app"].1, ContainerState::Running);
    assert_eq!(creates(&rt), 6);
    assert_eq!(restart_count(&sink.last(), "app"), 1);
}

/// A pod with a container that ignores SIGTERM, Running under `run`.
async fn stubborn_pod(
    uid: &str,
) -> (
    Arc<FakeRuntime>,
    Arc<Sink>,
    mpsc::UnboundedSender<PodMsg>,
    tokio::task::JoinHandle<()>,
) {
    let p = pod(
        uid,
        json!({"terminationGracePeriodSeconds": 30, "containers": [c("c")]}),
    );
    let (rt, sink, t) = setup(p);
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(t.run(rx));
    let rt2 = rt.clone();
    let mut id = None;
    for _ in 0..100 {
        if let Some((cid, ContainerState::Running)) = containers(&rt2).await.get("c").cloned() {
            id = Some(cid);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    rt.ignore_sigterm(&id.expect("the container runs"));
    (rt, sink, tx, task)
}

fn deleted(uid: &str, grace: i64) -> Box<Pod> {
    let mut p = pod(
        uid,
        json!({"terminationGracePeriodSeconds": 30, "containers": [c("c")]}),
    );
    p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    p.metadata.deletion_grace_period_seconds = Some(grace);
    Box::new(p)
}

#[tokio::test(start_paused = true)]
async fn a_shorter_grace_period_cuts_a_termination_short() {
    // The full grace period, for comparison.
    let (_, sink, tx, task) = stubborn_pod("full").await;
    let started = Instant::now();
    tx.send(PodMsg::Update(deleted("full", 30))).unwrap();
    task.await.unwrap();
    assert_eq!(started.elapsed().as_secs(), 30);
    assert_eq!(*sink.terminated.lock().unwrap(), ["full"]);

    // A second delete with --grace-period=5 after 1 s: done 5 s later.
    let (_, sink, tx, task) = stubborn_pod("shorter").await;
    let started = Instant::now();
    tx.send(PodMsg::Update(deleted("shorter", 30))).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    tx.send(PodMsg::Update(deleted("shorter", 5))).unwrap();
    task.await.unwrap();
    assert_eq!(started.elapsed().as_secs(), 6);
    assert_eq!(*sink.terminated.lock().unwrap(), ["shorter"]);

    // A longer one changes nothing; a force delete (grace 0) gets the
    // kubelet's minimum of 2 s.
    let (rt, sink, tx, task) = stubborn_pod("forced").await;
    let started = Instant::now();
    tx.send(PodMsg::Update(deleted("forced", 30))).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    tx.send(PodMsg::Update(deleted("forced", 60))).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    tx.send(PodMsg::Remove {
        grace: Some(Duration::ZERO),
    })
    .unwrap();
    task.await.unwrap();
    assert_eq!(started.elapsed().as_secs(), 4);
    assert_eq!(*sink.terminated.lock().unwrap(), ["forced"]);
    let stops = rt.calls().iter().filter(|c| *c == "StopContainer").count();
    assert_eq!(stops, 2, "the stop is restarted once, for the force delete");
}

#[tokio::test(start_paused = true)]
async fn a_terminated_pod_is_not_started_again_by_its_own_final_delete() {
    let rt = Arc::new(FakeRuntime::new());
    rt.add_image(IMAGE);
    let sink = Arc::new(Sink::default());
    let (tx, rx) = mpsc::channel(8);
    let worker = Worker::spawn(rt.clone(), config(), sink.clone(), rx);
    let view = worker.view();
    let upsert = |p: Pod| PodEvent::Upsert {
        pod: Box::new(p),
        source: PodSource::Api,
    };
    let live = pod(
        "gone",
        json!({"terminationGracePeriodSeconds": 30, "containers": [c("c")]}),
    );
    tx.send(upsert(live)).await.unwrap();
    eventually("Running", || {
        view_phase(&*view, "gone").as_deref() == Some("Running")
    })
    .await;
    tx.send(upsert(*deleted("gone", 30))).await.unwrap();
    eventually("terminated", || sink.terminated.lock().unwrap().len() == 1).await;
    // The kubelet's final delete (grace 0) comes back as an update, then
    // as the removal.
    tokio::time::sleep(Duration::from_secs(2)).await;
    tx.send(upsert(*deleted("gone", 0))).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let sandboxes = rt.calls().iter().filter(|c| *c == "RunPodSandbox").count();
    assert_eq!(sandboxes, 1, "started once");
    assert_eq!(sink.terminated.lock().unwrap().len(), 1);
    assert!(view.pods().is_empty());
    tx.send(PodEvent::Remove {
        uid: "gone".into(),
        grace: Some(Duration::ZERO),
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(worker);
}

#[tokio::test]
async fn an_evicted_pod_stops_for_good_and_shows_why() {
    let (rt, sink, mut t) = setup(pod("ev", json!({"containers": [c("c")]})));
    step(&mut t).await;
    assert_eq!(phase(&sink.last()), "Running");
    let message = "The node was low on resource: ephemeral-storage. ";
    t.evict(crate::worker::Eviction {
        message: message.into(),
        grace: Duration::ZERO,
    })
    .await;
    for _ in 0..3 {
        step(&mut t).await;
    }
    assert!(
        rt.list_pod_sandboxes(&SandboxFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(creates(&rt), 1, "never started again");
    let s = sink.last();
    assert_eq!(phase(&s), "Failed");
    assert_eq!(s.reason.as_deref(), Some("Evicted"));
    assert_eq!(s.message.as_deref(), Some(message));
    let dt = s
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("DisruptionTarget");
    assert_eq!(dt.reason.as_deref(), Some("TerminationByKubelet"));
    assert_eq!(
        *sink.warnings.lock().unwrap(),
        [("Evicted".to_owned(), message.to_owned())]
    );
    assert!(
        sink.terminated.lock().unwrap().is_empty(),
        "the pod object stays"
    );
}
