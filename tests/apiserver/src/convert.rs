//! Resources that are views of another's storage. On a real server core/v1
//! and events.k8s.io/v1 Events are one resource: kube-rs's `Recorder` writes
//! through events.k8s.io, and `kubectl get events` and `kubectl describe`
//! read through core/v1. Objects are stored in the form of the resource named
//! by `stored_as`; a view converts on the way in and on the way out, so the
//! store, its history and its watches only ever hold one form.
use std::borrow::Cow;

use serde_json::{Map, Value, json};

use crate::resources::{self, ResourceDef};

/// core/v1 field ↔ events.k8s.io/v1 field, upstream's
/// `Convert_v1_Event_To_core_Event` and back. Every other field (`eventTime`,
/// `series`, `action`, `reason`, `related`, `reportingInstance`, `type`,
/// `metadata`) has one name in both.
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

/// The resource whose storage holds `res`'s objects.
pub fn storage(res: &'static ResourceDef) -> &'static ResourceDef {
    res.stored_as
        .and_then(|group| resources::find(group, "v1", res.plural))
        .unwrap_or(res)
}

/// An object as `res` is written, in its storage's form.
pub fn to_storage(res: &'static ResourceDef, obj: Value) -> Value {
    let Value::Object(mut m) = obj else {
        return obj;
    };
    let to = storage(res);
    if std::ptr::eq(to, res) {
        return Value::Object(m);
    }
    rename(&mut m, |&(core, view)| (view, core));
    // A Go struct, not a pointer, upstream: always present in the core form.
    m.entry("involvedObject").or_insert_with(|| json!({}));
    set_type_meta(&mut m, to);
    Value::Object(m)
}

/// A stored object as `res` reads it.
pub fn to_view<'a>(res: &'static ResourceDef, stored: &'a Value) -> Cow<'a, Value> {
    let from = storage(res);
    let Some(m) = stored.as_object().filter(|_| !std::ptr::eq(from, res)) else {
        return Cow::Borrowed(stored);
    };
    let mut m = m.clone();
    rename(&mut m, |&(core, view)| (core, view));
    set_type_meta(&mut m, res);
    Cow::Owned(Value::Object(m))
}

/// Moves each `from` field to `to`, keeping the fields' order otherwise.
fn rename(
    m: &mut Map<String, Value>,
    pair: impl Fn(&(&'static str, &'static str)) -> (&'static str, &'static str),
) {
    let pairs: Vec<_> = EVENT_FIELDS.iter().map(pair).collect();
    if !pairs.iter().any(|(from, _)| m.contains_key(*from)) {
        return;
    }
    *m = std::mem::take(m)
        .into_iter()
        .map(|(k, v)| match pairs.iter().find(|(from, _)| *from == k) {
            Some((_, to)) => (to.to_string(), v),
            None => (k, v),
        })
        .collect();
}

/// Type meta only where the object had it: list items carry none.
fn set_type_meta(m: &mut Map<String, Value>, res: &ResourceDef) {
    if m.contains_key("apiVersion") {
        m.insert("apiVersion".into(), json!(res.api_version()));
    }
    if m.contains_key("kind") {
        m.insert("kind".into(), json!(res.kind));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events_v1() -> &'static ResourceDef {
        resources::find("events.k8s.io", "v1", "events").unwrap()
    }

    fn core_events() -> &'static ResourceDef {
        resources::find("", "v1", "events").unwrap()
    }

    /// What kube-rs's `Recorder` sends (trimmed).
    fn recorded() -> Value {
        json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": "web.1", "namespace": "demo"},
            "eventTime": "2026-12-04T10:00:00.000000Z",
            "action": "Program",
            "reason": "MapFull",
            "note": "services map is full",
            "type": "Warning",
            "regarding": {"kind": "Service", "name": "web", "namespace": "demo", "uid": "u1"},
            "reportingController": "weir-agent",
            "reportingInstance": "node-1",
            "series": {"count": 2, "lastObservedTime": "2026-12-04T10:00:05.000000Z"},
        })
    }

    #[test]
    fn an_events_v1_event_reads_back_through_core_with_upstreams_names() {
        let stored = to_storage(events_v1(), recorded());
        assert_eq!(stored["apiVersion"], "v1");
        assert_eq!(stored["involvedObject"]["name"], "web");
        assert_eq!(stored["message"], "services map is full");
        assert_eq!(stored["reportingComponent"], "weir-agent");
        assert_eq!(stored["series"]["count"], 2);
        assert!(stored.get("regarding").is_none() && stored.get("note").is_none());
        // The core view is the stored form itself.
        assert!(matches!(to_view(core_events(), &stored), Cow::Borrowed(_)));
        assert_eq!(*to_view(events_v1(), &stored), recorded());
    }

    #[test]
    fn a_core_event_reads_through_events_v1() {
        let core = json!({
            "metadata": {"name": "p.1", "namespace": "demo"},
            "involvedObject": {"kind": "Pod", "name": "p"},
            "message": "pulled", "source": {"component": "kubelet"},
            "firstTimestamp": "2026-12-04T10:00:00Z", "count": 3,
        });
        let view = to_view(events_v1(), &core);
        assert_eq!(view["regarding"]["name"], "p");
        assert_eq!(view["note"], "pulled");
        assert_eq!(view["deprecatedSource"]["component"], "kubelet");
        assert_eq!(view["deprecatedCount"], 3);
        assert!(
            view.get("kind").is_none(),
            "a list item stays without type meta"
        );
        assert_eq!(to_storage(events_v1(), view.into_owned()), core);
    }

    #[test]
    fn an_event_without_regarding_has_an_empty_involved_object() {
        let stored = to_storage(
            events_v1(),
            json!({"metadata": {"name": "x"}, "reason": "R"}),
        );
        assert_eq!(stored["involvedObject"], json!({}));
    }

    #[test]
    fn other_resources_are_their_own_storage() {
        let svc = resources::find("", "v1", "services").unwrap();
        let obj = json!({"metadata": {"name": "a"}, "message": "kept"});
        assert!(std::ptr::eq(storage(svc), svc));
        assert_eq!(to_storage(svc, obj.clone()), obj);
        assert!(matches!(to_view(svc, &obj), Cow::Borrowed(_)));
    }
}
