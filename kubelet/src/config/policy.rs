//! What a KubeletConfiguration written for the real kubelet (by kubeadm, by
//! kind, by hand) may say beyond the fields this kubelet honours.
//!
//! ```text
//!  file ─▶ zero values of honoured fields dropped (the kubelet defaults them)
//!       ─▶ each known field not acted on:
//!            harmless here ──────────────▶ accepted, one warning
//!            asks for what we do anyway ─▶ accepted
//!            asks for what we cannot do ─▶ refused, with the reason
//!       ─▶ the rest: honoured fields, anything else refused as unknown
//! ```
//!
//! Refusing is for settings whose absence would change what a pod or the
//! node gets (reserved resources, CPU pinning, eviction thresholds, a
//! systemd cgroup tree): a kubelet that starts and silently does otherwise
//! is worse than one that says why it will not.
use serde_json::Value;

use super::{FieldError, parse_go_duration};

/// A field accepted but not acted on, reported once at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ignored {
    pub field: &'static str,
    pub why: &'static str,
}

enum Rule {
    /// Any value: it tunes something this kubelet does not have, and
    /// without it nothing a pod gets changes.
    Ignore(&'static str),
    /// Accepted while the value asks for what this kubelet does anyway,
    /// refused otherwise, with why.
    Only(Test, &'static str),
}

use Rule::{Ignore, Only};

/// Whether a value is one a rule accepts, or the zero of a field.
type Test = fn(&Value) -> bool;

/// Honoured fields whose zero value the kubelet's defaulting replaces
/// (`SetDefaults_KubeletConfiguration`: a zero duration or port is unset):
/// kubeadm writes `0s` for every duration it leaves to the kubelet.
const ZERO_IS_DEFAULT: &[(&str, Test)] = &[
    ("syncFrequency", zero_duration),
    ("fileCheckFrequency", zero_duration),
    ("nodeStatusUpdateFrequency", zero_duration),
    ("authorization.webhook.cacheAuthorizedTTL", zero_duration),
    ("authorization.webhook.cacheUnauthorizedTTL", zero_duration),
    ("evictionPressureTransitionPeriod", zero_duration),
    ("evictionMaxPodGracePeriod", zero_number),
    ("port", zero_number),
    ("nodeLeaseDurationSeconds", zero_number),
    ("maxPods", zero_number),
    ("containerLogMaxSize", empty_string),
    ("containerRuntimeEndpoint", empty_string),
    ("address", empty_string),
    ("healthzBindAddress", empty_string),
    ("authorization.mode", empty_string),
];

const NO_TOKENS: &str = "bearer tokens are not authenticated (no TokenReview): such requests get 401; \
     authenticate with client certificates";
const NO_RATE_LIMIT: &str = "API and registry rate limits are not applied";
const NO_DEBUG: &str = "the debugging, profiling and log-query handlers are not served";
const NO_GC: &str = "unused images are not garbage-collected";
const NOT_HERE: &str = "not used by this kubelet";
const NO_RECLAIM: &str =
    "eviction stops once no threshold is met; no minimum beyond it is reclaimed";
const NO_MEMCG: &str = "memory is observed every monitoring period, not on memcg notifications";
const NO_ALLOCATABLE: &str = "node allocatable is not reduced by reservations: the scheduler would place pods on \
     resources this kubelet does not set aside";

const RULES: &[(&str, Rule)] = &[
    ("authentication.webhook", Ignore(NO_TOKENS)),
    ("logging", Ignore("log output is set with RUST_LOG")),
    ("featureGates", Ignore("feature gates are not read")),
    (
        "rotateCertificates",
        Ignore("client certificates are not rotated"),
    ),
    (
        "serverTLSBootstrap",
        Only(
            is_false,
            "the serving certificate is tlsCertFile or self-signed; no CSR is made",
        ),
    ),
    (
        "tlsCipherSuites",
        Ignore("TLS 1.2+ with rustls' default suites"),
    ),
    (
        "tlsMinVersion",
        Ignore("TLS 1.2+ with rustls' default suites"),
    ),
    (
        "enableServer",
        Only(is_true, "the kubelet API cannot be turned off"),
    ),
    ("httpCheckFrequency", Ignore(NOT_HERE)),
    (
        "staticPodURL",
        Only(is_empty, "static pods are read from staticPodPath only"),
    ),
    ("staticPodURLHeader", Ignore(NOT_HERE)),
    ("registryPullQPS", Ignore(NO_RATE_LIMIT)),
    ("registryBurst", Ignore(NO_RATE_LIMIT)),
    ("eventRecordQPS", Ignore(NO_RATE_LIMIT)),
    ("eventBurst", Ignore(NO_RATE_LIMIT)),
    ("kubeAPIQPS", Ignore(NO_RATE_LIMIT)),
    ("kubeAPIBurst", Ignore(NO_RATE_LIMIT)),
    ("contentType", Ignore("the API is spoken in JSON")),
    ("enableDebuggingHandlers", Ignore(NO_DEBUG)),
    ("enableContentionProfiling", Ignore(NO_DEBUG)),
    ("enableProfilingHandler", Ignore(NO_DEBUG)),
    ("enableDebugFlagsHandler", Ignore(NO_DEBUG)),
    ("enableSystemLogHandler", Ignore(NO_DEBUG)),
    ("enableSystemLogQuery", Ignore(NO_DEBUG)),
    (
        "oomScoreAdj",
        Ignore("the kubelet's own OOM score is left as started"),
    ),
    (
        "streamingConnectionIdleTimeout",
        Ignore("idle streams are timed out by the runtime's streaming server"),
    ),
    (
        "nodeStatusReportFrequency",
        Ignore("the status is posted when it changes and every nodeStatusUpdateFrequency"),
    ),
    ("imageMinimumGCAge", Ignore(NO_GC)),
    ("imageMaximumGCAge", Ignore(NO_GC)),
    ("imageGCHighThresholdPercent", Ignore(NO_GC)),
    ("imageGCLowThresholdPercent", Ignore(NO_GC)),
    (
        "volumeStatsAggPeriod",
        Ignore("volume usage is not reported"),
    ),
    ("volumePluginDir", Ignore("there are no volume plugins")),
    ("providerID", Ignore("Node.spec.providerID is not set")),
    ("kubeletCgroups", Ignore(NOT_HERE)),
    ("systemCgroups", Ignore(NOT_HERE)),
    ("cgroupRoot", Ignore("pods go under --cgroup-root")),
    (
        "cgroupsPerQOS",
        Only(is_true, "pods always get per-QoS cgroups"),
    ),
    (
        "cgroupDriver",
        Only(
            |v| v.as_str() == Some("cgroupfs"),
            "pods' cgroups are cgroupfs paths: run containerd with SystemdCgroup = false \
             and set cgroupDriver: cgroupfs",
        ),
    ),
    (
        "cpuManagerPolicy",
        Only(eq_none, "CPUs are not pinned (only the none policy)"),
    ),
    (
        "cpuManagerPolicyOptions",
        Only(is_empty, "CPUs are not pinned"),
    ),
    ("cpuManagerReconcilePeriod", Ignore(NOT_HERE)),
    (
        "memoryManagerPolicy",
        Only(
            |v| v.as_str().is_some_and(|s| s.eq_ignore_ascii_case("none")),
            "memory is not pinned to NUMA nodes (only the None policy)",
        ),
    ),
    (
        "topologyManagerPolicy",
        Only(
            eq_none,
            "there is no topology manager (only the none policy)",
        ),
    ),
    ("topologyManagerScope", Ignore(NOT_HERE)),
    (
        "topologyManagerPolicyOptions",
        Only(is_empty, "there is no topology manager"),
    ),
    ("qosReserved", Only(is_empty, NO_ALLOCATABLE)),
    (
        "runtimeRequestTimeout",
        Ignore("CRI calls time out after 2m, the kubelet's default"),
    ),
    ("hairpinMode", Ignore("hairpin traffic is the CNI plugin's")),
    (
        "podCIDR",
        Ignore("pod addresses come from the CNI configuration"),
    ),
    (
        "podPidsLimit",
        Only(
            |v| v.as_i64().is_some_and(|n| n <= 0),
            "a pod's process count is not limited",
        ),
    ),
    ("resolvConfDefault", Ignore(NOT_HERE)),
    ("cpuCFSQuota", Only(is_true, "CPU limits are CFS quotas")),
    (
        "cpuCFSQuotaPeriod",
        Only(
            |v| {
                v.as_str().and_then(parse_go_duration)
                    == Some(std::time::Duration::from_millis(100))
            },
            "the CFS period is 100ms",
        ),
    ),
    (
        "nodeStatusMaxImages",
        Ignore("the Node's images are not listed"),
    ),
    ("maxOpenFiles", Ignore(NOT_HERE)),
    (
        "serializeImagePulls",
        Ignore("each pod's images are pulled by its own task"),
    ),
    (
        "maxParallelImagePulls",
        Ignore("each pod's images are pulled by its own task"),
    ),
    ("evictionMinimumReclaim", Ignore(NO_RECLAIM)),
    (
        "podsPerCore",
        Only(|v| v.as_i64() == Some(0), "maxPods alone bounds the pods"),
    ),
    (
        "enableControllerAttachDetach",
        Ignore("there are no attachable volumes"),
    ),
    (
        "protectKernelDefaults",
        Ignore("kernel tunables are not checked"),
    ),
    (
        "makeIPTablesUtilChains",
        Ignore("the kubelet writes no iptables rules"),
    ),
    (
        "iptablesMasqueradeBit",
        Ignore("the kubelet writes no iptables rules"),
    ),
    (
        "iptablesDropBit",
        Ignore("the kubelet writes no iptables rules"),
    ),
    ("failSwapOn", Ignore("swap is not checked")),
    ("memorySwap", Ignore("containers get no swap settings")),
    (
        "containerLogMaxWorkers",
        Ignore("one task rotates every log"),
    ),
    (
        "configMapAndSecretChangeDetectionStrategy",
        Ignore("objects are watched and files refreshed every syncFrequency"),
    ),
    ("systemReserved", Only(is_empty, NO_ALLOCATABLE)),
    ("kubeReserved", Only(is_empty, NO_ALLOCATABLE)),
    ("reservedSystemCPUs", Only(is_empty, NO_ALLOCATABLE)),
    ("reservedMemory", Only(is_empty, NO_ALLOCATABLE)),
    ("systemReservedCgroup", Ignore(NO_ALLOCATABLE)),
    ("kubeReservedCgroup", Ignore(NO_ALLOCATABLE)),
    (
        "enforceNodeAllocatable",
        Only(
            |v| {
                v.as_array()
                    .is_some_and(|a| a.iter().all(|x| x == "pods" || x == "none"))
            },
            NO_ALLOCATABLE,
        ),
    ),
    (
        "allowedUnsafeSysctls",
        Ignore("pods asking for sysctls are not admitted for them"),
    ),
    (
        "showHiddenMetricsForVersion",
        Ignore("no metrics are served"),
    ),
    ("kernelMemcgNotification", Ignore(NO_MEMCG)),
    (
        "shutdownGracePeriod",
        Only(zero_duration, "graceful node shutdown is not implemented"),
    ),
    (
        "shutdownGracePeriodCriticalPods",
        Only(zero_duration, "graceful node shutdown is not implemented"),
    ),
    (
        "shutdownGracePeriodByPodPriority",
        Only(is_empty, "graceful node shutdown is not implemented"),
    ),
    (
        "registerNode",
        Only(is_true, "the kubelet always registers its Node"),
    ),
    (
        "registerWithTaints",
        Only(is_empty, "the Node is registered without taints"),
    ),
    (
        "localStorageCapacityIsolation",
        Ignore("ephemeral storage is not limited"),
    ),
    (
        "imageServiceEndpoint",
        Only(is_empty, "images are served by containerRuntimeEndpoint"),
    ),
    ("failCgroupV1", Ignore(NOT_HERE)),
    (
        "seccompDefault",
        Only(
            is_false,
            "containers without a seccompProfile run Unconfined, as the kubelet's default",
        ),
    ),
    ("memoryThrottlingFactor", Ignore("there is no memory QoS")),
    ("singleProcessOOMKill", Ignore(NOT_HERE)),
    (
        "podLogsDir",
        Ignore("container logs go under --pod-logs-dir"),
    ),
    (
        "crashLoopBackOff",
        Ignore("restarts back off from 10s to 5m, the kubelet's default"),
    ),
    ("imagePullCredentialsVerificationPolicy", Ignore(NOT_HERE)),
    ("preloadedImagesVerificationAllowlist", Ignore(NOT_HERE)),
    (
        "userNamespaces",
        Ignore("pods with hostUsers: false are not given user namespaces"),
    ),
    ("podHousekeepingPeriod", Ignore(NOT_HERE)),
];

/// Drops zero values the kubelet defaults and the fields [`RULES`] know,
/// returning those accepted without effect, or every refusal at once.
pub(super) fn sort(doc: &mut Value) -> Result<Vec<Ignored>, Vec<FieldError>> {
    for (path, zero) in ZERO_IS_DEFAULT {
        if take(doc, path, *zero).is_some() {
            tracing::debug!(field = path, "zero value: the default applies");
        }
    }
    let (mut ignored, mut refused) = (Vec::new(), Vec::new());
    for (field, rule) in RULES {
        let Some(value) = take(doc, field, |_| true) else {
            continue;
        };
        match rule {
            Ignore(why) => ignored.push(Ignored { field, why }),
            Only(ok, _) if ok(&value) => {}
            Only(_, why) => refused.push(FieldError::Unsupported {
                field,
                value: value.to_string(),
                why,
            }),
        }
    }
    if refused.is_empty() {
        Ok(ignored)
    } else {
        Err(refused)
    }
}

/// Removes the value at a dotted path when `pick` says so.
fn take(doc: &mut Value, path: &str, pick: Test) -> Option<Value> {
    let (parent, key) = match path.rsplit_once('.') {
        Some((head, key)) => (
            head.split('.')
                .try_fold(&mut *doc, |v, k| v.as_object_mut()?.get_mut(k))?,
            key,
        ),
        None => (doc, path),
    };
    let map = parent.as_object_mut()?;
    if pick(map.get(key)?) {
        map.remove(key)
    } else {
        None
    }
}

fn is_true(v: &Value) -> bool {
    v.as_bool() == Some(true)
}

fn is_false(v: &Value) -> bool {
    v.as_bool() == Some(false)
}

/// Unset in all but name: null, "", [], {}.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

fn eq_none(v: &Value) -> bool {
    v.as_str() == Some("none")
}

fn zero_duration(v: &Value) -> bool {
    v.as_str()
        .and_then(parse_go_duration)
        .is_some_and(|d| d.is_zero())
}

fn zero_number(v: &Value) -> bool {
    v.as_f64() == Some(0.0)
}

fn empty_string(v: &Value) -> bool {
    v.as_str() == Some("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_reach_nested_fields_and_leave_the_rest() {
        let mut doc = serde_json::json!({"a": {"b": {"c": 1, "d": 2}}, "e": 3});
        assert_eq!(take(&mut doc, "a.b.c", |_| true), Some(1.into()));
        assert_eq!(take(&mut doc, "a.x.c", |_| true), None);
        assert_eq!(take(&mut doc, "e", zero_number), None);
        assert_eq!(doc, serde_json::json!({"a": {"b": {"d": 2}}, "e": 3}));
    }

    #[test]
    fn every_rule_names_a_distinct_field() {
        let mut seen = std::collections::BTreeSet::new();
        for (field, _) in RULES {
            assert!(seen.insert(*field), "{field} twice");
            assert!(
                !ZERO_IS_DEFAULT.iter().any(|(f, _)| f == field),
                "{field} is honoured"
            );
        }
    }
}
