//! The CRI v1 client over containerd's unix socket.
use std::{future::Future, path::PathBuf, time::Duration};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::{
    self as pb, image_service_client::ImageServiceClient,
    runtime_service_client::RuntimeServiceClient,
};
use tonic::transport::{Channel, Endpoint, Uri};

use super::{Runtime, convert, error::*, types::*};

/// kubelet's `runtimeRequestTimeout` default.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The CRI API version this client speaks, sent in `Version`.
const API_VERSION: &str = "v1";

/// A [`Runtime`] backed by a CRI v1 runtime. Cheap to clone: clones share one
/// HTTP/2 connection, which tonic re-dials after the runtime restarts.
#[derive(Clone, Debug)]
pub struct CriRuntime {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    timeout: Duration,
}

impl CriRuntime {
    /// A client for `endpoint`: `unix:///run/containerd/containerd.sock` (the
    /// `containerRuntimeEndpoint` form) or a plain socket path. Nothing is dialled
    /// until the first call, so the kubelet may start before the runtime; call
    /// [`Runtime::version`] to check the runtime is there. Must be called inside
    /// a Tokio runtime: the connection's task is spawned on it.
    pub fn new(endpoint: &str) -> Result<Self> {
        let path = match endpoint.strip_prefix("unix://") {
            Some(p) => PathBuf::from(p),
            None if endpoint.starts_with('/') => PathBuf::from(endpoint),
            None => {
                return Err(CriError::Endpoint {
                    endpoint: endpoint.to_owned(),
                });
            }
        };
        // The URI only satisfies tonic: the connector ignores it and dials the socket.
        let channel = Endpoint::from_static("http://cri.invalid").connect_with_connector_lazy(
            tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }),
        );
        Ok(Self {
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
            timeout: DEFAULT_REQUEST_TIMEOUT,
        })
    }

    /// Replaces the per-call timeout (`runtimeRequestTimeout`).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn rt(&self) -> RuntimeServiceClient<Channel> {
        self.runtime.clone()
    }

    fn img(&self) -> ImageServiceClient<Channel> {
        self.images.clone()
    }
}

/// Runs one call bounded by `timeout` (`None`: unbounded, as kubelet does for pulls).
async fn call<T>(
    operation: &'static str,
    timeout: Option<Duration>,
    fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T> {
    let res = match timeout {
        Some(t) => tokio::time::timeout(t, fut)
            .await
            .map_err(|_| CriError::Timeout {
                operation,
                timeout: t,
            })?,
        None => fut.await,
    };
    res.map(tonic::Response::into_inner)
        .map_err(|s| CriError::from_status(operation, s))
}

/// CRI timeouts are whole seconds and 0 means none: round up so a sub-second
/// probe timeout still bounds the call.
fn whole_seconds(d: Duration) -> i64 {
    i64::try_from(d.as_secs() + u64::from(d.subsec_nanos() > 0)).unwrap_or(i64::MAX)
}

fn missing(operation: &'static str, field: &'static str) -> CriError {
    CriError::InvalidResponse {
        operation,
        field,
        value: "(missing)".into(),
    }
}

impl Runtime for CriRuntime {
    async fn version(&self) -> Result<RuntimeVersion> {
        let req = pb::VersionRequest {
            version: API_VERSION.into(),
        };
        let mut c = self.rt();
        let v = call("Version", Some(self.timeout), c.version(req)).await?;
        Ok(convert::version(v))
    }

    async fn status(&self) -> Result<RuntimeStatus> {
        let req = pb::StatusRequest { verbose: false };
        let mut c = self.rt();
        let r = call("Status", Some(self.timeout), c.status(req)).await?;
        Ok(convert::runtime_status(r.status))
    }

    async fn run_pod_sandbox(&self, config: &SandboxConfig) -> Result<String> {
        let req = pb::RunPodSandboxRequest {
            config: Some(convert::sandbox_config(config)),
            runtime_handler: String::new(),
        };
        let mut c = self.rt();
        let r = call("RunPodSandbox", Some(self.timeout), c.run_pod_sandbox(req)).await?;
        Ok(r.pod_sandbox_id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        let req = pb::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        let mut c = self.rt();
        call(
            "StopPodSandbox",
            Some(self.timeout),
            c.stop_pod_sandbox(req),
        )
        .await?;
        Ok(())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        let req = pb::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        let mut c = self.rt();
        call(
            "RemovePodSandbox",
            Some(self.timeout),
            c.remove_pod_sandbox(req),
        )
        .await?;
        Ok(())
    }

    async fn pod_sandbox_status(&self, id: &str) -> Result<SandboxStatus> {
        const OP: &str = "PodSandboxStatus";
        let req = pb::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: false,
        };
        let mut c = self.rt();
        let r = call(OP, Some(self.timeout), c.pod_sandbox_status(req)).await?;
        convert::sandbox_status(OP, r.status.ok_or_else(|| missing(OP, "status"))?)
    }

    async fn list_pod_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<SandboxInfo>> {
        let req = pb::ListPodSandboxRequest {
            filter: Some(convert::sandbox_filter(filter)),
        };
        let mut c = self.rt();
        let r = call(
            "ListPodSandbox",
            Some(self.timeout),
            c.list_pod_sandbox(req),
        )
        .await?;
        Ok(r.items.into_iter().map(convert::sandbox_info).collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        sandbox: &SandboxConfig,
    ) -> Result<String> {
        let req = pb::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(convert::container_config(config, sandbox)),
            sandbox_config: Some(convert::sandbox_config(sandbox)),
        };
        let mut c = self.rt();
        let r = call(
            "CreateContainer",
            Some(self.timeout),
            c.create_container(req),
        )
        .await?;
        Ok(r.container_id)
    }

    async fn start_container(&self, id: &str) -> Result<()> {
        let req = pb::StartContainerRequest {
            container_id: id.into(),
        };
        let mut c = self.rt();
        call("StartContainer", Some(self.timeout), c.start_container(req)).await?;
        Ok(())
    }

    async fn stop_container(&self, id: &str, grace: Duration) -> Result<()> {
        let req = pb::StopContainerRequest {
            container_id: id.into(),
            timeout: whole_seconds(grace),
        };
        let mut c = self.rt();
        // As kubelet: the grace period plus the usual budget for the runtime's own work.
        let timeout = self.timeout + grace;
        call("StopContainer", Some(timeout), c.stop_container(req)).await?;
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        let req = pb::RemoveContainerRequest {
            container_id: id.into(),
        };
        let mut c = self.rt();
        call(
            "RemoveContainer",
            Some(self.timeout),
            c.remove_container(req),
        )
        .await?;
        Ok(())
    }

    async fn container_status(&self, id: &str) -> Result<ContainerStatus> {
        const OP: &str = "ContainerStatus";
        let req = pb::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        let mut c = self.rt();
        let r = call(OP, Some(self.timeout), c.container_status(req)).await?;
        Ok(convert::container_status(
            r.status.ok_or_else(|| missing(OP, "status"))?,
        ))
    }

    async fn reopen_container_log(&self, id: &str) -> Result<()> {
        let req = pb::ReopenContainerLogRequest {
            container_id: id.into(),
        };
        let mut c = self.rt();
        call(
            "ReopenContainerLog",
            Some(self.timeout),
            c.reopen_container_log(req),
        )
        .await?;
        Ok(())
    }

    async fn list_containers(&self, filter: &ContainerFilter) -> Result<Vec<ContainerInfo>> {
        let req = pb::ListContainersRequest {
            filter: Some(convert::container_filter(filter)),
        };
        let mut c = self.rt();
        let r = call("ListContainers", Some(self.timeout), c.list_containers(req)).await?;
        Ok(r.containers
            .into_iter()
            .map(convert::container_info)
            .collect())
    }

    async fn exec_sync(&self, id: &str, cmd: &[String], timeout: Duration) -> Result<ExecResult> {
        let req = pb::ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.to_vec(),
            timeout: whole_seconds(timeout),
        };
        let mut c = self.rt();
        // The runtime enforces `timeout` on the command; the extra budget lets it
        // report that instead of the call being cut first.
        let r = call("ExecSync", Some(self.timeout + timeout), c.exec_sync(req)).await?;
        Ok(ExecResult {
            exit_code: r.exit_code,
            stdout: r.stdout,
            stderr: r.stderr,
        })
    }

    async fn exec(&self, id: &str, cmd: &[String], streams: StreamOptions) -> Result<String> {
        let req = pb::ExecRequest {
            container_id: id.into(),
            cmd: cmd.to_vec(),
            tty: streams.tty,
            stdin: streams.stdin,
            stdout: streams.stdout,
            stderr: streams.stderr,
        };
        let mut c = self.rt();
        let r = call("Exec", Some(self.timeout), c.exec(req)).await?;
        Ok(r.url)
    }

    async fn attach(&self, id: &str, streams: StreamOptions) -> Result<String> {
        let req = pb::AttachRequest {
            container_id: id.into(),
            stdin: streams.stdin,
            tty: streams.tty,
            stdout: streams.stdout,
            stderr: streams.stderr,
        };
        let mut c = self.rt();
        let r = call("Attach", Some(self.timeout), c.attach(req)).await?;
        Ok(r.url)
    }

    async fn port_forward(&self, sandbox_id: &str, ports: &[u16]) -> Result<String> {
        let req = pb::PortForwardRequest {
            pod_sandbox_id: sandbox_id.into(),
            port: ports.iter().map(|&p| i32::from(p)).collect(),
        };
        let mut c = self.rt();
        let r = call("PortForward", Some(self.timeout), c.port_forward(req)).await?;
        Ok(r.url)
    }

    async fn image_status(&self, image: &str) -> Result<Option<ImageInfo>> {
        let req = pb::ImageStatusRequest {
            image: Some(convert::image_spec(image)),
            verbose: false,
        };
        let mut c = self.img();
        let r = call("ImageStatus", Some(self.timeout), c.image_status(req)).await?;
        Ok(r.image.map(convert::image))
    }

    async fn pull_image(&self, image: &str) -> Result<String> {
        let req = pb::PullImageRequest {
            image: Some(convert::image_spec(image)),
            ..Default::default()
        };
        let mut c = self.img();
        // Pulls take as long as the registry does: kubelet bounds them by
        // progress, not by a deadline.
        let r = call("PullImage", None, c.pull_image(req)).await?;
        Ok(r.image_ref)
    }

    async fn list_images(&self) -> Result<Vec<ImageInfo>> {
        let req = pb::ListImagesRequest { filter: None };
        let mut c = self.img();
        let r = call("ListImages", Some(self.timeout), c.list_images(req)).await?;
        Ok(r.images.into_iter().map(convert::image).collect())
    }

    async fn remove_image(&self, image: &str) -> Result<()> {
        let req = pb::RemoveImageRequest {
            image: Some(convert::image_spec(image)),
        };
        let mut c = self.img();
        call("RemoveImage", Some(self.timeout), c.remove_image(req)).await?;
        Ok(())
    }

    async fn image_fs_mountpoint(&self) -> Result<Option<std::path::PathBuf>> {
        let mut c = self.img();
        let r = call(
            "ImageFsInfo",
            Some(self.timeout),
            c.image_fs_info(pb::ImageFsInfoRequest {}),
        )
        .await?;
        Ok(r.image_filesystems
            .into_iter()
            .filter_map(|f| f.fs_id)
            .map(|id| id.mountpoint)
            .find(|m| !m.is_empty())
            .map(std::path::PathBuf::from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_round_up_to_whole_seconds() {
        assert_eq!(whole_seconds(Duration::ZERO), 0);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(30)), 30);
        assert_eq!(whole_seconds(Duration::from_millis(30_500)), 31);
    }

    #[test]
    fn endpoints_must_be_unix_sockets() {
        assert!(matches!(
            CriRuntime::new("tcp://127.0.0.1:1234"),
            Err(CriError::Endpoint { .. })
        ));
    }

    #[tokio::test]
    async fn a_missing_socket_is_an_unavailable_status() {
        let rt = CriRuntime::new("unix:///nonexistent/weir-cri.sock")
            .unwrap()
            .with_timeout(Duration::from_secs(5));
        let err = rt.version().await.unwrap_err();
        assert!(
            matches!(
                err,
                CriError::Status {
                    operation: "Version",
                    code: Code::Unavailable,
                    ..
                }
            ),
            "{err:?}"
        );
    }
}
