use std::collections::BTreeMap;

use k8s_openapi::{api::core::v1 as api, jiff::Timestamp};

use super::*;
use crate::pod::{RestartPolicy, test_pod};

fn ts(secs: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + secs).unwrap()
}

fn running(id: &str, at: i64) -> RuntimeContainer {
    RuntimeContainer {
        id: id.into(),
        image_ref: "docker.io/library/busybox@sha256:abc".into(),
        state: RuntimeState::Running { started_at: ts(at) },
    }
}

fn exited(id: &str, code: i32) -> Terminated {
    Terminated {
        exit_code: code,
        signal: None,
        reason: None,
        message: None,
        started_at: Some(ts(1)),
        finished_at: Some(ts(2)),
        container_id: Some(id.into()),
    }
}

fn view(latest: Option<RuntimeContainer>, ready: bool) -> ContainerView {
    ContainerView {
        latest,
        ready,
        started: true,
        ..Default::default()
    }
}

fn status_of(
    spec: &PodSpec,
    views: &BTreeMap<String, ContainerView>,
    previous: Option<&api::PodStatus>,
    now: i64,
) -> api::PodStatus {
    pod_status(&PodView {
        spec,
        containers: views,
        sandbox_ready: true,
        pod_ips: vec!["10.1.0.5".parse().unwrap()],
        host_ips: vec!["192.168.1.2".parse().unwrap()],
        start_time: Some(ts(0)),
        terminal: false,
        previous,
        now: ts(now),
    })
}

fn condition<'a>(s: &'a api::PodStatus, t: &str) -> &'a api::PodCondition {
    s.conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == t)
        .unwrap()
}

#[test]
fn running_pod() {
    let spec = test_pod(&[], &["web"], RestartPolicy::Always);
    let views = BTreeMap::from([("web".to_owned(), view(Some(running("c1", 5)), true))]);
    let s = status_of(&spec, &views, None, 10);
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(s.pod_ip.as_deref(), Some("10.1.0.5"));
    assert_eq!(s.pod_ips.as_ref().unwrap()[0].ip, "10.1.0.5");
    assert_eq!(s.host_ip.as_deref(), Some("192.168.1.2"));
    assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
    assert!(s.init_container_statuses.is_none());
    let c = &s.container_statuses.as_ref().unwrap()[0];
    assert_eq!(c.name, "web");
    assert_eq!(c.image, "busybox:1.36");
    assert_eq!(c.image_id, "docker.io/library/busybox@sha256:abc");
    assert_eq!(c.container_id.as_deref(), Some("containerd://c1"));
    assert!(c.ready);
    assert_eq!(c.started, Some(true));
    assert_eq!(
        c.state
            .as_ref()
            .unwrap()
            .running
            .as_ref()
            .unwrap()
            .started_at,
        Some(Time(ts(5)))
    );
    for t in [
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "Ready",
        "PodScheduled",
    ] {
        let c = condition(&s, t);
        assert_eq!(c.status, "True", "{t}");
        assert_eq!(c.last_transition_time, Some(Time(ts(10))));
    }
}

#[test]
fn transition_times_are_kept_until_the_status_changes() {
    let spec = test_pod(&[], &["web"], RestartPolicy::Always);
    let mut views = BTreeMap::from([("web".to_owned(), view(Some(running("c1", 5)), false))]);
    let s1 = status_of(&spec, &views, None, 10);
    assert_eq!(condition(&s1, "Ready").status, "False");
    assert_eq!(
        condition(&s1, "Ready").reason.as_deref(),
        Some("ContainersNotReady")
    );
    assert_eq!(
        condition(&s1, "Ready").message.as_deref(),
        Some("containers with unready status: [web]")
    );
    let s2 = status_of(&spec, &views, Some(&s1), 20);
    assert_eq!(
        condition(&s2, "Ready").last_transition_time,
        Some(Time(ts(10)))
    );
    views.get_mut("web").unwrap().ready = true;
    let s3 = status_of(&spec, &views, Some(&s2), 30);
    assert_eq!(condition(&s3, "Ready").status, "True");
    assert_eq!(
        condition(&s3, "Ready").last_transition_time,
        Some(Time(ts(30)))
    );
    assert_eq!(
        condition(&s3, "PodScheduled").last_transition_time,
        Some(Time(ts(10)))
    );
}

#[test]
fn crash_loop_shows_waiting_with_last_state() {
    let spec = test_pod(&[], &["web"], RestartPolicy::Always);
    let mut v = view(
        Some(RuntimeContainer {
            id: "c2".into(),
            image_ref: "img".into(),
            state: RuntimeState::Exited(exited("c2", 137)),
        }),
        true,
    );
    v.restart_count = 3;
    v.waiting = Some(Waiting {
        reason: WaitingReason::CrashLoopBackOff,
        message: Some("back-off 40s restarting failed container=web pod=ns/p".into()),
    });
    let views = BTreeMap::from([("web".to_owned(), v)]);
    let s = status_of(&spec, &views, None, 10);
    let c = &s.container_statuses.as_ref().unwrap()[0];
    assert_eq!(c.restart_count, 3);
    assert!(!c.ready, "ready only while running");
    assert_eq!(c.started, Some(false));
    let w = c.state.as_ref().unwrap().waiting.as_ref().unwrap();
    assert_eq!(w.reason.as_deref(), Some("CrashLoopBackOff"));
    let last = c.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(
        (last.exit_code, last.reason.as_deref()),
        (137, Some("Error"))
    );
    assert_eq!(last.container_id.as_deref(), Some("containerd://c2"));
    assert_eq!(last.finished_at, Some(Time(ts(2))));
    assert_eq!(
        s.phase.as_deref(),
        Some("Running"),
        "restarting under Always"
    );
}

#[test]
fn restarted_container_keeps_the_previous_exit_as_last_state() {
    let spec = test_pod(&[], &["web"], RestartPolicy::Always);
    let mut v = view(Some(running("c3", 50)), true);
    v.previous = Some(exited("c2", 1));
    v.restart_count = 1;
    let s = status_of(&spec, &BTreeMap::from([("web".to_owned(), v)]), None, 60);
    let c = &s.container_statuses.as_ref().unwrap()[0];
    assert!(c.state.as_ref().unwrap().running.is_some());
    assert_eq!(
        c.last_state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .exit_code,
        1
    );
}

#[test]
fn finished_pods() {
    let spec = test_pod(&[], &["job"], RestartPolicy::Never);
    let done = |code| {
        BTreeMap::from([(
            "job".to_owned(),
            view(
                Some(RuntimeContainer {
                    id: "c".into(),
                    image_ref: "img".into(),
                    state: RuntimeState::Exited(exited("c", code)),
                }),
                false,
            ),
        )])
    };
    let ok = status_of(&spec, &done(0), None, 5);
    assert_eq!(ok.phase.as_deref(), Some("Succeeded"));
    let t = ok.container_statuses.as_ref().unwrap()[0]
        .state
        .as_ref()
        .unwrap()
        .terminated
        .clone()
        .unwrap();
    assert_eq!(t.reason.as_deref(), Some("Completed"));
    assert_eq!(
        condition(&ok, "Ready").reason.as_deref(),
        Some("PodCompleted")
    );
    let failed = status_of(&spec, &done(2), None, 5);
    assert_eq!(failed.phase.as_deref(), Some("Failed"));
    assert_eq!(
        condition(&failed, "ContainersReady").reason.as_deref(),
        Some("PodFailed")
    );
    // A terminal phase never goes back, whatever comes next.
    let later = status_of(&spec, &BTreeMap::new(), Some(&failed), 9);
    assert_eq!(later.phase.as_deref(), Some("Failed"));
}

#[test]
fn initializing_pod() {
    let spec = test_pod(&["init"], &["app"], RestartPolicy::Always);
    let views = BTreeMap::from([("init".to_owned(), view(Some(running("i1", 1)), false))]);
    let s = status_of(&spec, &views, None, 5);
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let init = condition(&s, "Initialized");
    assert_eq!(init.status, "False");
    assert_eq!(init.reason.as_deref(), Some("ContainersNotInitialized"));
    assert_eq!(
        init.message.as_deref(),
        Some("containers with incomplete status: [init]")
    );
    let app = &s.container_statuses.as_ref().unwrap()[0];
    let w = app.state.as_ref().unwrap().waiting.as_ref().unwrap();
    assert_eq!(w.reason.as_deref(), Some("PodInitializing"));
    assert_eq!(
        condition(&s, "ContainersReady").message.as_deref(),
        Some("containers with unknown status: [app]")
    );
    assert_eq!(s.init_container_statuses.as_ref().unwrap().len(), 1);

    let done = RuntimeContainer {
        id: "i1".into(),
        image_ref: "img".into(),
        state: RuntimeState::Exited(exited("i1", 0)),
    };
    let views = BTreeMap::from([
        ("init".to_owned(), view(Some(done), false)),
        ("app".to_owned(), view(Some(running("a1", 3)), true)),
    ]);
    let s = status_of(&spec, &views, None, 5);
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(condition(&s, "Initialized").status, "True");
    assert_eq!(condition(&s, "Ready").status, "True");
}

#[test]
fn waiting_reasons_and_sandbox() {
    let spec = test_pod(&[], &["web"], RestartPolicy::Always);
    let v = ContainerView {
        waiting: Some(Waiting {
            reason: WaitingReason::ImagePullBackOff,
            message: Some("Back-off pulling image \"x\"".into()),
        }),
        ..Default::default()
    };
    let views = BTreeMap::from([("web".to_owned(), v)]);
    let s = pod_status(&PodView {
        spec: &spec,
        containers: &views,
        sandbox_ready: false,
        pod_ips: vec![],
        host_ips: vec![],
        start_time: None,
        terminal: false,
        previous: None,
        now: ts(0),
    });
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    assert!(s.pod_ip.is_none() && s.pod_ips.is_none());
    assert_eq!(condition(&s, "PodReadyToStartContainers").status, "False");
    let c = &s.container_statuses.as_ref().unwrap()[0];
    assert_eq!(c.container_id, None);
    assert_eq!(
        c.state
            .as_ref()
            .unwrap()
            .waiting
            .as_ref()
            .unwrap()
            .reason
            .as_deref(),
        Some("ImagePullBackOff")
    );
}

#[test]
fn runtime_states_map_to_run_states() {
    use crate::pod::restart::RunState;
    assert_eq!(RuntimeState::Created.run_state(), RunState::Created);
    assert_eq!(
        RuntimeState::Running { started_at: ts(0) }.run_state(),
        RunState::Running
    );
    assert_eq!(
        RuntimeState::Exited(exited("c", 3)).run_state(),
        RunState::Exited { exit_code: 3 }
    );
}

#[test]
fn invalid_pods_report_create_container_config_error() {
    let pod = api::Pod {
        spec: Some(api::PodSpec {
            containers: vec![api::Container {
                name: "a".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let err = PodSpec::from_api(&pod).unwrap_err();
    let s = invalid_pod_status(&pod, &err, ts(0));
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let w = s.container_statuses.as_ref().unwrap()[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(w.reason.as_deref(), Some("CreateContainerConfigError"));
    assert!(
        w.message
            .unwrap()
            .contains("spec.containers[0].image: is required")
    );
}
