//! Which pod goes first, as the kubelet ranks them (`rankMemoryPressure`,
//! `rankDiskPressureFunc`): pods whose usage exceeds their requests before
//! those within them, then lower priority first, then the largest usage
//! above requests. Static pods and pods of system-critical priority are
//! never candidates. The message is the kubelet's `evictionMessage`.
use std::cmp::Reverse;

use super::{decide::Met, thresholds::Resource};

/// The kubelet's `SystemCriticalPriority`: such pods are not evicted.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// One pod's use of the resource the node runs short of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub uid: String,
    pub priority: i32,
    pub critical: bool,
    /// Bytes (or inodes) in use, and requested, for the whole pod.
    pub usage: u64,
    pub request: u64,
    /// Per container: (name, usage, request), for the message.
    pub containers: Vec<(String, u64, u64)>,
}

/// The candidates in eviction order; critical pods left out.
pub fn rank(mut pods: Vec<Candidate>) -> Vec<Candidate> {
    pods.retain(|p| !p.critical && p.priority < SYSTEM_CRITICAL_PRIORITY);
    pods.sort_by_key(|p| {
        (
            p.usage <= p.request,
            p.priority,
            Reverse(i128::from(p.usage) - i128::from(p.request)),
            p.uid.clone(),
        )
    });
    pods
}

/// A quantity as the API prints bytes: `Ki` when it divides evenly.
fn quantity(v: u64, resource: Resource) -> String {
    if resource != Resource::Inodes && v > 0 && v.is_multiple_of(1024) {
        format!("{}Ki", v / 1024)
    } else {
        v.to_string()
    }
}

/// `evictionMessage`: what ran short, the threshold, and each container
/// that used more than it asked for.
pub fn message(met: &Met, pod: &Candidate) -> String {
    let r = met.resource();
    let mut m = format!(
        "The node was low on resource: {}. Threshold quantity: {}, available: {}. ",
        r.name(),
        quantity(met.threshold, r),
        quantity(met.available, r)
    );
    for (name, usage, request) in &pod.containers {
        if usage > request {
            m.push_str(&format!(
                "Container {name} was using {}, request is {}, has larger consumption of {}. ",
                quantity(*usage, r),
                quantity(*request, r),
                r.name()
            ));
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eviction::thresholds::Signal;

    fn pod(uid: &str, priority: i32, usage: u64, request: u64) -> Candidate {
        Candidate {
            uid: uid.into(),
            priority,
            critical: false,
            usage,
            request,
            containers: vec![("c".into(), usage, request)],
        }
    }

    #[test]
    fn over_requests_then_priority_then_usage_above_requests() {
        let ranked = rank(vec![
            pod("within", 0, 50, 100),
            pod("over-small", 0, 20, 10),
            pod("over-big", 0, 500, 10),
            pod("over-important", 1000, 900, 0),
            pod("critical", SYSTEM_CRITICAL_PRIORITY, 10_000, 0),
            Candidate {
                critical: true,
                ..pod("static", 0, 10_000, 0)
            },
        ]);
        let order: Vec<&str> = ranked.iter().map(|p| p.uid.as_str()).collect();
        assert_eq!(
            order,
            ["over-big", "over-small", "over-important", "within"]
        );
    }

    #[test]
    fn the_message_is_the_kubelets() {
        let met = Met {
            signal: Signal::NodeFsAvailable,
            threshold: 6_710_886,
            available: 4_194_304,
            soft: false,
        };
        let mut p = pod("u", 0, 40 << 20, 0);
        p.containers.push(("quiet".into(), 0, 0));
        assert_eq!(
            message(&met, &p),
            "The node was low on resource: ephemeral-storage. Threshold quantity: 6710886, \
             available: 4096Ki. Container c was using 40960Ki, request is 0, has larger \
             consumption of ephemeral-storage. "
        );
    }
}
