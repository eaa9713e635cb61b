//! What the agent writes back to the API server: Events on Services it cannot
//! program, and a Lease that shows it is alive.
//!
//! ```text
//!  controller ─┐                     ┌─▶ events.k8s.io Event on the Service
//!  API source ─┴─Report─▶ (channel) ─┤   (once per distinct failure)
//!                                    │
//!                 every 10 s ────────┴─▶ Lease <namespace>/weir-agent-<node>
//! ```
pub mod events;
pub mod lease;

use tokio::sync::mpsc;

use crate::model::ServiceId;

/// Why a Service is not (fully) in the datapath. The names are the Events'
/// `reason`s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    InvalidService,
    InvalidEndpointSlice,
    MapFull,
    FrontendConflict,
    /// Some of a Service's frontends are another Service's (an external IP
    /// that is another Service's cluster or load-balancer IP, or a frontend
    /// an older Service claimed first); its others are programmed.
    FrontendRefused,
    TooManyBackends,
    ProgrammingFailed,
    /// kube-proxy's reason when a healthCheckNodePort cannot be listened on.
    FailedToStartServiceHealthcheck,
}

/// Which part of the agent a failure belongs to: a Service can be valid again
/// and still not fit in the maps, and each side clears only its own failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    Validation,
    Programming,
    /// The Service's healthCheckNodePort listener.
    HealthCheck,
    /// Frontends the store keeps from a Service that is otherwise programmed.
    Frontends,
}

impl Reason {
    pub const fn stage(self) -> Stage {
        match self {
            Self::InvalidService | Self::InvalidEndpointSlice => Stage::Validation,
            Self::FailedToStartServiceHealthcheck => Stage::HealthCheck,
            Self::FrontendRefused => Stage::Frontends,
            _ => Stage::Programming,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InvalidService => "InvalidService",
            Self::InvalidEndpointSlice => "InvalidEndpointSlice",
            Self::MapFull => "MapFull",
            Self::FrontendConflict => "FrontendConflict",
            Self::FrontendRefused => "FrontendRefused",
            Self::TooManyBackends => "TooManyBackends",
            Self::ProgrammingFailed => "ProgrammingFailed",
            Self::FailedToStartServiceHealthcheck => "FailedToStartServiceHealthcheck",
        }
    }

    /// The Event's `action`: what the agent was doing (kube-proxy's `Listen`
    /// for health checks).
    pub const fn action(self) -> &'static str {
        match self {
            Self::FailedToStartServiceHealthcheck => "Listen",
            _ => "Program",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    Failed {
        service: ServiceId,
        reason: Reason,
        message: String,
    },
    Recovered {
        service: ServiceId,
        stage: Stage,
    },
}

/// Where reports go. Sending never blocks the datapath: when the API server is
/// slow and the queue is full, a report is dropped (the log has it).
#[derive(Clone, Debug, Default)]
pub struct Reports(Option<mpsc::Sender<Report>>);

impl Reports {
    pub fn channel(depth: usize) -> (Self, mpsc::Receiver<Report>) {
        let (tx, rx) = mpsc::channel(depth);
        (Self(Some(tx)), rx)
    }

    /// Reports that go nowhere (standalone mode has no API server).
    pub const fn none() -> Self {
        Self(None)
    }

    pub fn send(&self, report: Report) {
        if let Some(tx) = &self.0 {
            let _ = tx.try_send(report);
        }
    }
}
