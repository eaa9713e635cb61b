//! The kubelet's view of a pod: domain types converted once, at the edge, from
//! `k8s_openapi::api::core::v1::Pod` ([`PodSpec::from_api`]), with every
//! problem the kubelet would report as `CreateContainerConfigError`; and the
//! pure decisions taken on them (restart, backoff, probes, status).
use std::{collections::BTreeMap, net::IpAddr, time::Duration};

pub mod backoff;
mod convert;
pub mod dns;
pub mod env;
pub mod probe;
pub mod prober;
pub mod quantity;
pub mod resources;
pub mod restart;
pub mod status;

pub use convert::{InvalidPod, SpecError, default_pull_policy};
pub use resources::{LinuxResources, QosClass};

/// The wall clock as an API timestamp (k8s-openapi's jiff is built without
/// its clock).
pub fn timestamp_now() -> k8s_openapi::jiff::Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    timestamp_from_unix_nanos(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// CRI times (nanoseconds since the epoch) as an API timestamp.
pub fn timestamp_from_unix_nanos(nanos: i64) -> k8s_openapi::jiff::Timestamp {
    let (s, n) = (
        nanos.div_euclid(1_000_000_000),
        nanos.rem_euclid(1_000_000_000),
    );
    k8s_openapi::jiff::Timestamp::new(s, n as i32).unwrap_or_default()
}

/// The reason the kubelet gives a container whose spec it cannot turn into a
/// runtime config.
pub const CREATE_CONTAINER_CONFIG_ERROR: &str = "CreateContainerConfigError";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSpec {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub node_name: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub restart_policy: RestartPolicy,
    /// `terminationGracePeriodSeconds`, 30 s when unset.
    pub termination_grace_period: Duration,
    pub init_containers: Vec<ContainerSpec>,
    pub containers: Vec<ContainerSpec>,
    pub volumes: Vec<Volume>,
    pub dns_policy: DnsPolicy,
    /// `spec.dnsConfig`, merged into what the policy gives.
    pub dns_config: Option<PodDnsConfig>,
    pub hostname: Option<String>,
    pub subdomain: Option<String>,
    /// Supported: the sandbox then uses the node's network namespace
    /// (CRI `NamespaceMode::NODE`), and the pod IP is the host IP.
    pub host_network: bool,
    /// CRI `NamespaceMode::NODE` for the PID / IPC namespaces.
    pub host_pid: bool,
    pub host_ipc: bool,
    /// `shareProcessNamespace`: one PID namespace for the pod's containers.
    pub share_process_namespace: bool,
    /// `serviceAccountName`, `default` when unset (the API's defaulting).
    pub service_account_name: String,
    /// The pod-level settings the sandbox itself runs with.
    pub security: PodSecurity,
    /// Set once the API server marked the pod for deletion: nothing restarts
    /// after that.
    pub deleting: bool,
}

impl PodSpec {
    /// `namespace/name`, as the kubelet logs pods.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Init containers then app containers, in spec order.
    pub fn all_containers(&self) -> impl Iterator<Item = &ContainerSpec> {
        self.init_containers.iter().chain(&self.containers)
    }

    pub fn container(&self, name: &str) -> Option<&ContainerSpec> {
        self.all_containers().find(|c| c.name == name)
    }

    pub fn is_init_container(&self, name: &str) -> bool {
        self.init_containers.iter().any(|c| c.name == name)
    }

    pub fn qos_class(&self) -> QosClass {
        resources::qos_class(self.all_containers().map(|c| &c.resources))
    }

    /// The sandbox must be privileged for any container to be
    /// (kubecontainer `HasPrivilegedContainer`): containerd refuses a
    /// privileged container in an unprivileged sandbox.
    pub fn has_privileged_container(&self) -> bool {
        self.all_containers().any(|c| c.security.privileged)
    }
}

/// `spec.dnsConfig`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodDnsConfig {
    pub nameservers: Vec<IpAddr>,
    pub searches: Vec<String>,
    /// `name` or `name:value`, as resolv.conf writes them.
    pub options: Vec<(String, Option<String>)>,
}

/// Pod-level `securityContext` fields the sandbox gets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSecurity {
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    /// Owns the pod's writable volumes (emptyDir, configMap, secret).
    pub fs_group: Option<i64>,
    /// `fsGroup` first, then `supplementalGroups`: what processes get.
    pub supplemental_groups: Vec<i64>,
    pub se_linux: Option<SeLinuxOptions>,
    pub seccomp: Option<SecurityProfile>,
    /// Only inherited by containers: CRI takes AppArmor per container.
    pub app_armor: Option<SecurityProfile>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeLinuxOptions {
    pub user: String,
    pub role: String,
    pub type_: String,
    pub level: String,
}

/// `appArmorProfile` / `seccompProfile`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SecurityProfile {
    RuntimeDefault,
    Unconfined,
    /// The profile's name (AppArmor) or path under the runtime's seccomp root.
    Localhost(String),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RestartPolicy {
    #[default]
    Always,
    OnFailure,
    Never,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DnsPolicy {
    #[default]
    ClusterFirst,
    ClusterFirstWithHostNet,
    Default,
    None,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    pub image_pull_policy: PullPolicy,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub working_dir: Option<String>,
    /// `stdin`, `stdinOnce`, `tty`: what `kubectl attach` and `run -it` use.
    pub stdin: bool,
    pub stdin_once: bool,
    pub tty: bool,
    /// `envFrom`, in order; `env` is applied after and wins.
    pub env_from: Vec<EnvFrom>,
    pub env: Vec<EnvVar>,
    pub ports: Vec<ContainerPort>,
    /// The request/limit quantities, kept for QoS and status.
    pub resources: Resources,
    pub security: SecurityContext,
    pub liveness: Option<Probe>,
    pub readiness: Option<Probe>,
    pub startup: Option<Probe>,
    pub post_start: Option<Handler>,
    pub pre_stop: Option<Handler>,
    pub volume_mounts: Vec<VolumeMount>,
}

impl ContainerSpec {
    /// The CRI resources, computed as the kubelet does.
    pub fn linux_resources(&self) -> LinuxResources {
        resources::linux_resources(&self.resources)
    }

    pub fn probe(&self, kind: probe::ProbeKind) -> Option<&Probe> {
        match kind {
            probe::ProbeKind::Liveness => self.liveness.as_ref(),
            probe::ProbeKind::Readiness => self.readiness.as_ref(),
            probe::ProbeKind::Startup => self.startup.as_ref(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvVar {
    pub name: String,
    pub value: EnvValue,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnvValue {
    /// `value`, as written: `$(VAR)` references are expanded when the
    /// container is created ([`env::resolve`]).
    Literal(String),
    /// `valueFrom.fieldRef`: known only once the sandbox has its IP.
    Field(FieldRef),
    /// `valueFrom.configMapKeyRef`: read through the API in API mode.
    ConfigMapKey {
        name: String,
        key: String,
        optional: bool,
    },
    /// `valueFrom.secretKeyRef`: read through the API in API mode.
    SecretKey {
        name: String,
        key: String,
        optional: bool,
    },
}

/// One `envFrom` entry: every key of a ConfigMap or Secret, prefixed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvFrom {
    pub kind: EnvFromKind,
    pub name: String,
    pub prefix: String,
    pub optional: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EnvFromKind {
    ConfigMap,
    Secret,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldRef {
    PodName,
    PodNamespace,
    PodUid,
    PodIp,
    HostIp,
    NodeName,
    ServiceAccountName,
}

/// What `fieldRef`s resolve against.
#[derive(Clone, Copy, Debug)]
pub struct FieldValues<'a> {
    pub pod: &'a PodSpec,
    pub pod_ip: Option<IpAddr>,
    pub host_ip: Option<IpAddr>,
}

impl FieldRef {
    pub fn resolve(self, v: &FieldValues<'_>) -> String {
        let ip = |a: Option<IpAddr>| a.map(|a| a.to_string()).unwrap_or_default();
        match self {
            Self::PodName => v.pod.name.clone(),
            Self::PodNamespace => v.pod.namespace.clone(),
            Self::PodUid => v.pod.uid.clone(),
            Self::PodIp => ip(v.pod_ip),
            Self::HostIp => ip(v.host_ip),
            Self::NodeName => v.pod.node_name.clone().unwrap_or_default(),
            Self::ServiceAccountName => v.pod.service_account_name.clone(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerPort {
    pub name: Option<String>,
    pub container_port: u16,
    pub host_port: Option<u16>,
    pub host_ip: Option<IpAddr>,
    pub protocol: Protocol,
}

/// Requests and limits as the kubelet uses them: CPU in millicores, memory in
/// bytes. A request left unset takes the limit, as the API server's defaulting
/// would have done (static pods never pass through it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_request_milli: Option<i64>,
    pub cpu_limit_milli: Option<i64>,
    pub memory_request: Option<i64>,
    pub memory_limit: Option<i64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecurityContext {
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub run_as_non_root: bool,
    pub read_only_root_filesystem: bool,
    pub privileged: bool,
    pub allow_privilege_escalation: Option<bool>,
    /// Upper-case, without the `CAP_` prefix, as the API writes them.
    pub capabilities_add: Vec<String>,
    pub capabilities_drop: Vec<String>,
    /// The container's own, else the pod's.
    pub se_linux: Option<SeLinuxOptions>,
    pub app_armor: Option<SecurityProfile>,
    pub seccomp: Option<SecurityProfile>,
    pub supplemental_groups: Vec<i64>,
}

impl SecurityContext {
    /// `allowPrivilegeEscalation: false` sets no_new_privs; unset leaves the
    /// runtime's default (securitycontext `AddNoNewPrivileges`).
    pub fn no_new_privs(&self) -> bool {
        self.allow_privilege_escalation == Some(false)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub action: ProbeAction,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeAction {
    Exec {
        command: Vec<String>,
    },
    HttpGet(HttpGet),
    TcpSocket {
        host: Option<String>,
        port: u16,
    },
    /// `grpc`: the gRPC health protocol's `Check` on the pod IP, for
    /// `service` (empty: the server as a whole).
    Grpc {
        port: u16,
        service: String,
    },
}

/// `httpGet`, with a named port already resolved against the container's ports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpGet {
    pub scheme: Scheme,
    /// Defaults to the pod IP when `None`.
    pub host: Option<String>,
    pub port: u16,
    pub path: String,
    pub headers: Vec<(String, String)>,
}

/// `httpGet.scheme`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scheme {
    #[default]
    Http,
    /// TLS without verifying the certificate, as the kubelet probes.
    Https,
}

/// A lifecycle hook (postStart / preStop).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handler {
    Exec { command: Vec<String> },
    HttpGet(HttpGet),
    Sleep(Duration),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    pub name: String,
    pub source: VolumeSource,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeSource {
    EmptyDir {
        /// `medium: Memory`: a tmpfs.
        memory: bool,
        size_limit: Option<i64>,
    },
    HostPath {
        path: String,
        kind: HostPathType,
    },
    ConfigMap {
        name: String,
        items: Vec<KeyToPath>,
        default_mode: u32,
        optional: bool,
    },
    Secret {
        name: String,
        items: Vec<KeyToPath>,
        default_mode: u32,
        optional: bool,
    },
    /// `projected`: several sources written into one directory.
    Projected {
        sources: Vec<ProjectedSource>,
        default_mode: u32,
    },
    /// `downwardAPI`: the pod's own fields as files.
    DownwardApi {
        items: Vec<DownwardItem>,
        default_mode: u32,
    },
}

impl VolumeSource {
    /// Volumes whose files the kubelet writes (and rewrites while the pod
    /// runs, as their sources change): mounted read-only.
    pub fn is_projection(&self) -> bool {
        matches!(
            self,
            Self::ConfigMap { .. }
                | Self::Secret { .. }
                | Self::Projected { .. }
                | Self::DownwardApi { .. }
        )
    }
}

/// One source of a `projected` volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProjectedSource {
    ConfigMap {
        name: String,
        items: Vec<KeyToPath>,
        optional: bool,
    },
    Secret {
        name: String,
        items: Vec<KeyToPath>,
        optional: bool,
    },
    DownwardApi {
        items: Vec<DownwardItem>,
    },
    /// A token from the TokenRequest API, bound to the pod.
    ServiceAccountToken(TokenProjection),
}

/// `serviceAccountToken`, with the API's defaults applied.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenProjection {
    /// `None`: the API server's own audiences.
    pub audience: Option<String>,
    pub expiration_seconds: i64,
    pub path: String,
}

/// One file of a downwardAPI volume or source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DownwardItem {
    pub path: String,
    pub mode: Option<u32>,
    pub value: DownwardValue,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DownwardValue {
    /// `fieldRef`: metadata.name, namespace, uid, labels, annotations, or one
    /// label or annotation (`metadata.labels['k']`).
    Field(DownwardField),
    /// `resourceFieldRef`: a container's request or limit, in `divisor`
    /// units rounded up, as the kubelet writes it.
    Resource {
        container: String,
        resource: ResourceName,
        /// The divisor in millis (CPU) or bytes (memory, storage).
        divisor: i64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DownwardField {
    Name,
    Namespace,
    Uid,
    Labels,
    Annotations,
    Label(String),
    Annotation(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResourceName {
    LimitsCpu,
    LimitsMemory,
    RequestsCpu,
    RequestsMemory,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HostPathType {
    /// `""`: no check.
    #[default]
    Unset,
    DirectoryOrCreate,
    Directory,
    FileOrCreate,
    File,
    Socket,
    CharDevice,
    BlockDevice,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyToPath {
    pub key: String,
    pub path: String,
    pub mode: Option<u32>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeMount {
    pub name: String,
    pub mount_path: String,
    pub sub_path: Option<String>,
    pub read_only: bool,
    pub propagation: MountPropagation,
}

/// `mountPropagation`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MountPropagation {
    /// `None`, and the default.
    #[default]
    None,
    HostToContainer,
    /// Only for privileged containers.
    Bidirectional,
}

/// A minimal valid pod for tests: containers named as given, image busybox.
#[cfg(test)]
pub(crate) fn test_pod(init: &[&str], app: &[&str], policy: RestartPolicy) -> PodSpec {
    use k8s_openapi::api::core::v1 as api;
    let container = |n: &&str| api::Container {
        name: (*n).to_owned(),
        image: Some("busybox:1.36".to_owned()),
        ..Default::default()
    };
    let pod = api::Pod {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("p".to_owned()),
            namespace: Some("ns".to_owned()),
            uid: Some("uid-1".to_owned()),
            ..Default::default()
        },
        spec: Some(api::PodSpec {
            init_containers: Some(init.iter().map(container).collect()),
            containers: app.iter().map(container).collect(),
            restart_policy: Some(format!("{policy:?}")),
            ..Default::default()
        }),
        status: None,
    };
    PodSpec::from_api(&pod).expect("test pod is valid")
}
