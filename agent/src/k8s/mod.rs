//! The edge between Kubernetes wire types (k8s-openapi) and the agent's domain
//! types. Every source, the manifest directory today and the API server later,
//! converts through here, so validation and defaults are the same everywhere.
mod external;
pub mod node;
mod service;
mod slice;
pub mod wire;

use std::fmt;

pub use external::{ANNOTATION_SOURCE_RANGES, DEFAULT_AFFINITY_TIMEOUT, MAX_AFFINITY_TIMEOUT};
pub use service::service;
pub use slice::{SliceOutcome, slice};

/// The label that ties an EndpointSlice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Services with this label belong to another proxy (as in kube-proxy).
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";

/// One problem with one field of an object.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct FieldError {
    /// JSON path of the field, e.g. `spec.ports[1].port`.
    pub field: String,
    pub problem: Problem,
}

impl FieldError {
    pub fn new(field: impl Into<String>, problem: Problem) -> Self {
        Self {
            field: field.into(),
            problem,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    #[error("is required")]
    Missing,
    #[error("{value:?} is not a valid IP address")]
    InvalidIp { value: String },
    #[error("{value:?} is not an {family} address")]
    WrongFamily {
        value: String,
        family: crate::model::IpFamily,
    },
    #[error("{value} is out of range 1-65535")]
    PortOutOfRange { value: i64 },
    #[error("unknown protocol {value:?} (expected TCP, UDP or SCTP)")]
    UnknownProtocol { value: String },
    #[error("duplicate port {port}/{proto}")]
    DuplicatePort {
        port: u16,
        proto: crate::model::Protocol,
    },
    #[error("unknown address type {value:?} (expected IPv4, IPv6 or FQDN)")]
    UnknownAddressType { value: String },
    #[error("clusterIPs[0] {ips0:?} differs from clusterIP {ip:?}")]
    ClusterIpMismatch { ip: String, ips0: String },
    #[error("no port number; the port is skipped")]
    NoPortNumber,
    #[error(
        "empty, so the Service gets no frontend of any kind (nothing allocates a cluster IP without an API server)"
    )]
    NoClusterIp,
    #[error("unknown traffic policy {value:?} (expected Cluster or Local)")]
    UnknownTrafficPolicy { value: String },
    #[error(
        "unknown Service type {value:?} (expected ClusterIP, NodePort, LoadBalancer or ExternalName)"
    )]
    UnknownServiceType { value: String },
    #[error("unknown IP family {value:?} (expected IPv4 or IPv6)")]
    UnknownIpFamily { value: String },
    #[error("{family} given twice; a dual-stack Service has one address per family")]
    DuplicateFamily { family: crate::model::IpFamily },
    #[error("{count} entries; at most 2 (one per family)")]
    TooManyFamilies { count: usize },
    #[error("is {family} but the cluster IP at the same index is {ip}")]
    FamilyMismatch {
        family: crate::model::IpFamily,
        ip: std::net::IpAddr,
    },
    #[error("duplicate node port {port}/{proto}")]
    DuplicateNodePort {
        port: u16,
        proto: crate::model::Protocol,
    },
    #[error("unknown session affinity {value:?} (expected None or ClientIP)")]
    UnknownSessionAffinity { value: String },
    #[error("{value} is out of range 1-86400 seconds")]
    AffinityTimeoutOutOfRange { value: i64 },
    #[error("{value:?} is not a valid CIDR (address/prefix length)")]
    InvalidCidr { value: String },
    #[error(
        "unknown load-balancing algorithm {value:?} (expected random or maglev); the agent's --lb-algorithm applies"
    )]
    UnknownLbAlgorithm { value: String },
}

/// Why a whole object was rejected: every field problem found, at once.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ObjectError {
    pub errors: Vec<FieldError>,
}

impl fmt::Display for ObjectError {
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

/// A converted object and the problems that did not reject it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Converted<T> {
    pub value: T,
    pub warnings: Vec<FieldError>,
}

fn port(field: impl FnOnce() -> String, value: i64) -> Result<u16, FieldError> {
    match u16::try_from(value) {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(FieldError::new(field(), Problem::PortOutOfRange { value })),
    }
}

fn traffic_policy(
    field: &str,
    value: Option<&str>,
) -> Result<crate::model::TrafficPolicy, FieldError> {
    use crate::model::TrafficPolicy;
    match value {
        None | Some("Cluster") => Ok(TrafficPolicy::Cluster),
        Some("Local") => Ok(TrafficPolicy::Local),
        Some(other) => Err(FieldError::new(
            field,
            Problem::UnknownTrafficPolicy {
                value: other.to_owned(),
            },
        )),
    }
}

fn protocol(
    field: impl FnOnce() -> String,
    value: Option<&str>,
) -> Result<crate::model::Protocol, FieldError> {
    let value = value.unwrap_or("TCP");
    crate::model::Protocol::from_k8s(value).ok_or_else(|| {
        FieldError::new(
            field(),
            Problem::UnknownProtocol {
                value: value.to_owned(),
            },
        )
    })
}

#[cfg(test)]
mod external_tests;
#[cfg(test)]
mod tests;
