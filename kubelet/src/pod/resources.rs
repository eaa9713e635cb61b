//! Container resources → CRI Linux resources, QoS class and OOM score, as
//! pkg/kubelet/kuberuntime/kuberuntime_container_linux.go
//! (`calculateLinuxResources`), pkg/kubelet/cm/helpers_linux.go
//! (`MilliCPUToShares`, `MilliCPUToQuota`), pkg/apis/core/v1/helper/qos and
//! pkg/kubelet/qos/policy.go do it.
use super::Resources;

pub const MIN_SHARES: i64 = 2;
pub const MAX_SHARES: i64 = 262_144;
pub const SHARES_PER_CPU: i64 = 1024;
/// The CFS period the kubelet uses unless the CPUCFSQuotaPeriod gate changes it (µs).
pub const QUOTA_PERIOD: i64 = 100_000;
pub const MIN_QUOTA_PERIOD: i64 = 1_000;

/// What the CRI's `LinuxContainerResources` gets; the CRI engineer maps it field
/// by field. Zero means "not set" for the quota and the memory limit, as in CRI.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinuxResources {
    pub cpu_shares: i64,
    pub cpu_period: i64,
    /// 0 when there is no CPU limit.
    pub cpu_quota: i64,
    /// 0 when there is no memory limit.
    pub memory_limit_in_bytes: i64,
}

pub fn milli_cpu_to_shares(milli: i64) -> i64 {
    if milli == 0 {
        return MIN_SHARES;
    }
    (milli * SHARES_PER_CPU / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

pub fn milli_cpu_to_quota(milli: i64, period: i64) -> i64 {
    if milli == 0 {
        return 0;
    }
    (milli * period / 1000).max(MIN_QUOTA_PERIOD)
}

pub fn linux_resources(r: &Resources) -> LinuxResources {
    let request = r.cpu_request_milli.unwrap_or(0);
    let limit = r.cpu_limit_milli.unwrap_or(0);
    // A limit without a request: the request defaults to the limit.
    let shares_from = if request == 0 && limit != 0 {
        limit
    } else {
        request
    };
    LinuxResources {
        cpu_shares: milli_cpu_to_shares(shares_from),
        cpu_period: QUOTA_PERIOD,
        cpu_quota: milli_cpu_to_quota(limit, QUOTA_PERIOD),
        memory_limit_in_bytes: r.memory_limit.unwrap_or(0),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        }
    }
}

/// Guaranteed when every container limits CPU and memory with requests equal
/// to the limits; BestEffort when nothing requests or limits anything.
pub fn qos_class<'a>(containers: impl IntoIterator<Item = &'a Resources>) -> QosClass {
    let mut any = false;
    let mut guaranteed = true;
    for r in containers {
        let set = |v: Option<i64>| v.is_some_and(|v| v != 0);
        if set(r.cpu_request_milli)
            || set(r.cpu_limit_milli)
            || set(r.memory_request)
            || set(r.memory_limit)
        {
            any = true;
        }
        let full = set(r.cpu_limit_milli) && set(r.memory_limit);
        let equal = r.cpu_request_milli.or(r.cpu_limit_milli) == r.cpu_limit_milli
            && r.memory_request.or(r.memory_limit) == r.memory_limit;
        guaranteed &= full && equal;
    }
    match (any, guaranteed) {
        (false, _) => QosClass::BestEffort,
        (true, true) => QosClass::Guaranteed,
        (true, false) => QosClass::Burstable,
    }
}

/// The container's `oom_score_adj`: -997 for Guaranteed, 1000 for BestEffort,
/// and for Burstable `1000 - 1000*memoryRequest/capacity`, kept in [2, 999]
/// so it stays above Guaranteed and below BestEffort.
pub fn oom_score_adj(qos: QosClass, container: &Resources, memory_capacity: i64) -> i64 {
    match qos {
        QosClass::Guaranteed => -997,
        QosClass::BestEffort => 1000,
        QosClass::Burstable => {
            let request = container.memory_request.unwrap_or(0);
            let adj = if memory_capacity > 0 {
                1000 - (1000 * request) / memory_capacity
            } else {
                999
            };
            adj.clamp(2, 999)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(
        cpu_req: Option<i64>,
        cpu_lim: Option<i64>,
        mem_req: Option<i64>,
        mem_lim: Option<i64>,
    ) -> Resources {
        Resources {
            cpu_request_milli: cpu_req,
            cpu_limit_milli: cpu_lim,
            memory_request: mem_req,
            memory_limit: mem_lim,
        }
    }

    #[test]
    fn shares_and_quota() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(100), 102);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_shares(1_000_000), MAX_SHARES);
        assert_eq!(milli_cpu_to_quota(0, QUOTA_PERIOD), 0);
        assert_eq!(milli_cpu_to_quota(500, QUOTA_PERIOD), 50_000);
        assert_eq!(milli_cpu_to_quota(5, QUOTA_PERIOD), MIN_QUOTA_PERIOD);
    }

    #[test]
    fn linux_resources_follow_calculate_linux_resources() {
        let r = linux_resources(&res(Some(250), Some(500), None, Some(128 << 20)));
        assert_eq!(
            r,
            LinuxResources {
                cpu_shares: 256,
                cpu_period: 100_000,
                cpu_quota: 50_000,
                memory_limit_in_bytes: 128 << 20
            }
        );
        // Limit only: shares from the limit.
        assert_eq!(
            linux_resources(&res(None, Some(2000), None, None)).cpu_shares,
            2048
        );
        // Nothing: minimum shares, no quota, no memory limit.
        let none = linux_resources(&Resources::default());
        assert_eq!(
            (none.cpu_shares, none.cpu_quota, none.memory_limit_in_bytes),
            (2, 0, 0)
        );
    }

    #[test]
    fn qos_classes() {
        assert_eq!(qos_class(&[Resources::default()]), QosClass::BestEffort);
        let g = res(Some(100), Some(100), Some(1), Some(1));
        assert_eq!(qos_class(&[g, g]), QosClass::Guaranteed);
        // Limits only: requests default to them.
        assert_eq!(
            qos_class(&[res(None, Some(1), None, Some(1))]),
            QosClass::Guaranteed
        );
        assert_eq!(qos_class(&[g, Resources::default()]), QosClass::Burstable);
        assert_eq!(
            qos_class(&[res(Some(50), Some(100), Some(1), Some(1))]),
            QosClass::Burstable
        );
        assert_eq!(
            qos_class(&[res(Some(50), None, None, None)]),
            QosClass::Burstable
        );
    }

    #[test]
    fn oom_scores() {
        let r = res(None, None, Some(1 << 30), None);
        assert_eq!(oom_score_adj(QosClass::Guaranteed, &r, 4 << 30), -997);
        assert_eq!(oom_score_adj(QosClass::BestEffort, &r, 4 << 30), 1000);
        assert_eq!(oom_score_adj(QosClass::Burstable, &r, 4 << 30), 750);
        assert_eq!(oom_score_adj(QosClass::Burstable, &r, 1 << 30), 2);
        assert_eq!(
            oom_score_adj(QosClass::Burstable, &Resources::default(), 1 << 30),
            999
        );
    }
}
