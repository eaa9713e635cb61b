//! Services and EndpointSlices for the packet-datapath tests, dual-stack. They
//! are written as JSON, which is YAML too, one document per `---`.
use serde_json::{Value, json};

use super::{NODE_NAME, NODE2_NAME, POD_DNS_PORT, POD_TCP_PORT, POD_UDP_PORT, Pod};
pub use crate::manifest::{Cond, NOT_SERVING, READY, TERMINATING};

/// Service ports: `http` 80/TCP → 8080, `echo` 5353/UDP → 5353 (weir-testsrv),
/// `dns` 53/UDP → 53 (dnsmasq).
pub const HTTP_PORT: u16 = 80;
pub const ECHO_PORT: u16 = 5353;
pub const DNS_PORT: u16 = 53;

/// A Service's spec, as the tests vary it.
#[derive(Clone, Debug)]
pub struct Svc {
    pub name: String,
    /// `ClusterIP`, `NodePort` or `LoadBalancer`.
    pub kind: &'static str,
    /// `clusterIPs`: the IPv4 one first for dual-stack.
    pub cluster_ips: Vec<String>,
    /// `nodePort` of `http`, `echo` and `dns`, for NodePort and LoadBalancer.
    pub node_ports: Option<[u16; 3]>,
    pub external_ips: Vec<String>,
    /// `status.loadBalancer.ingress[].ip`.
    pub lb_ingress: Vec<String>,
    pub etp_local: bool,
    pub itp_local: bool,
    pub health_check_node_port: Option<u16>,
    /// `sessionAffinity: ClientIP` with this `timeoutSeconds`.
    pub affinity_timeout: Option<i64>,
    pub source_ranges: Vec<String>,
    /// Extra fields merged into `spec` as given (bad input tests).
    pub spec_extra: Value,
    /// The pods' port behind `echo`: [`POD_UDP_PORT`], or
    /// [`super::POD_UDP_PORT_PRIVATE`] for a test whose UDP backends no other
    /// test's agent removes (the agent destroys sockets to a removed UDP
    /// backend in every network namespace, other tests' included).
    pub echo_target: u16,
    /// `metadata.annotations`.
    pub annotations: Vec<(String, String)>,
}

impl Svc {
    /// A dual-stack ClusterIP Service `name` at `v4`/`v6`.
    pub fn cluster_ip(name: &str, v4: &str, v6: &str) -> Self {
        Self {
            name: name.into(),
            kind: "ClusterIP",
            cluster_ips: vec![v4.into(), v6.into()],
            node_ports: None,
            external_ips: Vec::new(),
            lb_ingress: Vec::new(),
            etp_local: false,
            itp_local: false,
            health_check_node_port: None,
            affinity_timeout: None,
            source_ranges: Vec::new(),
            spec_extra: json!({}),
            echo_target: POD_UDP_PORT,
            annotations: Vec::new(),
        }
    }

    /// A dual-stack NodePort Service.
    pub fn node_port(name: &str, v4: &str, v6: &str, node_ports: [u16; 3]) -> Self {
        Self {
            kind: "NodePort",
            node_ports: Some(node_ports),
            ..Self::cluster_ip(name, v4, v6)
        }
    }

    /// A dual-stack LoadBalancer Service with ingress IPs `lb`.
    pub fn load_balancer(
        name: &str,
        v4: &str,
        v6: &str,
        node_ports: [u16; 3],
        lb: &[&str],
    ) -> Self {
        Self {
            kind: "LoadBalancer",
            node_ports: Some(node_ports),
            lb_ingress: lb.iter().map(|s| (*s).to_owned()).collect(),
            ..Self::cluster_ip(name, v4, v6)
        }
    }

    pub fn to_json(&self) -> Value {
        let names = ["http", "echo", "dns"];
        let ports = [
            (HTTP_PORT, "TCP", POD_TCP_PORT),
            (ECHO_PORT, "UDP", self.echo_target),
            (DNS_PORT, "UDP", POD_DNS_PORT),
        ];
        let ports: Vec<Value> = ports
            .iter()
            .zip(names)
            .enumerate()
            .map(|(i, ((port, proto, target), name))| {
                let mut p =
                    json!({"name": name, "port": port, "protocol": proto, "targetPort": target});
                if let Some(np) = self.node_ports {
                    p["nodePort"] = json!(np[i]);
                }
                p
            })
            .collect();
        let families: Vec<&str> = self
            .cluster_ips
            .iter()
            .map(|ip| if ip.contains(':') { "IPv6" } else { "IPv4" })
            .collect();
        let mut spec = json!({
            "type": self.kind,
            "clusterIP": self.cluster_ips.first(),
            "clusterIPs": self.cluster_ips,
            "ipFamilies": families,
            "ipFamilyPolicy": if families.len() > 1 { "RequireDualStack" } else { "SingleStack" },
            "ports": ports,
        });
        if !self.external_ips.is_empty() {
            spec["externalIPs"] = json!(self.external_ips);
        }
        if self.kind != "ClusterIP" {
            spec["externalTrafficPolicy"] = json!(if self.etp_local { "Local" } else { "Cluster" });
        }
        if self.itp_local {
            spec["internalTrafficPolicy"] = json!("Local");
        }
        if let Some(p) = self.health_check_node_port {
            spec["healthCheckNodePort"] = json!(p);
        }
        if let Some(t) = self.affinity_timeout {
            spec["sessionAffinity"] = json!("ClientIP");
            spec["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": t}});
        }
        if !self.source_ranges.is_empty() {
            spec["loadBalancerSourceRanges"] = json!(self.source_ranges);
        }
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), self.spec_extra.as_object()) {
            for (k, v) in extra {
                spec.insert(k.clone(), v.clone());
            }
        }
        let mut svc = json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": self.name, "namespace": "default"},
            "spec": spec,
        });
        for (k, v) in &self.annotations {
            svc["metadata"]["annotations"][k] = json!(v);
        }
        if !self.lb_ingress.is_empty() {
            let ingress: Vec<Value> = self.lb_ingress.iter().map(|ip| json!({"ip": ip})).collect();
            svc["status"] = json!({"loadBalancer": {"ingress": ingress}});
        }
        svc
    }

    pub fn manifest(&self) -> String {
        self.to_json().to_string()
    }
}

/// One endpoint: a pod, the node it runs on and its conditions.
#[derive(Clone, Copy, Debug)]
pub struct Ep {
    pub pod: Pod,
    pub node: &'static str,
    pub cond: Cond,
}

impl Ep {
    /// `pod` on its own node.
    pub fn of(pod: Pod, cond: Cond) -> Self {
        Self {
            pod,
            node: pod.node,
            cond,
        }
    }

    /// The local pod on the agent's node.
    pub fn local(pod: Pod, cond: Cond) -> Self {
        Self {
            pod,
            node: NODE_NAME,
            cond,
        }
    }

    /// A pod on node2.
    pub fn remote(pod: Pod, cond: Cond) -> Self {
        Self {
            pod,
            node: NODE2_NAME,
            cond,
        }
    }
}

/// The IPv4 and IPv6 EndpointSlices of Service `service`, as two documents.
pub fn slices(service: &str, eps: &[Ep]) -> String {
    slices_per_family(service, POD_UDP_PORT, eps, eps)
}

/// As [`slices`], with `echo` on pod port `echo_port`, and other endpoints
/// in each family, so a test can change one family's endpoints independently
/// of the other's.
pub fn slices_per_family(service: &str, echo_port: u16, v4: &[Ep], v6: &[Ep]) -> String {
    [("IPv4", v4), ("IPv6", v6)]
        .iter()
        .map(|(family, eps)| slice(service, family, echo_port, eps).to_string())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

fn slice(service: &str, family: &str, echo_port: u16, eps: &[Ep]) -> Value {
    let v6 = family == "IPv6";
    let endpoints: Vec<Value> = eps
        .iter()
        .map(|e| {
            json!({
                "addresses": [e.pod.addr(v6)],
                "nodeName": e.node,
                "conditions": {"ready": e.cond.ready, "serving": e.cond.serving, "terminating": e.cond.terminating},
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{service}-{}", if v6 { "v6" } else { "v4" }),
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": family,
        "ports": [
            {"name": "http", "port": POD_TCP_PORT, "protocol": "TCP"},
            {"name": "echo", "port": echo_port, "protocol": "UDP"},
            {"name": "dns", "port": POD_DNS_PORT, "protocol": "UDP"},
        ],
        "endpoints": endpoints,
    })
}

/// A Service and its slices as one manifest file.
pub fn service_with(svc: &Svc, eps: &[Ep]) -> String {
    service_per_family(svc, eps, eps)
}

/// A Service and its slices, with other endpoints in each family.
pub fn service_per_family(svc: &Svc, v4: &[Ep], v6: &[Ep]) -> String {
    format!(
        "{}\n---\n{}\n",
        svc.manifest(),
        slices_per_family(&svc.name, svc.echo_target, v4, v6)
    )
}
