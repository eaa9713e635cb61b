//! The pure planner: from what a frontend looks like in the maps now and what it
//! should look like, the map operations that get it there, in make-before-break
//! order. No I/O: everything here is testable without a kernel.
//!
//! Order, per frontend:
//! 1. upsert new or changed backends, the rev-NAT entry and new source ranges
//!    (a master that turns `SVC_F_SRC_RANGES` on must find its ranges);
//! 2. upsert slots `1..`, then write a new Maglev table if the frontend's
//!    members changed (a whole new table swapped in by one update);
//! 3. upsert the master (slot 0), which switches readers to the new slots;
//! 4. prune: a deleted frontend's master first, then slots beyond the new counts,
//!    then backends that turn draining (`BACKEND_STATE_DRAINING`: kept, in no
//!    slot, for the flows conntrack tracks to them; the datapath never picks
//!    one for anything new), then a Maglev table no master asks for, then
//!    backends, source ranges and rev-NAT entries nothing points at any more
//!    (the master no longer asks for a range before it goes).
//!
//! A reader that loaded the old master can still find every slot and backend it
//! names until step 4, and the datapath re-reads the master when a slot vanished
//! under it, so a frontend with backends never looks empty.
// Public only for the fuzz targets (fuzz/), which use the same oracle as
// the unit tests.
#[doc(hidden)]
pub mod check;
mod compact;
mod ids;
mod image;
pub mod maglev;
mod restore;

use weir_abi::BACKEND_STATE_DRAINING;

pub use compact::{Backends, Slots};
pub use ids::{IdAllocator, Ids};
pub use image::{FrontendImage, ImageParts, service_key};
pub use restore::{Restored, restore};

use crate::{
    maps::MapOp,
    model::{DesiredFrontend, Frontend},
};

/// The operations for one frontend and the image they produce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub frontend: Frontend,
    pub ops: Vec<MapOp>,
    /// `None` when the frontend is deleted.
    pub image: Option<FrontendImage>,
    /// Ids reserved while planning; given back if the plan is not applied.
    pub allocated: Vec<Allocated>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocated {
    Backend(u32),
    RevNat(u32),
}

/// Plans one frontend from `old` (what the maps hold) to `desired`.
pub fn plan(
    frontend: Frontend,
    old: Option<&FrontendImage>,
    desired: Option<&DesiredFrontend>,
    ids: &mut Ids,
) -> Plan {
    let mut allocated = Vec::new();
    let image = desired.map(|d| FrontendImage::build(d, old, ids, &mut allocated));
    let ops = diff(frontend, old, image.as_ref());
    Plan {
        frontend,
        ops,
        image,
        allocated,
    }
}

/// The operations that turn `old` into `new`, in make-before-break order.
/// Also used to roll a partly applied plan back: diff from what was written to
/// what was there before.
pub fn diff(
    frontend: Frontend,
    old: Option<&FrontendImage>,
    new: Option<&FrontendImage>,
) -> Vec<MapOp> {
    let empty = FrontendImage::default();
    let old = old.unwrap_or(&empty);
    let new_img = new.unwrap_or(&empty);
    let mut ops = Vec::new();

    // Draining backends are written with the pruning: a backend that stops
    // serving must stay usable until no master names a slot with it, as a
    // removed one does (the datapath refuses a draining backend found in a
    // slot). They need no slot, so nothing has to wait for them.
    let draining = |b: &weir_abi::Backend| b.state == BACKEND_STATE_DRAINING;
    for (id, b) in new_img.backends.iter() {
        if !draining(&b) && old.backends.get(id) != Some(b) {
            ops.push(MapOp::UpsertBackend(id, b));
        }
    }
    if new.is_some() && (old.rev_nat_id != new_img.rev_nat_id || old.revnat != new_img.revnat) {
        ops.push(MapOp::UpsertRevNat(new_img.rev_nat_id, new_img.revnat));
    }
    for r in new_img.src_ranges.difference(&old.src_ranges) {
        ops.push(MapOp::UpsertSrcRange(*r));
    }
    for (slot, v) in new_img.services.slots() {
        if old.services.get(slot) != Some(v) {
            ops.push(MapOp::UpsertService(service_key(frontend, slot), v));
        }
    }
    let (old_table, new_table) = (&old.maglev, &new_img.maglev);
    if let Some(t) = new_table
        && old_table.as_deref() != Some(&**t)
    {
        ops.push(MapOp::SetMaglev(t.clone()));
    }
    if let Some(master) = new_img.services.get(0)
        && old.services.get(0) != Some(master)
    {
        ops.push(MapOp::UpsertService(service_key(frontend, 0), master));
    }

    if old.services.contains(0) && !new_img.services.contains(0) {
        ops.push(MapOp::DeleteService(service_key(frontend, 0)));
    }
    for (slot, _) in old.services.slots() {
        if !new_img.services.contains(slot) {
            ops.push(MapOp::DeleteService(service_key(frontend, slot)));
        }
    }
    for (id, b) in new_img.backends.iter() {
        if draining(&b) && old.backends.get(id) != Some(b) {
            ops.push(MapOp::UpsertBackend(id, b));
        }
    }
    // The old table's chunks that the new one does not overwrite: all of
    // them, or those past the end of a table that shrank.
    if let Some(t) = old_table {
        let kept = new_table
            .as_ref()
            .filter(|n| n.rev_nat_id == t.rev_nat_id)
            .map_or(0, |n| n.chunks());
        if kept < t.chunks() {
            ops.push(MapOp::DeleteMaglev(t.rev_nat_id, kept..t.chunks()));
        }
    }
    for id in old.backends.ids() {
        if !new_img.backends.contains(id) {
            ops.push(MapOp::DeleteBackend(id));
        }
    }
    for r in old.src_ranges.difference(&new_img.src_ranges) {
        ops.push(MapOp::DeleteSrcRange(*r));
    }
    let old_has_revnat = old.rev_nat_id != 0;
    if old_has_revnat && (new.is_none() || old.rev_nat_id != new_img.rev_nat_id) {
        ops.push(MapOp::DeleteRevNat(old.rev_nat_id));
    }
    ops
}

/// New entries a plan adds to each map before it prunes: what must fit.
pub fn growth(old: Option<&FrontendImage>, new: Option<&FrontendImage>) -> crate::maps::MapCounts {
    use crate::maps::MapName;
    let empty = FrontendImage::default();
    let old = old.unwrap_or(&empty);
    let mut g = crate::maps::MapCounts::default();
    if let Some(new) = new {
        let services = new
            .services
            .iter()
            .filter(|(s, _)| !old.services.contains(*s))
            .count();
        let backends = new
            .backends
            .ids()
            .filter(|b| !old.backends.contains(*b))
            .count();
        let revnat = usize::from(new.rev_nat_id != old.rev_nat_id);
        let src_ranges = new.src_ranges.difference(&old.src_ranges).count();
        // Chunks the new table writes beyond what the old one holds.
        let maglev = new.maglev.as_ref().map_or(0, |n| {
            let held = old
                .maglev
                .as_ref()
                .filter(|o| o.rev_nat_id == n.rev_nat_id)
                .map_or(0, |o| o.chunks());
            n.chunks().saturating_sub(held) as usize
        });
        for (map, n) in [
            (MapName::Services, services),
            (MapName::Backends, backends),
            (MapName::RevNat, revnat),
            (MapName::SrcRanges, src_ranges),
            (MapName::Maglev, maglev),
        ] {
            g.add(map, n as u64);
        }
    }
    g
}

#[cfg(test)]
mod tests;
