//! An in-memory [`Runtime`] for unit tests of the code that drives it. It keeps
//! the CRI's rules that callers depend on (ids, states, idempotent removal,
//! NotFound for unknown ids, label filters) and lets the test play the
//! processes: exits, exec results and failures.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
    sync::{Mutex, MutexGuard},
    time::{Duration, SystemTime},
};

use super::{Runtime, error::*, types::*};

type ExecHandler = Box<dyn Fn(&ContainerStatus, &[String]) -> ExecResult + Send + Sync>;

struct Sandbox {
    config: SandboxConfig,
    state: SandboxState,
    ip: IpAddr,
    created_at: SystemTime,
}

struct Container {
    sandbox_id: String,
    status: ContainerStatus,
}

#[derive(Default)]
struct State {
    next_id: u64,
    sandboxes: BTreeMap<String, Sandbox>,
    containers: BTreeMap<String, Container>,
    images: BTreeSet<String>,
    /// The image config's user (uid, or name), by image; none means root.
    image_users: BTreeMap<String, (Option<i64>, String)>,
    registry: BTreeSet<String>,
    runtime_status: Option<RuntimeStatus>,
    calls: Vec<String>,
    fail: BTreeMap<&'static str, CriError>,
    /// The base of streaming URLs; see [`FakeRuntime::set_stream_server`].
    stream_server: String,
    /// Containers whose process ignores SIGTERM: see [`FakeRuntime::ignore_sigterm`].
    stubborn: BTreeSet<String>,
}

impl State {
    fn id(&mut self, kind: &str) -> String {
        self.next_id += 1;
        format!("{kind}{:04}", self.next_id)
    }
}

#[derive(Default)]
pub struct FakeRuntime {
    state: Mutex<State>,
    exec: Mutex<Option<ExecHandler>>,
}

fn not_found(operation: &'static str, what: &str) -> CriError {
    CriError::NotFound {
        operation,
        message: what.to_owned(),
    }
}

fn matches(labels: &Labels, want: &Labels) -> bool {
    want.iter().all(|(k, v)| labels.get(k) == Some(v))
}

impl FakeRuntime {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self, call: &str) -> MutexGuard<'_, State> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.calls.push(call.to_owned());
        s
    }

    /// An image already present on the node.
    pub fn add_image(&self, image: &str) {
        self.lock("").images.insert(image.to_owned());
    }

    /// The `User` of `image`'s config: a uid, or a name (`uid` `None`).
    pub fn set_image_user(&self, image: &str, uid: Option<i64>, username: &str) {
        self.lock("")
            .image_users
            .insert(image.to_owned(), (uid, username.to_owned()));
    }

    /// What `status` answers; both conditions true until set.
    pub fn set_status(&self, status: RuntimeStatus) {
        self.lock("").runtime_status = Some(status);
    }

    /// An image `pull_image` can fetch; others fail as an unreachable registry does.
    pub fn add_registry_image(&self, image: &str) {
        self.lock("").registry.insert(image.to_owned());
    }

    /// The next call of `operation` (a CRI method name, e.g. `StartContainer`) fails.
    pub fn fail_next(&self, operation: &'static str, error: CriError) {
        self.lock("").fail.insert(operation, error);
    }

    /// What `exec_sync` returns; by default every command exits 0 silently.
    pub fn on_exec(
        &self,
        handler: impl Fn(&ContainerStatus, &[String]) -> ExecResult + Send + Sync + 'static,
    ) {
        *self.exec.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(handler));
    }

    /// The container's process exits with `code`, as a crash or completion would.
    /// The container's process ignores SIGTERM: `stop_container` returns
    /// only when its grace period ran out (on Tokio's clock), killing it
    /// then; a stop cancelled before that leaves it running.
    pub fn ignore_sigterm(&self, id: &str) {
        self.lock("").stubborn.insert(id.to_owned());
    }

    pub fn exit_container(&self, id: &str, code: i32) {
        let mut s = self.lock("");
        if let Some(c) = s.containers.get_mut(id)
            && c.status.state == ContainerState::Running
        {
            c.status.state = ContainerState::Exited;
            c.status.exit_code = code;
            c.status.reason = if code == 0 { "Completed" } else { "Error" }.into();
            c.status.finished_at = Some(SystemTime::now());
        }
    }

    /// Where the URLs `Exec`, `Attach` and `PortForward` return point
    /// (`http://host:port`); a test serves its own streaming server there.
    pub fn set_stream_server(&self, base: &str) {
        self.lock("").stream_server = base.to_owned();
    }

    /// A running container's streaming URL, as containerd refuses others.
    fn stream_url(&self, operation: &'static str, id: &str, kind: &str) -> Result<String> {
        let s = self.begin(operation)?;
        let c = s
            .containers
            .get(id)
            .ok_or_else(|| not_found(operation, id))?;
        if c.status.state != ContainerState::Running {
            return Err(CriError::Status {
                operation,
                code: Code::Unknown,
                message: format!("container {id} is not running"),
            });
        }
        Ok(format!("{}/{kind}/{id}", s.stream_server))
    }

    /// Every CRI method called so far, in order (e.g. `RunPodSandbox`).
    pub fn calls(&self) -> Vec<String> {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.calls.iter().filter(|c| !c.is_empty()).cloned().collect()
    }

    fn begin(&self, operation: &'static str) -> Result<MutexGuard<'_, State>> {
        let mut s = self.lock(operation);
        match s.fail.remove(operation) {
            Some(e) => Err(e),
            None => Ok(s),
        }
    }
}

impl Runtime for FakeRuntime {
    async fn version(&self) -> Result<RuntimeVersion> {
        drop(self.begin("Version")?);
        Ok(RuntimeVersion {
            version: "0.1.0".into(),
            runtime_name: "fake".into(),
            runtime_version: "0.0.1".into(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn status(&self) -> Result<RuntimeStatus> {
        let s = self.begin("Status")?;
        let ready = |type_: &str| RuntimeCondition {
            type_: type_.into(),
            status: true,
            ..Default::default()
        };
        Ok(s.runtime_status.clone().unwrap_or_else(|| RuntimeStatus {
            conditions: vec![ready(RUNTIME_READY), ready(NETWORK_READY)],
        }))
    }

    async fn run_pod_sandbox(&self, config: &SandboxConfig) -> Result<String> {
        let mut s = self.begin("RunPodSandbox")?;
        let id = s.id("sandbox");
        let n = u8::try_from(s.sandboxes.len() % 250).unwrap_or(0) + 2;
        let ip = if config.security.host_network {
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        } else {
            IpAddr::V4(Ipv4Addr::new(10, 88, 0, n))
        };
        let sandbox = Sandbox {
            config: config.clone(),
            state: SandboxState::Ready,
            ip,
            created_at: SystemTime::now(),
        };
        s.sandboxes.insert(id.clone(), sandbox);
        Ok(id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        const OP: &str = "StopPodSandbox";
        let mut s = self.begin(OP)?;
        let sb = s.sandboxes.get_mut(id).ok_or_else(|| not_found(OP, id))?;
        sb.state = SandboxState::NotReady;
        for c in s.containers.values_mut().filter(|c| c.sandbox_id == id) {
            if c.status.state == ContainerState::Running {
                c.status.state = ContainerState::Exited;
                c.status.exit_code = 137;
                c.status.reason = "Error".into();
                c.status.finished_at = Some(SystemTime::now());
            }
        }
        Ok(())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut s = self.begin("RemovePodSandbox")?;
        s.sandboxes.remove(id);
        s.containers.retain(|_, c| c.sandbox_id != id);
        Ok(())
    }

    async fn pod_sandbox_status(&self, id: &str) -> Result<SandboxStatus> {
        const OP: &str = "PodSandboxStatus";
        let s = self.begin(OP)?;
        let sb = s.sandboxes.get(id).ok_or_else(|| not_found(OP, id))?;
        let c = &sb.config;
        Ok(SandboxStatus {
            id: id.to_owned(),
            name: c.name.clone(),
            namespace: c.namespace.clone(),
            uid: c.uid.clone(),
            attempt: c.attempt,
            state: sb.state,
            ip: (sb.state == SandboxState::Ready).then_some(sb.ip),
            additional_ips: Vec::new(),
            created_at: sb.created_at,
            labels: c.labels.clone(),
            annotations: c.annotations.clone(),
        })
    }

    async fn list_pod_sandboxes(&self, filter: &SandboxFilter) -> Result<Vec<SandboxInfo>> {
        let s = self.begin("ListPodSandbox")?;
        Ok(s.sandboxes
            .iter()
            .filter(|(id, sb)| {
                filter.id.as_ref().is_none_or(|f| f == *id)
                    && filter.state.is_none_or(|st| st == sb.state)
                    && matches(&sb.config.labels, &filter.labels)
            })
            .map(|(id, sb)| SandboxInfo {
                id: id.clone(),
                name: sb.config.name.clone(),
                namespace: sb.config.namespace.clone(),
                uid: sb.config.uid.clone(),
                attempt: sb.config.attempt,
                state: sb.state,
                created_at: sb.created_at,
                labels: sb.config.labels.clone(),
                annotations: sb.config.annotations.clone(),
            })
            .collect())
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: &ContainerConfig,
        _sandbox: &SandboxConfig,
    ) -> Result<String> {
        const OP: &str = "CreateContainer";
        let mut s = self.begin(OP)?;
        let sb = s
            .sandboxes
            .get(sandbox_id)
            .ok_or_else(|| not_found(OP, sandbox_id))?;
        if sb.state != SandboxState::Ready {
            return Err(CriError::Status {
                operation: OP,
                code: Code::Unknown,
                message: format!("sandbox {sandbox_id} is not ready"),
            });
        }
        if !s.images.contains(&config.image) {
            return Err(CriError::NotFound {
                operation: OP,
                message: format!("image {:?}", config.image),
            });
        }
        let id = s.id("container");
        let status = ContainerStatus {
            id: id.clone(),
            name: config.name.clone(),
            attempt: config.attempt,
            state: ContainerState::Created,
            created_at: SystemTime::now(),
            started_at: None,
            finished_at: None,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            image: config.image.clone(),
            image_ref: format!("sha256:fake-{}", config.image),
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            log_path: config.log_path.clone(),
        };
        let container = Container {
            sandbox_id: sandbox_id.to_owned(),
            status,
        };
        s.containers.insert(id.clone(), container);
        Ok(id)
    }

    async fn start_container(&self, id: &str) -> Result<()> {
        const OP: &str = "StartContainer";
        let mut s = self.begin(OP)?;
        let c = s.containers.get_mut(id).ok_or_else(|| not_found(OP, id))?;
        if c.status.state != ContainerState::Created {
            return Err(CriError::Status {
                operation: OP,
                code: Code::Unknown,
                message: format!("container {id} is {:?}, not created", c.status.state),
            });
        }
        c.status.state = ContainerState::Running;
        c.status.started_at = Some(SystemTime::now());
        Ok(())
    }

    async fn stop_container(&self, id: &str, grace: Duration) -> Result<()> {
        const OP: &str = "StopContainer";
        let stubborn = {
            let s = self.begin(OP)?;
            let c = s.containers.get(id).ok_or_else(|| not_found(OP, id))?;
            c.status.state == ContainerState::Running && s.stubborn.contains(id)
        };
        if stubborn {
            tokio::time::sleep(grace).await;
        }
        let mut s = self.lock("");
        let c = s.containers.get_mut(id).ok_or_else(|| not_found(OP, id))?;
        if c.status.state == ContainerState::Running {
            // SIGTERM honoured, or SIGKILL at the end of the grace period.
            c.status.state = ContainerState::Exited;
            c.status.exit_code = if stubborn { 137 } else { 143 };
            c.status.reason = "Error".into();
            c.status.finished_at = Some(SystemTime::now());
        }
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        self.begin("RemoveContainer")?.containers.remove(id);
        Ok(())
    }

    async fn container_status(&self, id: &str) -> Result<ContainerStatus> {
        const OP: &str = "ContainerStatus";
        let s = self.begin(OP)?;
        let c = s.containers.get(id).ok_or_else(|| not_found(OP, id))?;
        Ok(c.status.clone())
    }

    async fn reopen_container_log(&self, id: &str) -> Result<()> {
        const OP: &str = "ReopenContainerLog";
        let s = self.begin(OP)?;
        let c = s.containers.get(id).ok_or_else(|| not_found(OP, id))?;
        if c.status.state != ContainerState::Running {
            return Err(CriError::Status {
                operation: OP,
                code: Code::FailedPrecondition,
                message: format!("container {id} is not running"),
            });
        }
        Ok(())
    }

    async fn list_containers(&self, filter: &ContainerFilter) -> Result<Vec<ContainerInfo>> {
        let s = self.begin("ListContainers")?;
        Ok(s.containers
            .values()
            .filter(|c| {
                filter.id.as_ref().is_none_or(|f| *f == c.status.id)
                    && filter
                        .sandbox_id
                        .as_ref()
                        .is_none_or(|f| *f == c.sandbox_id)
                    && filter.state.is_none_or(|st| st == c.status.state)
                    && matches(&c.status.labels, &filter.labels)
            })
            .map(|c| ContainerInfo {
                id: c.status.id.clone(),
                sandbox_id: c.sandbox_id.clone(),
                name: c.status.name.clone(),
                attempt: c.status.attempt,
                image: c.status.image.clone(),
                image_ref: c.status.image_ref.clone(),
                state: c.status.state,
                created_at: c.status.created_at,
                labels: c.status.labels.clone(),
                annotations: c.status.annotations.clone(),
            })
            .collect())
    }

    async fn exec_sync(&self, id: &str, cmd: &[String], _timeout: Duration) -> Result<ExecResult> {
        const OP: &str = "ExecSync";
        let status = {
            let s = self.begin(OP)?;
            let c = s.containers.get(id).ok_or_else(|| not_found(OP, id))?;
            c.status.clone()
        };
        if status.state != ContainerState::Running {
            return Err(CriError::Status {
                operation: OP,
                code: Code::Unknown,
                message: format!("container {id} is not running"),
            });
        }
        let exec = self.exec.lock().unwrap_or_else(|e| e.into_inner());
        Ok(exec.as_ref().map(|h| h(&status, cmd)).unwrap_or_default())
    }

    async fn exec(&self, id: &str, cmd: &[String], _: StreamOptions) -> Result<String> {
        const OP: &str = "Exec";
        if cmd.is_empty() {
            return Err(CriError::Status {
                operation: OP,
                code: Code::InvalidArgument,
                message: "cmd can't be empty".into(),
            });
        }
        self.stream_url(OP, id, "exec")
    }

    async fn attach(&self, id: &str, _: StreamOptions) -> Result<String> {
        self.stream_url("Attach", id, "attach")
    }

    async fn port_forward(&self, sandbox_id: &str, _: &[u16]) -> Result<String> {
        const OP: &str = "PortForward";
        let s = self.begin(OP)?;
        match s.sandboxes.get(sandbox_id) {
            Some(sb) if sb.state == SandboxState::Ready => {
                Ok(format!("{}/portforward/{sandbox_id}", s.stream_server))
            }
            Some(_) => Err(CriError::Status {
                operation: OP,
                code: Code::FailedPrecondition,
                message: format!("sandbox {sandbox_id} is not running"),
            }),
            None => Err(not_found(OP, sandbox_id)),
        }
    }

    async fn image_status(&self, image: &str) -> Result<Option<ImageInfo>> {
        let s = self.begin("ImageStatus")?;
        Ok(s.images.contains(image).then(|| fake_image(&s, image)))
    }

    async fn pull_image(&self, image: &str) -> Result<String> {
        const OP: &str = "PullImage";
        let mut s = self.begin(OP)?;
        if !s.registry.contains(image) {
            return Err(CriError::Status {
                operation: OP,
                code: Code::Unknown,
                message: format!("failed to resolve reference {image:?}: not found"),
            });
        }
        s.images.insert(image.to_owned());
        Ok(fake_image(&s, image).id)
    }

    async fn list_images(&self) -> Result<Vec<ImageInfo>> {
        let s = self.begin("ListImages")?;
        Ok(s.images.iter().map(|i| fake_image(&s, i)).collect())
    }

    async fn remove_image(&self, image: &str) -> Result<()> {
        self.begin("RemoveImage")?.images.remove(image);
        Ok(())
    }

    async fn image_fs_mountpoint(&self) -> Result<Option<std::path::PathBuf>> {
        drop(self.begin("ImageFsInfo")?);
        Ok(None)
    }
}

fn fake_image(s: &State, image: &str) -> ImageInfo {
    let (uid, username) = s.image_users.get(image).cloned().unwrap_or_default();
    ImageInfo {
        id: format!("sha256:fake-{image}"),
        repo_tags: vec![image.to_owned()],
        repo_digests: Vec::new(),
        size: 1024,
        uid,
        username,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox() -> SandboxConfig {
        SandboxConfig {
            name: "web".into(),
            namespace: "default".into(),
            uid: "u1".into(),
            labels: [("app".into(), "web".into())].into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn lifecycle_follows_cri_rules() {
        let rt = FakeRuntime::new();
        rt.add_image("busybox");
        let cfg = sandbox();
        let sb = rt.run_pod_sandbox(&cfg).await.unwrap();
        assert!(rt.pod_sandbox_status(&sb).await.unwrap().ip.is_some());
        let container = ContainerConfig {
            name: "c".into(),
            image: "busybox".into(),
            labels: [("k".into(), "v".into())].into(),
            ..Default::default()
        };
        let id = rt.create_container(&sb, &container, &cfg).await.unwrap();
        rt.start_container(&id).await.unwrap();
        rt.exit_container(&id, 3);
        let st = rt.container_status(&id).await.unwrap();
        assert_eq!((st.state, st.exit_code), (ContainerState::Exited, 3));

        let filter = ContainerFilter {
            labels: [("k".into(), "v".into())].into(),
            ..Default::default()
        };
        assert_eq!(rt.list_containers(&filter).await.unwrap().len(), 1);
        let other = SandboxFilter {
            labels: [("app".into(), "db".into())].into(),
            ..Default::default()
        };
        assert!(rt.list_pod_sandboxes(&other).await.unwrap().is_empty());

        rt.stop_pod_sandbox(&sb).await.unwrap();
        rt.remove_pod_sandbox(&sb).await.unwrap();
        rt.remove_pod_sandbox(&sb).await.unwrap();
        assert!(rt.container_status(&id).await.unwrap_err().is_not_found());
    }

    #[tokio::test]
    async fn missing_images_and_injected_failures() {
        let rt = FakeRuntime::new();
        let cfg = sandbox();
        let sb = rt.run_pod_sandbox(&cfg).await.unwrap();
        let c = ContainerConfig {
            name: "c".into(),
            image: "nope".into(),
            ..Default::default()
        };
        assert!(rt.create_container(&sb, &c, &cfg).await.is_err());
        assert!(rt.pull_image("nope").await.is_err());
        assert_eq!(rt.image_status("nope").await.unwrap(), None);

        rt.fail_next(
            "Version",
            CriError::Timeout {
                operation: "Version",
                timeout: Duration::from_secs(1),
            },
        );
        assert!(rt.version().await.is_err());
        assert!(rt.version().await.is_ok());
        assert_eq!(rt.calls()[0], "RunPodSandbox");
    }
}
