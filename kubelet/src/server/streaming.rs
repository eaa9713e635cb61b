//! `/exec`, `/attach` and `/portForward`: the kubelet asks the runtime for a
//! streaming URL (CRI `Exec`, `Attach`, `PortForward`) and proxies the
//! client's upgrade request to it, as the kubelet's `proxyStream` does.
//!
//! ```text
//!  client ──upgrade──▶ kubelet ──CRI Exec──▶ containerd: url
//!                         └──── same request ───▶ url (streaming server)
//!  client ◀════ 101, then bytes both ways (SPDY/3.1 or WebSocket) ════▶
//! ```
//!
//! The protocol is negotiated between the client and the runtime's
//! streaming server; the kubelet only splices bytes. Proxying rather than
//! redirecting keeps the runtime's server off the network: it listens on
//! the node's loopback.
use std::{future::Future, pin::Pin, sync::Arc};

use http_body_util::BodyExt as _;
use hyper::{
    Request, Response, StatusCode, Uri,
    body::{Bytes, Incoming},
    header::{self, HeaderValue},
};
use hyper_util::rt::TokioIo;

use super::routes::{Body, text};
use crate::{
    cri::{self, Runtime, StreamOptions},
    flow::PodsView,
};

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The runtime calls the streaming endpoints make, object-safe so that the
/// server needs no type parameter.
pub trait StreamRuntime: Send + Sync + 'static {
    fn exec<'a>(
        &'a self,
        id: &'a str,
        cmd: &'a [String],
        streams: StreamOptions,
    ) -> BoxFuture<'a, cri::Result<String>>;
    fn attach<'a>(
        &'a self,
        id: &'a str,
        streams: StreamOptions,
    ) -> BoxFuture<'a, cri::Result<String>>;
    fn port_forward<'a>(
        &'a self,
        sandbox_id: &'a str,
        ports: &'a [u16],
    ) -> BoxFuture<'a, cri::Result<String>>;
}

impl<R: Runtime + 'static> StreamRuntime for R {
    fn exec<'a>(
        &'a self,
        id: &'a str,
        cmd: &'a [String],
        streams: StreamOptions,
    ) -> BoxFuture<'a, cri::Result<String>> {
        Box::pin(Runtime::exec(self, id, cmd, streams))
    }
    fn attach<'a>(
        &'a self,
        id: &'a str,
        streams: StreamOptions,
    ) -> BoxFuture<'a, cri::Result<String>> {
        Box::pin(Runtime::attach(self, id, streams))
    }
    fn port_forward<'a>(
        &'a self,
        sandbox_id: &'a str,
        ports: &'a [u16],
    ) -> BoxFuture<'a, cri::Result<String>> {
        Box::pin(Runtime::port_forward(self, sandbox_id, ports))
    }
}

/// Which streaming endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Exec,
    Attach,
    PortForward,
}

/// What the query asks, in the names the API server forwards
/// (`streamParams`: `input`, `output`, `error`, `tty`, `command`, `port`).
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Params {
    pub command: Vec<String>,
    pub streams: StreamOptions,
    pub ports: Vec<u16>,
}

impl Params {
    pub fn from_query(kind: Kind, query: Option<&str>) -> Result<Self, String> {
        let mut p = Params::default();
        for (name, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            let flag = || value == "1" || value.eq_ignore_ascii_case("true");
            match &*name {
                "command" => p.command.push(value.into_owned()),
                "input" => p.streams.stdin = flag(),
                "output" => p.streams.stdout = flag(),
                "error" => p.streams.stderr = flag(),
                "tty" => p.streams.tty = flag(),
                "port" => p.ports.push(
                    value
                        .parse()
                        .ok()
                        .filter(|&n: &u16| n > 0)
                        .ok_or_else(|| format!("port {value:?} is not a port number"))?,
                ),
                _ => {}
            }
        }
        match kind {
            Kind::PortForward => return Ok(p),
            Kind::Exec if p.command.is_empty() => {
                return Err("command is required: no command given to exec".into());
            }
            _ => {}
        }
        let s = &mut p.streams;
        if !(s.stdin || s.stdout || s.stderr) {
            return Err("you must specify at least 1 of stdin, stdout, stderr".into());
        }
        // A terminal has one output: the kubelet drops stderr likewise.
        if s.tty {
            s.stderr = false;
        }
        Ok(p)
    }
}

/// Serves one streaming request for `namespace/pod` (and `container`,
/// except for port forwarding).
pub(super) async fn handle(
    kind: Kind,
    view: &Arc<dyn PodsView>,
    runtime: Option<&Arc<dyn StreamRuntime>>,
    target: (&str, &str, Option<&str>),
    req: Request<Incoming>,
) -> Response<Body> {
    let (namespace, pod, container) = target;
    let params = match Params::from_query(kind, req.uri().query()) {
        Ok(p) => p,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    // Refused before the runtime is asked: its URL would expire unused.
    if !is_upgrade(&req) {
        return text(StatusCode::BAD_REQUEST, "Upgrade request required\n");
    }
    let Some(runtime) = runtime else {
        return text(
            StatusCode::NOT_IMPLEMENTED,
            "container streaming needs a container runtime\n",
        );
    };
    let url = match kind {
        Kind::PortForward => {
            let Some(sandbox) = view.sandbox(namespace, pod) else {
                return text(
                    StatusCode::NOT_FOUND,
                    format!("pod \"{pod}\" in namespace \"{namespace}\" has no running sandbox\n"),
                );
            };
            runtime.port_forward(&sandbox, &params.ports).await
        }
        Kind::Exec | Kind::Attach => {
            let name = container.unwrap_or_default();
            let Some(c) = view.container(namespace, pod, name) else {
                return text(
                    StatusCode::NOT_FOUND,
                    format!(
                        "container \"{name}\" not found in pod \"{pod}\" in namespace \"{namespace}\"\n"
                    ),
                );
            };
            if !c.running {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("container \"{name}\" in pod \"{pod}\" is not running\n"),
                );
            }
            match kind {
                Kind::Exec => runtime.exec(&c.id, &params.command, params.streams).await,
                _ => runtime.attach(&c.id, params.streams).await,
            }
        }
    };
    match url {
        Ok(url) => proxy_upgrade(req, &url).await,
        Err(e) => {
            tracing::debug!(
                ?kind,
                namespace,
                pod,
                "streaming request refused by the runtime: {e}"
            );
            text(cri_status(&e), format!("{e}\n"))
        }
    }
}

/// The kubelet's `streaming.WriteError`: the runtime's gRPC code as HTTP.
fn cri_status(e: &cri::CriError) -> StatusCode {
    match e {
        cri::CriError::NotFound { .. } => StatusCode::NOT_FOUND,
        cri::CriError::Status { code, .. } => match code {
            cri::Code::InvalidArgument => StatusCode::BAD_REQUEST,
            cri::Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            cri::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        },
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn is_upgrade<B>(req: &Request<B>) -> bool {
    let connection_upgrade = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade && req.headers().contains_key(header::UPGRADE)
}

/// Sends `req` to `url` and, on 101, splices the two upgraded connections;
/// any other answer goes back to the client as it came (a client that
/// falls back from WebSocket to SPDY must see the upgrade refused).
async fn proxy_upgrade(mut req: Request<Incoming>, url: &str) -> Response<Body> {
    let bad_gateway = |what: String| {
        tracing::warn!(url, "streaming proxy: {what}");
        text(StatusCode::BAD_GATEWAY, format!("{what}\n"))
    };
    let uri: Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => return bad_gateway(format!("the runtime's streaming URL {url:?}: {e}")),
    };
    // containerd serves TLS streaming only when configured to, with a
    // certificate the kubelet has no way to check; its default is plain
    // HTTP on loopback.
    let (Some("http"), Some(authority)) = (uri.scheme_str(), uri.authority().cloned()) else {
        return bad_gateway(format!(
            "the runtime's streaming URL {url:?} is not http://host:port"
        ));
    };
    let tcp = match tokio::net::TcpStream::connect(authority.as_str()).await {
        Ok(t) => t,
        Err(e) => {
            return bad_gateway(format!(
                "cannot reach the runtime's streaming server at {authority}: {e}"
            ));
        }
    };
    let _ = tcp.set_nodelay(true);
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await {
        Ok(x) => x,
        Err(e) => return bad_gateway(format!("streaming server at {authority}: {e}")),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!("streaming server connection: {e}");
        }
    });

    let client_upgrade = hyper::upgrade::on(&mut req);
    let mut up = Request::builder()
        .method(req.method())
        .uri(uri.path_and_query().map_or("/", |p| p.as_str()));
    for (name, value) in req.headers() {
        // The client's credentials were for the kubelet, not the runtime.
        if name != header::HOST && name != header::AUTHORIZATION {
            up = up.header(name, value);
        }
    }
    let up = match up
        .header(header::HOST, authority.as_str())
        .body(http_body_util::Empty::<Bytes>::new())
    {
        Ok(r) => r,
        Err(e) => return bad_gateway(format!("cannot forward the request: {e}")),
    };
    let mut resp = match sender.send_request(up).await {
        Ok(r) => r,
        Err(e) => return bad_gateway(format!("streaming server at {authority}: {e}")),
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (parts, body) = resp.into_parts();
        // The refusal is small (a status line and a message); bounded so a
        // misbehaving server cannot make it otherwise.
        let body = http_body_util::Limited::new(body, 64 << 10)
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let mut out = Response::from_parts(parts, super::routes::full(body));
        out.headers_mut().remove(header::TRANSFER_ENCODING);
        return out;
    }
    let server_upgrade = hyper::upgrade::on(&mut resp);
    let mut out = Response::new(super::routes::full(Bytes::new()));
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *out.headers_mut() = resp.headers().clone();
    out.headers_mut()
        .entry(header::CONNECTION)
        .or_insert(HeaderValue::from_static("Upgrade"));
    tokio::spawn(async move {
        let (client, server) = match tokio::try_join!(client_upgrade, server_upgrade) {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!("streaming upgrade failed: {e}");
                return;
            }
        };
        let (mut client, mut server) = (TokioIo::new(client), TokioIo::new(server));
        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut server).await {
            tracing::debug!("streaming session ended: {e}");
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(kind: Kind, q: &str) -> Result<Params, String> {
        Params::from_query(kind, Some(q))
    }

    #[test]
    fn query_as_the_api_server_forwards_it() {
        let p = params(
            Kind::Exec,
            "command=sh&command=-c&command=echo%20hi&input=1&output=1&tty=1&error=1",
        )
        .unwrap();
        assert_eq!(p.command, ["sh", "-c", "echo hi"]);
        assert_eq!(
            p.streams,
            StreamOptions {
                stdin: true,
                stdout: true,
                stderr: false,
                tty: true
            }
        );
        let p = params(Kind::Attach, "output=1&error=1").unwrap();
        assert!(p.command.is_empty() && p.streams.stderr && !p.streams.stdin);
        let p = params(Kind::PortForward, "port=8080&port=53").unwrap();
        assert_eq!(p.ports, [8080, 53]);
        assert_eq!(
            params(Kind::PortForward, "").unwrap().ports,
            Vec::<u16>::new()
        );
    }

    #[test]
    fn queries_the_kubelet_refuses() {
        assert!(
            params(Kind::Exec, "output=1")
                .unwrap_err()
                .contains("command")
        );
        assert!(
            params(Kind::Exec, "command=ls")
                .unwrap_err()
                .contains("at least 1")
        );
        assert!(
            params(Kind::Attach, "tty=1")
                .unwrap_err()
                .contains("at least 1")
        );
        assert!(
            params(Kind::PortForward, "port=0")
                .unwrap_err()
                .contains("\"0\"")
        );
        assert!(params(Kind::PortForward, "port=http").is_err());
    }
}
