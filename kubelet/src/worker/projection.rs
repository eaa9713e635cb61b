//! The files of ConfigMap, Secret, downwardAPI and projected volumes: what
//! each holds (its payload, as the kubelet's volume plugins build it) and
//! its atomic write. Written when a container starts and again every
//! `syncFrequency` while the pod runs, so ConfigMap edits and rotated
//! service-account tokens reach running containers, as on a real node.
use std::{collections::BTreeMap, path::Path};

use super::{WorkerConfig, atomic_writer, spec::ContainerConfigError};
use crate::pod::{
    DownwardField, DownwardItem, DownwardValue, KeyToPath, PodSpec, ProjectedSource, ResourceName,
    VolumeSource,
};

/// The plugin directory name of each projection, as the kubelet names them.
pub(super) fn plugin(source: &VolumeSource) -> Option<&'static str> {
    Some(match source {
        VolumeSource::ConfigMap { .. } => "kubernetes.io~configmap",
        VolumeSource::Secret { .. } => super::pod_dir::SECRET_PLUGIN,
        VolumeSource::Projected { .. } => super::pod_dir::PROJECTED_PLUGIN,
        VolumeSource::DownwardApi { .. } => "kubernetes.io~downward-api",
        _ => return None,
    })
}

/// Brings the projection volume `name` in `dir` up to date; whether a new
/// version was written.
pub(super) fn write(
    cfg: &WorkerConfig,
    pod: &PodSpec,
    name: &str,
    source: &VolumeSource,
    dir: &Path,
) -> Result<bool, ContainerConfigError> {
    let io = |e| super::spec::io_err(name, dir)(e);
    let payload = payload(cfg, pod, name, source)?;
    // Secrets and tokens never touch the node's disk: the kubelet mounts a
    // tmpfs for them, and so for projected volumes (which may hold both).
    if matches!(
        source,
        VolumeSource::Secret { .. } | VolumeSource::Projected { .. }
    ) {
        super::pod_dir::secret_tmpfs(dir).map_err(io)?;
    }
    atomic_writer::write(dir, &payload).map_err(io)
}

/// Everything the volume should hold.
fn payload(
    cfg: &WorkerConfig,
    pod: &PodSpec,
    volume: &str,
    source: &VolumeSource,
) -> Result<atomic_writer::Payload, ContainerConfigError> {
    let mut out = atomic_writer::Payload::new();
    let object = |kind: &'static str,
                  name: &str,
                  items: &[KeyToPath],
                  mode: u32,
                  optional: bool,
                  out: &mut atomic_writer::Payload| {
        let data = object_data(cfg, kind, volume, pod, name, optional)?;
        keys(out, volume, kind, name, data, items, mode, optional)
    };
    match source {
        VolumeSource::ConfigMap {
            name,
            items,
            default_mode,
            optional,
        } => object("ConfigMap", name, items, *default_mode, *optional, &mut out)?,
        VolumeSource::Secret {
            name,
            items,
            default_mode,
            optional,
        } => object("Secret", name, items, *default_mode, *optional, &mut out)?,
        VolumeSource::DownwardApi {
            items,
            default_mode,
        } => downward(&mut out, cfg, pod, items, *default_mode),
        VolumeSource::Projected {
            sources,
            default_mode,
        } => {
            for s in sources {
                match s {
                    ProjectedSource::ConfigMap {
                        name,
                        items,
                        optional,
                    } => object("ConfigMap", name, items, *default_mode, *optional, &mut out)?,
                    ProjectedSource::Secret {
                        name,
                        items,
                        optional,
                    } => object("Secret", name, items, *default_mode, *optional, &mut out)?,
                    ProjectedSource::DownwardApi { items } => {
                        downward(&mut out, cfg, pod, items, *default_mode);
                    }
                    ProjectedSource::ServiceAccountToken(t) => {
                        let Some(objects) = cfg.objects.as_deref() else {
                            return Err(ContainerConfigError::NeedsApi {
                                volume: volume.to_owned(),
                                kind: "serviceAccountToken",
                            });
                        };
                        let token = objects.service_account_token(pod, t).map_err(|message| {
                            ContainerConfigError::Token {
                                volume: volume.to_owned(),
                                service_account: pod.service_account_name.clone(),
                                message,
                            }
                        })?;
                        out.insert(t.path.clone(), (token.into_bytes(), *default_mode));
                    }
                }
            }
        }
        VolumeSource::EmptyDir { .. } | VolumeSource::HostPath { .. } => {}
    }
    Ok(out)
}

pub(super) fn object_data(
    cfg: &WorkerConfig,
    kind: &'static str,
    volume: &str,
    pod: &PodSpec,
    object: &str,
    optional: bool,
) -> Result<BTreeMap<String, Vec<u8>>, ContainerConfigError> {
    let Some(objects) = cfg.objects.as_deref() else {
        return Err(ContainerConfigError::NeedsApi {
            volume: volume.to_owned(),
            kind,
        });
    };
    let found = match kind {
        "Secret" => objects.secret(&pod.namespace, object),
        _ => objects.config_map(&pod.namespace, object),
    };
    match found {
        Ok(Some(d)) => Ok(d),
        Ok(None) if optional => Ok(BTreeMap::new()),
        Err(message) => Err(ContainerConfigError::ObjectUnavailable {
            volume: volume.to_owned(),
            kind,
            namespace: pod.namespace.clone(),
            name: object.to_owned(),
            message,
        }),
        Ok(None) => Err(ContainerConfigError::ObjectNotFound {
            volume: volume.to_owned(),
            kind,
            namespace: pod.namespace.clone(),
            name: object.to_owned(),
        }),
    }
}

/// An object's keys (all, or `items`) as files, as `MakePayload` does. Keys
/// come from the API and become file names, so each is checked as a path.
#[allow(clippy::too_many_arguments)]
fn keys(
    out: &mut atomic_writer::Payload,
    volume: &str,
    kind: &'static str,
    object: &str,
    data: BTreeMap<String, Vec<u8>>,
    items: &[KeyToPath],
    default_mode: u32,
    optional: bool,
) -> Result<(), ContainerConfigError> {
    let files: Vec<(String, Vec<u8>, u32)> = if items.is_empty() {
        data.into_iter()
            .map(|(k, v)| (k, v, default_mode))
            .collect()
    } else {
        let mut files = Vec::new();
        for it in items {
            match data.get(&it.key) {
                Some(v) => {
                    files.push((it.path.clone(), v.clone(), it.mode.unwrap_or(default_mode)))
                }
                None if optional => {}
                None => {
                    return Err(ContainerConfigError::KeyNotFound {
                        volume: volume.to_owned(),
                        kind,
                        name: object.to_owned(),
                        key: it.key.clone(),
                    });
                }
            }
        }
        files
    };
    for (rel, bytes, mode) in files {
        crate::safe_path::descending("items path", &rel)?;
        if rel.starts_with("..") {
            return Err(crate::safe_path::PathError {
                what: "items path",
                value: rel,
                reason: "must not start with '..'",
            }
            .into());
        }
        out.insert(rel, (bytes, mode));
    }
    Ok(())
}

fn downward(
    out: &mut atomic_writer::Payload,
    cfg: &WorkerConfig,
    pod: &PodSpec,
    items: &[DownwardItem],
    default_mode: u32,
) {
    for it in items {
        let text = match &it.value {
            DownwardValue::Field(f) => field(pod, f),
            DownwardValue::Resource {
                container,
                resource,
                divisor,
            } => resource_value(cfg, pod, container, *resource, *divisor),
        };
        out.insert(
            it.path.clone(),
            (text.into_bytes(), it.mode.unwrap_or(default_mode)),
        );
    }
}

fn field(pod: &PodSpec, f: &DownwardField) -> String {
    match f {
        DownwardField::Name => pod.name.clone(),
        DownwardField::Namespace => pod.namespace.clone(),
        DownwardField::Uid => pod.uid.clone(),
        DownwardField::Labels => format_map(&pod.labels),
        DownwardField::Annotations => format_map(&pod.annotations),
        DownwardField::Label(k) => pod.labels.get(k).cloned().unwrap_or_default(),
        DownwardField::Annotation(k) => pod.annotations.get(k).cloned().unwrap_or_default(),
    }
}

/// `key="value"` lines in key order, values quoted as Go's `%q` quotes
/// them, without a final newline: the kubelet's `fieldpath.FormatMap`.
fn format_map(m: &BTreeMap<String, String>) -> String {
    let mut s = String::new();
    for (k, v) in m {
        if !s.is_empty() {
            s.push('\n');
        }
        s.push_str(k);
        s.push_str("=\"");
        for c in v.chars() {
            match c {
                '"' => s.push_str("\\\""),
                '\\' => s.push_str("\\\\"),
                '\n' => s.push_str("\\n"),
                '\t' => s.push_str("\\t"),
                '\r' => s.push_str("\\r"),
                c if c.is_control() => {
                    let code = u32::from(c);
                    if code < 0x80 {
                        s.push_str(&format!("\\x{code:02x}"));
                    } else {
                        s.push_str(&format!("\\u{code:04x}"));
                    }
                }
                c => s.push(c),
            }
        }
        s.push('"');
    }
    s
}

/// A container's request or limit in `divisor` units, rounded up; a limit
/// left unset is the node's allocatable, as `MergeContainerResourceLimits`
/// makes it.
fn resource_value(
    cfg: &WorkerConfig,
    pod: &PodSpec,
    container: &str,
    resource: ResourceName,
    divisor: i64,
) -> String {
    let Some(c) = pod
        .containers
        .iter()
        .chain(&pod.init_containers)
        .find(|c| c.name == container)
    else {
        return String::new();
    };
    let r = &c.resources;
    let node_cpu_milli = || {
        std::thread::available_parallelism().map_or(1000, |n| {
            i64::try_from(n.get()).unwrap_or(1).saturating_mul(1000)
        })
    };
    let value = match resource {
        ResourceName::LimitsCpu => r.cpu_limit_milli.unwrap_or_else(node_cpu_milli),
        ResourceName::RequestsCpu => r.cpu_request_milli.unwrap_or(0),
        ResourceName::LimitsMemory => r.memory_limit.or(cfg.memory_capacity).unwrap_or(0),
        ResourceName::RequestsMemory => r.memory_request.unwrap_or(0),
    };
    // Divisors were checked positive; both values are in the same unit
    // (millicores for CPU, bytes for memory).
    (value.max(0) as u64)
        .div_ceil(divisor.max(1) as u64)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_are_formatted_as_the_kubelet_does() {
        let m = BTreeMap::from([
            ("b".to_owned(), "two words".to_owned()),
            ("a".to_owned(), "say \"hi\"\n".to_owned()),
        ]);
        assert_eq!(format_map(&m), "a=\"say \\\"hi\\\"\\n\"\nb=\"two words\"");
        assert_eq!(format_map(&BTreeMap::new()), "");
    }
}
