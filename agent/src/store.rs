//! Desired-state tables fed by the sources: Services and EndpointSlices as the
//! sources last saw them, and the join that turns them into frontends.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::model::{
    Backend, BackendState, DesiredFrontend, Frontend, ServiceId, ServiceSpec, SliceId, SliceSpec,
};

/// A change from a source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    UpsertService(ServiceSpec),
    DeleteService(ServiceId),
    UpsertSlice(SliceSpec),
    DeleteSlice(SliceId),
}

#[derive(Debug, Default)]
pub struct Store {
    services: HashMap<ServiceId, ServiceSpec>,
    slices: HashMap<SliceId, SliceSpec>,
    slices_by_service: HashMap<ServiceId, BTreeSet<SliceId>>,
}

impl Store {
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
            let backends = backends_for(&slices, &port.name, port.proto);
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
/// name and protocol, deduplicated by address and port (a pod seen in two slices
/// during a slice rebalance keeps its best state), in a stable order.
fn backends_for(slices: &[&SliceSpec], name: &str, proto: crate::model::Protocol) -> Vec<Backend> {
    let mut best: BTreeMap<(std::net::Ipv4Addr, u16), BackendState> = BTreeMap::new();
    for slice in slices {
        for sp in slice
            .ports
            .iter()
            .filter(|p| p.name == name && p.proto == proto)
        {
            for ep in &slice.endpoints {
                let Some(state) = ep.backend_state() else {
                    continue;
                };
                for &addr in &ep.addrs {
                    best.entry((addr, sp.port))
                        .and_modify(|s| *s = (*s).min(state))
                        .or_insert(state);
                }
            }
        }
    }
    best.into_iter()
        .map(|((addr, port), state)| Backend { addr, port, state })
        .collect()
}

#[cfg(test)]
mod tests;
