//! The node's readiness, as the kubelet's `runtimeState` decides it: the
//! runtime's CRI `Status` is polled every 5 s (`updateRuntimeUp`), the
//! worker's node-wide PLEG records each successful relist, and the Node's
//! Ready condition is False, with reason `KubeletNotReady` and the errors as
//! its message, while any of these holds:
//!
//! - no successful `Status` yet, or none for 30 s: "container runtime is down";
//! - the relist has not succeeded for 3 min: "PLEG is not healthy: …";
//! - `RuntimeReady` false: "container runtime not ready: …";
//! - `NetworkReady` false: "container runtime network not ready: …".
//!
//! The decision is [`not_ready_errors`], a pure function of the recorded
//! [`HealthState`] and the time; the tasks only record.
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::time::Instant;

use crate::cri::{NETWORK_READY, RUNTIME_READY, Runtime, RuntimeCondition, RuntimeStatus};

/// The kubelet's `maxWaitForContainerRuntime`.
pub const RUNTIME_SYNC_THRESHOLD: Duration = Duration::from_secs(30);
/// The kubelet's `genericPlegRelistThreshold`.
pub const RELIST_THRESHOLD: Duration = Duration::from_secs(180);
/// How often the kubelet calls the runtime's `Status`.
pub const RUNTIME_CHECK_PERIOD: Duration = Duration::from_secs(5);

/// After how long without success each check counts as failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    pub runtime_sync: Duration,
    pub relist: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            runtime_sync: RUNTIME_SYNC_THRESHOLD,
            relist: RELIST_THRESHOLD,
        }
    }
}

/// What the checks last saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealthState {
    /// The last `Status` that answered with `RuntimeReady` true.
    pub last_runtime_sync: Option<Instant>,
    pub runtime_error: Option<String>,
    pub network_error: Option<String>,
    /// When the last successful relist started.
    pub last_relist: Option<Instant>,
    /// The eviction manager's MemoryPressure and DiskPressure.
    pub pressure: Option<Pressure>,
}

/// The pressure conditions, as the eviction manager last decided them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pressure {
    pub memory: bool,
    pub disk: bool,
}

/// Go's `%v` of a `*RuntimeCondition`, as the kubelet's messages embed it.
fn condition_text(c: Option<&RuntimeCondition>) -> String {
    match c {
        None => "<nil>".into(),
        Some(c) => format!(
            "{}={} reason:{} message:{}",
            c.type_, c.status, c.reason, c.message
        ),
    }
}

/// `updateRuntimeUp` after a `Status` call: the network's state is always
/// taken; the sync time only moves when the runtime itself is ready. A
/// failed call changes nothing, so the sync time ages towards "down".
pub fn observe_status(s: &mut HealthState, status: &RuntimeStatus, now: Instant) {
    let network = status.condition(NETWORK_READY);
    s.network_error = match network {
        Some(c) if c.status => None,
        c => Some(format!(
            "container runtime network not ready: {}",
            condition_text(c)
        )),
    };
    match status.condition(RUNTIME_READY) {
        Some(c) if c.status => {
            s.runtime_error = None;
            s.last_runtime_sync = Some(now);
        }
        c => {
            s.runtime_error = Some(format!(
                "container runtime not ready: {}",
                condition_text(c)
            ));
        }
    }
}

/// Go's `time.Duration.String()` to the millisecond, e.g. `3m0.5s`.
fn go_duration(d: Duration) -> String {
    let ms = d.as_millis();
    let (h, m, s, frac) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    let secs = if frac == 0 {
        format!("{s}s")
    } else {
        format!("{s}.{}s", format!("{frac:03}").trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => secs,
        (0, m) => format!("{m}m{secs}"),
        (h, m) => format!("{h}h{m}m{secs}"),
    }
}

/// Why the node is not ready, in the kubelet's order (runtime sync, PLEG,
/// runtime condition, network condition); empty when it is.
pub fn not_ready_errors(s: &HealthState, now: Instant, t: &Thresholds) -> Vec<String> {
    let mut errs = Vec::new();
    match s.last_runtime_sync {
        None => errs.push("container runtime status check may not have completed yet".into()),
        Some(at) if now.saturating_duration_since(at) >= t.runtime_sync => {
            errs.push("container runtime is down".into());
        }
        Some(_) => {}
    }
    match s.last_relist {
        None => errs.push("PLEG is not healthy: pleg has yet to be successful".into()),
        Some(at) => {
            let elapsed = now.saturating_duration_since(at);
            if elapsed > t.relist {
                errs.push(format!(
                    "PLEG is not healthy: pleg was last seen active {} ago; threshold is {}",
                    go_duration(elapsed),
                    go_duration(t.relist)
                ));
            }
        }
    }
    errs.extend(s.runtime_error.clone());
    errs.extend(s.network_error.clone());
    errs
}

/// The Ready condition's message for `errs`, as `utilerrors.NewAggregate`
/// prints it: one error alone, several deduplicated in brackets.
pub fn aggregate(errs: &[String]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for e in errs {
        if !seen.contains(&e.as_str()) {
            seen.push(e);
        }
    }
    match seen.as_slice() {
        [one] => (*one).to_owned(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// The recorded state, shared by the check tasks and the Node reporter.
#[derive(Debug, Default)]
pub struct NodeHealth {
    state: Mutex<HealthState>,
    thresholds: Thresholds,
}

impl NodeHealth {
    pub fn new() -> Arc<Self> {
        Self::with_thresholds(Thresholds::default())
    }

    /// Shorter thresholds, for tests.
    pub fn with_thresholds(thresholds: Thresholds) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::default(),
            thresholds,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn state(&self) -> HealthState {
        self.lock().clone()
    }

    /// Why the node is not ready now; empty when it is.
    pub fn not_ready(&self) -> Vec<String> {
        not_ready_errors(&self.lock(), Instant::now(), &self.thresholds)
    }

    /// One `Status` call, recorded. Returns whether the runtime answered.
    pub async fn check_runtime<R: Runtime>(&self, rt: &R) -> bool {
        let now = Instant::now();
        match rt.status().await {
            Ok(status) => {
                let mut s = self.lock();
                let before = (s.runtime_error.clone(), s.network_error.clone());
                observe_status(&mut s, &status, now);
                if (s.runtime_error.clone(), s.network_error.clone()) != before {
                    for e in s.runtime_error.iter().chain(&s.network_error) {
                        tracing::warn!(error = %e, "container runtime status");
                    }
                }
                true
            }
            Err(e) => {
                tracing::debug!(error = %e, "container runtime status check failed");
                false
            }
        }
    }

    /// One node-wide relist (every sandbox and container, as the PLEG's
    /// `GetPods`), recorded with the time it started: the check before the
    /// Node registers, so that a healthy node is Ready from its first status
    /// on. The worker's PLEG records its own relists after that.
    pub async fn relist<R: Runtime>(&self, rt: &R) -> bool {
        let started = Instant::now();
        let ok = match rt.list_pod_sandboxes(&Default::default()).await {
            Ok(_) => rt.list_containers(&Default::default()).await.is_ok(),
            Err(_) => false,
        };
        if ok {
            self.record_relist(started);
        }
        ok
    }

    /// The eviction manager's view of memory and disk.
    pub fn set_pressure(&self, memory: bool, disk: bool) {
        self.lock().pressure = Some(Pressure { memory, disk });
    }

    /// A relist that started at `started` succeeded.
    pub fn record_relist(&self, started: Instant) {
        let mut s = self.lock();
        if s.last_relist.is_none_or(|at| at < started) {
            s.last_relist = Some(started);
        }
    }

    /// Starts the runtime's `Status` check every [`RUNTIME_CHECK_PERIOD`] on
    /// the current Tokio runtime. The relists are the PLEG's (the worker's),
    /// so that a hung relist shows here without holding this check back.
    pub fn spawn<R: Runtime + 'static>(self: &Arc<Self>, rt: Arc<R>) {
        let h = self.clone();
        tokio::spawn(async move {
            let mut down = false;
            loop {
                let ok = h.check_runtime(&*rt).await;
                if ok == down {
                    down = !ok;
                    if down {
                        tracing::warn!("container runtime does not answer its Status call");
                    } else {
                        tracing::info!("container runtime answers again");
                    }
                }
                tokio::time::sleep(RUNTIME_CHECK_PERIOD).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(type_: &str, status: bool) -> RuntimeCondition {
        RuntimeCondition {
            type_: type_.into(),
            status,
            reason: if status { "" } else { "NetworkPluginNotReady" }.into(),
            message: if status {
                ""
            } else {
                "cni plugin not initialized"
            }
            .into(),
        }
    }

    fn ready_status(network: bool) -> RuntimeStatus {
        RuntimeStatus {
            conditions: vec![cond(RUNTIME_READY, true), cond(NETWORK_READY, network)],
        }
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(Duration::from_secs(180)), "3m0s");
        assert_eq!(go_duration(Duration::from_millis(180_500)), "3m0.5s");
        assert_eq!(go_duration(Duration::from_millis(1_250)), "1.25s");
        assert_eq!(go_duration(Duration::from_secs(3_661)), "1h1m1s");
    }

    #[test]
    fn ready_only_once_both_checks_succeeded() {
        let t = Thresholds::default();
        let now = Instant::now();
        let mut s = HealthState::default();
        assert_eq!(
            not_ready_errors(&s, now, &t),
            [
                "container runtime status check may not have completed yet",
                "PLEG is not healthy: pleg has yet to be successful"
            ]
        );
        observe_status(&mut s, &ready_status(true), now);
        s.last_relist = Some(now);
        assert!(not_ready_errors(&s, now, &t).is_empty());
    }

    #[test]
    fn a_silent_runtime_is_down_after_the_threshold() {
        let t = Thresholds::default();
        let start = Instant::now();
        let mut s = HealthState::default();
        observe_status(&mut s, &ready_status(true), start);
        s.last_relist = Some(start);
        let at = |secs| start + Duration::from_secs(secs);
        assert!(not_ready_errors(&s, at(29), &t).is_empty());
        assert_eq!(
            not_ready_errors(&s, at(30), &t),
            ["container runtime is down"]
        );
        // The relist failing too: after 3 min, the PLEG joins in.
        let errs = not_ready_errors(&s, at(181), &t);
        assert_eq!(
            aggregate(&errs),
            "[container runtime is down, PLEG is not healthy: pleg was last seen active 3m1s ago; \
             threshold is 3m0s]"
        );
        // It answers again: ready at once (the PLEG recovers on its next relist).
        observe_status(&mut s, &ready_status(true), at(182));
        s.last_relist = Some(at(182));
        assert!(not_ready_errors(&s, at(182), &t).is_empty());
    }

    #[test]
    fn runtime_and_network_conditions() {
        let t = Thresholds::default();
        let now = Instant::now();
        let mut s = HealthState {
            last_relist: Some(now),
            ..Default::default()
        };
        observe_status(&mut s, &ready_status(false), now);
        assert_eq!(
            not_ready_errors(&s, now, &t),
            ["container runtime network not ready: NetworkReady=false \
              reason:NetworkPluginNotReady message:cni plugin not initialized"]
        );
        // No RuntimeReady: not ready, and the sync time stays where it was,
        // so 30 s later it also counts as down.
        let later = now + Duration::from_secs(1);
        observe_status(
            &mut s,
            &RuntimeStatus {
                conditions: vec![cond(NETWORK_READY, true)],
            },
            later,
        );
        assert_eq!(
            not_ready_errors(&s, later, &t),
            ["container runtime not ready: <nil>"]
        );
        assert_eq!(s.last_runtime_sync, Some(now));
        assert_eq!(
            not_ready_errors(&s, now + Duration::from_secs(30), &t)[0],
            "container runtime is down"
        );
        assert_eq!(aggregate(&["a".into(), "a".into()]), "a");
    }
}
