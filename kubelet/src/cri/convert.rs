//! The edge: our types to CRI v1 messages and back. CRI encodes "unset" as a
//! zero value and time as nanoseconds since the epoch; both stop here.
use std::{
    collections::HashMap,
    net::IpAddr,
    path::PathBuf,
    time::{Duration, SystemTime},
};

use k8s_cri::v1 as pb;

use super::{error::*, types::*};

fn map(labels: &Labels) -> HashMap<String, String> {
    labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn labels(m: HashMap<String, String>) -> Labels {
    m.into_iter().collect()
}

fn time(nanos: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(u64::try_from(nanos).unwrap_or(0))
}

fn opt_time(nanos: i64) -> Option<SystemTime> {
    (nanos > 0).then(|| time(nanos))
}

fn opt_path(s: String) -> Option<PathBuf> {
    (!s.is_empty()).then(|| PathBuf::from(s))
}

fn path_string(p: &Option<PathBuf>) -> String {
    p.as_ref()
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

pub fn version(v: pb::VersionResponse) -> RuntimeVersion {
    RuntimeVersion {
        version: v.version,
        runtime_name: v.runtime_name,
        runtime_version: v.runtime_version,
        runtime_api_version: v.runtime_api_version,
    }
}

/// The namespaces the sandbox and each of its containers share: kubelet's
/// defaults for v1 pods (a private pid namespace per container).
fn namespaces(s: &SandboxSecurity) -> pb::NamespaceOption {
    let pod_or = |node: bool| {
        if node {
            pb::NamespaceMode::Node
        } else {
            pb::NamespaceMode::Pod
        }
    };
    pb::NamespaceOption {
        network: pod_or(s.host_network) as i32,
        pid: if s.share_process_namespace {
            pb::NamespaceMode::Pod
        } else {
            pb::NamespaceMode::Container
        } as i32,
        ipc: pb::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

pub fn sandbox_config(c: &SandboxConfig) -> pb::PodSandboxConfig {
    pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata {
            name: c.name.clone(),
            uid: c.uid.clone(),
            namespace: c.namespace.clone(),
            attempt: c.attempt,
        }),
        hostname: c.hostname.clone(),
        log_directory: path_string(&c.log_directory),
        dns_config: c.dns.as_ref().map(|d| pb::DnsConfig {
            servers: d.servers.clone(),
            searches: d.searches.clone(),
            options: d.options.clone(),
        }),
        port_mappings: c
            .port_mappings
            .iter()
            .map(|p| pb::PortMapping {
                protocol: match p.protocol {
                    Protocol::Tcp => pb::Protocol::Tcp,
                    Protocol::Udp => pb::Protocol::Udp,
                    Protocol::Sctp => pb::Protocol::Sctp,
                } as i32,
                container_port: i32::from(p.container_port),
                host_port: p.host_port.map_or(0, i32::from),
                host_ip: p.host_ip.map(|ip| ip.to_string()).unwrap_or_default(),
            })
            .collect(),
        labels: map(&c.labels),
        annotations: map(&c.annotations),
        linux: Some(pb::LinuxPodSandboxConfig {
            cgroup_parent: c.cgroup_parent.clone().unwrap_or_default(),
            security_context: Some(pb::LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces(&c.security)),
                run_as_user: c.security.run_as_user.map(|value| pb::Int64Value { value }),
                readonly_rootfs: c.security.readonly_rootfs,
                privileged: c.security.privileged,
                ..Default::default()
            }),
            ..Default::default()
        }),
        windows: None,
    }
}

fn capability(name: &str) -> String {
    name.strip_prefix("CAP_").unwrap_or(name).to_owned()
}

pub fn container_config(c: &ContainerConfig, sandbox: &SandboxConfig) -> pb::ContainerConfig {
    let r = &c.resources;
    let s = &c.security;
    pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata {
            name: c.name.clone(),
            attempt: c.attempt,
        }),
        image: Some(image_spec(&c.image)),
        command: c.command.clone(),
        args: c.args.clone(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: c
            .env
            .iter()
            .map(|(key, value)| pb::KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        mounts: c
            .mounts
            .iter()
            .map(|m| pb::Mount {
                container_path: m.container_path.to_string_lossy().into_owned(),
                host_path: m.host_path.to_string_lossy().into_owned(),
                readonly: m.readonly,
                propagation: match m.propagation {
                    MountPropagation::Private => pb::MountPropagation::PropagationPrivate,
                    MountPropagation::HostToContainer => {
                        pb::MountPropagation::PropagationHostToContainer
                    }
                    MountPropagation::Bidirectional => {
                        pb::MountPropagation::PropagationBidirectional
                    }
                } as i32,
                ..Default::default()
            })
            .collect(),
        labels: map(&c.labels),
        annotations: map(&c.annotations),
        log_path: path_string(&c.log_path),
        linux: Some(pb::LinuxContainerConfig {
            resources: Some(pb::LinuxContainerResources {
                cpu_period: r.cpu_period.unwrap_or(0),
                cpu_quota: r.cpu_quota.unwrap_or(0),
                cpu_shares: r.cpu_shares.unwrap_or(0),
                memory_limit_in_bytes: r.memory_limit_bytes.unwrap_or(0),
                oom_score_adj: r.oom_score_adj.unwrap_or(0),
                ..Default::default()
            }),
            security_context: Some(pb::LinuxContainerSecurityContext {
                capabilities: Some(pb::Capability {
                    add_capabilities: s.capabilities_add.iter().map(|c| capability(c)).collect(),
                    drop_capabilities: s.capabilities_drop.iter().map(|c| capability(c)).collect(),
                    ..Default::default()
                }),
                privileged: s.privileged,
                // Must agree with the sandbox's, or the runtime refuses the container.
                namespace_options: Some(namespaces(&sandbox.security)),
                run_as_user: s.run_as_user.map(|value| pb::Int64Value { value }),
                readonly_rootfs: s.readonly_rootfs,
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

pub fn image_spec(image: &str) -> pb::ImageSpec {
    pb::ImageSpec {
        image: image.to_owned(),
        ..Default::default()
    }
}

fn sandbox_state(s: pb::PodSandboxState) -> SandboxState {
    match s {
        pb::PodSandboxState::SandboxReady => SandboxState::Ready,
        pb::PodSandboxState::SandboxNotready => SandboxState::NotReady,
    }
}

pub fn pb_sandbox_state(s: SandboxState) -> pb::PodSandboxState {
    match s {
        SandboxState::Ready => pb::PodSandboxState::SandboxReady,
        SandboxState::NotReady => pb::PodSandboxState::SandboxNotready,
    }
}

fn container_state(s: pb::ContainerState) -> ContainerState {
    match s {
        pb::ContainerState::ContainerCreated => ContainerState::Created,
        pb::ContainerState::ContainerRunning => ContainerState::Running,
        pb::ContainerState::ContainerExited => ContainerState::Exited,
        pb::ContainerState::ContainerUnknown => ContainerState::Unknown,
    }
}

pub fn pb_container_state(s: ContainerState) -> pb::ContainerState {
    match s {
        ContainerState::Created => pb::ContainerState::ContainerCreated,
        ContainerState::Running => pb::ContainerState::ContainerRunning,
        ContainerState::Exited => pb::ContainerState::ContainerExited,
        ContainerState::Unknown => pb::ContainerState::ContainerUnknown,
    }
}

fn ip(operation: &'static str, s: &str) -> Result<IpAddr> {
    s.parse().map_err(|_| CriError::InvalidResponse {
        operation,
        field: "pod IP",
        value: s.to_owned(),
    })
}

pub fn sandbox_status(op: &'static str, s: pb::PodSandboxStatus) -> Result<SandboxStatus> {
    let state = sandbox_state(s.state());
    let meta = s.metadata.unwrap_or_default();
    let net = s.network.unwrap_or_default();
    Ok(SandboxStatus {
        ip: (!net.ip.is_empty()).then(|| ip(op, &net.ip)).transpose()?,
        additional_ips: net
            .additional_ips
            .iter()
            .map(|a| ip(op, &a.ip))
            .collect::<Result<_>>()?,
        id: s.id,
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        attempt: meta.attempt,
        state,
        created_at: time(s.created_at),
        labels: labels(s.labels),
        annotations: labels(s.annotations),
    })
}

pub fn sandbox_info(s: pb::PodSandbox) -> SandboxInfo {
    let state = sandbox_state(s.state());
    let meta = s.metadata.unwrap_or_default();
    SandboxInfo {
        id: s.id,
        name: meta.name,
        namespace: meta.namespace,
        uid: meta.uid,
        attempt: meta.attempt,
        state,
        created_at: time(s.created_at),
        labels: labels(s.labels),
        annotations: labels(s.annotations),
    }
}

pub fn container_info(c: pb::Container) -> ContainerInfo {
    let state = container_state(c.state());
    let meta = c.metadata.unwrap_or_default();
    ContainerInfo {
        id: c.id,
        sandbox_id: c.pod_sandbox_id,
        name: meta.name,
        attempt: meta.attempt,
        image: c.image.map(|i| i.image).unwrap_or_default(),
        image_ref: c.image_ref,
        state,
        created_at: time(c.created_at),
        labels: labels(c.labels),
        annotations: labels(c.annotations),
    }
}

pub fn container_status(c: pb::ContainerStatus) -> ContainerStatus {
    let state = container_state(c.state());
    let meta = c.metadata.unwrap_or_default();
    ContainerStatus {
        id: c.id,
        name: meta.name,
        attempt: meta.attempt,
        state,
        created_at: time(c.created_at),
        started_at: opt_time(c.started_at),
        finished_at: opt_time(c.finished_at),
        exit_code: c.exit_code,
        reason: c.reason,
        message: c.message,
        image: c.image.map(|i| i.image).unwrap_or_default(),
        image_ref: c.image_ref,
        labels: labels(c.labels),
        annotations: labels(c.annotations),
        log_path: opt_path(c.log_path),
    }
}

pub fn image(i: pb::Image) -> ImageInfo {
    ImageInfo {
        id: i.id,
        repo_tags: i.repo_tags,
        repo_digests: i.repo_digests,
        size: i.size,
    }
}

pub fn sandbox_filter(f: &SandboxFilter) -> pb::PodSandboxFilter {
    pb::PodSandboxFilter {
        id: f.id.clone().unwrap_or_default(),
        state: f.state.map(|s| pb::PodSandboxStateValue {
            state: pb_sandbox_state(s) as i32,
        }),
        label_selector: map(&f.labels),
    }
}

pub fn container_filter(f: &ContainerFilter) -> pb::ContainerFilter {
    pb::ContainerFilter {
        id: f.id.clone().unwrap_or_default(),
        state: f.state.map(|s| pb::ContainerStateValue {
            state: pb_container_state(s) as i32,
        }),
        pod_sandbox_id: f.sandbox_id.clone().unwrap_or_default(),
        label_selector: map(&f.labels),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_times_are_unset_and_nanos_survive() {
        assert_eq!(opt_time(0), None);
        let t = opt_time(1_700_000_000_123_456_789).unwrap();
        let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(d.as_nanos(), 1_700_000_000_123_456_789);
    }

    #[test]
    fn containers_share_the_sandbox_namespaces_but_not_pid() {
        let sandbox = SandboxConfig::default();
        let c = container_config(
            &ContainerConfig {
                security: ContainerSecurity {
                    capabilities_add: vec!["CAP_NET_ADMIN".into(), "SYS_TIME".into()],
                    ..Default::default()
                },
                ..Default::default()
            },
            &sandbox,
        );
        let sc = c.linux.unwrap().security_context.unwrap();
        let ns = sc.namespace_options.unwrap();
        assert_eq!(ns.network(), pb::NamespaceMode::Pod);
        assert_eq!(ns.pid(), pb::NamespaceMode::Container);
        assert_eq!(
            sc.capabilities.unwrap().add_capabilities,
            ["NET_ADMIN", "SYS_TIME"]
        );
    }

    #[test]
    fn bad_pod_ip_is_an_invalid_response() {
        let status = pb::PodSandboxStatus {
            network: Some(pb::PodSandboxNetworkStatus {
                ip: "not-an-ip".into(),
                additional_ips: vec![],
            }),
            ..Default::default()
        };
        let err = sandbox_status("PodSandboxStatus", status).unwrap_err();
        assert!(matches!(
            err,
            CriError::InvalidResponse {
                field: "pod IP",
                ..
            }
        ));
    }
}
