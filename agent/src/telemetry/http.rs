//! The two small HTTP servers: metrics on `--metrics-addr` and kube-proxy's
//! health endpoints on `--healthz-addr`. A port that cannot be bound is logged
//! and retried, as kube-proxy does; it never stops the datapath.
use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Bytes, header};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::{debug, error, info};

use super::{Health, Metrics, metrics::CodeLabel};

const BIND_RETRY: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub enum Routes {
    /// `/metrics`.
    Metrics(Arc<Metrics>),
    /// `/healthz` and `/livez`.
    Health(Arc<Health>, Arc<Metrics>),
}

impl Routes {
    const fn what(&self) -> &'static str {
        match self {
            Self::Metrics(_) => "metrics",
            Self::Health(..) => "healthz",
        }
    }
}

/// Serves until the task is dropped.
pub async fn serve(addr: SocketAddr, routes: Routes) {
    let what = routes.what();
    let listener = loop {
        match TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(e) => {
                error!(%addr, "cannot serve {what}: {e}; retrying in {BIND_RETRY:?}");
                tokio::time::sleep(BIND_RETRY).await;
            }
        }
    };
    let local = listener.local_addr().unwrap_or(addr);
    info!(addr = %local, "serving {what}");
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                debug!("{what} accept: {e}");
                continue;
            }
        };
        let routes = routes.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let routes = routes.clone();
                async move { Ok::<_, Infallible>(answer(&routes, &req)) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                debug!(%peer, "{what} connection: {e}");
            }
        });
    }
}

fn answer<B>(routes: &Routes, req: &Request<B>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
    }
    match (routes, req.uri().path()) {
        (Routes::Metrics(m), "/metrics") => Response::builder()
            .header(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
            .body(Full::new(Bytes::from(m.encode())))
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

fn plain(code: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap_or_default()
}
