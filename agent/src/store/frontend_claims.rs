//! Who serves a frontend that more than one Service asks for.
//!
//! Two rules, both decided here from the Services alone, so that the outcome
//! never depends on the order the Services arrive or sync in (a restart syncs
//! them by namespace/name, and `aaa/evil` would otherwise win every time):
//!
//! 1. An external IP that is another Service's cluster IP or load-balancer IP
//!    is refused, however old its Service: those addresses are allocated to
//!    their Service by the cluster, while `spec.externalIPs` is whatever a
//!    tenant writes. Taking one would steal the victim's traffic and drop its
//!    `loadBalancerSourceRanges`.
//! 2. Any other frontend (address, port, protocol) two valid Services produce
//!    goes to the older claim, as node ports do ([`Claim`]): creationTimestamp,
//!    then namespace/name.
//!
//! A refusal costs the Service that frontend only; its others are programmed.
//! Node ports are not claimed here: `Store::holds` settles them, and a
//! Service that loses one is rejected as a whole. (A load-balancer IP that
//! is a node address, on a port another Service uses as its node port, is
//! the one overlap left to the reconciler, which keeps the first owner.)
//! Whether a Service is valid never depends on these claims, so settling them
//! needs no chain of contenders (node ports do, see `Store::holds`).
use std::{collections::BTreeSet, net::IpAddr};

use super::{Claim, Store, StoreError, frontends};
use crate::hash::HashMap;
use crate::model::{
    DesiredFrontend, Frontend, FrontendKind, NodeInfo, Scope, ServiceId, ServiceSpec, ServiceType,
};
use crate::small_set::SmallSet;

/// Every Service's claims, indexed the ways the rules look them up.
#[derive(Debug, Default)]
pub(super) struct FrontendClaims {
    /// Claims on each frontend ([`Scope::All`]: both scopes of an
    /// `externalTrafficPolicy: Local` frontend are one claim), oldest first.
    by_frontend: HashMap<Frontend, SmallSet<Claim>>,
    /// The Services whose cluster IP or load-balancer IP each address is.
    vips: HashMap<IpAddr, SmallSet<ServiceId>>,
    /// The Services that list each address in `spec.externalIPs`.
    external_ips: HashMap<IpAddr, SmallSet<ServiceId>>,
}

/// The frontends `svc` produces on `node` (one per address, port and
/// protocol), whether or not it is valid: what it claims. Not its node
/// ports: the node-port claims settle those, with the chains they need.
fn keys(svc: &ServiceSpec, node: &NodeInfo) -> Vec<Frontend> {
    frontends::frontend_kinds(svc, node)
        .into_iter()
        .filter(|(_, kind)| *kind != FrontendKind::NodePort)
        .map(|(fe, _)| fe)
        .collect()
}

/// Addresses the cluster allocated to `svc`, which no external IP may take.
fn vips(svc: &ServiceSpec) -> impl Iterator<Item = IpAddr> + '_ {
    let lb: &[IpAddr] = if svc.kind == ServiceType::LoadBalancer {
        &svc.lb_ips
    } else {
        &[]
    };
    svc.cluster_ips.iter().chain(lb).copied()
}

fn insert<K: std::hash::Hash + Eq, V: Ord>(m: &mut HashMap<K, SmallSet<V>>, k: K, v: V) {
    m.entry(k).or_default().insert(v);
}

fn remove<K: std::hash::Hash + Eq, V: Ord>(m: &mut HashMap<K, SmallSet<V>>, k: K, v: &V) {
    if let Some(set) = m.get_mut(&k) {
        set.remove(v);
        if set.is_empty() {
            m.remove(&k);
        }
    }
}

impl FrontendClaims {
    pub(super) fn add(&mut self, svc: &ServiceSpec, node: &NodeInfo) {
        for fe in keys(svc, node) {
            insert(&mut self.by_frontend, fe, Claim::of(svc));
        }
        for ip in vips(svc) {
            insert(&mut self.vips, ip, svc.id.clone());
        }
        for &ip in &svc.external_ips {
            insert(&mut self.external_ips, ip, svc.id.clone());
        }
    }

    /// Undoes [`Self::add`]; `node` must be the one `svc` was added with.
    pub(super) fn remove(&mut self, svc: &ServiceSpec, node: &NodeInfo) {
        for fe in keys(svc, node) {
            remove(&mut self.by_frontend, fe, &Claim::of(svc));
        }
        for ip in vips(svc) {
            remove(&mut self.vips, ip, &svc.id);
        }
        for &ip in &svc.external_ips {
            remove(&mut self.external_ips, ip, &svc.id);
        }
    }

    pub(super) fn rebuild<'a>(
        &mut self,
        services: impl Iterator<Item = &'a ServiceSpec>,
        node: &NodeInfo,
    ) {
        *self = Self::default();
        for svc in services {
            self.add(svc, node);
        }
    }

    /// Adds every Service whose frontends may change when `svc` appears,
    /// goes or changes its validity: the other claimants of its frontends,
    /// and the Services with external IPs on its cluster or load-balancer
    /// IPs (refused or let through now) with their own frontends' claimants.
    pub(super) fn contenders(
        &self,
        svc: &ServiceSpec,
        node: &NodeInfo,
        out: &mut BTreeSet<ServiceId>,
    ) {
        self.claimants(keys(svc, node), out);
        for ip in vips(svc) {
            for other in self.external_ips.get(&ip).into_iter().flatten() {
                out.insert(other.clone());
                let at_ip = self.by_frontend.keys().filter(|fe| fe.addr == ip).copied();
                self.claimants(at_ip, out);
            }
        }
    }

    fn claimants(&self, fes: impl IntoIterator<Item = Frontend>, out: &mut BTreeSet<ServiceId>) {
        for fe in fes {
            for c in self.by_frontend.get(&fe).into_iter().flatten() {
                out.insert(c.service.clone());
            }
        }
    }

    /// A Service other than `me` whose cluster or load-balancer IP `ip` is.
    fn vip_owner(&self, ip: IpAddr, me: &ServiceId) -> Option<&ServiceId> {
        self.vips.get(&ip)?.iter().find(|s| *s != me)
    }
}

impl Store {
    /// Splits `desired` (all of `svc`'s frontends) into the ones it serves
    /// and, for each one another Service keeps from it, why.
    pub(super) fn settle_frontends(
        &self,
        svc: &ServiceSpec,
        desired: Vec<DesiredFrontend>,
    ) -> (Vec<DesiredFrontend>, Vec<StoreError>) {
        let mut kept = Vec::with_capacity(desired.len());
        let mut refused = Vec::new();
        // Both scopes of a frontend share one verdict and one error.
        let mut verdicts: HashMap<Frontend, bool> = HashMap::default();
        let mut valid: HashMap<ServiceId, bool> = HashMap::default();
        for d in desired {
            if d.kind == FrontendKind::NodePort {
                kept.push(d);
                continue;
            }
            let key = d.frontend.in_scope(Scope::All);
            let keep = *verdicts.entry(key).or_insert_with(|| {
                match self.refusal(svc, key, d.kind, &mut valid) {
                    Some(e) => {
                        refused.push(e);
                        false
                    }
                    None => true,
                }
            });
            if keep {
                kept.push(d);
            }
        }
        (kept, refused)
    }

    /// Why `svc` may not serve `fe` (which it produces as `kind`), if it may not.
    fn refusal(
        &self,
        svc: &ServiceSpec,
        fe: Frontend,
        kind: FrontendKind,
        valid: &mut HashMap<ServiceId, bool>,
    ) -> Option<StoreError> {
        if kind == FrontendKind::ExternalIp
            && let Some(owner) = self.claims.vip_owner(fe.addr, &svc.id)
        {
            let what = match self.services.get(owner) {
                Some(o) if o.cluster_ips.contains(&fe.addr) => "cluster IP",
                _ => "load-balancer IP",
            };
            return Some(StoreError::ExternalIpIsServiceIp {
                index: position(&svc.external_ips, fe.addr),
                ip: fe.addr,
                what,
                owner: owner.clone(),
            });
        }
        let me = Claim::of(svc);
        let owner = self
            .claims
            .by_frontend
            .get(&fe)
            .into_iter()
            .flatten()
            .take_while(|c| **c < me)
            .find(|c| self.serves(c, fe, valid))?;
        Some(StoreError::FrontendInUse {
            field: field(svc, fe, kind),
            frontend: fe,
            owner: owner.service.clone(),
        })
    }

    /// Whether the claimant `c` gets `fe` unless an older claim takes it: it is
    /// valid, and `fe` is not an external IP the first rule refuses it.
    fn serves(&self, c: &Claim, fe: Frontend, valid: &mut HashMap<ServiceId, bool>) -> bool {
        let Some(svc) = self.services.get(&c.service) else {
            return false;
        };
        let ok = *valid
            .entry(c.service.clone())
            .or_insert_with(|| self.validate(svc).is_empty());
        if !ok {
            return false;
        }
        let kind = frontends::frontend_kinds(svc, &self.node)
            .into_iter()
            .find(|(f, _)| *f == fe)
            .map(|(_, kind)| kind);
        match kind {
            Some(FrontendKind::ExternalIp) => self.claims.vip_owner(fe.addr, &svc.id).is_none(),
            Some(_) => true,
            None => false,
        }
    }

    /// Every Service [`FrontendClaims::contenders`] names for each of
    /// `services`, which changed or whose validity may have.
    pub(super) fn frontend_contenders<'a>(
        &self,
        services: impl IntoIterator<Item = &'a ServiceSpec>,
        out: &mut BTreeSet<ServiceId>,
    ) {
        for svc in services {
            self.claims.contenders(svc, &self.node, out);
        }
    }
}

fn position(ips: &[IpAddr], ip: IpAddr) -> usize {
    ips.iter().position(|i| *i == ip).unwrap_or(0)
}

/// The field of `svc` that produces `fe` as `kind`, for the error.
fn field(svc: &ServiceSpec, fe: Frontend, kind: FrontendKind) -> String {
    match kind {
        FrontendKind::ClusterIp => {
            format!("spec.clusterIPs[{}]", position(&svc.cluster_ips, fe.addr))
        }
        FrontendKind::ExternalIp => {
            format!("spec.externalIPs[{}]", position(&svc.external_ips, fe.addr))
        }
        FrontendKind::NodePort => {
            let index = svc
                .ports
                .iter()
                .position(|p| p.node_port == Some(fe.port) && p.proto == fe.proto)
                .unwrap_or(0);
            format!("spec.ports[{index}].nodePort")
        }
        // The ingress list also holds hostnames and `ipMode: Proxy` entries
        // the agent skips, so an index into its own list would mislead.
        FrontendKind::LoadBalancer => "status.loadBalancer.ingress[].ip".to_owned(),
    }
}
