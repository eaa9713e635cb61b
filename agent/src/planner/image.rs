use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use weir_abi::{
    Addr, BACKEND_STATE_ACTIVE, BACKEND_STATE_DRAINING, BACKEND_STATE_TERMINATING, Backend, RevNat,
    SVC_F_AFFINITY, SVC_F_EXTERNAL, SVC_F_LOCAL, SVC_F_MAGLEV, SVC_F_NODEPORT, SVC_F_SRC_RANGES,
    ServiceKey, ServiceValue,
};

use super::{
    Allocated, Backends, Ids, Slots,
    maglev::{self, TableSpec},
};
use crate::hash::HashMap;
use crate::{
    maps::SrcRange,
    model::{BackendState, DesiredFrontend, Frontend, FrontendKind, IpFamily},
};

/// Every map entry one frontend owns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrontendImage {
    /// 0 only in the empty image.
    pub rev_nat_id: u32,
    pub revnat: RevNat,
    /// Services-map values by slot; slot 0 is the master.
    pub services: Slots,
    pub backends: Backends,
    /// Source-range trie entries, all keyed by `rev_nat_id`.
    pub src_ranges: BTreeSet<SrcRange>,
    /// The Maglev table under `rev_nat_id`, as written.
    pub maglev: Option<Arc<TableSpec>>,
}

/// A [`FrontendImage`] laid out for editing entry by entry: restoring one
/// from the maps, or following a partly applied plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageParts {
    pub rev_nat_id: u32,
    pub revnat: RevNat,
    pub services: BTreeMap<u16, ServiceValue>,
    pub backends: BTreeMap<u32, Backend>,
    pub src_ranges: BTreeSet<SrcRange>,
    pub maglev: Option<Arc<TableSpec>>,
}

impl From<ImageParts> for FrontendImage {
    fn from(p: ImageParts) -> Self {
        Self {
            rev_nat_id: p.rev_nat_id,
            revnat: p.revnat,
            services: Slots::from_map(p.services),
            backends: Backends::from_map(p.backends),
            src_ranges: p.src_ranges,
            maglev: p.maglev,
        }
    }
}

impl FrontendImage {
    pub fn to_parts(&self) -> ImageParts {
        ImageParts {
            rev_nat_id: self.rev_nat_id,
            revnat: self.revnat,
            services: self.services.to_map(),
            backends: self.backends.to_map(),
            src_ranges: self.src_ranges.clone(),
            maglev: self.maglev.clone(),
        }
    }

    /// The image of `desired`, reusing the ids `old` already gave to the same
    /// backends so that unchanged backends are not rewritten.
    pub fn build(
        desired: &DesiredFrontend,
        old: Option<&FrontendImage>,
        ids: &mut Ids,
        allocated: &mut Vec<Allocated>,
    ) -> Self {
        let fe = desired.frontend;
        let rev_nat_id = match old.map(|o| o.rev_nat_id) {
            Some(id) if id != 0 => id,
            _ => {
                let id = ids.revnat.alloc();
                allocated.push(Allocated::RevNat(id));
                id
            }
        };
        let existing: HashMap<(Addr, u16), u32> = old
            .map(|o| {
                o.backends
                    .iter()
                    .map(|(id, b)| ((b.addr, b.port), id))
                    .collect()
            })
            .unwrap_or_default();

        // Active backends take slots 1..=count, terminating ones follow;
        // draining ones (sorted last) get a backend entry and no slot. The
        // sort inside each group keeps plans deterministic.
        // Never a backend of the other family: the datapath would refuse it,
        // and a v4 client cannot reach a v6 pod through a v4 VIP anyway.
        let family = IpFamily::of(&fe.addr);
        let mut ordered: Vec<_> = desired
            .backends
            .iter()
            .filter(|b| IpFamily::of(&b.addr) == family)
            .collect();
        ordered.sort_by_key(|b| (b.state, b.addr, b.port));
        let proto = fe.proto.ip_proto();
        let mut image = Self {
            rev_nat_id,
            revnat: RevNat {
                addr: Addr::from(fe.addr),
                port: fe.port.to_be(),
                _pad: [0; 2],
            },
            ..Self::default()
        };
        let (mut count, mut qcount) = (0u16, 0u16);
        let mut slots = Vec::with_capacity(ordered.len());
        let mut backends = Vec::with_capacity(ordered.len());
        for b in ordered {
            let value = Backend {
                addr: Addr::from(b.addr),
                port: b.port.to_be(),
                proto,
                state: match b.state {
                    BackendState::Active => BACKEND_STATE_ACTIVE,
                    BackendState::Terminating => BACKEND_STATE_TERMINATING,
                    BackendState::Draining => BACKEND_STATE_DRAINING,
                },
                rev_nat_id,
            };
            let id = existing
                .get(&(value.addr, value.port))
                .copied()
                .unwrap_or_else(|| {
                    let id = ids.backends.alloc();
                    allocated.push(Allocated::Backend(id));
                    id
                });
            backends.push((id, value));
            match b.state {
                BackendState::Active => count += 1,
                BackendState::Terminating => qcount += 1,
                // Reachable by id only: conntrack entries name it, no slot
                // does, so nothing new picks it.
                BackendState::Draining => continue,
            }
            // Position `count + qcount - 1`: actives first, then terminating ones.
            slots.push(id);
        }
        image.backends = Backends::from_unsorted(backends);
        image.src_ranges = desired
            .source_ranges
            .iter()
            .filter(|c| c.family() == family)
            .map(|&c| SrcRange::new(rev_nat_id, c))
            .collect();
        let mut flags = match desired.kind {
            FrontendKind::ClusterIp => 0,
            FrontendKind::NodePort => SVC_F_EXTERNAL | SVC_F_NODEPORT,
            FrontendKind::ExternalIp | FrontendKind::LoadBalancer => SVC_F_EXTERNAL,
        };
        if desired.local && desired.kind.is_external() {
            flags |= SVC_F_LOCAL;
        }
        let affinity_timeout = desired.affinity.unwrap_or(0);
        if affinity_timeout != 0 {
            flags |= SVC_F_AFFINITY;
        }
        if !image.src_ranges.is_empty() {
            flags |= SVC_F_SRC_RANGES;
        }
        // A table only with something to spread over: the flag promises the
        // datapath a table.
        let table_size = desired
            .maglev
            .filter(|_| count + qcount > 0 && desired.kind.is_external());
        if table_size.is_some() {
            flags |= SVC_F_MAGLEV;
        }
        let master = ServiceValue {
            table_size: table_size.unwrap_or(0),
            count,
            qcount,
            rev_nat_id,
            flags,
            affinity_timeout,
            ..ServiceValue::default()
        };
        image.services = Slots::plain(master, slots);
        image.maglev = maglev::wanted(&image).map(Arc::new);
        image
    }
}

pub fn service_key(fe: Frontend, slot: u16) -> ServiceKey {
    ServiceKey {
        addr: Addr::from(fe.addr),
        port: fe.port.to_be(),
        slot,
        proto: fe.proto.ip_proto(),
        // Each scope of an eTP=Local frontend is its own set of entries.
        scope: fe.scope.abi(),
        _pad: [0; 2],
    }
}
