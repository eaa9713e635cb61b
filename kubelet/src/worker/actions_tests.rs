//! `compute_pod_actions` as a table: a pod, what the runtime shows, and what
//! the sync must do.
use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant, SystemTime},
};

use super::*;
use crate::{
    cri::{ContainerStatus, Labels, SandboxInfo, SandboxState, SandboxStatus},
    pod::test_pod,
    worker::{RESTART_COUNT_ANNOTATION, snapshot::Instance},
};
use RestartPolicy::*;

/// `secs` after a fixed start, as the runtime's wall clock.
fn at(secs: u64) -> SystemTime {
    SystemTime::now() - Duration::from_secs(3600) + Duration::from_secs(secs)
}

#[derive(Default)]
struct Runtime(Snapshot);

impl Runtime {
    /// A sandbox created at `t`; the newest Ready one is the pod's.
    fn sandbox(mut self, id: &str, ready: bool, attempt: u32, t: u64) -> Self {
        let state = if ready {
            SandboxState::Ready
        } else {
            SandboxState::NotReady
        };
        self.0.sandboxes.push(SandboxInfo {
            id: id.into(),
            name: "p".into(),
            namespace: "ns".into(),
            uid: "uid-1".into(),
            attempt,
            state,
            created_at: at(t),
            labels: Labels::new(),
            annotations: Labels::new(),
        });
        self.0
            .sandboxes
            .sort_by_key(|s| std::cmp::Reverse(s.created_at));
        self.0.ready = self
            .0
            .sandboxes
            .iter()
            .find(|s| s.state == SandboxState::Ready)
            .map(|s| SandboxStatus {
                id: s.id.clone(),
                name: s.name.clone(),
                namespace: s.namespace.clone(),
                uid: s.uid.clone(),
                attempt: s.attempt,
                state: s.state,
                ip: Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))),
                additional_ips: vec![],
                created_at: s.created_at,
                labels: Labels::new(),
                annotations: Labels::new(),
            });
        self
    }

    /// An instance of `name` in `sandbox`, created at `t`; `exit` is its
    /// exit code once it exited (at `t + 1`), `None` while it runs.
    fn container(mut self, name: &str, sandbox: &str, t: u64, exit: Option<i32>) -> Self {
        let n = self.0.containers.get(name).map_or(0, Vec::len);
        let (state, finished) = match exit {
            Some(_) => (ContainerState::Exited, Some(at(t + 1))),
            None => (ContainerState::Running, None),
        };
        let inst = Instance {
            sandbox_id: sandbox.into(),
            status: ContainerStatus {
                id: format!("{name}-{n}"),
                name: name.into(),
                attempt: 0,
                state,
                created_at: at(t),
                started_at: Some(at(t)),
                finished_at: finished,
                exit_code: exit.unwrap_or(0),
                reason: String::new(),
                message: String::new(),
                image: String::new(),
                image_ref: String::new(),
                labels: Labels::new(),
                annotations: Labels::from([(RESTART_COUNT_ANNOTATION.into(), n.to_string())]),
                log_path: None,
            },
        };
        let v = self.0.containers.entry(name.into()).or_default();
        v.insert(0, inst);
        self
    }
}

fn start(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

/// What the actions must be, summarised; unset parts are empty.
#[derive(Default)]
struct Expect {
    stop_sandbox: bool,
    kill: &'static [&'static str],
    create: Option<u32>,
    start: &'static [&'static str],
    back_off: &'static [&'static str],
}

fn summary(a: &PodActions) -> (bool, Vec<String>, Option<u32>, Vec<String>, Vec<String>) {
    (
        a.stop_sandbox.is_some(),
        a.kill.clone(),
        a.create_sandbox,
        a.start.iter().map(|s| s.name.clone()).collect(),
        a.back_off.iter().map(|b| b.name.clone()).collect(),
    )
}

type Pod = (&'static [&'static str], RestartPolicy);

/// Both init containers and the app ran in `s1`, whose pause process died;
/// `s2` replaced it.
fn recreated() -> Runtime {
    Runtime::default()
        .sandbox("s1", false, 0, 0)
        .container("i1", "s1", 1, Some(0))
        .container("i2", "s1", 2, Some(0))
        .container("a", "s1", 3, Some(137))
        .sandbox("s2", true, 1, 10)
}

#[test]
fn actions_by_runtime_state() {
    let cases: Vec<(&str, Pod, Runtime, Expect)> = vec![
        (
            "a new pod gets a sandbox first",
            (&[], Always),
            Runtime::default(),
            Expect {
                create: Some(0),
                ..Expect::default()
            },
        ),
        (
            "then its containers, all at once",
            (&[], Always),
            Runtime::default().sandbox("s1", true, 0, 0),
            Expect {
                start: &["a", "b"],
                ..Expect::default()
            },
        ),
        (
            "init containers one at a time, before the app",
            (&["i1", "i2"], Always),
            Runtime::default()
                .sandbox("s1", true, 0, 0)
                .container("i1", "s1", 1, Some(0)),
            Expect {
                start: &["i2"],
                ..Expect::default()
            },
        ),
        (
            "a running init container is waited for",
            (&["i1"], Always),
            Runtime::default()
                .sandbox("s1", true, 0, 0)
                .container("i1", "s1", 1, None),
            Expect::default(),
        ),
        (
            "a dead sandbox: its running containers are killed, a new one made",
            (&[], Always),
            Runtime::default()
                .sandbox("s1", false, 0, 0)
                .container("a", "s1", 1, None)
                .container("b", "s1", 1, None),
            Expect {
                kill: &["a-0", "b-0"],
                create: Some(1),
                ..Expect::default()
            },
        ),
        (
            "restartPolicy Never gets no second sandbox",
            (&[], Never),
            Runtime::default()
                .sandbox("s1", false, 0, 0)
                .container("a", "s1", 1, None)
                .container("b", "s1", 1, Some(0)),
            Expect {
                kill: &["a-0"],
                ..Expect::default()
            },
        ),
        (
            "init containers run again in a recreated sandbox",
            (&["i1", "i2"], Always),
            recreated(),
            Expect {
                start: &["i1"],
                ..Expect::default()
            },
        ),
        (
            "... and the app waits for the second one",
            (&["i1", "i2"], Always),
            recreated().container("i1", "s2", 11, Some(0)),
            Expect {
                start: &["i2"],
                ..Expect::default()
            },
        ),
        (
            "a container left running in an old sandbox is killed first",
            (&[], Always),
            Runtime::default()
                .sandbox("s1", false, 0, 0)
                .container("a", "s1", 1, None)
                .sandbox("s2", true, 1, 10),
            Expect {
                kill: &["a-0"],
                ..Expect::default()
            },
        ),
        (
            "OnFailure: a success stays done, a failure restarts",
            (&[], OnFailure),
            Runtime::default()
                .sandbox("s1", true, 0, 0)
                .container("a", "s1", 1, Some(0))
                .container("b", "s1", 1, Some(1)),
            Expect {
                start: &["b"],
                ..Expect::default()
            },
        ),
        (
            "every container done under Never: the sandbox stops",
            (&[], Never),
            Runtime::default()
                .sandbox("s1", true, 0, 0)
                .container("a", "s1", 1, Some(0))
                .container("b", "s1", 1, Some(2)),
            Expect {
                stop_sandbox: true,
                ..Expect::default()
            },
        ),
        (
            "a failed init container under Never fails the pod",
            (&["i1"], Never),
            Runtime::default()
                .sandbox("s1", true, 0, 0)
                .container("i1", "s1", 1, Some(1)),
            Expect {
                stop_sandbox: true,
                ..Expect::default()
            },
        ),
    ];
    let crash = CrashLoopBackoff::default();
    for (what, (init, policy), runtime, want) in cases {
        let spec = test_pod(init, &["a", "b"], policy);
        let got = compute_pod_actions(&spec, &runtime.0, false, &crash, Instant::now());
        let want = (
            want.stop_sandbox,
            start(want.kill),
            want.create,
            start(want.start),
            start(want.back_off),
        );
        assert_eq!(summary(&got), want, "{what}");
    }
}

#[test]
fn restarts_wait_out_their_backoff() {
    let spec = test_pod(&[], &["a", "b"], Always);
    // `a` failed a second ago.
    let snap = Runtime::default()
        .sandbox("s1", true, 0, 0)
        .container("a", "s1", 3598, Some(1))
        .container("b", "s1", 1, None)
        .0;
    let mut crash = CrashLoopBackoff::default();
    let now = Instant::now();
    let a = compute_pod_actions(&spec, &snap, false, &crash, now);
    assert_eq!(start(&["a"]), summary(&a).3);
    // Deciding records nothing; carrying the restart out does.
    let replaced = a.start[0].replaces.expect("a restart");
    crash.restarted("uid-1", "a", replaced, now);
    let a = compute_pod_actions(&spec, &snap, false, &crash, now);
    assert!(a.start.is_empty());
    assert_eq!(a.back_off.len(), 1);
    assert_eq!(a.back_off[0].name, "a");
    assert!(
        a.back_off[0]
            .message
            .starts_with("back-off 10s restarting failed container=a")
    );
    assert!(a.back_off[0].remaining <= Duration::from_secs(10));
    assert!(a.is_empty());
}

#[test]
fn a_pod_the_api_shows_finished_only_stops() {
    let spec = test_pod(&[], &["a"], Always);
    let snap = Runtime::default().sandbox("s1", true, 0, 0).0;
    let a = compute_pod_actions(
        &spec,
        &snap,
        true,
        &CrashLoopBackoff::default(),
        Instant::now(),
    );
    assert_eq!(a.stop_sandbox.as_deref(), Some("s1"));
    assert!(a.start.is_empty());
    let a = compute_pod_actions(
        &spec,
        &Snapshot::default(),
        true,
        &CrashLoopBackoff::default(),
        Instant::now(),
    );
    assert!(a.is_empty(), "nothing to stop, nothing created");
}
