//! Fixture helpers for the controllers' table tests.
use serde_json::Value;

/// Deep-merges `extra` into `into` (objects key by key, anything else
/// replaced): a fixture plus the one field a case changes.
pub fn merge(into: &mut Value, extra: Value) {
    match (into, extra) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}
