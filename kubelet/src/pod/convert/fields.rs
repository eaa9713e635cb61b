//! Environment, resources and volumes.
use std::collections::BTreeSet;

use k8s_openapi::api::core::v1 as api;

use super::Errs;
use super::projected::{downward_volume, key_to_paths, projected_volume};
use crate::config::is_dns_label;
use crate::pod::{
    EnvValue, EnvVar, FieldRef, HostPathType, Resources, SpecError, Volume, VolumeSource,
    quantity::{Quantity, QuantityError},
};

pub(super) fn convert_env(errs: &mut Errs, env: &[api::EnvVar], at: &str) -> Vec<EnvVar> {
    env.iter()
        .enumerate()
        .filter_map(|(i, e)| {
            let at = format!("{at}.env[{i}]");
            if e.name.is_empty() {
                errs.required(format!("{at}.name"));
            }
            let value = match (&e.value, &e.value_from) {
                (Some(v), Some(_)) if !v.is_empty() => {
                    errs.invalid(
                        format!("{at}.valueFrom"),
                        "",
                        "may not be set when `value` is not empty",
                    );
                    return None;
                }
                (_, Some(from)) => convert_env_source(errs, from, &format!("{at}.valueFrom"))?,
                (v, None) => EnvValue::Literal(v.clone().unwrap_or_default()),
            };
            Some(EnvVar {
                name: e.name.clone(),
                value,
            })
        })
        .collect()
}

fn convert_env_source(errs: &mut Errs, from: &api::EnvVarSource, at: &str) -> Option<EnvValue> {
    if let Some(f) = &from.field_ref {
        let r = match f.field_path.as_str() {
            "metadata.name" => FieldRef::PodName,
            "metadata.namespace" => FieldRef::PodNamespace,
            "metadata.uid" => FieldRef::PodUid,
            "status.podIP" => FieldRef::PodIp,
            "status.hostIP" => FieldRef::HostIp,
            "spec.nodeName" => FieldRef::NodeName,
            "spec.serviceAccountName" => FieldRef::ServiceAccountName,
            other => {
                errs.unsupported(
                    format!("{at}.fieldRef.fieldPath"),
                    format!("field path {other:?}"),
                );
                return None;
            }
        };
        return Some(EnvValue::Field(r));
    }
    if let Some(c) = &from.config_map_key_ref {
        return Some(EnvValue::ConfigMapKey {
            name: c.name.clone(),
            key: c.key.clone(),
            optional: c.optional.unwrap_or(false),
        });
    }
    if let Some(s) = &from.secret_key_ref {
        return Some(EnvValue::SecretKey {
            name: s.name.clone(),
            key: s.key.clone(),
            optional: s.optional.unwrap_or(false),
        });
    }
    let what = if from.resource_field_ref.is_some() {
        "resourceFieldRef"
    } else if from.file_key_ref.is_some() {
        "fileKeyRef"
    } else {
        errs.required(at);
        return None;
    };
    errs.unsupported(format!("{at}.{what}"), what);
    None
}

pub(super) fn convert_resources(
    errs: &mut Errs,
    r: Option<&api::ResourceRequirements>,
    at: &str,
) -> Resources {
    let Some(r) = r else {
        return Resources::default();
    };
    let get = |errs: &mut Errs, which: &str, name: &str, milli: bool| {
        let q = match which {
            "limits" => r.limits.as_ref(),
            _ => r.requests.as_ref(),
        }?
        .get(name)?;
        let field = format!("{at}.resources.{which}.{name}");
        let parsed = match Quantity::parse(&q.0) {
            Ok(p) => p,
            Err(source) => {
                errs.0.push(SpecError::Quantity { field, source });
                return None;
            }
        };
        if parsed.is_negative() {
            errs.invalid(field, &q.0, "must be greater than or equal to 0");
            return None;
        }
        let v = if milli {
            parsed.milli_value()
        } else {
            parsed.value()
        };
        if v.is_none() {
            errs.0.push(SpecError::Quantity {
                field,
                source: QuantityError::TooLarge(q.0.clone()),
            });
        }
        v
    };
    let cpu_limit_milli = get(errs, "limits", "cpu", true);
    let memory_limit = get(errs, "limits", "memory", false);
    let cpu_request_milli = get(errs, "requests", "cpu", true).or(cpu_limit_milli);
    let memory_request = get(errs, "requests", "memory", false).or(memory_limit);
    for (name, req, lim) in [
        ("cpu", cpu_request_milli, cpu_limit_milli),
        ("memory", memory_request, memory_limit),
    ] {
        if let (Some(req), Some(lim)) = (req, lim)
            && req > lim
        {
            errs.invalid(
                format!("{at}.resources.requests.{name}"),
                req,
                "must be less than or equal to the limit",
            );
        }
    }
    Resources {
        cpu_request_milli,
        cpu_limit_milli,
        memory_request,
        memory_limit,
    }
}

pub(super) fn convert_volumes(
    errs: &mut Errs,
    volumes: &[api::Volume],
    containers: &BTreeSet<&str>,
) -> Vec<Volume> {
    let mut names = BTreeSet::new();
    volumes
        .iter()
        .enumerate()
        .filter_map(|(i, v)| {
            let at = format!("spec.volumes[{i}]");
            if v.name.is_empty() {
                errs.required(format!("{at}.name"));
            } else if !is_dns_label(&v.name) {
                // It names the volume's directory in the pod's.
                errs.invalid(format!("{at}.name"), &v.name, "must be a DNS label");
            } else if !names.insert(v.name.clone()) {
                errs.0.push(SpecError::Duplicate {
                    field: format!("{at}.name"),
                    value: v.name.clone(),
                });
            }
            let mode = |errs: &mut Errs, field: &str, m| {
                super::projected::mode(errs, format!("{at}.{field}.defaultMode"), m)
                    .unwrap_or(0o644)
            };
            let source = if let Some(e) = &v.empty_dir {
                let size_limit = e
                    .size_limit
                    .as_ref()
                    .and_then(|q| match Quantity::parse(&q.0) {
                        Ok(q) => q.value(),
                        Err(source) => {
                            errs.0.push(SpecError::Quantity {
                                field: format!("{at}.emptyDir.sizeLimit"),
                                source,
                            });
                            None
                        }
                    });
                let memory = match e.medium.as_deref() {
                    None | Some("") => false,
                    Some("Memory") => true,
                    Some(m) => {
                        errs.unsupported(format!("{at}.emptyDir.medium"), format!("medium {m:?}"));
                        false
                    }
                };
                VolumeSource::EmptyDir { memory, size_limit }
            } else if let Some(h) = &v.host_path {
                if !h.path.starts_with('/') {
                    errs.invalid(
                        format!("{at}.hostPath.path"),
                        &h.path,
                        "must be an absolute path",
                    );
                }
                let kind = match h.type_.as_deref().unwrap_or("") {
                    "" => HostPathType::Unset,
                    "DirectoryOrCreate" => HostPathType::DirectoryOrCreate,
                    "Directory" => HostPathType::Directory,
                    "FileOrCreate" => HostPathType::FileOrCreate,
                    "File" => HostPathType::File,
                    "Socket" => HostPathType::Socket,
                    "CharDevice" => HostPathType::CharDevice,
                    "BlockDevice" => HostPathType::BlockDevice,
                    t => {
                        errs.invalid(format!("{at}.hostPath.type"), t, "is not a hostPath type");
                        HostPathType::Unset
                    }
                };
                VolumeSource::HostPath {
                    path: h.path.clone(),
                    kind,
                }
            } else if let Some(c) = &v.config_map {
                if c.name.is_empty() {
                    errs.required(format!("{at}.configMap.name"));
                }
                VolumeSource::ConfigMap {
                    name: c.name.clone(),
                    items: key_to_paths(errs, &format!("{at}.configMap"), c.items.as_ref()),
                    default_mode: mode(errs, "configMap", c.default_mode),
                    optional: c.optional.unwrap_or(false),
                }
            } else if let Some(s) = &v.secret {
                let name = s.secret_name.clone().unwrap_or_default();
                if name.is_empty() {
                    errs.required(format!("{at}.secret.secretName"));
                }
                VolumeSource::Secret {
                    name,
                    items: key_to_paths(errs, &format!("{at}.secret"), s.items.as_ref()),
                    default_mode: mode(errs, "secret", s.default_mode),
                    optional: s.optional.unwrap_or(false),
                }
            } else if let Some(p) = &v.projected {
                projected_volume(errs, &at, p, containers)
            } else if let Some(d) = &v.downward_api {
                downward_volume(errs, &at, d, containers)
            } else {
                errs.0.push(SpecError::UnknownVolumeType {
                    field: at,
                    kind: volume_kind(v),
                });
                return None;
            };
            Some(Volume {
                name: v.name.clone(),
                source,
            })
        })
        .collect()
}

/// The API name of whatever source a volume has ("nfs", "persistentVolumeClaim").
fn volume_kind(v: &api::Volume) -> String {
    let Ok(serde_json::Value::Object(m)) = serde_json::to_value(v) else {
        return "unknown".to_owned();
    };
    m.keys()
        .find(|k| *k != "name")
        .cloned()
        .unwrap_or_else(|| "none".to_owned())
}
