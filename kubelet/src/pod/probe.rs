//! The probe state machine of one container, as pkg/kubelet/prober/worker.go
//! (`doProbe`) runs it: a worker per probe kind, results kept per container
//! ID, thresholds counted over consecutive results, startup gating the other
//! two, and a liveness or startup failure putting the worker on hold until a
//! new container appears. Pure: time is passed in, probes are run by the
//! caller ([`super::prober`]) and their outcome recorded.
use std::time::{Duration, Instant};

use super::{ContainerSpec, Probe};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeKind {
    pub const ALL: [ProbeKind; 3] = [Self::Startup, Self::Liveness, Self::Readiness];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Liveness => "Liveness",
            Self::Readiness => "Readiness",
            Self::Startup => "Startup",
        }
    }

    /// The kubelet's starting value for a new container: not ready until a
    /// success, alive until proven dead, startup unknown.
    fn initial(self) -> ProbeResult {
        match self {
            Self::Liveness => ProbeResult::Success,
            Self::Readiness => ProbeResult::Failure,
            Self::Startup => ProbeResult::Unknown,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeResult {
    Success,
    Failure,
    Unknown,
}

/// What running a probe once gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    Success,
    Failure {
        message: String,
    },
    /// The probe itself could not run (a runtime error): the kubelet throws
    /// such results away.
    Unknown {
        message: String,
    },
}

/// What the pod worker should do after a result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeVerdict {
    /// Kill the container and let the restart policy decide (kubelet event:
    /// "Container c failed liveness probe, will be restarted").
    Restart { kind: ProbeKind, message: String },
}

/// The container as the pod worker sees it on its latest relist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observed<'a> {
    Running {
        container_id: &'a str,
        started_at: Instant,
    },
    NotRunning,
}

#[derive(Clone, Debug)]
struct Worker {
    kind: ProbeKind,
    probe: Probe,
    container_id: Option<String>,
    started_at: Option<Instant>,
    running: bool,
    result: ProbeResult,
    last: Option<ProbeResult>,
    run: u32,
    on_hold: bool,
    next_at: Option<Instant>,
    message: Option<String>,
}

impl Worker {
    fn new(kind: ProbeKind, probe: Probe) -> Self {
        Self {
            kind,
            probe,
            container_id: None,
            started_at: None,
            running: false,
            result: kind.initial(),
            last: None,
            run: 0,
            on_hold: false,
            next_at: None,
            message: None,
        }
    }

    fn observe(&mut self, obs: Observed<'_>) {
        match obs {
            Observed::Running {
                container_id,
                started_at,
            } => {
                if self.container_id.as_deref() != Some(container_id) {
                    // A new container: fresh results, and probing resumes.
                    *self = Self::new(self.kind, self.probe.clone());
                    self.container_id = Some(container_id.to_owned());
                    self.started_at = Some(started_at);
                }
                self.running = true;
            }
            Observed::NotRunning => {
                if self.container_id.is_some() {
                    self.result = ProbeResult::Failure;
                }
                self.running = false;
            }
        }
    }

    /// When this worker may probe next, given whether the container started.
    fn due_at(&self, started: bool, deleting: bool) -> Option<Instant> {
        if !self.running || self.on_hold {
            return None;
        }
        // A pod being deleted is not restarted for failing liveness/startup.
        if deleting && self.kind != ProbeKind::Readiness {
            return None;
        }
        // Startup stops once the container started; the others wait for it.
        if started == (self.kind == ProbeKind::Startup) {
            return None;
        }
        let delay_end = self.started_at? + self.probe.initial_delay;
        Some(self.next_at.map_or(delay_end, |n| n.max(delay_end)))
    }

    fn record(&mut self, outcome: ProbeOutcome, now: Instant) -> Option<ProbeVerdict> {
        self.next_at = Some(now + self.probe.period);
        let (result, message) = match outcome {
            ProbeOutcome::Success => (ProbeResult::Success, None),
            ProbeOutcome::Failure { message } => (ProbeResult::Failure, Some(message)),
            ProbeOutcome::Unknown { .. } => return None,
        };
        if self.last == Some(result) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(result);
            self.run = 1;
        }
        self.message = message;
        let threshold = match result {
            ProbeResult::Failure => self.probe.failure_threshold,
            _ => self.probe.success_threshold,
        };
        if self.run < threshold {
            return None;
        }
        self.result = result;
        if result == ProbeResult::Failure && self.kind != ProbeKind::Readiness {
            // Stop probing until a new container appears: exec into a
            // container being killed can corrupt its state (kubernetes#21751).
            self.on_hold = true;
            self.run = 0;
            return Some(ProbeVerdict::Restart {
                kind: self.kind,
                message: self.message.clone().unwrap_or_default(),
            });
        }
        None
    }
}

/// The probes of one container.
#[derive(Clone, Debug)]
pub struct ContainerProbes {
    workers: Vec<Worker>,
    running: bool,
    deleting: bool,
}

impl ContainerProbes {
    pub fn new(c: &ContainerSpec) -> Self {
        Self {
            workers: ProbeKind::ALL
                .into_iter()
                .filter_map(|k| Some(Worker::new(k, c.probe(k)?.clone())))
                .collect(),
            running: false,
            deleting: false,
        }
    }

    fn worker(&self, kind: ProbeKind) -> Option<&Worker> {
        self.workers.iter().find(|w| w.kind == kind)
    }

    /// Feeds the latest relist. A new container ID resets every result.
    pub fn observe(&mut self, obs: Observed<'_>) {
        self.running = matches!(obs, Observed::Running { .. });
        for w in &mut self.workers {
            w.observe(obs);
        }
    }

    /// The pod is being deleted: liveness and startup stop, and count as
    /// passing, so nothing restarts during the grace period.
    pub fn set_deleting(&mut self) {
        self.deleting = true;
        for w in &mut self.workers {
            if w.kind != ProbeKind::Readiness {
                w.result = ProbeResult::Success;
            }
        }
    }

    /// `started` of the container status: running, and its startup probe (if
    /// any) succeeded.
    pub fn started(&self) -> bool {
        self.running
            && self
                .worker(ProbeKind::Startup)
                .is_none_or(|w| w.result == ProbeResult::Success)
    }

    /// `ready` of the container status: started, and its readiness probe (if
    /// any) succeeded.
    pub fn ready(&self) -> bool {
        self.started()
            && self
                .worker(ProbeKind::Readiness)
                .is_none_or(|w| w.result == ProbeResult::Success)
    }

    pub fn result(&self, kind: ProbeKind) -> Option<ProbeResult> {
        self.worker(kind).map(|w| w.result)
    }

    /// The probes to run at `now`.
    pub fn due(&self, now: Instant) -> Vec<(ProbeKind, &Probe)> {
        let started = self.started();
        self.workers
            .iter()
            .filter(|w| w.due_at(started, self.deleting).is_some_and(|t| t <= now))
            .map(|w| (w.kind, &w.probe))
            .collect()
    }

    /// When something next becomes due, for the pod worker's timer.
    pub fn next_due(&self) -> Option<Instant> {
        let started = self.started();
        self.workers
            .iter()
            .filter_map(|w| w.due_at(started, self.deleting))
            .min()
    }

    /// Records a probe's outcome (for the container observed last).
    pub fn record(
        &mut self,
        kind: ProbeKind,
        outcome: ProbeOutcome,
        now: Instant,
    ) -> Option<ProbeVerdict> {
        self.workers
            .iter_mut()
            .find(|w| w.kind == kind)?
            .record(outcome, now)
    }

    /// The timeout the caller should give a probe of this kind.
    pub fn timeout(&self, kind: ProbeKind) -> Option<Duration> {
        self.worker(kind).map(|w| w.probe.timeout)
    }
}

#[cfg(test)]
mod tests;
