//! Desired-state tables fed by the sources: Services and EndpointSlices as the
//! sources last saw them, and the join that turns them into frontends.
//!
//! The checks that need more than one object (a node port two Services ask
//! for, an external IP that is one of this node's addresses, a node port
//! outside the configured range) live here too: the converters in `k8s` see
//! one object at a time and know nothing of the node.
mod backends;
mod frontends;

use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
    ops::RangeInclusive,
};

pub use frontends::{DesiredService, HealthCheck};

use crate::{
    k8s::{FieldError, ObjectError, Problem},
    model::{DesiredFrontend, NodeInfo, Protocol, ServiceId, ServiceSpec, SliceId, SliceSpec},
};

/// A change from a source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    UpsertService(ServiceSpec),
    DeleteService(ServiceId),
    UpsertSlice(SliceSpec),
    DeleteSlice(SliceId),
    /// This node's name and labels changed (its zone decides which topology
    /// hints apply). The addresses are not the source's to say and are kept.
    Node(NodeInfo),
    /// This node's addresses changed (NodePort frontends live on them).
    NodeAddresses(Vec<IpAddr>),
}

/// Agent settings the store validates against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// `--nodeport-range`: node ports outside it are refused, as the API
    /// server's `--service-node-port-range` would have.
    pub node_port_range: RangeInclusive<u16>,
}

/// The API server's default `--service-node-port-range`.
pub const DEFAULT_NODE_PORT_RANGE: RangeInclusive<u16> = 30_000..=32_767;

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            node_port_range: DEFAULT_NODE_PORT_RANGE,
        }
    }
}

/// A Service the store refuses to program: every problem found, each naming
/// its field. The Service gets no frontend; other Services are unaffected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("service {service}: {errors}")]
pub struct Rejected {
    pub service: ServiceId,
    pub errors: ObjectError,
}

/// Who asks for a node port, ordered oldest first: the first claim owns it.
/// Services without a creation time (manifests) sort after dated ones, then
/// by namespace/name, so the owner never depends on the order events arrive in
/// and stays the same across relists and restarts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Claim {
    undated: bool,
    created: i64,
    service: ServiceId,
}

impl Claim {
    fn of(svc: &ServiceSpec) -> Self {
        Self {
            undated: svc.created.is_none(),
            created: svc.created.unwrap_or(0),
            service: svc.id.clone(),
        }
    }
}

#[derive(Debug, Default)]
pub struct Store {
    node: NodeInfo,
    options: StoreOptions,
    services: HashMap<ServiceId, ServiceSpec>,
    slices: HashMap<SliceId, SliceSpec>,
    slices_by_service: HashMap<ServiceId, BTreeSet<SliceId>>,
    /// Every claim on each node port (port, protocol).
    node_ports: HashMap<(u16, Protocol), BTreeSet<Claim>>,
}

impl Store {
    pub fn new(node: NodeInfo) -> Self {
        Self::with_options(node, StoreOptions::default())
    }

    pub fn with_options(node: NodeInfo, options: StoreOptions) -> Self {
        Self {
            node,
            options,
            ..Self::default()
        }
    }

    /// Applies a change and adds the Services whose frontends may differ now.
    pub fn apply(&mut self, change: Change, dirty: &mut BTreeSet<ServiceId>) {
        match change {
            Change::UpsertService(spec) => {
                if self.services.get(&spec.id) != Some(&spec) {
                    dirty.insert(spec.id.clone());
                    if let Some(old) = self.services.remove(&spec.id) {
                        self.unclaim(&old, dirty);
                    }
                    self.claim(&spec, dirty);
                    self.services.insert(spec.id.clone(), spec);
                }
            }
            Change::DeleteService(id) => {
                if let Some(old) = self.services.remove(&id) {
                    self.unclaim(&old, dirty);
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
                if node.name != self.node.name || node.zone != self.node.zone {
                    self.node.name = node.name;
                    self.node.zone = node.zone;
                    dirty.extend(self.services.keys().cloned());
                }
            }
            Change::NodeAddresses(addresses) => {
                if addresses != self.node.addresses {
                    self.node.addresses = addresses;
                    dirty.extend(self.services.keys().cloned());
                }
            }
        }
    }

    /// The node ports `svc` asks for and may own: only Services that get
    /// frontends, and only ports inside the range (one outside is an error of
    /// its own Service and must not take the port from a valid one).
    fn node_port_keys(&self, svc: &ServiceSpec) -> Vec<(u16, Protocol)> {
        if !svc.kind.has_node_ports() || svc.cluster_ips.is_empty() {
            return Vec::new();
        }
        svc.ports
            .iter()
            .filter_map(|p| Some((p.node_port?, p.proto)))
            .filter(|(n, _)| self.options.node_port_range.contains(n))
            .collect()
    }

    /// Records `svc`'s node-port claims; every Service contending for the
    /// same ports may win or lose one now.
    fn claim(&mut self, svc: &ServiceSpec, dirty: &mut BTreeSet<ServiceId>) {
        for key in self.node_port_keys(svc) {
            let claims = self.node_ports.entry(key).or_default();
            dirty.extend(claims.iter().map(|c| c.service.clone()));
            claims.insert(Claim::of(svc));
        }
    }

    fn unclaim(&mut self, svc: &ServiceSpec, dirty: &mut BTreeSet<ServiceId>) {
        for key in self.node_port_keys(svc) {
            if let Some(claims) = self.node_ports.get_mut(&key) {
                claims.remove(&Claim::of(svc));
                dirty.extend(claims.iter().map(|c| c.service.clone()));
                if claims.is_empty() {
                    self.node_ports.remove(&key);
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

    pub fn options(&self) -> &StoreOptions {
        &self.options
    }

    /// What a Service should look like in the datapath; empty when it is
    /// absent, an error when it is present but cannot be programmed.
    pub fn desired(&self, id: &ServiceId) -> Result<DesiredService, Rejected> {
        let Some(svc) = self.services.get(id) else {
            return Ok(DesiredService::default());
        };
        let errors = self.validate(svc);
        if !errors.is_empty() {
            return Err(Rejected {
                service: id.clone(),
                errors: ObjectError { errors },
            });
        }
        let slices: Vec<&SliceSpec> = self
            .slices_by_service
            .get(id)
            .into_iter()
            .flatten()
            .filter_map(|s| self.slices.get(s))
            .collect();
        Ok(frontends::desired(svc, &slices, &self.node))
    }

    /// The frontends a Service should have; empty when it is absent, gets
    /// none, or is rejected.
    pub fn frontends(&self, id: &ServiceId) -> Vec<DesiredFrontend> {
        self.desired(id).map(|d| d.frontends).unwrap_or_default()
    }

    /// The checks that need the node or the other Services.
    fn validate(&self, svc: &ServiceSpec) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if svc.cluster_ips.is_empty() {
            // No frontend of any kind: nothing to conflict with.
            return errors;
        }
        let range = &self.options.node_port_range;
        for (i, p) in svc.ports.iter().enumerate() {
            let Some(port) = p.node_port.filter(|_| svc.kind.has_node_ports()) else {
                continue;
            };
            let field = format!("spec.ports[{i}].nodePort");
            if !range.contains(&port) {
                errors.push(FieldError::new(
                    field,
                    Problem::NodePortOutOfRange {
                        port,
                        min: *range.start(),
                        max: *range.end(),
                    },
                ));
                continue;
            }
            let owner = self
                .node_ports
                .get(&(port, p.proto))
                .and_then(|c| c.first())
                .map(|c| &c.service);
            if let Some(owner) = owner
                && *owner != svc.id
            {
                errors.push(FieldError::new(
                    field,
                    Problem::NodePortInUse {
                        port,
                        proto: p.proto,
                        owner: owner.clone(),
                    },
                ));
            }
        }
        for (i, ip) in svc.external_ips.iter().enumerate() {
            // The node's own address would capture traffic meant for the node
            // (kubelet, SSH) on that port; kube-proxy docs warn, we refuse.
            if self.node.addresses.contains(ip) {
                errors.push(FieldError::new(
                    format!("spec.externalIPs[{i}]"),
                    Problem::ExternalIpIsNodeAddress { ip: *ip },
                ));
            }
        }
        errors
    }
}

#[cfg(test)]
mod external_tests;
#[cfg(test)]
mod tests;
