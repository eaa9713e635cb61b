//! Manifest text for tests and the demo.
use std::fmt::Write as _;

use crate::topology::{BACKEND_TCP_PORT, BACKEND_UDP_PORT};

/// A Service with an `http` TCP port 80 and a `dns` UDP port 53.
pub fn service(name: &str, cluster_ip: &str) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: default
spec:
  clusterIP: {cluster_ip}
  ports:
  - {{name: http, port: 80, protocol: TCP, targetPort: {BACKEND_TCP_PORT}}}
  - {{name: dns, port: 53, protocol: UDP, targetPort: {BACKEND_UDP_PORT}}}
"
    )
}

/// Conditions of one endpoint.
#[derive(Clone, Copy, Debug)]
pub struct Cond {
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

pub const READY: Cond = Cond {
    ready: true,
    serving: true,
    terminating: false,
};
pub const TERMINATING: Cond = Cond {
    ready: false,
    serving: true,
    terminating: true,
};
pub const NOT_SERVING: Cond = Cond {
    ready: false,
    serving: false,
    terminating: true,
};

/// An EndpointSlice for [`service`]'s ports.
pub fn slice(name: &str, service: &str, endpoints: &[(std::net::Ipv4Addr, Cond)]) -> String {
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}
  namespace: default
  labels:
    kubernetes.io/service-name: {service}
addressType: IPv4
ports:
- {{name: http, port: {BACKEND_TCP_PORT}, protocol: TCP}}
- {{name: dns, port: {BACKEND_UDP_PORT}, protocol: UDP}}
endpoints:
"
    );
    if endpoints.is_empty() {
        s.truncate(s.len() - "endpoints:\n".len());
        s.push_str("endpoints: []\n");
    }
    for (ip, c) in endpoints {
        let _ = writeln!(
            s,
            "- addresses: [\"{ip}\"]\n  conditions: {{ready: {}, serving: {}, terminating: {}}}",
            c.ready, c.serving, c.terminating
        );
    }
    s
}
