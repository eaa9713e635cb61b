//! The loop between sources and the reconciler: changes go into the store, every
//! Service they touch is synced, and failures are retried without a storm of
//! identical log lines.
use std::{
    collections::{BTreeSet, HashMap},
    time::{Duration, Instant},
};

use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use crate::{
    maps::LbMaps, model::ServiceId, reconciler::Reconciler, source::SourceMsg, store::Store,
};

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
}

impl<M: LbMaps> Controller<M> {
    pub fn new(reconciler: Reconciler<M>) -> Self {
        Self {
            store: Store::default(),
            reconciler,
            failed: BTreeSet::new(),
            last_error: HashMap::new(),
            synced: false,
            initial_ops: 0,
        }
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
                for c in changes {
                    self.store.apply(c, dirty);
                }
            }
            SourceMsg::Synced { complete } => {
                // Sync what is pending first, so restored frontends get claimed
                // before the unclaimed ones are pruned.
                self.sync(std::mem::take(dirty));
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
                    if self.last_error.remove(&id).is_some() {
                        info!(service = %id, "service programmed after earlier failure");
                    }
                }
                Err(e) => {
                    let msg = chain(&e);
                    if self.last_error.get(&id) == Some(&msg) {
                        debug!(service = %id, "still failing: {msg}");
                    } else {
                        error!(service = %id, "{msg}");
                        self.last_error.insert(id.clone(), msg);
                    }
                    if e.is_transient() {
                        self.failed.insert(id);
                    }
                }
            }
        }
        if !self.synced {
            self.initial_ops += ops;
        }
        debug!(
            services = n,
            map_ops = ops,
            elapsed_us = start.elapsed().as_micros() as u64,
            "synced"
        );
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
