//! Typed parsing of rendered documents, with the round-trip check for fields
//! the types do not know.
use std::collections::BTreeSet;

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Container, PodSpec, Service, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

use crate::render::Doc;

/// Parses into the k8s-openapi type, failing with the field path, and checks
/// that nothing is lost when serialising it back (unknown fields).
pub(crate) fn typed<T: DeserializeOwned + Serialize>(doc: &Doc) -> T {
    let t: T = serde_path_to_error::deserialize(doc.value.clone()).unwrap_or_else(|e| {
        panic!(
            "{} ({}): does not parse at {}: {}",
            doc.source,
            doc.kind,
            e.path(),
            e.inner()
        )
    });
    let back = serde_json::to_value(&t).expect("serialise");
    if let Some(path) = first_loss(&doc.value, &back, String::new()) {
        panic!(
            "{} ({}): {path} is not a field of the type (lost in a round trip)",
            doc.source, doc.kind
        );
    }
    t
}

/// The first path in `orig` that `back` lacks or holds differently.
pub(crate) fn first_loss(orig: &Value, back: &Value, at: String) -> Option<String> {
    match (orig, back) {
        (Value::Object(o), Value::Object(b)) => o.iter().find_map(|(k, v)| match b.get(k) {
            None if !v.is_null() => Some(format!("{at}.{k}")),
            None => None,
            Some(bv) => first_loss(v, bv, format!("{at}.{k}")),
        }),
        (Value::Array(o), Value::Array(b)) if o.len() == b.len() => o
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (v, bv))| first_loss(v, bv, format!("{at}[{i}]"))),
        (o, b) if o == b => None,
        (Value::Number(o), Value::Number(b)) if o.as_f64() == b.as_f64() => None,
        _ => Some(if at.is_empty() { ".".into() } else { at }),
    }
}

pub(crate) struct Rendered(pub(crate) Vec<Doc>);

impl Rendered {
    pub(crate) fn kinds(&self) -> Vec<&str> {
        self.0.iter().map(|d| d.kind.as_str()).collect()
    }

    pub(crate) fn only(&self, kind: &str) -> &Doc {
        let found: Vec<&Doc> = self.0.iter().filter(|d| d.kind == kind).collect();
        assert_eq!(found.len(), 1, "exactly one {kind}, got {}", found.len());
        found[0]
    }

    pub(crate) fn ds(&self) -> DaemonSet {
        typed(self.only("DaemonSet"))
    }

    pub(crate) fn pod(&self) -> PodSpec {
        self.ds().spec.unwrap().template.spec.unwrap()
    }

    pub(crate) fn agent(&self) -> Container {
        let pod = self.pod();
        assert_eq!(pod.containers.len(), 1, "one container");
        let c = pod.containers[0].clone();
        assert_eq!(c.name, "weir-agent");
        c
    }

    pub(crate) fn args(&self) -> Vec<String> {
        let c = self.agent();
        assert_eq!(c.command.as_deref(), Some(&["weir-agent".to_owned()][..]));
        c.args.unwrap_or_default()
    }

    /// Parses every document into its type (unknown fields rejected).
    pub(crate) fn check_all_typed(&self) {
        for d in &self.0 {
            match d.kind.as_str() {
                "DaemonSet" => drop(typed::<DaemonSet>(d)),
                "ServiceAccount" => drop(typed::<ServiceAccount>(d)),
                "ClusterRole" => drop(typed::<ClusterRole>(d)),
                "ClusterRoleBinding" => drop(typed::<ClusterRoleBinding>(d)),
                "Role" => drop(typed::<Role>(d)),
                "RoleBinding" => drop(typed::<RoleBinding>(d)),
                "Service" => drop(typed::<Service>(d)),
                "ServiceMonitor" => check_service_monitor_shape(d),
                other => panic!("{}: unexpected kind {other}", d.source),
            }
        }
    }
}

pub(crate) fn check_service_monitor_shape(d: &Doc) {
    let v = &d.value;
    assert_eq!(v["apiVersion"], "monitoring.coreos.com/v1");
    let allowed_top: BTreeSet<&str> = ["apiVersion", "kind", "metadata", "spec"].into();
    for k in v.as_object().unwrap().keys() {
        assert!(
            allowed_top.contains(k.as_str()),
            "ServiceMonitor: unknown {k}"
        );
    }
    let spec_keys: BTreeSet<&str> = ["selector", "namespaceSelector", "endpoints"].into();
    for k in v["spec"].as_object().unwrap().keys() {
        assert!(
            spec_keys.contains(k.as_str()),
            "ServiceMonitor.spec: unknown {k}"
        );
    }
    let ep_keys: BTreeSet<&str> = ["port", "path", "interval", "relabelings"].into();
    for ep in v["spec"]["endpoints"].as_array().unwrap() {
        for k in ep.as_object().unwrap().keys() {
            assert!(
                ep_keys.contains(k.as_str()),
                "ServiceMonitor endpoint: unknown {k}"
            );
        }
    }
}
