//! One function per verb: parse parameters, run the store operation under the
//! lock, and shape the response like the real server does.
use std::{borrow::Cow, time::Duration};

use base64::Engine as _;
use hyper::Response;
use serde_json::{Value, json};

use crate::{
    apps, convert,
    error::ApiError,
    evictions,
    http::{ApiRequest, Body, State, json_bytes_response, json_response, stream_response},
    patch::{self, PatchType},
    pods,
    selectors::{FieldSelector, LabelSelector, Selector},
    semantics::{self, DeleteOptions, Deleted},
    store::{Inner, Stored, is_type_meta},
    table::View,
    watch::{self, WatchRequest},
};

type Reply = Result<Response<Body>, ApiError>;

fn selector(r: &ApiRequest) -> Result<Selector, ApiError> {
    Ok(Selector {
        labels: LabelSelector::parse(r.q("labelSelector").unwrap_or_default())?,
        fields: FieldSelector::parse(r.q("fieldSelector").unwrap_or_default(), r.res)?,
    })
}

fn view(r: &ApiRequest) -> View {
    View::from_accept(&r.accept, r.q("includeObject"))
}

fn body_json(r: &ApiRequest) -> Result<Value, ApiError> {
    let ct = r.content_type.split(';').next().unwrap_or_default().trim();
    match ct {
        "" | "application/json" | "*/*" => serde_json::from_slice(&r.body)
            .map_err(|e| ApiError::BadRequest(format!("error decoding the request body: {e}"))),
        "application/yaml" => serde_saphyr::from_slice(&r.body)
            .map_err(|e| ApiError::BadRequest(format!("error decoding YAML: {e}"))),
        "application/vnd.kubernetes.protobuf" => {
            crate::proto::decode(&r.body).map_err(|e| ApiError::BadRequest(e.to_string()))
        }
        _ => Err(ApiError::UnsupportedMediaType),
    }
}

fn parse_rv(rv: &str) -> Result<u64, ApiError> {
    rv.parse().map_err(|_| {
        ApiError::BadRequest(format!(
            "resourceVersion: Invalid value: {rv:?}: must be an unsigned integer"
        ))
    })
}

/// Continue tokens look like the real server's: base64 JSON with the list's
/// resourceVersion and the key to start after. Ours also carry how many
/// keys followed the page when the list began, when they were counted: etcd
/// counts them in the list's snapshot, and counting them again for every
/// page made a 100k-object list quadratic.
fn encode_continue(rv: u64, ns: &str, name: &str, remaining: Option<usize>) -> String {
    let mut raw = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{ns}/{name}\u{0}")});
    if let Some(n) = remaining {
        raw["remaining"] = json!(n);
    }
    base64::engine::general_purpose::URL_SAFE.encode(raw.to_string())
}

struct Continue {
    rv: u64,
    after: (String, String),
    remaining: Option<usize>,
}

fn decode_continue(token: &str) -> Result<Continue, ApiError> {
    let bad = || {
        ApiError::BadRequest("continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)".into())
    };
    let raw = base64::engine::general_purpose::URL_SAFE
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v["rv"].as_u64().ok_or_else(bad)?;
    let start = v["start"]
        .as_str()
        .ok_or_else(bad)?
        .trim_end_matches('\u{0}');
    let (ns, name) = start.split_once('/').ok_or_else(bad)?;
    Ok(Continue {
        rv,
        after: (ns.to_string(), name.to_string()),
        remaining: v["remaining"]
            .as_u64()
            .and_then(|n| usize::try_from(n).ok()),
    })
}

pub fn list(state: &State, r: &ApiRequest) -> Reply {
    let sel = selector(r)?;
    let limit = match r.q("limit") {
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| ApiError::BadRequest(format!("invalid limit {l:?}")))?,
        None => 0,
    };
    let inner = state.store.lock();
    let (list_rv, after, counted) = match r.q("continue") {
        Some(token) => {
            let c = decode_continue(token)?;
            if c.rv < inner.compacted() {
                return Err(ApiError::Gone("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.".into()));
            }
            (c.rv, Some(c.after), c.remaining)
        }
        None => {
            if let Some(rv) = r.q("resourceVersion").filter(|rv| *rv != "0") {
                let rv = parse_rv(rv)?;
                let exact = r.q("resourceVersionMatch") == Some("Exact");
                if (limit > 0 || exact) && rv < inner.compacted() {
                    return Err(ApiError::Gone(format!(
                        "too old resource version: {rv} ({})",
                        inner.compacted()
                    )));
                }
            }
            (inner.rv(), None, None)
        }
    };
    // Each object as stored and as this resource reads it: the same,
    // borrowed, but for a view (see `convert`).
    let mut items: Vec<(&Stored, Cow<'_, Value>)> = Vec::new();
    let mut next_key = None;
    let mut rest = inner.list_stored(r.res, r.namespace.as_deref(), after);
    for (key, obj) in rest.by_ref() {
        let value = convert::to_view(r.res, &obj.value);
        if !sel.matches_stored(obj, &value) {
            continue;
        }
        items.push((obj, value));
        next_key = Some(key);
        if limit > 0 && items.len() == limit {
            break;
        }
    }
    // A full page continues whenever any key follows it, matching or not,
    // as etcd's paging does (the next page may then be empty); only
    // without selectors is the rest counted, where counting keys is cheap,
    // and only on the first page (see `encode_continue`).
    let unselected = sel.labels.is_empty() && sel.fields.is_empty();
    let more = limit > 0 && items.len() == limit && rest.next().is_some();
    let remaining = (more && unselected).then(|| match counted {
        Some(before) => before.saturating_sub(items.len()).max(1),
        None => 1 + rest.count(),
    });
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if more && let Some((ns, name)) = next_key {
        meta["continue"] = json!(encode_continue(list_rv, ns, name, remaining));
        if let Some(n) = remaining {
            meta["remainingItemCount"] = json!(n);
        }
    }
    match view(r) {
        // The items' encodings copied from the store (see `Stored`).
        View::Object => {
            let head = json!({
                "kind": format!("{}List", r.res.kind),
                "apiVersion": r.res.api_version(),
                "metadata": meta,
            });
            let mut body = serde_json::to_vec(&head).unwrap_or_default();
            body.pop();
            body.extend_from_slice(b",\"items\":[");
            for (i, (stored, value)) in items.iter().enumerate() {
                if i > 0 {
                    body.push(b',');
                }
                match value {
                    Cow::Borrowed(_) => body.extend_from_slice(stored.item()),
                    Cow::Owned(v) => {
                        let _ = serde_json::to_writer(&mut body, &list_item(v));
                    }
                }
            }
            body.extend_from_slice(b"]}");
            drop(inner);
            Ok(json_bytes_response(200, body))
        }
        other => {
            let items: Vec<Value> = items.iter().map(|(_, v)| list_item(v)).collect();
            drop(inner);
            Ok(json_response(200, &other.list(r.res, &items, meta)))
        }
    }
}

/// List items carry no type meta on the wire, like the real server's.
fn list_item(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.retain(|k, _| !is_type_meta(k));
    }
    o
}

fn name(r: &ApiRequest) -> &str {
    r.name.as_deref().unwrap_or_default()
}

/// The object the request names, as its resource reads it.
fn fetch(state: &State, r: &ApiRequest) -> Result<Value, ApiError> {
    state
        .store
        .lock()
        .get(r.res, r.ns(), name(r))
        .map(Cow::into_owned)
        .ok_or_else(|| ApiError::not_found(r.res, name(r)))
}

pub fn get(state: &State, r: &ApiRequest) -> Reply {
    let obj = fetch(state, r)?;
    Ok(json_response(200, &view(r).one(r.res, &obj)))
}

/// Runs a write against the store, or against a throwaway copy for
/// `dryRun=All`.
fn with_store<T>(
    state: &State,
    r: &ApiRequest,
    write: impl FnOnce(&mut Inner) -> Result<T, ApiError>,
) -> Result<T, ApiError> {
    // DeleteOptions carries dryRun in the body; other verbs in the query.
    let in_body = serde_json::from_slice::<Value>(&r.body)
        .ok()
        .filter(|b| b["kind"] == "DeleteOptions" || r.method == hyper::Method::DELETE)
        .and_then(|b| b["dryRun"].as_array().cloned())
        .unwrap_or_default();
    let dry = match r.q("dryRun") {
        None => in_body.iter().any(|v| v == "All"),
        Some("All") => true,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            )));
        }
    };
    let mut inner = state.store.lock();
    if dry {
        write(&mut inner.scratch())
    } else {
        write(&mut inner)
    }
}

pub fn bind(state: &State, r: &ApiRequest) -> Reply {
    let binding = body_json(r)?;
    let status = with_store(state, r, |inner| {
        pods::bind(inner, r.res, r.ns(), name(r), &binding)
    })?;
    Ok(json_response(201, &status))
}

/// `GET|PUT|PATCH {workload}/scale`.
pub fn scale(state: &State, r: &ApiRequest) -> Reply {
    if r.method == hyper::Method::GET {
        return Ok(json_response(200, &apps::scale_of(&fetch(state, r)?)));
    }
    let (body, kind) = match r.method {
        hyper::Method::PUT => (body_json(r)?, None),
        hyper::Method::PATCH => {
            let kind = PatchType::from_content_type(&r.content_type)
                .ok_or(ApiError::UnsupportedPatchType)?;
            (patch::parse_body(kind, &r.body)?, Some(kind))
        }
        _ => return Err(ApiError::MethodNotAllowed),
    };
    let write = match kind {
        None => apps::ScaleWrite::Replace(&body),
        Some(k) => apps::ScaleWrite::Patch(k, &body),
    };
    let scale = with_store(state, r, |inner| {
        apps::write_scale(inner, r.res, r.ns(), name(r), write)
    })?;
    Ok(json_response(200, &scale))
}

pub fn evict(state: &State, r: &ApiRequest) -> Reply {
    let eviction = body_json(r)?;
    let status = with_store(state, r, |inner| {
        evictions::evict(inner, r.res, r.ns(), name(r), &eviction)
    })?;
    Ok(json_response(201, &status))
}

/// `POST serviceaccounts/{name}/token`. Nothing is stored, so dryRun has
/// nothing to skip.
pub fn token_request(state: &State, r: &ApiRequest) -> Reply {
    let body = body_json(r)?;
    let inner = state.store.lock();
    let out = crate::tokens::request(
        &inner,
        &state.service_account_key,
        state.max_token_expiration,
        r.ns(),
        name(r),
        body,
    )?;
    drop(inner);
    Ok(json_response(201, &out))
}

pub fn create(state: &State, r: &ApiRequest) -> Reply {
    let obj = body_json(r)?;
    let created = with_store(state, r, |inner| {
        semantics::create(inner, r.res, r.ns(), obj)
    })?;
    Ok(json_response(201, &created))
}

pub fn update(state: &State, r: &ApiRequest) -> Reply {
    let obj = body_json(r)?;
    let status_only = r.subresource.as_deref() == Some("status");
    let updated = with_store(state, r, |inner| {
        semantics::update(inner, r.res, r.ns(), name(r), obj, status_only)
    })?;
    Ok(json_response(200, &updated))
}

pub fn patch(state: &State, r: &ApiRequest) -> Reply {
    let kind =
        PatchType::from_content_type(&r.content_type).ok_or(ApiError::UnsupportedPatchType)?;
    if kind == PatchType::Apply && r.q("fieldManager").is_none() {
        return Err(ApiError::BadRequest(
            "fieldManager is required for apply requests".into(),
        ));
    }
    let body = patch::parse_body(kind, &r.body)?;
    let status_only = r.subresource.as_deref() == Some("status");
    let (obj, created) = with_store(state, r, |inner| {
        let req = semantics::PatchRequest {
            kind,
            body: &body,
            status_only,
            manager: r.q("fieldManager"),
        };
        semantics::patch(inner, r.res, r.ns(), name(r), &req)
    })?;
    Ok(json_response(if created { 201 } else { 200 }, &obj))
}

fn delete_options(r: &ApiRequest) -> Result<DeleteOptions, ApiError> {
    let body: Value = if r.body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        body_json(r)?
    };
    let grace = match r.q("gracePeriodSeconds") {
        Some(g) => Some(
            g.parse::<i64>()
                .map_err(|_| ApiError::BadRequest(format!("invalid gracePeriodSeconds {g:?}")))?,
        ),
        None => body["gracePeriodSeconds"].as_i64(),
    };
    Ok(DeleteOptions {
        grace_period: grace,
        uid: body
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(String::from),
        resource_version: body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(String::from),
    })
}

/// Pods, Services and Namespaces answer a delete with the object, the rest
/// with a Success status, as their registries are configured upstream.
fn deleted_reply(r: &ApiRequest, d: Deleted) -> Value {
    match d {
        Deleted::Pending(obj) => obj,
        Deleted::Gone(obj)
            if r.res.group.is_empty()
                && matches!(r.res.plural, "pods" | "services" | "namespaces") =>
        {
            obj
        }
        Deleted::Gone(obj) => {
            let mut details = json!({"name": obj["metadata"]["name"], "kind": r.res.plural, "uid": obj["metadata"]["uid"]});
            if !r.res.group.is_empty() {
                details["group"] = json!(r.res.group);
            }
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
        }
    }
}

pub fn delete(state: &State, r: &ApiRequest) -> Reply {
    let opts = delete_options(r)?;
    let d = with_store(state, r, |inner| {
        semantics::delete(inner, r.res, r.ns(), name(r), &opts)
    })?;
    Ok(json_response(200, &deleted_reply(r, d)))
}

pub fn delete_collection(state: &State, r: &ApiRequest) -> Reply {
    let sel = selector(r)?;
    let mut opts = delete_options(r)?;
    opts.uid = None;
    opts.resource_version = None;
    let mut inner = state.store.lock();
    let names: Vec<(String, String)> = inner
        .list(r.res, r.namespace.as_deref(), None)
        .filter(|(_, o)| sel.matches(o))
        .map(|(k, _)| k.clone())
        .collect();
    let mut items = Vec::new();
    for (ns, n) in names {
        match semantics::delete(&mut inner, r.res, &ns, &n, &opts)? {
            Deleted::Gone(o) | Deleted::Pending(o) => items.push(list_item(&o)),
        }
    }
    let rv = inner.rv().to_string();
    Ok(json_response(
        200,
        &json!({"kind": format!("{}List", r.res.kind), "apiVersion": r.res.api_version(), "metadata": {"resourceVersion": rv}, "items": items}),
    ))
}

/// Real servers close a watch after `timeoutSeconds`, or after a randomised
/// 30-60 minutes without one.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

pub fn watch(state: &State, r: &ApiRequest) -> Reply {
    let timeout = match r.q("timeoutSeconds") {
        Some(t) => Duration::from_secs(
            t.parse()
                .map_err(|_| ApiError::BadRequest(format!("invalid timeoutSeconds {t:?}")))?,
        ),
        None => DEFAULT_WATCH_TIMEOUT,
    };
    let send_initial_events = r.flag("sendInitialEvents");
    let bookmarks = r.flag("allowWatchBookmarks");
    if send_initial_events && (!bookmarks || r.q("resourceVersionMatch") != Some("NotOlderThan")) {
        return Err(ApiError::BadRequest(
            "sendInitialEvents requires allowWatchBookmarks=true and resourceVersionMatch=NotOlderThan".into(),
        ));
    }
    let req = WatchRequest {
        res: r.res,
        namespace: r.namespace.clone(),
        selector: selector(r)?,
        resource_version: r.q("resourceVersion").map(String::from),
        send_initial_events,
        bookmarks,
        timeout,
        view: view(r),
    };
    let rx = watch::spawn(
        state.store.clone(),
        req,
        state.bookmark_interval,
        state.shutdown.clone(),
    )?;
    Ok(stream_response(rx))
}
