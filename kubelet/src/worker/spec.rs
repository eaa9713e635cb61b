//! The CRI configs of a pod's sandbox and containers, as kuberuntime's
//! `generatePodSandboxConfig` and `generateContainerConfig` build them. The
//! labels and annotations are the kubelet's own keys: they are how a restarted
//! kubelet finds (adopts) what it started before and how it keeps restart counts.
use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
};

use crate::{
    cri::{self, ContainerConfig, SandboxConfig},
    pod::{self, ContainerSpec, FieldValues, PodSpec, QosClass, VolumeSource, dns, env},
};

use super::WorkerConfig;

pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";
pub const RESTART_COUNT_ANNOTATION: &str = "io.kubernetes.container.restartCount";
/// Lets a kubelet that no longer knows the pod stop it with its own grace.
pub const GRACE_ANNOTATION: &str = "io.kubernetes.pod.terminationGracePeriod";

/// Why a container config could not be built: the container waits with
/// `CreateContainerConfigError` and this message.
#[derive(Debug, thiserror::Error)]
pub enum ContainerConfigError {
    #[error(transparent)]
    Env(#[from] env::EnvError),
    #[error("volume {volume:?}: {kind} volumes need the API server (standalone mode)")]
    NeedsApi { volume: String, kind: &'static str },
    #[error("volume {volume:?}: {kind} {namespace}/{name} not found")]
    ObjectNotFound {
        volume: String,
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error("volume {volume:?}: {kind} {namespace}/{name}: {message}")]
    ObjectUnavailable {
        volume: String,
        kind: &'static str,
        namespace: String,
        name: String,
        message: String,
    },
    #[error("volume {volume:?}: no token for service account {service_account:?}: {message}")]
    Token {
        volume: String,
        service_account: String,
        message: String,
    },
    #[error("volume {volume:?}: key {key:?} not found in {kind} {name}")]
    KeyNotFound {
        volume: String,
        kind: &'static str,
        name: String,
        key: String,
    },
    #[error("volume {volume:?}: hostPath type check failed: {} {reason}", path.display())]
    HostPath {
        volume: String,
        path: PathBuf,
        reason: &'static str,
    },
    #[error("spec.securityContext.fsGroup: {gid} is not a valid group id")]
    FsGroup { gid: i64 },
    /// An identifier of the pod that cannot be part of a path.
    #[error(transparent)]
    Path(#[from] crate::safe_path::PathError),
    #[error("volume {volume:?}: subPath {sub_path:?}: {source}")]
    SubPath {
        volume: String,
        sub_path: String,
        source: super::subpath::SubPathError,
    },
    #[error("volume {volume:?}: {}: {source}", path.display())]
    Io {
        volume: String,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// An object's data, `None` when it does not exist, or why it cannot be
/// read (the API server's message).
pub type ObjectData = Result<Option<BTreeMap<String, Vec<u8>>>, String>;

/// ConfigMaps and Secrets, read through the API (API-server mode). The
/// worker registers each pod's references when the pod arrives or changes
/// and unregisters them when its worker ends; it asks when it creates a
/// container, and an implementation answers from its cache.
pub trait ApiObjects: Send + Sync + 'static {
    fn config_map(&self, namespace: &str, name: &str) -> ObjectData;
    fn secret(&self, namespace: &str, name: &str) -> ObjectData;
    /// A token for `pod`'s service account as `projection` asks, bound to
    /// the pod; from what the implementation keeps fresh (requested when the
    /// pod registers, renewed at 80% of its life), or why there is none.
    fn service_account_token(
        &self,
        _pod: &PodSpec,
        _projection: &pod::TokenProjection,
    ) -> Result<String, String> {
        Err("service-account tokens need the API server (standalone mode)".into())
    }
    /// The pod (new or changed) refers to the objects in its spec.
    fn register_pod(&self, _pod: &k8s_openapi::api::core::v1::Pod) {}
    /// The pod's worker ended: its references go.
    fn unregister_pod(&self, _uid: &str) {}
}

/// Env lookups through [`ApiObjects`], or none in standalone mode.
struct Lookup<'a>(Option<&'a dyn ApiObjects>);

impl env::ObjectLookup for Lookup<'_> {
    fn config_map_key(&self, ns: &str, name: &str, key: &str) -> Option<String> {
        let v = self.0?.config_map(ns, name).ok()??.remove(key)?;
        Some(String::from_utf8_lossy(&v).into_owned())
    }
    fn secret_key(&self, ns: &str, name: &str, key: &str) -> Option<String> {
        let v = self.0?.secret(ns, name).ok()??.remove(key)?;
        Some(String::from_utf8_lossy(&v).into_owned())
    }
    fn object(&self, kind: pod::EnvFromKind, ns: &str, name: &str) -> ObjectData {
        let Some(objects) = self.0 else {
            return env::NoObjects.object(kind, ns, name);
        };
        match kind {
            pod::EnvFromKind::ConfigMap => objects.config_map(ns, name),
            pod::EnvFromKind::Secret => objects.secret(ns, name),
        }
    }
}

/// The pod's labels plus the kubelet's identity labels.
pub fn pod_labels(spec: &PodSpec) -> cri::Labels {
    let mut l = spec.labels.clone();
    l.insert(POD_UID_LABEL.into(), spec.uid.clone());
    l.insert(POD_NAME_LABEL.into(), spec.name.clone());
    l.insert(POD_NAMESPACE_LABEL.into(), spec.namespace.clone());
    l
}

/// Only the UID label: what relists filter on.
pub fn uid_filter(uid: &str) -> cri::Labels {
    cri::Labels::from([(POD_UID_LABEL.to_owned(), uid.to_owned())])
}

/// `/var/log/pods/<ns>_<name>_<uid>`, as the kubelet names it. `None` only
/// for identifiers [`PodSpec::from_api`] refuses: the runtime then keeps no
/// log rather than one outside `pod_log_dir`.
pub fn log_directory(cfg: &WorkerConfig, spec: &PodSpec) -> Option<PathBuf> {
    let name = format!("{}_{}_{}", spec.namespace, spec.name, spec.uid);
    crate::safe_path::join_name(&cfg.pod_log_dir, "pod log directory", &name).ok()
}

/// The pod's cgroupfs path, `<cgroup_root>[/burstable|/besteffort]/pod<uid>`.
/// A UID from_api refuses leaves the cgroup to the runtime.
pub fn pod_cgroup(cfg: &WorkerConfig, spec: &PodSpec) -> Option<String> {
    let qos = match spec.qos_class() {
        QosClass::Guaranteed => "",
        QosClass::Burstable => "/burstable",
        QosClass::BestEffort => "/besteffort",
    };
    let uid = crate::safe_path::uid(&spec.uid).ok()?;
    Some(format!(
        "{}{qos}/pod{uid}",
        cfg.cgroup_root.trim_end_matches('/')
    ))
}

pub fn sandbox_config(cfg: &WorkerConfig, spec: &PodSpec, attempt: u32) -> SandboxConfig {
    // An unreadable resolv.conf leaves the runtime to copy the node's own.
    let host_dns = (!cfg.resolv_conf.as_os_str().is_empty()).then(|| {
        std::fs::read_to_string(&cfg.resolv_conf)
            .map(|t| dns::parse_resolv_conf(&t))
            .unwrap_or_default()
    });
    let d = dns::pod_dns(
        spec,
        &cfg.cluster_dns,
        cfg.cluster_domain.as_deref(),
        host_dns.as_ref(),
        cfg.node_ip,
    );
    // A host-network pod keeps the node's hostname: the kubelet leaves it
    // empty and the runtime fills in its own.
    let hostname = if spec.host_network {
        String::new()
    } else {
        dns::hostname_and_domain(spec, cfg.cluster_domain.as_deref()).0
    };
    let port_mappings = spec
        .all_containers()
        .flat_map(|c| &c.ports)
        .map(|p| cri::PortMapping {
            protocol: match p.protocol {
                pod::Protocol::Tcp => cri::Protocol::Tcp,
                pod::Protocol::Udp => cri::Protocol::Udp,
                pod::Protocol::Sctp => cri::Protocol::Sctp,
            },
            container_port: p.container_port,
            host_port: p.host_port,
            host_ip: p.host_ip,
        })
        .collect();
    SandboxConfig {
        name: spec.name.clone(),
        namespace: spec.namespace.clone(),
        uid: spec.uid.clone(),
        attempt,
        hostname,
        labels: pod_labels(spec),
        annotations: spec.annotations.clone(),
        dns: Some(cri::DnsConfig {
            servers: d.servers,
            searches: d.searches,
            options: d.options,
        }),
        port_mappings,
        log_directory: log_directory(cfg, spec),
        cgroup_parent: pod_cgroup(cfg, spec),
        security: cri::SandboxSecurity {
            run_as_user: spec.security.run_as_user,
            run_as_group: spec.security.run_as_group,
            supplemental_groups: spec.security.supplemental_groups.clone(),
            readonly_rootfs: false,
            privileged: spec.has_privileged_container(),
            host_network: spec.host_network,
            host_pid: spec.host_pid,
            host_ipc: spec.host_ipc,
            share_process_namespace: spec.share_process_namespace,
            selinux: spec.security.se_linux.as_ref().map(selinux),
            seccomp: spec
                .security
                .seccomp
                .as_ref()
                .map(|p| seccomp_profile(cfg, p)),
        },
    }
}

/// What a container config depends on besides the specs.
pub struct ContainerInputs<'a> {
    pub cfg: &'a WorkerConfig,
    pub pod: &'a PodSpec,
    pub container: &'a ContainerSpec,
    pub restart_count: u32,
    pub pod_ip: Option<IpAddr>,
}

pub fn container_config(i: &ContainerInputs<'_>) -> Result<ContainerConfig, ContainerConfigError> {
    let (cfg, pod, c) = (i.cfg, i.pod, i.container);
    let values = FieldValues {
        pod,
        pod_ip: i.pod_ip,
        host_ip: cfg.node_ip,
    };
    let resolved = env::resolve(c, &values, &Lookup(cfg.objects.as_deref()))?;
    if !resolved.skipped.is_empty() {
        // The kubelet's InvalidEnvironmentVariableNames warning.
        tracing::warn!(
            pod = %pod.full_name(),
            container = %c.name,
            keys = ?resolved.skipped,
            "envFrom keys skipped: they are not valid environment variable names"
        );
    }
    let mounts = mounts(cfg, pod, c)?;
    let r = c.linux_resources();
    let memory_capacity = cfg.memory_capacity.unwrap_or(0);
    let resources = cri::LinuxResources {
        cpu_shares: Some(r.cpu_shares),
        cpu_quota: (r.cpu_quota > 0).then_some(r.cpu_quota),
        cpu_period: Some(r.cpu_period),
        memory_limit_bytes: (r.memory_limit_in_bytes > 0).then_some(r.memory_limit_in_bytes),
        oom_score_adj: Some(pod::resources::oom_score_adj(
            pod.qos_class(),
            &c.resources,
            memory_capacity,
        )),
    };
    let mut labels = cri::Labels::new();
    labels.insert(POD_UID_LABEL.into(), pod.uid.clone());
    labels.insert(POD_NAME_LABEL.into(), pod.name.clone());
    labels.insert(POD_NAMESPACE_LABEL.into(), pod.namespace.clone());
    labels.insert(CONTAINER_NAME_LABEL.into(), c.name.clone());
    let annotations = cri::Labels::from([
        (
            RESTART_COUNT_ANNOTATION.to_owned(),
            i.restart_count.to_string(),
        ),
        (
            GRACE_ANNOTATION.to_owned(),
            pod.termination_grace_period.as_secs().to_string(),
        ),
    ]);
    Ok(ContainerConfig {
        name: c.name.clone(),
        attempt: i.restart_count,
        image: c.image.clone(),
        command: resolved.command,
        args: resolved.args,
        working_dir: c.working_dir.clone(),
        stdin: c.stdin,
        stdin_once: c.stdin_once,
        tty: c.tty,
        env: resolved.env,
        mounts,
        labels,
        annotations,
        log_path: Some(PathBuf::from(format!("{}/{}.log", c.name, i.restart_count))),
        resources,
        security: container_security(cfg, &c.security),
    })
}

fn selinux(o: &pod::SeLinuxOptions) -> cri::SeLinuxOptions {
    cri::SeLinuxOptions {
        user: o.user.clone(),
        role: o.role.clone(),
        type_: o.type_.clone(),
        level: o.level.clone(),
    }
}

fn profile(p: &pod::SecurityProfile) -> cri::SecurityProfile {
    match p {
        pod::SecurityProfile::RuntimeDefault => cri::SecurityProfile::RuntimeDefault,
        pod::SecurityProfile::Unconfined => cri::SecurityProfile::Unconfined,
        pod::SecurityProfile::Localhost(r) => cri::SecurityProfile::Localhost(r.clone()),
    }
}

/// A Localhost seccomp profile is a file below `<root-dir>/seccomp` (the
/// conversion refused absolute paths and `..`), handed to the runtime as an
/// absolute path, as the kubelet does; AppArmor profiles stay names.
fn seccomp_profile(cfg: &WorkerConfig, p: &pod::SecurityProfile) -> cri::SecurityProfile {
    match p {
        pod::SecurityProfile::Localhost(rel) => {
            cri::SecurityProfile::Localhost(cfg.seccomp_dir.join(rel).display().to_string())
        }
        other => profile(other),
    }
}

/// kuberuntime `determineEffectiveSecurityContext` on the already merged
/// context. Seccomp defaults to Unconfined, as the kubelet's
/// `seccompDefault: false` sends it.
fn container_security(cfg: &WorkerConfig, s: &pod::SecurityContext) -> cri::ContainerSecurity {
    cri::ContainerSecurity {
        run_as_user: s.run_as_user,
        run_as_group: s.run_as_group,
        supplemental_groups: s.supplemental_groups.clone(),
        readonly_rootfs: s.read_only_root_filesystem,
        privileged: s.privileged,
        capabilities_add: s.capabilities_add.clone(),
        capabilities_drop: s.capabilities_drop.clone(),
        no_new_privs: s.no_new_privs(),
        selinux: s.se_linux.as_ref().map(selinux),
        apparmor: s.app_armor.as_ref().map(profile),
        seccomp: Some(
            s.seccomp
                .as_ref()
                .map_or(cri::SecurityProfile::Unconfined, |p| {
                    seccomp_profile(cfg, p)
                }),
        ),
        // The image's user is filled in once its status is known.
        run_as_username: String::new(),
        // `procMount: Default` (the conversion refuses `Unmasked`, which
        // needs a user namespace): the kubelet's lists, sent explicitly
        // rather than trusting the runtime's defaults. containerd drops
        // them for privileged containers.
        masked_paths: DEFAULT_MASKED_PATHS.map(String::from).to_vec(),
        readonly_paths: DEFAULT_READONLY_PATHS.map(String::from).to_vec(),
    }
}

/// securitycontext `defaultMaskedPaths` and `defaultReadonlyPaths`.
const DEFAULT_MASKED_PATHS: [&str; 11] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
const DEFAULT_READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

pub(super) fn io_err(
    volume: &str,
    path: &Path,
) -> impl FnOnce(std::io::Error) -> ContainerConfigError {
    let (volume, path) = (volume.to_owned(), path.to_owned());
    move |source| ContainerConfigError::Io {
        volume,
        path,
        source,
    }
}

/// The host side of each volume mount, created as the volume type says.
fn mounts(
    cfg: &WorkerConfig,
    pod: &PodSpec,
    c: &ContainerSpec,
) -> Result<Vec<cri::Mount>, ContainerConfigError> {
    let mut out = Vec::new();
    for (index, m) in c.volume_mounts.iter().enumerate() {
        // from_api checked that every mount names a volume.
        let Some(v) = pod.volumes.iter().find(|v| v.name == m.name) else {
            continue;
        };
        let host = volume_path(cfg, pod, &v.name, &v.source)?;
        let host = match &m.sub_path {
            // Never the joined path: a link in the volume could lead it out.
            Some(sub) => {
                let target =
                    super::pod_dir::subpath_target(cfg, &pod.uid, &v.name, &c.name, index)?;
                super::subpath::bind(&host, sub, &target).map_err(|source| {
                    ContainerConfigError::SubPath {
                        volume: v.name.clone(),
                        sub_path: sub.clone(),
                        source,
                    }
                })?;
                target
            }
            None => host,
        };
        let read_only = m.read_only || v.source.is_projection();
        out.push(cri::Mount {
            host_path: host,
            container_path: PathBuf::from(&m.mount_path),
            readonly: read_only,
            propagation: match m.propagation {
                pod::MountPropagation::None => cri::MountPropagation::Private,
                pod::MountPropagation::HostToContainer => cri::MountPropagation::HostToContainer,
                pod::MountPropagation::Bidirectional => cri::MountPropagation::Bidirectional,
            },
        });
    }
    Ok(out)
}

fn volume_path(
    cfg: &WorkerConfig,
    pod: &PodSpec,
    name: &str,
    source: &VolumeSource,
) -> Result<PathBuf, ContainerConfigError> {
    let dir = |plugin| super::pod_dir::volume_dir(cfg, &pod.uid, plugin, name);
    match source {
        // Memory-backed emptyDirs are plain directories here: the kubelet
        // mounts a tmpfs, which needs a mount namespace we do not manage.
        VolumeSource::EmptyDir { .. } => {
            let p = dir("kubernetes.io~empty-dir")?;
            std::fs::create_dir_all(&p).map_err(io_err(name, &p))?;
            fs_group_owns(pod, name, &p, false)?;
            Ok(p)
        }
        VolumeSource::HostPath { path, kind } => {
            super::host_path::check(name, Path::new(path), *kind)
        }
        VolumeSource::ConfigMap { .. }
        | VolumeSource::Secret { .. }
        | VolumeSource::Projected { .. }
        | VolumeSource::DownwardApi { .. } => {
            let plugin = super::projection::plugin(source).unwrap_or("kubernetes.io~unknown");
            let dir = dir(plugin)?;
            // An unchanged payload is the version owned when it was written.
            if super::projection::write(cfg, pod, name, source, &dir)? {
                fs_group_owns(pod, name, &dir, true)?;
            }
            Ok(dir)
        }
    }
}

/// Brings every projection volume of `pod` up to date (see
/// `PodTask::refresh_projections`); what failed, each naming its volume.
pub(super) fn refresh_projections(cfg: &WorkerConfig, pod: &PodSpec) -> Vec<String> {
    pod.volumes
        .iter()
        .filter(|v| v.source.is_projection())
        .filter_map(|v| volume_path(cfg, pod, &v.name, &v.source).err())
        .map(|e| e.to_string())
        .collect()
}

/// `fsGroup` ownership of one of the pod's own volumes. Projected volumes
/// are re-owned whenever a new version of their files is written; an
/// emptyDir whose root is already right is left alone, as the kubelet sets
/// it up once per pod.
fn fs_group_owns(
    pod: &PodSpec,
    volume: &str,
    dir: &Path,
    readonly: bool,
) -> Result<(), ContainerConfigError> {
    let Some(gid) = pod.security.fs_group else {
        return Ok(());
    };
    let gid = u32::try_from(gid).map_err(|_| ContainerConfigError::FsGroup { gid })?;
    if !readonly && super::ownership::root_owned(dir, gid, readonly) {
        return Ok(());
    }
    super::ownership::set_volume_ownership(dir, gid, readonly).map_err(io_err(volume, dir))
}

#[cfg(test)]
#[path = "spec_tests.rs"]
mod tests;
