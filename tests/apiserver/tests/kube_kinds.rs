//! Kind-specific behaviour through kube-rs: Service allocation, Leases,
//! EndpointSlices, name validation, discovery.

use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::{ConfigMap, Service},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
mod common;

use common::{cm, code, start};

fn service(name: &str, spec: serde_json::Value) -> Service {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

#[tokio::test]
async fn services_get_cluster_ips_and_node_ports() {
    let (_server, client) = start().await;
    let svcs: Api<Service> = Api::namespaced(client, "default");
    let a = svcs
        .create(
            &PostParams::default(),
            &service("a", json!({"ports": [{"port": 80}]})),
        )
        .await
        .unwrap();
    let spec = a.spec.unwrap();
    let ip = spec.cluster_ip.clone().unwrap();
    assert!(in_service_cidr(&ip), "{ip}");
    assert_eq!(spec.cluster_ips, Some(vec![ip.clone()]));
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    let dup = svcs
        .create(
            &PostParams::default(),
            &service("b", json!({"clusterIP": ip, "ports": [{"port": 80}]})),
        )
        .await;
    assert_eq!(code(dup.unwrap_err()), 422);
    let headless = svcs
        .create(
            &PostParams::default(),
            &service("h", json!({"clusterIP": "None", "ports": [{"port": 80}]})),
        )
        .await
        .unwrap();
    assert_eq!(headless.spec.unwrap().cluster_ip.as_deref(), Some("None"));
    let np = svcs
        .create(
            &PostParams::default(),
            &service("np", json!({"type": "NodePort", "ports": [{"port": 80}]})),
        )
        .await
        .unwrap();
    let port = np.spec.unwrap().ports.unwrap()[0].node_port.unwrap();
    assert!((30000..=32767).contains(&port));
    let dup = svcs
        .create(
            &PostParams::default(),
            &service(
                "np2",
                json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": port}]}),
            ),
        )
        .await;
    assert_eq!(code(dup.unwrap_err()), 422);
    // A replace without the allocated values keeps them.
    let mut again = service("a", json!({"ports": [{"port": 81}]}));
    again.metadata.resource_version = a.metadata.resource_version.clone();
    let replaced = svcs
        .replace("a", &PostParams::default(), &again)
        .await
        .unwrap();
    assert_eq!(replaced.spec.unwrap().cluster_ip, Some(ip));
}

#[tokio::test]
async fn lease_create_and_replace() {
    let (_server, client) = start().await;
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("n1".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("n1".into()),
            lease_duration_seconds: Some(40),
            ..Default::default()
        }),
    };
    let mut l = leases.create(&PostParams::default(), &lease).await.unwrap();
    l.spec.as_mut().unwrap().lease_duration_seconds = Some(10);
    let r = leases
        .replace("n1", &PostParams::default(), &l)
        .await
        .unwrap();
    assert_eq!(r.spec.unwrap().lease_duration_seconds, Some(10));
    assert_eq!(
        code(
            leases
                .replace("n1", &PostParams::default(), &l)
                .await
                .unwrap_err()
        ),
        409
    );
}

#[tokio::test]
async fn endpointslices_and_name_validation() {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let (_server, client) = start().await;
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    let slice = |name: &str, svc: &str, ip: &str| -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        }))
        .unwrap()
    };
    slices
        .create(&PostParams::default(), &slice("web-1", "web", "10.0.0.1"))
        .await
        .unwrap();
    slices
        .create(&PostParams::default(), &slice("db-1", "db", "10.0.0.2"))
        .await
        .unwrap();
    let web = slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
        .await
        .unwrap();
    assert_eq!(web.items.len(), 1);
    assert_eq!(web.items[0].endpoints[0].addresses, ["10.0.0.1"]);
    assert_eq!(web.items[0].metadata.generation, Some(1));
    let moved = slices
        .patch(
            "web-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"endpoints": [{"addresses": ["10.0.0.9"]}]})),
        )
        .await
        .unwrap();
    assert_eq!(moved.metadata.generation, Some(2));
    let mut no_type = serde_json::to_value(slice("x", "web", "10.0.0.3")).unwrap();
    no_type.as_object_mut().unwrap().remove("addressType");
    let raw: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &kube::api::ApiResource::erase::<EndpointSlice>(&()),
    );
    let obj: kube::api::DynamicObject = serde_json::from_value(no_type).unwrap();
    assert_eq!(
        code(raw.create(&PostParams::default(), &obj).await.unwrap_err()),
        422
    );

    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let err = cms
        .create(&PostParams::default(), &cm("Not_Valid", "v", &[]))
        .await
        .unwrap_err();
    assert_eq!(code(err), 422);
}

#[tokio::test]
async fn discovery_and_version() {
    let (_server, client) = start().await;
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1");
    let discovery = kube::Discovery::new(client).run().await.unwrap();
    let groups: Vec<String> = discovery.groups().map(|g| g.name().to_string()).collect();
    for g in [
        "",
        "coordination.k8s.io",
        "discovery.k8s.io",
        "events.k8s.io",
    ] {
        assert!(groups.contains(&g.to_string()), "{groups:?}");
    }
    let (lease, caps) = discovery
        .groups()
        .find(|g| g.name() == "coordination.k8s.io")
        .unwrap()
        .recommended_kind("Lease")
        .unwrap();
    assert_eq!(lease.plural, "leases");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    assert!(caps.subresources.is_empty());
}

/// 10.96.0.0/12.
fn in_service_cidr(ip: &str) -> bool {
    let ip: std::net::Ipv4Addr = ip.parse().unwrap();
    u32::from(ip) >> 20 == u32::from(std::net::Ipv4Addr::new(10, 96, 0, 0)) >> 20
}
