//! Events on Services whose programming fails. One Event per distinct failure:
//! a Service that stays in the same state while the controller retries every
//! two seconds does not produce a stream of Events, and a Service that recovers
//! and fails again gets a new one.
use std::collections::HashMap;

use k8s_openapi::api::core::v1::{ObjectReference, Service};
use kube::runtime::{
    events::{Event, EventType, Recorder},
    reflector::{ObjectRef, Store},
};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::{Reason, Report, Stage};
use crate::model::ServiceId;

/// Filters reports down to the ones that deserve a new Event.
#[derive(Debug, Default)]
pub struct Dedup {
    last: HashMap<(ServiceId, Stage), (Reason, String)>,
}

impl Dedup {
    /// The Event to write for this report, if any.
    pub fn admit(&mut self, report: Report) -> Option<(ServiceId, Reason, String)> {
        match report {
            Report::Failed {
                service,
                reason,
                message,
            } => {
                let slot = (service.clone(), reason.stage());
                let value = (reason, message);
                if self.last.get(&slot) == Some(&value) {
                    return None;
                }
                self.last.insert(slot, value.clone());
                Some((service, value.0, value.1))
            }
            Report::Recovered { service, stage } => {
                self.last.remove(&(service, stage));
                None
            }
        }
    }
}

/// Writes Events until the report channel closes. `services` is the API
/// source's reflector store, for the Services' UIDs.
pub async fn run(recorder: Recorder, services: Store<Service>, mut rx: mpsc::Receiver<Report>) {
    let mut dedup = Dedup::default();
    while let Some(report) = rx.recv().await {
        let Some((service, reason, message)) = dedup.admit(report) else {
            continue;
        };
        let uid = services
            .get(&ObjectRef::new(&service.name).within(&service.namespace))
            .and_then(|s| s.metadata.uid.clone());
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some(service.namespace.clone()),
            name: Some(service.name.clone()),
            uid,
            ..ObjectReference::default()
        };
        // The API caps an Event's note at 1 kB.
        let note: String = message.chars().take(1000).collect();
        let event = Event {
            type_: EventType::Warning,
            reason: reason.as_str().into(),
            note: Some(note),
            action: reason.action().into(),
            secondary: None,
        };
        match recorder.publish(&event, &reference).await {
            Ok(()) => debug!(%service, reason = reason.as_str(), "event written"),
            Err(e) => warn!(%service, reason = reason.as_str(), "cannot write event: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(n: &str, reason: Reason, msg: &str) -> Report {
        Report::Failed {
            service: ServiceId::new("default", n),
            reason,
            message: msg.into(),
        }
    }

    #[test]
    fn one_event_per_distinct_failure() {
        let mut d = Dedup::default();
        assert!(d.admit(failed("a", Reason::MapFull, "full")).is_some());
        for _ in 0..10 {
            assert!(d.admit(failed("a", Reason::MapFull, "full")).is_none());
        }
        assert!(d.admit(failed("b", Reason::MapFull, "full")).is_some());
        assert!(
            d.admit(failed("a", Reason::MapFull, "full: 9 of 8"))
                .is_some(),
            "a new message is a new event"
        );
        d.admit(Report::Recovered {
            service: ServiceId::new("default", "a"),
            stage: Stage::Validation,
        });
        assert!(
            d.admit(failed("a", Reason::MapFull, "full: 9 of 8"))
                .is_none(),
            "a valid object does not clear a programming failure"
        );
        d.admit(Report::Recovered {
            service: ServiceId::new("default", "a"),
            stage: Stage::Programming,
        });
        assert!(
            d.admit(failed("a", Reason::MapFull, "full: 9 of 8"))
                .is_some(),
            "failing again after recovering is news"
        );
    }
}
