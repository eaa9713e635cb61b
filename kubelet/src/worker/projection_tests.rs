//! Projection volumes and `envFrom` through a fake API: what the files hold,
//! that a rotated token reaches the volume, and that an unchanged one
//! writes nothing. Mounts a tmpfs (projected volumes hold tokens): root.
use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, Mutex},
};

use serde_json::json;

use super::{
    WorkerConfig,
    spec::{ApiObjects, ContainerInputs, ObjectData, container_config, refresh_projections},
};
use crate::pod::{PodSpec, TokenProjection};

#[derive(Default)]
struct FakeApi {
    config_maps: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    token: Mutex<String>,
    asked: Mutex<Vec<(String, TokenProjection)>>,
}

impl ApiObjects for FakeApi {
    fn config_map(&self, _ns: &str, name: &str) -> ObjectData {
        Ok(self.config_maps.get(name).cloned())
    }
    fn secret(&self, _ns: &str, _name: &str) -> ObjectData {
        Ok(None)
    }
    fn service_account_token(&self, pod: &PodSpec, t: &TokenProjection) -> Result<String, String> {
        self.asked
            .lock()
            .unwrap()
            .push((pod.service_account_name.clone(), t.clone()));
        Ok(self.token.lock().unwrap().clone())
    }
}

struct Dir(std::path::PathBuf, WorkerConfig);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = super::pod_dir::remove(&self.1, "u1");
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn setup(tag: &str, api: Arc<FakeApi>) -> Dir {
    let d = std::env::temp_dir().join(format!("weir-projection-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    let mut c = WorkerConfig::new(&crate::config::Config::default(), "node1");
    c.pods_dir = d.join("pods");
    c.pod_log_dir = d.join("logs");
    c.resolv_conf = std::path::PathBuf::new();
    c.memory_capacity = Some(8 << 30);
    c.objects = Some(api);
    Dir(d, c)
}

fn pod(spec: serde_json::Value) -> PodSpec {
    let pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "prod", "uid": "u1",
                     "labels": {"app": "web", "tier": "front"}},
        "spec": spec,
    }))
    .unwrap();
    PodSpec::from_api(&pod).unwrap_or_else(|e| panic!("{e}"))
}

fn read(dir: &Path, rel: &str) -> String {
    std::fs::read_to_string(dir.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The volume the API server's ServiceAccount admission adds to every pod.
fn kube_api_access() -> serde_json::Value {
    json!({"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
    ]}})
}

#[test]
fn the_service_account_volume_holds_token_ca_and_namespace_and_follows_rotation() {
    let api = Arc::new(FakeApi {
        config_maps: BTreeMap::from([(
            "kube-root-ca.crt".to_owned(),
            BTreeMap::from([("ca.crt".to_owned(), b"-----BEGIN CERTIFICATE-----".to_vec())]),
        )]),
        token: Mutex::new("token-1".into()),
        ..FakeApi::default()
    });
    let d = setup("sa", api.clone());
    let spec = pod(json!({
        "serviceAccountName": "builder",
        "volumes": [kube_api_access()],
        "containers": [{"name": "c", "image": "i:1", "volumeMounts": [
            {"name": "kube-api-access-x7k2p", "readOnly": true,
             "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}],
    }));
    let i = ContainerInputs {
        cfg: &d.1,
        pod: &spec,
        container: &spec.containers[0],
        restart_count: 0,
        pod_ip: None,
    };
    let c = container_config(&i).unwrap_or_else(|e| panic!("{e}"));
    let m = &c.mounts[0];
    assert!(m.readonly);
    let vol = &m.host_path;
    assert!(vol.ends_with("u1/volumes/kubernetes.io~projected/kube-api-access-x7k2p"));
    assert_eq!(read(vol, "token"), "token-1");
    assert_eq!(read(vol, "ca.crt"), "-----BEGIN CERTIFICATE-----");
    assert_eq!(read(vol, "namespace"), "prod");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(vol.join("token"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);
    let asked = api.asked.lock().unwrap().clone();
    assert_eq!(asked[0].0, "builder");
    assert_eq!(asked[0].1.expiration_seconds, 3607);
    assert_eq!(asked[0].1.audience, None);

    // Nothing changed: the version the container sees stays.
    let version = std::fs::read_link(vol.join("..data")).unwrap();
    assert!(refresh_projections(&d.1, &spec).is_empty());
    assert_eq!(std::fs::read_link(vol.join("..data")).unwrap(), version);

    // A rotated token: a new version, whole.
    *api.token.lock().unwrap() = "token-2".into();
    assert!(refresh_projections(&d.1, &spec).is_empty());
    assert_eq!(read(vol, "token"), "token-2");
    assert_ne!(std::fs::read_link(vol.join("..data")).unwrap(), version);
}

#[test]
fn downward_api_volumes_show_fields_labels_and_resources() {
    let d = setup("downward", Arc::new(FakeApi::default()));
    let spec = pod(json!({
        "volumes": [{"name": "info", "downwardAPI": {"items": [
            {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "meta/tier", "fieldRef": {"fieldPath": "metadata.labels['tier']"}},
            {"path": "cpu_limit", "resourceFieldRef": {"containerName": "c", "resource": "limits.cpu", "divisor": "1m"}},
            {"path": "mem_request", "resourceFieldRef": {"containerName": "c", "resource": "requests.memory", "divisor": "1Mi"}},
            {"path": "mem_limit", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory"}}
        ]}}],
        "containers": [{"name": "c", "image": "i:1",
            "resources": {"limits": {"cpu": "250m"}, "requests": {"memory": "100Mi"}},
            "volumeMounts": [{"name": "info", "mountPath": "/etc/info"}]}],
    }));
    assert!(refresh_projections(&d.1, &spec).is_empty());
    let vol =
        d.1.pods_dir
            .join("u1/volumes/kubernetes.io~downward-api/info");
    assert_eq!(read(&vol, "name"), "web");
    assert_eq!(read(&vol, "labels"), "app=\"web\"\ntier=\"front\"");
    assert_eq!(read(&vol, "meta/tier"), "front");
    assert_eq!(read(&vol, "cpu_limit"), "250");
    assert_eq!(read(&vol, "mem_request"), "100");
    // No limit: the node's memory, as the kubelet merges it.
    assert_eq!(read(&vol, "mem_limit"), (8u64 << 30).to_string());
}

#[test]
fn env_from_sources_are_prefixed_and_env_wins() {
    let api = Arc::new(FakeApi {
        config_maps: BTreeMap::from([(
            "cfg".to_owned(),
            BTreeMap::from([
                ("MODE".to_owned(), b"fast".to_vec()),
                ("LEVEL".to_owned(), b"3".to_vec()),
                ("bad=name".to_owned(), b"x".to_vec()),
            ]),
        )]),
        ..FakeApi::default()
    });
    let d = setup("envfrom", api);
    let spec = pod(json!({
        "containers": [{"name": "c", "image": "i:1",
            "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "APP_"},
                        {"configMapRef": {"name": "absent", "optional": true}}],
            "env": [{"name": "APP_LEVEL", "value": "9"},
                    {"name": "URL", "value": "http://x/$(APP_MODE)"}]}],
    }));
    let i = ContainerInputs {
        cfg: &d.1,
        pod: &spec,
        container: &spec.containers[0],
        restart_count: 0,
        pod_ip: None,
    };
    let c = container_config(&i).unwrap_or_else(|e| panic!("{e}"));
    let env: BTreeMap<_, _> = c.env.iter().cloned().collect();
    assert_eq!(env.get("APP_MODE").map(String::as_str), Some("fast"));
    assert_eq!(env.get("APP_LEVEL").map(String::as_str), Some("9"));
    assert_eq!(env.get("URL").map(String::as_str), Some("http://x/fast"));
    assert!(!env.keys().any(|k| k.contains("bad")), "{env:?}");

    // A required source that is missing holds the container back.
    let spec = pod(json!({
        "containers": [{"name": "c", "image": "i:1",
            "envFrom": [{"secretRef": {"name": "creds"}}]}],
    }));
    let i = ContainerInputs {
        container: &spec.containers[0],
        pod: &spec,
        ..i
    };
    assert_eq!(
        container_config(&i).unwrap_err().to_string(),
        "secret \"creds\" not found"
    );
}
