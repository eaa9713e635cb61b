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
    let endpoints: Vec<_> = endpoints
        .iter()
        .map(|(ip, c)| (std::net::IpAddr::V4(*ip), *c, None))
        .collect();
    slice_on_nodes(name, service, &endpoints)
}

/// An EndpointSlice of either family for [`service`]'s ports: each endpoint
/// with its conditions and, for `externalTrafficPolicy: Local` tests, the node
/// it runs on. The address type follows the first address (IPv4 if none).
pub fn slice_on_nodes(
    name: &str,
    service: &str,
    endpoints: &[(std::net::IpAddr, Cond, Option<&str>)],
) -> String {
    let family = match endpoints.first() {
        Some((std::net::IpAddr::V6(_), ..)) => "IPv6",
        _ => "IPv4",
    };
    let mut s = format!(
        "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {name}
  namespace: default
  labels:
    kubernetes.io/service-name: {service}
addressType: {family}
ports:
- {{name: http, port: {BACKEND_TCP_PORT}, protocol: TCP}}
- {{name: dns, port: {BACKEND_UDP_PORT}, protocol: UDP}}
endpoints:{}
",
        if endpoints.is_empty() { " []" } else { "" }
    );
    for (ip, c, node) in endpoints {
        let _ = writeln!(
            s,
            "- addresses: [\"{ip}\"]\n  conditions: {{ready: {}, serving: {}, terminating: {}}}",
            c.ready, c.serving, c.terminating
        );
        if let Some(node) = node {
            let _ = writeln!(s, "  nodeName: {node}");
        }
    }
    s
}

/// A Service with the external parts the packet datapath serves, with the
/// same `http` TCP 80 and `dns` UDP 53 ports as [`service`]. Unset fields are
/// left out of the manifest (the API defaults apply).
#[derive(Clone, Debug, Default)]
pub struct ExternalService {
    pub name: String,
    /// `ClusterIP`, `NodePort` or `LoadBalancer`; empty means ClusterIP.
    pub type_: String,
    /// `clusterIPs`, primary first (one per family).
    pub cluster_ips: Vec<String>,
    /// Node ports of the `http` and `dns` ports.
    pub node_ports: Option<(u16, u16)>,
    pub external_ips: Vec<String>,
    /// `status.loadBalancer.ingress[].ip`.
    pub ingress_ips: Vec<String>,
    /// `externalTrafficPolicy: Local`.
    pub local: bool,
    pub health_check_node_port: Option<u16>,
    /// `sessionAffinity: ClientIP` with this timeout.
    pub affinity_timeout: Option<i64>,
    pub source_ranges: Vec<String>,
}

impl ExternalService {
    pub fn to_yaml(&self) -> String {
        let list = |v: &[String]| {
            let quoted: Vec<String> = v.iter().map(|s| format!("\"{s}\"")).collect();
            format!("[{}]", quoted.join(", "))
        };
        let mut s = format!(
            "apiVersion: v1
kind: Service
metadata:
  name: {}
  namespace: default
spec:
  type: {}
  clusterIP: {}
  clusterIPs: {}
",
            self.name,
            if self.type_.is_empty() {
                "ClusterIP"
            } else {
                &self.type_
            },
            self.cluster_ips.first().map_or("", String::as_str),
            list(&self.cluster_ips),
        );
        let (np_http, np_dns) = match self.node_ports {
            Some((h, d)) => (format!(", nodePort: {h}"), format!(", nodePort: {d}")),
            None => (String::new(), String::new()),
        };
        let _ = write!(
            s,
            "  ports:
  - {{name: http, port: 80, protocol: TCP, targetPort: {BACKEND_TCP_PORT}{np_http}}}
  - {{name: dns, port: 53, protocol: UDP, targetPort: {BACKEND_UDP_PORT}{np_dns}}}
"
        );
        if !self.external_ips.is_empty() {
            let _ = writeln!(s, "  externalIPs: {}", list(&self.external_ips));
        }
        if self.local {
            s.push_str("  externalTrafficPolicy: Local\n");
        }
        if let Some(p) = self.health_check_node_port {
            let _ = writeln!(s, "  healthCheckNodePort: {p}");
        }
        if let Some(t) = self.affinity_timeout {
            let _ = writeln!(
                s,
                "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {{clientIP: {{timeoutSeconds: {t}}}}}"
            );
        }
        if !self.source_ranges.is_empty() {
            let _ = writeln!(
                s,
                "  loadBalancerSourceRanges: {}",
                list(&self.source_ranges)
            );
        }
        if !self.ingress_ips.is_empty() {
            s.push_str("status:\n  loadBalancer:\n    ingress:\n");
            for ip in &self.ingress_ips {
                let _ = writeln!(s, "    - ip: \"{ip}\"");
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

    use super::*;

    #[test]
    fn external_service_parses_into_every_field() {
        let y = ExternalService {
            name: "lb".into(),
            type_: "LoadBalancer".into(),
            cluster_ips: vec!["10.96.0.20".into(), "fd00::20".into()],
            node_ports: Some((30080, 30053)),
            external_ips: vec!["192.0.2.7".into()],
            ingress_ips: vec!["198.51.100.1".into()],
            local: true,
            health_check_node_port: Some(32000),
            affinity_timeout: Some(60),
            source_ranges: vec!["10.0.0.0/8".into()],
        }
        .to_yaml();
        let s: Service = serde_saphyr::from_str(&y).unwrap_or_else(|e| panic!("{e}\n{y}"));
        let spec = s.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("LoadBalancer"));
        assert_eq!(spec.cluster_ips.unwrap().len(), 2);
        assert_eq!(spec.ports.unwrap()[1].node_port, Some(30053));
        assert_eq!(spec.external_traffic_policy.as_deref(), Some("Local"));
        assert_eq!(spec.health_check_node_port, Some(32000));
        assert_eq!(
            spec.session_affinity_config
                .unwrap()
                .client_ip
                .unwrap()
                .timeout_seconds,
            Some(60)
        );
        assert_eq!(spec.load_balancer_source_ranges.unwrap(), ["10.0.0.0/8"]);
        let ingress = s.status.unwrap().load_balancer.unwrap().ingress.unwrap();
        assert_eq!(ingress[0].ip.as_deref(), Some("198.51.100.1"));

        let y = slice_on_nodes(
            "lb-v6",
            "lb",
            &[("fd00::1".parse().unwrap(), READY, Some("node-1"))],
        );
        let e: EndpointSlice = serde_saphyr::from_str(&y).unwrap_or_else(|e| panic!("{e}\n{y}"));
        assert_eq!(e.address_type, "IPv6");
        assert_eq!(e.endpoints[0].node_name.as_deref(), Some("node-1"));
    }
}
