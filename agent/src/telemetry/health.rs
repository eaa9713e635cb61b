//! kube-proxy's health model: the agent is healthy once it has synced and as
//! long as no change has waited longer than the bound to be handled. An
//! API-server outage queues nothing, so it never fails every node's health
//! check at once. What counts is whether the sync loop runs and the kernel
//! takes its writes: one Service that is invalid, conflicts with another or
//! does not fit is reported on that Service (Event, metrics), never here,
//! or any tenant could take every node out of its load balancers.
use std::{
    sync::Mutex,
    time::{Duration, Instant, SystemTime},
};

#[derive(Debug)]
pub struct Health {
    timeout: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    last_updated: Option<SystemTime>,
    oldest_pending: Option<Instant>,
    /// False while the Node is being deleted or drained by the cluster
    /// autoscaler, so load balancers stop sending new traffic here.
    node_ineligible: bool,
}

/// What `/healthz` and `/livez` report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub healthy: bool,
    pub node_eligible: bool,
    pub last_updated: Option<SystemTime>,
    pub current_time: SystemTime,
}

impl Health {
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic elsewhere cannot leave State inconsistent: every write is one field.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A change arrived that is not in the maps yet.
    pub fn queued(&self) {
        self.lock().oldest_pending.get_or_insert_with(Instant::now);
    }

    /// A sync finished; `complete` unless the kernel refused a write that is
    /// still to be retried.
    pub fn updated(&self, complete: bool) {
        let mut s = self.lock();
        s.last_updated = Some(SystemTime::now());
        if complete {
            s.oldest_pending = None;
        }
    }

    pub fn set_node_eligible(&self, eligible: bool) {
        self.lock().node_ineligible = !eligible;
    }

    pub fn status(&self) -> Status {
        self.status_at(Instant::now())
    }

    fn status_at(&self, now: Instant) -> Status {
        let s = self.lock();
        let stale = s
            .oldest_pending
            .is_some_and(|t| now.saturating_duration_since(t) > self.timeout);
        Status {
            healthy: s.last_updated.is_some() && !stale,
            node_eligible: !s.node_ineligible,
            last_updated: s.last_updated,
            current_time: SystemTime::now(),
        }
    }
}

impl Status {
    /// kube-proxy's body: `{"lastUpdated": ..., "currentTime": ..., "nodeEligible": ...}`.
    pub fn to_json(&self) -> String {
        let ts = |t: SystemTime| humantime::format_rfc3339_nanos(t).to_string();
        serde_json::json!({
            "lastUpdated": self.last_updated.map(ts).unwrap_or_default(),
            "currentTime": ts(self.current_time),
            "nodeEligible": self.node_eligible,
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unhealthy_until_first_sync_then_only_when_a_change_waits_too_long() {
        let h = Health::new(Duration::from_secs(60));
        assert!(!h.status().healthy, "never synced");
        h.updated(true);
        assert!(h.status().healthy);

        h.queued();
        let t0 = Instant::now();
        assert!(h.status_at(t0 + Duration::from_secs(59)).healthy);
        assert!(!h.status_at(t0 + Duration::from_secs(61)).healthy);
        // A partial sync keeps the oldest pending change pending.
        h.updated(false);
        assert!(!h.status_at(t0 + Duration::from_secs(61)).healthy);
        h.updated(true);
        assert!(h.status_at(t0 + Duration::from_secs(3600)).healthy);
    }

    #[test]
    fn node_eligibility_is_separate_from_health() {
        let h = Health::new(Duration::from_secs(60));
        h.updated(true);
        h.set_node_eligible(false);
        let s = h.status();
        assert!(s.healthy && !s.node_eligible);
        let body: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
        assert_eq!(body["nodeEligible"], false);
        assert!(body["lastUpdated"].as_str().unwrap().ends_with('Z'));
    }
}
