//! `POST pods/{name}/eviction` and the PodDisruptionBudgets it honours, as
//! upstream's eviction REST (`pkg/registry/core/pod/storage/eviction.go`).
//! The server only reads and decrements a budget's `status`; computing it
//! (`disruptionsAllowed`, `currentHealthy`, …) is the disruption
//! controller's job, so a budget nobody has observed yet blocks evictions,
//! as it does upstream.
use serde_json::{Value, json};

use crate::{
    error::ApiError,
    pods,
    resources::{self, ResourceDef},
    selectors::LabelSelector,
    semantics::{self, DeleteOptions},
    store::Inner,
};

/// Upstream refuses to grow `status.disruptedPods` beyond this: evictions
/// the controller has not confirmed yet.
const MAX_DISRUPTED_PODS: usize = 2000;

const BLOCKED: &str = "Cannot evict pod as it would violate the pod's disruption budget.";

fn budgets() -> &'static ResourceDef {
    resources::find("policy", "v1", "poddisruptionbudgets").expect("served")
}

/// What an eviction does to a pod, decided from the pod and its budgets
/// alone (upstream's order of checks).
#[derive(Debug)]
pub enum Verdict {
    /// Delete it without touching a budget.
    Delete,
    /// Decrement this budget, then delete it.
    Spend(String),
    Refuse(ApiError),
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

/// The budgets of `pod` among `pdbs` (its namespace's): a null or empty
/// selector selects nothing here, unlike in the disruption controller.
fn selecting<'a>(pod: &Value, pdbs: &'a [Value]) -> Vec<&'a Value> {
    pdbs.iter()
        .filter(|pdb| {
            LabelSelector::from_object(&pdb["spec"]["selector"])
                .ok()
                .flatten()
                .is_some_and(|sel| !sel.is_empty() && sel.matches(pod))
        })
        .collect()
}

pub fn decide(pod: &Value, pdbs: &[Value]) -> Verdict {
    // Already disrupted, or not yet running: no budget to protect.
    let phase = pod["status"]["phase"].as_str().unwrap_or_default();
    if matches!(phase, "Succeeded" | "Failed" | "Pending")
        || !pod["metadata"]["deletionTimestamp"].is_null()
    {
        return Verdict::Delete;
    }
    let pdb = match selecting(pod, pdbs)[..] {
        [] => return Verdict::Delete,
        [pdb] => pdb,
        _ => {
            return Verdict::Refuse(ApiError::Internal(
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.".into(),
            ));
        }
    };
    let name = pdb["metadata"]["name"].as_str().unwrap_or_default();
    let (spec, status) = (&pdb["spec"], &pdb["status"]);
    if !is_ready(pod) {
        // An unready pod is not healthy, so evicting it costs the budget
        // nothing when the budget is met (IfHealthyBudget, the default).
        let always = spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow";
        let desired = int(&status["desiredHealthy"]);
        if always || (int(&status["currentHealthy"]) >= desired && desired > 0) {
            return Verdict::Delete;
        }
    }
    let blocked = |why: String| {
        Verdict::Refuse(ApiError::TooManyRequests {
            message: BLOCKED.into(),
            causes: vec![("DisruptionBudget".into(), why)],
        })
    };
    if int(&status["observedGeneration"]) < int(&pdb["metadata"]["generation"]) {
        return blocked(format!(
            "The disruption budget {name} is still being processed by the server."
        ));
    }
    let forbidden = |reason: &str| {
        Verdict::Refuse(ApiError::Forbidden {
            resource: "poddisruptionbudget.policy".into(),
            name: name.into(),
            reason: reason.into(),
        })
    };
    let allowed = int(&status["disruptionsAllowed"]);
    if allowed < 0 {
        return forbidden("pdb disruptions allowed is negative");
    }
    if status["disruptedPods"].as_object().map_or(0, |m| m.len()) > MAX_DISRUPTED_PODS {
        return forbidden(
            "DisruptedPods map too big - too many evictions not confirmed by PDB controller",
        );
    }
    if allowed == 0 {
        return blocked(format!(
            "The disruption budget {name} needs {} healthy pods and has {} currently",
            int(&status["desiredHealthy"]),
            int(&status["currentHealthy"])
        ));
    }
    Verdict::Spend(name.to_string())
}

/// The eviction's `deleteOptions`, checked against the URL.
fn parse(pods: &ResourceDef, name: &str, body: &Value) -> Result<DeleteOptions, ApiError> {
    if body["kind"].as_str().is_some_and(|k| k != "Eviction") {
        return Err(ApiError::BadRequest(format!(
            "expected an Eviction, got {}",
            body["kind"]
        )));
    }
    if body["metadata"]["name"].as_str().is_some_and(|n| n != name) {
        return Err(ApiError::BadRequest(
            "name in URL does not match name in Eviction object".into(),
        ));
    }
    let opts = &body["deleteOptions"];
    let grace_period = match &opts["gracePeriodSeconds"] {
        Value::Null => None,
        g => Some(g.as_i64().ok_or_else(|| {
            ApiError::invalid(
                pods,
                name,
                "deleteOptions.gracePeriodSeconds",
                "not an integer",
            )
        })?),
    };
    let text = |p: &str| opts.pointer(p).and_then(Value::as_str).map(String::from);
    Ok(DeleteOptions {
        grace_period,
        uid: text("/preconditions/uid"),
        resource_version: text("/preconditions/resourceVersion"),
    })
}

/// Evicts a pod: checks, spends its budget, marks it `DisruptionTarget`,
/// deletes it (gracefully, as a delete would). Returns the 201 Status.
pub fn evict(
    inner: &mut Inner,
    pods: &'static ResourceDef,
    ns: &str,
    name: &str,
    body: &Value,
) -> Result<Value, ApiError> {
    let opts = parse(pods, name, body)?;
    let pod = inner
        .get(pods, ns, name)
        .map(std::borrow::Cow::into_owned)
        .ok_or_else(|| ApiError::not_found(pods, name))?;
    // Preconditions first: a failed delete must not have spent the budget.
    let meta = &pod["metadata"];
    if opts
        .uid
        .as_ref()
        .is_some_and(|u| meta["uid"].as_str() != Some(u))
        || opts
            .resource_version
            .as_ref()
            .is_some_and(|rv| meta["resourceVersion"].as_str() != Some(rv))
    {
        return Err(ApiError::conflict(
            pods,
            name,
            "Precondition failed: the pod's UID or resourceVersion does not match",
        ));
    }
    let pdbs: Vec<Value> = inner
        .list(budgets(), Some(ns), None)
        .map(|(_, v)| v.into_owned())
        .collect();
    match decide(&pod, &pdbs) {
        Verdict::Refuse(e) => return Err(e),
        Verdict::Spend(pdb) => spend(inner, ns, &pdb, name)?,
        Verdict::Delete => {}
    }
    if pod["metadata"]["deletionTimestamp"].is_null() {
        mark_disrupted(inner, pods, ns, name, pod)?;
    }
    let opts = DeleteOptions {
        uid: None,
        resource_version: None,
        ..opts
    };
    semantics::delete(inner, pods, ns, name, &opts)?;
    Ok(
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    )
}

/// Takes one disruption from the budget and records the pod as disrupted,
/// so the controller does not count it healthy while it terminates.
fn spend(inner: &mut Inner, ns: &str, pdb: &str, pod: &str) -> Result<(), ApiError> {
    let res = budgets();
    let mut obj = inner
        .get(res, ns, pdb)
        .map(std::borrow::Cow::into_owned)
        .ok_or_else(|| ApiError::not_found(res, pdb))?;
    let generation = obj["metadata"]["generation"].clone();
    let status = &mut obj["status"];
    let left = int(&status["disruptionsAllowed"]) - 1;
    status["disruptionsAllowed"] = json!(left);
    status["disruptedPods"][pod] = json!(semantics::now());
    if left == 0 {
        pods::set_condition(
            status,
            json!({"type": "DisruptionAllowed", "status": "False", "reason": "InsufficientPods",
                   "message": "", "observedGeneration": generation}),
        );
    }
    semantics::update(inner, res, ns, pdb, obj, true)?;
    Ok(())
}

fn mark_disrupted(
    inner: &mut Inner,
    pods: &'static ResourceDef,
    ns: &str,
    name: &str,
    mut pod: Value,
) -> Result<(), ApiError> {
    pods::set_condition(
        &mut pod["status"],
        json!({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
               "message": "Eviction API: evicting"}),
    );
    semantics::update(inner, pods, ns, name, pod, true)?;
    Ok(())
}

/// Checks a budget on create and update, as upstream's validation does.
pub fn validate_budget(res: &ResourceDef, name: &str, pdb: &Value) -> Result<(), ApiError> {
    let spec = &pdb["spec"];
    if !spec["minAvailable"].is_null() && !spec["maxUnavailable"].is_null() {
        return Err(ApiError::invalid(
            res,
            name,
            "spec",
            "Invalid value: minAvailable and maxUnavailable cannot be both set",
        ));
    }
    LabelSelector::from_object(&spec["selector"]).map_err(|e| {
        ApiError::invalid(res, name, "spec.selector", format!("Invalid value: {e}"))
    })?;
    match spec["unhealthyPodEvictionPolicy"].as_str() {
        None | Some("IfHealthyBudget" | "AlwaysAllow") => Ok(()),
        Some(other) => Err(ApiError::invalid(
            res,
            name,
            "spec.unhealthyPodEvictionPolicy",
            format!(
                "Unsupported value: {other:?}: supported values: \"AlwaysAllow\", \"IfHealthyBudget\""
            ),
        )),
    }
}

#[cfg(test)]
mod tests;
