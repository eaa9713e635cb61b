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

/// The namespaces the sandbox and each of its containers share, as the
/// kubelet's `namespacesForPod`: a private pid namespace per container unless
/// the pod shares one or uses the node's.
fn namespaces(s: &SandboxSecurity) -> pb::NamespaceOption {
    let pod_or = |node: bool| {
        if node {
            pb::NamespaceMode::Node
        } else {
            pb::NamespaceMode::Pod
        }
    };
    let pid = if s.host_pid {
        pb::NamespaceMode::Node
    } else if s.share_process_namespace {
        pb::NamespaceMode::Pod
    } else {
        pb::NamespaceMode::Container
    };
    pb::NamespaceOption {
        network: pod_or(s.host_network) as i32,
        pid: pid as i32,
        ipc: pod_or(s.host_ipc) as i32,
        ..Default::default()
    }
}

fn selinux(o: &Option<SeLinuxOptions>) -> Option<pb::SeLinuxOption> {
    o.as_ref().map(|o| pb::SeLinuxOption {
        user: o.user.clone(),
        role: o.role.clone(),
        r#type: o.type_.clone(),
        level: o.level.clone(),
    })
}

fn profile(p: &Option<SecurityProfile>) -> Option<pb::SecurityProfile> {
    use pb::security_profile::ProfileType;
    p.as_ref().map(|p| {
        let (t, localhost_ref) = match p {
            SecurityProfile::RuntimeDefault => (ProfileType::RuntimeDefault, String::new()),
            SecurityProfile::Unconfined => (ProfileType::Unconfined, String::new()),
            SecurityProfile::Localhost(r) => (ProfileType::Localhost, r.clone()),
        };
        pb::SecurityProfile {
            profile_type: t as i32,
            localhost_ref,
        }
    })
}

/// The deprecated string forms, which runtimes older than the structured
/// fields (and containerd 1.6 as a fallback) read: `runtime/default`,
/// `unconfined`, `localhost/<ref>`.
fn legacy_profile(p: &Option<SecurityProfile>) -> String {
    match p {
        None => String::new(),
        Some(SecurityProfile::RuntimeDefault) => "runtime/default".into(),
        Some(SecurityProfile::Unconfined) => "unconfined".into(),
        Some(SecurityProfile::Localhost(r)) => format!("localhost/{r}"),
    }
}

// The deprecated profile strings go along with the structured fields: see
// `legacy_profile`.
#[allow(deprecated)]
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
                selinux_options: selinux(&c.security.selinux),
                run_as_user: c.security.run_as_user.map(|value| pb::Int64Value { value }),
                run_as_group: c
                    .security
                    .run_as_group
                    .map(|value| pb::Int64Value { value }),
                supplemental_groups: c.security.supplemental_groups.clone(),
                readonly_rootfs: c.security.readonly_rootfs,
                privileged: c.security.privileged,
                seccomp: profile(&c.security.seccomp),
                seccomp_profile_path: legacy_profile(&c.security.seccomp),
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

#[allow(deprecated)]
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
        stdin: c.stdin,
        stdin_once: c.stdin_once,
        tty: c.tty,
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
                selinux_options: selinux(&s.selinux),
                run_as_user: s.run_as_user.map(|value| pb::Int64Value { value }),
                run_as_group: s.run_as_group.map(|value| pb::Int64Value { value }),
                run_as_username: s.run_as_username.clone(),
                supplemental_groups: s.supplemental_groups.clone(),
                readonly_rootfs: s.readonly_rootfs,
                no_new_privs: s.no_new_privs,
                masked_paths: s.masked_paths.clone(),
                readonly_paths: s.readonly_paths.clone(),
                seccomp: profile(&s.seccomp),
                seccomp_profile_path: legacy_profile(&s.seccomp),
                apparmor: profile(&s.apparmor),
                apparmor_profile: legacy_profile(&s.apparmor),
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
        uid: i.uid.map(|u| u.value),
        username: i.username,
    }
}

pub fn runtime_status(s: Option<pb::RuntimeStatus>) -> RuntimeStatus {
    RuntimeStatus {
        conditions: s
            .map(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .map(|c| RuntimeCondition {
                type_: c.r#type,
                status: c.status,
                reason: c.reason,
                message: c.message,
            })
            .collect(),
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
    fn host_namespaces_reach_the_sandbox_and_its_containers() {
        let ns = |s: SandboxSecurity| {
            let sb = SandboxConfig {
                security: s,
                ..Default::default()
            };
            let c = container_config(&ContainerConfig::default(), &sb);
            let from_c = c.linux.unwrap().security_context.unwrap().namespace_options;
            let from_sb = sandbox_config(&sb)
                .linux
                .unwrap()
                .security_context
                .unwrap()
                .namespace_options;
            assert_eq!(from_c, from_sb);
            let n = from_c.unwrap();
            (n.network(), n.pid(), n.ipc())
        };
        use pb::NamespaceMode::{Container, Node, Pod};
        assert_eq!(ns(SandboxSecurity::default()), (Pod, Container, Pod));
        let host = SandboxSecurity {
            host_network: true,
            host_pid: true,
            host_ipc: true,
            ..Default::default()
        };
        assert_eq!(ns(host), (Node, Node, Node));
        let shared = SandboxSecurity {
            share_process_namespace: true,
            ..Default::default()
        };
        assert_eq!(ns(shared), (Pod, Pod, Pod));
    }

    #[test]
    #[allow(deprecated)]
    fn security_and_propagation_reach_cri() {
        let mount = |p| Mount {
            host_path: "/h".into(),
            container_path: "/c".into(),
            readonly: false,
            propagation: p,
        };
        let c = container_config(
            &ContainerConfig {
                mounts: vec![
                    mount(MountPropagation::Private),
                    mount(MountPropagation::HostToContainer),
                    mount(MountPropagation::Bidirectional),
                ],
                security: ContainerSecurity {
                    privileged: true,
                    run_as_group: Some(7),
                    no_new_privs: true,
                    selinux: Some(SeLinuxOptions {
                        type_: "spc_t".into(),
                        level: "s0".into(),
                        ..Default::default()
                    }),
                    apparmor: Some(SecurityProfile::Unconfined),
                    seccomp: Some(SecurityProfile::Localhost("p.json".into())),
                    ..Default::default()
                },
                ..Default::default()
            },
            &SandboxConfig::default(),
        );
        let props: Vec<_> = c.mounts.iter().map(|m| m.propagation()).collect();
        assert_eq!(
            props,
            [
                pb::MountPropagation::PropagationPrivate,
                pb::MountPropagation::PropagationHostToContainer,
                pb::MountPropagation::PropagationBidirectional,
            ]
        );
        let sc = c.linux.unwrap().security_context.unwrap();
        assert!(sc.privileged && sc.no_new_privs);
        assert_eq!(sc.run_as_group, Some(pb::Int64Value { value: 7 }));
        let se = sc.selinux_options.unwrap();
        assert_eq!((se.r#type.as_str(), se.level.as_str()), ("spc_t", "s0"));
        let aa = sc.apparmor.unwrap();
        assert_eq!(
            aa.profile_type(),
            pb::security_profile::ProfileType::Unconfined
        );
        assert_eq!(sc.apparmor_profile, "unconfined");
        let sp = sc.seccomp.unwrap();
        assert_eq!(
            (sp.profile_type(), sp.localhost_ref.as_str()),
            (pb::security_profile::ProfileType::Localhost, "p.json")
        );
        assert_eq!(sc.seccomp_profile_path, "localhost/p.json");

        let sb = sandbox_config(&SandboxConfig {
            security: SandboxSecurity {
                privileged: true,
                run_as_group: Some(3),
                ..Default::default()
            },
            ..Default::default()
        });
        let ssc = sb.linux.unwrap().security_context.unwrap();
        assert!(ssc.privileged);
        assert_eq!(ssc.run_as_group, Some(pb::Int64Value { value: 3 }));
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
