//! Which endpoints back a frontend: kube-proxy's endpoint selection (traffic
//! policy, topology hints, terminating fallback) on the agent's model types.
use std::net::IpAddr;

use crate::model::{
    Backend, BackendState, EndpointSpec, IpFamily, NodeInfo, Protocol, SliceSpec, TrafficPolicy,
};

/// An endpoint of a Service port and the target port it serves on.
pub type Candidate<'a> = (u16, &'a EndpointSpec);

/// The endpoints of every slice of `family` that serve the Service port
/// `name`/`proto`. Slices of the other family never contribute: a frontend's
/// backends are always of its own family (kube-proxy runs one proxier per
/// family and hands each only its slices).
pub fn candidates<'a>(
    slices: &[&'a SliceSpec],
    family: IpFamily,
    name: &str,
    proto: Protocol,
) -> Vec<Candidate<'a>> {
    let mut out = Vec::new();
    for slice in slices.iter().filter(|s| s.family == family) {
        for sp in slice
            .ports
            .iter()
            .filter(|p| *p.name == *name && p.proto == proto)
        {
            out.extend(slice.endpoints.iter().map(|ep| (sp.port, ep)));
        }
    }
    out
}

/// Addresses of this node's ready endpoints among `candidates`; the caller
/// counts them across ports (kube-proxy's `LocalReadyEndpoints` counts
/// distinct IPs). Terminating endpoints never count: the health check must
/// fail on a node whose only endpoints are going away.
pub fn local_ready(candidates: &[Candidate<'_>], node: &NodeInfo) -> Vec<IpAddr> {
    candidates
        .iter()
        .filter(|(_, ep)| {
            ep.node_name() == Some(node.name.as_str())
                && ep.backend_state() == Some(BackendState::Active)
        })
        .map(|(_, ep)| ep.addr)
        .collect()
}

/// Backends of one Service port: the endpoints of every slice, matched by port
/// name and protocol, narrowed by traffic policy and topology as kube-proxy
/// narrows them, deduplicated by address and port (a pod seen in two slices
/// during a slice rebalance keeps its best state), in a stable order.
///
/// Terminating endpoints stay in the list: the datapath uses them only when no
/// active one is left, which is kube-proxy's "ready, else serving and
/// terminating" fallback (KEP-1669) applied to the same narrowed set.
///
/// Draining endpoints (terminating, no longer serving) stay too, narrowed the
/// same way, so each belongs to the frontends it served: the planner keeps
/// them in the backends map, in no slot, for the flows conntrack tracks to
/// them. Under topology hints a draining endpoint without hints is kept as
/// well: the EndpointSlice controller drops the hints of endpoints that stop
/// being ready, so it may well have served this node's zone until now, and a
/// slot-less backend costs new connections nothing.
///
/// `policy` is the internal policy for ClusterIP frontends and the external
/// one for the others: kube-proxy's `CategorizeEndpoints` gives both kinds of
/// traffic either its topology-narrowed cluster endpoints or its local ones.
pub fn backends_for(
    candidates: &[Candidate<'_>],
    policy: TrafficPolicy,
    node: &NodeInfo,
) -> Vec<Backend> {
    let scope = match policy {
        TrafficPolicy::Local => Scope::Local,
        TrafficPolicy::Cluster => topology_scope(candidates.iter().map(|(_, ep)| *ep), node),
    };
    // Sorted, then deduplicated: one allocation where a map of a dozen
    // entries took several, for every port of every Service at a cold start.
    let mut all: Vec<Backend> = Vec::with_capacity(candidates.len());
    for &(port, ep) in candidates {
        let Some(state) = ep.backend_state() else {
            continue;
        };
        let admitted = scope.admits(ep, node)
            || (state == BackendState::Draining && scope.admits_unhinted(ep));
        if !admitted {
            continue;
        }
        all.extend(ep.addrs().map(|addr| Backend { addr, port, state }));
    }
    // The best state of each address and port first, then the others go.
    all.sort_unstable_by_key(|b| (b.addr, b.port, b.state));
    all.dedup_by(|later, first| (later.addr, later.port) == (first.addr, first.port));
    all
}

/// Which endpoints a frontend may use on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scope {
    All,
    /// `internalTrafficPolicy: Local`: endpoints on this node only, with no
    /// fallback to other nodes (kube-proxy drops instead; we refuse).
    Local,
    /// Hints name this node (`trafficDistribution: PreferSameNode`).
    SameNode,
    /// Hints name this node's zone (topology-aware routing, `PreferClose`).
    SameZone,
}

impl Scope {
    /// A hinted scope and an endpoint without the hints it looks at (they are
    /// removed once an endpoint stops being ready).
    fn admits_unhinted(self, ep: &EndpointSpec) -> bool {
        match self {
            Self::All | Self::Local => false,
            Self::SameNode => ep.node_hints().is_empty(),
            Self::SameZone => ep.zone_hints().is_empty(),
        }
    }

    fn admits(self, ep: &EndpointSpec, node: &NodeInfo) -> bool {
        match self {
            Self::All => true,
            Self::Local => ep.node_name() == Some(node.name.as_str()),
            Self::SameNode => ep.node_hints().contains(&node.name),
            Self::SameZone => node
                .zone
                .as_ref()
                .is_some_and(|z| ep.zone_hints().iter().any(|h| h == z)),
        }
    }
}

/// kube-proxy's `topologyModeFromHints`: hints are used only when every ready
/// endpoint carries them and at least one names this node (or its zone);
/// otherwise traffic goes to every endpoint, so a half-rolled-out hint set or
/// a zone with no endpoint never black-holes a Service.
fn topology_scope<'a>(eps: impl Iterator<Item = &'a EndpointSpec>, node: &NodeInfo) -> Scope {
    let (mut all_node_hints, mut for_node) = (true, false);
    let (mut all_zone_hints, mut for_zone) = (true, false);
    for ep in eps.filter(|ep| ep.ready) {
        if ep.node_hints().is_empty() {
            all_node_hints = false;
        } else if ep.node_hints().contains(&node.name) {
            for_node = true;
        }
        if ep.zone_hints().is_empty() {
            all_zone_hints = false;
        } else if node
            .zone
            .as_ref()
            .is_some_and(|z| ep.zone_hints().iter().any(|h| h == z))
        {
            for_zone = true;
        }
    }
    if all_node_hints && for_node {
        Scope::SameNode
    } else if all_zone_hints && for_zone {
        Scope::SameZone
    } else {
        Scope::All
    }
}
