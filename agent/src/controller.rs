//! The loop between sources and the reconciler: changes go into the store, every
//! Service they touch is synced, and failures are retried without a storm of
//! identical log lines.
use std::{
    collections::BTreeSet,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use crate::hash::{HashMap, HashSet};
use crate::{
    healthcheck::HealthChecks,
    maps::LbMaps,
    model::{DesiredFrontend, Protocol, Scope, ServiceId, SliceId},
    reconciler::{ReconcileError, Reconciler},
    report::{Reason, Report, Reports, Stage},
    sockdestroy::{SocketReaper, UdpPair},
    source::SourceMsg,
    store::{Change, DesiredService, NoLocalEndpoints, Rejected, Store, StoreError},
    telemetry::{
        Health, Metrics,
        metrics::{KindLabel, MapLabel, ReasonLabel},
    },
};

/// Where the controller reports how it is doing. The defaults observe into
/// metrics nobody serves, which is what unit tests want.
#[derive(Clone)]
pub struct Hooks {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub reports: Reports,
    /// healthCheckNodePort listeners of eTP=Local LoadBalancer Services.
    pub health_checks: Arc<HealthChecks>,
    /// Destroys connected UDP sockets of backends a sync removed.
    pub sockets: Arc<SocketReaper>,
}

impl Default for Hooks {
    fn default() -> Self {
        Self {
            metrics: Arc::default(),
            health: Arc::new(Health::new(Duration::from_secs(60))),
            reports: Reports::none(),
            health_checks: Arc::default(),
            sockets: Arc::default(),
        }
    }
}

const RETRY: Duration = Duration::from_secs(2);
/// A sync of at least this many Services hands what it left free back to
/// the kernel (see `heap::tune`): a relist or a rewritten manifest
/// directory should not leave the agent's resident size at its peak.
const RELEASE_AFTER: usize = 1024;
/// A sync of at least this many Services writes the backends array through
/// one mapping (see `maps::array`); mapping it costs about a millisecond at
/// a million backends, so single changes do without.
const BULK: usize = 256;
/// Services handed to the reconciler at once in a bulk sync: those it can
/// write together share each batch (see `reconciler::group`).
const GROUP: usize = 512;

pub struct Controller<M> {
    store: Store,
    reconciler: Reconciler<M>,
    failed: BTreeSet<ServiceId>,
    /// Services whose last sync failed because the kernel refused a map
    /// write. Only these hold the agent's health down: a Service that is
    /// invalid, conflicts with another or does not fit is that Service's
    /// problem (an Event and metrics say so), and a tenant must not be able
    /// to take every node out of its load balancers by creating one.
    broken: BTreeSet<ServiceId>,
    /// The failure each failing Service was last reported for
    /// ([`ReconcileError::identity`], else the message).
    last_error: HashMap<ServiceId, String>,
    synced: bool,
    /// Services changed before the source's first complete view, synced
    /// together once it arrives.
    held: BTreeSet<ServiceId>,
    /// Nothing was restored from the maps: until the first complete view,
    /// Services are synced as their slices come (see [`Self::run`]).
    cold_start: bool,
    /// Map writes until the first full sync: zero after a restart that found
    /// the maps already right.
    initial_ops: usize,
    /// EndpointSlice trigger times of changes not yet in the maps.
    triggers: HashMap<ServiceId, Vec<SystemTime>>,
    /// The store's last rejection of each Service, to log and report it once.
    rejected: HashMap<ServiceId, String>,
    /// The frontends the store last kept from each Service (another Service
    /// serves them), as one message, to log and report it once.
    refused: HashMap<ServiceId, String>,
    /// Services with a healthCheckNodePort listener.
    health_checked: HashSet<ServiceId>,
    /// The UDP (frontend, backend) pairs each Service served after its last
    /// successful sync: the pairs a sync drops have sockets to destroy.
    udp_pairs: HashMap<ServiceId, BTreeSet<UdpPair>>,
    /// How many Services' sets in `udp_pairs` hold each pair: a frontend
    /// that moves from a deleted Service to a new one in one batch keeps
    /// its sockets to the backends both have.
    udp_refs: HashMap<UdpPair, usize>,
    /// Services and slices changed since the last sync that left nothing
    /// held back (kube-proxy's pending changes).
    pending_services: HashSet<ServiceId>,
    pending_slices: HashSet<SliceId>,
    /// Each Service's ports without a local endpoint under a Local policy,
    /// and their sum, kept as Services sync rather than recounted.
    no_local: HashMap<ServiceId, NoLocalEndpoints>,
    no_local_sum: NoLocalEndpoints,
    hooks: Hooks,
}

impl<M: LbMaps> Controller<M> {
    pub fn new(reconciler: Reconciler<M>, store: Store, hooks: Hooks) -> Self {
        let cold_start = reconciler.frontend_count() == 0;
        let this = Self {
            store,
            reconciler,
            failed: BTreeSet::new(),
            broken: BTreeSet::new(),
            last_error: HashMap::default(),
            synced: false,
            held: BTreeSet::new(),
            cold_start,
            initial_ops: 0,
            triggers: HashMap::default(),
            rejected: HashMap::default(),
            refused: HashMap::default(),
            health_checked: HashSet::default(),
            udp_pairs: HashMap::default(),
            udp_refs: HashMap::default(),
            pending_services: HashSet::default(),
            pending_slices: HashSet::default(),
            no_local: HashMap::default(),
            no_local_sum: NoLocalEndpoints::default(),
            hooks,
        };
        this.publish_gauges();
        this
    }

    /// Runs until every source is gone or `shutdown` resolves.
    pub async fn run(
        &mut self,
        mut rx: mpsc::Receiver<SourceMsg>,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        let mut retry = tokio::time::interval(RETRY);
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // A cold start's held Services are not rechecked on every
            // message: the change that completes one (its slice or the
            // Service itself) marks it dirty again.
            let mut dirty = if self.synced || !self.cold_start {
                std::mem::take(&mut self.held)
            } else {
                BTreeSet::new()
            };
            tokio::select! {
                () = &mut shutdown => return,
                msg = rx.recv() => {
                    let Some(msg) = msg else { return };
                    self.handle(msg, &mut dirty);
                    while let Ok(msg) = rx.try_recv() {
                        self.handle(msg, &mut dirty);
                    }
                }
                _ = retry.tick(), if !self.failed.is_empty() => {
                    dirty.extend(self.failed.iter().cloned());
                }
            }
            // Until the source's first complete view, what it sent is only
            // part of it: a paginated list delivers every Service before
            // their slices, and syncing then would give each Service a
            // master without backends until its slice came (a restart
            // would refuse every connection for seconds). kube-proxy waits
            // for both informers in the same way.
            //
            // When nothing was restored, though, nothing serves yet that a
            // partial view could break, and a Service whose slices have come
            // is programmed while the rest is still being listed: the sync
            // then overlaps the list instead of following it. Services
            // without a slice yet wait, or most would be written twice.
            if self.synced {
                self.sync(dirty);
            } else if self.cold_start {
                let mut now = BTreeSet::new();
                for id in dirty {
                    if self.store.has_service_and_slices(&id) {
                        self.held.remove(&id);
                        now.insert(id);
                    } else {
                        self.held.insert(id);
                    }
                }
                // Health waits for the complete view.
                self.sync_quietly(now);
            } else {
                self.held = dirty;
            }
        }
    }

    /// Applies one source message; exposed for tests that drive the loop by hand.
    pub fn handle(&mut self, msg: SourceMsg, dirty: &mut BTreeSet<ServiceId>) {
        match msg {
            SourceMsg::Changes(changes) => {
                self.hooks.health.queued();
                for c in changes {
                    self.count_change(&c);
                    self.store.apply(c, dirty);
                }
                let kp = &self.hooks.metrics.kube_proxy;
                kp.last_queued.set(unix_now());
                self.publish_pending();
            }
            SourceMsg::Triggers(triggers) => {
                for (id, t) in triggers {
                    self.triggers.entry(id).or_default().push(t);
                }
            }
            SourceMsg::Synced { complete } => {
                // Sync what is pending first, so restored frontends get claimed
                // before the unclaimed ones are pruned.
                dirty.append(&mut self.held);
                self.sync(std::mem::take(dirty));
                // An empty source syncs nothing, and is still in sync.
                self.hooks.health.updated(self.broken.is_empty());
                let removed = self.prune_stale(complete);
                if !self.synced {
                    self.synced = true;
                    self.reconciler.bulk(false);
                    crate::heap::release_free_memory();
                    info!(
                        services = self.store.service_count(),
                        frontends = self.reconciler.frontend_count(),
                        map_ops = self.initial_ops,
                        stale_removed = removed,
                        "initial sync complete"
                    );
                } else if removed > 0 {
                    info!(
                        removed,
                        "removed frontends of Services deleted while the agent was away"
                    );
                }
            }
        }
    }

    /// Removes restored frontends nobody claimed, once the source's view is
    /// complete; returns how many went.
    fn prune_stale(&mut self, complete: bool) -> usize {
        let stale = self.reconciler.unclaimed();
        if stale == 0 {
            return 0;
        }
        if !complete {
            warn!(
                frontends = stale,
                "keeping frontends restored from the maps that no Service claims yet: some manifests failed to load and may be what claims them; they are removed once every manifest loads"
            );
            return 0;
        }
        for (fe, e) in self.reconciler.prune_unclaimed() {
            warn!(frontend = %fe, "cannot remove stale frontend: {}", chain(&e));
        }
        self.reconciler.flush_labels();
        stale - self.reconciler.unclaimed()
    }

    pub fn sync(&mut self, dirty: BTreeSet<ServiceId>) {
        let n = dirty.len();
        if self.sync_quietly(dirty) {
            self.hooks.health.updated(self.broken.is_empty());
            // The first complete view's handler frees memory itself.
            if n >= RELEASE_AFTER && self.synced {
                crate::heap::release_free_memory();
            }
        }
    }

    /// Syncs `dirty` and updates the metrics; false if there was nothing.
    fn sync_quietly(&mut self, dirty: BTreeSet<ServiceId>) -> bool {
        if dirty.is_empty() {
            return false;
        }
        let start = Instant::now();
        let n = dirty.len();
        let mut ops = 0;
        // A frontend moving between Services in one batch (a node port handed
        // to the older Service, an address taken over) conflicts until its
        // old owner has synced; those get a second try at the end of the
        // batch instead of an error and a retry two seconds later.
        let mut conflicted = Vec::new();
        // Before the first complete view every sync is one of a series (a
        // cold start syncs a list as it arrives, in batches of a few
        // hundred Services down to one): all go through groups, and the
        // backends array stays mapped until the Synced handler lets go.
        // Services synced one at a time had cost about five times as much
        // each (perf, 100k Services from the API server).
        let bulk = n >= BULK || !self.synced;
        if bulk {
            self.reconciler.bulk(true);
            // New Services are written a group at a time (see
            // `reconciler::group`); the results are the same.
            let ids: Vec<ServiceId> = dirty.into_iter().collect();
            for group in ids.chunks(GROUP) {
                let desired: Vec<DesiredService> =
                    group.iter().map(|id| self.prepare(id)).collect();
                let items: Vec<(&ServiceId, &[DesiredFrontend])> = group
                    .iter()
                    .zip(&desired)
                    .map(|(id, d)| (id, d.frontends.as_slice()))
                    .collect();
                let results = self.reconciler.sync_services(&items);
                for ((id, d), r) in group.iter().zip(&desired).zip(results) {
                    match self.finish(id, d, r, false) {
                        Some(done) => ops += done,
                        None => conflicted.push(id.clone()),
                    }
                }
            }
        } else {
            for id in dirty {
                match self.sync_one(&id, false) {
                    Some(done) => ops += done,
                    None => conflicted.push(id),
                }
            }
        }
        for id in conflicted {
            ops += self.sync_one(&id, true).unwrap_or(0);
        }
        self.reconciler.flush_labels();
        if bulk && self.synced {
            self.reconciler.bulk(false);
        }
        if !self.synced {
            self.initial_ops += ops;
        }
        let m = &self.hooks.metrics;
        m.observe_sync(start.elapsed().as_secs_f64(), !self.synced);
        m.map_ops.inc_by(ops as u64);
        m.last_sync.set(unix_now());
        if self.held.is_empty() {
            self.pending_services.clear();
            self.pending_slices.clear();
        }
        self.publish_pending();
        self.publish_gauges();
        debug!(
            services = n,
            map_ops = ops,
            elapsed_us = start.elapsed().as_micros() as u64,
            "synced"
        );
        true
    }

    /// Syncs one Service and returns the map writes it took. `None` (nothing
    /// reported or recorded) when it conflicts with another Service's frontend
    /// and `last_try` is false.
    fn sync_one(&mut self, id: &ServiceId, last_try: bool) -> Option<usize> {
        let desired = self.prepare(id);
        let result = self.reconciler.sync_service(id, &desired.frontends);
        self.finish(id, &desired, result, last_try)
    }

    /// What `id` should look like, with what the store says about it
    /// reported: the first half of [`Self::sync_one`].
    fn prepare(&mut self, id: &ServiceId) -> DesiredService {
        // A rejected Service is skipped: it loses its frontends, as if it
        // were deleted, until it is fixed.
        let desired = match self.store.desired(id) {
            Ok(d) => {
                self.accepted(id);
                self.frontends_refused(id, &d.refused);
                d
            }
            Err(r) => {
                self.reject(r);
                // Rejected as a whole: no frontend of it is refused any more.
                self.frontends_refused(id, &[]);
                DesiredService::default()
            }
        };
        self.set_no_local(id, desired.no_local);
        desired
    }

    /// Records how writing `desired` for `id` went: the second half of
    /// [`Self::sync_one`].
    fn finish(
        &mut self,
        id: &ServiceId,
        desired: &DesiredService,
        result: Result<usize, ReconcileError>,
        last_try: bool,
    ) -> Option<usize> {
        match result {
            Ok(done) => {
                self.failed.remove(id);
                self.broken.remove(id);
                self.programmed(id);
                self.after_programmed(id, desired);
                if self.last_error.remove(id).is_some() {
                    info!(service = %id, "service programmed after earlier failure");
                    self.hooks.reports.send(Report::Recovered {
                        service: id.clone(),
                        stage: Stage::Programming,
                    });
                }
                Some(done)
            }
            Err(ReconcileError::FrontendConflict { .. }) if !last_try => None,
            Err(e) => {
                let msg = chain(&e);
                let reason = reason(&e);
                if e.is_node_fault() {
                    self.broken.insert(id.clone());
                } else {
                    self.broken.remove(id);
                }
                let identity = e.identity().unwrap_or_else(|| msg.clone());
                if self.last_error.get(id) == Some(&identity) {
                    debug!(service = %id, "still failing: {msg}");
                } else {
                    error!(service = %id, "{msg}");
                    self.count_failure(&e, reason);
                    self.hooks.reports.send(Report::Failed {
                        service: id.clone(),
                        reason,
                        message: msg,
                    });
                    self.last_error.insert(id.clone(), identity);
                }
                if e.is_transient() {
                    self.failed.insert(id.clone());
                } else {
                    // Nothing will change until the Service does.
                    self.triggers.remove(id);
                }
                Some(0)
            }
        }
    }

    /// A Service's changes are in the maps: its pending trigger times become
    /// network programming latencies.
    fn programmed(&mut self, id: &ServiceId) {
        if let Some(times) = self.triggers.remove(id) {
            let now = SystemTime::now();
            for t in times {
                if let Ok(d) = now.duration_since(t) {
                    self.hooks
                        .metrics
                        .network_programming
                        .observe(d.as_secs_f64());
                }
            }
        }
    }

    /// Logs, counts and reports a rejection once per distinct message.
    fn reject(&mut self, r: Rejected) {
        let msg = r.to_string();
        if self.rejected.get(&r.service) == Some(&msg) {
            return;
        }
        warn!(service = %r.service, "invalid Service, not programmed: {msg}");
        self.hooks
            .metrics
            .invalid_objects
            .get_or_create(&KindLabel {
                kind: "Service".into(),
            })
            .inc();
        self.hooks.reports.send(Report::Failed {
            service: r.service.clone(),
            reason: Reason::InvalidService,
            message: msg.clone(),
        });
        self.rejected.insert(r.service, msg);
    }

    /// Logs, counts and reports the frontends another Service keeps from
    /// `id` once per distinct set, and withdraws the report when none are
    /// left. The Service's other frontends are programmed all the same.
    fn frontends_refused(&mut self, id: &ServiceId, refused: &[StoreError]) {
        if refused.is_empty() {
            if self.refused.remove(id).is_some() {
                info!(service = %id, "every frontend of the service is its own again");
                self.hooks.reports.send(Report::Recovered {
                    service: id.clone(),
                    stage: Stage::Frontends,
                });
            }
            return;
        }
        let msg = format!(
            "service {id}: {}",
            refused
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        );
        if self.refused.get(id) == Some(&msg) {
            return;
        }
        warn!(service = %id, "frontends not programmed: {msg}");
        self.hooks
            .metrics
            .sync_errors
            .get_or_create(&ReasonLabel {
                reason: Reason::FrontendRefused.as_str().into(),
            })
            .inc();
        self.hooks.reports.send(Report::Failed {
            service: id.clone(),
            reason: Reason::FrontendRefused,
            message: msg.clone(),
        });
        self.refused.insert(id.clone(), msg);
    }

    fn accepted(&mut self, id: &ServiceId) {
        if self.rejected.remove(id).is_some() {
            info!(service = %id, "service valid again");
            self.hooks.reports.send(Report::Recovered {
                service: id.clone(),
                stage: Stage::Validation,
            });
        }
    }

    /// What follows a Service's successful programming: its health-check
    /// listener, and destroying UDP sockets of backends it no longer has
    /// (a connected UDP socket never passes the socket hooks again).
    fn after_programmed(&mut self, id: &ServiceId, desired: &DesiredService) {
        if let Some(hc) = desired.health_check {
            self.hooks
                .health_checks
                .set(id, hc.node_port, hc.local_endpoints);
            self.health_checked.insert(id.clone());
        } else if self.health_checked.remove(id) {
            self.hooks.health_checks.remove(id);
        }

        let gone = self.udp_pairs_gone(id, desired);
        if !gone.is_empty() {
            debug!(service = %id, pairs = gone.len(), "UDP backends removed");
            self.hooks.sockets.backends_removed(gone);
        }
    }

    /// Records the UDP (frontend, backend) pairs `desired` serves (active or
    /// terminating backends; draining ones do not count) and returns the
    /// ones the Service served before and does not now. Sockets are reaped
    /// per frontend, as kube-proxy clears conntrack per (ClusterIP,
    /// endpoint): a backend that Service B still lists does not keep Service
    /// A's sockets on it once A dropped it. Only the scope the socket hooks
    /// read counts: an eTP=Local node port that loses a remote backend from
    /// its external view still serves in-cluster sockets with it.
    fn udp_pairs_gone(&mut self, id: &ServiceId, desired: &DesiredService) -> Vec<UdpPair> {
        let now: BTreeSet<UdpPair> = desired
            .frontends
            .iter()
            .filter(|d| d.frontend.proto == Protocol::Udp && d.frontend.scope == Scope::All)
            .flat_map(|d| {
                let frontend = SocketAddr::new(d.frontend.addr, d.frontend.port);
                d.backends
                    .iter()
                    // A draining backend is gone for UDP sockets: the socket
                    // hooks pin new ones only to serving backends, and a
                    // connected socket to a pod that stopped serving should
                    // move on.
                    .filter(|b| b.state.serves())
                    .map(move |b| UdpPair {
                        frontend,
                        backend: SocketAddr::new(b.addr, b.port),
                    })
            })
            .collect();
        let before = if now.is_empty() {
            self.udp_pairs.remove(id)
        } else {
            self.udp_pairs.insert(id.clone(), now.clone())
        }
        .unwrap_or_default();
        for added in now.difference(&before) {
            *self.udp_refs.entry(*added).or_default() += 1;
        }
        let mut gone = Vec::new();
        for removed in before.difference(&now) {
            if let Some(n) = self.udp_refs.get_mut(removed) {
                *n -= 1;
                if *n == 0 {
                    self.udp_refs.remove(removed);
                    gone.push(*removed);
                }
            }
        }
        gone
    }

    fn count_failure(&self, e: &ReconcileError, reason: Reason) {
        let m = &self.hooks.metrics;
        m.sync_errors
            .get_or_create(&ReasonLabel {
                reason: reason.as_str().into(),
            })
            .inc();
        if let ReconcileError::MapFull { map, .. } = e {
            m.map_full.get_or_create(&MapLabel::of(*map)).inc();
        }
    }

    /// kube-proxy counts every Service and EndpointSlice event it is
    /// handed, changed or not.
    fn count_change(&mut self, c: &Change) {
        let kp = &self.hooks.metrics.kube_proxy;
        match c {
            Change::UpsertService(spec) => {
                kp.service_changes.inc();
                self.pending_services.insert(spec.id.clone());
            }
            Change::DeleteService(id) => {
                kp.service_changes.inc();
                self.pending_services.insert(id.clone());
            }
            Change::UpsertSlice(spec) => {
                kp.endpoint_changes.inc();
                self.pending_slices.insert(spec.id.clone());
            }
            Change::DeleteSlice(id) => {
                kp.endpoint_changes.inc();
                self.pending_slices.insert(id.clone());
            }
            Change::Node(_) | Change::NodeAddresses(_) => {}
        }
    }

    fn publish_pending(&self) {
        let kp = &self.hooks.metrics.kube_proxy;
        let n = |len: usize| i64::try_from(len).unwrap_or(i64::MAX);
        kp.service_changes_pending
            .set(n(self.pending_services.len()));
        kp.endpoint_changes_pending
            .set(n(self.pending_slices.len()));
    }

    fn set_no_local(&mut self, id: &ServiceId, now: NoLocalEndpoints) {
        let before = if now == NoLocalEndpoints::default() {
            self.no_local.remove(id)
        } else {
            self.no_local.insert(id.clone(), now)
        }
        .unwrap_or_default();
        if before == now {
            return;
        }
        let sum = &mut self.no_local_sum;
        sum.internal = sum.internal - before.internal + now.internal;
        sum.external = sum.external - before.external + now.external;
    }

    fn publish_gauges(&self) {
        let m = &self.hooks.metrics;
        m.kube_proxy.set_no_local_endpoints(
            self.no_local_sum.internal as usize,
            self.no_local_sum.external as usize,
        );
        m.services
            .set(i64::try_from(self.store.service_count()).unwrap_or(i64::MAX));
        m.frontends
            .set(i64::try_from(self.reconciler.frontend_count()).unwrap_or(i64::MAX));
        for (map, used, cap) in self.reconciler.usage() {
            if map == crate::maps::MapName::Backends {
                m.backends.set(i64::try_from(used).unwrap_or(i64::MAX));
            }
            m.set_map_usage(map, used, cap);
        }
    }
}

fn unix_now() -> f64 {
    crate::telemetry::status::unix(SystemTime::now())
}

fn reason(e: &ReconcileError) -> Reason {
    match e {
        ReconcileError::MapFull { .. } => Reason::MapFull,
        ReconcileError::FrontendConflict { .. } => Reason::FrontendConflict,
        ReconcileError::TooManyBackends { .. } => Reason::TooManyBackends,
        ReconcileError::Map { .. } | ReconcileError::RollbackFailed { .. } => {
            Reason::ProgrammingFailed
        }
    }
}

/// An error and its causes on one line, for logs.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests;
