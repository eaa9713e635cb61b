//! Reconnecting within a second of the API server answering again.
//!
//! Each watcher keeps kube's own backoff (0.8 s doubling to 30 s, plus up to
//! as much again as jitter, like client-go's reflector). After half a minute
//! of outage that backoff sleeps 30 s to a minute, so on its own a watcher would notice
//! the API server's return late, and the three watchers at three different
//! times. A watcher whose request got no answer (refused, reset, timed out,
//! or a 5xx) therefore also wakes when one shared probe sees `/readyz` answer.
//! The probe runs only while such a watcher waits, every 250–500 ms with
//! jitter so that a fleet of agents does not probe in step. `/readyz` is the
//! cheapest request a recovering API server serves, and the one that says it
//! can serve lists again.
//!
//! Only outages are cut short. A watcher that is refused (403), told to slow
//! down (429) or cannot decode an answer keeps its backoff: `/readyz`
//! answering says nothing about those. A `410 Gone` relists at once, as the
//! reflector does. A watcher wakes early at most [`EARLY_WAKES`] times until
//! it gets an event again: enough for a pooled connection that died with the
//! old server, and a server whose `/readyz` answers while its watches keep
//! failing cannot turn the probe into a retry loop.
use std::{future::Future, ops::Range, sync::Arc, time::Duration};

use kube::{
    Client,
    runtime::{utils::Backoff as _, watcher},
};
use tokio::sync::watch;

/// How often the probe asks while a watcher waits on an outage.
const PROBE_EVERY: Range<Duration> = Duration::from_millis(250)..Duration::from_millis(500);
/// A probe that takes longer is a server that is not back yet.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Early wakes a watcher may take between two events.
const EARLY_WAKES: u8 = 3;

/// What a watcher's failure says about the API server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// No answer: the connection failed, or the server is not serving (5xx).
    Unreachable,
    /// `410 Gone`: the watcher's resourceVersion is too old; it relists.
    Gone,
    /// The server answered, and what it said does not change with `/readyz`.
    Answered,
}

pub fn classify(e: &watcher::Error) -> Failure {
    use watcher::Error as W;
    let client = match e {
        W::InitialListFailed(c) | W::WatchStartFailed(c) | W::WatchFailed(c) => c,
        W::WatchError(status) => return of_status(status.code),
        W::NoResourceVersion => return Failure::Answered,
    };
    match client {
        kube::Error::Api(status) => of_status(status.code),
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            Failure::Unreachable
        }
        _ => Failure::Answered,
    }
}

fn of_status(code: u16) -> Failure {
    match code {
        410 => Failure::Gone,
        500..=599 => Failure::Unreachable,
        _ => Failure::Answered,
    }
}

/// How a failed watcher waits before its next request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wait {
    Now,
    BackoffOrAnswer,
    Backoff,
}

fn wait_for(failure: Failure, may_wake_early: bool) -> Wait {
    match (failure, may_wake_early) {
        (_, false) | (Failure::Answered, _) => Wait::Backoff,
        (Failure::Gone, true) => Wait::Now,
        (Failure::Unreachable, true) => Wait::BackoffOrAnswer,
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Phase {
    /// Watchers waiting on an outage; the probe runs while there are any.
    waiters: usize,
    /// Bumped each time the probe sees the API server answer.
    answered: u64,
}

/// Shared by the watchers and the probe.
#[derive(Clone)]
pub struct Outage(Arc<watch::Sender<Phase>>);

impl Default for Outage {
    fn default() -> Self {
        Self(Arc::new(watch::Sender::new(Phase::default())))
    }
}

impl Outage {
    /// Probes while watchers wait on an outage, and wakes them all when it
    /// sees an answer. Runs until the task is dropped.
    pub async fn probe<F, Fut>(&self, mut answers: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let mut rx = self.0.subscribe();
        loop {
            if rx.wait_for(|p| p.waiters > 0).await.is_err() {
                return;
            }
            loop {
                let every = PROBE_EVERY.start
                    + (PROBE_EVERY.end - PROBE_EVERY.start).mul_f64(fastrand::f64());
                tokio::time::sleep(every).await;
                if self.0.borrow().waiters == 0 {
                    break;
                }
                if answers().await {
                    self.0.send_modify(|p| p.answered += 1);
                    break;
                }
            }
        }
    }

    /// Sleeps `delay`, or less if the probe sees the API server answer;
    /// true when it did.
    async fn sleep_or_answer(&self, delay: Duration) -> bool {
        struct Waiting<'a>(&'a watch::Sender<Phase>);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.send_modify(|p| p.waiters -= 1);
            }
        }
        let mut rx = self.0.subscribe();
        let seen = rx.borrow_and_update().answered;
        self.0.send_modify(|p| p.waiters += 1);
        let _waiting = Waiting(&self.0);
        tokio::select! {
            () = tokio::time::sleep(delay) => false,
            r = rx.wait_for(|p| p.answered != seen) => r.is_ok(),
        }
    }
}

/// Whether the API server answers `/readyz`. A 401 or 403 is an answer too:
/// the server is serving, and the watchers' own requests tell the rest.
pub async fn readyz(client: &Client) -> bool {
    let Ok(req) = http::Request::get("/readyz").body(kube::client::Body::empty()) else {
        return false;
    };
    match tokio::time::timeout(PROBE_TIMEOUT, client.send(req)).await {
        Ok(Ok(resp)) => matches!(resp.status().as_u16(), 200 | 401 | 403),
        _ => false,
    }
}

/// One watcher's retry state.
pub struct Retry {
    backoff: watcher::DefaultBackoff,
    early_wakes_left: u8,
    outage: Outage,
}

impl Retry {
    pub fn new(outage: Outage) -> Self {
        Self {
            backoff: watcher::DefaultBackoff::default(),
            early_wakes_left: EARLY_WAKES,
            outage,
        }
    }

    /// The watcher delivered an event: the next failure starts afresh.
    pub fn succeeded(&mut self) {
        self.backoff.reset();
        self.early_wakes_left = EARLY_WAKES;
    }

    /// Waits before the request that follows `failure`.
    pub async fn failed(&mut self, failure: Failure) {
        // Never None: kube's default backoff has no retry limit.
        let delay = self.backoff.next().unwrap_or(Duration::from_secs(30));
        let woke_early = match wait_for(failure, self.early_wakes_left > 0) {
            Wait::Now => true,
            Wait::Backoff => {
                tokio::time::sleep(delay).await;
                false
            }
            Wait::BackoffOrAnswer => self.outage.sleep_or_answer(delay).await,
        };
        if woke_early {
            self.early_wakes_left -= 1;
        }
    }
}

#[cfg(test)]
mod tests;
