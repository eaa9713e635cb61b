//! The runtime's view of pods and containers in our own terms: the rest of the
//! kubelet never sees a generated CRI type, so a CRI revision only touches
//! `convert.rs`.
use std::{collections::BTreeMap, net::IpAddr, path::PathBuf, time::SystemTime};

pub type Labels = BTreeMap<String, String>;

/// What the runtime says about itself (`containerRuntimeVersion` in NodeInfo is
/// `<runtime_name>://<runtime_version>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeVersion {
    /// The CRI API version the runtime answered with (`0.1.0` for v1).
    pub version: String,
    pub runtime_name: String,
    pub runtime_version: String,
    pub runtime_api_version: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DnsConfig {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    #[default]
    Tcp,
    Udp,
    Sctp,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortMapping {
    pub protocol: Protocol,
    pub container_port: u16,
    /// `None`: the port is only declared, nothing is published on the node.
    pub host_port: Option<u16>,
    pub host_ip: Option<IpAddr>,
}

/// The pod-level security settings the sandbox itself runs with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxSecurity {
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub supplemental_groups: Vec<i64>,
    pub readonly_rootfs: bool,
    /// Set when any container is: the runtime refuses a privileged container
    /// in an unprivileged sandbox.
    pub privileged: bool,
    /// `hostNetwork`: the pod shares the node's network namespace.
    pub host_network: bool,
    /// `hostPID` / `hostIPC`: the node's PID / IPC namespace.
    pub host_pid: bool,
    pub host_ipc: bool,
    /// `shareProcessNamespace`: containers see each other's processes.
    pub share_process_namespace: bool,
    pub selinux: Option<SeLinuxOptions>,
    pub seccomp: Option<SecurityProfile>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeLinuxOptions {
    pub user: String,
    pub role: String,
    pub type_: String,
    pub level: String,
}

/// A seccomp or AppArmor profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecurityProfile {
    RuntimeDefault,
    Unconfined,
    Localhost(String),
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxConfig {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub attempt: u32,
    pub hostname: String,
    pub labels: Labels,
    pub annotations: Labels,
    pub dns: Option<DnsConfig>,
    pub port_mappings: Vec<PortMapping>,
    /// Container log paths are relative to this directory.
    pub log_directory: Option<PathBuf>,
    /// A cgroupfs path such as `/kubepods/besteffort/pod<uid>`; `None` leaves
    /// the runtime's default.
    pub cgroup_parent: Option<String>,
    pub security: SandboxSecurity,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SandboxState {
    Ready,
    NotReady,
}

/// One entry of `list_pod_sandboxes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxInfo {
    pub id: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub attempt: u32,
    pub state: SandboxState,
    pub created_at: SystemTime,
    pub labels: Labels,
    pub annotations: Labels,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxStatus {
    pub id: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub attempt: u32,
    pub state: SandboxState,
    /// `None` for host-network pods and sandboxes whose network is torn down.
    pub ip: Option<IpAddr>,
    pub additional_ips: Vec<IpAddr>,
    pub created_at: SystemTime,
    pub labels: Labels,
    pub annotations: Labels,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SandboxFilter {
    pub id: Option<String>,
    pub state: Option<SandboxState>,
    /// Every pair must match.
    pub labels: Labels,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MountPropagation {
    /// `None` in the pod spec: rprivate.
    #[default]
    Private,
    /// rslave.
    HostToContainer,
    /// rshared.
    Bidirectional,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mount {
    pub host_path: PathBuf,
    pub container_path: PathBuf,
    pub readonly: bool,
    pub propagation: MountPropagation,
}

/// CRI linux resources; `None` leaves the runtime's default (no limit).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinuxResources {
    pub cpu_shares: Option<i64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<i64>,
    pub memory_limit_bytes: Option<i64>,
    pub oom_score_adj: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerSecurity {
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub supplemental_groups: Vec<i64>,
    pub readonly_rootfs: bool,
    pub privileged: bool,
    /// Capability names as in the pod spec, e.g. `NET_ADMIN` (no `CAP_` prefix needed).
    pub capabilities_add: Vec<String>,
    pub capabilities_drop: Vec<String>,
    /// `allowPrivilegeEscalation: false`.
    pub no_new_privs: bool,
    pub selinux: Option<SeLinuxOptions>,
    /// `None`: the runtime's default (its own profile where AppArmor is on).
    pub apparmor: Option<SecurityProfile>,
    /// `None`: the runtime's default, unconfined as the kubelet's
    /// `seccompDefault: false` asks.
    pub seccomp: Option<SecurityProfile>,
    /// The image's user by name when there is no `run_as_user` (CRI
    /// `run_as_username`), so the runtime resolves it in the image.
    pub run_as_username: String,
    /// /proc paths hidden and made read-only (`procMount: Default`); empty
    /// for `Unmasked`.
    pub masked_paths: Vec<String>,
    pub readonly_paths: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerConfig {
    pub name: String,
    pub attempt: u32,
    pub image: String,
    /// Replaces the image's entrypoint when not empty.
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub working_dir: Option<String>,
    /// Keep the container's stdin open for `Attach`; `stdin_once` closes it
    /// when the first attached client goes.
    pub stdin: bool,
    pub stdin_once: bool,
    pub tty: bool,
    /// In order: later entries may refer to earlier ones in the pod spec.
    pub env: Vec<(String, String)>,
    pub mounts: Vec<Mount>,
    pub labels: Labels,
    pub annotations: Labels,
    /// Relative to the sandbox's `log_directory`.
    pub log_path: Option<PathBuf>,
    pub resources: LinuxResources,
    pub security: ContainerSecurity,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

/// One entry of `list_containers`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerInfo {
    pub id: String,
    pub sandbox_id: String,
    pub name: String,
    pub attempt: u32,
    pub image: String,
    pub image_ref: String,
    pub state: ContainerState,
    pub created_at: SystemTime,
    pub labels: Labels,
    pub annotations: Labels,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerStatus {
    pub id: String,
    pub name: String,
    pub attempt: u32,
    pub state: ContainerState,
    pub created_at: SystemTime,
    pub started_at: Option<SystemTime>,
    /// containerd stamps `started_at` when the start call returns and this from
    /// the exit event: a process that exits at once may finish "before" it started.
    pub finished_at: Option<SystemTime>,
    pub exit_code: i32,
    /// e.g. `Completed`, `Error`, `OOMKilled`.
    pub reason: String,
    pub message: String,
    pub image: String,
    /// The image's digest reference: `imageID` in the pod status.
    pub image_ref: String,
    pub labels: Labels,
    pub annotations: Labels,
    pub log_path: Option<PathBuf>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerFilter {
    pub id: Option<String>,
    pub sandbox_id: Option<String>,
    pub state: Option<ContainerState>,
    /// Every pair must match.
    pub labels: Labels,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecResult {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// The standard streams a streaming session (CRI `Exec`, `Attach`) carries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    pub id: String,
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
    pub size: u64,
    /// The image config's `User` as a uid, when it is numeric.
    pub uid: Option<i64>,
    /// The image config's `User` when it is a name, empty otherwise.
    pub username: String,
}

/// One of the runtime's `Status` conditions (`RuntimeReady`, `NetworkReady`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeCondition {
    pub type_: String,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// The CRI condition types the kubelet requires.
pub const RUNTIME_READY: &str = "RuntimeReady";
pub const NETWORK_READY: &str = "NetworkReady";

/// What the runtime's `Status` call says about its health.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeStatus {
    pub conditions: Vec<RuntimeCondition>,
}

impl RuntimeStatus {
    pub fn condition(&self, type_: &str) -> Option<&RuntimeCondition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}
