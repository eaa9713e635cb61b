//! The frontends of one valid Service: one per cluster IP, node address
//! (NodePort), load-balancer IP and external IP, per port and family, and a
//! second, local-only scope of each external one under
//! `externalTrafficPolicy: Local`.

use std::net::IpAddr;

use super::backends::{backends_for, candidates, local_ready};
use crate::hash::HashSet;
use crate::model::{
    Backend, BackendState, DesiredFrontend, Frontend, FrontendKind, IpFamily, LbAlgorithm,
    LbOptions, NodeInfo, Scope, ServicePortSpec, ServiceSpec, ServiceType, SliceSpec,
    TrafficPolicy,
};

/// What a Service should look like in the datapath and around it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DesiredService {
    pub frontends: Vec<DesiredFrontend>,
    /// Set for LoadBalancer Services with `externalTrafficPolicy: Local` and a
    /// `healthCheckNodePort`.
    pub health_check: Option<HealthCheck>,
    /// Frontends the Service asks for that another Service keeps (see
    /// `frontend_claims`), each naming its field; not in `frontends`.
    pub refused: Vec<super::StoreError>,
    pub no_local: NoLocalEndpoints,
}

/// Ports of a Service whose Local traffic policy leaves this node without an
/// endpoint to serve them, counted in the primary family as kube-proxy's
/// primary proxier counts `sync_proxy_rules_no_local_endpoints_total`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NoLocalEndpoints {
    /// `internalTrafficPolicy: Local`: in-cluster clients here are refused.
    pub internal: u32,
    /// `externalTrafficPolicy: Local`: external traffic here is dropped.
    pub external: u32,
}

/// What the healthCheckNodePort server answers for a Service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HealthCheck {
    pub node_port: u16,
    /// This node's ready endpoints; the load balancer sends traffic only
    /// while it is above 0.
    pub local_endpoints: usize,
}

pub fn desired(
    svc: &ServiceSpec,
    slices: &[&SliceSpec],
    node: &NodeInfo,
    lb: &LbOptions,
) -> DesiredService {
    let families = svc.families();
    let maglev = (svc.lb_algorithm.unwrap_or(lb.algorithm) == LbAlgorithm::Maglev)
        .then_some(lb.maglev_table_size);
    let mut out = Vec::new();
    let mut seen = HashSet::default();
    // eTP=Local only exists for externally accessible Services (the
    // converter resets it otherwise); it then covers all their external
    // frontends.
    let local = svc.external_policy == TrafficPolicy::Local;
    let mut no_local = NoLocalEndpoints::default();
    // Terminating endpoints still serve as a fallback; draining ones do not.
    let none_serve = |b: &[Backend]| b.iter().all(|b| b.state == BackendState::Draining);
    for port in &svc.ports {
        for &family in &families {
            let cands = candidates(slices, family, &port.name, port.proto);
            let internal = backends_for(&cands, svc.internal_policy, node);
            // kube-proxy's cluster endpoints (topology applied, no policy):
            // external frontends of an eTP=Cluster Service use them for
            // everyone, and those of an eTP=Local Service for in-cluster
            // clients (pods and the node), which kube-proxy sends to any
            // endpoint even for external destinations ("pod traffic for
            // external destinations" short-circuits the local-only check).
            //
            // Only frontends other than cluster IPs use them: most Services
            // have none, and skip the copy.
            let cluster = if !svc.kind.has_node_ports() && svc.external_ips.is_empty() {
                Vec::new()
            } else if svc.internal_policy == TrafficPolicy::Cluster {
                internal.clone()
            } else {
                backends_for(&cands, TrafficPolicy::Cluster, node)
            };
            // The local view of an eTP=Local Service: only this node's
            // endpoints (terminating ones as a fallback within them), for
            // traffic from outside.
            let local_only = if local {
                backends_for(&cands, TrafficPolicy::Local, node)
            } else {
                Vec::new()
            };
            if families.first() == Some(&family) {
                let internal_local = svc.internal_policy == TrafficPolicy::Local;
                no_local.internal += u32::from(internal_local && none_serve(&internal));
                no_local.external += u32::from(local && none_serve(&local_only));
            }
            let mut add = |addr, port_number, kind: FrontendKind, backends: &Vec<Backend>| {
                let frontend = Frontend::new(addr, port_number, port.proto);
                // The first kind to claim an address:port wins (a node address
                // that is also a load-balancer IP, say); see the order below.
                if !seen.insert(frontend) {
                    return;
                }
                let local = local && kind.is_external();
                // Tables only where packets from outside pick: not ClusterIP,
                // and not the all-endpoints view of an eTP=Local frontend.
                let table = maglev.filter(|_| kind.is_external());
                let d = DesiredFrontend {
                    frontend,
                    backends: backends.clone(),
                    kind,
                    local,
                    affinity: svc.affinity,
                    source_ranges: if kind == FrontendKind::LoadBalancer {
                        svc.source_ranges
                            .iter()
                            .copied()
                            .filter(|c| c.family() == family)
                            .collect()
                    } else {
                        Vec::new()
                    },
                    maglev: if local { None } else { table },
                    port_name: port.name.clone(),
                };
                if local {
                    // Same flags, affinity and ranges; only this node's
                    // endpoints. The datapath's packet programs switch to it
                    // when the `All` master says LOCAL.
                    out.push(DesiredFrontend {
                        frontend: frontend.in_scope(Scope::External),
                        backends: local_only.clone(),
                        maglev: table,
                        ..d.clone()
                    });
                }
                out.push(d);
            };
            each_frontend(svc, port, family, node, |ip, number, kind| {
                let backends = if kind == FrontendKind::ClusterIp {
                    &internal
                } else {
                    &cluster
                };
                add(ip, number, kind, backends);
            });
        }
    }
    // The primary family's count, as kube-proxy's primary proxier reports; a
    // Service without frontends has no health check either.
    let health_check = svc
        .health_check_node_port
        .zip(families.first().copied())
        .map(|(node_port, family)| {
            // Distinct addresses, as kube-proxy's `LocalReadyEndpoints`: a pod
            // serving ports 80 and 443 is one endpoint, not two.
            let local_endpoints = svc
                .ports
                .iter()
                .flat_map(|p| local_ready(&candidates(slices, family, &p.name, p.proto), node))
                .collect::<std::collections::BTreeSet<_>>()
                .len();
            HealthCheck {
                node_port,
                local_endpoints,
            }
        });
    DesiredService {
        frontends: out,
        health_check,
        refused: Vec::new(),
        no_local,
    }
}

/// The frontends of one port and family of `svc`, as address, port number
/// and kind, in the order that settles an address:port two kinds share:
/// the first takes it (a node address that is also a load-balancer IP is a
/// node port, and a load-balancer IP that is also an external IP keeps its
/// source ranges).
fn each_frontend(
    svc: &ServiceSpec,
    port: &ServicePortSpec,
    family: IpFamily,
    node: &NodeInfo,
    mut f: impl FnMut(IpAddr, u16, FrontendKind),
) {
    fn of_family(ips: &[IpAddr], family: IpFamily) -> impl Iterator<Item = IpAddr> + '_ {
        ips.iter()
            .copied()
            .filter(move |ip| IpFamily::of(ip) == family)
    }
    for ip in of_family(&svc.cluster_ips, family) {
        f(ip, port.port, FrontendKind::ClusterIp);
    }
    if let Some(node_port) = port.node_port.filter(|_| svc.kind.has_node_ports()) {
        for ip in of_family(&node.node_ports, family) {
            f(ip, node_port, FrontendKind::NodePort);
        }
    }
    if svc.kind == ServiceType::LoadBalancer {
        for ip in of_family(&svc.lb_ips, family) {
            f(ip, port.port, FrontendKind::LoadBalancer);
        }
    }
    for ip in of_family(&svc.external_ips, family) {
        f(ip, port.port, FrontendKind::ExternalIp);
    }
}

/// Every frontend `svc` produces on `node` and its kind, in [`Scope::All`]
/// (one per address, port and protocol), whatever its endpoints: what
/// [`desired`] gives without building any of them.
pub fn frontend_kinds(svc: &ServiceSpec, node: &NodeInfo) -> Vec<(Frontend, FrontendKind)> {
    let mut out: Vec<(Frontend, FrontendKind)> = Vec::new();
    let mut seen = HashSet::default();
    for port in &svc.ports {
        for family in svc.families() {
            each_frontend(svc, port, family, node, |ip, number, kind| {
                let frontend = Frontend::new(ip, number, port.proto);
                if seen.insert(frontend) {
                    out.push((frontend, kind));
                }
            });
        }
    }
    out
}
