use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use kube::core::Status;
use tokio::time::Instant;

use super::*;

fn status(code: u16) -> Box<Status> {
    Box::new(Status::failure("test", "Test").with_code(code))
}

#[test]
fn failures_are_classified_by_whether_the_server_answered() {
    use watcher::Error as W;
    let refused = || kube::Error::Service("connection refused".into());
    let cases = [
        (W::InitialListFailed(refused()), Failure::Unreachable),
        (W::WatchStartFailed(refused()), Failure::Unreachable),
        (
            W::WatchFailed(kube::Error::ReadEvents(std::io::Error::other("reset"))),
            Failure::Unreachable,
        ),
        (
            W::InitialListFailed(kube::Error::Api(status(503))),
            Failure::Unreachable,
        ),
        (W::WatchError(status(410)), Failure::Gone),
        (
            W::WatchStartFailed(kube::Error::Api(status(410))),
            Failure::Gone,
        ),
        (
            W::InitialListFailed(kube::Error::Api(status(403))),
            Failure::Answered,
        ),
        (W::WatchError(status(429)), Failure::Answered),
        (
            W::InitialListFailed(kube::Error::LinesCodecMaxLineLengthExceeded),
            Failure::Answered,
        ),
        (W::NoResourceVersion, Failure::Answered),
    ];
    for (e, want) in cases {
        assert_eq!(classify(&e), want, "{e}");
    }
}

#[test]
fn only_outages_are_cut_short() {
    use Failure::*;
    assert_eq!(wait_for(Unreachable, true), Wait::BackoffOrAnswer);
    assert_eq!(wait_for(Gone, true), Wait::Now);
    assert_eq!(wait_for(Answered, true), Wait::Backoff);
    for f in [Unreachable, Gone, Answered] {
        assert_eq!(wait_for(f, false), Wait::Backoff, "{f:?}");
    }
}

/// A probe that answers from `back` on, counting its calls.
fn server_back_at(
    back: Instant,
    calls: Arc<AtomicUsize>,
) -> impl FnMut() -> std::future::Ready<bool> {
    move || {
        calls.fetch_add(1, Ordering::Relaxed);
        std::future::ready(Instant::now() >= back)
    }
}

/// An outage whose probe task answers from `back` on: the outage, the
/// probe's call count and its task.
fn probing(back: Instant) -> (Outage, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let outage = Outage::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let (o, f) = (outage.clone(), server_back_at(back, calls.clone()));
    let probe = tokio::spawn(async move { o.probe(f).await });
    (outage, calls, probe)
}

#[tokio::test(start_paused = true)]
async fn every_watcher_resumes_within_a_probe_period_of_the_return() {
    let back = Instant::now() + Duration::from_secs(30);
    let (outage, calls, probe) = probing(back);
    let watchers: Vec<_> = (0..3)
        .map(|_| {
            let mut retry = Retry::new(outage.clone());
            tokio::spawn(async move {
                // Fails at once while the server is away, as a refused
                // connection does.
                while Instant::now() < back {
                    retry.failed(Failure::Unreachable).await;
                }
                Instant::now()
            })
        })
        .collect();
    for w in watchers {
        let resumed = w.await.unwrap();
        assert!(
            resumed - back <= PROBE_EVERY.end,
            "resumed {:?} after the return",
            resumed - back
        );
    }
    // The probe ran every 250-500 ms of the outage, and not since.
    let n = calls.load(Ordering::Relaxed);
    assert!((60..=121).contains(&n), "{n} probes");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(calls.load(Ordering::Relaxed), n);
    probe.abort();
}

#[tokio::test(start_paused = true)]
async fn an_answered_failure_keeps_its_backoff() {
    let (outage, calls, probe) = probing(Instant::now());
    let mut retry = Retry::new(outage);
    let t0 = Instant::now();
    retry.failed(Failure::Answered).await;
    assert!(
        t0.elapsed() >= Duration::from_millis(800),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(calls.load(Ordering::Relaxed), 0, "a 403 is not an outage");
    probe.abort();
}

#[tokio::test(start_paused = true)]
async fn a_watcher_wakes_early_a_few_times_until_it_gets_an_event() {
    // /readyz answers all along, as when only the watches fail.
    let (outage, _calls, probe) = probing(Instant::now());
    let mut retry = Retry::new(outage);
    let timed = async |retry: &mut Retry, f| {
        let t0 = Instant::now();
        retry.failed(f).await;
        t0.elapsed()
    };
    for _ in 0..EARLY_WAKES {
        assert!(timed(&mut retry, Failure::Unreachable).await <= PROBE_EVERY.end);
    }
    // The next failure in a row waits out its backoff (0.8 s doubled thrice).
    assert!(timed(&mut retry, Failure::Unreachable).await >= Duration::from_millis(6400));
    retry.succeeded();
    assert!(timed(&mut retry, Failure::Unreachable).await <= PROBE_EVERY.end);
    // A 410 relists at once, as long as early wakes are left.
    retry.succeeded();
    for _ in 0..EARLY_WAKES {
        assert_eq!(timed(&mut retry, Failure::Gone).await, Duration::ZERO);
    }
    assert!(timed(&mut retry, Failure::Gone).await >= Duration::from_millis(6400));
    probe.abort();
}

#[tokio::test(start_paused = true)]
async fn while_the_server_stays_away_a_watcher_sleeps_its_backoff() {
    let (outage, calls, probe) = probing(Instant::now() + Duration::from_secs(3600));
    let mut retry = Retry::new(outage);
    let t0 = Instant::now();
    for _ in 0..3 {
        retry.failed(Failure::Unreachable).await;
    }
    // 0.8 + 1.6 + 3.2 s at least, jitter on top.
    assert!(
        t0.elapsed() >= Duration::from_millis(5600),
        "{:?}",
        t0.elapsed()
    );
    assert!(calls.load(Ordering::Relaxed) >= 11, "probed all along");
    probe.abort();
}
