//! Many new Services at once, as at a cold start: their plans are written
//! together, one batch per kind of entry, where one Service at a time wrote
//! its rev-NAT entry and its master with a syscall each (200k of them, a
//! fifth of the controller's CPU, at 100k Services).
//!
//! ```text
//!  Service a: backends ─ rev-NAT ─ slots ─ master
//!  Service b: backends ─ rev-NAT ─ slots ─ master
//!                 │          │        │       │
//!  written:   [a b …]    [a b …]  [a b …]  [a b …]   (phase by phase)
//! ```
//!
//! Only Services that hold no frontend yet and whose plans only add entries
//! join a group. Each plan's ops come in make-before-break phases
//! ([`planner::check::phase`]), and plans of a group touch disjoint keys: a
//! stable sort of all their ops by phase keeps each plan's own order, and so
//! every invariant a plan keeps alone. Within a phase the plans keep their
//! order, so an eTP=Local Service's External-scope master still comes before
//! its All-scope one. Everything else goes through [`Reconciler::sync_service`]
//! in turn, after the group before it is written.
//!
//! A failed write undoes every Service of the group it did not complete:
//! the one whose write failed fails as it would alone, and the others are
//! synced again one at a time. Every Service ends fully written or exactly
//! as it was.
use super::{ReconcileError, Reconciler, upsert_order};
use crate::{
    hash::HashSet,
    maps::{LbMaps, MapCounts, MapError, MapName, MapOp},
    model::{DesiredFrontend, Frontend, ServiceId},
    planner::{self, Plan, check::phase},
};

/// The last phase a group writes: masters. Deletes and draining backends
/// come after it, and a plan that has them is synced alone.
const LAST_PHASE: u8 = 5;

/// A group is written once it holds this many Services: room enough for
/// batches to pay, and a bound on the ops held at once.
const MAX_GROUP: usize = 512;

struct Member<'a> {
    /// Where its result goes.
    index: usize,
    service: &'a ServiceId,
    desired: &'a [DesiredFrontend],
    plans: Vec<Plan>,
}

#[derive(Default)]
struct Group<'a> {
    members: Vec<Member<'a>>,
    frontends: HashSet<Frontend>,
    /// Entries the members will take, by map, on top of those in use.
    reserved: MapCounts,
}

impl<M: LbMaps> Reconciler<M> {
    /// As [`Self::sync_service`] for each of `services` in order, with the
    /// same results; see the module's documentation.
    pub fn sync_services(
        &mut self,
        services: &[(&ServiceId, &[DesiredFrontend])],
    ) -> Vec<Result<usize, ReconcileError>> {
        let mut results: Vec<Option<Result<usize, ReconcileError>>> =
            services.iter().map(|_| None).collect();
        let mut group = Group::default();
        for (index, &(service, desired)) in services.iter().enumerate() {
            if self.join(&mut group, index, service, desired) {
                if group.members.len() >= MAX_GROUP {
                    self.write_group(std::mem::take(&mut group), &mut results);
                }
                continue;
            }
            self.write_group(std::mem::take(&mut group), &mut results);
            results[index] = Some(self.sync_service(service, desired));
        }
        self.write_group(group, &mut results);
        results
            .into_iter()
            .map(|r| r.expect("every Service is synced alone or in a group"))
            .collect()
    }

    /// Plans `service` into `group` if it can be written with it.
    fn join<'a>(
        &mut self,
        group: &mut Group<'a>,
        index: usize,
        service: &'a ServiceId,
        desired: &'a [DesiredFrontend],
    ) -> bool {
        let new = |fe: &Frontend| !self.images.contains_key(fe) && !group.frontends.contains(fe);
        if self.by_service.contains_key(service)
            || !desired.iter().all(|d| new(&d.frontend))
            || self.check_service(service, desired).is_err()
        {
            return false;
        }
        let plans: Vec<Plan> = upsert_order(desired)
            .into_iter()
            .map(|(fe, d)| planner::plan(fe, None, Some(d), &mut self.ids))
            .collect();
        let adds_only = plans
            .iter()
            .all(|p| p.ops.iter().all(|op| phase(op) <= LAST_PHASE));
        let needed = adds_only
            .then(|| self.needed(&plans, &group.reserved).ok())
            .flatten();
        let Some(needed) = needed else {
            // Alone, it fails or writes as it would without groups.
            for p in &plans {
                self.release_allocated(p);
            }
            return false;
        };
        group.reserved.add_all(&needed);
        group.frontends.extend(plans.iter().map(|p| p.frontend));
        group.members.push(Member {
            index,
            service,
            desired,
            plans,
        });
        true
    }

    /// Writes `group`'s plans phase by phase and records each member's result.
    fn write_group(
        &mut self,
        group: Group<'_>,
        results: &mut [Option<Result<usize, ReconcileError>>],
    ) {
        if group.members.is_empty() {
            return;
        }
        let (ops, owners) = merge(&group.members);
        let failure = self.apply_ops(&ops).err();
        // How many of each plan's ops the maps took (the failed one counts:
        // the undo then covers its key whichever way the kernel took it).
        let mut written: Vec<Vec<usize>> = group
            .members
            .iter()
            .map(|m| vec![0; m.plans.len()])
            .collect();
        let reached = failure.as_ref().map_or(ops.len(), |(n, _)| n + 1);
        for &(m, p) in &owners[..reached] {
            written[m][p] += 1;
        }
        let failed_member = failure.as_ref().map(|(n, _)| owners[*n].0);
        let mut source = failure.map(|(_, e)| e);
        let mut again = Vec::new();
        for (i, (member, written)) in group.members.into_iter().zip(written).enumerate() {
            let complete = member
                .plans
                .iter()
                .zip(&written)
                .all(|(p, &n)| n == p.ops.len());
            if complete && failed_member != Some(i) {
                let ops = member.plans.iter().map(|p| p.ops.len()).sum();
                for plan in member.plans {
                    self.commit(member.service, plan);
                }
                self.label(member.service, member.desired);
                results[member.index] = Some(Ok(ops));
                continue;
            }
            let undone = self.undo(member.service, &member.plans, &written);
            let own = (failed_member == Some(i)).then(|| source.take()).flatten();
            let result = match (undone, own) {
                (Ok(()), Some(source)) => Err(ReconcileError::Map {
                    service: member.service.clone(),
                    source,
                }),
                (Ok(()), None) => {
                    again.push(member);
                    continue;
                }
                (Err(rollback), own) => Err(ReconcileError::RollbackFailed {
                    service: member.service.clone(),
                    source: own.unwrap_or_else(|| another_failed(&member.plans)),
                    rollback,
                }),
            };
            self.label(member.service, member.desired);
            results[member.index] = Some(result);
        }
        // Undone whole, through no fault of their own: alone now.
        for member in again {
            results[member.index] = Some(self.sync_service(member.service, member.desired));
        }
    }
}

/// Every member's ops, stably sorted by phase, and for each the member and
/// plan it comes from.
///
/// A pass per phase, into vectors sized once: a group's ops (thousands) were
/// pushed into one growing vector per phase before, and the copies and fresh
/// pages of their growth showed in profiles.
fn merge(members: &[Member<'_>]) -> (Vec<MapOp>, Vec<(usize, usize)>) {
    let plans = || {
        members.iter().enumerate().flat_map(|(m, member)| {
            member
                .plans
                .iter()
                .enumerate()
                .map(move |(p, plan)| (m, p, plan))
        })
    };
    debug_assert!(
        plans().all(|(_, _, plan)| plan.ops.windows(2).all(|w| phase(&w[0]) <= phase(&w[1]))),
        "a plan's ops come in phase order"
    );
    let total = plans().map(|(_, _, plan)| plan.ops.len()).sum();
    let mut ops = Vec::with_capacity(total);
    let mut owners = Vec::with_capacity(total);
    for now in 0..=LAST_PHASE {
        for (m, p, plan) in plans() {
            for op in plan.ops.iter().filter(|op| phase(op) == now) {
                ops.push(op.clone());
                owners.push((m, p));
            }
        }
    }
    debug_assert_eq!(ops.len(), total, "every op has a phase up to LAST_PHASE");
    (ops, owners)
}

/// The error a member reports whose own writes did not fail, when undoing
/// them did: the failure was another member's.
fn another_failed(plans: &[Plan]) -> MapError {
    let map = plans
        .iter()
        .flat_map(|p| p.ops.first())
        .map(MapOp::map)
        .next()
        .unwrap_or(MapName::Services);
    MapError::Write {
        map,
        source: std::io::Error::other("a write of another Service in the same batch failed"),
    }
}
