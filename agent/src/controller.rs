//! The loop between sources and the reconciler: changes go into the store, every
//! Service they touch is synced, and failures are retried without a storm of
//! identical log lines.
use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use crate::{
    maps::LbMaps,
    model::ServiceId,
    reconciler::{ReconcileError, Reconciler},
    report::{Reason, Report, Reports, Stage},
    source::SourceMsg,
    store::Store,
    telemetry::{
        Health, Metrics,
        metrics::{MapLabel, ReasonLabel},
    },
};

/// Where the controller reports how it is doing. The defaults observe into
/// metrics nobody serves, which is what unit tests want.
#[derive(Clone)]
pub struct Hooks {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub reports: Reports,
}

impl Default for Hooks {
    fn default() -> Self {
        Self {
            metrics: Arc::default(),
            health: Arc::new(Health::new(Duration::from_secs(60))),
            reports: Reports::none(),
        }
    }
}

const RETRY: Duration = Duration::from_secs(2);

pub struct Controller<M> {
    store: Store,
    reconciler: Reconciler<M>,
    failed: BTreeSet<ServiceId>,
    last_error: HashMap<ServiceId, String>,
    synced: bool,
    /// Map writes until the first full sync: zero after a restart that found
    /// the maps already right.
    initial_ops: usize,
    /// EndpointSlice trigger times of changes not yet in the maps.
    triggers: HashMap<ServiceId, Vec<SystemTime>>,
    hooks: Hooks,
}

impl<M: LbMaps> Controller<M> {
    pub fn new(reconciler: Reconciler<M>, store: Store, hooks: Hooks) -> Self {
        let this = Self {
            store,
            reconciler,
            failed: BTreeSet::new(),
            last_error: HashMap::new(),
            synced: false,
            initial_ops: 0,
            triggers: HashMap::new(),
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
            let mut dirty = BTreeSet::new();
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
            self.sync(dirty);
        }
    }

    /// Applies one source message; exposed for tests that drive the loop by hand.
    pub fn handle(&mut self, msg: SourceMsg, dirty: &mut BTreeSet<ServiceId>) {
        match msg {
            SourceMsg::Changes(changes) => {
                self.hooks.health.queued();
                for c in changes {
                    self.store.apply(c, dirty);
                }
            }
            SourceMsg::Triggers(triggers) => {
                for (id, t) in triggers {
                    self.triggers.entry(id).or_default().push(t);
                }
            }
            SourceMsg::Synced { complete } => {
                // Sync what is pending first, so restored frontends get claimed
                // before the unclaimed ones are pruned.
                self.sync(std::mem::take(dirty));
                // An empty source syncs nothing, and is still in sync.
                self.hooks.health.updated(self.failed.is_empty());
                let removed = self.prune_stale(complete);
                if !self.synced {
                    self.synced = true;
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
        stale - self.reconciler.unclaimed()
    }

    pub fn sync(&mut self, dirty: BTreeSet<ServiceId>) {
        if dirty.is_empty() {
            return;
        }
        let start = Instant::now();
        let n = dirty.len();
        let mut ops = 0;
        for id in dirty {
            let desired = self.store.frontends(&id);
            match self.reconciler.sync_service(&id, &desired) {
                Ok(done) => {
                    ops += done;
                    self.failed.remove(&id);
                    self.programmed(&id);
                    if self.last_error.remove(&id).is_some() {
                        info!(service = %id, "service programmed after earlier failure");
                        self.hooks.reports.send(Report::Recovered {
                            service: id,
                            stage: Stage::Programming,
                        });
                    }
                }
                Err(e) => {
                    let msg = chain(&e);
                    let reason = reason(&e);
                    if self.last_error.get(&id) == Some(&msg) {
                        debug!(service = %id, "still failing: {msg}");
                    } else {
                        error!(service = %id, "{msg}");
                        self.count_failure(&e, reason);
                        self.hooks.reports.send(Report::Failed {
                            service: id.clone(),
                            reason,
                            message: msg.clone(),
                        });
                        self.last_error.insert(id.clone(), msg);
                    }
                    if e.is_transient() {
                        self.failed.insert(id);
                    } else {
                        // Nothing will change until the Service does.
                        self.triggers.remove(&id);
                    }
                }
            }
        }
        if !self.synced {
            self.initial_ops += ops;
        }
        let m = &self.hooks.metrics;
        m.sync_duration.observe(start.elapsed().as_secs_f64());
        m.map_ops.inc_by(ops as u64);
        m.last_sync.set(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        );
        self.publish_gauges();
        self.hooks.health.updated(self.failed.is_empty());
        debug!(
            services = n,
            map_ops = ops,
            elapsed_us = start.elapsed().as_micros() as u64,
            "synced"
        );
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

    fn publish_gauges(&self) {
        let m = &self.hooks.metrics;
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
