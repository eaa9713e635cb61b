//! The fast path: documents deserialized straight into the k8s-openapi types.
//!
//! The general path builds a `serde_json::Value` tree of every document
//! first, to learn its kind and to name the field at fault when it does not
//! fit; perf showed that tree at 100k files to cost more than the YAML
//! parse. Services and EndpointSlices share no top-level field but
//! `apiVersion`, `kind` and `metadata`, so one struct holds either, and the
//! kind picks which fields make the object. Any document this cannot take
//! whole (a type error, a duplicate key, another kind's fields) sends the
//! file to the general path, which reports each problem by object and field.
use k8s_openapi::{
    api::{
        core::v1::{Service, ServiceSpec, ServiceStatus},
        discovery::v1::EndpointPort,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use serde::Deserialize;

use super::{Body, Doc, lite};
use crate::k8s::wire::{Endpoint, EndpointSlice};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AnyDoc {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    metadata: Option<ObjectMeta>,
    // v1 Service
    spec: Option<ServiceSpec>,
    status: Option<ServiceStatus>,
    // discovery.k8s.io/v1 EndpointSlice
    address_type: Option<String>,
    endpoints: Option<Vec<Endpoint>>,
    ports: Option<Vec<EndpointPort>>,
    // any `*List`
    items: Option<Vec<AnyDoc>>,
}

/// The documents of a YAML stream, or `None` if any of them needs the
/// general path. The lite reader takes what it can, serde-saphyr the rest.
pub(super) fn yaml(text: &str, options: serde_saphyr::Options) -> Option<Vec<Doc>> {
    lite_yaml(text).or_else(|| saphyr_yaml(text, options))
}

/// Through the lite reader, or `None` where it leaves the text to
/// serde-saphyr.
pub(super) fn lite_yaml(text: &str) -> Option<Vec<Doc>> {
    // A document that is no mapping is no object, and no `AnyDoc`:
    // serde-saphyr and the general path say what it is instead.
    let docs = lite::documents::<AnyDoc>(text).ok()?;
    documents(docs.into_iter().map(Some).collect())
}

/// Through serde-saphyr.
pub(super) fn saphyr_yaml(text: &str, options: serde_saphyr::Options) -> Option<Vec<Doc>> {
    documents(serde_saphyr::from_multiple_with_options(text, options).ok()?)
}

fn documents(docs: Vec<Option<AnyDoc>>) -> Option<Vec<Doc>> {
    let mut out = Vec::with_capacity(docs.len());
    for (i, d) in docs.into_iter().enumerate() {
        if let Some(d) = d {
            flatten(format!("document {i}"), d, &mut out)?;
        }
    }
    Some(out)
}

/// One JSON document, or `None` if it needs the general path.
pub(super) fn json(text: &str) -> Option<Vec<Doc>> {
    let d: AnyDoc = serde_json::from_str(text).ok()?;
    let mut out = Vec::new();
    flatten("document 0".to_owned(), d, &mut out)?;
    Some(out)
}

fn flatten(at: String, d: AnyDoc, out: &mut Vec<Doc>) -> Option<()> {
    if d.kind.ends_with("List") {
        for (j, item) in d.items.into_iter().flatten().enumerate() {
            flatten(format!("{at} items[{j}]"), item, out)?;
        }
        return Some(());
    }
    let (name, namespace) = d
        .metadata
        .as_ref()
        .map(|m| {
            let ns = m.namespace.clone().filter(|n| !n.is_empty());
            (m.name.clone().unwrap_or_default(), ns)
        })
        .unwrap_or_default();
    let body = match (d.api_version.as_str(), d.kind.as_str()) {
        ("v1", "Service") => {
            if d.address_type.is_some() || d.endpoints.is_some() || d.ports.is_some() {
                return None;
            }
            Some(Box::new(Body::Service(Service {
                metadata: d.metadata.unwrap_or_default(),
                spec: d.spec,
                status: d.status,
            })))
        }
        ("discovery.k8s.io/v1", "EndpointSlice") => {
            if d.spec.is_some() || d.status.is_some() {
                return None;
            }
            Some(Box::new(Body::Slice(EndpointSlice {
                metadata: d.metadata.unwrap_or_default(),
                address_type: d.address_type.unwrap_or_default(),
                endpoints: d.endpoints.unwrap_or_default(),
                ports: d.ports,
            })))
        }
        // Another kind's fields may not fit these types: only the general
        // path can skip it without losing the file.
        _ => return None,
    };
    out.push(Doc {
        at,
        api: d.api_version,
        kind: d.kind,
        name,
        namespace,
        body: body.map(Ok),
    });
    Some(())
}

/// A document's every part, to compare two paths' readings.
pub(super) type Seen = (
    String,
    String,
    String,
    String,
    Option<String>,
    Option<Box<Body>>,
);

pub(super) fn seen(docs: Vec<Doc>) -> Vec<Seen> {
    docs.into_iter()
        .map(|d| {
            let body = d.body.map(|b| b.expect("fits its type"));
            (d.at, d.api, d.kind, d.name, d.namespace, body)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    const YAML: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop, labels: {app: web}}
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  ports: [{name: http, port: 80, targetPort: 8080, nodePort: 30080}]
  externalTrafficPolicy: Local
status: {loadBalancer: {}}
---
---
apiVersion: v1
kind: List
items:
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata:
    name: web-1
    namespace: shop
    labels: {kubernetes.io/service-name: web}
  addressType: IPv4
  ports: [{name: http, port: 8080, protocol: TCP}]
  endpoints:
  - addresses: ["10.1.0.1"]
    conditions: {ready: true, serving: true, terminating: false}
    nodeName: n1
    zone: z1
    hints: {forZones: [{name: z1}]}
    targetRef: {kind: Pod, namespace: shop, name: web-abc, uid: 00000000-0000-4000-8000-0000000a0001}
- apiVersion: v1
  kind: Service
  metadata: {name: bare}
"#;

    #[test]
    fn the_fast_path_reads_what_the_general_path_reads() {
        let fast = yaml(YAML, serde_saphyr::Options::default()).expect("fast path");
        let values: Vec<Value> = serde_saphyr::from_multiple(YAML).unwrap();
        let general = super::super::general(values);
        assert_eq!(fast.len(), 3);
        assert_eq!(seen(fast), seen(general));

        let json = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"j"},"spec":{"clusterIP":"10.96.0.9","ports":[{"port":53,"protocol":"UDP"}]}}"#;
        let general = super::super::general(vec![serde_json::from_str(json).unwrap()]);
        assert_eq!(seen(json_docs(json)), seen(general));
    }

    fn json_docs(text: &str) -> Vec<Doc> {
        json(text).expect("fast path")
    }

    #[test]
    fn what_the_fast_path_cannot_take_whole_goes_to_the_general_path() {
        for text in [
            // A type error: the general path names the field.
            "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: x}]}\n",
            // Another kind, whose `spec` is no ServiceSpec.
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {replicas: 2}\n",
            // A duplicate key.
            "apiVersion: v1\nkind: Service\nkind: Service\nmetadata: {name: a}\n",
            // Fields of the other kind.
            "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nendpoints: []\n",
        ] {
            assert!(
                yaml(text, serde_saphyr::Options::default()).is_none(),
                "{text}"
            );
        }
    }
}
