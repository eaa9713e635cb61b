use std::net::IpAddr;

use k8s_openapi::api::core::v1::Service;

use super::{
    Converted, FieldError, LABEL_SERVICE_PROXY_NAME, ObjectError, Problem, port, protocol,
    traffic_policy,
};
use crate::model::{ServiceId, ServicePortSpec, ServiceSpec};

/// Converts a Service. Services that a kube-proxy would not program (headless,
/// ExternalName, owned by another proxy) convert to a spec with no cluster IP.
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
    let spec = svc.spec.clone().unwrap_or_default();

    let foreign_proxy = svc
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL_SERVICE_PROXY_NAME));
    let external_name = spec.type_.as_deref() == Some("ExternalName");
    let headless = spec.cluster_ip.as_deref() == Some("None");

    let mut cluster_ips = Vec::new();
    if !(foreign_proxy || external_name || headless) {
        let ips: Vec<(String, String)> = match (&spec.cluster_ips, &spec.cluster_ip) {
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
                ips.iter()
                    .enumerate()
                    .map(|(i, ip)| (format!("spec.clusterIPs[{i}]"), ip.clone()))
                    .collect()
            }
            (_, Some(ip)) if !ip.is_empty() => vec![("spec.clusterIP".to_owned(), ip.clone())],
            _ => {
                warnings.push(FieldError::new("spec.clusterIP", Problem::NoClusterIp));
                Vec::new()
            }
        };
        for (field, ip) in ips {
            match ip.parse::<IpAddr>() {
                Ok(IpAddr::V4(v4)) => cluster_ips.push(v4),
                // The IPv6 datapath is not built yet; the address is valid, so it
                // is not an error in the object.
                Ok(IpAddr::V6(_)) => {}
                Err(_) => errors.push(FieldError::new(field, Problem::InvalidIp { value: ip })),
            }
        }
    }

    let mut ports: Vec<ServicePortSpec> = Vec::new();
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        let number = port(|| format!("spec.ports[{i}].port"), i64::from(p.port));
        let proto = protocol(
            || format!("spec.ports[{i}].protocol"),
            p.protocol.as_deref(),
        );
        match (number, proto) {
            (Ok(port), Ok(proto)) => {
                if ports.iter().any(|q| q.port == port && q.proto == proto) {
                    errors.push(FieldError::new(
                        format!("spec.ports[{i}]"),
                        Problem::DuplicatePort { port, proto },
                    ));
                }
                ports.push(ServicePortSpec {
                    name: p.name.clone().unwrap_or_default(),
                    port,
                    proto,
                });
            }
            (number, proto) => errors.extend(number.err().into_iter().chain(proto.err())),
        }
    }

    let internal_policy = traffic_policy(
        "spec.internalTrafficPolicy",
        spec.internal_traffic_policy.as_deref(),
    )
    .map_err(|e| errors.push(e))
    .unwrap_or_default();
    let external_policy = traffic_policy(
        "spec.externalTrafficPolicy",
        spec.external_traffic_policy.as_deref(),
    )
    .map_err(|e| errors.push(e))
    .unwrap_or_default();

    if !errors.is_empty() {
        return Err(ObjectError { errors });
    }
    Ok(Converted {
        value: ServiceSpec {
            id,
            cluster_ips,
            ports,
            internal_policy,
            external_policy,
        },
        warnings,
    })
}
