//! The pod subresources kube-apiserver serves from the pod's kubelet: `log`
//! (a GET whose body is streamed through) and `exec`, `attach`,
//! `portforward` (upgraded connections: a WebSocket exec or attach in
//! `v5.channel.k8s.io` and a port-forward WebSocket tunnelling SPDY are
//! translated to SPDY for the kubelet, `translate.rs` over `spdy.rs`; any
//! other upgrade is spliced byte for byte). Upstream:
//! `pkg/registry/core/pod/strategy.go` (the kubelet locations),
//! `pkg/registry/core/pod/rest/{log,subresources}.go`, and apiserver's
//! `util/proxy/{upgradeaware,streamtranslator,streamtunnel}.go`;
//! `backend.rs` is the client side.
mod backend;
mod options;
mod spdy;
mod translate;

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, RwLock},
};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header};
use serde_json::{Value, json};
use tokio_rustls::TlsConnector;

use self::{
    backend::{Failed, Target, Upstream},
    options::{LogOptions, Query, StreamOptions},
};
use crate::{
    error::ApiError,
    http::{Body, State, error_response},
    rbac, resources,
    tokens::User,
};

/// The port kube-apiserver's `--kubelet-port` defaults to.
const DEFAULT_KUBELET_PORT: u16 = 10250;

/// `--kubelet-preferred-address-types`, default order.
const PREFERRED_ADDRESS_TYPES: [&str; 5] = [
    "Hostname",
    "InternalDNS",
    "InternalIP",
    "ExternalDNS",
    "ExternalIP",
];

/// How this server reaches kubelets, kept across restarts.
pub struct Kubelets {
    /// Per node, where to dial instead of the node's address: what an
    /// egress selector does for kube-apiserver. Tests run each kubelet in
    /// a network namespace of its own, out of the server's reach.
    routes: RwLock<HashMap<String, SocketAddr>>,
    tls: TlsConnector,
}

impl Kubelets {
    pub fn new(tls: Arc<rustls::ClientConfig>) -> Self {
        Kubelets {
            routes: RwLock::default(),
            tls: TlsConnector::from(tls),
        }
    }

    pub fn route(&self, node: &str, addr: SocketAddr) {
        self.routes
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node.to_string(), addr);
    }

    fn route_of(&self, node: &str) -> Option<SocketAddr> {
        self.routes
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(node)
            .copied()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subresource {
    Log,
    Exec,
    Attach,
    PortForward,
}

impl Subresource {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "log" => Some(Subresource::Log),
            "exec" => Some(Subresource::Exec),
            "attach" => Some(Subresource::Attach),
            "portforward" => Some(Subresource::PortForward),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Subresource::Log => "log",
            Subresource::Exec => "exec",
            Subresource::Attach => "attach",
            Subresource::PortForward => "portforward",
        }
    }
}

/// `/api/v1/namespaces/{ns}/pods/{name}/{sub}`, already authenticated.
pub async fn handle(
    state: Arc<State>,
    user: &User,
    ns: &str,
    name: &str,
    sub: Subresource,
    req: Request<Incoming>,
) -> Response<Body> {
    match serve(&state, user, ns, name, sub, req).await {
        Ok(resp) => resp,
        Err(e) => error_response(&e),
    }
}

async fn serve(
    state: &Arc<State>,
    user: &User,
    ns: &str,
    name: &str,
    sub: Subresource,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let method = req.method().clone();
    let allowed = match sub {
        Subresource::Log => method == Method::GET,
        _ => method == Method::GET || method == Method::POST,
    };
    if !allowed {
        return Err(ApiError::MethodNotAllowed);
    }
    authorize(state, user, ns, name, sub, &method)?;
    let query = Query::parse(req.uri().query().unwrap_or_default());
    match sub {
        Subresource::Log => log(state, ns, name, &query).await,
        _ => stream(state, ns, name, sub, &query, req).await,
    }
}

/// As the RBAC authorizer behind kube-apiserver's filter: `get` for a GET,
/// `create` for a POST. A websocket GET to exec, attach or portforward
/// must also be allowed `create`, as from 1.35, the version this server
/// reports (AuthorizePodWebsocketUpgradeCreatePermission, on by default;
/// 1.32 asked `get` only): a role that passes here passes on both.
fn authorize(
    state: &State,
    user: &User,
    ns: &str,
    name: &str,
    sub: Subresource,
    method: &Method,
) -> Result<(), ApiError> {
    let verbs: &[&str] = match (sub, method) {
        (Subresource::Log, _) => &["get"],
        (_, &Method::POST) => &["create"],
        _ => &["get", "create"],
    };
    let store = state.store.lock();
    for verb in verbs {
        let asked = rbac::Request {
            user: user.name.clone(),
            groups: user.groups.clone(),
            verb: (*verb).to_string(),
            resource: Some(rbac::ResourceAttrs {
                namespace: ns.to_string(),
                group: String::new(),
                resource: "pods".into(),
                subresource: sub.name().into(),
                name: name.to_string(),
            }),
            path: String::new(),
        };
        if !rbac::decide(&store, &asked).0 {
            return Err(ApiError::Forbidden {
                resource: "pods".into(),
                name: name.to_string(),
                reason: format!(
                    "User {:?} cannot {verb} resource \"pods/{}\" in API group \"\" in the namespace {ns:?}",
                    user.name,
                    sub.name()
                ),
            });
        }
    }
    Ok(())
}

fn pods() -> &'static resources::ResourceDef {
    resources::find("", "v1", "pods").expect("pods are served")
}

fn nodes() -> &'static resources::ResourceDef {
    resources::find("", "v1", "nodes").expect("nodes are served")
}

fn get_pod(state: &State, ns: &str, name: &str) -> Result<Value, ApiError> {
    state
        .store
        .lock()
        .get(pods(), ns, name)
        .map(std::borrow::Cow::into_owned)
        .ok_or_else(|| ApiError::not_found(pods(), name))
}

/// A Status the way kube-apiserver renders an error that is no Status:
/// code 500 and no reason.
fn unknown(message: String) -> ApiError {
    ApiError::Other {
        code: 500,
        reason: "",
        message,
        details: None,
    }
}

/// Upstream's `validateContainer`: the only container by default; init and
/// ephemeral containers are valid names and are listed first and last.
fn container_of(pod: &Value, asked: &str) -> Result<String, ApiError> {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let list = |field: &str| -> Vec<String> {
        pod["spec"][field]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str().map(String::from))
            .collect()
    };
    let containers = list("containers");
    let all: Vec<String> = list("initContainers")
        .into_iter()
        .chain(containers.iter().cloned())
        .chain(list("ephemeralContainers"))
        .collect();
    if !asked.is_empty() {
        return if all.iter().any(|c| c == asked) {
            Ok(asked.to_string())
        } else {
            Err(ApiError::BadRequest(format!(
                "container {asked} is not valid for pod {name}"
            )))
        };
    }
    match containers.as_slice() {
        [only] => Ok(only.clone()),
        [] => Err(ApiError::BadRequest(format!(
            "a container name must be specified for pod {name}"
        ))),
        _ => Err(ApiError::BadRequest(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            all.join(" ")
        ))),
    }
}

/// The pod's `spec.nodeName`, if it has one.
fn node_of(pod: &Value) -> Option<String> {
    pod["spec"]["nodeName"]
        .as_str()
        .filter(|n| !n.is_empty())
        .map(String::from)
}

/// Upstream's `NodeConnectionInfoGetter`: the node's preferred address and
/// its kubelet port; then this server's route for the node, if any.
fn target_of(state: &State, node: &str) -> Result<Target, ApiError> {
    let obj = state
        .store
        .lock()
        .get(nodes(), "", node)
        .map(std::borrow::Cow::into_owned)
        .ok_or_else(|| ApiError::not_found(nodes(), node))?;
    let addresses = obj["status"]["addresses"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let host = PREFERRED_ADDRESS_TYPES
        .iter()
        .find_map(|t| {
            addresses
                .iter()
                .find(|a| a["type"] == *t)
                .and_then(|a| a["address"].as_str())
        })
        .ok_or_else(|| {
            // Go's %v of []NodeAddress.
            let known: Vec<String> = addresses
                .iter()
                .map(|a| {
                    format!(
                        "{{{} {}}}",
                        a["type"].as_str().unwrap_or_default(),
                        a["address"].as_str().unwrap_or_default()
                    )
                })
                .collect();
            unknown(format!(
                "no preferred addresses found; known addresses: [{}]",
                known.join(" ")
            ))
        })?;
    let port = obj
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_i64)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
        .unwrap_or(DEFAULT_KUBELET_PORT);
    Ok(Target::new(host, port, state.kubelets.route_of(node)))
}

/// `GET pods/{name}/log`: upstream's LogREST and LocationStreamer.
async fn log(
    state: &Arc<State>,
    ns: &str,
    name: &str,
    query: &Query,
) -> Result<Response<Body>, ApiError> {
    let opts = LogOptions::parse(query)?;
    opts.validate(name)?;
    let pod = get_pod(state, ns, name)?;
    let container = container_of(&pod, &opts.container)?;
    // An unscheduled pod has no log yet: an empty stream, which the
    // handler answers with 204.
    let Some(node) = node_of(&pod) else {
        return Ok(Response::builder()
            .status(StatusCode::NO_CONTENT)
            .body(Empty::new().map_err(|n| match n {}).boxed_unsync())
            .unwrap_or_default());
    };
    let target = target_of(state, &node)?;
    let path = format!(
        "/containerLogs/{ns}/{name}/{container}{}",
        options::encode(&opts.kubelet_params())
    );
    let get = || {
        Request::get(path.as_str())
            .header(header::HOST, target.authority())
            .body(Empty::<Bytes>::new())
    };
    let request = get().map_err(|e| ApiError::Internal(e.to_string()))?;
    let upstream = Upstream::request(&state.kubelets.tls, &target, request)
        .await
        .map_err(|e| unknown(format!("Get \"{}{path}\": {e}", target.base_url())))?;
    let code = upstream.response.status().as_u16();
    if !(200..=206).contains(&code) {
        let text = upstream.text().await;
        return Err(kubelet_error(code, name, text));
    }
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/plain")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(upstream.into_body())
        .unwrap_or_default())
}

/// Upstream's GenericHttpResponseChecker: what a kubelet's failed answer
/// to a log request becomes.
fn kubelet_error(code: u16, name: &str, text: String) -> ApiError {
    match code {
        500 => ApiError::Internal(text),
        400 => ApiError::BadRequest(text),
        _ => {
            // apimachinery's NewGenericServerResponse, verb "".
            let (reason, message) = match code {
                404 => (
                    "NotFound",
                    "the server could not find the requested resource".to_string(),
                ),
                401 => (
                    "Unauthorized",
                    "the server has asked for the client to provide credentials".to_string(),
                ),
                403 => ("Forbidden", text),
                405 => (
                    "MethodNotAllowed",
                    "the server does not allow this method on the requested resource".to_string(),
                ),
                503 => (
                    "ServiceUnavailable",
                    "the server is currently unable to handle the request".to_string(),
                ),
                c if c >= 500 => (
                    "InternalError",
                    format!(
                        "an error on the server ({text:?}) has prevented the request from succeeding"
                    ),
                ),
                c => (
                    "",
                    format!(
                        "the server responded with the status code {c} but did not return more information"
                    ),
                ),
            };
            ApiError::Other {
                code,
                reason,
                message: format!("{message} ( pods/log {name})"),
                details: Some(json!({"name": name, "kind": "pods/log"})),
            }
        }
    }
}

/// Upstream's `httpstream.IsUpgradeRequest`.
fn is_upgrade(req: &Request<Incoming>) -> bool {
    req.headers().get_all(header::CONNECTION).iter().any(|v| {
        v.as_bytes()
            .to_ascii_lowercase()
            .windows(7)
            .any(|w| w == b"upgrade")
    })
}

/// exec, attach, portforward: the kubelet location, then the stream
/// translator (WebSocket v5 and port-forward tunnels, `translate.rs`) or the
/// upgrade-aware proxy.
async fn stream(
    state: &Arc<State>,
    ns: &str,
    name: &str,
    sub: Subresource,
    query: &Query,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let opts = StreamOptions::parse(sub, query)?;
    let pod = get_pod(state, ns, name)?;
    let path = match sub {
        Subresource::PortForward => format!("/portForward/{ns}/{name}"),
        _ => {
            let container = container_of(&pod, &opts.container)?;
            format!("/{}/{ns}/{name}/{container}", sub.name())
        }
    };
    let node = node_of(&pod)
        .ok_or_else(|| ApiError::BadRequest(format!("pod {name} does not have a host assigned")))?;
    let target = target_of(state, &node)?;
    if !is_upgrade(&req) {
        return Err(ApiError::BadRequest("Upgrade request required".into()));
    }
    let location = format!("{path}{}", options::encode(&opts.kubelet_params()));
    if let Some(plan) = translate::plan(sub, req.headers(), opts.streams()) {
        return translate::serve(state, &target, &location, plan, req).await;
    }
    let client_upgrade = hyper::upgrade::on(&mut req);
    let (parts, body) = req.into_parts();
    let mut forward = Request::builder().method(parts.method).uri(location);
    for (name, value) in &parts.headers {
        // The caller's credentials are for this server only; the kubelet
        // gets ours (the client certificate).
        if name != header::AUTHORIZATION && name != header::HOST {
            forward = forward.header(name, value);
        }
    }
    let forward = forward
        .header(header::HOST, target.authority())
        .body(body)
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let mut upstream = dial(state, &target, forward).await?;
    if upstream.response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return refused(upstream).await;
    }
    let backend_upgrade = hyper::upgrade::on(&mut upstream.response);
    upstream.detach();
    let mut reply = Response::builder().status(StatusCode::SWITCHING_PROTOCOLS);
    for (name, value) in upstream.response.headers() {
        reply = reply.header(name, value);
    }
    tokio::spawn(backend::splice(
        client_upgrade,
        backend_upgrade,
        state.shutdown.clone(),
    ));
    Ok(reply
        .body(Empty::new().map_err(|n| match n {}).boxed_unsync())
        .unwrap_or_default())
}

/// Sends a streaming request to the kubelet; its answer's head.
async fn dial<B>(state: &State, target: &Target, req: Request<B>) -> Result<Upstream, ApiError>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    Upstream::request(&state.kubelets.tls, target, req)
        .await
        .map_err(|e| {
            unknown(match e {
                Failed::Dial(e) => format!("error dialing backend: {e}"),
                Failed::Exchange(e) => e,
            })
        })
}

/// A kubelet's answer to an upgrade that is no 101. A refusal (4xx/5xx)
/// goes back as the kubelet sent it: clients decide from it whether to fall
/// back (kubectl from WebSocket to SPDY).
async fn refused(upstream: Upstream) -> Result<Response<Body>, ApiError> {
    let status = upstream.response.status();
    if status.as_u16() < 400 {
        return Err(unknown(format!(
            "invalid upgrade response: status code {}",
            status.as_u16()
        )));
    }
    let mut reply = Response::builder().status(status);
    for (name, value) in upstream.response.headers() {
        if name != header::TRANSFER_ENCODING && name != header::CONNECTION {
            reply = reply.header(name, value);
        }
    }
    Ok(reply.body(upstream.into_body()).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": spec})
    }

    #[test]
    fn containers_default_to_the_only_one_and_list_all_kinds() {
        let one = pod(json!({"containers": [{"name": "a"}]}));
        assert_eq!(container_of(&one, "").unwrap(), "a");
        let many = pod(json!({
            "initContainers": [{"name": "init"}],
            "containers": [{"name": "a"}, {"name": "b"}],
            "ephemeralContainers": [{"name": "debug"}],
        }));
        assert_eq!(
            container_of(&many, "").unwrap_err().to_string(),
            "a container name must be specified for pod p, choose one of: [init a b debug]"
        );
        assert_eq!(container_of(&many, "init").unwrap(), "init");
        assert_eq!(container_of(&many, "debug").unwrap(), "debug");
        let e = container_of(&many, "nope").unwrap_err();
        assert_eq!(e.to_string(), "container nope is not valid for pod p");
        assert_eq!(e.code(), 400);
    }

    #[test]
    fn kubelet_failures_become_upstreams_statuses() {
        let s = kubelet_error(404, "p", "nothing".into()).status();
        assert_eq!(
            s["message"],
            "the server could not find the requested resource ( pods/log p)"
        );
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(s["details"]["kind"], "pods/log");
        let s = kubelet_error(400, "p", "previous terminated container".into()).status();
        assert_eq!(
            (s["code"].as_u64(), s["message"].as_str()),
            (Some(400), Some("previous terminated container"))
        );
        let s = kubelet_error(500, "p", "boom".into()).status();
        assert_eq!(s["message"], "Internal error occurred: boom");
        let s = kubelet_error(502, "p", "bad".into()).status();
        assert_eq!(
            s["message"],
            "an error on the server (\"bad\") has prevented the request from succeeding ( pods/log p)"
        );
        assert!(unknown("x".into()).status().get("reason").is_none());
    }
}
