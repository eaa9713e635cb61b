//! Desired-state tables fed by the sources: Services and EndpointSlices as the
//! sources last saw them, and the join that turns them into frontends.
//!
//! The checks that need more than one object (a node port two Services ask
//! for, an external IP that is one of this node's addresses, a node port
//! outside the configured range) live here too: the converters in `k8s` see
//! one object at a time and know nothing of the node.
mod backends;
mod frontend_claims;
mod frontends;

use std::{collections::BTreeSet, net::IpAddr, ops::RangeInclusive, sync::Arc};

pub use frontends::{DesiredService, HealthCheck, NoLocalEndpoints};

use crate::hash::HashMap;
use crate::model::{
    DesiredFrontend, Frontend, LbOptions, NodeInfo, NodePortAddresses, Protocol, ServiceId,
    ServiceSpec, SliceId, SliceSpec,
};
use crate::small_set::SmallSet;

/// A change from a source. Objects come in an `Arc` that the store keeps, so
/// a source that holds them too (the manifest directory) shares one copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    UpsertService(Arc<ServiceSpec>),
    DeleteService(ServiceId),
    UpsertSlice(Arc<SliceSpec>),
    DeleteSlice(SliceId),
    /// This node's name and labels changed (its zone decides which topology
    /// hints apply). The addresses are not the source's to say and are kept.
    Node(NodeInfo),
    /// This node's addresses changed (NodePort frontends live on them).
    NodeAddresses(Vec<IpAddr>),
}

impl Change {
    pub fn service(spec: ServiceSpec) -> Self {
        Self::UpsertService(Arc::new(spec))
    }

    pub fn slice(spec: SliceSpec) -> Self {
        Self::UpsertSlice(Arc::new(spec))
    }
}

/// Agent settings the store validates against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// `--nodeport-range`: node ports outside it are refused, as the API
    /// server's `--service-node-port-range` would have.
    pub node_port_range: RangeInclusive<u16>,
    /// `--lb-algorithm` and `--maglev-table-size`.
    pub lb: LbOptions,
    /// `--nodeport-addresses`.
    pub node_port_addresses: NodePortAddresses,
}

/// The API server's default `--service-node-port-range`.
pub const DEFAULT_NODE_PORT_RANGE: RangeInclusive<u16> = 30_000..=32_767;

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            node_port_range: DEFAULT_NODE_PORT_RANGE,
            lb: LbOptions::default(),
            node_port_addresses: NodePortAddresses::All,
        }
    }
}

/// A Service the store refuses to program: every problem found, each naming
/// its field. The Service gets no frontend; other Services are unaffected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("service {service}: {}", join(errors))]
pub struct Rejected {
    pub service: ServiceId,
    pub errors: Vec<StoreError>,
}

fn join(errors: &[StoreError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A check that needs more than the Service itself (the node, the agent's
/// options, the other Services). Each message starts with the field path, as
/// the converters' `k8s::FieldError` does, so one log line names the Service,
/// the field and the bad value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error(
        "spec.ports[{index}].nodePort: node port {port} is outside the node port range {min}-{max}"
    )]
    NodePortOutOfRange {
        /// Index in `spec.ports`.
        index: usize,
        port: u16,
        min: u16,
        max: u16,
    },
    #[error(
        "spec.ports[{index}].nodePort: node port {port}/{proto} is already used by Service {owner}, which claimed it first (claims are ordered by creationTimestamp, oldest first and Services without one last, then by namespace/name)"
    )]
    NodePortInUse {
        index: usize,
        port: u16,
        proto: Protocol,
        owner: ServiceId,
    },
    #[error(
        "spec.externalIPs[{index}]: {ip} is an address of this node; an external IP must not be one"
    )]
    ExternalIpIsNodeAddress {
        /// Index in `spec.externalIPs`.
        index: usize,
        ip: IpAddr,
    },
    /// Refuses that external IP's frontends only; the Service keeps its others.
    #[error(
        "spec.externalIPs[{index}]: {ip} is the {what} of Service {owner}; an external IP must not be another Service's cluster IP or load-balancer IP, so it is not programmed"
    )]
    ExternalIpIsServiceIp {
        index: usize,
        ip: IpAddr,
        /// `cluster IP` or `load-balancer IP`.
        what: &'static str,
        owner: ServiceId,
    },
    /// Refuses that frontend only; the Service keeps its others.
    #[error(
        "{field}: frontend {frontend} is already served by Service {owner}, which claimed it first (claims are ordered by creationTimestamp, oldest first and Services without one last, then by namespace/name), so it is not programmed"
    )]
    FrontendInUse {
        /// The field that produces the frontend, e.g. `spec.externalIPs[1]`.
        field: String,
        frontend: Frontend,
        owner: ServiceId,
    },
}

impl StoreError {
    /// JSON path of the field at fault, e.g. `spec.ports[1].nodePort`.
    pub fn field(&self) -> String {
        match self {
            Self::NodePortOutOfRange { index, .. } | Self::NodePortInUse { index, .. } => {
                format!("spec.ports[{index}].nodePort")
            }
            Self::ExternalIpIsNodeAddress { index, .. }
            | Self::ExternalIpIsServiceIp { index, .. } => format!("spec.externalIPs[{index}]"),
            Self::FrontendInUse { field, .. } => field.clone(),
        }
    }
}

/// A claim on a node port. Claims are ordered oldest first: Services without
/// a creation time (manifests) sort after dated ones, then by namespace/name,
/// so the winner never depends on the order events arrive in and stays the
/// same across relists and restarts.
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
    services: HashMap<ServiceId, Arc<ServiceSpec>>,
    slices: HashMap<SliceId, Arc<SliceSpec>>,
    slices_by_service: HashMap<ServiceId, SmallSet<SliceId>>,
    /// Every claim on each node port (port, protocol), by the Services that
    /// pass their own checks (see [`Store::node_port_keys`]).
    node_ports: HashMap<(u16, Protocol), SmallSet<Claim>>,
    /// Every Service's claims on its frontends, valid or not.
    claims: frontend_claims::FrontendClaims,
}

impl Store {
    pub fn new(node: NodeInfo) -> Self {
        Self::with_options(node, StoreOptions::default())
    }

    pub fn with_options(mut node: NodeInfo, options: StoreOptions) -> Self {
        node.node_ports = options
            .node_port_addresses
            .select(&node.addresses, &node.primary_ips);
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
                    let old = self.services.remove(&spec.id);
                    // Node-port contenders may change validity, and with it
                    // the frontends they hold against others.
                    let mut touched = BTreeSet::from([spec.id.clone()]);
                    if let Some(old) = &old {
                        self.unclaim(old, &mut touched);
                        self.claims.remove(old, &self.node);
                    }
                    self.claim(&spec, &mut touched);
                    self.claims.add(&spec, &self.node);
                    self.services.insert(spec.id.clone(), spec);
                    self.mark_frontend_contenders(old.as_deref(), touched, dirty);
                }
            }
            Change::DeleteService(id) => {
                if let Some(old) = self.services.remove(&id) {
                    let mut touched = BTreeSet::from([id]);
                    self.unclaim(&old, &mut touched);
                    self.claims.remove(&old, &self.node);
                    self.mark_frontend_contenders(Some(&old), touched, dirty);
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
                    dirty.insert(old.service.clone());
                }
            }
            Change::Node(node) => {
                if node.name != self.node.name || node.zone != self.node.zone {
                    self.node.name = node.name;
                    self.node.zone = node.zone;
                    dirty.extend(self.services.keys().cloned());
                }
                // An empty list is a Node not read yet (or without
                // addresses): the last known ones stay.
                if !node.primary_ips.is_empty() && node.primary_ips != self.node.primary_ips {
                    self.node.primary_ips = node.primary_ips;
                    self.addresses_changed(dirty);
                }
            }
            Change::NodeAddresses(addresses) => {
                if addresses != self.node.addresses {
                    self.node.addresses = addresses;
                    self.addresses_changed(dirty);
                }
            }
        }
    }

    fn addresses_changed(&mut self, dirty: &mut BTreeSet<ServiceId>) {
        self.node.node_ports = self
            .options
            .node_port_addresses
            .select(&self.node.addresses, &self.node.primary_ips);
        // Whether a Service passes its own checks (external IPs vs node
        // addresses) may have changed, and with it the claims it makes.
        // Rare: rebuild them all.
        self.reclaim_all();
        self.claims
            .rebuild(self.services.values().map(|s| &**s), &self.node);
        dirty.extend(self.services.keys().cloned());
    }

    /// Adds `touched` (Services that changed or whose validity may have) to
    /// `dirty` with everyone contending for their frontends, before and
    /// after the change (`old` is the changed Service's previous version).
    fn mark_frontend_contenders(
        &self,
        old: Option<&ServiceSpec>,
        touched: BTreeSet<ServiceId>,
        dirty: &mut BTreeSet<ServiceId>,
    ) {
        let mut out = BTreeSet::new();
        let now = touched
            .iter()
            .filter_map(|id| self.services.get(id).map(|s| &**s));
        self.frontend_contenders(old.into_iter().chain(now), &mut out);
        dirty.extend(touched);
        dirty.extend(out);
    }

    /// The node ports `svc` claims: none unless it gets frontends and passes
    /// its own checks. A Service refused for its own reasons (a node port out
    /// of range, an external IP on this node) is not programmed, so it must
    /// not hold a node port against another Service.
    fn node_port_keys(&self, svc: &ServiceSpec) -> Vec<(u16, Protocol)> {
        if !svc.kind.has_node_ports()
            || svc.cluster_ips.is_empty()
            || !self.own_errors(svc).is_empty()
        {
            return Vec::new();
        }
        svc.ports
            .iter()
            .filter_map(|p| Some((p.node_port?, p.proto)))
            .collect()
    }

    /// Records `svc`'s node-port claims; every Service contending for the
    /// same ports, directly or through a chain of contenders, may win or
    /// lose one now.
    fn claim(&mut self, svc: &ServiceSpec, dirty: &mut BTreeSet<ServiceId>) {
        let keys = self.node_port_keys(svc);
        for key in &keys {
            self.node_ports
                .entry(*key)
                .or_default()
                .insert(Claim::of(svc));
        }
        self.mark_contenders(keys, dirty);
    }

    fn unclaim(&mut self, svc: &ServiceSpec, dirty: &mut BTreeSet<ServiceId>) {
        let keys = self.node_port_keys(svc);
        for key in &keys {
            if let Some(claims) = self.node_ports.get_mut(key) {
                claims.remove(&Claim::of(svc));
                if claims.is_empty() {
                    self.node_ports.remove(key);
                }
            }
        }
        self.mark_contenders(keys, dirty);
    }

    /// Marks every Service connected to `keys` through shared node ports: a
    /// Service that loses one port gives up all of them, which may let a
    /// younger contender of another port win it, and so on.
    fn mark_contenders(&self, keys: Vec<(u16, Protocol)>, dirty: &mut BTreeSet<ServiceId>) {
        let mut seen: BTreeSet<(u16, Protocol)> = BTreeSet::new();
        // Not `dirty`: a Service already dirty for another reason must still
        // lead on to its other ports' contenders.
        let mut reached: BTreeSet<&ServiceId> = BTreeSet::new();
        let mut todo = keys;
        while let Some(key) = todo.pop() {
            if !seen.insert(key) {
                continue;
            }
            for c in self.node_ports.get(&key).into_iter().flatten() {
                if reached.insert(&c.service)
                    && let Some(svc) = self.services.get(&c.service)
                {
                    todo.extend(self.node_port_keys(svc));
                }
            }
        }
        dirty.extend(reached.into_iter().cloned());
    }

    /// Rebuilds every claim from scratch.
    fn reclaim_all(&mut self) {
        let claims: Vec<((u16, Protocol), Claim)> = self
            .services
            .values()
            .flat_map(|svc| {
                self.node_port_keys(svc)
                    .into_iter()
                    .map(move |k| (k, Claim::of(svc)))
            })
            .collect();
        self.node_ports.clear();
        for (key, claim) in claims {
            self.node_ports.entry(key).or_default().insert(claim);
        }
    }

    /// Whether the claimant holds all its node ports: no claim ahead of it on
    /// any of them holds its own. Claims are settled oldest first, so a
    /// Service that loses one port (and so gets no frontend) never blocks a
    /// younger Service on another. Iterative (a long chain of contenders
    /// must not exhaust the stack); `memo` keeps repeated calls linear.
    fn holds(&self, claim: &Claim, memo: &mut HashMap<ServiceId, bool>) -> bool {
        if let Some(&h) = memo.get(&claim.service) {
            return h;
        }
        let earlier = |c: &Claim, key: &(u16, Protocol)| -> Vec<Claim> {
            self.node_ports
                .get(key)
                .into_iter()
                .flatten()
                .take_while(|e| *e < c)
                .cloned()
                .collect()
        };
        let keys_of = |c: &Claim| {
            self.services
                .get(&c.service)
                .map(|svc| self.node_port_keys(svc))
                .unwrap_or_default()
        };
        // Every claim that can matter: older ones reachable through shared
        // ports (a younger claim never takes a port from an older one).
        let mut found: BTreeSet<Claim> = BTreeSet::new();
        let mut todo = vec![claim.clone()];
        while let Some(c) = todo.pop() {
            if memo.contains_key(&c.service) || found.contains(&c) {
                continue;
            }
            for key in keys_of(&c) {
                todo.extend(earlier(&c, &key));
            }
            found.insert(c);
        }
        // Oldest first: whatever is ahead of a claim is settled before it.
        for c in &found {
            let holds = self.services.contains_key(&c.service)
                && keys_of(c).iter().all(|key| {
                    earlier(c, key)
                        .iter()
                        .all(|e| memo.get(&e.service) != Some(&true))
                });
            memo.insert(c.service.clone(), holds);
        }
        memo.get(&claim.service).copied().unwrap_or(false)
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
                errors,
            });
        }
        let slices: Vec<&SliceSpec> = self
            .slices_by_service
            .get(id)
            .into_iter()
            .flatten()
            .filter_map(|s| self.slices.get(s).map(|s| &**s))
            .collect();
        let mut desired = frontends::desired(svc, &slices, &self.node, &self.options.lb);
        let (kept, refused) = self.settle_frontends(svc, desired.frontends);
        desired.frontends = kept;
        desired.refused = refused;
        Ok(desired)
    }

    /// The Service and at least one of its EndpointSlices are here.
    pub fn has_service_and_slices(&self, id: &ServiceId) -> bool {
        self.services.contains_key(id) && self.slices_by_service.contains_key(id)
    }

    /// The frontends a Service should have; empty when it is absent, gets
    /// none, or is rejected.
    pub fn frontends(&self, id: &ServiceId) -> Vec<DesiredFrontend> {
        self.desired(id).map(|d| d.frontends).unwrap_or_default()
    }

    /// The checks that need the node or the options: the Service's own.
    fn own_errors(&self, svc: &ServiceSpec) -> Vec<StoreError> {
        let mut errors = Vec::new();
        if svc.cluster_ips.is_empty() {
            // No frontend of any kind: nothing to check.
            return errors;
        }
        let range = &self.options.node_port_range;
        for (index, p) in svc.ports.iter().enumerate() {
            let Some(port) = p.node_port.filter(|_| svc.kind.has_node_ports()) else {
                continue;
            };
            if !range.contains(&port) {
                errors.push(StoreError::NodePortOutOfRange {
                    index,
                    port,
                    min: *range.start(),
                    max: *range.end(),
                });
            }
        }
        for (index, ip) in svc.external_ips.iter().enumerate() {
            // The node's own address would capture traffic meant for the node
            // (kubelet, SSH) on that port; kube-proxy docs warn, we refuse.
            if self.node.addresses.contains(ip) {
                errors.push(StoreError::ExternalIpIsNodeAddress { index, ip: *ip });
            }
        }
        errors
    }

    /// Its own checks, then, if it passes them, its node ports against the
    /// other Services' claims.
    fn validate(&self, svc: &ServiceSpec) -> Vec<StoreError> {
        let mut errors = self.own_errors(svc);
        if !errors.is_empty() || svc.cluster_ips.is_empty() || !svc.kind.has_node_ports() {
            return errors;
        }
        let me = Claim::of(svc);
        let mut memo = HashMap::default();
        for (index, p) in svc.ports.iter().enumerate() {
            let Some(port) = p.node_port else { continue };
            // Only a claim ahead of ours can take the port from us.
            let owner = self
                .node_ports
                .get(&(port, p.proto))
                .into_iter()
                .flatten()
                .take_while(|c| **c < me)
                .find(|c| self.holds(c, &mut memo));
            if let Some(owner) = owner {
                errors.push(StoreError::NodePortInUse {
                    index,
                    port,
                    proto: p.proto,
                    owner: owner.service.clone(),
                });
            }
        }
        errors
    }
}

#[cfg(test)]
mod conflict_tests;
#[cfg(test)]
mod external_tests;
#[cfg(test)]
mod tests;
