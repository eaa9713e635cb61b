//! `v1.Pod` → [`PodSpec`], collecting every problem with its field path. These
//! are the checks the kubelet (and, for static pods that never meet one, the
//! API server's validation in pkg/apis/core/validation) would make before
//! creating containers.
use std::{collections::BTreeSet, fmt, time::Duration};

use k8s_openapi::api::core::v1 as api;

use super::{quantity::QuantityError, *};
use crate::config::{is_dns_label, is_dns_subdomain};

mod fields;
mod handlers;
mod projected;
mod security;

use super::probe::ProbeKind as Kind;
use fields::{convert_env, convert_resources, convert_volumes};
use handlers::{convert_handler, convert_probe};
pub(crate) use security::{MAX_NAMESERVERS, MAX_SEARCH_CHARS, MAX_SEARCHES};

/// One problem in a pod spec, named by its field path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("{field}: is required")]
    Required { field: String },
    #[error("{field}: duplicate value {value:?}")]
    Duplicate { field: String, value: String },
    #[error("{field}: {value:?} is invalid: {reason}")]
    Invalid {
        field: String,
        value: String,
        reason: &'static str,
    },
    #[error("{field}: forbidden: {reason}")]
    Forbidden { field: String, reason: String },
    #[error("{field}: {what} is not supported by this kubelet")]
    NotSupported { field: String, what: String },
    #[error(
        "{field}: volume type {kind:?} is not supported (emptyDir, hostPath, configMap, secret, projected, downwardAPI are)"
    )]
    UnknownVolumeType { field: String, kind: String },
    #[error("{field}: no container port named {name:?}")]
    PortNotFound { field: String, name: String },
    #[error("{field}: port {port} is out of range 1-65535")]
    PortOutOfRange { field: String, port: i64 },
    #[error("{field}: no volume named {name:?} in spec.volumes")]
    UndefinedVolume { field: String, name: String },
    #[error("{field}: {source}")]
    Quantity {
        field: String,
        source: QuantityError,
    },
}

/// Every problem found in a pod: the message of its
/// `CreateContainerConfigError` status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct InvalidPod {
    pub errors: Vec<SpecError>,
}

impl fmt::Display for InvalidPod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

pub(super) struct Errs(Vec<SpecError>);

impl Errs {
    pub(super) fn required(&mut self, field: impl Into<String>) {
        self.0.push(SpecError::Required {
            field: field.into(),
        });
    }
    pub(super) fn invalid(
        &mut self,
        field: impl Into<String>,
        value: impl fmt::Display,
        reason: &'static str,
    ) {
        self.0.push(SpecError::Invalid {
            field: field.into(),
            value: value.to_string(),
            reason,
        });
    }
    pub(super) fn unsupported(&mut self, field: impl Into<String>, what: impl Into<String>) {
        self.0.push(SpecError::NotSupported {
            field: field.into(),
            what: what.into(),
        });
    }
}

pub(super) fn seconds(errs: &mut Errs, field: String, v: Option<i64>, default: u64) -> Duration {
    match v {
        None => Duration::from_secs(default),
        Some(v) if v < 0 => {
            errs.invalid(field, v, "must be greater than or equal to 0");
            Duration::from_secs(default)
        }
        Some(v) => Duration::from_secs(v as u64),
    }
}

impl PodSpec {
    /// Converts a pod, or lists everything wrong with it.
    pub fn from_api(pod: &api::Pod) -> Result<PodSpec, InvalidPod> {
        let mut errs = Errs(Vec::new());
        let meta = &pod.metadata;
        let name = meta.name.clone().unwrap_or_default();
        if name.is_empty() {
            errs.required("metadata.name");
        } else if !is_dns_subdomain(&name) {
            errs.invalid("metadata.name", &name, "must be a DNS subdomain");
        }
        let uid = meta.uid.clone().unwrap_or_default();
        if uid.is_empty() {
            errs.required("metadata.uid");
        } else if let Err(e) = crate::safe_path::uid(&uid) {
            // It names the pod's directory and cgroup.
            errs.invalid("metadata.uid", &uid, e.reason);
        }
        if let Some(ns) = meta
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty() && !is_dns_label(n))
        {
            errs.invalid("metadata.namespace", ns, "must be a DNS label");
        }
        let default_spec = api::PodSpec::default();
        let spec = pod.spec.as_ref().unwrap_or_else(|| {
            errs.required("spec");
            &default_spec
        });
        let restart_policy = match spec.restart_policy.as_deref() {
            None | Some("Always") => RestartPolicy::Always,
            Some("OnFailure") => RestartPolicy::OnFailure,
            Some("Never") => RestartPolicy::Never,
            Some(v) => {
                errs.invalid(
                    "spec.restartPolicy",
                    v,
                    "must be Always, OnFailure or Never",
                );
                RestartPolicy::Always
            }
        };
        let dns_policy = match spec.dns_policy.as_deref() {
            None | Some("ClusterFirst") => DnsPolicy::ClusterFirst,
            Some("ClusterFirstWithHostNet") => DnsPolicy::ClusterFirstWithHostNet,
            Some("Default") => DnsPolicy::Default,
            Some("None") => DnsPolicy::None,
            Some(v) => {
                errs.invalid(
                    "spec.dnsPolicy",
                    v,
                    "must be ClusterFirst, ClusterFirstWithHostNet, Default or None",
                );
                DnsPolicy::ClusterFirst
            }
        };
        let dns_config = security::dns_config(
            &mut errs,
            spec.dns_config.as_ref(),
            dns_policy == DnsPolicy::None,
        );
        let host_network = spec.host_network.unwrap_or(false);
        for (field, v) in [
            ("spec.hostname", &spec.hostname),
            ("spec.subdomain", &spec.subdomain),
        ] {
            if let Some(v) = v.as_deref().filter(|v| !is_dns_label(v)) {
                errs.invalid(field, v, "must be a DNS label");
            }
        }
        if spec
            .ephemeral_containers
            .as_ref()
            .is_some_and(|e| !e.is_empty())
        {
            errs.unsupported("spec.ephemeralContainers", "ephemeral containers");
        }
        // Running it in the node's user namespace instead would silently
        // give the pod real root.
        if spec.host_users == Some(false) {
            errs.unsupported("spec.hostUsers", "user namespaces (hostUsers: false)");
        }
        let container_names: BTreeSet<&str> = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .map(|c| c.name.as_str())
            .collect();
        let volumes = convert_volumes(
            &mut errs,
            spec.volumes.as_deref().unwrap_or_default(),
            &container_names,
        );
        let volume_names: BTreeSet<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
        let mut names = BTreeSet::new();
        let pod_sc = spec.security_context.as_ref();
        let pod_security = security::pod_security(&mut errs, pod_sc);
        let mut convert_list =
            |errs: &mut Errs, list: &[api::Container], field: &str, init: bool| {
                list.iter()
                    .enumerate()
                    .map(|(i, c)| {
                        let at = format!("spec.{field}[{i}]");
                        if !c.name.is_empty() && !names.insert(c.name.clone()) {
                            errs.0.push(SpecError::Duplicate {
                                field: format!("{at}.name"),
                                value: c.name.clone(),
                            });
                        }
                        let ctx = ContainerContext {
                            at: &at,
                            init,
                            volumes: &volume_names,
                            pod_sc,
                            pod: &pod_security,
                            host_network,
                        };
                        convert_container(errs, c, &ctx)
                    })
                    .collect::<Vec<_>>()
            };
        let init_containers = convert_list(
            &mut errs,
            spec.init_containers.as_deref().unwrap_or_default(),
            "initContainers",
            true,
        );
        if spec.containers.is_empty() {
            errs.required("spec.containers");
        }
        let containers = convert_list(&mut errs, &spec.containers, "containers", false);
        let termination_grace_period = seconds(
            &mut errs,
            "spec.terminationGracePeriodSeconds".into(),
            spec.termination_grace_period_seconds,
            30,
        );
        if !errs.0.is_empty() {
            return Err(InvalidPod { errors: errs.0 });
        }
        Ok(PodSpec {
            uid,
            namespace: meta
                .namespace
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "default".to_owned()),
            name,
            node_name: spec.node_name.clone().filter(|n| !n.is_empty()),
            labels: meta.labels.clone().unwrap_or_default(),
            annotations: meta.annotations.clone().unwrap_or_default(),
            restart_policy,
            termination_grace_period,
            init_containers,
            containers,
            volumes,
            dns_policy,
            dns_config,
            hostname: spec.hostname.clone().filter(|h| !h.is_empty()),
            subdomain: spec.subdomain.clone().filter(|h| !h.is_empty()),
            host_network,
            host_pid: spec.host_pid.unwrap_or(false),
            host_ipc: spec.host_ipc.unwrap_or(false),
            share_process_namespace: spec.share_process_namespace.unwrap_or(false),
            service_account_name: spec
                .service_account_name
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "default".to_owned()),
            security: pod_security,
            deleting: meta.deletion_timestamp.is_some(),
        })
    }
}

/// The API's defaulting: `Always` for `:latest` or an untagged image, else
/// `IfNotPresent` (pkg/apis/core/v1/defaults.go `SetDefaults_Container`).
pub fn default_pull_policy(image: &str) -> PullPolicy {
    // A digest pins the image whatever its tag says.
    let name = image.split('@').next().unwrap_or(image);
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.split_once(':') {
        _ if image.contains('@') => PullPolicy::IfNotPresent,
        Some((_, "latest")) | None => PullPolicy::Always,
        Some(_) => PullPolicy::IfNotPresent,
    }
}

/// What a container's conversion needs from its pod.
struct ContainerContext<'a> {
    /// `spec.containers[i]` or `spec.initContainers[i]`.
    at: &'a str,
    init: bool,
    volumes: &'a BTreeSet<&'a str>,
    pod_sc: Option<&'a api::PodSecurityContext>,
    pod: &'a PodSecurity,
    host_network: bool,
}

fn convert_container(
    errs: &mut Errs,
    c: &api::Container,
    ctx: &ContainerContext<'_>,
) -> ContainerSpec {
    let (at, init, volumes) = (ctx.at, ctx.init, ctx.volumes);
    let security = security::container_security(errs, at, c, ctx.pod_sc, ctx.pod);
    if c.name.is_empty() {
        errs.required(format!("{at}.name"));
    } else if !is_dns_label(&c.name) {
        errs.invalid(format!("{at}.name"), &c.name, "must be a DNS label");
    }
    let image = c.image.clone().unwrap_or_default().trim().to_owned();
    if image.is_empty() {
        errs.required(format!("{at}.image"));
    }
    let image_pull_policy = match c.image_pull_policy.as_deref() {
        None | Some("") => default_pull_policy(&image),
        Some("Always") => PullPolicy::Always,
        Some("IfNotPresent") => PullPolicy::IfNotPresent,
        Some("Never") => PullPolicy::Never,
        Some(v) => {
            errs.invalid(
                format!("{at}.imagePullPolicy"),
                v,
                "must be Always, IfNotPresent or Never",
            );
            default_pull_policy(&image)
        }
    };
    if init && c.restart_policy.is_some() {
        errs.unsupported(format!("{at}.restartPolicy"), "sidecar init containers");
    }
    let ports = convert_ports(
        errs,
        c.ports.as_deref().unwrap_or_default(),
        at,
        ctx.host_network,
    );
    let probe = |errs: &mut Errs, p: &Option<api::Probe>, field: &str, kind| {
        let p = p.as_ref()?;
        if init {
            errs.unsupported(format!("{at}.{field}"), "a probe on an init container");
            return None;
        }
        convert_probe(errs, p, &format!("{at}.{field}"), kind, &ports)
    };
    let liveness = probe(errs, &c.liveness_probe, "livenessProbe", Kind::Liveness);
    let readiness = probe(errs, &c.readiness_probe, "readinessProbe", Kind::Readiness);
    let startup = probe(errs, &c.startup_probe, "startupProbe", Kind::Startup);
    let lifecycle = c.lifecycle.as_ref();
    let hook = |errs: &mut Errs, h: Option<&api::LifecycleHandler>, field| {
        convert_handler(errs, h?, &format!("{at}.lifecycle.{field}"), &ports)
    };
    let post_start = hook(
        errs,
        lifecycle.and_then(|l| l.post_start.as_ref()),
        "postStart",
    );
    let pre_stop = hook(errs, lifecycle.and_then(|l| l.pre_stop.as_ref()), "preStop");
    let mut mount_paths = BTreeSet::new();
    let volume_mounts = c
        .volume_mounts
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let at = format!("{at}.volumeMounts[{i}]");
            if !volumes.contains(m.name.as_str()) {
                errs.0.push(SpecError::UndefinedVolume {
                    field: format!("{at}.name"),
                    name: m.name.clone(),
                });
            }
            if !m.mount_path.starts_with('/') {
                errs.invalid(
                    format!("{at}.mountPath"),
                    &m.mount_path,
                    "must be an absolute path",
                );
            } else if !mount_paths.insert(m.mount_path.clone()) {
                errs.0.push(SpecError::Duplicate {
                    field: format!("{at}.mountPath"),
                    value: m.mount_path.clone(),
                });
            }
            let sub_path = m.sub_path.clone().filter(|s| !s.is_empty());
            if let Some(s) = &sub_path
                && (s.starts_with('/') || s.split('/').any(|p| p == ".."))
            {
                errs.invalid(
                    format!("{at}.subPath"),
                    s,
                    "must be a relative path without '..'",
                );
            }
            if m.sub_path_expr.as_ref().is_some_and(|s| !s.is_empty()) {
                errs.unsupported(format!("{at}.subPathExpr"), "subPathExpr");
            }
            let propagation =
                security::mount_propagation(errs, &at, &c.name, m, security.privileged);
            VolumeMount {
                name: m.name.clone(),
                mount_path: m.mount_path.clone(),
                sub_path,
                read_only: m.read_only.unwrap_or(false),
                propagation,
            }
        })
        .collect();
    ContainerSpec {
        name: c.name.clone(),
        image,
        image_pull_policy,
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        working_dir: c.working_dir.clone().filter(|w| !w.is_empty()),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        env_from: projected::env_from(errs, at, c.env_from.as_deref().unwrap_or_default()),
        env: convert_env(errs, c.env.as_deref().unwrap_or_default(), at),
        ports,
        resources: convert_resources(errs, c.resources.as_ref(), at),
        security,
        liveness,
        readiness,
        startup,
        post_start,
        pre_stop,
        volume_mounts,
    }
}

fn convert_ports(
    errs: &mut Errs,
    ports: &[api::ContainerPort],
    at: &str,
    host_network: bool,
) -> Vec<ContainerPort> {
    let mut names = BTreeSet::new();
    ports
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            let at = format!("{at}.ports[{i}]");
            let name = p.name.clone().filter(|n| !n.is_empty());
            if let Some(n) = &name
                && !names.insert(n.clone())
            {
                errs.0.push(SpecError::Duplicate {
                    field: format!("{at}.name"),
                    value: n.clone(),
                });
            }
            let protocol = match p.protocol.as_deref() {
                None | Some("TCP") => Protocol::Tcp,
                Some("UDP") => Protocol::Udp,
                Some("SCTP") => Protocol::Sctp,
                Some(v) => {
                    errs.invalid(format!("{at}.protocol"), v, "must be TCP, UDP or SCTP");
                    Protocol::Tcp
                }
            };
            let host_port = match p.host_port {
                None | Some(0) => None,
                Some(hp) => port_number(errs, format!("{at}.hostPort"), i64::from(hp)),
            };
            let host_ip = p
                .host_ip
                .as_deref()
                .filter(|h| !h.is_empty())
                .and_then(|h| {
                    h.parse()
                        .map_err(|_| errs.invalid(format!("{at}.hostIP"), h, "must be an IP"))
                        .ok()
                });
            let container_port = port_number(
                errs,
                format!("{at}.containerPort"),
                i64::from(p.container_port),
            )?;
            // The API defaults hostPort to containerPort on the host network
            // and refuses any other value: the node's port is the container's.
            let host_port = match host_port {
                Some(hp) if host_network && hp != container_port => {
                    errs.invalid(
                        format!("{at}.hostPort"),
                        hp,
                        "must match containerPort when hostNetwork is true",
                    );
                    Some(hp)
                }
                None if host_network => Some(container_port),
                hp => hp,
            };
            Some(ContainerPort {
                name,
                container_port,
                host_port,
                host_ip,
                protocol,
            })
        })
        .collect()
}

pub(super) fn port_number(errs: &mut Errs, field: String, port: i64) -> Option<u16> {
    match u16::try_from(port) {
        Ok(p) if p != 0 => Some(p),
        _ => {
            errs.0.push(SpecError::PortOutOfRange { field, port });
            None
        }
    }
}

#[cfg(test)]
mod node_agent_tests;
#[cfg(test)]
mod tests;
