//! Desired-state tables fed by the sources: Services and EndpointSlices as the
//! sources last saw them, and the join that turns them into frontends.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::model::{
    Backend, BackendState, DesiredFrontend, EndpointSpec, Frontend, NodeInfo, ServiceId,
    ServiceSpec, SliceId, SliceSpec, TrafficPolicy,
};

/// A change from a source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    UpsertService(ServiceSpec),
    DeleteService(ServiceId),
    UpsertSlice(SliceSpec),
    DeleteSlice(SliceId),
    /// This node's labels changed (its zone decides which topology hints apply).
    Node(NodeInfo),
}

#[derive(Debug, Default)]
pub struct Store {
    node: NodeInfo,
    services: HashMap<ServiceId, ServiceSpec>,
    slices: HashMap<SliceId, SliceSpec>,
    slices_by_service: HashMap<ServiceId, BTreeSet<SliceId>>,
}

impl Store {
    pub fn new(node: NodeInfo) -> Self {
        Self {
            node,
            ..Self::default()
        }
    }

    /// Applies a change and adds the Services whose frontends may differ now.
    pub fn apply(&mut self, change: Change, dirty: &mut BTreeSet<ServiceId>) {
        match change {
            Change::UpsertService(spec) => {
                if self.services.get(&spec.id) != Some(&spec) {
                    dirty.insert(spec.id.clone());
                    self.services.insert(spec.id.clone(), spec);
                }
            }
            Change::DeleteService(id) => {
                if self.services.remove(&id).is_some() {
                    dirty.insert(id);
                }
            }
            Change::UpsertSlice(spec) => {
                if self.slices.get(&spec.id) == Some(&spec) {
                    return;
                }
                if let Some(old) = self.slices.get(&spec.id)
                    && old.service != spec.service
                {
                    let old_service = old.service.clone();
                    self.unindex(&old_service, &spec.id);
                    dirty.insert(old_service);
                }
                self.slices_by_service
                    .entry(spec.service.clone())
                    .or_default()
                    .insert(spec.id.clone());
                dirty.insert(spec.service.clone());
                self.slices.insert(spec.id.clone(), spec);
            }
            Change::DeleteSlice(id) => {
                if let Some(old) = self.slices.remove(&id) {
                    self.unindex(&old.service, &id);
                    dirty.insert(old.service);
                }
            }
            Change::Node(node) => {
                if node != self.node {
                    self.node = node;
                    dirty.extend(self.services.keys().cloned());
                }
            }
        }
    }

    fn unindex(&mut self, service: &ServiceId, slice: &SliceId) {
        if let Some(set) = self.slices_by_service.get_mut(service) {
            set.remove(slice);
            if set.is_empty() {
                self.slices_by_service.remove(service);
            }
        }
    }

    pub fn service_count(&self) -> usize {
        self.services.len()
    }

    pub fn node(&self) -> &NodeInfo {
        &self.node
    }

    /// The frontends a Service should have; empty when it is absent or gets none.
    pub fn frontends(&self, id: &ServiceId) -> Vec<DesiredFrontend> {
        let Some(svc) = self.services.get(id) else {
            return Vec::new();
        };
        let slices: Vec<&SliceSpec> = self
            .slices_by_service
            .get(id)
            .into_iter()
            .flatten()
            .filter_map(|s| self.slices.get(s))
            .collect();
        let mut out = Vec::new();
        for port in &svc.ports {
            let backends = backends_for(&slices, svc, &port.name, port.proto, &self.node);
            for &addr in &svc.cluster_ips {
                out.push(DesiredFrontend {
                    frontend: Frontend {
                        addr,
                        port: port.port,
                        proto: port.proto,
                    },
                    backends: backends.clone(),
                });
            }
        }
        out
    }
}

/// Backends of one Service port: the endpoints of every slice, matched by port
/// name and protocol, narrowed by traffic policy and topology as kube-proxy
/// narrows them, deduplicated by address and port (a pod seen in two slices
/// during a slice rebalance keeps its best state), in a stable order.
///
/// Terminating endpoints stay in the list: the datapath uses them only when no
/// active one is left, which is kube-proxy's "ready, else serving and
/// terminating" fallback (KEP-1669) applied to the same narrowed set.
fn backends_for(
    slices: &[&SliceSpec],
    svc: &ServiceSpec,
    name: &str,
    proto: crate::model::Protocol,
    node: &NodeInfo,
) -> Vec<Backend> {
    let mut candidates: Vec<(u16, &EndpointSpec)> = Vec::new();
    for slice in slices {
        for sp in slice
            .ports
            .iter()
            .filter(|p| p.name == name && p.proto == proto)
        {
            candidates.extend(slice.endpoints.iter().map(|ep| (sp.port, ep)));
        }
    }
    let scope = match svc.internal_policy {
        TrafficPolicy::Local => Scope::Local,
        TrafficPolicy::Cluster => topology_scope(candidates.iter().map(|(_, ep)| *ep), node),
    };
    let mut best: BTreeMap<(std::net::Ipv4Addr, u16), BackendState> = BTreeMap::new();
    for (port, ep) in candidates {
        if !scope.admits(ep, node) {
            continue;
        }
        let Some(state) = ep.backend_state() else {
            continue;
        };
        for &addr in &ep.addrs {
            best.entry((addr, port))
                .and_modify(|s| *s = (*s).min(state))
                .or_insert(state);
        }
    }
    best.into_iter()
        .map(|((addr, port), state)| Backend { addr, port, state })
        .collect()
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
    fn admits(self, ep: &EndpointSpec, node: &NodeInfo) -> bool {
        match self {
            Self::All => true,
            Self::Local => ep.node_name.as_deref() == Some(node.name.as_str()),
            Self::SameNode => ep.node_hints.contains(&node.name),
            Self::SameZone => node
                .zone
                .as_ref()
                .is_some_and(|z| ep.zone_hints.iter().any(|h| h == z)),
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
        if ep.node_hints.is_empty() {
            all_node_hints = false;
        } else if ep.node_hints.contains(&node.name) {
            for_node = true;
        }
        if ep.zone_hints.is_empty() {
            all_zone_hints = false;
        } else if node
            .zone
            .as_ref()
            .is_some_and(|z| ep.zone_hints.iter().any(|h| h == z))
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

#[cfg(test)]
mod tests;
