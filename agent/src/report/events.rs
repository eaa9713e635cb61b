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
pub struct Uids(Arc<Mutex<HashMap<ServiceId, Uid>>>);

impl Uids {
    pub fn set(&self, id: &ServiceId, uid: Option<&str>) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match uid {
            Some(uid) => {
                let uid = Uid::new(uid);
                if map.get(id) != Some(&uid) {
                    map.insert(id.clone(), uid);
                }
            }
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

/// A UID as the API server wrote it. The API server makes them lowercase
/// RFC 4122 UUIDs, held here as their 16 bytes instead of 36 characters on
/// the heap; any other text is kept as it is, so a UID always reads back
/// exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Uid {
    Uuid([u8; 16]),
    Text(Box<str>),
}

impl Uid {
    fn new(text: &str) -> Self {
        let b = text.as_bytes();
        let dashes_at = |i| matches!(i, 8 | 13 | 18 | 23);
        let well_formed = b.len() == 36
            && b.iter().enumerate().all(|(i, &c)| {
                if dashes_at(i) {
                    c == b'-'
                } else {
                    matches!(c, b'0'..=b'9' | b'a'..=b'f')
                }
            });
        if !well_formed {
            return Self::Text(text.into());
        }
        let mut hex = b.iter().filter(|&&c| c != b'-').map(|&c| match c {
            b'0'..=b'9' => c - b'0',
            _ => c - b'a' + 10,
        });
        let mut out = [0u8; 16];
        for byte in &mut out {
            let (hi, lo) = (hex.next().unwrap_or(0), hex.next().unwrap_or(0));
            *byte = hi << 4 | lo;
        }
        Self::Uuid(out)
    }
}

impl std::fmt::Display for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Text(t) => f.write_str(t),
            Self::Uuid(b) => {
                for (i, byte) in b.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
        }
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
    fn uids_read_back_exactly() {
        for (i, text) in [
            "3f2b8c1e-9a4d-4e7b-8c2a-1d5e6f7a8b9c",
            "3F2B8C1E-9A4D-4E7B-8C2A-1D5E6F7A8B9C",
            "3f2b8c1e9a4d4e7b8c2a1d5e6f7a8b9c0000",
            "3f2b8c1e-9a4d-4e7b-8c2a-1d5e6f7a8b9",
            "",
            "u1",
        ]
        .into_iter()
        .enumerate()
        {
            let uid = Uid::new(text);
            assert_eq!(uid.to_string(), text);
            // Only the canonical form is packed.
            assert_eq!(matches!(uid, Uid::Uuid(_)), i == 0, "{text}");
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
