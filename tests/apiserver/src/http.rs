//! Request routing: authentication, the URL layout of `/api` and `/apis`, and
//! the mapping of HTTP methods to verbs.
use std::{collections::HashMap, convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header};
use serde_json::Value;
use tokio::sync::watch;

use crate::{
    discovery,
    error::ApiError,
    handlers,
    kubelet_proxy::{self, Kubelets, Subresource},
    rbac,
    resources::{self, ResourceDef},
    store::Store,
    tokens::{self, SigningKey, User},
};

pub type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// What every request handler shares for one run of the server.
pub struct State {
    pub store: Arc<Store>,
    pub token: String,
    pub service_account_key: Arc<SigningKey>,
    /// `--service-account-max-token-expiration`.
    pub max_token_expiration: Option<Duration>,
    pub bookmark_interval: Duration,
    /// host:port, for `serverAddressByClientCIDRs`.
    pub server_addr: String,
    pub shutdown: watch::Receiver<bool>,
    /// Every authenticated request, like an audit log.
    pub requests: Arc<std::sync::Mutex<Vec<Audit>>>,
    /// Routes and TLS for the subresources served by kubelets.
    pub kubelets: Arc<Kubelets>,
}

/// One authenticated request: who, and `METHOD path?query`.
#[derive(Debug, Clone)]
pub struct Audit {
    pub user: String,
    pub request: String,
}

pub fn json_response(code: u16, v: &Value) -> Response<Body> {
    json_bytes_response(code, serde_json::to_vec(v).unwrap_or_default())
}

/// A JSON body already serialized.
pub fn json_bytes_response(code: u16, body: Vec<u8>) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(
            Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .unwrap_or_default()
}

pub fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.code(), &e.status())
}

pub fn stream_response(
    rx: tokio::sync::mpsc::Receiver<crate::watch::FrameResult>,
) -> Response<Body> {
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|f| (f, rx)) });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(StreamBody::new(stream).boxed_unsync())
        .unwrap_or_default()
}

/// A parsed request to a resource endpoint.
pub struct ApiRequest {
    pub method: Method,
    pub res: &'static ResourceDef,
    /// `None` for a cluster-scoped resource or an all-namespaces collection.
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
    pub query: HashMap<String, String>,
    pub content_type: String,
    pub accept: String,
    pub body: Bytes,
}

impl ApiRequest {
    pub fn q(&self, key: &str) -> Option<&str> {
        self.query
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.q(key), Some("true" | "1"))
    }

    /// The namespace key in the store ("" for cluster-scoped objects).
    pub fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or_default()
    }
}

pub async fn handle(
    state: Arc<State>,
    client_cert: bool,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let Some(user) = authenticate(&state, client_cert, &req) else {
        return Ok(error_response(&ApiError::Unauthorized));
    };
    // Every authenticated user may do anything but reach kubelets: a real
    // cluster would ask RBAC for every request (`rbac.rs` answers
    // SubjectAccessReviews), so a test passing here proves nothing about
    // permissions, except for the pod subresources `kubelet_proxy` serves.
    state
        .requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Audit {
            user: user.name.clone(),
            request: format!("{} {}", req.method(), req.uri()),
        });
    tracing::debug!(method = %req.method(), uri = %req.uri(), content_type = ?req.headers().get(header::CONTENT_TYPE), accept = ?req.headers().get(header::ACCEPT), "request");
    let path = req.uri().path().trim_end_matches('/').to_string();
    let query: HashMap<String, String> =
        form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let ok = |v: Option<Value>| match v {
        Some(v) => json_response(200, &v),
        None => error_response(&ApiError::NoRoute),
    };
    let resp = match segs.as_slice() {
        ["version"] => ok(Some(discovery::version())),
        ["healthz" | "livez" | "readyz"] => Response::new(
            Full::new(Bytes::from_static(b"ok"))
                .map_err(|n| match n {})
                .boxed_unsync(),
        ),
        ["api"] => ok(Some(discovery::api_versions(&state.server_addr))),
        ["apis"] => ok(Some(discovery::api_group_list())),
        ["apis", group] => ok(discovery::api_group(group)),
        ["api", "v1"] => ok(discovery::resource_list("", "v1")),
        ["apis", group, version] => ok(discovery::resource_list(group, version)),
        ["openapi", "v2"] => openapi_v2(&req),
        ["openapi", "v3"] => ok(Some(discovery::openapi_root())),
        ["openapi", "v3", rest @ ..] => ok(discovery::openapi_gv(&rest.join("/"))),
        ["api", "v1", "namespaces", ns, "pods", name, sub]
            if let Some(sub) = Subresource::parse(sub) =>
        {
            let (ns, name) = (ns.to_string(), name.to_string());
            kubelet_proxy::handle(state, &user, &ns, &name, sub, req).await
        }
        ["api", "v1", rest @ ..] => resource(state, "", "v1", rest, query, req).await,
        ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"] => {
            subject_access_review(&state, req).await
        }
        ["apis", group, version, rest @ ..] => {
            resource(state, group, version, rest, query, req).await
        }
        _ => error_response(&ApiError::NoRoute),
    };
    tracing::debug!(status = resp.status().as_u16(), "response");
    Ok(resp)
}

/// The user a request authenticates as, or `None` for a 401: the client
/// certificate and the static token are superusers (group
/// `system:masters`), a live service-account token is its account.
fn authenticate(state: &State, client_cert: bool, req: &Request<Incoming>) -> Option<User> {
    let admin = |name: &str| User {
        name: name.into(),
        groups: vec!["system:masters".into(), "system:authenticated".into()],
    };
    if client_cert {
        return Some(admin("weir-test-admin"));
    }
    let token = req
        .headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?
        .trim();
    if token == state.token {
        return Some(admin("weir-test-token"));
    }
    let inner = state.store.lock();
    match tokens::authenticate(&inner, &state.service_account_key, token) {
        Ok(user) => Some(user),
        Err(why) => {
            tracing::debug!("bearer token refused: {why}");
            None
        }
    }
}

/// Protobuf when asked for (kubectl always asks), JSON otherwise.
fn openapi_v2(req: &Request<Incoming>) -> Response<Body> {
    let accept = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if ![
        discovery::OPENAPI_V2_PROTOBUF_ASKED,
        discovery::OPENAPI_V2_PROTOBUF,
    ]
    .iter()
    .any(|t| accept.contains(t))
    {
        return json_response(200, &discovery::openapi_v2_json());
    }
    Response::builder()
        .header(header::CONTENT_TYPE, discovery::OPENAPI_V2_PROTOBUF)
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(
            Full::new(Bytes::from(discovery::openapi_v2_protobuf()))
                .map_err(|never| match never {})
                .boxed_unsync(),
        )
        .unwrap_or_default()
}

/// Reviews are not stored: a POST is answered with the decision at once.
async fn subject_access_review(state: &State, req: Request<Incoming>) -> Response<Body> {
    if req.method() != Method::POST {
        return error_response(&ApiError::MethodNotAllowed);
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error_response(&ApiError::BadRequest(format!("cannot read the body: {e}")));
        }
    };
    let reviewed = rbac::review(&state.store.lock(), &body);
    match reviewed {
        Ok(v) => json_response(201, &v),
        Err(e) => error_response(&e),
    }
}

async fn resource(
    state: Arc<State>,
    group: &str,
    version: &str,
    rest: &[&str],
    query: HashMap<String, String>,
    req: Request<Incoming>,
) -> Response<Body> {
    let find = |plural: &str| resources::find(group, version, plural);
    // `namespaces/{ns}/{resource}/...` vs. the Namespace object itself, which
    // is `namespaces/{name}[/status]`.
    let target = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if find(plural).is_some_and(|r| r.namespaced) && tail.len() <= 2 =>
        {
            Some((find(plural), Some(ns.to_string()), tail))
        }
        [plural, tail @ ..] if tail.len() <= 2 => Some((find(plural), None, tail)),
        _ => None,
    };
    let Some((Some(res), namespace, tail)) = target else {
        return error_response(&ApiError::NoRoute);
    };
    if !res.namespaced && namespace.is_some() {
        return error_response(&ApiError::NoRoute);
    }
    let (name, subresource) = match tail {
        [] => (None, None),
        [name] => (Some(name.to_string()), None),
        [name, sub @ ("binding" | "eviction")] if res.group.is_empty() && res.plural == "pods" => {
            (Some(name.to_string()), Some(sub.to_string()))
        }
        [name, "token"] if res.group.is_empty() && res.plural == "serviceaccounts" => {
            (Some(name.to_string()), Some("token".to_string()))
        }
        [name, "scale"] if crate::apps::has_scale(res) => {
            (Some(name.to_string()), Some("scale".to_string()))
        }
        [name, "status"] if res.status_subresource => {
            (Some(name.to_string()), Some("status".to_string()))
        }
        _ => return error_response(&ApiError::NoRoute),
    };
    // A namespaced resource addressed without a namespace is only a collection
    // read across all namespaces.
    if res.namespaced && namespace.is_none() && (name.is_some() || req.method() != Method::GET) {
        return error_response(&ApiError::NoRoute);
    }
    let header = |h: header::HeaderName| {
        req.headers()
            .get(h)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let content_type = header(header::CONTENT_TYPE);
    let accept = header(header::ACCEPT);
    let method = req.method().clone();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error_response(&ApiError::BadRequest(format!("cannot read the body: {e}")));
        }
    };
    let r = ApiRequest {
        method,
        res,
        namespace,
        name,
        subresource,
        query,
        content_type,
        accept,
        body,
    };
    if matches!(
        r.subresource.as_deref(),
        Some("binding" | "eviction" | "token")
    ) && r.method != Method::POST
    {
        return error_response(&ApiError::MethodNotAllowed);
    }
    if r.subresource.as_deref() == Some("scale") {
        return handlers::scale(&state, &r).unwrap_or_else(|e| error_response(&e));
    }
    let result = match (&r.method, r.name.is_some()) {
        (&Method::GET, false) if r.flag("watch") => handlers::watch(&state, &r),
        (&Method::GET, false) => handlers::list(&state, &r),
        (&Method::GET, true) => handlers::get(&state, &r),
        (&Method::POST, false) => handlers::create(&state, &r),
        (&Method::POST, true) if r.subresource.as_deref() == Some("binding") => {
            handlers::bind(&state, &r)
        }
        (&Method::POST, true) if r.subresource.as_deref() == Some("eviction") => {
            handlers::evict(&state, &r)
        }
        (&Method::POST, true) if r.subresource.as_deref() == Some("token") => {
            handlers::token_request(&state, &r)
        }
        (&Method::PUT, true) => handlers::update(&state, &r),
        (&Method::PATCH, true) => handlers::patch(&state, &r),
        (&Method::DELETE, true) => handlers::delete(&state, &r),
        (&Method::DELETE, false) => handlers::delete_collection(&state, &r),
        _ => Err(ApiError::MethodNotAllowed),
    };
    result.unwrap_or_else(|e| error_response(&e))
}
