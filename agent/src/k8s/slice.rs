use std::net::IpAddr;

use super::{
    Converted, FieldError, LABEL_SERVICE_NAME, ObjectError, Problem, port, protocol,
    wire::{Address, EndpointSlice},
};
use crate::model::{
    EndpointMeta, EndpointSpec, IpFamily, ServiceId, SliceId, SlicePortSpec, SliceSpec,
};

/// What became of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SliceOutcome {
    /// An IPv4 or IPv6 slice the datapath uses.
    Ip(Converted<SliceSpec>),
    /// A valid slice the datapath has no use for (FQDN). Any slice it replaces
    /// is withdrawn.
    Ignored { reason: &'static str },
}

pub fn slice(eps: &EndpointSlice) -> Result<SliceOutcome, ObjectError> {
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let name = eps.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        errors.push(FieldError::new("metadata.name", Problem::Missing));
    }
    let namespace = eps
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".to_owned());
    let service = eps
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_SERVICE_NAME))
        .filter(|s| !s.is_empty());
    if service.is_none() {
        errors.push(FieldError::new(
            format!("metadata.labels[{LABEL_SERVICE_NAME}]"),
            Problem::Missing,
        ));
    }
    // kube-proxy keeps one proxier per family and feeds each only the slices
    // of its family; the store does the same by frontend family.
    let family = match eps.address_type.as_str() {
        "IPv4" => IpFamily::V4,
        "IPv6" => IpFamily::V6,
        "FQDN" => {
            return finish(
                errors,
                "FQDN slices are not load balanced (as in kube-proxy)",
            );
        }
        other => {
            errors.push(FieldError::new(
                "addressType",
                Problem::UnknownAddressType {
                    value: other.to_owned(),
                },
            ));
            IpFamily::V4
        }
    };

    let mut ports = Vec::with_capacity(eps.ports.as_ref().map_or(0, Vec::len));
    for (i, p) in eps.ports.iter().flatten().enumerate() {
        let Some(number) = p.port else {
            warnings.push(FieldError::new(
                format!("ports[{i}].port"),
                Problem::NoPortNumber,
            ));
            continue;
        };
        let number = port(|| format!("ports[{i}].port"), i64::from(number));
        let proto = protocol(|| format!("ports[{i}].protocol"), p.protocol.as_deref());
        match (number, proto) {
            (Ok(port), Ok(proto)) => ports.push(SlicePortSpec {
                name: crate::intern::name(p.name.as_deref().unwrap_or_default()),
                port,
                proto,
            }),
            (number, proto) => errors.extend(number.err().into_iter().chain(proto.err())),
        }
    }

    let mut endpoints = Vec::with_capacity(eps.endpoints.len());
    for (i, ep) in eps.endpoints.iter().enumerate() {
        // The first usable address apart: a Vec per endpoint for the
        // rare second one would be a heap block per endpoint.
        let mut first = None;
        let mut more_addrs = Vec::new();
        for (j, a) in ep.addresses.iter().enumerate() {
            let field = || format!("endpoints[{i}].addresses[{j}]");
            let parsed = match a {
                Address::Ip(ip) => Ok(*ip),
                Address::Text(t) => t.parse::<IpAddr>().map(|ip| ip.to_canonical()),
            };
            // One bad address costs that address, not the slice.
            match parsed {
                Ok(ip) if IpFamily::of(&ip) == family => match first {
                    None => first = Some(ip),
                    Some(_) => more_addrs.push(ip),
                },
                // An address of the other family would give a frontend a
                // backend it cannot reach; the API server forbids it anyway.
                Ok(_) => warnings.push(FieldError::new(
                    field(),
                    Problem::WrongFamily {
                        value: a.to_string(),
                        family,
                    },
                )),
                Err(_) => warnings.push(FieldError::new(
                    field(),
                    Problem::InvalidIp {
                        value: a.to_string(),
                    },
                )),
            }
        }
        let Some(addr) = first else {
            continue;
        };
        let c = ep.conditions.unwrap_or_default();
        // API defaults: unknown readiness counts as ready, serving defers to
        // ready, and terminating defaults to false.
        let ready = c.ready.unwrap_or(true);
        let hints = ep.hints.as_ref();
        let meta = EndpointMeta {
            node_name: ep.node_name.clone(),
            more_addrs,
            zone_hints: hints
                .and_then(|h| h.for_zones.as_ref())
                .into_iter()
                .flatten()
                .map(|z| z.name.clone())
                .collect(),
            node_hints: hints
                .and_then(|h| h.for_nodes.as_ref())
                .into_iter()
                .flatten()
                .map(|n| n.name.clone())
                .collect(),
        };
        endpoints.push(EndpointSpec {
            addr,
            ready,
            serving: c.serving.unwrap_or(ready),
            terminating: c.terminating.unwrap_or(false),
            meta: meta.shared(),
        });
    }

    if !errors.is_empty() {
        return Err(ObjectError { errors });
    }
    Ok(SliceOutcome::Ip(Converted {
        value: SliceSpec {
            id: SliceId::new(&namespace, name),
            service: ServiceId::new(namespace, service.cloned().unwrap_or_default()),
            family,
            ports: ports.into(),
            endpoints: endpoints.into(),
        },
        warnings,
    }))
}

fn finish(errors: Vec<FieldError>, reason: &'static str) -> Result<SliceOutcome, ObjectError> {
    if errors.is_empty() {
        Ok(SliceOutcome::Ignored { reason })
    } else {
        Err(ObjectError { errors })
    }
}
