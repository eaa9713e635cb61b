//! Request handling shared by the three listeners: authentication, routing,
//! and the `/healthz`, `/pods` and `/containerLogs` handlers.
use std::{
    io::{Read, Seek, SeekFrom},
    path::Path,
    sync::Arc,
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

/// Containers' log files are not rotated by this kubelet, so a long-lived
/// chatty container's file can be large; only its tail is read per request.
const MAX_LOG_READ: u64 = 64 << 20;

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

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
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
    let read = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || read_tail(&path)).await
    };
    match read {
        Ok(Ok(file)) => response(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            logs::to_plain(&file, &opts).into(),
        ),
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

/// The whole file, or its last [`MAX_LOG_READ`] bytes from the first whole
/// line on.
fn read_tail(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    if len <= MAX_LOG_READ {
        let mut buf = Vec::with_capacity(len as usize);
        file.read_to_end(&mut buf)?;
        return Ok(buf);
    }
    file.seek(SeekFrom::Start(len - MAX_LOG_READ))?;
    let mut buf = Vec::with_capacity(MAX_LOG_READ as usize);
    file.take(MAX_LOG_READ).read_to_end(&mut buf)?;
    let start = buf.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
    Ok(buf.split_off(start))
}

#[cfg(test)]
mod tests {
    use super::*;

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
