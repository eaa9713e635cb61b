//! The eviction loop: observe every monitoring period, decide, report the
//! pressure conditions, and evict at most one pod per round, waiting for it
//! to stop before observing again (the kubelet's `synchronize` and
//! `waitForPodsCleanup`).
use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use super::{
    decide::{Met, State, decide},
    observe,
    rank::{Candidate, message, rank},
    thresholds::{EvictionConfig, Resource},
};
use crate::{
    health::NodeHealth,
    pod::quantity::Quantity,
    worker::{Eviction, EvictionHandle, EvictionTarget},
};

/// The kubelet's housekeeping interval, which paces its eviction manager.
pub const MONITORING_PERIOD: Duration = Duration::from_secs(10);
/// How long an evicted pod gets to be gone before the next round.
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

pub struct EvictionManager {
    pub config: EvictionConfig,
    pub pods: EvictionHandle,
    pub health: Option<Arc<NodeHealth>>,
    pub root_dir: std::path::PathBuf,
    pub image_fs: Option<std::path::PathBuf>,
}

/// A container's request of `resource` in bytes (0 when it asks none).
fn request(c: &k8s_openapi::api::core::v1::Container, resource: Resource) -> u64 {
    let key = match resource {
        Resource::Memory => "memory",
        Resource::EphemeralStorage => "ephemeral-storage",
        Resource::Inodes => return 0,
    };
    c.resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(key))
        .and_then(|q| Quantity::parse(&q.0).ok()?.value())
        .map_or(0, |v| u64::try_from(v).unwrap_or(0))
}

fn containers(pod: &Pod) -> &[k8s_openapi::api::core::v1::Container] {
    pod.spec.as_ref().map_or(&[], |s| s.containers.as_slice())
}

/// A pod's use of `resource`, as the ranking and the message need it.
pub fn candidate(t: &EvictionTarget, resource: Resource) -> Candidate {
    let cs = containers(&t.pod);
    let request_total = cs.iter().map(|c| request(c, resource)).sum();
    let (usage, per_container) = match resource {
        Resource::Memory => {
            let usage = t
                .cgroup
                .as_deref()
                .and_then(observe::cgroup_memory)
                .unwrap_or(0);
            // Only a lone container's share is known from the pod's cgroup.
            let per = match cs {
                [c] => vec![(c.name.clone(), usage, request(c, resource))],
                _ => Vec::new(),
            };
            (usage, per)
        }
        Resource::EphemeralStorage | Resource::Inodes => {
            let pick = |(bytes, inodes): (u64, u64)| {
                if resource == Resource::Inodes {
                    inodes
                } else {
                    bytes
                }
            };
            let usage = t.dirs.iter().map(|d| pick(observe::dir_usage(d))).sum();
            // Each container's own logs, as the kubelet counts its usage.
            let logs = t.dirs.get(1);
            let per = cs
                .iter()
                .map(|c| {
                    let used = logs.map_or(0, |l| pick(observe::dir_usage(&l.join(&c.name))));
                    (c.name.clone(), used, request(c, resource))
                })
                .collect();
            (usage, per)
        }
    };
    Candidate {
        uid: t.pod.metadata.uid.clone().unwrap_or_default(),
        priority: t.pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0),
        critical: t.static_pod,
        usage,
        request: request_total,
        containers: per_container,
    }
}

impl EvictionManager {
    /// Runs on the current Tokio runtime, unless no threshold is set.
    pub fn spawn(self) {
        if self.config.thresholds.is_empty() {
            tracing::info!("no eviction threshold: node-pressure eviction is off");
            return;
        }
        tokio::spawn(self.run());
    }

    pub async fn run(self) {
        let mut state = State::default();
        let mut shown = (false, false);
        loop {
            let obs = observe::node(&self.root_dir, self.image_fs.as_deref());
            let d = decide(&self.config, &mut state, &obs, Instant::now());
            let pressure = (d.memory_pressure, d.disk_pressure);
            if pressure != shown {
                tracing::warn!(
                    memory = pressure.0,
                    disk = pressure.1,
                    "node pressure changed"
                );
                shown = pressure;
            }
            if let Some(h) = &self.health {
                h.set_pressure(pressure.0, pressure.1);
            }
            if let Some(met) = d.evict {
                self.evict_one(&met).await;
            }
            tokio::time::sleep(MONITORING_PERIOD).await;
        }
    }

    async fn evict_one(&self, met: &Met) {
        let targets = self.pods.eviction_targets();
        let candidates = targets
            .iter()
            .map(|t| candidate(t, met.resource()))
            .collect();
        let Some(pod) = rank(candidates).into_iter().next() else {
            tracing::warn!(
                signal = met.signal.name(),
                "eviction threshold met, but no pod can be evicted"
            );
            return;
        };
        let grace = if met.soft {
            self.config.max_pod_grace_period
        } else {
            Duration::ZERO
        };
        let message = message(met, &pod);
        tracing::warn!(uid = %pod.uid, signal = met.signal.name(), %message, "evicting a pod");
        self.pods.evict(&pod.uid, Eviction { message, grace });
        let deadline = Instant::now() + CLEANUP_TIMEOUT;
        while Instant::now() < deadline
            && self
                .pods
                .eviction_targets()
                .iter()
                .any(|t| t.pod.metadata.uid.as_deref() == Some(pod.uid.as_str()))
        {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}
