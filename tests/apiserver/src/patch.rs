//! The four patch types the API server accepts.
//!
//! Strategic merge uses a small table of list merge keys instead of the OpenAPI
//! extensions; it covers the core kinds Weir writes. Lists not in the table are
//! atomic, as they are for any field without `x-kubernetes-patch-strategy`.
use serde_json::{Map, Value};

use crate::error::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        match ct.split(';').next().unwrap_or_default().trim() {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// Parses a patch body: JSON for all types, YAML too for apply.
pub fn parse_body(kind: PatchType, body: &[u8]) -> Result<Value, ApiError> {
    match serde_json::from_slice(body) {
        Ok(v) => Ok(v),
        Err(json_err) if kind == PatchType::Apply => serde_saphyr::from_slice(body)
            .map_err(|e| ApiError::BadRequest(format!("error decoding YAML: {e} ({json_err})"))),
        Err(e) => Err(ApiError::BadRequest(format!("error decoding patch: {e}"))),
    }
}

/// Applies `patch` to `doc`; Apply is handled as a strategic merge by the caller.
pub fn apply(kind: PatchType, doc: &Value, patch: &Value) -> Result<Value, ApiError> {
    let mut out = doc.clone();
    match kind {
        PatchType::Merge => {
            if !patch.is_object() {
                return Err(ApiError::BadRequest(
                    "merge patch must be a JSON object".into(),
                ));
            }
            json_patch::merge(&mut out, patch);
        }
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::BadRequest(format!("invalid JSON patch: {e}")))?;
            json_patch::patch(&mut out, &ops).map_err(|e| {
                ApiError::BadRequest(format!(
                    "the server rejected our request due to an error in our request: {e}"
                ))
            })?;
        }
        PatchType::Strategic | PatchType::Apply => {
            let Value::Object(p) = patch else {
                return Err(ApiError::BadRequest(
                    "strategic merge patch must be a JSON object".into(),
                ));
            };
            let Value::Object(o) = &mut out else {
                return Err(ApiError::BadRequest("object is not a JSON object".into()));
            };
            merge_map(o, p, &mut Vec::new())?;
        }
    }
    Ok(out)
}

/// How a list field merges, from `patchStrategy`/`patchMergeKey` in the Go types.
#[derive(Debug, PartialEq)]
enum ListStrategy {
    /// Maps merged by this key.
    ByKey(&'static str),
    /// A list of scalars merged as a set (`patchStrategy:"merge"` on `[]string`).
    Set,
    Atomic,
}

/// `path` holds the field names from the root to the list (no indices).
fn strategy(path: &[String]) -> ListStrategy {
    let field = path.last().map(String::as_str).unwrap_or_default();
    let parent = path
        .len()
        .checked_sub(2)
        .and_then(|i| path.get(i))
        .map(String::as_str)
        .unwrap_or_default();
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates" => ListStrategy::ByKey("name"),
        "ports"
            if matches!(
                parent,
                "containers" | "initContainers" | "ephemeralContainers"
            ) =>
        {
            ListStrategy::ByKey("containerPort")
        }
        "ports" if parent == "spec" => ListStrategy::ByKey("port"),
        "volumeMounts" => ListStrategy::ByKey("mountPath"),
        "volumeDevices" => ListStrategy::ByKey("devicePath"),
        "conditions" | "addresses" if parent == "status" => ListStrategy::ByKey("type"),
        "podIPs" | "hostIPs" => ListStrategy::ByKey("ip"),
        "hostAliases" => ListStrategy::ByKey("ip"),
        "topologySpreadConstraints" => ListStrategy::ByKey("topologyKey"),
        "ownerReferences" => ListStrategy::ByKey("uid"),
        "finalizers" if parent == "metadata" => ListStrategy::Set,
        "podCIDRs" => ListStrategy::Set,
        _ => ListStrategy::Atomic,
    }
}

fn merge_map(
    orig: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    path: &mut Vec<String>,
) -> Result<(), ApiError> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *orig = strip(patch);
            return Ok(());
        }
        Some("delete") => {
            orig.clear();
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "Unknown patch type: {other:?}"
            )));
        }
    }
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(gone)) = (orig.get_mut(field), v) {
                list.retain(|x| !gone.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        path.push(k.clone());
        match (orig.get_mut(k), v) {
            (_, Value::Null) => {
                orig.remove(k);
            }
            (Some(Value::Object(o)), Value::Object(p)) => {
                if p.get("$patch").and_then(Value::as_str) == Some("delete") {
                    orig.remove(k);
                } else {
                    merge_map(o, p, path)?;
                }
            }
            (Some(Value::Array(o)), Value::Array(p)) => {
                merge_list(o, p, path)?;
                // Deleting the last item leaves no list, as Go's omitempty
                // serialization of the real object would.
                let only_deletes = p.iter().all(|e| e.get("$patch").is_some());
                if o.is_empty() && only_deletes && !p.is_empty() {
                    orig.remove(k);
                }
            }
            (_, v) => {
                orig.insert(k.clone(), strip_value(v));
            }
        }
        path.pop();
    }
    if let Some(Value::Array(keep)) = patch.get("$retainKeys") {
        orig.retain(|k, _| keep.iter().any(|x| x.as_str() == Some(k)));
    }
    Ok(())
}

fn merge_list(
    orig: &mut Vec<Value>,
    patch: &[Value],
    path: &mut Vec<String>,
) -> Result<(), ApiError> {
    let replace = patch
        .iter()
        .any(|e| e.get("$patch").and_then(Value::as_str) == Some("replace"));
    if replace {
        *orig = patch
            .iter()
            .filter(|e| e.get("$patch").is_none())
            .map(strip_value)
            .collect();
        return Ok(());
    }
    match strategy(path) {
        ListStrategy::Atomic => *orig = patch.iter().map(strip_value).collect(),
        ListStrategy::Set => {
            for v in patch {
                if !orig.contains(v) {
                    orig.push(v.clone());
                }
            }
        }
        ListStrategy::ByKey(key) => {
            for p in patch {
                let Value::Object(pm) = p else {
                    return Err(ApiError::BadRequest(format!(
                        "list {} merges by {key:?}; its elements must be objects",
                        path.join(".")
                    )));
                };
                let id = pm.get(key);
                let pos = orig.iter().position(|o| o.get(key) == id && id.is_some());
                let delete = pm.get("$patch").and_then(Value::as_str) == Some("delete");
                match (pos, delete) {
                    (Some(i), true) => {
                        orig.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => {
                        if let Value::Object(om) = &mut orig[i] {
                            merge_map(om, pm, path)?;
                        }
                    }
                    (None, false) => orig.push(Value::Object(strip(pm))),
                }
            }
        }
    }
    Ok(())
}

/// Turns an apply configuration into a strategic patch that also removes what
/// the same manager applied last time and has now dropped: the part of
/// server-side apply's field ownership that clients notice most.
pub fn with_removals(previous: &Value, applied: &Value) -> Value {
    match (previous, applied) {
        (Value::Object(p), Value::Object(a)) => Value::Object(map_removals(p, a, &mut Vec::new())),
        _ => applied.clone(),
    }
}

fn map_removals(
    prev: &Map<String, Value>,
    applied: &Map<String, Value>,
    path: &mut Vec<String>,
) -> Map<String, Value> {
    let mut out = applied.clone();
    for (k, pv) in prev {
        if matches!(k.as_str(), "apiVersion" | "kind") {
            continue;
        }
        path.push(k.clone());
        match (pv, applied.get(k)) {
            // Only the fields this manager set go; others' fields in the same
            // map or keyed list stay.
            (Value::Object(pm), None) => {
                out.insert(
                    k.clone(),
                    Value::Object(map_removals(pm, &Map::new(), path)),
                );
            }
            (Value::Array(_), None) if matches!(strategy(path), ListStrategy::ByKey(_)) => {
                let list = list_removals(pv, &[], path);
                out.insert(k.clone(), Value::Array(list));
            }
            (_, None) => {
                out.insert(k.clone(), Value::Null);
            }
            (Value::Object(pm), Some(Value::Object(am))) => {
                out.insert(k.clone(), Value::Object(map_removals(pm, am, path)));
            }
            (Value::Array(_), Some(Value::Array(al))) => {
                if matches!(strategy(path), ListStrategy::ByKey(_)) {
                    out.insert(k.clone(), Value::Array(list_removals(pv, al, path)));
                }
            }
            _ => {}
        }
        path.pop();
    }
    out
}

/// A keyed list as applied now, with delete directives for the items applied
/// last time and dropped since.
fn list_removals(prev: &Value, applied: &[Value], path: &mut Vec<String>) -> Vec<Value> {
    let ListStrategy::ByKey(key) = strategy(path) else {
        return applied.to_vec();
    };
    let prev = prev.as_array().map(Vec::as_slice).unwrap_or_default();
    let mut list = Vec::new();
    for a in applied {
        let before = prev
            .iter()
            .find(|p| p.get(key).is_some() && p.get(key) == a.get(key));
        match (before, a) {
            (Some(Value::Object(pm)), Value::Object(am)) => {
                list.push(Value::Object(map_removals(pm, am, path)));
            }
            _ => list.push(a.clone()),
        }
    }
    for p in prev {
        if let Some(id) = p.get(key)
            && !applied.iter().any(|a| a.get(key) == Some(id))
        {
            list.push(serde_json::json!({key: id, "$patch": "delete"}));
        }
    }
    list
}

/// Drops patch directives from a value that is inserted as a whole.
fn strip_value(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(strip(m)),
        Value::Array(a) => Value::Array(a.iter().map(strip_value).collect()),
        other => other.clone(),
    }
}

fn strip(m: &Map<String, Value>) -> Map<String, Value> {
    m.iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .map(|(k, v)| (k.clone(), strip_value(v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn strategic_merges_containers_by_name_and_conditions_by_type() {
        let pod = json!({
            "spec": {"containers": [
                {"name": "a", "image": "a:1", "ports": [{"containerPort": 80}]},
                {"name": "b", "image": "b:1"}
            ], "tolerations": [{"key": "x"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "Initialized", "status": "True"}]}
        });
        let patch = json!({
            "spec": {"containers": [
                {"name": "a", "image": "a:2", "ports": [{"containerPort": 81}]},
                {"name": "b", "$patch": "delete"},
                {"name": "c", "image": "c:1"}
            ], "tolerations": [{"key": "y"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        });
        let out = apply(PatchType::Strategic, &pod, &patch).unwrap();
        assert_eq!(
            out,
            json!({
                "spec": {"containers": [
                    {"name": "a", "image": "a:2", "ports": [{"containerPort": 80}, {"containerPort": 81}]},
                    {"name": "c", "image": "c:1"}
                ], "tolerations": [{"key": "y"}]},
                "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "Initialized", "status": "True"}]}
            })
        );
    }

    #[test]
    fn strategic_directives() {
        let doc = json!({"metadata": {"finalizers": ["a", "b"], "labels": {"x": "1", "y": "2"}},
                         "spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"], "finalizers": ["c"],
                                        "labels": {"$patch": "replace", "z": "3"}},
                           "spec": {"containers": [{"name": "q"}, {"$patch": "replace"}]}});
        let out = apply(PatchType::Strategic, &doc, &patch).unwrap();
        assert_eq!(
            out,
            json!({"metadata": {"finalizers": ["b", "c"], "labels": {"z": "3"}},
                   "spec": {"containers": [{"name": "q"}]}})
        );
    }

    #[test]
    fn apply_removes_what_the_manager_dropped() {
        let prev = json!({"metadata": {"labels": {"a": "1", "b": "2"}},
                          "spec": {"containers": [{"name": "x", "image": "i", "env": [{"name": "E"}]}, {"name": "y"}]}});
        let now = json!({"metadata": {"labels": {"a": "1"}},
                         "spec": {"containers": [{"name": "x", "image": "i"}]}});
        let live = json!({"metadata": {"labels": {"a": "1", "b": "2", "other": "kept"}},
                          "spec": {"containers": [{"name": "x", "image": "i", "env": [{"name": "E"}]}, {"name": "y"}]}});
        let out = apply(PatchType::Strategic, &live, &with_removals(&prev, &now)).unwrap();
        assert_eq!(
            out,
            json!({"metadata": {"labels": {"a": "1", "other": "kept"}},
                   "spec": {"containers": [{"name": "x", "image": "i"}]}})
        );
    }

    #[test]
    fn merge_and_json_patch() {
        let doc = json!({"a": {"b": 1, "c": [1, 2]}});
        let out = apply(PatchType::Merge, &doc, &json!({"a": {"b": null, "c": [3]}})).unwrap();
        assert_eq!(out, json!({"a": {"c": [3]}}));
        let out = apply(
            PatchType::Json,
            &doc,
            &json!([{"op": "add", "path": "/a/c/-", "value": 9}, {"op": "test", "path": "/a/b", "value": 1}]),
        )
        .unwrap();
        assert_eq!(out, json!({"a": {"b": 1, "c": [1, 2, 9]}}));
        assert!(
            apply(
                PatchType::Json,
                &doc,
                &json!([{"op": "test", "path": "/a/b", "value": 2}])
            )
            .is_err()
        );
    }
}
