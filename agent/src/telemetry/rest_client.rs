//! client-go's request metrics (`rest_client_requests_total`,
//! `rest_client_request_duration_seconds`) for the agent's kube client, so
//! the alerts operators have on kube-proxy's API traffic (429 storms, slow
//! lists) keep working.
//!
//! A tower layer on the outside of kube's stack: one observation per
//! request the agent makes, retries inside kube's stack included in its
//! duration. As in client-go, the duration ends when the response's headers
//! arrive, so a watch counts its setup, not its lifetime.
use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Instant,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

/// client-go's buckets for `rest_client_request_duration_seconds`.
const BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabel {
    pub code: String,
    pub method: String,
    pub host: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DurationLabel {
    pub verb: String,
    pub host: String,
}

#[derive(Clone, Debug)]
pub struct RestClientMetrics {
    requests: Family<RequestLabel, Counter>,
    duration: Family<DurationLabel, Histogram>,
    /// The same requests' outcome for `/statusz`.
    contact: std::sync::Arc<super::status::ApiContact>,
}

impl Default for RestClientMetrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(|| Histogram::new(BUCKETS)),
            contact: std::sync::Arc::default(),
        }
    }
}

impl RestClientMetrics {
    /// Registers both families, unprefixed as client-go names them.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "rest_client_requests",
            "Number of HTTP requests, partitioned by status code, method, and host.",
            self.requests.clone(),
        );
        r.register(
            "rest_client_request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host.",
            self.duration.clone(),
        );
    }

    /// One finished request: `code` is the HTTP status, or client-go's
    /// `<error>` when none came back.
    pub fn observe(&self, method: &str, host: &str, code: &str, secs: f64) {
        self.contact.observe(code);
        self.requests
            .get_or_create(&RequestLabel {
                code: code.to_owned(),
                method: method.to_owned(),
                host: host.to_owned(),
            })
            .inc();
        self.duration
            .get_or_create(&DurationLabel {
                verb: method.to_owned(),
                host: host.to_owned(),
            })
            .observe(secs);
    }

    pub fn contact(&self) -> std::sync::Arc<super::status::ApiContact> {
        self.contact.clone()
    }

    /// The layer for a client of the API server at `host` (`host:port`, the
    /// label client-go gives).
    pub fn layer(&self, host: String) -> Layer {
        self.contact.set_server(&host);
        Layer {
            metrics: self.clone(),
            host,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Layer {
    metrics: RestClientMetrics,
    host: String,
}

impl<S> tower::Layer<S> for Layer {
    type Service = Measured<S>;

    fn layer(&self, inner: S) -> Measured<S> {
        Measured {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Measured<S> {
    inner: S,
    layer: Layer,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for Measured<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req.method().as_str().to_owned();
        let layer = self.layer.clone();
        let start = Instant::now();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await;
            let code = match &res {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => "<error>".to_owned(),
            };
            let secs = start.elapsed().as_secs_f64();
            layer.metrics.observe(&method, &layer.host, &code, secs);
            res
        })
    }
}

/// client-go's host label: the server URL's `host:port`.
pub fn host_label(uri: &http::Uri) -> String {
    let host = uri.host().unwrap_or_default();
    match uri.port_u16() {
        Some(p) => format!("{host}:{p}"),
        None if uri.scheme_str() == Some("http") => format!("{host}:80"),
        None => format!("{host}:443"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer as _, Service as _};

    #[tokio::test]
    async fn counts_each_request_by_code_method_and_host() {
        let m = RestClientMetrics::default();
        let mut svc = m.layer("10.96.0.1:443".into()).layer(tower::service_fn(
            |req: http::Request<()>| async move {
                if req.uri().path() == "/fail" {
                    return Err("connection refused");
                }
                let status = if req.method() == http::Method::POST {
                    429
                } else {
                    200
                };
                Ok(http::Response::builder().status(status).body(()).unwrap())
            },
        ));
        let get = |p: &str| http::Request::get(p).body(()).unwrap();
        svc.call(get("/api/v1/services")).await.unwrap();
        svc.call(get("/api/v1/services")).await.unwrap();
        svc.call(http::Request::post("/x").body(()).unwrap())
            .await
            .unwrap();
        svc.call(get("/fail")).await.unwrap_err();

        let mut r = Registry::default();
        m.register(&mut r);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        for line in [
            "rest_client_requests_total{code=\"200\",method=\"GET\",host=\"10.96.0.1:443\"} 2",
            "rest_client_requests_total{code=\"429\",method=\"POST\",host=\"10.96.0.1:443\"} 1",
            "rest_client_requests_total{code=\"<error>\",method=\"GET\",host=\"10.96.0.1:443\"} 1",
            "rest_client_request_duration_seconds_count{verb=\"GET\",host=\"10.96.0.1:443\"} 3",
            "rest_client_request_duration_seconds_bucket{le=\"60.0\",verb=\"POST\",host=\"10.96.0.1:443\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }

    #[test]
    fn host_label_has_the_port_client_go_shows() {
        let h = |s: &str| host_label(&s.parse().unwrap());
        assert_eq!(h("https://10.96.0.1"), "10.96.0.1:443");
        assert_eq!(h("https://api.example:6443/"), "api.example:6443");
        assert_eq!(h("http://127.0.0.1"), "127.0.0.1:80");
    }
}
