//! What a cluster does for service accounts besides issuing tokens: the
//! controller-manager's serviceaccount controller (a `default` account in
//! every namespace) and root-ca-cert-publisher (`kube-root-ca.crt`), and
//! kube-apiserver's ServiceAccount admission plugin, which gives every new
//! pod an account and a projected token volume
//! (`plugin/pkg/admission/serviceaccount/admission.go`).
use serde_json::{Value, json};

use crate::{
    error::ApiError,
    resources::{self, ResourceDef},
    semantics,
    store::Inner,
    tokens::{self, service_accounts},
};

pub const DEFAULT: &str = "default";
pub const ROOT_CA: &str = "kube-root-ca.crt";
pub const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const VOLUME_PREFIX: &str = "kube-api-access-";
const MIRROR: &str = "kubernetes.io/config.mirror";
const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

fn configmaps() -> &'static ResourceDef {
    resources::find("", "v1", "configmaps").expect("served")
}

/// Adds what the two controllers keep in namespace `ns` when it is missing.
/// Upstream they do it moments after the namespace appears (a pod created
/// in between is refused for want of its account); here it is at once,
/// through the same store writes, so watches see the ADDED events.
pub fn populate(inner: &mut Inner, ns: &str) {
    if inner.get(service_accounts(), ns, DEFAULT).is_none() {
        let sa = json!({"metadata": {"name": DEFAULT}});
        if let Err(e) = semantics::create(inner, service_accounts(), ns, sa) {
            tracing::warn!("cannot create {ns}/{DEFAULT} service account: {e}");
        }
    }
    if inner.get(configmaps(), ns, ROOT_CA).is_none() {
        let cm = json!({
            "metadata": {"name": ROOT_CA, "annotations": {"kubernetes.io/description": DESCRIPTION}},
            "data": {"ca.crt": inner.root_ca()},
        });
        if let Err(e) = semantics::create(inner, configmaps(), ns, cm) {
            tracing::warn!("cannot create {ns}/{ROOT_CA} ConfigMap: {e}");
        }
    }
}

/// The controllers put their objects back when someone deletes them. (The
/// root CA publisher also reverts edits to the ConfigMap's data; that is not
/// done here.)
pub fn after_delete(inner: &mut Inner, res: &ResourceDef, ns: &str, name: &str) {
    let ours = (res.id() == service_accounts().id() && name == DEFAULT)
        || (res.id() == configmaps().id() && name == ROOT_CA);
    if ours && inner.namespace_exists(ns) {
        populate(inner, ns);
    }
}

fn forbidden(name: &str, reason: String) -> ApiError {
    ApiError::Forbidden {
        resource: "pods".into(),
        name: name.into(),
        reason,
    }
}

fn is_mirror(pod: &Value) -> bool {
    pod["metadata"]["annotations"].get(MIRROR).is_some()
}

fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(|l| spec.get(l).and_then(Value::as_array).into_iter().flatten())
}

/// The ServiceAccount admission plugin on pod CREATE (it leaves updates
/// alone).
pub fn admit_pod(inner: &Inner, ns: &str, name: &str, pod: &mut Value) -> Result<(), ApiError> {
    if !pod["spec"].is_object() {
        return Ok(());
    }
    // A kubelet's mirror of a static pod must stand alone: it is not
    // changed, and may not reach for API credentials.
    if is_mirror(pod) {
        return check_mirror(name, &pod["spec"]);
    }
    let spec = &mut pod["spec"];
    let account = spec["serviceAccountName"]
        .as_str()
        .filter(|s| !s.is_empty())
        .unwrap_or(DEFAULT)
        .to_string();
    spec["serviceAccountName"] = json!(account);
    spec["serviceAccount"] = json!(account);
    let Some(sa) = inner.get(service_accounts(), ns, &account) else {
        return Err(forbidden(
            name,
            format!(
                "error looking up service account {ns}/{account}: serviceaccount {account:?} not found"
            ),
        ));
    };
    // The pod's own setting wins over its account's.
    let automount = spec["automountServiceAccountToken"]
        .as_bool()
        .or_else(|| sa["automountServiceAccountToken"].as_bool())
        .unwrap_or(true);
    if automount {
        mount_token(spec);
    }
    let pull_secrets = spec["imagePullSecrets"]
        .as_array()
        .is_some_and(|s| !s.is_empty());
    if let Some(from_sa) = sa["imagePullSecrets"].as_array().filter(|s| !s.is_empty())
        && !pull_secrets
    {
        spec["imagePullSecrets"] =
            Value::Array(from_sa.iter().map(|s| json!({"name": s["name"]})).collect());
    }
    Ok(())
}

/// The projected volume upstream's `TokenVolumeSource` builds.
fn token_volume(name: &str) -> Value {
    json!({
        "name": name,
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": tokens::WARN_ONLY_EXPIRATION, "path": "token"}},
                {"configMap": {"name": ROOT_CA, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
            ],
        },
    })
}

/// Mounts the token volume in every container (not ephemeral ones, which a
/// create cannot carry) that has nothing at the token path yet, adding the
/// volume if one of them needed it and the pod has none of that name.
fn mount_token(spec: &mut Value) {
    let existing = spec["volumes"].as_array().and_then(|vs| {
        vs.iter()
            .filter_map(|v| v["name"].as_str())
            .find(|n| n.starts_with(VOLUME_PREFIX))
            .map(String::from)
    });
    let volume = existing
        .clone()
        .unwrap_or_else(|| format!("{VOLUME_PREFIX}{}", semantics::random_suffix()));
    let mount = json!({"name": volume, "readOnly": true, "mountPath": MOUNT_PATH});
    let mut needed = false;
    for list in ["initContainers", "containers"] {
        let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) else {
            continue;
        };
        for c in cs.iter_mut().filter(|c| c.is_object()) {
            let mounted = c["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["mountPath"] == MOUNT_PATH);
            if mounted {
                continue;
            }
            if !c["volumeMounts"].is_array() {
                c["volumeMounts"] = json!([]);
            }
            if let Some(ms) = c["volumeMounts"].as_array_mut() {
                ms.push(mount.clone());
                needed = true;
            }
        }
    }
    if existing.is_none() && needed {
        if !spec["volumes"].is_array() {
            spec["volumes"] = json!([]);
        }
        if let Some(vs) = spec["volumes"].as_array_mut() {
            vs.push(token_volume(&volume));
        }
    }
}

/// Upstream's checks of a mirror pod: no service account, no secrets, no
/// token projections.
fn check_mirror(name: &str, spec: &Value) -> Result<(), ApiError> {
    if spec["serviceAccountName"]
        .as_str()
        .is_some_and(|s| !s.is_empty())
    {
        return Err(forbidden(
            name,
            "a mirror pod may not reference service accounts".into(),
        ));
    }
    let volumes = spec["volumes"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    let projections = || {
        volumes
            .iter()
            .flat_map(|v| v["projected"]["sources"].as_array().into_iter().flatten())
    };
    let secret_in_env = containers(spec).any(|c| {
        let env = c["env"].as_array().into_iter().flatten();
        let env_from = c["envFrom"].as_array().into_iter().flatten();
        env.into_iter()
            .any(|e| !e["valueFrom"]["secretKeyRef"].is_null())
            || env_from.into_iter().any(|e| !e["secretRef"].is_null())
    });
    let secrets = secret_in_env
        || spec["imagePullSecrets"]
            .as_array()
            .is_some_and(|s| !s.is_empty())
        || volumes.iter().any(|v| !v["secret"].is_null())
        || projections().any(|p| !p["secret"].is_null());
    if secrets {
        return Err(forbidden(
            name,
            "a mirror pod may not reference secrets".into(),
        ));
    }
    if projections().any(|p| !p["serviceAccountToken"].is_null()) {
        return Err(forbidden(
            name,
            "a mirror pod may not use ServiceAccountToken volume projections".into(),
        ));
    }
    Ok(())
}
