//! Pod rules: defaulting, which spec fields an update may change, and binding.
use serde_json::{Value, json};

use crate::{error::ApiError, resources::ResourceDef, store::Inner};

pub fn has_resources(pod: &Value) -> bool {
    pod.pointer("/spec/containers")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["resources"].as_object().is_some_and(|r| !r.is_empty()))
        })
}

/// The DefaultTolerationSeconds admission plugin, on by default upstream:
/// a pod that does not tolerate a node being not-ready or unreachable gets
/// 300 s of each, after which the node lifecycle controller evicts it.
pub fn admit(pod: &mut Value) {
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        let tolerated = pod["spec"]["tolerations"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| {
                let effect = t["effect"].as_str().unwrap_or_default();
                let t_key = t["key"].as_str().unwrap_or_default();
                (effect.is_empty() || effect == "NoExecute")
                    && (t_key == key || (t_key.is_empty() && t["operator"] == "Exists"))
            });
        if tolerated || !pod["spec"].is_object() {
            continue;
        }
        if !pod["spec"]["tolerations"].is_array() {
            pod["spec"]["tolerations"] = json!([]);
        }
        if let Some(list) = pod["spec"]["tolerations"].as_array_mut() {
            list.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
        }
    }
}

pub fn defaults(pod: &mut Value) {
    if !pod["spec"].is_object() {
        return;
    }
    let spec = pod["spec"].as_object_mut().expect("checked");
    for (k, v) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("dnsPolicy", json!("ClusterFirst")),
        ("schedulerName", json!("default-scheduler")),
        ("securityContext", json!({})),
        ("enableServiceLinks", json!(true)),
        ("priority", json!(0)),
    ] {
        spec.entry(k).or_insert(v);
    }
    // v1's deprecated alias: read when the real field is empty, always
    // written back equal to it (upstream's conversion does both).
    let alias = spec
        .get("serviceAccount")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let account = match spec.get("serviceAccountName").and_then(Value::as_str) {
        Some(a) if !a.is_empty() => a.to_string(),
        _ => alias,
    };
    if !account.is_empty() {
        spec.insert("serviceAccountName".into(), json!(account));
        spec.insert("serviceAccount".into(), json!(account));
    }
    for list in ["initContainers", "containers"] {
        for c in spec
            .get_mut(list)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let Some(c) = c.as_object_mut() else { continue };
            let image = c.get("image").and_then(Value::as_str).unwrap_or_default();
            let tag = image.rsplit('/').next().unwrap_or_default();
            let latest = !tag.contains(':') || tag.ends_with(":latest");
            let pull = if latest && !image.contains('@') {
                "Always"
            } else {
                "IfNotPresent"
            };
            c.entry("imagePullPolicy").or_insert(json!(pull));
            c.entry("terminationMessagePath")
                .or_insert(json!("/dev/termination-log"));
            c.entry("terminationMessagePolicy").or_insert(json!("File"));
            c.entry("resources").or_insert(json!({}));
            for p in c
                .get_mut("ports")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if p["protocol"].is_null() {
                    p["protocol"] = json!("TCP");
                }
            }
        }
    }
}

/// The checks of upstream pod validation that tests trip over most.
pub fn validate(res: &ResourceDef, name: &str, pod: &Value) -> Result<(), ApiError> {
    let containers = pod.pointer("/spec/containers").and_then(Value::as_array);
    let Some(containers) = containers.filter(|c| !c.is_empty()) else {
        return Err(ApiError::invalid(
            res,
            name,
            "spec.containers",
            "Required value",
        ));
    };
    for (i, c) in containers.iter().enumerate() {
        for field in ["name", "image"] {
            if c[field].as_str().unwrap_or_default().is_empty() {
                return Err(ApiError::invalid(
                    res,
                    name,
                    &format!("spec.containers[{i}].{field}"),
                    "Required value",
                ));
            }
        }
    }
    Ok(())
}

const IMMUTABLE: &str = "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)";

/// Rejects spec changes the real validation rejects: only images, the
/// deadline, the grace period, added tolerations and removed scheduling gates
/// may change.
pub fn check_update(
    res: &ResourceDef,
    name: &str,
    old: &Value,
    new: &Value,
) -> Result<(), ApiError> {
    let (a, mut b) = (&old["spec"], new["spec"].clone());
    if b.is_null() {
        return Ok(());
    }
    for list in ["containers", "initContainers"] {
        let (Some(olds), Some(news)) = (a[list].as_array(), b[list].as_array_mut()) else {
            continue;
        };
        if olds.len() == news.len() {
            for (o, n) in olds.iter().zip(news.iter_mut()) {
                n["image"] = o["image"].clone();
            }
        }
    }
    for field in ["activeDeadlineSeconds", "terminationGracePeriodSeconds"] {
        b[field] = a[field].clone();
    }
    let subset = |small: &Value, big: &Value| {
        let big = big.as_array().cloned().unwrap_or_default();
        small
            .as_array()
            .into_iter()
            .flatten()
            .all(|x| big.contains(x))
    };
    if subset(&a["tolerations"], &b["tolerations"]) {
        b["tolerations"] = a["tolerations"].clone();
    }
    if subset(&b["schedulingGates"], &a["schedulingGates"]) {
        b["schedulingGates"] = a["schedulingGates"].clone();
    }
    // Normalize absent vs null so that copying an absent field is a no-op.
    let strip = |v: &Value| match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    };
    if strip(a) == strip(&b) {
        Ok(())
    } else {
        Err(ApiError::invalid(res, name, "spec", IMMUTABLE))
    }
}

/// `POST pods/{name}/binding`: what the scheduler does to put a pod on a node.
pub fn bind(
    inner: &mut Inner,
    res: &'static ResourceDef,
    ns: &str,
    name: &str,
    binding: &Value,
) -> Result<Value, ApiError> {
    let node = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ApiError::invalid(res, name, "target.name", "Required value"))?;
    let mut pod = inner
        .get(res, ns, name)
        .map(std::borrow::Cow::into_owned)
        .ok_or_else(|| ApiError::not_found(res, name))?;
    if let Some(current) = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
    {
        return Err(ApiError::conflict(
            res,
            name,
            format!("pod {name} is already assigned to node {current:?}"),
        ));
    }
    if !pod["metadata"]["deletionTimestamp"].is_null() {
        return Err(ApiError::conflict(
            res,
            name,
            format!("pod {name} is being deleted, cannot be assigned to a host"),
        ));
    }
    pod["spec"]["nodeName"] = json!(node);
    // As upstream's binding does: `kubectl describe pod` shows it.
    set_condition(
        &mut pod["status"],
        json!({"type": "PodScheduled", "status": "True"}),
    );
    inner.put(res, ns, name, pod);
    Ok(
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    )
}

/// Replaces the condition of the same type, keeping its transition time
/// when the status did not change.
pub fn set_condition(status: &mut Value, mut cond: Value) {
    if !status["conditions"].is_array() {
        status["conditions"] = json!([]);
    }
    let conds = status["conditions"].as_array_mut().expect("set above");
    let old = conds.iter().position(|c| c["type"] == cond["type"]);
    cond["lastTransitionTime"] = match old.map(|i| &conds[i]) {
        Some(c) if c["status"] == cond["status"] => c["lastTransitionTime"].clone(),
        _ => json!(crate::semantics::now()),
    };
    match old {
        Some(i) => conds[i] = cond,
        None => conds.push(cond),
    }
}
