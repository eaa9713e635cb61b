//! The two small HTTP servers: metrics (and kube-proxy's `/proxyMode` and
//! `/configz`) on `--metrics-addr`, and kube-proxy's health endpoints on
//! `--healthz-addr`.
//!
//! Both are bound before anything else starts, and a port that stays taken
//! stops the agent (kube-proxy's `--bind-address-hard-fail`, on by default
//! here). Retrying forever, as kube-proxy does without that flag, hides the
//! failure: next to kube-proxy on the host network, the kubelet's probe of
//! 10256 reaches kube-proxy's `/healthz` and the agent looks Ready while its
//! own server is down. An exit makes the pod CrashLoopBackOff, which no probe
//! can mask.
use std::{convert::Infallible, io, net::SocketAddr, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Bytes, header};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::{debug, error, info, warn};

use super::{
    Health, Metrics,
    conns::{self, Conns},
    metrics::CodeLabel,
};

/// How long a listener given on the command line may stay taken before the
/// agent gives up.
#[derive(Clone, Copy, Debug)]
pub struct BindRetry {
    pub attempts: u32,
    pub interval: Duration,
}

impl BindRetry {
    /// About 10 s: long enough for a previous agent (or a kube-proxy being
    /// deleted) to let go of the port, short enough that a holder that stays
    /// is reported within one probe period or two.
    pub const STARTUP: Self = Self {
        attempts: 5,
        interval: Duration::from_millis(2500),
    };
}

/// A listener the agent was told to serve and cannot.
#[derive(Debug, thiserror::Error)]
#[error("cannot bind {flag} {addr}: {io}{}", hint(.flag, .addr, .io, .attempts, .waited))]
pub struct BindError {
    pub flag: &'static str,
    pub addr: SocketAddr,
    pub attempts: u32,
    pub waited: Duration,
    /// Part of the message, not a `source()`: the hint depends on it.
    pub io: io::Error,
}

fn hint(flag: &str, addr: &SocketAddr, e: &io::Error, attempts: &u32, waited: &Duration) -> String {
    match e.kind() {
        io::ErrorKind::AddrInUse => format!(
            " (still taken after {attempts} attempts over {}). Another process holds port {port}: \
             on a node that still runs kube-proxy, that is kube-proxy, which serves /healthz on \
             10256 and metrics on 10249. To run beside kube-proxy, install the Helm chart with \
             kubeProxyCoexistence.enabled=true (other ports, no healthCheckNodePorts); otherwise \
             give {flag} a free port or stop the other process (ss -ltnp 'sport = :{port}' names it)",
            humantime::format_duration(*waited),
            port = addr.port(),
        ),
        io::ErrorKind::AddrNotAvailable => {
            format!(" ({} is not an address of this node)", addr.ip())
        }
        _ => String::new(),
    }
}

/// Binds `addr` for `flag`, retrying while another process holds it (only
/// then: no other error goes away by waiting).
pub async fn bind(
    flag: &'static str,
    addr: SocketAddr,
    retry: BindRetry,
) -> Result<TcpListener, BindError> {
    let mut attempt = 1;
    loop {
        match TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && attempt < retry.attempts => {
                warn!(%addr, "{flag} {addr} is taken ({e}); attempt {attempt} of {}, retrying in {:?}", retry.attempts, retry.interval);
                tokio::time::sleep(retry.interval).await;
                attempt += 1;
            }
            Err(io) => {
                return Err(BindError {
                    flag,
                    addr,
                    attempts: attempt,
                    waited: retry.interval * (attempt - 1),
                    io,
                });
            }
        }
    }
}

#[derive(Clone)]
pub enum Routes {
    /// `/metrics`, `/proxyMode`, `/configz` (the JSON it serves) and
    /// `/statusz`.
    Metrics(Arc<Metrics>, Arc<str>, Arc<super::status::StatusBoard>),
    /// `/healthz` and `/livez`.
    Health(Arc<Health>, Arc<Metrics>),
}

impl Routes {
    const fn what(&self) -> &'static str {
        match self {
            Self::Metrics(..) => "metrics",
            Self::Health(..) => "healthz",
        }
    }
}

/// The listener for `flag` given as `value` ("ip:port", or an IP alone for
/// `default_port` as kube-proxy's bind addresses; empty: none), bound with
/// [`BindRetry::STARTUP`]. A failure is logged here too, so it shows in the
/// agent's log format and not only in the exit message.
pub async fn bind_flag(
    flag: &'static str,
    value: &str,
    default_port: u16,
) -> anyhow::Result<Option<TcpListener>> {
    let Some(addr) = parse_bind_addr(value, default_port)
        .map_err(|_| anyhow::anyhow!("{flag} {value:?} is not ip:port or an IP"))?
    else {
        return Ok(None);
    };
    match bind(flag, addr, BindRetry::STARTUP).await {
        Ok(l) => Ok(Some(l)),
        Err(e) => {
            error!("{e}");
            Err(e.into())
        }
    }
}

/// `ip:port`, `[v6]:port`, or a bare IP (v6 with or without brackets) that
/// takes `default_port`; `None` for empty (disabled).
pub fn parse_bind_addr(
    value: &str,
    default_port: u16,
) -> Result<Option<SocketAddr>, std::net::AddrParseError> {
    let v = value.trim();
    if v.is_empty() {
        return Ok(None);
    }
    if let Ok(a) = v.parse::<SocketAddr>() {
        return Ok(Some(a));
    }
    let bare = v
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(v);
    bare.parse::<std::net::IpAddr>()
        .map(|ip| Some(SocketAddr::new(ip, default_port)))
}

/// Serves on `listener` (from [`bind`]) until the task is dropped, within
/// the limits of [`conns`](super::conns): a header timeout and a cap on open
/// connections, so idle connections from pods cannot starve the probes.
pub async fn serve(listener: TcpListener, routes: Routes) {
    let what = routes.what();
    if let Ok(local) = listener.local_addr() {
        info!(addr = %local, "serving {what}");
    }
    let cap = match routes {
        Routes::Metrics(..) => conns::METRICS_CONNS,
        Routes::Health(..) => conns::HEALTHZ_CONNS,
    };
    conns::accept_loop(listener, what, Conns::new(cap), move |stream, peer| {
        let routes = routes.clone();
        async move {
            let svc = hyper::service::service_fn(move |req| {
                let routes = routes.clone();
                async move { Ok::<_, Infallible>(answer(&routes, &req)) }
            });
            if let Err(e) = conns::http1()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                debug!(%peer, "{what} connection: {e}");
            }
        }
    })
    .await;
}

fn answer<B>(routes: &Routes, req: &Request<B>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
    }
    match (routes, req.uri().path()) {
        (Routes::Metrics(m, ..), "/metrics") => Response::builder()
            .header(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
            .body(Full::new(Bytes::from(m.encode())))
            .unwrap_or_default(),
        // kube-proxy answers its mode here ("iptables", "ipvs", "nftables");
        // scripts and conformance checks read it to see who proxies.
        (Routes::Metrics(..), "/proxyMode") => plain(StatusCode::OK, PROXY_MODE),
        // kube-proxy's configz: the effective configuration.
        // What only the running agent knows, for `inspect status`.
        (Routes::Metrics(_, _, board), "/statusz") => Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(
                serde_json::to_string(&board.status()).unwrap_or_default(),
            )))
            .unwrap_or_default(),
        (Routes::Metrics(_, configz, _), "/configz") => Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(configz.to_string())))
            .unwrap_or_default(),
        (Routes::Health(h, m), path @ ("/healthz" | "/livez")) => {
            let s = h.status();
            // /livez only asks whether the agent works; /healthz also whether
            // this node should take new traffic (kube-proxy's split).
            let ok = if path == "/healthz" {
                s.healthy && s.node_eligible
            } else {
                s.healthy
            };
            let code = if ok {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            let family = if path == "/healthz" {
                &m.healthz
            } else {
                &m.livez
            };
            family
                .get_or_create(&CodeLabel {
                    code: code.as_u16().to_string(),
                })
                .inc();
            Response::builder()
                .status(code)
                .header(header::CONTENT_TYPE, "application/json")
                .header("X-Content-Type-Options", "nosniff")
                .body(Full::new(Bytes::from(s.to_json())))
                .unwrap_or_default()
        }
        _ => plain(StatusCode::NOT_FOUND, "404 page not found\n"),
    }
}

/// What `/proxyMode` answers. kube-proxy writes the mode without a newline.
pub const PROXY_MODE: &str = "ebpf";

fn plain(code: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUICK: BindRetry = BindRetry {
        attempts: 3,
        interval: Duration::from_millis(10),
    };

    #[tokio::test]
    async fn taken_port_fails_naming_flag_address_and_fix() {
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = holder.local_addr().unwrap();
        let e = bind("--healthz-addr", addr, QUICK).await.unwrap_err();
        assert_eq!(e.io.kind(), io::ErrorKind::AddrInUse);
        assert_eq!(e.attempts, 3);
        let msg = e.to_string();
        for want in [
            &format!("cannot bind --healthz-addr {addr}: "),
            "after 3 attempts over 20ms",
            &format!("Another process holds port {}", addr.port()),
            "kube-proxy",
            "kubeProxyCoexistence.enabled=true",
            "give --healthz-addr a free port",
        ] {
            assert!(msg.contains(want), "{want:?} missing from: {msg}");
        }
    }

    #[tokio::test]
    async fn port_freed_while_retrying_is_taken() {
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = holder.local_addr().unwrap();
        // The previous agent exits during the second wait.
        let exiting = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            drop(holder);
        });
        let patient = BindRetry {
            attempts: 50,
            interval: Duration::from_millis(20),
        };
        let l = bind("--metrics-addr", addr, patient).await.unwrap();
        assert_eq!(l.local_addr().unwrap(), addr);
        exiting.await.unwrap();
    }

    #[tokio::test]
    async fn address_not_on_the_node_fails_at_once() {
        // TEST-NET-1: on no interface here, and waiting does not change that.
        let addr: SocketAddr = "192.0.2.1:0".parse().unwrap();
        let result = bind("--metrics-addr", addr, BindRetry::STARTUP).await;
        let nonlocal = std::fs::read_to_string("/proc/sys/net/ipv4/ip_nonlocal_bind")
            .is_ok_and(|v| v.trim() == "1");
        if nonlocal {
            return; // the kernel lets any address bind here: nothing to refuse
        }
        let e = result.expect_err("binding an address of no interface must fail");
        assert_eq!(e.attempts, 1);
        let msg = e.to_string();
        assert!(msg.contains("--metrics-addr 192.0.2.1:0"), "{msg}");
        assert!(msg.contains("not an address of this node"), "{msg}");
    }

    #[tokio::test]
    async fn empty_flag_is_no_listener_and_garbage_is_named() {
        assert!(bind_flag("--metrics-addr", "", 1).await.unwrap().is_none());
        let e = bind_flag("--metrics-addr", "localhost", 1)
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "--metrics-addr \"localhost\" is not ip:port or an IP"
        );
    }

    #[test]
    fn bind_addresses_as_kube_proxy_takes_them() {
        let p = |v: &str| {
            parse_bind_addr(v, 10249)
                .map(|a| a.map(|a| a.to_string()))
                .map_err(|_| ())
        };
        assert_eq!(p("0.0.0.0:9000"), Ok(Some("0.0.0.0:9000".into())));
        assert_eq!(p("0.0.0.0"), Ok(Some("0.0.0.0:10249".into())));
        assert_eq!(p("::"), Ok(Some("[::]:10249".into())));
        assert_eq!(p("[::1]"), Ok(Some("[::1]:10249".into())));
        assert_eq!(p("[::1]:1"), Ok(Some("[::1]:1".into())));
        assert_eq!(p(""), Ok(None));
        assert_eq!(p("10.0.0.0/8"), Err(()));
    }

    #[tokio::test]
    async fn serves_health_on_a_bound_listener() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let l = bind("--healthz-addr", "127.0.0.1:0".parse().unwrap(), QUICK)
            .await
            .unwrap();
        let addr = l.local_addr().unwrap();
        let health = Arc::new(Health::new(Duration::from_secs(60)));
        health.updated(true);
        let task = tokio::spawn(serve(l, Routes::Health(health, Arc::default())));
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /livez HTTP/1.0\r\n\r\n").await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        assert!(out.starts_with("HTTP/1.0 200"), "{out}");
        assert!(out.contains("lastUpdated"), "{out}");
        task.abort();
    }
}
