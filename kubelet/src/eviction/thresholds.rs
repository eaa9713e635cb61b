//! Eviction thresholds as `KubeletConfiguration` states them
//! (`evictionHard`, `evictionSoft`, `evictionSoftGracePeriod`,
//! `evictionPressureTransitionPeriod`, `evictionMaxPodGracePeriod`,
//! `mergeDefaultEvictionSettings`), parsed as pkg/kubelet/eviction/api and
//! `ParseThresholdConfig` do: a quantity (`100Mi`) or a percentage (`10%`)
//! of the signal's capacity; `0` or `0%` turns a signal off, which is how
//! kind disables disk eviction.
use std::{collections::BTreeMap, time::Duration};

use crate::pod::quantity::Quantity;

/// The signals this kubelet observes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    MemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
}

impl Signal {
    pub const ALL: [Signal; 4] = [
        Signal::MemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::NodeFsAvailable => "nodefs.available",
            Self::NodeFsInodesFree => "nodefs.inodesFree",
            Self::ImageFsAvailable => "imagefs.available",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|x| x.name() == s)
    }

    /// The resource the node runs short of, as messages and ranking name it.
    pub fn resource(self) -> Resource {
        match self {
            Self::MemoryAvailable => Resource::Memory,
            Self::NodeFsInodesFree => Resource::Inodes,
            Self::NodeFsAvailable | Self::ImageFsAvailable => Resource::EphemeralStorage,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resource {
    Memory,
    EphemeralStorage,
    Inodes,
}

impl Resource {
    pub fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::EphemeralStorage => "ephemeral-storage",
            Self::Inodes => "inodes",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Amount {
    /// Bytes, or inodes for `nodefs.inodesFree`.
    Absolute(u64),
    /// Millionths of the capacity (`10%` is 100 000).
    PerMillion(u32),
}

impl Amount {
    /// The amount for a signal whose capacity is `capacity`.
    pub fn of(self, capacity: u64) -> u64 {
        match self {
            Self::Absolute(v) => v,
            Self::PerMillion(p) => (u128::from(capacity) * u128::from(p) / 1_000_000) as u64,
        }
    }
}

/// A signal falling below `min` is met; a soft one must stay met for `grace`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Threshold {
    pub signal: Signal,
    pub min: Amount,
    /// `None` for a hard threshold.
    pub grace: Option<Duration>,
}

/// The eviction settings, with the kubelet's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionConfig {
    pub thresholds: Vec<Threshold>,
    /// How long a pressure condition stays after its threshold last was met.
    pub pressure_transition_period: Duration,
    /// The most a pod gets to stop when a soft threshold evicts it.
    pub max_pod_grace_period: Duration,
}

/// `DefaultEvictionHard` of the kubelet (Linux).
pub const DEFAULT_HARD: [(&str, &str); 4] = [
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
];

impl Default for EvictionConfig {
    fn default() -> Self {
        let hard = DEFAULT_HARD
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        parse(&Raw {
            hard: Some(hard),
            ..Raw::default()
        })
        .expect("the defaults parse")
    }
}

/// The fields as the file has them.
#[derive(Clone, Debug, Default)]
pub struct Raw {
    pub hard: Option<BTreeMap<String, String>>,
    pub soft: Option<BTreeMap<String, String>>,
    pub soft_grace_period: Option<BTreeMap<String, String>>,
    pub pressure_transition_period: Option<Duration>,
    pub max_pod_grace_period: Option<i64>,
    pub merge_defaults: Option<bool>,
}

/// One field's problem: its path and what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub field: String,
    pub message: String,
}

fn amount(field: &str, value: &str) -> Result<Option<Amount>, Invalid> {
    let bad = |message: String| Invalid {
        field: field.to_owned(),
        message,
    };
    if let Some(p) = value.strip_suffix('%') {
        let f: f64 = p
            .parse()
            .map_err(|_| bad(format!("{value:?} is not a percentage")))?;
        if !(0.0..=100.0).contains(&f) {
            return Err(bad(format!("{value:?} must be between 0% and 100%")));
        }
        let ppm = (f * 10_000.0).round() as u32;
        return Ok((ppm > 0).then_some(Amount::PerMillion(ppm)));
    }
    let q = Quantity::parse(value).map_err(|e| bad(format!("{value:?}: {e}")))?;
    match q.value() {
        Some(v) if v < 0 => Err(bad(format!("{value:?} must not be negative"))),
        Some(0) => Ok(None),
        Some(v) => Ok(Some(Amount::Absolute(v as u64))),
        None => Err(bad(format!("{value:?} is out of range"))),
    }
}

/// `ParseThresholdConfig`: every problem, named by its field.
pub fn parse(raw: &Raw) -> Result<EvictionConfig, Vec<Invalid>> {
    let mut errs = Vec::new();
    let mut thresholds = Vec::new();
    let hard = match (&raw.hard, raw.merge_defaults) {
        (None, _) => DEFAULT_HARD
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        (Some(h), Some(true)) => {
            let mut m: BTreeMap<String, String> = DEFAULT_HARD
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            m.extend(h.clone());
            m
        }
        (Some(h), _) => h.clone(),
    };
    let empty = BTreeMap::new();
    let graces = raw.soft_grace_period.as_ref().unwrap_or(&empty);
    for (kind, map) in [
        ("evictionHard", Some(&hard)),
        ("evictionSoft", raw.soft.as_ref()),
    ] {
        for (name, value) in map.into_iter().flatten() {
            let field = format!("{kind}.{name}");
            let Some(signal) = Signal::parse(name) else {
                errs.push(Invalid {
                    field,
                    message: format!(
                        "unsupported eviction signal; supported: {}",
                        Signal::ALL.map(Signal::name).join(", ")
                    ),
                });
                continue;
            };
            let min = match amount(&field, value) {
                Ok(Some(m)) => m,
                Ok(None) => continue,
                Err(e) => {
                    errs.push(e);
                    continue;
                }
            };
            let grace = if kind == "evictionSoft" {
                let gfield = format!("evictionSoftGracePeriod.{name}");
                match graces
                    .get(name)
                    .map(|g| crate::config::parse_go_duration(g))
                {
                    Some(Some(d)) => Some(d),
                    Some(None) => {
                        errs.push(Invalid {
                            field: gfield,
                            message: format!("{:?} is not a duration", graces[name]),
                        });
                        continue;
                    }
                    None => {
                        errs.push(Invalid {
                            field: gfield,
                            message: "a soft threshold needs its grace period".into(),
                        });
                        continue;
                    }
                }
            } else {
                None
            };
            thresholds.push(Threshold { signal, min, grace });
        }
    }
    for name in graces.keys() {
        if !raw.soft.as_ref().is_some_and(|s| s.contains_key(name)) {
            errs.push(Invalid {
                field: format!("evictionSoftGracePeriod.{name}"),
                message: "no evictionSoft threshold for this signal".into(),
            });
        }
    }
    let max_pod_grace_period = match raw.max_pod_grace_period {
        None | Some(0) => Duration::ZERO,
        Some(s) if s > 0 => Duration::from_secs(s as u64),
        Some(s) => {
            errs.push(Invalid {
                field: "evictionMaxPodGracePeriod".into(),
                message: format!("{s} must not be negative"),
            });
            Duration::ZERO
        }
    };
    if !errs.is_empty() {
        return Err(errs);
    }
    Ok(EvictionConfig {
        thresholds,
        pressure_transition_period: raw
            .pressure_transition_period
            .unwrap_or(Duration::from_secs(300)),
        max_pod_grace_period,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    #[test]
    fn the_defaults_are_the_kubelets() {
        let c = EvictionConfig::default();
        assert_eq!(c.thresholds.len(), 4);
        let mem = c
            .thresholds
            .iter()
            .find(|t| t.signal == Signal::MemoryAvailable)
            .unwrap();
        assert_eq!(mem.min, Amount::Absolute(100 << 20));
        assert_eq!(mem.grace, None);
        assert_eq!(c.pressure_transition_period, Duration::from_secs(300));
    }

    #[test]
    fn zero_turns_a_signal_off_and_a_given_map_replaces_the_defaults() {
        let c = parse(&Raw {
            hard: map(&[
                ("memory.available", "200Mi"),
                ("nodefs.available", "0%"),
                ("imagefs.available", "0"),
            ]),
            ..Raw::default()
        })
        .unwrap();
        assert_eq!(
            c.thresholds,
            [Threshold {
                signal: Signal::MemoryAvailable,
                min: Amount::Absolute(200 << 20),
                grace: None
            }]
        );
        let merged = parse(&Raw {
            hard: map(&[("nodefs.available", "20%")]),
            merge_defaults: Some(true),
            ..Raw::default()
        })
        .unwrap();
        assert_eq!(merged.thresholds.len(), 4);
        assert!(merged.thresholds.contains(&Threshold {
            signal: Signal::NodeFsAvailable,
            min: Amount::PerMillion(200_000),
            grace: None
        }));
    }

    #[test]
    fn soft_thresholds_need_a_grace_period_and_errors_name_the_field() {
        let c = parse(&Raw {
            hard: map(&[]),
            soft: map(&[("memory.available", "1Gi")]),
            soft_grace_period: map(&[("memory.available", "1m30s")]),
            ..Raw::default()
        })
        .unwrap();
        assert_eq!(c.thresholds[0].grace, Some(Duration::from_secs(90)));
        let errs = parse(&Raw {
            hard: map(&[("pid.available", "10%"), ("nodefs.available", "110%")]),
            soft: map(&[("memory.available", "1Gi")]),
            soft_grace_period: map(&[("nodefs.available", "1m")]),
            max_pod_grace_period: Some(-1),
            ..Raw::default()
        })
        .unwrap_err();
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "evictionHard.nodefs.available",
                "evictionHard.pid.available",
                "evictionSoftGracePeriod.memory.available",
                "evictionSoftGracePeriod.nodefs.available",
                "evictionMaxPodGracePeriod"
            ]
        );
        assert!(errs[1].message.contains("supported: memory.available"));
    }
}
