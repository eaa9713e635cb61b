//! Events on Services whose programming fails. One Event per distinct failure:
//! a Service that stays in the same state while the controller retries every
//! two seconds does not produce a stream of Events, and a Service that recovers
//! and fails again gets a new one.
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::{Reason, Report, Stage};
use crate::hash::HashMap;
use crate::model::ServiceId;

/// Each watched Service's UID, for the Events' `regarding`: all the Event
/// writer needs of a Service, where a reflector store would hold every one
/// whole (tens of megabytes at 100k Services).
#[derive(Clone, Debug, Default)]
pub struct Uids(Arc<Mutex<HashMap<ServiceId, Box<str>>>>);

impl Uids {
    pub fn set(&self, id: &ServiceId, uid: Option<&str>) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match uid {
            Some(uid) if map.get(id).map(AsRef::as_ref) != Some(uid) => {
                map.insert(id.clone(), uid.into());
            }
            Some(_) => {}
            None => {
                map.remove(id);
            }
        }
    }

    pub fn get(&self, id: &ServiceId) -> Option<String> {
        let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(id).map(ToString::to_string)
    }
}

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

/// Writes Events until the report channel closes. `uids` is kept by the
/// API source.
pub async fn run(recorder: Recorder, uids: Uids, mut rx: mpsc::Receiver<Report>) {
    let mut dedup = Dedup::default();
    while let Some(report) = rx.recv().await {
        let Some((service, reason, message)) = dedup.admit(report) else {
            continue;
        };
        let uid = uids.get(&service);
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Service".into()),
            namespace: Some(service.namespace().to_owned()),
            name: Some(service.name().to_owned()),
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
    fn uids_follow_the_watched_services() {
        let uids = Uids::default();
        let a = ServiceId::new("default", "a");
        assert_eq!(uids.get(&a), None);
        uids.set(&a, Some("u1"));
        assert_eq!(uids.get(&a).as_deref(), Some("u1"));
        // Deleted and created again under the same name: a new UID.
        uids.set(&a, Some("u2"));
        assert_eq!(uids.get(&a).as_deref(), Some("u2"));
        uids.set(&a, None);
        assert_eq!(uids.get(&a), None);
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
