//! What create, update, patch and delete do to objects: metadata the server
//! owns, per-kind defaulting, optimistic concurrency, the status subresource,
//! finalizers and graceful pod deletion.
use serde_json::{Value, json};

use crate::{
    error::ApiError,
    patch::{self, PatchType},
    pods,
    resources::{self, ResourceDef},
    serviceaccounts, services,
    store::Inner,
};

pub fn now() -> String {
    timestamp(jiff::Timestamp::now())
}

/// RFC 3339 in UTC with seconds, as `metav1.Time` marshals.
pub fn timestamp(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn meta(obj: &Value) -> &Value {
    &obj["metadata"]
}

pub fn name_of(obj: &Value) -> &str {
    meta(obj)["name"].as_str().unwrap_or_default()
}

pub fn random_suffix() -> String {
    // The alphabet of apimachinery's rand.String: no vowels, no look-alikes.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4().as_bytes()[..5]
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

/// Checks the object's kind/apiVersion/namespace against the request and
/// returns it as a map with canonical type meta.
fn check_body(res: &ResourceDef, ns: &str, mut obj: Value) -> Result<Value, ApiError> {
    if !obj.is_object() {
        return Err(ApiError::BadRequest(
            "the body must be a JSON object".into(),
        ));
    }
    if let Some(kind) = obj["kind"].as_str()
        && kind != res.kind
    {
        return Err(ApiError::BadRequest(format!(
            "the API version in the data ({}) does not match the expected API version ({})",
            obj["apiVersion"].as_str().unwrap_or_default(),
            res.api_version()
        )));
    }
    obj["kind"] = json!(res.kind);
    obj["apiVersion"] = json!(res.api_version());
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    let body_ns = obj["metadata"]["namespace"].as_str().unwrap_or_default();
    if res.namespaced {
        if !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::BadRequest(
                "the namespace of the provided object does not match the namespace sent on the request".into(),
            ));
        }
        obj["metadata"]["namespace"] = json!(ns);
    } else if let Some(m) = obj["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    Ok(obj)
}

pub fn create(
    inner: &mut Inner,
    res: &'static ResourceDef,
    ns: &str,
    obj: Value,
) -> Result<Value, ApiError> {
    let mut obj = check_body(res, ns, obj)?;
    if obj["metadata"]["resourceVersion"]
        .as_str()
        .is_some_and(|rv| !rv.is_empty())
    {
        return Err(ApiError::BadRequest(
            "resourceVersion should not be set on objects to be created".into(),
        ));
    }
    if res.namespaced && !inner.namespace_exists(ns) {
        return Err(ApiError::namespace_not_found(ns));
    }
    let mut name = name_of(&obj).to_string();
    if name.is_empty() {
        let prefix = obj["metadata"]["generateName"].as_str().unwrap_or_default();
        if prefix.is_empty() {
            return Err(ApiError::invalid(
                res,
                "",
                "metadata.name",
                "Required value: name or generateName is required",
            ));
        }
        name = format!("{prefix}{}", random_suffix());
        obj["metadata"]["name"] = json!(name);
    }
    validate_name(res, &name)?;
    if res.id() == "discovery.k8s.io/endpointslices"
        && !matches!(obj["addressType"].as_str(), Some("IPv4" | "IPv6" | "FQDN"))
    {
        return Err(ApiError::invalid(
            res,
            &name,
            "addressType",
            "Unsupported value: supported values: \"FQDN\", \"IPv4\", \"IPv6\"",
        ));
    }
    if inner.get(res, ns, &name).is_some() {
        return Err(ApiError::already_exists(res, &name));
    }
    let m = obj["metadata"].as_object_mut().expect("checked above");
    for owned in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "resourceVersion",
        "managedFields",
        "selfLink",
    ] {
        m.remove(owned);
    }
    m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    m.insert("creationTimestamp".into(), json!(now()));
    if res.generation {
        m.insert("generation".into(), json!(1));
    }
    defaults_on_create(inner, res, ns, &name, &mut obj)?;
    let created = inner.put(res, ns, &name, obj);
    if res.id() == resources::namespaces().id() {
        serviceaccounts::populate(inner, &name);
    }
    Ok(created)
}

/// Names are DNS-1123 subdomains; Namespaces and Services (which become DNS
/// labels) are DNS-1123 labels, as upstream validation has it.
fn validate_name(res: &ResourceDef, name: &str) -> Result<(), ApiError> {
    let label = res.group.is_empty() && matches!(res.plural, "namespaces" | "services");
    let (max, dots) = if label { (63, false) } else { (253, true) };
    let ok = name.len() <= max
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.chars().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (dots && c == '.')
        });
    if ok {
        return Ok(());
    }
    let what = if label {
        "RFC 1123 label"
    } else {
        "RFC 1123 subdomain"
    };
    Err(ApiError::invalid(
        res,
        name,
        "metadata.name",
        format!(
            "Invalid value: {name:?}: a lowercase {what} must consist of lower case alphanumeric characters, '-'{} and must start and end with an alphanumeric character",
            if dots { " or '.'," } else { "," }
        ),
    ))
}

fn defaults_on_create(
    inner: &Inner,
    res: &ResourceDef,
    ns: &str,
    name: &str,
    obj: &mut Value,
) -> Result<(), ApiError> {
    match (res.group, res.plural) {
        ("", "namespaces") => {
            obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            obj["status"] = json!({"phase": "Active"});
        }
        ("", "pods") => {
            // Upstream's order: defaulting, mutating admission, validation.
            pods::defaults(obj);
            serviceaccounts::admit_pod(inner, ns, name, obj)?;
            pods::admit(obj);
            pods::validate(res, name, obj)?;
            let qos = if pods::has_resources(obj) {
                "Burstable"
            } else {
                "BestEffort"
            };
            obj["status"] = json!({"phase": "Pending", "qosClass": qos});
        }
        ("", "secrets") if obj["type"].as_str().unwrap_or_default().is_empty() => {
            obj["type"] = json!("Opaque");
        }
        ("", "services") => {
            services::prepare(inner, res, name, obj, None)?;
            obj["status"] = json!({"loadBalancer": {}});
        }
        ("apps", _) => {
            crate::apps::defaults(res, obj);
            crate::apps::validate(res, name, obj, None)?;
            obj["status"] = json!({});
        }
        ("policy", "poddisruptionbudgets") => {
            crate::evictions::validate_budget(res, name, obj)?;
            // Zeroes, not absent: the fields are not omitempty upstream.
            obj["status"] = json!({"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0});
        }
        _ => {}
    }
    Ok(())
}

/// Replaces an object (PUT, or the result of a patch). `status_only` is the
/// `/status` subresource: only `.status` changes. Otherwise kinds with a status
/// subresource keep their stored `.status`.
pub fn update(
    inner: &mut Inner,
    res: &'static ResourceDef,
    ns: &str,
    name: &str,
    obj: Value,
    status_only: bool,
) -> Result<Value, ApiError> {
    let mut obj = check_body(res, ns, obj)?;
    let body_name = name_of(&obj);
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::BadRequest(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    obj["metadata"]["name"] = json!(name);
    let old = inner
        .get(res, ns, name)
        .map(std::borrow::Cow::into_owned)
        .ok_or_else(|| ApiError::not_found(res, name))?;
    if let Some(rv) = obj["metadata"]["resourceVersion"].as_str()
        && !rv.is_empty()
        && Some(rv) != old["metadata"]["resourceVersion"].as_str()
    {
        return Err(ApiError::modified(res, name));
    }
    if let Some(uid) = obj["metadata"]["uid"].as_str()
        && !uid.is_empty()
        && Some(uid) != old["metadata"]["uid"].as_str()
    {
        return Err(ApiError::conflict(
            res,
            name,
            format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                old["metadata"]["uid"].as_str().unwrap_or_default()
            ),
        ));
    }
    let mut new = if status_only {
        let mut n = old.clone();
        match obj["status"].take() {
            Value::Null => {
                if let Some(m) = n.as_object_mut() {
                    m.remove("status");
                }
            }
            status => n["status"] = status,
        }
        n
    } else {
        if res.status_subresource {
            obj["status"] = old["status"].clone();
        }
        obj
    };
    // Server-owned metadata survives any update.
    let m = new["metadata"].as_object_mut().expect("checked");
    for owned in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match old["metadata"].get(owned) {
            Some(v) => m.insert(owned.into(), v.clone()),
            None => m.remove(owned),
        };
    }
    m.remove("managedFields");
    m.insert(
        "resourceVersion".into(),
        old["metadata"]["resourceVersion"].clone(),
    );
    if !old["metadata"]["deletionTimestamp"].is_null() {
        let had = finalizers(&old);
        if finalizers(&new).iter().any(|f| !had.contains(f)) {
            return Err(ApiError::invalid(
                res,
                name,
                "metadata.finalizers",
                "Forbidden: no new finalizers can be added if the object is being deleted",
            ));
        }
    }
    match (res.group, res.plural) {
        ("", "services") if !status_only => {
            services::prepare(inner, res, name, &mut new, Some(&old))?
        }
        ("", "pods") if !status_only => {
            pods::defaults(&mut new);
            pods::check_update(res, name, &old, &new)?;
        }
        ("discovery.k8s.io", "endpointslices") if new["addressType"] != old["addressType"] => {
            return Err(ApiError::invalid(
                res,
                name,
                "addressType",
                "Invalid value: field is immutable",
            ));
        }
        ("", "namespaces") if !status_only => {
            new["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
        }
        ("policy", "poddisruptionbudgets") if !status_only => {
            crate::evictions::validate_budget(res, name, &new)?;
        }
        ("apps", _) if !status_only => {
            crate::apps::defaults(res, &mut new);
            crate::apps::validate(res, name, &new, Some(&old))?;
        }
        _ => {}
    }
    if res.generation && spec_changed(&old, &new) {
        let g = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        new["metadata"]["generation"] = json!(g);
    }
    if new == old {
        // A no-op write does not bump the resourceVersion or emit an event.
        return Ok(old);
    }
    let deleting = !new["metadata"]["deletionTimestamp"].is_null();
    if deleting
        && finalizers(&new).is_empty()
        && new["metadata"]["deletionGracePeriodSeconds"]
            .as_i64()
            .unwrap_or(0)
            == 0
    {
        return Ok(inner.remove(res, ns, name, Some(new)).unwrap_or_default());
    }
    Ok(inner.put(res, ns, name, new))
}

/// What bumps `metadata.generation`: `.spec`, or for kinds without one
/// (EndpointSlices) anything outside metadata.
fn spec_changed(old: &Value, new: &Value) -> bool {
    if old.get("spec").is_some() || new.get("spec").is_some() {
        return old.get("spec") != new.get("spec");
    }
    let body = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("metadata");
            m.remove("status");
        }
        v
    };
    body(old) != body(new)
}

fn finalizers(obj: &Value) -> Vec<String> {
    obj["metadata"]["finalizers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(String::from)
        .collect()
}

/// A PATCH request's content.
pub struct PatchRequest<'a> {
    pub kind: PatchType,
    pub body: &'a Value,
    /// The `/status` subresource.
    pub status_only: bool,
    /// `fieldManager`; apply remembers what each manager applied.
    pub manager: Option<&'a str>,
}

/// Patches an object under the store lock. Apply creates the object when it
/// is absent; returns whether it did.
pub fn patch(
    inner: &mut Inner,
    res: &'static ResourceDef,
    ns: &str,
    name: &str,
    req: &PatchRequest<'_>,
) -> Result<(Value, bool), ApiError> {
    let (kind, body, status_only) = (req.kind, req.body, req.status_only);
    let apply_key = |obj: &Value| {
        let uid = obj["metadata"]["uid"].as_str().unwrap_or_default();
        (
            uid.to_string(),
            req.manager.unwrap_or_default().to_string(),
            status_only,
        )
    };
    let Some(current) = inner.get(res, ns, name).map(std::borrow::Cow::into_owned) else {
        if kind == PatchType::Apply && !status_only {
            let mut obj = body.clone();
            if !obj["metadata"].is_object() {
                obj["metadata"] = json!({});
            }
            let body_name = name_of(&obj).to_string();
            if !body_name.is_empty() && body_name != name {
                return Err(ApiError::BadRequest(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({name})"
                )));
            }
            obj["metadata"]["name"] = json!(name);
            let created = create(inner, res, ns, obj)?;
            inner.remember_applied(apply_key(&created), body.clone());
            return Ok((created, true));
        }
        return Err(ApiError::not_found(res, name));
    };
    let mut effective = body.clone();
    if kind == PatchType::Apply {
        for (field, v) in [("kind", res.kind), ("apiVersion", &res.api_version())] {
            if body[field].as_str() != Some(v) {
                return Err(ApiError::BadRequest(format!(
                    "apply patches must set {field} to {v:?}"
                )));
            }
        }
        if let Some(previous) = inner.last_applied(&apply_key(&current)) {
            effective = patch::with_removals(previous, body);
        }
    }
    let mut patched = patch::apply(kind, &current, &effective)?;
    // A patch that carries a resourceVersion makes it a precondition.
    let want_rv = patched["metadata"]["resourceVersion"].clone();
    if want_rv != current["metadata"]["resourceVersion"] && !want_rv.is_null() {
        return Err(ApiError::modified(res, name));
    }
    if let Some(m) = patched["metadata"].as_object_mut() {
        m.insert(
            "resourceVersion".into(),
            current["metadata"]["resourceVersion"].clone(),
        );
    }
    let updated = update(inner, res, ns, name, patched, status_only)?;
    if kind == PatchType::Apply {
        inner.remember_applied(apply_key(&current), body.clone());
    }
    Ok((updated, false))
}

/// Parsed `DeleteOptions` (body or query).
#[derive(Debug, Default, Clone)]
pub struct DeleteOptions {
    pub grace_period: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

pub enum Deleted {
    /// Removed from the store; the final state.
    Gone(Value),
    /// Still there with a deletionTimestamp (finalizers or a graceful pod).
    Pending(Value),
}

pub fn delete(
    inner: &mut Inner,
    res: &'static ResourceDef,
    ns: &str,
    name: &str,
    opts: &DeleteOptions,
) -> Result<Deleted, ApiError> {
    let obj = inner
        .get(res, ns, name)
        .map(std::borrow::Cow::into_owned)
        .ok_or_else(|| ApiError::not_found(res, name))?;
    let m = &obj["metadata"];
    if let Some(uid) = &opts.uid
        && m["uid"].as_str() != Some(uid)
    {
        return Err(ApiError::conflict(
            res,
            name,
            format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                m["uid"].as_str().unwrap_or_default()
            ),
        ));
    }
    if let Some(rv) = &opts.resource_version
        && m["resourceVersion"].as_str() != Some(rv)
    {
        return Err(ApiError::conflict(
            res,
            name,
            format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                m["resourceVersion"].as_str().unwrap_or_default()
            ),
        ));
    }
    if res.id() == resources::namespaces().id() {
        if matches!(name, "default" | "kube-system" | "kube-public") {
            return Err(ApiError::Forbidden {
                resource: "namespaces".into(),
                name: name.into(),
                reason: "this namespace may not be deleted".into(),
            });
        }
        return Ok(Deleted::Gone(delete_namespace(inner, name)));
    }
    let grace = if res.id() == "/pods" {
        let terminal = matches!(
            obj.pointer("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        );
        let unbound = obj
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .is_empty();
        if terminal || unbound {
            0
        } else {
            opts.grace_period
                .or_else(|| {
                    obj.pointer("/spec/terminationGracePeriodSeconds")
                        .and_then(Value::as_i64)
                })
                .unwrap_or(30)
                .max(0)
        }
    } else {
        0
    };
    let pending_grace = m["deletionGracePeriodSeconds"].as_i64();
    if grace > 0 || !finalizers(&obj).is_empty() {
        if m["deletionTimestamp"].is_null() || pending_grace.is_some_and(|g| grace < g) {
            let mut new = obj.clone();
            let at = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(grace);
            new["metadata"]["deletionTimestamp"] = json!(timestamp(at));
            new["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            return Ok(Deleted::Pending(inner.put(res, ns, name, new)));
        }
        return Ok(Deleted::Pending(obj));
    }
    // A pod always goes through graceful deletion upstream (its strategy's
    // CheckGracefulDelete is true, with a period of 0 here): the object is
    // first written with deletionTimestamp and deletionGracePeriodSeconds 0,
    // which watchers see as MODIFIED, then removed, so that the DELETED
    // event carries both. The kubelet reads a force delete from them.
    let obj = if res.id() == "/pods" && pending_grace != Some(0) {
        let mut new = obj.clone();
        let at = match (m["deletionTimestamp"].as_str(), pending_grace) {
            (Some(ts), Some(g)) => ts
                .parse::<jiff::Timestamp>()
                .map(|t| t - jiff::SignedDuration::from_secs(g))
                .unwrap_or_else(|_| jiff::Timestamp::now()),
            _ => jiff::Timestamp::now(),
        };
        new["metadata"]["deletionTimestamp"] = json!(timestamp(at));
        new["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        inner.put(res, ns, name, new)
    } else {
        obj
    };
    let gone = inner.remove(res, ns, name, None).unwrap_or(obj);
    serviceaccounts::after_delete(inner, res, ns, name);
    Ok(Deleted::Gone(gone))
}

/// Deletes a namespace and everything in it at once; the real namespace
/// controller does the same over a few seconds with a Terminating phase.
fn delete_namespace(inner: &mut Inner, name: &str) -> Value {
    for res in resources::namespaced() {
        let names: Vec<String> = inner
            .list(res, Some(name), None)
            .map(|((_, n), _)| n.clone())
            .collect();
        for n in names {
            inner.remove(res, name, &n, None);
        }
    }
    let ns = resources::namespaces();
    let mut gone = inner.remove(ns, "", name, None).unwrap_or_default();
    gone["status"]["phase"] = json!("Terminating");
    gone
}

/// The namespaces every cluster starts with (each with what the
/// controllers add to a namespace, see `serviceaccounts::populate`).
pub fn bootstrap(inner: &mut Inner) {
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let obj = json!({"metadata": {"name": ns}});
        // Cannot fail on an empty store.
        let _ = create(inner, resources::namespaces(), "", obj);
    }
}
