//! `projected` and `downwardAPI` volumes, and `envFrom`: the checks of the
//! API server's validation (pkg/apis/core/validation), which static pods
//! never meet, with the API's defaults applied.
use std::collections::BTreeSet;

use k8s_openapi::api::core::v1 as api;

use super::Errs;
use crate::pod::{
    DownwardField, DownwardItem, DownwardValue, EnvFrom, EnvFromKind, KeyToPath, ProjectedSource,
    ResourceName, SpecError, TokenProjection, VolumeSource, quantity::Quantity,
};
use crate::safe_path;

/// `serviceAccountToken.expirationSeconds` when unset, and its bounds.
const TOKEN_DEFAULT_SECS: i64 = 3600;
const TOKEN_MIN_SECS: i64 = 600;
const TOKEN_MAX_SECS: i64 = 1 << 32;

/// A file path inside a projection: relative, no `..`, and not starting with
/// `..`, which the writer keeps for itself (`..data`, its timestamped
/// directories), as `validateLocalNonReservedPath` refuses.
pub(super) fn projection_path(errs: &mut Errs, field: String, path: &str) {
    if path.is_empty() {
        errs.required(field);
    } else if let Err(e) = safe_path::descending("items path", path) {
        errs.invalid(field, path, e.reason);
    } else if path.starts_with("..") {
        errs.invalid(field, path, "must not start with '..'");
    }
}

pub(super) fn key_to_paths(
    errs: &mut Errs,
    at: &str,
    items: Option<&Vec<api::KeyToPath>>,
) -> Vec<KeyToPath> {
    items
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(j, k)| {
            let field = format!("{at}.items[{j}]");
            if k.key.is_empty() {
                errs.required(format!("{field}.key"));
            }
            projection_path(errs, format!("{field}.path"), &k.path);
            KeyToPath {
                key: k.key.clone(),
                path: k.path.clone(),
                mode: mode(errs, format!("{field}.mode"), k.mode),
            }
        })
        .collect()
}

/// A file mode: 0–0777, as the API allows.
pub(super) fn mode(errs: &mut Errs, field: String, m: Option<i32>) -> Option<u32> {
    let m = m?;
    match u32::try_from(m) {
        Ok(m) if m <= 0o777 => Some(m),
        _ => {
            errs.invalid(field, m, "must be a number between 0 and 0777 (octal)");
            None
        }
    }
}

pub(super) fn downward_volume(
    errs: &mut Errs,
    at: &str,
    d: &api::DownwardAPIVolumeSource,
    containers: &BTreeSet<&str>,
) -> VolumeSource {
    VolumeSource::DownwardApi {
        items: downward_items(
            errs,
            &format!("{at}.downwardAPI"),
            d.items.as_ref(),
            containers,
        ),
        default_mode: mode(
            errs,
            format!("{at}.downwardAPI.defaultMode"),
            d.default_mode,
        )
        .unwrap_or(0o644),
    }
}

pub(super) fn projected_volume(
    errs: &mut Errs,
    at: &str,
    p: &api::ProjectedVolumeSource,
    containers: &BTreeSet<&str>,
) -> VolumeSource {
    let at = format!("{at}.projected");
    let mut sources = Vec::new();
    for (j, s) in p.sources.iter().flatten().enumerate() {
        let at = format!("{at}.sources[{j}]");
        let set = [
            s.config_map.is_some(),
            s.secret.is_some(),
            s.downward_api.is_some(),
            s.service_account_token.is_some(),
            s.cluster_trust_bundle.is_some(),
            s.pod_certificate.is_some(),
        ];
        if set.iter().filter(|b| **b).count() > 1 {
            errs.0.push(SpecError::Forbidden {
                field: at.clone(),
                reason: "may not specify more than 1 volume type per source".into(),
            });
            continue;
        }
        let source = if let Some(c) = &s.config_map {
            if c.name.is_empty() {
                errs.required(format!("{at}.configMap.name"));
            }
            ProjectedSource::ConfigMap {
                name: c.name.clone(),
                items: key_to_paths(errs, &format!("{at}.configMap"), c.items.as_ref()),
                optional: c.optional.unwrap_or(false),
            }
        } else if let Some(c) = &s.secret {
            if c.name.is_empty() {
                errs.required(format!("{at}.secret.name"));
            }
            ProjectedSource::Secret {
                name: c.name.clone(),
                items: key_to_paths(errs, &format!("{at}.secret"), c.items.as_ref()),
                optional: c.optional.unwrap_or(false),
            }
        } else if let Some(d) = &s.downward_api {
            ProjectedSource::DownwardApi {
                items: downward_items(
                    errs,
                    &format!("{at}.downwardAPI"),
                    d.items.as_ref(),
                    containers,
                ),
            }
        } else if let Some(t) = &s.service_account_token {
            let field = format!("{at}.serviceAccountToken");
            let expiration_seconds = t.expiration_seconds.unwrap_or(TOKEN_DEFAULT_SECS);
            if expiration_seconds < TOKEN_MIN_SECS {
                errs.invalid(
                    format!("{field}.expirationSeconds"),
                    expiration_seconds,
                    "may not specify a duration less than 10 minutes",
                );
            } else if expiration_seconds > TOKEN_MAX_SECS {
                errs.invalid(
                    format!("{field}.expirationSeconds"),
                    expiration_seconds,
                    "may not specify a duration larger than 2^32 seconds",
                );
            }
            projection_path(errs, format!("{field}.path"), &t.path);
            ProjectedSource::ServiceAccountToken(TokenProjection {
                audience: t.audience.clone().filter(|a| !a.is_empty()),
                expiration_seconds,
                path: t.path.clone(),
            })
        } else if s.cluster_trust_bundle.is_some() {
            errs.unsupported(format!("{at}.clusterTrustBundle"), "clusterTrustBundle");
            continue;
        } else if s.pod_certificate.is_some() {
            errs.unsupported(format!("{at}.podCertificate"), "podCertificate");
            continue;
        } else {
            errs.required(at);
            continue;
        };
        sources.push(source);
    }
    // Two sources writing one file: the API refuses the pod.
    let mut seen = BTreeSet::new();
    for path in sources.iter().flat_map(source_paths) {
        if !seen.insert(path) {
            errs.invalid(format!("{at}.sources"), path, "conflicting duplicate paths");
        }
    }
    VolumeSource::Projected {
        sources,
        default_mode: mode(errs, format!("{at}.defaultMode"), p.default_mode).unwrap_or(0o644),
    }
}

/// The paths a source names explicitly (a source without items writes
/// whatever keys its object has, known only when written).
fn source_paths(s: &ProjectedSource) -> Vec<&str> {
    match s {
        ProjectedSource::ConfigMap { items, .. } | ProjectedSource::Secret { items, .. } => {
            items.iter().map(|i| i.path.as_str()).collect()
        }
        ProjectedSource::DownwardApi { items } => items.iter().map(|i| i.path.as_str()).collect(),
        ProjectedSource::ServiceAccountToken(t) => vec![t.path.as_str()],
    }
}

fn downward_items(
    errs: &mut Errs,
    at: &str,
    items: Option<&Vec<api::DownwardAPIVolumeFile>>,
    containers: &BTreeSet<&str>,
) -> Vec<DownwardItem> {
    items
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(|(j, it)| {
            let at = format!("{at}.items[{j}]");
            projection_path(errs, format!("{at}.path"), &it.path);
            let mode = mode(errs, format!("{at}.mode"), it.mode);
            let value = match (&it.field_ref, &it.resource_field_ref) {
                (Some(f), None) => DownwardValue::Field(field(errs, &at, &f.field_path)?),
                (None, Some(r)) => resource(errs, &at, r, containers)?,
                (Some(_), Some(_)) => {
                    errs.invalid(
                        at,
                        "",
                        "fieldRef and resourceFieldRef can not be specified simultaneously",
                    );
                    return None;
                }
                (None, None) => {
                    errs.required(format!("{at}.fieldRef"));
                    return None;
                }
            };
            Some(DownwardItem {
                path: it.path.clone(),
                mode,
                value,
            })
        })
        .collect()
}

/// The field paths a downwardAPI volume may project (`validDownwardAPIFieldPathExpressions`).
fn field(errs: &mut Errs, at: &str, path: &str) -> Option<DownwardField> {
    let subscript = |prefix: &str| {
        path.strip_prefix(prefix)?
            .strip_prefix("['")?
            .strip_suffix("']")
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
    };
    let f = match path {
        "metadata.name" => DownwardField::Name,
        "metadata.namespace" => DownwardField::Namespace,
        "metadata.uid" => DownwardField::Uid,
        "metadata.labels" => DownwardField::Labels,
        "metadata.annotations" => DownwardField::Annotations,
        _ => {
            if let Some(k) = subscript("metadata.labels") {
                DownwardField::Label(k)
            } else if let Some(k) = subscript("metadata.annotations") {
                DownwardField::Annotation(k)
            } else {
                errs.0.push(SpecError::NotSupported {
                    field: format!("{at}.fieldRef.fieldPath"),
                    what: format!(
                        "field path {path:?} in a volume (metadata.name, metadata.namespace, metadata.uid, metadata.labels, metadata.annotations and one label or annotation are)"
                    ),
                });
                return None;
            }
        }
    };
    Some(f)
}

fn resource(
    errs: &mut Errs,
    at: &str,
    r: &api::ResourceFieldSelector,
    containers: &BTreeSet<&str>,
) -> Option<DownwardValue> {
    let at = format!("{at}.resourceFieldRef");
    let container = r.container_name.clone().unwrap_or_default();
    if container.is_empty() {
        errs.required(format!("{at}.containerName"));
        return None;
    }
    if !containers.contains(container.as_str()) {
        errs.invalid(
            format!("{at}.containerName"),
            &container,
            "must name a container of the pod",
        );
        return None;
    }
    let (resource, cpu) = match r.resource.as_str() {
        "limits.cpu" => (ResourceName::LimitsCpu, true),
        "limits.memory" => (ResourceName::LimitsMemory, false),
        "requests.cpu" => (ResourceName::RequestsCpu, true),
        "requests.memory" => (ResourceName::RequestsMemory, false),
        other => {
            errs.unsupported(format!("{at}.resource"), format!("resource {other:?}"));
            return None;
        }
    };
    let divisor = match &r.divisor {
        None => Some(if cpu { 1000 } else { 1 }),
        Some(q) => match Quantity::parse(&q.0) {
            Ok(q) if cpu => q.milli_value(),
            Ok(q) => q.value(),
            Err(source) => {
                errs.0.push(SpecError::Quantity {
                    field: format!("{at}.divisor"),
                    source,
                });
                return None;
            }
        },
    };
    // The API allows only 1m and 1 for CPU, powers of 1000 and 1024 for
    // memory; anything positive divides correctly, zero never does.
    let Some(divisor) = divisor.filter(|d| *d > 0) else {
        errs.invalid(
            format!("{at}.divisor"),
            r.divisor.as_ref().map_or("", |q| q.0.as_str()),
            "must be positive",
        );
        return None;
    };
    Some(DownwardValue::Resource {
        container,
        resource,
        divisor,
    })
}

/// `envFrom`: a ConfigMap or a Secret, with an optional prefix that must
/// itself be a valid start of a variable name.
pub(super) fn env_from(errs: &mut Errs, at: &str, sources: &[api::EnvFromSource]) -> Vec<EnvFrom> {
    sources
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let at = format!("{at}.envFrom[{i}]");
            let prefix = s.prefix.clone().unwrap_or_default();
            if prefix.contains('=') {
                errs.invalid(format!("{at}.prefix"), &prefix, "must not contain '='");
            }
            let (kind, name, optional) = match (&s.config_map_ref, &s.secret_ref) {
                (Some(c), None) => (EnvFromKind::ConfigMap, c.name.clone(), c.optional),
                (None, Some(r)) => (EnvFromKind::Secret, r.name.clone(), r.optional),
                (Some(_), Some(_)) => {
                    errs.invalid(
                        at,
                        "",
                        "may not have more than one field specified at a time",
                    );
                    return None;
                }
                (None, None) => {
                    errs.required(format!("{at}.configMapRef"));
                    return None;
                }
            };
            if name.is_empty() {
                let which = match kind {
                    EnvFromKind::ConfigMap => "configMapRef",
                    EnvFromKind::Secret => "secretRef",
                };
                errs.required(format!("{at}.{which}.name"));
            }
            Some(EnvFrom {
                kind,
                name,
                prefix,
                optional: optional.unwrap_or(false),
            })
        })
        .collect()
}
