//! The one writer of the BPF maps. It plans each Service's frontends with the
//! pure planner, checks that the result fits, applies the operations in order and
//! rolls a Service back to its previous state if a write fails half-way, so a
//! Service is either fully updated or left exactly as it was.
use std::collections::{BTreeMap, BTreeSet, hash_map::Entry};

use tracing::{debug, warn};

mod group;
mod labeling;
use labeling::Labels;

use crate::hash::HashMap;
use crate::{
    maps::labels,
    maps::{LbMaps, MapCounts, MapError, MapName, MapOp},
    model::{DesiredFrontend, Frontend, Scope, ServiceId},
    planner::{self, Allocated, FrontendImage, Ids, ImageParts, Plan},
    small_set::SmallSet,
};

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("service {service}: frontend {frontend} already belongs to service {owner}")]
    FrontendConflict {
        service: ServiceId,
        frontend: Frontend,
        owner: ServiceId,
    },
    #[error(
        "service {service}: frontend {frontend} has {count} backends, more than the 65535 a frontend can hold"
    )]
    TooManyBackends {
        service: ServiceId,
        frontend: Frontend,
        count: usize,
    },
    #[error(
        "service {service} does not fit in map {map}: {used} of {capacity} entries in use and it needs {needed} more ({remedy})",
        remedy = .map.remedy()
    )]
    MapFull {
        service: ServiceId,
        map: MapName,
        used: u64,
        capacity: u32,
        needed: u32,
    },
    #[error("service {service}: programming failed and was rolled back to the previous state")]
    Map {
        service: ServiceId,
        #[source]
        source: MapError,
    },
    #[error(
        "service {service}: {source}; rolling back failed too ({rollback}), the next sync retries"
    )]
    RollbackFailed {
        service: ServiceId,
        #[source]
        source: MapError,
        rollback: MapError,
    },
}

impl ReconcileError {
    /// Worth retrying later without a change from the source.
    pub const fn is_transient(&self) -> bool {
        !matches!(self, Self::TooManyBackends { .. })
    }

    /// The kernel refused a write. Every Service is checked to fit before
    /// anything is written, so no Service's content causes this: it says the
    /// datapath itself is in trouble, which is the node's health. The other
    /// errors are one Service's (a conflict, a full map, too many backends).
    pub const fn is_node_fault(&self) -> bool {
        matches!(self, Self::Map { .. } | Self::RollbackFailed { .. })
    }

    /// What makes two failures of this kind the same failure, for
    /// reporting it once, where the message will not do: a full map's
    /// message holds counts the agent changes itself (refusing the new
    /// frontends takes entries), so a retry a moment later reads
    /// differently while nothing about it is new. `None`: the message is
    /// the identity.
    pub fn identity(&self) -> Option<String> {
        match self {
            Self::MapFull { service, map, .. } => Some(format!("{service}: map {map} full")),
            Self::TooManyBackends {
                service, frontend, ..
            } => Some(format!(
                "{service}: frontend {frontend} has too many backends"
            )),
            Self::FrontendConflict { .. } | Self::Map { .. } | Self::RollbackFailed { .. } => None,
        }
    }
}

/// A frontend's entries and the Service that wrote them (`None`: restored,
/// not yet claimed). One map for both: two maps keyed by frontend cost a
/// second copy of every key at 100k Services.
struct Held {
    image: FrontendImage,
    owner: Option<ServiceId>,
    /// Fingerprint of the label written for it (see `labels`); 0: none.
    label: u64,
}

pub struct Reconciler<M> {
    maps: M,
    ids: Ids,
    /// Hashed: a B-tree moved whole images as it shifted them, and was
    /// searched on every plan; nothing reads the images in order. Boxed:
    /// inline, each doubling of the table during a 100k-Service cold sync
    /// copied every image into megabytes of fresh pages while the source
    /// waited (a 30 ms stall at the last one).
    images: HashMap<Frontend, Box<Held>>,
    by_service: HashMap<ServiceId, SmallSet<Frontend>>,
    /// Restored from the maps but not yet claimed by any Service.
    unclaimed: BTreeSet<Frontend>,
    used: MapCounts,
    labels: Labels,
}

impl<M: LbMaps> Reconciler<M> {
    #[cfg(test)]
    pub fn maps(&self) -> &M {
        &self.maps
    }

    #[cfg(test)]
    pub fn maps_mut(&mut self) -> &mut M {
        &mut self.maps
    }

    /// Takes over whatever the maps hold: frontends become unclaimed images that
    /// Services adopt as they sync, and entries no frontend reaches are removed.
    pub fn restore(mut maps: M) -> Result<Self, MapError> {
        let snapshot = maps.snapshot()?;
        let restored = planner::restore(&snapshot);
        let mut ids = restored.ids;
        let applied = maps.apply_all(&restored.orphans);
        let done = applied
            .as_ref()
            .err()
            .map_or(restored.orphans.len(), |(n, _)| *n);
        for op in &restored.orphans[..done] {
            release_deleted(&mut ids, op);
        }
        applied.map_err(|(_, e)| e)?;
        if !restored.orphans.is_empty() {
            debug!(
                entries = restored.orphans.len(),
                "removed unreachable map entries"
            );
        }
        let mut this = Self {
            maps,
            ids,
            unclaimed: restored.images.keys().copied().collect(),
            images: restored
                .images
                .into_iter()
                .map(|(fe, image)| {
                    let held = Held {
                        image,
                        owner: None,
                        label: 0,
                    };
                    (fe, Box::new(held))
                })
                .collect(),
            by_service: HashMap::default(),
            used: MapCounts::default(),
            labels: Labels::new(),
        };
        for held in this.images.values() {
            this.used.add_all(&sizes(&held.image));
        }
        this.restore_labels();
        Ok(this)
    }

    /// Records the labels the maps hold for restored frontends, so that a
    /// restart with nothing changed rewrites none, and deletes the others.
    fn restore_labels(&mut self) {
        let mut found: HashMap<u32, u64> = HashMap::default();
        let labels = &self.labels;
        let read = self.maps.visit_labels(&mut |id, l| {
            found.insert(id, labels.fingerprint(id, &l));
        });
        if let Err(e) = read {
            // Every restored frontend gets its label rewritten as it syncs.
            warn!(
                "cannot read frontend labels: {}",
                crate::controller::chain(&e)
            );
        }
        for held in self.images.values_mut() {
            if let Some(fp) = found.remove(&held.image.rev_nat_id) {
                held.label = fp;
            }
        }
        for id in found.into_keys() {
            self.labels.delete(id);
        }
        self.labels.flush(&mut self.maps);
    }

    /// Says a sync of many Services starts (`true`) or ends; see
    /// [`LbMaps::bulk`].
    pub fn bulk(&mut self, on: bool) {
        self.maps.bulk(on);
    }

    /// Writes the labels still waiting; the controller calls it after each
    /// batch of Services.
    pub fn flush_labels(&mut self) {
        self.labels.flush(&mut self.maps);
    }

    /// Labels `service`'s frontends among `desired` that it holds.
    fn label(&mut self, service: &ServiceId, desired: &[DesiredFrontend]) {
        for d in desired {
            let Some(held) = self.images.get_mut(&d.frontend) else {
                continue;
            };
            if held.owner.as_ref() != Some(service) || held.image.rev_nat_id == 0 {
                continue;
            }
            let label = labels::encode(service, &d.port_name, d.kind);
            held.label = self.labels.set(held.image.rev_nat_id, label, held.label);
        }
        self.labels.flush_if_full(&mut self.maps);
    }

    /// Frontends restored from the maps that no Service has claimed yet.
    pub fn unclaimed(&self) -> usize {
        self.unclaimed.len()
    }

    pub fn frontend_count(&self) -> usize {
        self.images.len()
    }

    /// Entries in use and capacity of each map, for the pressure metrics.
    pub fn usage(&self) -> Vec<(MapName, u64, u32)> {
        let cap = self.maps.capacity();
        MapName::ALL
            .iter()
            .map(|&m| (m, self.used.get(m), cap.of(m)))
            .collect()
    }

    /// Makes the datapath serve exactly `desired` for `service`; an empty list
    /// removes it.
    pub fn sync_service(
        &mut self,
        service: &ServiceId,
        desired: &[DesiredFrontend],
    ) -> Result<usize, ReconcileError> {
        self.check_service(service, desired)?;
        let current = self.by_service.get(service).cloned().unwrap_or_default();
        let wanted: BTreeSet<Frontend> = desired.iter().map(|d| d.frontend).collect();
        let mut removed: Vec<Frontend> = current
            .iter()
            .filter(|fe| !wanted.contains(fe))
            .copied()
            .collect();
        removed.sort_by_key(|fe| fe.scope != Scope::All);
        let mut plans = Vec::new();
        for (fe, d) in upsert_order(desired) {
            plans.push(planner::plan(
                fe,
                image_in(&self.images, fe),
                Some(d),
                &mut self.ids,
            ));
        }
        for fe in removed {
            plans.push(planner::plan(
                fe,
                image_in(&self.images, fe),
                None,
                &mut self.ids,
            ));
        }

        let applied = match self.apply_plans(service, plans) {
            Err(e @ ReconcileError::MapFull { .. }) => {
                self.refuse_new_frontends(service, desired);
                Err(e)
            }
            other => other,
        };
        // Also after a failure: whatever the Service holds now is its own.
        self.label(service, desired);
        applied
    }

    /// What refuses a Service before anything is planned: a frontend with
    /// more backends than its counts address, or one another Service holds.
    fn check_service(
        &self,
        service: &ServiceId,
        desired: &[DesiredFrontend],
    ) -> Result<(), ReconcileError> {
        for d in desired {
            // Slots are what the u16 counts address; draining backends take none.
            let serving = d.backends.iter().filter(|b| b.state.serves()).count();
            if serving > usize::from(u16::MAX) {
                return Err(ReconcileError::TooManyBackends {
                    service: service.clone(),
                    frontend: d.frontend,
                    count: serving,
                });
            }
            if let Some(owner) = self.images.get(&d.frontend).and_then(|h| h.owner.as_ref())
                && owner != service
            {
                return Err(ReconcileError::FrontendConflict {
                    service: service.clone(),
                    frontend: d.frontend,
                    owner: owner.clone(),
                });
            }
        }
        Ok(())
    }

    /// A Service that does not fit must not leak to its VIPs unchanged: give
    /// its frontends that have no entry yet a master without backends, so
    /// connects are refused, as long as that much still fits. Frontends it
    /// already had keep serving their previous backends.
    fn refuse_new_frontends(&mut self, service: &ServiceId, desired: &[DesiredFrontend]) {
        let empty: Vec<DesiredFrontend> = desired
            .iter()
            .filter(|d| !self.images.contains_key(&d.frontend))
            .map(|d| DesiredFrontend {
                backends: Vec::new(),
                // A master without backends refuses everyone anyway; ranges
                // would only take room (and may be what did not fit).
                source_ranges: Vec::new(),
                ..d.clone()
            })
            .collect();
        let plans = empty
            .iter()
            .map(|d| planner::plan(d.frontend, None, Some(d), &mut self.ids))
            .collect();
        if let Err(e) = self.apply_plans(service, plans) {
            debug!(%service, "cannot even refuse its new frontends: {e}");
        }
    }

    /// Checks that `plans` fit, applies them in order and records the result;
    /// on a failed write, rolls every one of them back.
    fn apply_plans(
        &mut self,
        service: &ServiceId,
        plans: Vec<Plan>,
    ) -> Result<usize, ReconcileError> {
        self.check_fits(service, &plans)?;
        let mut ops = 0;
        for i in 0..plans.len() {
            if let Err((done, source)) = self.apply_ops(&plans[i].ops) {
                // The plans after the failed one were never applied: give back
                // the ids they reserved; roll_back handles the rest.
                for p in &plans[i + 1..] {
                    self.release_allocated(p);
                }
                return Err(self.roll_back(service, &plans[..=i], done, source));
            }
            ops += plans[i].ops.len();
        }
        for plan in plans {
            self.commit(service, plan);
        }
        Ok(ops)
    }

    /// Removes restored frontends that no Service claimed during the first full
    /// sync: their Services were deleted while the agent was away.
    pub fn prune_unclaimed(&mut self) -> Vec<(Frontend, MapError)> {
        let mut failed = Vec::new();
        for fe in std::mem::take(&mut self.unclaimed) {
            let plan = planner::plan(fe, image_in(&self.images, fe), None, &mut self.ids);
            match self.apply_ops(&plan.ops) {
                Ok(()) => {
                    debug!(%fe, "removed frontend of a service that no longer exists");
                    self.settle(plan, None);
                }
                Err((_, e)) => {
                    self.unclaimed.insert(fe);
                    failed.push((fe, e));
                }
            }
        }
        failed
    }

    fn check_fits(&mut self, service: &ServiceId, plans: &[Plan]) -> Result<(), ReconcileError> {
        let Err((map, used, needed)) = self.needed(plans, &MapCounts::default()) else {
            return Ok(());
        };
        for p in plans {
            self.release_allocated(p);
        }
        Err(ReconcileError::MapFull {
            service: service.clone(),
            map,
            used,
            capacity: self.maps.capacity().of(map),
            needed: u32::try_from(needed).unwrap_or(u32::MAX),
        })
    }

    /// The entries `plans` add to each map, if they fit beside those in use
    /// and `reserved`; else the first map they do not fit in, with the
    /// entries in use there (`reserved` included) and those they need.
    fn needed(
        &self,
        plans: &[Plan],
        reserved: &MapCounts,
    ) -> Result<MapCounts, (MapName, u64, u64)> {
        let mut needed = MapCounts::default();
        for p in plans {
            needed.add_all(&planner::growth(self.image(p.frontend), p.image.as_ref()));
        }
        let capacity = self.maps.capacity();
        for (map, n) in needed.iter() {
            let used = self.used.get(map) + reserved.get(map);
            if n > 0 && used + n > u64::from(capacity.of(map)) {
                return Err((map, used, n));
            }
        }
        Ok(needed)
    }

    /// Applies `ops` in order; on failure, says how many were applied first.
    fn apply_ops(&mut self, ops: &[MapOp]) -> Result<(), (usize, MapError)> {
        self.maps.apply_all(ops)
    }

    /// Undoes `plans`, all applied except the last, which failed after
    /// `applied_in_last` writes; newest first.
    fn roll_back(
        &mut self,
        service: &ServiceId,
        plans: &[Plan],
        applied_in_last: usize,
        source: MapError,
    ) -> ReconcileError {
        let last = plans.len() - 1;
        // The failed write counts as written: the undo then covers its key
        // whichever way the kernel took it.
        let written: Vec<usize> = plans
            .iter()
            .enumerate()
            .map(|(i, p)| {
                if i == last {
                    (applied_in_last + 1).min(p.ops.len())
                } else {
                    p.ops.len()
                }
            })
            .collect();
        match self.undo(service, plans, &written) {
            Ok(()) => ReconcileError::Map {
                service: service.clone(),
                source,
            },
            Err(rollback) => ReconcileError::RollbackFailed {
                service: service.clone(),
                source,
                rollback,
            },
        }
    }

    /// Undoes the first `written[i]` ops of each of `plans`, newest first,
    /// and gives back the ids they reserved. When an undo fails, what the
    /// maps hold is tracked as `service`'s instead, and that error returned.
    fn undo(
        &mut self,
        service: &ServiceId,
        plans: &[Plan],
        written: &[usize],
    ) -> Result<(), MapError> {
        let written: Vec<FrontendImage> = plans
            .iter()
            .zip(written)
            .map(|(p, &n)| {
                let mut img = self
                    .image(p.frontend)
                    .map(FrontendImage::to_parts)
                    .unwrap_or_default();
                for op in &p.ops[..n] {
                    apply_to_image(&mut img, op);
                }
                FrontendImage::from(img)
            })
            .collect();
        for (p, w) in plans.iter().zip(&written).rev() {
            let undo = planner::diff(p.frontend, Some(w), self.image(p.frontend));
            if let Err((_, rollback)) = self.apply_ops(&undo) {
                warn!(%service, frontend = %p.frontend, "rollback failed; tracking what was written");
                // `written` is not what the maps hold now: the failed writes
                // may not have landed and part of the undo did. Read back the
                // entries either image names; fall back to `written`.
                let held = self.maps.snapshot().ok();
                for (p, w) in plans.iter().zip(written) {
                    let w = match &held {
                        Some(s) => held_by(s, p.frontend, self.image(p.frontend), &w),
                        None => w,
                    };
                    self.adopt_written(service, p, w);
                }
                return Err(rollback);
            }
        }
        for p in plans {
            self.release_allocated(p);
        }
        Ok(())
    }

    /// After a failed rollback, the maps hold `written` for this frontend; track
    /// that so the next sync plans from the truth.
    fn adopt_written(&mut self, service: &ServiceId, plan: &Plan, written: FrontendImage) {
        let before = self.image(plan.frontend).map(sizes).unwrap_or_default();
        self.adjust_used(&before, &sizes(&written));
        for a in &plan.allocated {
            match *a {
                Allocated::Backend(id) if !written.backends.contains(id) => {
                    self.ids.backends.release(id)
                }
                Allocated::RevNat(id) if written.rev_nat_id != id => self.ids.revnat.release(id),
                _ => {}
            }
        }
        self.unclaimed.remove(&plan.frontend);
        self.by_service
            .entry(service.clone())
            .or_default()
            .insert(plan.frontend);
        let held = Held {
            image: written,
            owner: Some(service.clone()),
            // Unknown: the next successful sync writes it.
            label: 0,
        };
        self.images.insert(plan.frontend, Box::new(held));
    }

    fn commit(&mut self, service: &ServiceId, plan: Plan) {
        let fe = plan.frontend;
        self.unclaimed.remove(&fe);
        if plan.image.is_some() {
            self.settle(plan, Some(service));
            self.by_service
                .entry(service.clone())
                .or_default()
                .insert(fe);
        } else {
            self.settle(plan, None);
            if let Some(set) = self.by_service.get_mut(service) {
                set.remove(&fe);
                if set.is_empty() {
                    self.by_service.remove(service);
                }
            }
        }
    }

    /// Records a fully applied plan's image, written by `owner` (`None`
    /// keeps the owner it had), and frees the ids it deleted.
    fn settle(&mut self, plan: Plan, owner: Option<&ServiceId>) {
        for op in &plan.ops {
            release_deleted(&mut self.ids, op);
            if let MapOp::DeleteRevNat(id) = *op {
                self.labels.delete(id);
            }
        }
        let before = self.image(plan.frontend).map(sizes).unwrap_or_default();
        let after = plan.image.as_ref().map(sizes).unwrap_or_default();
        self.adjust_used(&before, &after);
        match plan.image {
            Some(image) => {
                let owner = owner.cloned();
                match self.images.entry(plan.frontend) {
                    Entry::Occupied(mut e) => {
                        let held = e.get_mut();
                        held.image = image;
                        held.owner = owner.or(held.owner.take());
                    }
                    Entry::Vacant(e) => drop(e.insert(Box::new(Held {
                        image,
                        owner,
                        label: 0,
                    }))),
                }
            }
            None => drop(self.images.remove(&plan.frontend)),
        }
    }

    fn image(&self, fe: Frontend) -> Option<&FrontendImage> {
        image_in(&self.images, fe)
    }

    fn adjust_used(&mut self, before: &MapCounts, after: &MapCounts) {
        self.used.adjust(after, before);
    }

    fn release_allocated(&mut self, plan: &Plan) {
        for a in &plan.allocated {
            match *a {
                Allocated::Backend(id) => self.ids.backends.release(id),
                Allocated::RevNat(id) => self.ids.revnat.release(id),
            }
        }
    }
}

/// The order a Service's frontends are upserted in. The packet programs use
/// an eTP=Local frontend's External-scope entries only while its All-scope
/// master says LOCAL: so External entries are written before any All
/// master (a frontend turning Local finds its local view in place) and
/// removed after them (one turning Cluster or going away stops pointing
/// there first). Hence: upserts External then All, then removals All then
/// External.
fn upsert_order(desired: &[DesiredFrontend]) -> Vec<(Frontend, &DesiredFrontend)> {
    // Keyed by frontend, a frontend listed twice keeps its last entry.
    let ordered: BTreeMap<(bool, Frontend), &DesiredFrontend> = desired
        .iter()
        .map(|d| ((d.frontend.scope != Scope::External, d.frontend), d))
        .collect();
    ordered.into_iter().map(|((_, fe), d)| (fe, d)).collect()
}

/// [`Reconciler::image`] where `self` is partly borrowed.
fn image_in(images: &HashMap<Frontend, Box<Held>>, fe: Frontend) -> Option<&FrontendImage> {
    images.get(&fe).map(|h| &h.image)
}

fn release_deleted(ids: &mut Ids, op: &MapOp) {
    match *op {
        MapOp::DeleteBackend(id) => ids.backends.release(id),
        MapOp::DeleteRevNat(id) => ids.revnat.release(id),
        _ => {}
    }
}

fn sizes(img: &FrontendImage) -> MapCounts {
    let mut n = MapCounts::default();
    n.add(MapName::Services, img.services.len() as u64);
    n.add(MapName::Backends, img.backends.len() as u64);
    n.add(MapName::RevNat, u64::from(img.rev_nat_id != 0));
    n.add(MapName::SrcRanges, img.src_ranges.len() as u64);
    let maglev = img.maglev.as_ref().map_or(0, |t| u64::from(t.chunks()));
    n.add(MapName::Maglev, maglev);
    n
}

/// The entries of `fe` that `s` holds under the keys `old` or `written` name.
fn held_by(
    s: &crate::maps::Snapshot,
    fe: Frontend,
    old: Option<&FrontendImage>,
    written: &FrontendImage,
) -> FrontendImage {
    let mut img = ImageParts::default();
    for src in old.into_iter().chain([written]) {
        for (slot, _) in src.services.iter() {
            if let Some(v) = s.services.get(&planner::service_key(fe, slot)) {
                img.services.insert(slot, *v);
            }
        }
        for id in src.backends.ids() {
            if let Some(b) = s.backends.get(&id) {
                img.backends.insert(id, *b);
            }
        }
        if let Some(r) = s.revnat.get(&src.rev_nat_id) {
            img.rev_nat_id = src.rev_nat_id;
            img.revnat = *r;
        }
        img.src_ranges
            .extend(src.src_ranges.iter().filter(|r| s.src_ranges.contains(r)));
    }
    // Which of the two tables the map holds. A write that failed partway
    // leaves a mix (chunks are written in place): count that as the written
    // table, so that undoing it rewrites the old table or deletes the
    // written one's chunks.
    let candidates = || {
        old.and_then(|o| o.maglev.clone())
            .into_iter()
            .chain(written.maglev.clone())
    };
    img.maglev = candidates()
        .find(|t| {
            s.maglev
                .get(&t.rev_nat_id)
                .is_some_and(|held| **held == *t.padded())
        })
        .or_else(|| {
            written
                .maglev
                .clone()
                .filter(|t| s.maglev.contains_key(&t.rev_nat_id))
        });
    FrontendImage::from(img)
}

fn apply_to_image(img: &mut ImageParts, op: &MapOp) {
    match *op {
        MapOp::UpsertService(k, v) => drop(img.services.insert(k.slot, v)),
        MapOp::DeleteService(k) => drop(img.services.remove(&k.slot)),
        MapOp::UpsertBackend(id, b) => drop(img.backends.insert(id, b)),
        MapOp::DeleteBackend(id) => drop(img.backends.remove(&id)),
        MapOp::UpsertRevNat(id, r) => {
            img.rev_nat_id = id;
            img.revnat = r;
        }
        MapOp::DeleteRevNat(_) => {
            img.rev_nat_id = 0;
            img.revnat = weir_abi::RevNat::default();
        }
        MapOp::UpsertSrcRange(r) => drop(img.src_ranges.insert(r)),
        MapOp::DeleteSrcRange(r) => drop(img.src_ranges.remove(&r)),
        MapOp::SetMaglev(ref t) => img.maglev = Some(t.clone()),
        // A trim past a shrunk table's end leaves the table.
        MapOp::DeleteMaglev(_, ref c) if c.start == 0 => img.maglev = None,
        MapOp::DeleteMaglev(..) => {}
    }
}

#[cfg(test)]
mod label_tests;
#[cfg(test)]
mod tests;
