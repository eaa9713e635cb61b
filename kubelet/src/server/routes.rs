//! Request handling shared by the three listeners: authentication, routing,
//! and the `/healthz`, `/pods` and `/containerLogs` handlers (the streaming
//! ones are in [`super::streaming`]).
use std::{
    io,
    path::Path,
    sync::{Arc, LazyLock},
};

use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header,
};
use k8s_openapi::api::core::v1::Pod;

use super::{
    Endpoint,
    follow::{self, Follow},
    logs::{self, LogOptions},
    streaming::{self, Kind, StreamRuntime},
};
use crate::flow::PodsView;

/// Every response's body: most are whole, a followed log is a stream.
pub(super) type Body = http_body_util::combinators::BoxBody<Bytes, io::Error>;

pub(super) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|e| match e {}).boxed()
}

/// Log requests served at once: each may hold up to
/// [`logs::MAX_LOG_READ`] (and its output) in memory, so their number is
/// what bounds the kubelet's memory, not the clients' patience.
const MAX_CONCURRENT_LOG_REQUESTS: usize = 4;
static LOG_REQUESTS: LazyLock<tokio::sync::Semaphore> =
    LazyLock::new(|| tokio::sync::Semaphore::new(MAX_CONCURRENT_LOG_REQUESTS));

#[derive(Debug, PartialEq, Eq)]
enum Route<'a> {
    Healthz,
    Pods,
    ContainerLogs {
        namespace: &'a str,
        pod: &'a str,
        container: &'a str,
    },
    Stream {
        kind: Kind,
        namespace: &'a str,
        pod: &'a str,
        /// `None` for port forwarding, which enters the pod, not a container.
        container: Option<&'a str>,
    },
}

fn route(endpoint: Endpoint, path: &str) -> Option<Route<'_>> {
    match (endpoint, path) {
        (_, "/healthz") => Some(Route::Healthz),
        (Endpoint::Healthz, _) => None,
        (_, "/pods" | "/pods/") => Some(Route::Pods),
        // The read-only port serves no logs, as the kubelet's does not.
        (Endpoint::ReadOnly, _) => None,
        (Endpoint::Api, _) => {
            let (area, rest) = path.strip_prefix('/')?.split_once('/')?;
            let parts: Vec<&str> = rest.split('/').collect();
            if parts.iter().any(|p| p.is_empty()) {
                return None;
            }
            let stream = |kind| match parts[..] {
                [namespace, pod, container] => Some(Route::Stream {
                    kind,
                    namespace,
                    pod,
                    container: Some(container),
                }),
                _ => None,
            };
            match (area, &parts[..]) {
                ("containerLogs", &[namespace, pod, container]) => Some(Route::ContainerLogs {
                    namespace,
                    pod,
                    container,
                }),
                ("exec", _) => stream(Kind::Exec),
                ("attach", _) => stream(Kind::Attach),
                ("portForward", &[namespace, pod]) => Some(Route::Stream {
                    kind: Kind::PortForward,
                    namespace,
                    pod,
                    container: None,
                }),
                _ => None,
            }
        }
    }
}

pub(super) async fn handle(
    pods: &Arc<dyn PodsView>,
    runtime: Option<&Arc<dyn StreamRuntime>>,
    endpoint: Endpoint,
    authenticated: bool,
    req: Request<Incoming>,
) -> Response<Body> {
    // Before routing, as the kubelet's authentication filter: an anonymous
    // client learns nothing, not even which paths exist.
    if endpoint == Endpoint::Api && !authenticated {
        return text(StatusCode::UNAUTHORIZED, "Unauthorized\n");
    }
    let Some(route) = route(endpoint, req.uri().path()) else {
        return text(StatusCode::NOT_FOUND, "404 page not found\n");
    };
    // The kubelet takes both for the streaming endpoints: kubectl's SPDY
    // client POSTs, its WebSocket client GETs.
    let allowed: &[Method] = match route {
        Route::Stream { .. } => &[Method::GET, Method::POST],
        _ => &[Method::GET],
    };
    if !allowed.contains(req.method()) {
        let names: Vec<&str> = allowed.iter().map(Method::as_str).collect();
        let mut resp = text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!(
                "{} is not allowed here, only {}\n",
                req.method(),
                names.join(", ")
            ),
        );
        if let Ok(v) = header::HeaderValue::from_str(&names.join(", ")) {
            resp.headers_mut().insert(header::ALLOW, v);
        }
        return resp;
    }
    match route {
        Route::Stream {
            kind,
            namespace,
            pod,
            container,
        } => {
            let (namespace, pod) = (namespace.to_owned(), pod.to_owned());
            let container = container.map(str::to_owned);
            streaming::handle(
                kind,
                pods,
                runtime,
                (&namespace, &pod, container.as_deref()),
                req,
            )
            .await
        }
        Route::Healthz => text(StatusCode::OK, "ok"),
        Route::Pods => pod_list(pods.as_ref()),
        Route::ContainerLogs {
            namespace,
            pod,
            container,
        } => container_logs(pods, namespace, pod, container, req.uri().query()).await,
    }
}

pub(super) fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    response(status, "text/plain; charset=utf-8", full(body))
}

fn response(status: StatusCode, content_type: &'static str, body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    resp
}

fn pod_list(pods: &dyn PodsView) -> Response<Body> {
    let list = k8s_openapi::List::<Pod> {
        items: pods.pods(),
        metadata: Default::default(),
    };
    match serde_json::to_vec(&list) {
        Ok(body) => response(StatusCode::OK, "application/json", full(body)),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode the pod list: {e}\n"),
        ),
    }
}

async fn container_logs(
    view: &Arc<dyn PodsView>,
    namespace: &str,
    pod: &str,
    container: &str,
    query: Option<&str>,
) -> Response<Body> {
    let opts = match LogOptions::from_query(query) {
        Ok(o) => o,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("{e}\n")),
    };
    // The kubelet's messages, so that kubectl users see familiar errors.
    let pods = view.pods();
    let Some(found) = pods.iter().find(|p| {
        p.metadata.name.as_deref() == Some(pod)
            && p.metadata.namespace.as_deref().unwrap_or("default") == namespace
    }) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod \"{pod}\" does not exist\n"),
        );
    };
    if !has_container(found, container) {
        return text(
            StatusCode::NOT_FOUND,
            format!("container \"{container}\" not found in pod \"{pod}\"\n"),
        );
    }
    let instance = view.container(namespace, pod, container);
    let path = match (&instance, opts.previous) {
        (Some(c), false) => c.log.clone(),
        (Some(c), true) => c.previous_log.clone(),
        (None, _) => None,
    };
    let Some(path) = path else {
        return text(
            StatusCode::BAD_REQUEST,
            if opts.previous {
                format!(
                    "previous terminated container \"{container}\" in pod \"{pod}\" not found\n"
                )
            } else {
                format!("container \"{container}\" in pod \"{pod}\" is waiting to start\n")
            },
        );
    };
    // Refused rather than queued: a queue would hold connections (and
    // their memory) instead, and clients retry on 429. A follower gives its
    // permit back after the first read: following holds little memory.
    let Ok(permit) = LOG_REQUESTS.try_acquire() else {
        let mut r = text(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "too many concurrent log requests (at most {MAX_CONCURRENT_LOG_REQUESTS}), retry later\n"
            ),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        return r;
    };
    // Only the running instance has more to come; a previous one is whole.
    let follow = instance
        .filter(|c| opts.follow && !opts.previous && c.running)
        .map(|c| c.id);
    let read = {
        let (path, opts, following) = (path.clone(), opts.clone(), follow.is_some());
        tokio::task::spawn_blocking(move || {
            let mut file = std::fs::File::open(&path)?;
            let mut len = file.metadata()?.len();
            // A follower sends a record being written once it is whole.
            if following {
                len = follow::whole_records_end(&mut file, len)?;
            }
            let out = logs::read_log(&mut file, len, &opts, logs::MAX_LOG_READ)?;
            io::Result::Ok((out, len))
        })
        .await
    };
    drop(permit);
    let (out, offset) = match read {
        Ok(Ok(x)) => x,
        Ok(Err(e)) if e.kind() == io::ErrorKind::NotFound => {
            return text(
                StatusCode::NOT_FOUND,
                format!(
                    "log file {} of container \"{container}\" in pod \"{pod}\" is gone\n",
                    path.display()
                ),
            );
        }
        Ok(Err(e)) => return log_error(&path, &e),
        Err(e) => return log_error(&path, &e),
    };
    let Some(id) = follow else {
        return response(StatusCode::OK, "text/plain; charset=utf-8", full(out));
    };
    let remaining = opts.limit_bytes.map(|l| l.saturating_sub(out.len()));
    let f = Follow {
        view: view.clone(),
        namespace: namespace.to_owned(),
        pod: pod.to_owned(),
        container: container.to_owned(),
        id,
        path,
        offset,
        opts: LogOptions {
            tail_lines: None,
            limit_bytes: None,
            ..opts
        },
        remaining,
    };
    // A small queue: a slow client slows the follower, it does not buffer.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(follow::run(f, out, tx));
    let frames = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (chunk.map(hyper::body::Frame::data), rx))
    });
    response(
        StatusCode::OK,
        "text/plain; charset=utf-8",
        StreamBody::new(frames).boxed(),
    )
}

fn log_error(path: &Path, e: &dyn std::fmt::Display) -> Response<Body> {
    tracing::warn!(path = %path.display(), "cannot read container log: {e}");
    text(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("cannot read {}: {e}\n", path.display()),
    )
}

fn has_container(pod: &Pod, name: &str) -> bool {
    let Some(spec) = &pod.spec else {
        return false;
    };
    spec.containers.iter().any(|c| c.name == name)
        || spec
            .init_containers
            .iter()
            .flatten()
            .any(|c| c.name == name)
        || spec
            .ephemeral_containers
            .iter()
            .flatten()
            .any(|c| c.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct OneLog(std::path::PathBuf);

    impl PodsView for OneLog {
        fn pods(&self) -> Vec<Pod> {
            vec![
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "p", "namespace": "ns"},
                    "spec": {"containers": [{"name": "c"}]},
                }))
                .unwrap(),
            ]
        }
        fn container(&self, _: &str, _: &str, _: &str) -> Option<crate::flow::ContainerRef> {
            Some(crate::flow::ContainerRef {
                id: "c1".into(),
                log: Some(self.0.clone()),
                ..Default::default()
            })
        }
        fn sandbox(&self, _: &str, _: &str) -> Option<String> {
            None
        }
    }

    /// Issue 12 item 5: at most MAX_CONCURRENT_LOG_REQUESTS log requests
    /// run at once; one more is refused with 429, not queued.
    #[tokio::test]
    async fn log_requests_beyond_the_limit_get_429() {
        let file = std::env::temp_dir().join(format!("weir-routes-log-{}", std::process::id()));
        std::fs::write(&file, "t stdout F one\nt stdout F two\n").unwrap();
        let view: Arc<dyn PodsView> = Arc::new(OneLog(file.clone()));
        let held = LOG_REQUESTS
            .try_acquire_many(MAX_CONCURRENT_LOG_REQUESTS as u32)
            .unwrap();
        let r = container_logs(&view, "ns", "p", "c", None).await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        drop(held);
        let r = container_logs(&view, "ns", "p", "c", Some("tailLines=1")).await;
        assert_eq!(r.status(), StatusCode::OK);
        let body = http_body_util::BodyExt::collect(r.into_body())
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(&body[..], b"two\n");
        std::fs::remove_file(&file).unwrap();
    }

    #[test]
    fn routes_per_endpoint() {
        use Endpoint::*;
        assert_eq!(route(Healthz, "/healthz"), Some(Route::Healthz));
        assert_eq!(route(Healthz, "/pods"), None);
        assert_eq!(route(ReadOnly, "/pods"), Some(Route::Pods));
        assert_eq!(route(ReadOnly, "/containerLogs/a/b/c"), None);
        assert_eq!(
            route(Api, "/containerLogs/ns/p/c"),
            Some(Route::ContainerLogs {
                namespace: "ns",
                pod: "p",
                container: "c"
            })
        );
        assert_eq!(route(Api, "/containerLogs/ns/p"), None);
        assert_eq!(route(Api, "/containerLogs/ns/p/c/d"), None);
        assert_eq!(route(Api, "/containerLogs/ns//c"), None);
        assert_eq!(
            route(Api, "/exec/ns/p/c"),
            Some(Route::Stream {
                kind: Kind::Exec,
                namespace: "ns",
                pod: "p",
                container: Some("c")
            })
        );
        assert_eq!(route(ReadOnly, "/exec/ns/p/c"), None);
        assert_eq!(route(Api, "/exec/ns/p"), None);
        assert_eq!(route(Api, "/attach/ns/p/c/"), None);
        assert_eq!(
            route(Api, "/portForward/ns/p"),
            Some(Route::Stream {
                kind: Kind::PortForward,
                namespace: "ns",
                pod: "p",
                container: None
            })
        );
        assert_eq!(route(Api, "/portForward/ns/p/c"), None);
        assert_eq!(route(Api, "/other/ns/p/c"), None);
    }
}
