//! A container's environment and `$(VAR)` expansion, as the kubelet's
//! `makeEnvironmentVariables` (pkg/kubelet/kubelet_pods.go) and
//! third_party/forked/golang/expansion do it.
use std::collections::{BTreeMap, HashMap};

use super::{ContainerSpec, EnvFromKind, EnvValue, FieldValues};

/// A ConfigMap or Secret key the environment needs. In standalone mode there
/// is no API to read them from: the lookup returns `None`.
pub trait ObjectLookup {
    fn config_map_key(&self, namespace: &str, name: &str, key: &str) -> Option<String>;
    fn secret_key(&self, namespace: &str, name: &str, key: &str) -> Option<String>;
    /// Every key of an object, for `envFrom`: `Ok(None)` when it does not
    /// exist, `Err` with the API's message when it cannot be read.
    fn object(
        &self,
        kind: EnvFromKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>, String>;
}

/// No API server: every ConfigMap and Secret is missing.
pub struct NoObjects;

impl ObjectLookup for NoObjects {
    fn config_map_key(&self, _: &str, _: &str, _: &str) -> Option<String> {
        None
    }
    fn secret_key(&self, _: &str, _: &str, _: &str) -> Option<String> {
        None
    }
    fn object(
        &self,
        _: EnvFromKind,
        _: &str,
        _: &str,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
        Err("ConfigMaps and Secrets need the API server (standalone mode)".into())
    }
}

/// A required key is missing: `CreateContainerConfigError`, as in the kubelet.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("couldn't find key {key} in ConfigMap {namespace}/{name}")]
    ConfigMapKey {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("couldn't find key {key} in Secret {namespace}/{name}")]
    SecretKey {
        namespace: String,
        name: String,
        key: String,
    },
    /// `envFrom` names an object that does not exist and is not optional;
    /// the kubelet's words (`configmap "x" not found`).
    #[error("{} {name:?} not found", kind_word(*kind))]
    NotFound { kind: EnvFromKind, name: String },
    #[error("{} {namespace}/{name}: {message}", kind_word(*kind))]
    Unavailable {
        kind: EnvFromKind,
        namespace: String,
        name: String,
        message: String,
    },
}

fn kind_word(k: EnvFromKind) -> &'static str {
    match k {
        EnvFromKind::ConfigMap => "configmap",
        EnvFromKind::Secret => "secret",
    }
}

/// Names an `envFrom` key may give a variable: printable ASCII without `=`,
/// as the API's relaxed validation (GA in 1.34) allows.
fn is_env_var_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b'=')
}

/// What the CRI container config gets: the environment in order, and the
/// command and args with `$(VAR)` expanded against it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    pub env: Vec<(String, String)>,
    pub command: Vec<String>,
    pub args: Vec<String>,
    /// `envFrom` keys skipped as invalid variable names, each as
    /// `kind namespace/name: key`: the kubelet's
    /// `InvalidEnvironmentVariableNames` warning.
    pub skipped: Vec<String>,
}

/// Resolves the environment of `c`. Each literal value may refer to the
/// variables defined before it; the command and args to all of them.
pub fn resolve(
    c: &ContainerSpec,
    values: &FieldValues<'_>,
    objects: &dyn ObjectLookup,
) -> Result<Resolved, EnvError> {
    let ns = values.pod.namespace.as_str();
    let mut env: Vec<(String, String)> = Vec::with_capacity(c.env.len());
    let mut known: HashMap<String, String> = HashMap::new();
    let mut skipped = Vec::new();
    // envFrom first, in order (a later source wins a key), then `env`,
    // which wins over both and may refer to them.
    for from in &c.env_from {
        let data = match objects.object(from.kind, ns, &from.name) {
            Ok(Some(d)) => d,
            Ok(None) if from.optional => continue,
            Ok(None) => {
                return Err(EnvError::NotFound {
                    kind: from.kind,
                    name: from.name.clone(),
                });
            }
            Err(message) => {
                return Err(EnvError::Unavailable {
                    kind: from.kind,
                    namespace: ns.to_owned(),
                    name: from.name.clone(),
                    message,
                });
            }
        };
        for (key, value) in data {
            let name = format!("{}{key}", from.prefix);
            if !is_env_var_name(&name) {
                skipped.push(format!(
                    "{} {ns}/{}: {name}",
                    kind_word(from.kind),
                    from.name
                ));
                continue;
            }
            let value = String::from_utf8_lossy(&value).into_owned();
            known.insert(name.clone(), value.clone());
            match env.iter_mut().find(|(n, _)| *n == name) {
                Some(slot) => slot.1 = value,
                None => env.push((name, value)),
            }
        }
    }
    for var in &c.env {
        let value = match &var.value {
            EnvValue::Literal(v) => expand(v, |name| known.get(name).cloned()),
            EnvValue::Field(f) => f.resolve(values),
            EnvValue::ConfigMapKey {
                name,
                key,
                optional,
            } => match objects.config_map_key(ns, name, key) {
                Some(v) => v,
                None if *optional => continue,
                None => {
                    return Err(EnvError::ConfigMapKey {
                        namespace: ns.to_owned(),
                        name: name.clone(),
                        key: key.clone(),
                    });
                }
            },
            EnvValue::SecretKey {
                name,
                key,
                optional,
            } => match objects.secret_key(ns, name, key) {
                Some(v) => v,
                None if *optional => continue,
                None => {
                    return Err(EnvError::SecretKey {
                        namespace: ns.to_owned(),
                        name: name.clone(),
                        key: key.clone(),
                    });
                }
            },
        };
        known.insert(var.name.clone(), value.clone());
        // A later definition of a name replaces the earlier one in place.
        match env.iter_mut().find(|(n, _)| *n == var.name) {
            Some(slot) => slot.1 = value,
            None => env.push((var.name.clone(), value)),
        }
    }
    let lookup = |name: &str| known.get(name).cloned();
    Ok(Resolved {
        command: c.command.iter().map(|s| expand(s, lookup)).collect(),
        args: c.args.iter().map(|s| expand(s, lookup)).collect(),
        env,
        skipped,
    })
}

/// `$(NAME)` becomes NAME's value, or stays as written when NAME is unknown;
/// `$$` is a literal `$`; anything else is copied.
pub fn expand(input: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match lookup(name) {
                        Some(v) => out.push_str(&v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = body;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::{EnvVar, FieldRef, PodSpec};

    fn lookup(name: &str) -> Option<String> {
        match name {
            "A" => Some("a".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expansion_follows_the_kubelet() {
        assert_eq!(expand("x$(A)y", lookup), "xay");
        assert_eq!(expand("$(A)$(A)", lookup), "aa");
        assert_eq!(expand("$(B)", lookup), "$(B)");
        assert_eq!(expand("$$(A)", lookup), "$(A)");
        assert_eq!(expand("$$", lookup), "$");
        assert_eq!(expand("$(A", lookup), "$(A");
        assert_eq!(expand("cost $5", lookup), "cost $5");
        assert_eq!(expand("end$", lookup), "end$");
        assert_eq!(expand("$(EMPTY)-", lookup), "-");
        assert_eq!(expand("naïve $(A)", lookup), "naïve a");
    }

    fn pod() -> PodSpec {
        let pod = k8s_openapi::api::core::v1::Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("web".into()),
                namespace: Some("prod".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                containers: vec![k8s_openapi::api::core::v1::Container {
                    name: "c".into(),
                    image: Some("busybox".into()),
                    ..Default::default()
                }],
                node_name: Some("node-1".into()),
                ..Default::default()
            }),
            status: None,
        };
        PodSpec::from_api(&pod).unwrap()
    }

    fn var(name: &str, value: EnvValue) -> EnvVar {
        EnvVar {
            name: name.into(),
            value,
        }
    }

    #[test]
    fn resolves_fields_and_expands_in_order() {
        let pod = pod();
        let mut c = pod.containers[0].clone();
        c.env = vec![
            var("NAME", EnvValue::Field(FieldRef::PodName)),
            var("IP", EnvValue::Field(FieldRef::PodIp)),
            var("URL", EnvValue::Literal("http://$(IP):80/$(LATER)".into())),
            var("NODE", EnvValue::Field(FieldRef::NodeName)),
            var("LATER", EnvValue::Literal("x".into())),
            var(
                "OPT",
                EnvValue::ConfigMapKey {
                    name: "cm".into(),
                    key: "k".into(),
                    optional: true,
                },
            ),
        ];
        c.command = vec!["echo".into(), "$(URL)".into()];
        c.args = vec!["$(NAME).$(LATER)".into()];
        let values = FieldValues {
            pod: &pod,
            pod_ip: Some("10.1.0.7".parse().unwrap()),
            host_ip: None,
        };
        let r = resolve(&c, &values, &NoObjects).unwrap();
        let env: Vec<_> = r.env.iter().map(|(n, v)| format!("{n}={v}")).collect();
        assert_eq!(
            env,
            [
                "NAME=web",
                "IP=10.1.0.7",
                "URL=http://10.1.0.7:80/$(LATER)",
                "NODE=node-1",
                "LATER=x"
            ]
        );
        assert_eq!(r.command, ["echo", "http://10.1.0.7:80/$(LATER)"]);
        assert_eq!(r.args, ["web.x"]);
    }

    #[test]
    fn a_missing_required_key_is_an_error() {
        let pod = pod();
        let mut c = pod.containers[0].clone();
        c.env = vec![var(
            "S",
            EnvValue::SecretKey {
                name: "s".into(),
                key: "k".into(),
                optional: false,
            },
        )];
        let values = FieldValues {
            pod: &pod,
            pod_ip: None,
            host_ip: None,
        };
        let e = resolve(&c, &values, &NoObjects).unwrap_err();
        assert_eq!(e.to_string(), "couldn't find key k in Secret prod/s");
    }
}
