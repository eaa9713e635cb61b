//! The `kubelet.config.k8s.io/v1beta1` KubeletConfiguration file, reduced to the
//! fields weir-kubelet honours, with the kubelet's defaults
//! (pkg/kubelet/apis/config/v1beta1/defaults.go) and validation
//! (pkg/kubelet/apis/config/validation/validation.go). What else a file
//! written for the real kubelet may say is [`policy`]'s.
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;

use crate::eviction::EvictionConfig;

mod policy;

pub use policy::Ignored;

pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub const KIND: &str = "KubeletConfiguration";

/// What the kubelet runs with, every value checked and defaulted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub address: IpAddr,
    pub port: u16,
    /// `None` when `healthzPort: 0` turns the endpoint off.
    pub healthz_port: Option<u16>,
    pub healthz_bind_address: IpAddr,
    /// `None`: no static pods.
    pub static_pod_path: Option<PathBuf>,
    pub file_check_frequency: Duration,
    /// `syncFrequency` (1m): how often a running pod's projected files
    /// (ConfigMaps, Secrets, downward API, service-account tokens) are
    /// brought up to date.
    pub sync_frequency: Duration,
    pub cluster_dns: Vec<IpAddr>,
    /// `None`: pods get no cluster search domains.
    pub cluster_domain: Option<String>,
    /// The node's resolver config for pods that do not use the cluster's;
    /// empty (`resolvConf: ""`) gives them the node's loopback instead.
    pub resolv_conf: PathBuf,
    pub node_status_update_frequency: Duration,
    pub node_lease_duration: Duration,
    /// The CRI socket's path (the endpoint is always `unix://`).
    pub container_runtime_endpoint: PathBuf,
    pub max_pods: u32,
    pub client_ca_file: Option<PathBuf>,
    pub authorization: Authorization,
    /// Both or neither: without them the kubelet serves a self-signed certificate.
    pub tls: Option<TlsFiles>,
    /// `None` when `readOnlyPort: 0` (the default) turns it off.
    pub read_only_port: Option<u16>,
    /// A container's log file is rotated once it is larger (bytes).
    pub container_log_max_size: u64,
    /// The current file plus rotated ones kept per container.
    pub container_log_max_files: u32,
    /// How often log sizes are checked.
    pub container_log_monitor_interval: Duration,
    /// Node-pressure eviction: `evictionHard` (the kubelet's defaults when
    /// unset), `evictionSoft` with its grace periods, and the rest.
    pub eviction: EvictionConfig,
    /// Fields the file sets that this kubelet accepts but does not act on,
    /// for one warning each at start.
    pub ignored: Vec<Ignored>,
}

/// `authorization`: who may use the kubelet API once authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authorization {
    /// `None` when the file does not say: the kubelet's default, Webhook,
    /// which needs an API server (see [`Authorization::mode_for`]).
    pub mode: Option<AuthorizationMode>,
    /// `webhook.cacheAuthorizedTTL` (5m; zero is the default, as the
    /// kubelet's defaulting has it).
    pub cache_authorized_ttl: Duration,
    /// `webhook.cacheUnauthorizedTTL` (30s; zero is the default).
    pub cache_unauthorized_ttl: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthorizationMode {
    AlwaysAllow,
    /// A SubjectAccessReview to the API server per request (cached).
    Webhook,
}

/// `authorization.mode: Webhook` was asked for without an API server to ask.
#[derive(Debug, thiserror::Error)]
#[error(
    "authorization.mode: Webhook needs an API server (--kubeconfig); \
     standalone, set authorization.mode: AlwaysAllow"
)]
pub struct WebhookWithoutApiServer;

impl Authorization {
    /// The mode in force. The kubelet defaults to Webhook, and so does this
    /// one with a kubeconfig; the real kubelet refuses to start standalone
    /// with Webhook, and so does this one when the file says Webhook. A file
    /// that says nothing keeps working standalone, as it did before
    /// authorization existed here: there is no API server holding RBAC
    /// objects to ask, so AlwaysAllow (with a warning from the caller).
    pub fn mode_for(
        &self,
        have_api_server: bool,
    ) -> Result<AuthorizationMode, WebhookWithoutApiServer> {
        match (self.mode, have_api_server) {
            (Some(AuthorizationMode::AlwaysAllow), _) | (None, false) => {
                Ok(AuthorizationMode::AlwaysAllow)
            }
            (Some(AuthorizationMode::Webhook) | None, true) => Ok(AuthorizationMode::Webhook),
            (Some(AuthorizationMode::Webhook), false) => Err(WebhookWithoutApiServer),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl Config {
    /// How often the Lease is renewed: a quarter of its duration, as the
    /// kubelet's `nodeLeaseRenewIntervalFraction` (0.25) does.
    pub fn lease_renew_interval(&self) -> Duration {
        self.node_lease_duration / 4
    }
}

impl Default for Config {
    fn default() -> Self {
        parse_str("{apiVersion: kubelet.config.k8s.io/v1beta1, kind: KubeletConfiguration}")
            .expect("the empty configuration is valid")
    }
}

/// Why a configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("not valid YAML or JSON: {first_line}")]
    Syntax { first_line: String },
    /// An unknown field or a value of the wrong type.
    #[error("{field}: {error}")]
    Decode {
        field: String,
        error: serde_json::Error,
    },
    #[error("{}", join(.0))]
    Invalid(Vec<FieldError>),
}

fn join(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// One invalid value, named by its field path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FieldError {
    #[error("{field}: is required, and must be {expected:?}")]
    Missing {
        field: &'static str,
        expected: &'static str,
    },
    #[error("{field}: {value:?} is not supported, only {expected:?}")]
    WrongValue {
        field: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("{field}: {value} is out of range {min}-{max}")]
    OutOfRange {
        field: &'static str,
        value: i64,
        min: i64,
        max: i64,
    },
    #[error("{field}: {value:?} is not a duration")]
    NotADuration { field: &'static str, value: String },
    #[error("{field}: {value:?} must be longer than zero")]
    NotPositive { field: &'static str, value: String },
    #[error("{field}: {value:?} must be at least {min}")]
    TooShort {
        field: &'static str,
        value: String,
        min: &'static str,
    },
    #[error("{field}: {value:?} is not a positive quantity of bytes")]
    NotAQuantity { field: &'static str, value: String },
    #[error("{field}: {value:?} is not an IP")]
    NotAnIp { field: String, value: String },
    #[error("{field}: {value:?} is not a DNS domain")]
    NotADomain { field: &'static str, value: String },
    #[error("{field}: {value:?} is not a unix socket endpoint (unix:///absolute/path)")]
    NotUnixEndpoint { field: &'static str, value: String },
    #[error("{field}: is required when {other} is set")]
    Pair {
        field: &'static str,
        other: &'static str,
    },
    #[error("{field}: true is not supported: anonymous requests are always refused")]
    AnonymousAuth { field: &'static str },
    /// An eviction threshold or one of its settings.
    #[error("{field}: {message}")]
    Eviction { field: String, message: String },
    /// A field of the real kubelet's that asks for what this one cannot do.
    #[error("{field}: {value} is not supported: {why}")]
    Unsupported {
        field: &'static str,
        value: String,
        why: &'static str,
    },
}

/// The file as written, once [`policy`] took what it knows. Unknown fields
/// are refused, so a setting this kubelet would silently ignore (or a typo)
/// never looks honoured.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Raw {
    api_version: Option<String>,
    kind: Option<String>,
    address: Option<String>,
    port: Option<i64>,
    healthz_port: Option<i64>,
    healthz_bind_address: Option<String>,
    static_pod_path: Option<String>,
    file_check_frequency: Option<String>,
    sync_frequency: Option<String>,
    #[serde(rename = "clusterDNS")]
    cluster_dns: Option<Vec<String>>,
    cluster_domain: Option<String>,
    resolv_conf: Option<String>,
    node_status_update_frequency: Option<String>,
    node_lease_duration_seconds: Option<i64>,
    container_runtime_endpoint: Option<String>,
    max_pods: Option<i64>,
    authentication: Option<RawAuthentication>,
    authorization: Option<RawAuthorization>,
    tls_cert_file: Option<String>,
    tls_private_key_file: Option<String>,
    read_only_port: Option<i64>,
    container_log_max_size: Option<String>,
    container_log_max_files: Option<i64>,
    container_log_monitor_interval: Option<String>,
    eviction_hard: Option<BTreeMap<String, String>>,
    eviction_soft: Option<BTreeMap<String, String>>,
    eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    eviction_pressure_transition_period: Option<String>,
    eviction_max_pod_grace_period: Option<i64>,
    merge_default_eviction_settings: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuthentication {
    x509: Option<RawX509>,
    anonymous: Option<RawAnonymous>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawX509 {
    #[serde(rename = "clientCAFile")]
    client_ca_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuthorization {
    mode: Option<String>,
    webhook: Option<RawWebhook>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawWebhook {
    #[serde(rename = "cacheAuthorizedTTL")]
    cache_authorized_ttl: Option<String>,
    #[serde(rename = "cacheUnauthorizedTTL")]
    cache_unauthorized_ttl: Option<String>,
}

/// Accepted so that configurations written for the real kubelet, which
/// commonly say `anonymous: {enabled: false}`, keep working.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAnonymous {
    enabled: Option<bool>,
}

/// Reads and checks a configuration file.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_str(&text)
}

/// Parses a configuration in YAML or JSON.
pub fn parse_str(text: &str) -> Result<Config, ConfigError> {
    let doc: serde_json::Value = if text.trim_start().starts_with('{') {
        // JSON is YAML too, but serde_json's messages are clearer for it.
        match serde_json::from_str(text) {
            Ok(v) => v,
            Err(_) => yaml(text)?,
        }
    } else {
        yaml(text)?
    };
    let mut doc = if doc.is_null() {
        serde_json::Value::Object(Default::default())
    } else {
        doc
    };
    let ignored = policy::sort(&mut doc).map_err(ConfigError::Invalid)?;
    let raw: Raw = serde_path_to_error::deserialize(doc).map_err(|e| ConfigError::Decode {
        field: e.path().to_string(),
        error: e.into_inner(),
    })?;
    let mut config = validate(raw).map_err(ConfigError::Invalid)?;
    config.ignored = ignored;
    Ok(config)
}

fn yaml(text: &str) -> Result<serde_json::Value, ConfigError> {
    serde_saphyr::from_str(text).map_err(|e| ConfigError::Syntax {
        first_line: e.to_string().lines().next().unwrap_or_default().to_owned(),
    })
}

fn validate(raw: Raw) -> Result<Config, Vec<FieldError>> {
    let mut errs = Vec::new();
    match raw.api_version.as_deref() {
        Some(API_VERSION) => {}
        None => errs.push(FieldError::Missing {
            field: "apiVersion",
            expected: API_VERSION,
        }),
        Some(v) => errs.push(FieldError::WrongValue {
            field: "apiVersion",
            value: v.to_owned(),
            expected: API_VERSION,
        }),
    }
    match raw.kind.as_deref() {
        Some(KIND) => {}
        None => errs.push(FieldError::Missing {
            field: "kind",
            expected: KIND,
        }),
        Some(v) => errs.push(FieldError::WrongValue {
            field: "kind",
            value: v.to_owned(),
            expected: KIND,
        }),
    }
    let v4_any = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
    let address = ip("address", raw.address, v4_any, &mut errs);
    let healthz_bind_address = ip(
        "healthzBindAddress",
        raw.healthz_bind_address,
        IpAddr::V4(Ipv4Addr::LOCALHOST),
        &mut errs,
    );
    let port = ranged("port", raw.port, 10250, 1, 65535, &mut errs) as u16;
    let healthz_port = ranged("healthzPort", raw.healthz_port, 10248, 0, 65535, &mut errs) as u16;
    let read_only_port = ranged("readOnlyPort", raw.read_only_port, 0, 0, 65535, &mut errs) as u16;
    let lease = ranged(
        "nodeLeaseDurationSeconds",
        raw.node_lease_duration_seconds,
        40,
        1,
        i64::from(i32::MAX),
        &mut errs,
    );
    let max_pods = ranged(
        "maxPods",
        raw.max_pods,
        110,
        0,
        i64::from(i32::MAX),
        &mut errs,
    ) as u32;
    let file_check_frequency = duration(
        "fileCheckFrequency",
        raw.file_check_frequency,
        Duration::from_secs(20),
        &mut errs,
    );
    let transition = duration(
        "evictionPressureTransitionPeriod",
        raw.eviction_pressure_transition_period,
        Duration::from_secs(300),
        &mut errs,
    );
    let eviction = crate::eviction::thresholds::parse(&crate::eviction::thresholds::Raw {
        hard: raw.eviction_hard,
        soft: raw.eviction_soft,
        soft_grace_period: raw.eviction_soft_grace_period,
        pressure_transition_period: Some(transition),
        max_pod_grace_period: raw.eviction_max_pod_grace_period,
        merge_defaults: raw.merge_default_eviction_settings,
    })
    .unwrap_or_else(|es| {
        errs.extend(es.into_iter().map(|e| FieldError::Eviction {
            field: e.field,
            message: e.message,
        }));
        EvictionConfig::default()
    });
    let sync_frequency = duration(
        "syncFrequency",
        raw.sync_frequency,
        Duration::from_secs(60),
        &mut errs,
    );
    let node_status_update_frequency = duration(
        "nodeStatusUpdateFrequency",
        raw.node_status_update_frequency,
        Duration::from_secs(10),
        &mut errs,
    );
    let container_log_max_size = match raw.container_log_max_size.as_deref() {
        None => 10 << 20,
        Some(q) => match crate::pod::quantity::Quantity::parse(q)
            .ok()
            .and_then(|v| v.value())
        {
            Some(v) if v > 0 => v as u64,
            _ => {
                errs.push(FieldError::NotAQuantity {
                    field: "containerLogMaxSize",
                    value: q.to_owned(),
                });
                10 << 20
            }
        },
    };
    let container_log_max_files = ranged(
        "containerLogMaxFiles",
        raw.container_log_max_files,
        5,
        2,
        i64::from(i32::MAX),
        &mut errs,
    ) as u32;
    let container_log_monitor_interval = duration(
        "containerLogMonitorInterval",
        raw.container_log_monitor_interval.clone(),
        Duration::from_secs(10),
        &mut errs,
    );
    if container_log_monitor_interval < Duration::from_secs(3) {
        errs.push(FieldError::TooShort {
            field: "containerLogMonitorInterval",
            value: raw.container_log_monitor_interval.unwrap_or_default(),
            min: "3s",
        });
    }
    let cluster_dns = raw
        .cluster_dns
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .filter_map(|(i, s)| match s.parse::<IpAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                errs.push(FieldError::NotAnIp {
                    field: format!("clusterDNS[{i}]"),
                    value: s,
                });
                None
            }
        })
        .collect();
    let cluster_domain = raw.cluster_domain.filter(|d| !d.is_empty()).and_then(|d| {
        // The kubelet accepts a trailing dot; resolv.conf search lists don't want it.
        let d = d.strip_suffix('.').unwrap_or(&d).to_owned();
        if is_dns_subdomain(&d) {
            Some(d)
        } else {
            errs.push(FieldError::NotADomain {
                field: "clusterDomain",
                value: d,
            });
            None
        }
    });
    let endpoint = raw
        .container_runtime_endpoint
        .unwrap_or_else(|| "unix:///run/containerd/containerd.sock".to_owned());
    let container_runtime_endpoint = unix_endpoint("containerRuntimeEndpoint", &endpoint)
        .unwrap_or_else(|e| {
            errs.push(e);
            PathBuf::new()
        });
    let auth = raw.authentication.unwrap_or_default();
    if auth.anonymous.and_then(|a| a.enabled) == Some(true) {
        errs.push(FieldError::AnonymousAuth {
            field: "authentication.anonymous.enabled",
        });
    }
    let client_ca_file = auth
        .x509
        .and_then(|x| x.client_ca_file)
        .filter(|s| !s.is_empty())
        .map(PathBuf::from);
    let authorization = authorization(raw.authorization.unwrap_or_default(), &mut errs);
    let non_empty = |s: Option<String>| s.filter(|s| !s.is_empty()).map(PathBuf::from);
    let tls = match (
        non_empty(raw.tls_cert_file),
        non_empty(raw.tls_private_key_file),
    ) {
        (Some(cert_file), Some(key_file)) => Some(TlsFiles {
            cert_file,
            key_file,
        }),
        (None, None) => None,
        (Some(_), None) => {
            errs.push(FieldError::Pair {
                field: "tlsPrivateKeyFile",
                other: "tlsCertFile",
            });
            None
        }
        (None, Some(_)) => {
            errs.push(FieldError::Pair {
                field: "tlsCertFile",
                other: "tlsPrivateKeyFile",
            });
            None
        }
    };
    if !errs.is_empty() {
        return Err(errs);
    }
    Ok(Config {
        address,
        port,
        healthz_port: (healthz_port != 0).then_some(healthz_port),
        healthz_bind_address,
        static_pod_path: non_empty(raw.static_pod_path),
        file_check_frequency,
        sync_frequency,
        eviction,
        cluster_dns,
        cluster_domain,
        resolv_conf: PathBuf::from(raw.resolv_conf.as_deref().unwrap_or("/etc/resolv.conf")),
        node_status_update_frequency,
        node_lease_duration: Duration::from_secs(lease as u64),
        container_runtime_endpoint,
        max_pods,
        client_ca_file,
        authorization,
        tls,
        read_only_port: (read_only_port != 0).then_some(read_only_port),
        container_log_max_size,
        container_log_max_files,
        container_log_monitor_interval,
        ignored: Vec::new(),
    })
}

fn authorization(raw: RawAuthorization, errs: &mut Vec<FieldError>) -> Authorization {
    let mode = match raw.mode.as_deref() {
        None | Some("") => None,
        Some("AlwaysAllow") => Some(AuthorizationMode::AlwaysAllow),
        Some("Webhook") => Some(AuthorizationMode::Webhook),
        Some(other) => {
            errs.push(FieldError::WrongValue {
                field: "authorization.mode",
                value: other.to_owned(),
                expected: "AlwaysAllow or Webhook",
            });
            None
        }
    };
    let webhook = raw.webhook.unwrap_or_default();
    let mut ttl = |field: &'static str, value: Option<String>, default: Duration| match value {
        None => default,
        Some(s) => parse_go_duration(&s).unwrap_or_else(|| {
            errs.push(FieldError::NotADuration { field, value: s });
            default
        }),
    };
    Authorization {
        mode,
        cache_authorized_ttl: ttl(
            "authorization.webhook.cacheAuthorizedTTL",
            webhook.cache_authorized_ttl,
            Duration::from_secs(5 * 60),
        ),
        cache_unauthorized_ttl: ttl(
            "authorization.webhook.cacheUnauthorizedTTL",
            webhook.cache_unauthorized_ttl,
            Duration::from_secs(30),
        ),
    }
}

fn ip(
    field: &'static str,
    value: Option<String>,
    default: IpAddr,
    errs: &mut Vec<FieldError>,
) -> IpAddr {
    match value.filter(|s| !s.is_empty()) {
        None => default,
        Some(s) => s.parse().unwrap_or_else(|_| {
            errs.push(FieldError::NotAnIp {
                field: field.to_owned(),
                value: s,
            });
            default
        }),
    }
}

fn ranged(
    field: &'static str,
    value: Option<i64>,
    default: i64,
    min: i64,
    max: i64,
    errs: &mut Vec<FieldError>,
) -> i64 {
    let v = value.unwrap_or(default);
    if (min..=max).contains(&v) {
        v
    } else {
        errs.push(FieldError::OutOfRange {
            field,
            value: v,
            min,
            max,
        });
        default
    }
}

fn duration(
    field: &'static str,
    value: Option<String>,
    default: Duration,
    errs: &mut Vec<FieldError>,
) -> Duration {
    let Some(s) = value else { return default };
    match parse_go_duration(&s) {
        Some(d) if !d.is_zero() => d,
        Some(_) => {
            errs.push(FieldError::NotPositive { field, value: s });
            default
        }
        None => {
            errs.push(FieldError::NotADuration { field, value: s });
            default
        }
    }
}

/// The socket path of a CRI endpoint, which must be `unix:///absolute/path`.
pub fn unix_endpoint(field: &'static str, endpoint: &str) -> Result<PathBuf, FieldError> {
    match endpoint.strip_prefix("unix://") {
        Some(p) if p.starts_with('/') => Ok(PathBuf::from(p)),
        _ => Err(FieldError::NotUnixEndpoint {
            field,
            value: endpoint.to_owned(),
        }),
    }
}

/// Go's `time.ParseDuration` for non-negative values: "20s", "1m30s", "1.5h",
/// "300ms", "0". `None` for anything else, negative durations included.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let s = s.strip_prefix('+').unwrap_or(s);
    if s == "0" {
        return Some(Duration::ZERO);
    }
    if s.is_empty() {
        return None;
    }
    let mut rest = s;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, tail) = rest.split_at(num_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let nanos_per: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        let (int, frac) = num.split_once('.').unwrap_or((num, ""));
        if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
            return None;
        }
        let int: u128 = if int.is_empty() { 0 } else { int.parse().ok()? };
        total = total.checked_add(int.checked_mul(nanos_per)?)?;
        let mut scale = nanos_per;
        for d in frac.bytes() {
            scale /= 10;
            total += u128::from(d - b'0') * scale;
        }
        rest = tail;
    }
    let secs = u64::try_from(total / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (total % 1_000_000_000) as u32))
}

/// RFC 1123 subdomain: what the kubelet requires of `clusterDomain`.
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// RFC 1123 label: lowercase alphanumerics and '-', not at either end.
pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

#[cfg(test)]
mod tests;
