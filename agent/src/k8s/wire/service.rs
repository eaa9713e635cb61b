//! The Service as the API source reads it off the wire: k8s-openapi's, but
//! for its metadata, of which only what the agent reads is built.
//!
//! Real API servers send `managedFields` with every object of a list: an
//! entry per field manager, each with a `fieldsV1` tree that k8s-openapi
//! builds as a `serde_json::Value`, to be dropped at once. The metadata here
//! keeps the name, namespace, UID, resource version, creation time, labels
//! and annotations (the conversion reads all of those); the rest is skipped
//! unbuilt.
use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{ServiceSpec, ServiceStatus},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use serde::{Deserialize, Deserializer};

type Api = k8s_openapi::api::core::v1::Service;

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Service {
    #[serde(default, deserialize_with = "service_meta")]
    pub metadata: ObjectMeta,
    pub spec: Option<ServiceSpec>,
    pub status: Option<ServiceStatus>,
}

impl From<Service> for Api {
    fn from(s: Service) -> Self {
        Self {
            metadata: s.metadata,
            spec: s.spec,
            status: s.status,
        }
    }
}

fn service_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        name: Option<String>,
        namespace: Option<String>,
        uid: Option<String>,
        resource_version: Option<String>,
        creation_timestamp: Option<Time>,
        labels: Option<BTreeMap<String, String>>,
        annotations: Option<BTreeMap<String, String>>,
    }
    let m = Option::<Meta>::deserialize(d)?;
    Ok(m.map_or_else(ObjectMeta::default, |m| ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        creation_timestamp: m.creation_timestamp,
        labels: m.labels,
        annotations: m.annotations,
        ..ObjectMeta::default()
    }))
}

super::resource_as!(Service, Api);

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_what_the_api_type_reads_but_managed_fields() {
        let v = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {
                "name": "web", "namespace": "shop", "uid": "u-1",
                "resourceVersion": "42", "generation": 3,
                "creationTimestamp": "2026-12-05T10:00:00Z",
                "labels": {"app": "web", "service.kubernetes.io/topology-mode": "Auto"},
                "annotations": {"weir.dev/lb-algorithm": "maglev"},
                "finalizers": ["service.kubernetes.io/load-balancer-cleanup"],
                "managedFields": [{
                    "manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                    "time": "2026-12-05T10:00:00Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:ports": {".": {}, "k:{\"port\":80}": {}}}},
                }],
            },
            "spec": {
                "type": "LoadBalancer", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080}],
                "externalTrafficPolicy": "Local", "healthCheckNodePort": 31000,
            },
            "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]}},
        });
        let api: Api = serde_json::from_value(v.clone()).unwrap();
        let wire: Service = serde_json::from_value(v).unwrap();
        assert!(api.metadata.managed_fields.is_some());
        let mut expected = api.clone();
        expected.metadata = ObjectMeta {
            generation: None,
            finalizers: None,
            managed_fields: None,
            ..api.metadata
        };
        assert_eq!(Api::from(wire), expected);
        // Absent and null metadata read as k8s-openapi reads them.
        for v in [json!({}), json!({"metadata": null})] {
            let api: Api = serde_json::from_value(v.clone()).unwrap();
            let wire: Service = serde_json::from_value(v).unwrap();
            assert_eq!(Api::from(wire), api);
        }
    }
}
