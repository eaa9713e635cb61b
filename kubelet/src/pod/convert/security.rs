//! Security contexts, `dnsConfig` and mount propagation, checked as the API
//! server's pkg/apis/core/validation does (static pods never meet it) and
//! merged as the kubelet's `determineEffectiveSecurityContext`.
use k8s_openapi::api::core::v1 as api;

use super::{Errs, SpecError};
use crate::{
    config::is_dns_subdomain,
    pod::{
        MountPropagation, PodDnsConfig, PodSecurity, SeLinuxOptions, SecurityContext,
        SecurityProfile,
    },
};

/// resolv.conf limits the API enforces (`MaxDNSNameservers`,
/// `MaxDNSSearchPaths`, `MaxDNSSearchListChars`).
pub(crate) const MAX_NAMESERVERS: usize = 3;
pub(crate) const MAX_SEARCHES: usize = 32;
pub(crate) const MAX_SEARCH_CHARS: usize = 2048;

fn se_linux(o: &api::SELinuxOptions) -> SeLinuxOptions {
    SeLinuxOptions {
        user: o.user.clone().unwrap_or_default(),
        role: o.role.clone().unwrap_or_default(),
        type_: o.type_.clone().unwrap_or_default(),
        level: o.level.clone().unwrap_or_default(),
    }
}

/// `appArmorProfile` and `seccompProfile` share a shape: a type, and a
/// `localhostProfile` only for `Localhost`.
fn profile(
    errs: &mut Errs,
    at: &str,
    type_: &str,
    localhost: Option<&str>,
    seccomp: bool,
) -> Option<SecurityProfile> {
    let localhost = localhost.filter(|l| !l.is_empty());
    let p = match type_ {
        "RuntimeDefault" => SecurityProfile::RuntimeDefault,
        "Unconfined" => SecurityProfile::Unconfined,
        "Localhost" => match localhost {
            None => {
                errs.required(format!("{at}.localhostProfile"));
                return None;
            }
            // A seccomp profile is a file below the runtime's root.
            Some(l) if seccomp && (l.starts_with('/') || l.split('/').any(|p| p == "..")) => {
                errs.invalid(
                    format!("{at}.localhostProfile"),
                    l,
                    "must be a relative path without '..'",
                );
                return None;
            }
            Some(l) => SecurityProfile::Localhost(l.to_owned()),
        },
        "" => {
            errs.required(format!("{at}.type"));
            return None;
        }
        t => {
            errs.invalid(
                format!("{at}.type"),
                t,
                "must be Localhost, RuntimeDefault or Unconfined",
            );
            return None;
        }
    };
    if localhost.is_some() && !matches!(p, SecurityProfile::Localhost(_)) {
        errs.invalid(
            format!("{at}.localhostProfile"),
            localhost.unwrap_or_default(),
            "can only be set when type is Localhost",
        );
    }
    Some(p)
}

fn app_armor(
    errs: &mut Errs,
    at: &str,
    p: Option<&api::AppArmorProfile>,
) -> Option<SecurityProfile> {
    let p = p?;
    profile(
        errs,
        &format!("{at}.appArmorProfile"),
        &p.type_,
        p.localhost_profile.as_deref(),
        false,
    )
}

fn seccomp(errs: &mut Errs, at: &str, p: Option<&api::SeccompProfile>) -> Option<SecurityProfile> {
    let p = p?;
    profile(
        errs,
        &format!("{at}.seccompProfile"),
        &p.type_,
        p.localhost_profile.as_deref(),
        true,
    )
}

/// The pod-level `securityContext`, as the sandbox runs with it.
pub(super) fn pod_security(errs: &mut Errs, sc: Option<&api::PodSecurityContext>) -> PodSecurity {
    let Some(sc) = sc else {
        return PodSecurity::default();
    };
    let at = "spec.securityContext";
    PodSecurity {
        app_armor: app_armor(errs, at, sc.app_armor_profile.as_ref()),
        run_as_user: sc.run_as_user,
        run_as_group: sc.run_as_group,
        fs_group: sc.fs_group,
        // fsGroup first, as the kubelet's sandbox and container configs list it.
        supplemental_groups: sc
            .fs_group
            .into_iter()
            .chain(sc.supplemental_groups.iter().flatten().copied())
            .collect(),
        se_linux: sc.se_linux_options.as_ref().map(se_linux),
        seccomp: seccomp(errs, at, sc.seccomp_profile.as_ref()),
    }
}

/// A container's effective security context: its own settings, else the
/// pod's (kubelet `determineEffectiveSecurityContext`).
pub(super) fn container_security(
    errs: &mut Errs,
    at: &str,
    c: &api::Container,
    pod_sc: Option<&api::PodSecurityContext>,
    pod: &PodSecurity,
) -> SecurityContext {
    let sc = c.security_context.clone().unwrap_or_default();
    let at = format!("{at}.securityContext");
    let caps = sc.capabilities.clone().unwrap_or_default();
    let privileged = sc.privileged.unwrap_or(false);
    let capabilities_add = caps.add.unwrap_or_default();
    if sc.allow_privilege_escalation == Some(false) {
        if privileged {
            errs.0.push(SpecError::Forbidden {
                field: format!("{at}.allowPrivilegeEscalation"),
                reason: "cannot be false when privileged is true".into(),
            });
        }
        // The API only matches the literal `CAP_SYS_ADMIN`; the runtime adds
        // the prefix, so both spellings grant the same capability.
        if let Some(cap) = capabilities_add
            .iter()
            .find(|c| c.strip_prefix("CAP_").unwrap_or(c) == "SYS_ADMIN")
        {
            errs.0.push(SpecError::Forbidden {
                field: format!("{at}.allowPrivilegeEscalation"),
                reason: format!("cannot be false when capabilities.add has {cap}"),
            });
        }
    }
    match sc.proc_mount.as_deref() {
        None | Some("Default") => {}
        // Pods here always share the node's user namespace (hostUsers: false
        // is refused), and the API allows an unmasked /proc only without it.
        Some("Unmasked") => errs.0.push(SpecError::Forbidden {
            field: format!("{at}.procMount"),
            reason: "`hostUsers` must be false to use `Unmasked`".into(),
        }),
        Some(v) => errs.invalid(format!("{at}.procMount"), v, "must be Default or Unmasked"),
    }
    SecurityContext {
        run_as_user: sc.run_as_user.or(pod.run_as_user),
        run_as_group: sc.run_as_group.or(pod.run_as_group),
        run_as_non_root: sc
            .run_as_non_root
            .or(pod_sc.and_then(|p| p.run_as_non_root))
            .unwrap_or(false),
        read_only_root_filesystem: sc.read_only_root_filesystem.unwrap_or(false),
        privileged,
        allow_privilege_escalation: sc.allow_privilege_escalation,
        capabilities_add,
        capabilities_drop: caps.drop.unwrap_or_default(),
        se_linux: sc
            .se_linux_options
            .as_ref()
            .map(se_linux)
            .or_else(|| pod.se_linux.clone()),
        app_armor: app_armor(errs, &at, sc.app_armor_profile.as_ref())
            .or_else(|| pod.app_armor.clone()),
        seccomp: seccomp(errs, &at, sc.seccomp_profile.as_ref()).or_else(|| pod.seccomp.clone()),
        supplemental_groups: pod.supplemental_groups.clone(),
    }
}

/// `mountPropagation` (validation `validateMountPropagation`).
pub(super) fn mount_propagation(
    errs: &mut Errs,
    at: &str,
    container: &str,
    mount: &api::VolumeMount,
    privileged: bool,
) -> MountPropagation {
    let field = format!("{at}.mountPropagation");
    let p = match mount.mount_propagation.as_deref() {
        None | Some("None") => MountPropagation::None,
        Some("HostToContainer") => MountPropagation::HostToContainer,
        Some("Bidirectional") => MountPropagation::Bidirectional,
        Some(v) => {
            errs.invalid(field, v, "must be Bidirectional, HostToContainer or None");
            return MountPropagation::None;
        }
    };
    if p == MountPropagation::Bidirectional && !privileged {
        errs.0.push(SpecError::Forbidden {
            field,
            reason: format!(
                "Bidirectional mount propagation is available only to privileged containers \
                 (container {container:?}, volume mount {:?} at {})",
                mount.name, mount.mount_path
            ),
        });
    }
    p
}

/// `spec.dnsConfig`, and what `dnsPolicy: None` requires of it
/// (validation `validatePodDNSConfig`).
pub(super) fn dns_config(
    errs: &mut Errs,
    c: Option<&api::PodDNSConfig>,
    policy_none: bool,
) -> Option<PodDnsConfig> {
    let at = "spec.dnsConfig";
    let Some(c) = c else {
        if policy_none {
            errs.0.push(SpecError::Forbidden {
                field: at.into(),
                reason: "is required when dnsPolicy is None".into(),
            });
        }
        return None;
    };
    let servers = c.nameservers.as_deref().unwrap_or_default();
    if policy_none && servers.is_empty() {
        errs.0.push(SpecError::Forbidden {
            field: format!("{at}.nameservers"),
            reason: "must have at least one nameserver when dnsPolicy is None".into(),
        });
    }
    if servers.len() > MAX_NAMESERVERS {
        errs.invalid(
            format!("{at}.nameservers"),
            servers.join(" "),
            "must not have more than 3 nameservers",
        );
    }
    let nameservers = servers
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            s.parse()
                .map_err(|_| errs.invalid(format!("{at}.nameservers[{i}]"), s, "must be an IP"))
                .ok()
        })
        .collect();
    let searches = c.searches.clone().unwrap_or_default();
    if searches.len() > MAX_SEARCHES {
        errs.invalid(
            format!("{at}.searches"),
            searches.len(),
            "must not have more than 32 search paths",
        );
    }
    if searches.join(" ").len() > MAX_SEARCH_CHARS {
        errs.invalid(
            format!("{at}.searches"),
            searches.join(" ").len(),
            "must not have more than 2048 characters (including spaces) in the search list",
        );
    }
    for (i, s) in searches.iter().enumerate() {
        // A trailing dot (fully qualified) is allowed, as the API does.
        if !is_dns_subdomain(s.strip_suffix('.').unwrap_or(s)) {
            errs.invalid(format!("{at}.searches[{i}]"), s, "must be a DNS subdomain");
        }
    }
    let options = c
        .options
        .iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, o)| {
            let name = o.name.clone().filter(|n| !n.is_empty());
            if name.is_none() {
                errs.required(format!("{at}.options[{i}].name"));
            }
            Some((name?, o.value.clone()))
        })
        .collect();
    Some(PodDnsConfig {
        nameservers,
        searches,
        options,
    })
}
