//! The container runtime as the kubelet sees it: a [`Runtime`] trait over our
//! own types, [`CriRuntime`] for containerd (CRI v1 over a unix socket) and
//! [`FakeRuntime`] to unit test what drives it.
mod client;
mod convert;
mod error;
mod fake;
mod types;

use std::{future::Future, time::Duration};

pub use client::{CriRuntime, DEFAULT_REQUEST_TIMEOUT};
pub use error::{Code, CriError, Result};
pub use fake::FakeRuntime;
pub use types::*;

/// The CRI operations the kubelet uses. Every future is `Send` so pod workers
/// can run on a multi-threaded runtime; implementations are shared by reference.
pub trait Runtime: Send + Sync {
    fn version(&self) -> impl Future<Output = Result<RuntimeVersion>> + Send;
    /// The runtime's conditions (`RuntimeReady`, `NetworkReady`).
    fn status(&self) -> impl Future<Output = Result<RuntimeStatus>> + Send;

    /// Creates and starts the sandbox (pause container and network); returns its id.
    fn run_pod_sandbox(
        &self,
        config: &SandboxConfig,
    ) -> impl Future<Output = Result<String>> + Send;
    /// Stops every container of the sandbox and tears its network down. Idempotent.
    fn stop_pod_sandbox(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
    /// Removes a stopped sandbox and its containers. Idempotent.
    fn remove_pod_sandbox(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
    fn pod_sandbox_status(&self, id: &str) -> impl Future<Output = Result<SandboxStatus>> + Send;
    fn list_pod_sandboxes(
        &self,
        filter: &SandboxFilter,
    ) -> impl Future<Output = Result<Vec<SandboxInfo>>> + Send;

    /// `sandbox` is the config the sandbox was run with: the runtime derives
    /// the container's namespaces and cgroup from it.
    fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        sandbox: &SandboxConfig,
    ) -> impl Future<Output = Result<String>> + Send;
    fn start_container(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
    /// SIGTERM, then SIGKILL once `grace` has passed.
    fn stop_container(&self, id: &str, grace: Duration) -> impl Future<Output = Result<()>> + Send;
    fn remove_container(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
    fn container_status(&self, id: &str) -> impl Future<Output = Result<ContainerStatus>> + Send;
    /// Makes the runtime write the container's output to a new file at its
    /// log path (the old one was renamed away: log rotation).
    fn reopen_container_log(&self, id: &str) -> impl Future<Output = Result<()>> + Send;
    fn list_containers(
        &self,
        filter: &ContainerFilter,
    ) -> impl Future<Output = Result<Vec<ContainerInfo>>> + Send;
    /// Runs `cmd` in the container and waits for it, at most `timeout`.
    fn exec_sync(
        &self,
        id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> impl Future<Output = Result<ExecResult>> + Send;

    /// Prepares an interactive `cmd` in the container; returns the URL of
    /// the runtime's streaming server that serves it (once, for a while).
    fn exec(
        &self,
        id: &str,
        cmd: &[String],
        streams: StreamOptions,
    ) -> impl Future<Output = Result<String>> + Send;
    /// Like [`Self::exec`], to the container's own process.
    fn attach(
        &self,
        id: &str,
        streams: StreamOptions,
    ) -> impl Future<Output = Result<String>> + Send;
    /// The streaming URL that forwards connections to `ports` in the
    /// sandbox's network namespace (all of them when empty: the client
    /// names each port per stream).
    fn port_forward(
        &self,
        sandbox_id: &str,
        ports: &[u16],
    ) -> impl Future<Output = Result<String>> + Send;

    /// `None` when the image is not present on the node.
    fn image_status(&self, image: &str) -> impl Future<Output = Result<Option<ImageInfo>>> + Send;
    /// Returns the pulled image's reference (its id).
    fn pull_image(&self, image: &str) -> impl Future<Output = Result<String>> + Send;
    fn list_images(&self) -> impl Future<Output = Result<Vec<ImageInfo>>> + Send;
    fn remove_image(&self, image: &str) -> impl Future<Output = Result<()>> + Send;
    /// Where the runtime keeps its images (`ImageFsInfo`): the first image
    /// filesystem's mount point, `None` when it names none.
    fn image_fs_mountpoint(
        &self,
    ) -> impl Future<Output = Result<Option<std::path::PathBuf>>> + Send;
}
