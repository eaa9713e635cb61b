//! Rebuilding the planner's view from pinned maps after a restart, so the first
//! sync rewrites only what changed while the agent was away.
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use weir_abi::SVC_IDS;

use super::{FrontendImage, Ids, ImageParts, maglev};
use crate::{
    maps::{MapOp, Snapshot},
    model::{Frontend, Protocol, Scope},
};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    pub images: BTreeMap<Frontend, FrontendImage>,
    /// Entries no frontend reaches: safe to delete at once, in this order.
    pub orphans: Vec<MapOp>,
    /// Every id found, orphans' included, marked used.
    pub ids: Ids,
}

pub fn restore(s: &Snapshot) -> Restored {
    let mut out = Restored::default();
    let mut claimed_slots = BTreeSet::new();
    let mut claimed_backends = BTreeSet::new();
    let mut claimed_revnat = BTreeSet::new();

    let mut parts: BTreeMap<Frontend, ImageParts> = BTreeMap::new();
    for (k, master) in s.services.iter().filter(|(k, _)| k.slot == 0) {
        let Some(proto) = Protocol::from_ip_proto(k.proto) else {
            continue;
        };
        // Both scopes are frontends of their own (an eTP=Local frontend's
        // local-only view has its own master, slots and rev-NAT id); an
        // unknown scope is an orphan.
        let Some(scope) = Scope::from_abi(k.scope) else {
            continue;
        };
        let fe = Frontend {
            addr: IpAddr::from(k.addr),
            port: u16::from_be(k.port),
            proto,
            scope,
        };
        let mut image = ImageParts {
            rev_nat_id: master.rev_nat_id,
            ..ImageParts::default()
        };
        if let Some(r) = s.revnat.get(&master.rev_nat_id) {
            image.revnat = *r;
            claimed_revnat.insert(master.rev_nat_id);
        }
        let used = usize::from(master.count) + usize::from(master.qcount);
        for slot in 0..weir_abi::service_entries(used) {
            let slot = u16::try_from(slot).unwrap_or(u16::MAX);
            let sk = weir_abi::ServiceKey { slot, ..*k };
            let Some(v) = s.services.get(&sk) else {
                continue;
            };
            image.services.insert(slot, *v);
            claimed_slots.insert(sk);
            let named = used.saturating_sub(usize::from(slot) * SVC_IDS);
            for &id in v.ids.iter().take(named) {
                if let Some(b) = s.backends.get(&id)
                    && claimed_backends.insert(id)
                {
                    image.backends.insert(id, *b);
                }
            }
        }
        parts.insert(fe, image);
    }

    // Ranges belong to the frontend whose rev-NAT id they carry.
    let mut by_revnat: BTreeMap<u32, &mut ImageParts> = parts
        .values_mut()
        .map(|img| (img.rev_nat_id, img))
        .collect();
    for r in &s.src_ranges {
        match by_revnat.get_mut(&r.rev_nat_id()) {
            Some(img) if r.rev_nat_id() != 0 => drop(img.src_ranges.insert(*r)),
            _ => out.orphans.push(MapOp::DeleteSrcRange(*r)),
        }
    }
    // So do draining backends (`BACKEND_STATE_DRAINING`): no slot names
    // them, they are kept for the flows conntrack tracks to them, and the
    // next plan keeps or prunes them like any backend of the frontend. Any
    // other backend no slot reaches is an orphan.
    for (&id, b) in &s.backends {
        if claimed_backends.contains(&id)
            || b.rev_nat_id == 0
            || b.state != weir_abi::BACKEND_STATE_DRAINING
        {
            continue;
        }
        if let Some(img) = by_revnat.get_mut(&b.rev_nat_id) {
            img.backends.insert(id, *b);
            claimed_backends.insert(id);
        }
    }

    // A table is the image's only if it is exactly what the image's master
    // and slots call for (an agent stopped between writing a table and its
    // master leaves one that is not). Any other table is an orphan, deleted
    // before the first sync writes the right one; until then the datapath
    // picks at random for that frontend.
    let mut claimed_tables = BTreeSet::new();
    for p in parts.values_mut() {
        if p.services.get(&0).and_then(maglev::size_of).is_none() {
            continue;
        }
        let Some(spec) = maglev::wanted(&FrontendImage::from(p.clone())) else {
            continue;
        };
        if let Some(t) = s.maglev.get(&spec.rev_nat_id)
            && **t == *spec.padded()
        {
            claimed_tables.insert(spec.rev_nat_id);
            p.maglev = Some(std::sync::Arc::new(spec));
        }
    }
    out.images = parts
        .into_iter()
        .map(|(fe, p)| (fe, FrontendImage::from(p)))
        .collect();
    for (&id, t) in s
        .maglev
        .iter()
        .filter(|(id, _)| !claimed_tables.contains(*id))
    {
        let held = u32::try_from(t.len()).unwrap_or(u32::MAX);
        out.orphans
            .push(MapOp::DeleteMaglev(id, 0..weir_abi::maglev::chunks(held)));
    }

    for k in s.services.keys().filter(|k| !claimed_slots.contains(*k)) {
        out.orphans.push(MapOp::DeleteService(*k));
    }
    for &id in s
        .backends
        .keys()
        .filter(|id| !claimed_backends.contains(*id))
    {
        out.orphans.push(MapOp::DeleteBackend(id));
    }
    for &id in s.revnat.keys().filter(|id| !claimed_revnat.contains(*id)) {
        out.orphans.push(MapOp::DeleteRevNat(id));
    }

    for &id in s.backends.keys() {
        out.ids.backends.reserve(id);
    }
    for image in out.images.values() {
        out.ids.revnat.reserve(image.rev_nat_id);
    }
    for &id in s.revnat.keys() {
        out.ids.revnat.reserve(id);
    }
    out
}
