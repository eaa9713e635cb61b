//! The parts of a Service that reach it from outside the cluster, and the
//! options that apply to every frontend: externalIPs, load-balancer ingress,
//! source ranges and session affinity.
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Service, ServiceSpec};

use super::{FieldError, Problem};
use crate::model::Cidr;

/// The annotation kube-proxy reads when `spec.loadBalancerSourceRanges` is
/// empty (comma-separated CIDRs).
pub const ANNOTATION_SOURCE_RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";

/// `sessionAffinityConfig.clientIP.timeoutSeconds` default (3 hours) and
/// maximum (1 day), as the API defines them.
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;
pub const MAX_AFFINITY_TIMEOUT: u32 = 86_400;

pub fn external_ips(spec: &ServiceSpec, errors: &mut Vec<FieldError>) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for (i, ip) in spec.external_ips.iter().flatten().enumerate() {
        match ip.trim().parse::<IpAddr>() {
            Ok(addr) => out.push(addr.to_canonical()),
            Err(_) => errors.push(FieldError::new(
                format!("spec.externalIPs[{i}]"),
                Problem::InvalidIp { value: ip.clone() },
            )),
        }
    }
    out
}

/// `status.loadBalancer.ingress[].ip`. Hostname-only entries have nothing to
/// program; `ipMode: Proxy` ones are reached through the load balancer's own
/// proxy, so, as kube-proxy (KEP-1860), nodes must not capture the IP.
pub fn lb_ips(svc: &Service, errors: &mut Vec<FieldError>) -> Vec<IpAddr> {
    let ingress = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref());
    let mut out = Vec::new();
    for (i, ing) in ingress.into_iter().flatten().enumerate() {
        let Some(ip) = ing.ip.as_deref().filter(|ip| !ip.is_empty()) else {
            continue;
        };
        match ip.parse::<IpAddr>() {
            Ok(_) if ing.ip_mode.as_deref() == Some("Proxy") => {}
            Ok(addr) => out.push(addr.to_canonical()),
            Err(_) => errors.push(FieldError::new(
                format!("status.loadBalancer.ingress[{i}].ip"),
                Problem::InvalidIp {
                    value: ip.to_owned(),
                },
            )),
        }
    }
    out
}

/// `spec.loadBalancerSourceRanges`, or the older annotation when the field is
/// empty (kube-proxy's `GetLoadBalancerSourceRanges`). One malformed entry
/// rejects the Service: dropping it would open the load balancer wider than
/// its owner asked.
pub fn source_ranges(svc: &Service, errors: &mut Vec<FieldError>) -> Vec<Cidr> {
    let field_ranges = svc
        .spec
        .as_ref()
        .and_then(|s| s.load_balancer_source_ranges.as_ref())
        .filter(|r| !r.is_empty());
    let entries: Vec<(String, &str)> = match field_ranges {
        Some(r) => r
            .iter()
            .enumerate()
            .map(|(i, c)| (format!("spec.loadBalancerSourceRanges[{i}]"), c.as_str()))
            .collect(),
        None => svc
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_SOURCE_RANGES))
            .map(|v| {
                v.split(',')
                    .filter(|c| !c.trim().is_empty())
                    .map(|c| {
                        (
                            format!("metadata.annotations[{ANNOTATION_SOURCE_RANGES}]"),
                            c,
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
    };
    let mut out = Vec::new();
    for (field, c) in entries {
        match Cidr::parse(c) {
            Some(cidr) => {
                if !out.contains(&cidr) {
                    out.push(cidr);
                }
            }
            None => errors.push(FieldError::new(
                field,
                Problem::InvalidCidr {
                    value: c.to_owned(),
                },
            )),
        }
    }
    out
}

/// `sessionAffinity: ClientIP` and its timeout in seconds.
pub fn affinity(spec: &ServiceSpec, errors: &mut Vec<FieldError>) -> Option<u32> {
    match spec.session_affinity.as_deref() {
        None | Some("" | "None") => None,
        Some("ClientIP") => {
            let value = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .map_or(i64::from(DEFAULT_AFFINITY_TIMEOUT), i64::from);
            match u32::try_from(value) {
                Ok(t) if (1..=MAX_AFFINITY_TIMEOUT).contains(&t) => Some(t),
                _ => {
                    errors.push(FieldError::new(
                        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                        Problem::AffinityTimeoutOutOfRange { value },
                    ));
                    None
                }
            }
        }
        Some(other) => {
            errors.push(FieldError::new(
                "spec.sessionAffinity",
                Problem::UnknownSessionAffinity {
                    value: other.to_owned(),
                },
            ));
            None
        }
    }
}
