use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;

use super::{
    Converted, FieldError, LABEL_SERVICE_PROXY_NAME, ObjectError, Problem, external, port,
    protocol, traffic_policy,
};
use crate::model::{
    ANNOTATION_LB_ALGORITHM, IpFamily, LbAlgorithm, ServiceId, ServicePortSpec, ServiceSpec,
    ServiceType, TrafficPolicy,
};

/// Converts a Service. Services that a kube-proxy would not program (headless,
/// ExternalName, owned by another proxy) convert to a spec with no cluster IP,
/// which gets no frontend of any kind.
pub fn service(svc: &Service) -> Result<Converted<ServiceSpec>, ObjectError> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let name = svc.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        errors.push(FieldError::new("metadata.name", Problem::Missing));
    }
    let namespace = svc
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    let id = ServiceId::new(namespace, name);
    // Borrowed: a clone of every string in the spec, per Service, was a
    // visible share of converting a 100k-Service list.
    let no_spec;
    let spec = match &svc.spec {
        Some(spec) => spec,
        None => {
            no_spec = k8s_openapi::api::core::v1::ServiceSpec::default();
            &no_spec
        }
    };

    let foreign_proxy = svc
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL_SERVICE_PROXY_NAME));
    let external_name = spec.type_.as_deref() == Some("ExternalName");
    let headless = spec.cluster_ip.as_deref() == Some("None");
    let kind = match spec.type_.as_deref() {
        None | Some("ClusterIP" | "ExternalName") => ServiceType::ClusterIp,
        Some("NodePort") => ServiceType::NodePort,
        Some("LoadBalancer") => ServiceType::LoadBalancer,
        Some(other) => {
            errors.push(FieldError::new(
                "spec.type",
                Problem::UnknownServiceType {
                    value: other.to_owned(),
                },
            ));
            ServiceType::ClusterIp
        }
    };

    let mut cluster_ips = Vec::new();
    if !(foreign_proxy || external_name || headless) {
        cluster_ips = parse_cluster_ips(spec, &mut errors, &mut warnings);
        check_families(spec, &cluster_ips, &mut errors);
    }

    let ports = parse_ports(spec, kind, &mut errors);

    let internal_policy = traffic_policy(
        "spec.internalTrafficPolicy",
        spec.internal_traffic_policy.as_deref(),
    )
    .map_err(|e| errors.push(e))
    .unwrap_or_default();
    let mut external_policy = traffic_policy(
        "spec.externalTrafficPolicy",
        spec.external_traffic_policy.as_deref(),
    )
    .map_err(|e| errors.push(e))
    .unwrap_or_default();
    let external_ips = external::external_ips(spec, &mut errors);
    // kube-proxy's ExternalPolicyLocal: the policy applies only to Services
    // that are externally accessible (apiservice.ExternallyAccessible): type
    // NodePort or LoadBalancer, or ClusterIP with external IPs. A plain
    // ClusterIP Service has no external frontend to apply it to.
    let externally_accessible = kind.has_node_ports() || !external_ips.is_empty();
    if !externally_accessible {
        external_policy = TrafficPolicy::Cluster;
    }
    let health_check_node_port = match (kind, external_policy, spec.health_check_node_port) {
        (ServiceType::LoadBalancer, TrafficPolicy::Local, Some(n)) => {
            port(|| "spec.healthCheckNodePort".to_owned(), i64::from(n))
                .map_err(|e| errors.push(e))
                .ok()
        }
        _ => None,
    };

    let lb_ips = if kind == ServiceType::LoadBalancer {
        external::lb_ips(svc, &mut errors)
    } else {
        Vec::new()
    };
    let source_ranges = external::source_ranges(svc, &mut errors);
    let affinity = external::affinity(spec, &mut errors);
    let lb_algorithm = lb_algorithm(svc, &mut warnings);

    if !errors.is_empty() {
        return Err(ObjectError { errors });
    }
    Ok(Converted {
        value: ServiceSpec {
            id,
            created: svc
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second()),
            kind,
            cluster_ips: cluster_ips.into(),
            ports: ports.into(),
            internal_policy,
            external_policy,
            external_ips: external_ips.into(),
            lb_ips: lb_ips.into(),
            source_ranges: source_ranges.into(),
            health_check_node_port,
            affinity,
            lb_algorithm,
        },
        warnings,
    })
}

fn parse_cluster_ips(
    spec: &k8s_openapi::api::core::v1::ServiceSpec,
    errors: &mut Vec<FieldError>,
    warnings: &mut Vec<FieldError>,
) -> Vec<IpAddr> {
    // Field names are only formatted for an error: at 100k Services the
    // valid ones would cost an allocation each for nothing.
    let (ips, plural): (&[String], bool) = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(ips), single) if !ips.is_empty() => {
            if let Some(single) = single.as_deref().filter(|s| !s.is_empty())
                && single != ips[0]
            {
                errors.push(FieldError::new(
                    "spec.clusterIPs[0]",
                    Problem::ClusterIpMismatch {
                        ip: single.to_owned(),
                        ips0: ips[0].clone(),
                    },
                ));
            }
            (ips, true)
        }
        (_, Some(ip)) if !ip.is_empty() => (std::slice::from_ref(ip), false),
        _ => {
            warnings.push(FieldError::new("spec.clusterIP", Problem::NoClusterIp));
            (&[], false)
        }
    };
    // Exact: held by every Service for as long as it exists.
    let mut out = Vec::with_capacity(ips.len());
    for (i, ip) in ips.iter().enumerate() {
        match ip.parse::<IpAddr>() {
            Ok(addr) => out.push(addr.to_canonical()),
            Err(_) => {
                let field = if plural {
                    format!("spec.clusterIPs[{i}]")
                } else {
                    "spec.clusterIP".to_owned()
                };
                errors.push(FieldError::new(
                    field,
                    Problem::InvalidIp { value: ip.clone() },
                ));
            }
        }
    }
    out
}

/// `clusterIPs` holds at most one address per family, and `ipFamilies[i]` is
/// the family of `clusterIPs[i]`, as the API server guarantees. A manifest
/// that breaks this would otherwise get frontends nobody can predict.
fn check_families(
    spec: &k8s_openapi::api::core::v1::ServiceSpec,
    cluster_ips: &[IpAddr],
    errors: &mut Vec<FieldError>,
) {
    let mut families = Vec::new();
    let mut flagged = Vec::new();
    for (i, f) in spec.ip_families.iter().flatten().enumerate() {
        let field = || format!("spec.ipFamilies[{i}]");
        let family = match f.as_str() {
            "IPv4" => IpFamily::V4,
            "IPv6" => IpFamily::V6,
            other => {
                errors.push(FieldError::new(
                    field(),
                    Problem::UnknownIpFamily {
                        value: other.to_owned(),
                    },
                ));
                // Keeps indexes aligned with clusterIPs.
                families.push(None);
                continue;
            }
        };
        if families.contains(&Some(family)) {
            errors.push(FieldError::new(
                field(),
                Problem::DuplicateFamily { family },
            ));
            flagged.push(i);
        }
        families.push(Some(family));
    }
    if families.len() > 2 {
        errors.push(FieldError::new(
            "spec.ipFamilies",
            Problem::TooManyFamilies {
                count: families.len(),
            },
        ));
    }
    if cluster_ips.len() > 2 {
        errors.push(FieldError::new(
            "spec.clusterIPs",
            Problem::TooManyFamilies {
                count: cluster_ips.len(),
            },
        ));
    }
    if let [a, b, ..] = cluster_ips
        && IpFamily::of(a) == IpFamily::of(b)
    {
        errors.push(FieldError::new(
            "spec.clusterIPs[1]",
            Problem::DuplicateFamily {
                family: IpFamily::of(b),
            },
        ));
    }
    for (i, (ip, family)) in cluster_ips.iter().zip(&families).enumerate() {
        let Some(family) = *family else { continue };
        // One error per field: a duplicate family is already reported.
        if IpFamily::of(ip) != family && !flagged.contains(&i) {
            errors.push(FieldError::new(
                format!("spec.ipFamilies[{i}]"),
                Problem::FamilyMismatch { family, ip: *ip },
            ));
        }
    }
}

fn parse_ports(
    spec: &k8s_openapi::api::core::v1::ServiceSpec,
    kind: ServiceType,
    errors: &mut Vec<FieldError>,
) -> Vec<ServicePortSpec> {
    let mut ports: Vec<ServicePortSpec> =
        Vec::with_capacity(spec.ports.as_ref().map_or(0, Vec::len));
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        let number = port(|| format!("spec.ports[{i}].port"), i64::from(p.port));
        let proto = protocol(
            || format!("spec.ports[{i}].protocol"),
            p.protocol.as_deref(),
        );
        // A ClusterIP Service may keep a stale nodePort from an earlier type;
        // it means nothing there, as in the API.
        let node_port = match p.node_port.filter(|_| kind.has_node_ports()) {
            Some(n) => match port(|| format!("spec.ports[{i}].nodePort"), i64::from(n)) {
                Ok(n) => Some(n),
                Err(e) => {
                    errors.push(e);
                    None
                }
            },
            None => None,
        };
        match (number, proto) {
            (Ok(port), Ok(proto)) => {
                if ports.iter().any(|q| q.port == port && q.proto == proto) {
                    errors.push(FieldError::new(
                        format!("spec.ports[{i}]"),
                        Problem::DuplicatePort { port, proto },
                    ));
                }
                if let Some(n) = node_port
                    && ports
                        .iter()
                        .any(|q| q.node_port == Some(n) && q.proto == proto)
                {
                    errors.push(FieldError::new(
                        format!("spec.ports[{i}].nodePort"),
                        Problem::DuplicateNodePort { port: n, proto },
                    ));
                }
                ports.push(ServicePortSpec {
                    name: crate::intern::name(p.name.as_deref().unwrap_or_default()),
                    port,
                    proto,
                    node_port,
                });
            }
            (number, proto) => errors.extend(number.err().into_iter().chain(proto.err())),
        }
    }
    ports
}

/// The [`ANNOTATION_LB_ALGORITHM`] override. An unknown value is a warning,
/// not a refusal: the Service keeps working with the agent's default.
fn lb_algorithm(svc: &Service, warnings: &mut Vec<FieldError>) -> Option<LbAlgorithm> {
    let value = svc
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_LB_ALGORITHM)?;
    let parsed = LbAlgorithm::parse(value.trim());
    if parsed.is_none() {
        warnings.push(FieldError::new(
            format!("metadata.annotations[{ANNOTATION_LB_ALGORITHM}]"),
            Problem::UnknownLbAlgorithm {
                value: value.clone(),
            },
        ));
    }
    parsed
}
