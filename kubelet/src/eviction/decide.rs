//! The eviction manager's decision, pure: which thresholds are met, which
//! pressure conditions the node shows, and whether a pod must go now
//! (`synchronize` in pkg/kubelet/eviction). Soft thresholds evict only once
//! met for their whole grace period; a pressure condition stays for
//! `evictionPressureTransitionPeriod` after its threshold was last met, so
//! that it does not flap.
use std::{collections::BTreeMap, time::Duration};

use tokio::time::Instant;

use super::thresholds::{EvictionConfig, Resource, Signal, Threshold};

/// One signal's value and the capacity percentages are taken of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observed {
    pub available: u64,
    pub capacity: u64,
}

pub type Observations = BTreeMap<Signal, Observed>;

/// What the manager remembers between two observations.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// When each met threshold (by index) was first seen met.
    first_met: BTreeMap<usize, Instant>,
    /// When each condition's threshold was last seen met.
    last_met: BTreeMap<Condition, Instant>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Condition {
    MemoryPressure,
    DiskPressure,
}

fn condition_of(signal: Signal) -> Condition {
    match signal {
        Signal::MemoryAvailable => Condition::MemoryPressure,
        _ => Condition::DiskPressure,
    }
}

/// A threshold that evicts now.
#[derive(Clone, Debug, PartialEq)]
pub struct Met {
    pub signal: Signal,
    /// The threshold in bytes (inodes), and what was available.
    pub threshold: u64,
    pub available: u64,
    /// Soft thresholds give pods at most this long to stop; hard ones none.
    pub soft: bool,
}

impl Met {
    pub fn resource(&self) -> Resource {
        self.signal.resource()
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    pub memory_pressure: bool,
    pub disk_pressure: bool,
    /// The threshold to reclaim for, memory first.
    pub evict: Option<Met>,
}

fn met(t: &Threshold, obs: &Observations) -> Option<(u64, u64)> {
    let o = obs.get(&t.signal)?;
    let threshold = t.min.of(o.capacity);
    (o.available < threshold).then_some((threshold, o.available))
}

/// One round: the observations at `now` against the thresholds.
pub fn decide(
    cfg: &EvictionConfig,
    state: &mut State,
    obs: &Observations,
    now: Instant,
) -> Decision {
    let mut due: Vec<Met> = Vec::new();
    for (i, t) in cfg.thresholds.iter().enumerate() {
        let Some((threshold, available)) = met(t, obs) else {
            state.first_met.remove(&i);
            continue;
        };
        state.last_met.insert(condition_of(t.signal), now);
        let since = *state.first_met.entry(i).or_insert(now);
        let grace = t.grace.unwrap_or(Duration::ZERO);
        if now.saturating_duration_since(since) >= grace {
            due.push(Met {
                signal: t.signal,
                threshold,
                available,
                soft: t.grace.is_some(),
            });
        }
    }
    // Hard before soft, then memory, disk, inodes, images, as the kubelet
    // reclaims memory first.
    due.sort_by_key(|m| (m.soft, m.signal));
    let pressure = |c: Condition| {
        state
            .last_met
            .get(&c)
            .is_some_and(|at| now.saturating_duration_since(*at) < cfg.pressure_transition_period)
    };
    Decision {
        memory_pressure: pressure(Condition::MemoryPressure),
        disk_pressure: pressure(Condition::DiskPressure),
        evict: due.into_iter().next(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eviction::thresholds::{Raw, parse};

    fn cfg() -> EvictionConfig {
        let map = |p: &[(&str, &str)]| {
            Some(
                p.iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            )
        };
        let mut c = parse(&Raw {
            hard: map(&[("nodefs.available", "10%")]),
            soft: map(&[("memory.available", "1Gi")]),
            soft_grace_period: map(&[("memory.available", "30s")]),
            ..Raw::default()
        })
        .unwrap();
        c.pressure_transition_period = Duration::from_secs(60);
        c
    }

    fn obs(mem_free: u64, disk_free: u64) -> Observations {
        Observations::from([
            (
                Signal::MemoryAvailable,
                Observed {
                    available: mem_free,
                    capacity: 8 << 30,
                },
            ),
            (
                Signal::NodeFsAvailable,
                Observed {
                    available: disk_free,
                    capacity: 1000,
                },
            ),
        ])
    }

    #[test]
    fn hard_thresholds_evict_at_once_and_pressure_outlasts_them() {
        let c = cfg();
        let mut s = State::default();
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        assert_eq!(
            decide(&c, &mut s, &obs(4 << 30, 500), t0),
            Decision::default()
        );
        let d = decide(&c, &mut s, &obs(4 << 30, 50), at(10));
        assert!(d.disk_pressure && !d.memory_pressure);
        assert_eq!(
            d.evict,
            Some(Met {
                signal: Signal::NodeFsAvailable,
                threshold: 100,
                available: 50,
                soft: false
            })
        );
        // Reclaimed: no eviction, but DiskPressure stays for the transition period.
        let d = decide(&c, &mut s, &obs(4 << 30, 500), at(20));
        assert!(d.disk_pressure && d.evict.is_none());
        let d = decide(&c, &mut s, &obs(4 << 30, 500), at(69));
        assert!(d.disk_pressure);
        let d = decide(&c, &mut s, &obs(4 << 30, 500), at(70));
        assert!(!d.disk_pressure);
    }

    #[test]
    fn soft_thresholds_wait_out_their_grace_period_and_memory_comes_first() {
        let c = cfg();
        let mut s = State::default();
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        let d = decide(&c, &mut s, &obs(512 << 20, 500), t0);
        assert!(d.memory_pressure, "the condition shows at once");
        assert!(d.evict.is_none(), "the eviction waits for the grace period");
        assert!(
            decide(&c, &mut s, &obs(512 << 20, 500), at(29))
                .evict
                .is_none()
        );
        let d = decide(&c, &mut s, &obs(512 << 20, 500), at(30));
        assert_eq!(
            d.evict.map(|m| (m.signal, m.soft)),
            Some((Signal::MemoryAvailable, true))
        );
        // Recovering resets the clock.
        decide(&c, &mut s, &obs(2 << 30, 500), at(31));
        assert!(
            decide(&c, &mut s, &obs(512 << 20, 500), at(32))
                .evict
                .is_none()
        );
        // A hard threshold goes first.
        let d = decide(&c, &mut s, &obs(512 << 20, 50), at(70));
        assert_eq!(d.evict.map(|m| m.signal), Some(Signal::NodeFsAvailable));
    }
}
