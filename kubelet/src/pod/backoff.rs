//! Restart and image pull backoff, as client-go's flowcontrol.Backoff and the
//! kubelet's use of it: 10 s doubling to 300 s (`MaxContainerBackOff`), and an
//! entry older than twice the maximum (10 minutes) starts over
//! (`hasExpired`), which is how a container that ran cleanly for 10 minutes
//! gets a fresh backoff. The kubelet adds no jitter here, nor does this.
//! Time is passed in, so tests need no clock.
use std::{collections::HashMap, hash::Hash, time::Duration, time::Instant};

pub const INITIAL: Duration = Duration::from_secs(10);
pub const MAX: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, Debug)]
struct Entry {
    backoff: Duration,
    last_update: Instant,
}

/// Per-key exponential backoff.
#[derive(Clone, Debug)]
pub struct Backoff<K> {
    initial: Duration,
    max: Duration,
    entries: HashMap<K, Entry>,
}

impl<K: Eq + Hash + Clone> Backoff<K> {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            entries: HashMap::new(),
        }
    }

    fn expired(&self, e: &Entry, event: Instant) -> bool {
        event.saturating_duration_since(e.last_update) > self.max * 2
    }

    /// The current delay for `key` (zero when it has none).
    pub fn get(&self, key: &K) -> Duration {
        self.entries.get(key).map_or(Duration::ZERO, |e| e.backoff)
    }

    /// Records a failure at `now`: the first (or the first after expiry) waits
    /// `initial`, each next one twice the last, up to `max`. `event` is when
    /// the failure happened (a container's finish time), which decides expiry.
    pub fn next(&mut self, key: &K, event: Instant, now: Instant) {
        let backoff = match self.entries.get(key) {
            Some(e) if !self.expired(e, event) => (e.backoff * 2).min(self.max),
            _ => self.initial,
        };
        self.entries.insert(
            key.clone(),
            Entry {
                backoff,
                last_update: now,
            },
        );
    }

    /// `IsInBackOffSince`: whether, at `now`, less than the current delay has
    /// passed since `event`. Returns what is left to wait.
    pub fn in_backoff_since(&self, key: &K, event: Instant, now: Instant) -> Option<Duration> {
        let e = self.entries.get(key)?;
        if self.expired(e, event) {
            return None;
        }
        let waited = now.saturating_duration_since(event);
        (waited < e.backoff).then(|| e.backoff - waited)
    }

    /// `IsInBackOffSinceUpdate`: as [`Self::in_backoff_since`], counted from the
    /// last failure recorded.
    pub fn in_backoff_since_update(&self, key: &K, now: Instant) -> Option<Duration> {
        let e = self.entries.get(key)?;
        self.in_backoff_since(key, e.last_update, now)
    }

    pub fn reset(&mut self, key: &K) {
        self.entries.remove(key);
    }

    /// Forgets entries that expired by `now`, as the kubelet's periodic GC.
    pub fn gc(&mut self, now: Instant) {
        let max2 = self.max * 2;
        self.entries
            .retain(|_, e| now.saturating_duration_since(e.last_update) <= max2);
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&K) -> bool) {
        self.entries.retain(|k, _| keep(k));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A container's backoff key: (pod uid, container name).
pub type ContainerKey = (String, String);
/// An image pull's backoff key: (pod uid, image), as the kubelet's image manager.
pub type ImageKey = (String, String);

/// What to do with an exited container that should restart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestartGate {
    Start,
    /// Status reason `CrashLoopBackOff` with this message.
    Wait {
        remaining: Duration,
        message: String,
    },
}

/// The kubelet's CrashLoopBackOff (kuberuntime `doBackOff`).
#[derive(Clone, Debug)]
pub struct CrashLoopBackoff(pub Backoff<ContainerKey>);

impl Default for CrashLoopBackoff {
    fn default() -> Self {
        Self(Backoff::new(INITIAL, MAX))
    }
}

impl CrashLoopBackoff {
    /// Call before restarting an exited container, with the time it finished.
    /// `Start` records the restart, so the next call backs off further.
    pub fn check(
        &mut self,
        pod_uid: &str,
        pod_name: &str,
        container: &str,
        finished_at: Instant,
        now: Instant,
    ) -> RestartGate {
        let gate = self.gate(pod_uid, pod_name, container, finished_at, now);
        if gate == RestartGate::Start {
            self.restarted(pod_uid, container, finished_at, now);
        }
        gate
    }

    /// Whether the container may restart now; records nothing.
    pub fn gate(
        &self,
        pod_uid: &str,
        pod_name: &str,
        container: &str,
        finished_at: Instant,
        now: Instant,
    ) -> RestartGate {
        let key = (pod_uid.to_owned(), container.to_owned());
        match self.0.in_backoff_since(&key, finished_at, now) {
            Some(remaining) => RestartGate::Wait {
                remaining,
                message: format!(
                    "back-off {} restarting failed container={container} pod={pod_name}",
                    go_duration(self.0.get(&key))
                ),
            },
            None => RestartGate::Start,
        }
    }

    /// The container that finished at `finished_at` was restarted at `now`:
    /// the next restart backs off further.
    pub fn restarted(
        &mut self,
        pod_uid: &str,
        container: &str,
        finished_at: Instant,
        now: Instant,
    ) {
        let key = (pod_uid.to_owned(), container.to_owned());
        self.0.next(&key, finished_at, now);
    }

    /// Drops the entries of pods that are gone.
    pub fn forget_pod(&mut self, pod_uid: &str) {
        self.0.retain(|(uid, _)| uid != pod_uid);
    }
}

/// What to do before pulling an image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PullGate {
    Pull,
    /// Status reason `ImagePullBackOff` with this message.
    Wait {
        remaining: Duration,
        message: String,
    },
}

/// `ErrImagePull` → `ImagePullBackOff` (pkg/kubelet/images/image_manager.go).
#[derive(Clone, Debug)]
pub struct ImagePullBackoff(pub Backoff<ImageKey>);

impl Default for ImagePullBackoff {
    fn default() -> Self {
        Self(Backoff::new(INITIAL, MAX))
    }
}

impl ImagePullBackoff {
    pub fn check(&self, pod_uid: &str, image: &str, now: Instant) -> PullGate {
        let key = (pod_uid.to_owned(), image.to_owned());
        match self.0.in_backoff_since_update(&key, now) {
            Some(remaining) => PullGate::Wait {
                remaining,
                message: format!("Back-off pulling image {image:?}"),
            },
            None => PullGate::Pull,
        }
    }

    /// A pull failed (the container shows `ErrImagePull` until the next check).
    pub fn failed(&mut self, pod_uid: &str, image: &str, now: Instant) {
        let key = (pod_uid.to_owned(), image.to_owned());
        self.0.next(&key, now, now);
    }

    pub fn succeeded(&mut self, pod_uid: &str, image: &str) {
        self.0.reset(&(pod_uid.to_owned(), image.to_owned()));
    }

    pub fn forget_pod(&mut self, pod_uid: &str) {
        self.0.retain(|(uid, _)| uid != pod_uid);
    }
}

/// The monotonic instant of a past wall-clock time (a CRI `finishedAt`), for
/// [`CrashLoopBackoff::check`]: `now` and `now_wall` are read together.
pub fn instant_of(
    t: k8s_openapi::jiff::Timestamp,
    now_wall: k8s_openapi::jiff::Timestamp,
    now: Instant,
) -> Instant {
    let ago = now_wall.as_nanosecond() - t.as_nanosecond();
    let ago = Duration::from_nanos(u64::try_from(ago.max(0)).unwrap_or(u64::MAX));
    now.checked_sub(ago).unwrap_or(now)
}

/// Go's rendering ("10s", "5m0s", "2m40s"), as the kubelet's messages show it.
pub fn go_duration(d: Duration) -> String {
    let s = d.as_secs();
    let ms = d.subsec_millis();
    let frac = if ms == 0 {
        String::new()
    } else {
        format!(".{ms:03}").trim_end_matches('0').to_owned()
    };
    match s {
        0 if ms == 0 => "0s".to_owned(),
        s if s < 60 => format!("{s}{frac}s"),
        s if s < 3600 => format!("{}m{}{frac}s", s / 60, s % 60),
        s => format!("{}h{}m{}{frac}s", s / 3600, s % 3600 / 60, s % 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn doubles_to_the_cap() {
        let t0 = Instant::now();
        let mut b = Backoff::new(INITIAL, MAX);
        let k = 1;
        let mut seen = vec![];
        for i in 0..8 {
            let t = t0 + S * i;
            b.next(&k, t, t);
            seen.push(b.get(&k).as_secs());
        }
        assert_eq!(seen, [10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn expires_after_twice_the_cap() {
        let t0 = Instant::now();
        let mut b = Backoff::new(INITIAL, MAX);
        b.next(&"k", t0, t0);
        b.next(&"k", t0, t0);
        assert_eq!(b.get(&"k"), 20 * S);
        // 10 minutes and a bit later: starts over.
        let later = t0 + 601 * S;
        assert_eq!(b.in_backoff_since(&"k", later, later), None);
        b.next(&"k", later, later);
        assert_eq!(b.get(&"k"), 10 * S);
        b.gc(later + 601 * S);
        assert!(b.is_empty());
    }

    #[test]
    fn crash_loop() {
        let t0 = Instant::now();
        let mut b = CrashLoopBackoff::default();
        // First exit: restart at once.
        assert_eq!(b.check("u", "ns/p", "c", t0, t0), RestartGate::Start);
        // It exits again 1 s after: 10 s from its finish time.
        let f1 = t0 + S;
        match b.check("u", "ns/p", "c", f1, f1 + 3 * S) {
            RestartGate::Wait { remaining, message } => {
                assert_eq!(remaining, 7 * S);
                assert_eq!(
                    message,
                    "back-off 10s restarting failed container=c pod=ns/p"
                );
            }
            g => panic!("{g:?}"),
        }
        assert_eq!(
            b.check("u", "ns/p", "c", f1, f1 + 10 * S),
            RestartGate::Start
        );
        let f2 = f1 + 11 * S;
        assert!(matches!(
            b.check("u", "ns/p", "c", f2, f2 + 19 * S),
            RestartGate::Wait { .. }
        ));
        assert_eq!(
            b.check("u", "ns/p", "c", f2, f2 + 20 * S),
            RestartGate::Start
        );
        // Another container of the same pod has its own entry.
        assert_eq!(b.check("u", "ns/p", "d", f2, f2), RestartGate::Start);
        // Ran cleanly for over 10 minutes since the last restart: back to 10 s.
        let f3 = f2 + 20 * S + 601 * S;
        assert_eq!(b.check("u", "ns/p", "c", f3, f3), RestartGate::Start);
        assert_eq!(b.0.get(&("u".into(), "c".into())), 10 * S);
        b.forget_pod("u");
        assert!(b.0.is_empty());
    }

    #[test]
    fn image_pulls() {
        let t0 = Instant::now();
        let mut b = ImagePullBackoff::default();
        assert_eq!(b.check("u", "img", t0), PullGate::Pull);
        b.failed("u", "img", t0);
        assert_eq!(
            b.check("u", "img", t0 + 4 * S),
            PullGate::Wait {
                remaining: 6 * S,
                message: "Back-off pulling image \"img\"".into()
            }
        );
        assert_eq!(b.check("u", "img", t0 + 10 * S), PullGate::Pull);
        b.failed("u", "img", t0 + 10 * S);
        assert!(matches!(
            b.check("u", "img", t0 + 29 * S),
            PullGate::Wait { .. }
        ));
        assert_eq!(b.check("u", "img", t0 + 30 * S), PullGate::Pull);
        b.succeeded("u", "img");
        assert_eq!(b.check("u", "img", t0 + 31 * S), PullGate::Pull);
    }

    #[test]
    fn wall_clock_to_instants() {
        let now = Instant::now();
        let wall = |s| k8s_openapi::jiff::Timestamp::from_second(s).unwrap();
        assert_eq!(instant_of(wall(90), wall(100), now), now - 10 * S);
        // A finish time in the future (clock skew) is now.
        assert_eq!(instant_of(wall(110), wall(100), now), now);
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(10 * S), "10s");
        assert_eq!(go_duration(160 * S), "2m40s");
        assert_eq!(go_duration(300 * S), "5m0s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(3700 * S), "1h1m40s");
    }
}
