use super::*;
use crate::pod::test_pod;
use PhaseInput::*;
use RestartPolicy::*;

#[test]
fn restart_by_policy() {
    let exited = |c| Some(RunState::Exited { exit_code: c });
    for (policy, code, init, want) in [
        (Always, 0, false, true),
        (Always, 1, false, true),
        (OnFailure, 0, false, false),
        (OnFailure, 1, false, true),
        (Never, 1, false, false),
        (Never, 0, false, false),
        // Init containers: a success is final, a failure restarts unless Never.
        (Always, 0, true, false),
        (Always, 2, true, true),
        (OnFailure, 2, true, true),
        (Never, 2, true, false),
    ] {
        assert_eq!(
            should_restart(policy, false, init, exited(code)),
            want,
            "{policy:?} {code} init={init}"
        );
    }
    assert!(should_restart(Never, false, false, None), "never started");
    assert!(should_restart(Never, false, false, Some(RunState::Created)));
    assert!(should_restart(Never, false, false, Some(RunState::Unknown)));
    assert!(!should_restart(
        Always,
        false,
        false,
        Some(RunState::Running)
    ));
    assert!(!should_restart(Always, true, false, exited(1)), "deleting");
}

#[test]
fn init_containers_run_in_order() {
    let pod = test_pod(&["a", "b"], &["app"], Always);
    let step = |states: &[(&str, RunState)]| {
        let states = states.to_vec();
        next_init_container(&pod, move |n| {
            states.iter().find(|(s, _)| *s == n).map(|(_, r)| *r)
        })
    };
    let ok = RunState::Exited { exit_code: 0 };
    let bad = RunState::Exited { exit_code: 1 };
    assert_eq!(step(&[]), InitStep::Start(0));
    assert_eq!(step(&[("a", RunState::Running)]), InitStep::Wait);
    assert_eq!(step(&[("a", ok)]), InitStep::Start(1));
    assert_eq!(step(&[("a", ok), ("b", RunState::Running)]), InitStep::Wait);
    assert_eq!(step(&[("a", ok), ("b", ok)]), InitStep::Done);
    assert_eq!(
        step(&[("a", ok), ("b", bad)]),
        InitStep::Failed {
            index: 1,
            pod_failed: false
        }
    );
    assert_eq!(step(&[("a", RunState::Created)]), InitStep::Start(0));
    // Init containers gone but the app runs (kubelet restart): done.
    assert_eq!(step(&[("app", RunState::Running)]), InitStep::Done);
    let never = test_pod(&["a"], &["app"], Never);
    assert_eq!(
        next_init_container(&never, |_| Some(bad)),
        InitStep::Failed {
            index: 0,
            pod_failed: true
        }
    );
    assert_eq!(
        next_init_container(&test_pod(&[], &["x"], Never), |_| None),
        InitStep::Done
    );
}

fn phase(pod: &PodSpec, states: &[(&str, PhaseInput)], terminal: bool) -> PodPhase {
    pod_phase(
        pod,
        |n| {
            states
                .iter()
                .find(|(s, _)| *s == n)
                .map_or(Missing, |(_, p)| *p)
        },
        terminal,
    )
}

#[test]
fn phases_without_init_containers() {
    let pod = |p| test_pod(&[], &["a", "b"], p);
    let ok = Terminated { exit_code: 0 };
    let bad = Terminated { exit_code: 1 };
    let fresh = Waiting {
        last_exit_code: None,
    };
    let crashed = Waiting {
        last_exit_code: Some(1),
    };
    assert_eq!(phase(&pod(Always), &[], false), PodPhase::Pending);
    assert_eq!(
        phase(&pod(Always), &[("a", Running)], false),
        PodPhase::Pending,
        "b unknown"
    );
    assert_eq!(
        phase(&pod(Always), &[("a", Running), ("b", fresh)], false),
        PodPhase::Pending
    );
    assert_eq!(
        phase(&pod(Always), &[("a", Running), ("b", Running)], false),
        PodPhase::Running
    );
    assert_eq!(
        phase(&pod(Always), &[("a", Running), ("b", crashed)], false),
        PodPhase::Running
    );
    assert_eq!(
        phase(&pod(Always), &[("a", ok), ("b", bad)], false),
        PodPhase::Running,
        "restarting"
    );
    assert_eq!(
        phase(&pod(Always), &[("a", ok), ("b", ok)], true),
        PodPhase::Succeeded,
        "terminal"
    );
    assert_eq!(
        phase(&pod(Always), &[("a", ok), ("b", bad)], true),
        PodPhase::Failed,
        "terminal"
    );
    assert_eq!(
        phase(&pod(OnFailure), &[("a", ok), ("b", ok)], false),
        PodPhase::Succeeded
    );
    assert_eq!(
        phase(&pod(OnFailure), &[("a", ok), ("b", crashed)], false),
        PodPhase::Running
    );
    assert_eq!(
        phase(&pod(Never), &[("a", ok), ("b", ok)], false),
        PodPhase::Succeeded
    );
    assert_eq!(
        phase(&pod(Never), &[("a", ok), ("b", bad)], false),
        PodPhase::Failed
    );
    assert_eq!(
        phase(&pod(Never), &[("a", Running), ("b", bad)], false),
        PodPhase::Running
    );
}

#[test]
fn phases_with_init_containers() {
    let pod = |p| test_pod(&["i1", "i2"], &["a"], p);
    let ok = Terminated { exit_code: 0 };
    let bad = Terminated { exit_code: 1 };
    assert_eq!(
        phase(&pod(Always), &[("i1", Running)], false),
        PodPhase::Pending
    );
    assert_eq!(phase(&pod(Always), &[("i1", ok)], false), PodPhase::Pending);
    assert_eq!(
        phase(
            &pod(Always),
            &[("i1", ok), ("i2", ok), ("a", Running)],
            false
        ),
        PodPhase::Running
    );
    // A failed init container fails the pod only with Never.
    assert_eq!(phase(&pod(Never), &[("i1", bad)], false), PodPhase::Failed);
    assert_eq!(
        phase(&pod(Always), &[("i1", bad)], false),
        PodPhase::Pending
    );
    assert_eq!(
        phase(
            &pod(Never),
            &[(
                "i1",
                Waiting {
                    last_exit_code: Some(2)
                }
            )],
            false
        ),
        PodPhase::Failed
    );
    assert!(PodPhase::Failed.is_terminal() && !PodPhase::Running.is_terminal());
}
