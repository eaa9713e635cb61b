//! `--config FILE`: kube-proxy's `KubeProxyConfiguration`
//! (`kubeproxy.config.k8s.io/v1alpha1`), so the ConfigMap an operator runs
//! kube-proxy with keeps working.
//!
//! Every field is sorted into one of three kinds:
//! - honoured: mapped onto the agent's own setting ([`Settings`]);
//! - without effect here (sync periods, iptables/IPVS tuning, `mode`, …):
//!   accepted, with one warning each when it is set to something other than
//!   kube-proxy's default, since then the operator expects a change;
//! - asking for behaviour Weir does not have (`masqueradeAll`): refused,
//!   naming the field and why.
//!
//! Unknown fields get a warning too, as kube-proxy's lenient decoding does.
use std::time::Duration;

use serde_json::Value;

pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
pub const KIND: &str = "KubeProxyConfiguration";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("not valid YAML or JSON: {0}")]
    Syntax(String),
    #[error("apiVersion/kind must be {API_VERSION}/{KIND}, not {0}")]
    Kind(String),
    #[error("{field}: {reason}")]
    Field { field: String, reason: String },
}

/// The fields the agent honours, as found in the file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    pub hostname_override: Option<String>,
    pub healthz_bind_address: Option<String>,
    pub metrics_bind_address: Option<String>,
    pub cluster_cidr: Option<String>,
    pub node_port_addresses: Option<Vec<String>>,
    pub kubeconfig: Option<String>,
    pub ct_tcp_established: Option<Duration>,
    pub ct_udp: Option<Duration>,
    pub verbosity: Option<u8>,
    pub log_format: Option<String>,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub settings: Settings,
    /// One line per field accepted without effect, naming it.
    pub warnings: Vec<String>,
}

/// A field kube-proxy has and Weir does not act on, with kube-proxy's
/// default (a value equal to it changes nothing and is not warned about).
const NO_EFFECT: &[(&str, &str, &str)] = &[
    ("featureGates", "{}", "Weir has no feature gates"),
    (
        "bindAddress",
        "\"0.0.0.0\"",
        "Weir takes the node's addresses from its interfaces and Node",
    ),
    (
        "bindAddressHardFail",
        "true",
        "Weir always exits when it cannot bind its ports",
    ),
    ("enableProfiling", "false", "Weir serves no pprof"),
    (
        "showHiddenMetricsForVersion",
        "\"\"",
        "Weir hides no metrics",
    ),
    ("mode", "\"\"", "Weir's datapath is always eBPF"),
    (
        "detectLocalMode",
        "\"\"",
        "Weir balances pod traffic at the socket and needs no local-traffic detection",
    ),
    ("detectLocal", "{}", "Weir needs no local-traffic detection"),
    ("logging.options", "{}", "use logging.format"),
    (
        "oomScoreAdj",
        "-999",
        "set the agent pod's priority instead",
    ),
    (
        "configSyncPeriod",
        "\"15m0s\"",
        "Weir's watches need no resync",
    ),
    (
        "portRange",
        "\"\"",
        "the userspace proxy is gone from kube-proxy too",
    ),
    ("winkernel", "{}", "Weir runs on Linux"),
    ("windowsRunAsService", "false", "Weir runs on Linux"),
    (
        "iptables.masqueradeBit",
        "14",
        "Weir uses no netfilter marks",
    ),
    (
        "iptables.localhostNodePorts",
        "true",
        "Weir's NodePorts are on the node's global addresses",
    ),
    (
        "iptables.syncPeriod",
        "\"30s\"",
        "Weir syncs each change as it comes",
    ),
    (
        "iptables.minSyncPeriod",
        "\"1s\"",
        "Weir syncs each change as it comes",
    ),
    (
        "iptables.snatNodeInternalIP",
        "false",
        "Weir SNATs to the egress address",
    ),
    ("ipvs", "{}", "Weir does not use IPVS"),
    (
        "nftables.masqueradeBit",
        "14",
        "Weir uses no netfilter marks",
    ),
    (
        "nftables.syncPeriod",
        "\"30s\"",
        "Weir syncs each change as it comes",
    ),
    (
        "nftables.minSyncPeriod",
        "\"1s\"",
        "Weir syncs each change as it comes",
    ),
    (
        "conntrack.maxPerCore",
        "32768",
        "size Weir's own tables with --ct-max",
    ),
    (
        "conntrack.min",
        "131072",
        "size Weir's own tables with --ct-max",
    ),
    (
        "conntrack.tcpCloseWaitTimeout",
        "\"1h0m0s\"",
        "Weir's timeout after FIN is --ct-timeout-tcp-fin",
    ),
    (
        "conntrack.tcpBeLiberal",
        "false",
        "Weir's conntrack does not track TCP windows",
    ),
    (
        "conntrack.udpTimeout",
        "\"0s\"",
        "Weir has one UDP timeout, set by conntrack.udpStreamTimeout",
    ),
    (
        "clientConnection.acceptContentTypes",
        "\"\"",
        "Weir's client speaks JSON",
    ),
    (
        "clientConnection.contentType",
        "\"application/vnd.kubernetes.protobuf\"",
        "Weir's client speaks JSON",
    ),
    (
        "clientConnection.qps",
        "5",
        "Weir's client is not rate limited",
    ),
    (
        "clientConnection.burst",
        "10",
        "Weir's client is not rate limited",
    ),
    (
        "logging.flushFrequency",
        "\"5s\"",
        "Weir writes log lines as they come",
    ),
    (
        "logging.vmodule",
        "[]",
        "per-file verbosity has no Rust counterpart; use RUST_LOG",
    ),
];

/// Fields that ask for behaviour Weir does not have: refused when true.
const REFUSED_IF_TRUE: &[(&str, &str)] = &[
    (
        "iptables.masqueradeAll",
        "Weir does not SNAT traffic to ClusterIPs: backends see the client's address",
    ),
    (
        "nftables.masqueradeAll",
        "Weir does not SNAT traffic to ClusterIPs: backends see the client's address",
    ),
];

/// Fields honoured, each read by [`settings`].
const HONOURED: &[&str] = &[
    "apiVersion",
    "kind",
    "hostnameOverride",
    "healthzBindAddress",
    "metricsBindAddress",
    "clusterCIDR",
    "nodePortAddresses",
    "clientConnection.kubeconfig",
    "conntrack.tcpEstablishedTimeout",
    "conntrack.udpStreamTimeout",
    "logging.verbosity",
    "logging.format",
];

/// Parses a KubeProxyConfiguration document (YAML or JSON).
pub fn parse(text: &str) -> Result<Parsed, ConfigError> {
    let doc: Value =
        serde_saphyr::from_str(text).map_err(|e| ConfigError::Syntax(e.to_string()))?;
    let version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
    if version != API_VERSION || kind != KIND {
        return Err(ConfigError::Kind(format!("{version:?}/{kind:?}")));
    }
    let mut warnings = Vec::new();
    for (path, value) in leaves(&doc) {
        if value.is_null() || HONOURED.contains(&path.as_str()) {
            continue;
        }
        if let Some((_, why)) = REFUSED_IF_TRUE.iter().find(|(p, _)| *p == path) {
            if value == Value::Bool(true) {
                return Err(ConfigError::Field {
                    field: path,
                    reason: format!("true is not supported: {why}"),
                });
            }
            continue;
        }
        match NO_EFFECT
            .iter()
            .find(|(p, ..)| path == *p || path.starts_with(&format!("{p}.")))
        {
            // A field inside a listed section (ipvs.strictARP) has no
            // default of its own here: only a zero value changes nothing.
            Some((p, default, why)) => {
                let default = if path == *p { default } else { "null" };
                if !is_default(&value, default) {
                    warnings.push(format!("{path}: {} has no effect: {why}", compact(&value)));
                }
            }
            None => warnings.push(format!("{path}: unknown field, ignored")),
        }
    }
    warnings.dedup();
    Ok(Parsed {
        settings: settings(&doc)?,
        warnings,
    })
}

fn settings(doc: &Value) -> Result<Settings, ConfigError> {
    let string = |path: &str| -> Result<Option<String>, ConfigError> {
        match lookup(doc, path) {
            Value::Null => Ok(None),
            Value::String(s) if s.is_empty() => Ok(None),
            Value::String(s) => Ok(Some(s)),
            other => Err(field(path, format!("{} is not a string", compact(&other)))),
        }
    };
    let duration = |path: &str| -> Result<Option<Duration>, ConfigError> {
        string(path)?
            .map(|s| {
                go_duration(&s)
                    .ok_or_else(|| field(path, format!("{s:?} is not a duration such as 1h0m0s")))
            })
            .transpose()
            // kube-proxy's 0s means "leave the kernel's value": here, ours.
            .map(|d| d.filter(|d| !d.is_zero()))
    };
    let node_port_addresses = match lookup(doc, "nodePortAddresses") {
        Value::Null => None,
        Value::Array(items) => Some(
            items
                .iter()
                .map(|v| {
                    v.as_str().map(str::to_owned).ok_or_else(|| {
                        field(
                            "nodePortAddresses",
                            format!("{} is not a string", compact(v)),
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
        ),
        other => {
            return Err(field(
                "nodePortAddresses",
                format!("{} is not a list", compact(&other)),
            ));
        }
    };
    let verbosity = match lookup(doc, "logging.verbosity") {
        Value::Null => None,
        v => Some(
            v.as_u64()
                .and_then(|n| u8::try_from(n).ok())
                .ok_or_else(|| {
                    field("logging.verbosity", format!("{} is not 0-255", compact(&v)))
                })?,
        ),
    };
    let log_format = string("logging.format")?;
    if let Some(f) = log_format
        .as_deref()
        .filter(|f| !matches!(*f, "text" | "json"))
    {
        return Err(field(
            "logging.format",
            format!("{f:?} is not text or json"),
        ));
    }
    Ok(Settings {
        hostname_override: string("hostnameOverride")?,
        healthz_bind_address: string("healthzBindAddress")?,
        metrics_bind_address: string("metricsBindAddress")?,
        cluster_cidr: string("clusterCIDR")?,
        node_port_addresses,
        kubeconfig: string("clientConnection.kubeconfig")?,
        ct_tcp_established: duration("conntrack.tcpEstablishedTimeout")?,
        ct_udp: duration("conntrack.udpStreamTimeout")?,
        verbosity,
        log_format,
    })
}

fn field(path: &str, reason: String) -> ConfigError {
    ConfigError::Field {
        field: path.to_owned(),
        reason,
    }
}

/// Every scalar and list in `doc` by dotted path; an empty map or list is
/// a leaf too, so it can be compared with a default.
fn leaves(doc: &Value) -> Vec<(String, Value)> {
    fn walk(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, v) in m {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&path, v, out);
                }
            }
            _ => out.push((prefix.to_owned(), v.clone())),
        }
    }
    let mut out = Vec::new();
    walk("", doc, &mut out);
    out
}

fn lookup(doc: &Value, path: &str) -> Value {
    path.split('.')
        .try_fold(doc, |v, k| v.get(k))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Whether `v` is kube-proxy's `default` (JSON text) or a zero value, which
/// kubeadm writes for every field it leaves to the defaults (`0s`, `null`).
fn is_default(v: &Value, default: &str) -> bool {
    let zero = match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => matches!(s.as_str(), "" | "0" | "0s"),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    };
    zero || serde_json::from_str::<Value>(default).is_ok_and(|d| *v == d)
}

fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// A Go duration (`1h0m0s`, `300ms`, `1.5h`): what kube-proxy writes.
pub fn go_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = s;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&n| n > 0)?;
        let n: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        total += n * scale;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).ok()
}

/// The agent's effective settings as `/configz` shows them: kube-proxy's
/// shape (`{"kubeproxy.config.k8s.io": {...}}`) with the v1alpha1 field
/// names a file would use, and `mode: ebpf`. (kube-proxy itself serves its
/// internal type there, with Go's field names; that is a known upstream
/// bug, kubernetes/kubernetes#137426, not something to copy.)
pub fn configz(s: &Settings, hard_fail: bool) -> String {
    let d = |d: Option<Duration>| d.map(format_go_duration);
    let doc = serde_json::json!({
        "kubeproxy.config.k8s.io": {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "mode": "ebpf",
            "hostnameOverride": s.hostname_override,
            "metricsBindAddress": s.metrics_bind_address.clone().unwrap_or_default(),
            "healthzBindAddress": s.healthz_bind_address.clone().unwrap_or_default(),
            "bindAddressHardFail": hard_fail,
            "clusterCIDR": s.cluster_cidr.clone().unwrap_or_default(),
            "nodePortAddresses": s.node_port_addresses,
            "clientConnection": {"kubeconfig": s.kubeconfig.clone().unwrap_or_default()},
            "conntrack": {
                "tcpEstablishedTimeout": d(s.ct_tcp_established),
                "udpStreamTimeout": d(s.ct_udp),
            },
            "logging": {
                "format": s.log_format.clone().unwrap_or_else(|| "text".into()),
                "verbosity": s.verbosity.unwrap_or(0),
            },
        }
    });
    doc.to_string()
}

/// `d` as Go prints a duration (`6h0m0s`, `1m0s`, `10s`, `500ms`).
pub fn format_go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return format!("{}ms", d.as_millis());
    }
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests;
