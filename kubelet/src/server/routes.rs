//! Request handling shared by the three listeners: authentication, routing,
//! and the `/healthz`, `/pods` and `/containerLogs` handlers.
use std::{
    path::Path,
    sync::{Arc, LazyLock},
};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header,
};
use k8s_openapi::api::core::v1::Pod;

use super::{
    Endpoint,
    logs::{self, LogOptions},
};
use crate::flow::PodsView;

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
}

fn route(endpoint: Endpoint, path: &str) -> Option<Route<'_>> {
    match (endpoint, path) {
        (_, "/healthz") => Some(Route::Healthz),
        (Endpoint::Healthz, _) => None,
        (_, "/pods" | "/pods/") => Some(Route::Pods),
        // The read-only port serves no logs, as the kubelet's does not.
        (Endpoint::ReadOnly, _) => None,
        (Endpoint::Api, _) => {
            let rest = path.strip_prefix("/containerLogs/")?;
            let mut parts = rest.split('/');
            match (parts.next(), parts.next(), parts.next(), parts.next()) {
                (Some(namespace), Some(pod), Some(container), None)
                    if !namespace.is_empty() && !pod.is_empty() && !container.is_empty() =>
                {
                    Some(Route::ContainerLogs {
                        namespace,
                        pod,
                        container,
                    })
                }
                _ => None,
            }
        }
    }
}

pub(super) async fn handle(
    pods: &Arc<dyn PodsView>,
    endpoint: Endpoint,
    authenticated: bool,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    // Before routing, as the kubelet's authentication filter: an anonymous
    // client learns nothing, not even which paths exist.
    if endpoint == Endpoint::Api && !authenticated {
        return text(StatusCode::UNAUTHORIZED, "Unauthorized\n");
    }
    let Some(route) = route(endpoint, req.uri().path()) else {
        return text(StatusCode::NOT_FOUND, "404 page not found\n");
    };
    if req.method() != Method::GET {
        let mut resp = text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} is not allowed here, only GET\n", req.method()),
        );
        resp.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET"));
        return resp;
    }
    match route {
        Route::Healthz => text(StatusCode::OK, "ok"),
        Route::Pods => pod_list(pods.as_ref()),
        Route::ContainerLogs {
            namespace,
            pod,
            container,
        } => container_logs(pods, namespace, pod, container, req.uri().query()).await,
    }
}

pub(super) fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    response(status, "text/plain; charset=utf-8", body.into())
}

fn response(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    resp
}

fn pod_list(pods: &dyn PodsView) -> Response<Full<Bytes>> {
    let list = k8s_openapi::List::<Pod> {
        items: pods.pods(),
        metadata: Default::default(),
    };
    match serde_json::to_vec(&list) {
        Ok(body) => response(StatusCode::OK, "application/json", body.into()),
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
) -> Response<Full<Bytes>> {
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
    let Some(path) = view.container_log(namespace, pod, container) else {
        return text(
            StatusCode::BAD_REQUEST,
            format!("container \"{container}\" in pod \"{pod}\" is waiting to start\n"),
        );
    };
    // Refused rather than queued: a queue would hold connections (and
    // their memory) instead, and clients retry on 429.
    let Ok(_permit) = LOG_REQUESTS.try_acquire() else {
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
    let read = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || {
            let mut file = std::fs::File::open(&path)?;
            let len = file.metadata()?.len();
            logs::read_log(&mut file, len, &opts, logs::MAX_LOG_READ)
        })
        .await
    };
    match read {
        Ok(Ok(out)) => response(StatusCode::OK, "text/plain; charset=utf-8", out.into()),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => text(
            StatusCode::NOT_FOUND,
            format!(
                "log file {} of container \"{container}\" in pod \"{pod}\" is gone\n",
                path.display()
            ),
        ),
        Ok(Err(e)) => log_error(&path, &e),
        Err(e) => log_error(&path, &e),
    }
}

fn log_error(path: &Path, e: &dyn std::fmt::Display) -> Response<Full<Bytes>> {
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
        fn container_log(&self, _: &str, _: &str, _: &str) -> Option<std::path::PathBuf> {
            Some(self.0.clone())
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
        assert_eq!(route(Api, "/exec/ns/p/c"), None);
    }
}
