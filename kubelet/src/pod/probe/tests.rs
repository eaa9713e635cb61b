use std::time::{Duration, Instant};

use super::*;
use crate::pod::{ProbeAction, RestartPolicy, test_pod};

const S: Duration = Duration::from_secs(1);

fn probe(initial_delay: u32, success: u32, failure: u32) -> Probe {
    Probe {
        action: ProbeAction::Exec {
            command: vec!["true".into()],
        },
        initial_delay: initial_delay * S,
        period: 10 * S,
        timeout: S,
        success_threshold: success,
        failure_threshold: failure,
    }
}

fn probes(
    liveness: Option<Probe>,
    readiness: Option<Probe>,
    startup: Option<Probe>,
) -> ContainerProbes {
    let mut c = test_pod(&[], &["c"], RestartPolicy::Always)
        .containers
        .remove(0);
    c.liveness = liveness;
    c.readiness = readiness;
    c.startup = startup;
    ContainerProbes::new(&c)
}

fn fail() -> ProbeOutcome {
    ProbeOutcome::Failure {
        message: "exit 1".into(),
    }
}

fn kinds(p: &ContainerProbes, now: Instant) -> Vec<ProbeKind> {
    p.due(now).into_iter().map(|(k, _)| k).collect()
}

#[test]
fn no_probes_ready_when_running() {
    let t0 = Instant::now();
    let mut p = probes(None, None, None);
    assert!(!p.ready() && !p.started());
    p.observe(Observed::Running {
        container_id: "a",
        started_at: t0,
    });
    assert!(p.ready() && p.started());
    assert!(p.due(t0).is_empty());
    assert_eq!(p.next_due(), None);
    p.observe(Observed::NotRunning);
    assert!(!p.ready() && !p.started());
}

#[test]
fn readiness_waits_for_initial_delay_and_first_success() {
    let t0 = Instant::now();
    let mut p = probes(None, Some(probe(5, 2, 3)), None);
    p.observe(Observed::Running {
        container_id: "a",
        started_at: t0,
    });
    assert!(!p.ready(), "not ready until the first success");
    assert!(p.due(t0 + 4 * S).is_empty());
    assert_eq!(p.next_due(), Some(t0 + 5 * S));
    assert_eq!(kinds(&p, t0 + 5 * S), [ProbeKind::Readiness]);
    assert_eq!(
        p.record(ProbeKind::Readiness, ProbeOutcome::Success, t0 + 5 * S),
        None
    );
    assert!(!p.ready(), "success threshold 2");
    assert!(p.due(t0 + 14 * S).is_empty(), "period 10");
    p.record(ProbeKind::Readiness, ProbeOutcome::Success, t0 + 15 * S);
    assert!(p.ready());
    // Unknown results are thrown away.
    p.record(
        ProbeKind::Readiness,
        ProbeOutcome::Unknown {
            message: "rpc".into(),
        },
        t0 + 25 * S,
    );
    assert!(p.ready());
    // Three failures in a row make it unready, and never restart anything.
    for i in 0..2 {
        assert_eq!(
            p.record(ProbeKind::Readiness, fail(), t0 + (35 + i * 10) * S),
            None
        );
        assert!(p.ready());
    }
    assert_eq!(p.record(ProbeKind::Readiness, fail(), t0 + 55 * S), None);
    assert!(!p.ready());
    assert_eq!(
        kinds(&p, t0 + 65 * S),
        [ProbeKind::Readiness],
        "keeps probing"
    );
}

#[test]
fn liveness_failure_restarts_and_holds_until_a_new_container() {
    let t0 = Instant::now();
    let mut p = probes(Some(probe(0, 1, 3)), None, None);
    p.observe(Observed::Running {
        container_id: "a",
        started_at: t0,
    });
    assert_eq!(
        p.result(ProbeKind::Liveness),
        Some(ProbeResult::Success),
        "alive until proven dead"
    );
    assert!(p.record(ProbeKind::Liveness, fail(), t0).is_none());
    // A success in between resets the count.
    p.record(ProbeKind::Liveness, ProbeOutcome::Success, t0 + 10 * S);
    assert!(p.record(ProbeKind::Liveness, fail(), t0 + 20 * S).is_none());
    assert!(p.record(ProbeKind::Liveness, fail(), t0 + 30 * S).is_none());
    let v = p.record(ProbeKind::Liveness, fail(), t0 + 40 * S);
    assert_eq!(
        v,
        Some(ProbeVerdict::Restart {
            kind: ProbeKind::Liveness,
            message: "exit 1".into()
        })
    );
    assert!(p.due(t0 + 100 * S).is_empty(), "on hold");
    // The same container still running: still on hold.
    p.observe(Observed::Running {
        container_id: "a",
        started_at: t0,
    });
    assert!(p.due(t0 + 100 * S).is_empty());
    p.observe(Observed::NotRunning);
    let t1 = t0 + 120 * S;
    p.observe(Observed::Running {
        container_id: "b",
        started_at: t1,
    });
    assert_eq!(kinds(&p, t1), [ProbeKind::Liveness]);
    assert_eq!(p.result(ProbeKind::Liveness), Some(ProbeResult::Success));
}

#[test]
fn startup_gates_liveness_and_readiness() {
    let t0 = Instant::now();
    let mut p = probes(
        Some(probe(0, 1, 1)),
        Some(probe(0, 1, 1)),
        Some(probe(0, 1, 2)),
    );
    p.observe(Observed::Running {
        container_id: "a",
        started_at: t0,
    });
    assert!(!p.started() && !p.ready());
    assert_eq!(kinds(&p, t0), [ProbeKind::Startup]);
    assert!(p.record(ProbeKind::Startup, fail(), t0).is_none());
    assert!(!p.started());
    p.record(ProbeKind::Startup, ProbeOutcome::Success, t0 + 10 * S);
    assert!(p.started() && !p.ready());
    // Startup stops; liveness and readiness begin.
    assert_eq!(
        kinds(&p, t0 + 10 * S),
        [ProbeKind::Liveness, ProbeKind::Readiness]
    );
    p.record(ProbeKind::Readiness, ProbeOutcome::Success, t0 + 10 * S);
    assert!(p.ready());
}

#[test]
fn startup_failure_restarts() {
    let t0 = Instant::now();
    let mut p = probes(None, None, Some(probe(0, 1, 2)));
    p.observe(Observed::Running {
        container_id: "a",
        started_at: t0,
    });
    assert!(p.record(ProbeKind::Startup, fail(), t0).is_none());
    assert!(matches!(
        p.record(ProbeKind::Startup, fail(), t0 + 10 * S),
        Some(ProbeVerdict::Restart {
            kind: ProbeKind::Startup,
            ..
        })
    ));
    assert!(!p.started());
}

#[test]
fn deleting_stops_liveness_but_not_readiness() {
    let t0 = Instant::now();
    let mut p = probes(Some(probe(0, 1, 1)), Some(probe(0, 1, 1)), None);
    p.observe(Observed::Running {
        container_id: "a",
        started_at: t0,
    });
    p.set_deleting();
    assert_eq!(kinds(&p, t0), [ProbeKind::Readiness]);
    assert_eq!(p.result(ProbeKind::Liveness), Some(ProbeResult::Success));
    assert_eq!(p.timeout(ProbeKind::Readiness), Some(S));
}
