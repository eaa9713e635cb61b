//! apps/v1 workloads (Deployments, ReplicaSets, DaemonSets): upstream's
//! defaults and the validation users meet, and the `/scale` subresource
//! that `kubectl scale` writes through. Nothing here runs them; that is the
//! test control plane's controllers' job.
use serde_json::{Value, json};

use crate::{
    error::ApiError,
    patch::{self, PatchType},
    pods,
    resources::ResourceDef,
    selectors::LabelSelector,
    semantics,
    store::Inner,
};

/// Whether `res` has a `/scale` subresource (autoscaling/v1 Scale).
pub fn has_scale(res: &ResourceDef) -> bool {
    res.group == "apps" && matches!(res.plural, "deployments" | "replicasets")
}

/// Upstream's `SetDefaults_Deployment`, `_ReplicaSet`, `_DaemonSet`, plus the
/// pod-spec defaults of the template.
pub fn defaults(res: &ResourceDef, obj: &mut Value) {
    let spec = &mut obj["spec"];
    if !spec.is_object() {
        return;
    }
    let mut set = |k: &str, v: Value| {
        if spec[k].is_null() {
            spec[k] = v;
        }
    };
    match res.plural {
        "deployments" => {
            set("replicas", json!(1));
            set("revisionHistoryLimit", json!(10));
            set("progressDeadlineSeconds", json!(600));
            // `strategy: {}` (what `kubectl create deployment` sends) too.
            if spec["strategy"]["type"]
                .as_str()
                .unwrap_or_default()
                .is_empty()
            {
                spec["strategy"]["type"] = json!("RollingUpdate");
            }
            if spec["strategy"]["type"] == "RollingUpdate" {
                let ru = &mut spec["strategy"]["rollingUpdate"];
                for k in ["maxUnavailable", "maxSurge"] {
                    if ru[k].is_null() {
                        ru[k] = json!("25%");
                    }
                }
            }
        }
        "replicasets" => set("replicas", json!(1)),
        "daemonsets" => {
            set("revisionHistoryLimit", json!(10));
            if spec["updateStrategy"]["type"]
                .as_str()
                .unwrap_or_default()
                .is_empty()
            {
                spec["updateStrategy"]["type"] = json!("RollingUpdate");
            }
            if spec["updateStrategy"]["type"] == "RollingUpdate" {
                let ru = &mut spec["updateStrategy"]["rollingUpdate"];
                for (k, v) in [("maxUnavailable", json!(1)), ("maxSurge", json!(0))] {
                    if ru[k].is_null() {
                        ru[k] = v;
                    }
                }
            }
        }
        _ => return,
    }
    // Pod-spec defaults apply to templates; `priority` comes from admission
    // on real pods only.
    let template = &mut spec["template"];
    if template["spec"].is_object() {
        let had_priority = !template["spec"]["priority"].is_null();
        pods::defaults(template);
        if !had_priority && let Some(s) = template["spec"].as_object_mut() {
            s.remove("priority");
        }
    }
}

/// The selector is required, non-empty, selects the template, and cannot
/// change (apps/v1).
pub fn validate(
    res: &ResourceDef,
    name: &str,
    obj: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    let selector = &obj["spec"]["selector"];
    let invalid = |field: &str, why: String| ApiError::invalid(res, name, field, why);
    let parsed = LabelSelector::from_object(selector)
        .map_err(|e| invalid("spec.selector", format!("Invalid value: {e}")))?;
    let Some(sel) = parsed.filter(|s| !s.is_empty()) else {
        return Err(invalid(
            "spec.selector",
            format!(
                "Invalid value: {selector}: empty selector is invalid for {}",
                res.singular
            ),
        ));
    };
    if !sel.matches(&obj["spec"]["template"]) {
        return Err(invalid(
            "spec.template.metadata.labels",
            format!(
                "Invalid value: {}: `selector` does not match template `labels`",
                obj["spec"]["template"]["metadata"]["labels"]
            ),
        ));
    }
    if let Some(old) = old
        && old["spec"]["selector"] != *selector
    {
        return Err(invalid(
            "spec.selector",
            format!("Invalid value: {selector}: field is immutable"),
        ));
    }
    if obj["spec"]["replicas"].as_i64().is_some_and(|r| r < 0) {
        return Err(invalid(
            "spec.replicas",
            "Invalid value: must be greater than or equal to 0".into(),
        ));
    }
    let containers = &obj["spec"]["template"]["spec"]["containers"];
    if containers.as_array().is_none_or(Vec::is_empty) {
        return Err(invalid(
            "spec.template.spec.containers",
            "Required value".into(),
        ));
    }
    Ok(())
}

/// The autoscaling/v1 Scale of a workload: `status.selector` is the
/// selector as a string, which is what an HPA or `kubectl scale` read.
pub fn scale_of(obj: &Value) -> Value {
    let m = &obj["metadata"];
    let mut terms: Vec<String> = obj["spec"]["selector"]["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    for e in obj["spec"]["selector"]["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let key = e["key"].as_str().unwrap_or_default();
        let values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        terms.push(match e["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "DoesNotExist" => format!("!{key}"),
            _ => key.to_string(),
        });
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": m["name"], "namespace": m["namespace"], "uid": m["uid"],
            "resourceVersion": m["resourceVersion"], "creationTimestamp": m["creationTimestamp"],
        },
        "spec": {"replicas": obj["spec"]["replicas"]},
        "status": {"replicas": obj["status"]["replicas"].as_i64().unwrap_or(0), "selector": terms.join(",")},
    })
}

/// How a Scale is written: replaced (PUT) or patched.
pub enum ScaleWrite<'a> {
    Replace(&'a Value),
    Patch(PatchType, &'a Value),
}

/// Writes `spec.replicas` through the Scale; a resourceVersion in the new
/// Scale is a precondition on the workload, as upstream.
pub fn write_scale(
    inner: &mut Inner,
    res: &'static ResourceDef,
    ns: &str,
    name: &str,
    write: ScaleWrite<'_>,
) -> Result<Value, ApiError> {
    let current = inner
        .get(res, ns, name)
        .map(std::borrow::Cow::into_owned)
        .ok_or_else(|| ApiError::not_found(res, name))?;
    let scale = scale_of(&current);
    let new = match write {
        ScaleWrite::Replace(body) => body.clone(),
        ScaleWrite::Patch(PatchType::Apply, _) => {
            return Err(ApiError::BadRequest(
                "apply patches are not supported on the scale subresource here".into(),
            ));
        }
        ScaleWrite::Patch(kind, body) => patch::apply(kind, &scale, body)?,
    };
    let replicas = new["spec"]["replicas"]
        .as_i64()
        .ok_or_else(|| ApiError::invalid(res, name, "spec.replicas", "Required value"))?;
    if replicas < 0 {
        return Err(ApiError::invalid(
            res,
            name,
            "spec.replicas",
            "Invalid value: must be greater than or equal to 0",
        ));
    }
    let mut updated = current;
    updated["spec"]["replicas"] = json!(replicas);
    match new["metadata"]["resourceVersion"].as_str() {
        Some(rv) if !rv.is_empty() => updated["metadata"]["resourceVersion"] = json!(rv),
        _ => {}
    }
    let written = semantics::update(inner, res, ns, name, updated, false)?;
    Ok(scale_of(&written))
}

#[cfg(test)]
mod tests;
