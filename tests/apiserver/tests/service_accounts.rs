//! Service accounts as a kubelet and in-cluster clients meet them: the
//! TokenRequest subresource, bound tokens authenticating (and no longer
//! once their pod is gone), each namespace's `default` account and
//! `kube-root-ca.crt`, and the ServiceAccount admission plugin on pods.
use std::time::Duration;

use base64::Engine as _;
use futures::StreamExt as _;
use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::{ConfigMap, Namespace, Node, Pod, ServiceAccount},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams, WatchEvent, WatchParams},
};
use serde_json::{Value, json};
use weir_test_apiserver::{Options, TestApiServer};
mod common;

use common::{code, start, start_with};

const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

fn pod_json(name: &str, spec: Value) -> Pod {
    let mut spec = spec;
    if spec["containers"].is_null() {
        spec["containers"] = json!([{"name": "c", "image": "busybox:1"}]);
    }
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

async fn create_pod(client: &Client, ns: &str, name: &str, spec: Value) -> Pod {
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod_json(name, spec))
        .await
        .unwrap()
}

fn request(expiration: Option<i64>, pod: Option<&Pod>) -> TokenRequest {
    TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: expiration,
            bound_object_ref: pod.map(|p| BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: p.metadata.name.clone(),
                uid: p.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    }
}

async fn token_for(client: &Client, ns: &str, sa: &str, req: &TokenRequest) -> TokenRequest {
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(sa, &PostParams::default(), req)
        .await
        .unwrap()
}

fn jwt_part(token: &str, i: usize) -> Value {
    let part = token.split('.').nth(i).unwrap();
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .unwrap();
    serde_json::from_slice(&raw).unwrap()
}

/// A client that has nothing but the CA and this bearer token, as a pod's
/// in-cluster configuration.
async fn client_with_token(server: &TestApiServer, ca_pem: &str, token: &str) -> Client {
    let b64 = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let kubeconfig = format!(
        "apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: {}, certificate-authority-data: {b64}}}}}]
users: [{{name: u, user: {{token: {token}}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
",
        server.url()
    );
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kc = kube::config::Kubeconfig::from_yaml(&kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

async fn list_pods(client: &Client) -> Result<usize, u16> {
    Api::<Pod>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .map(|l| l.items.len())
        .map_err(code)
}

#[tokio::test]
async fn token_request_signs_a_jwt_with_upstreams_claims() {
    let (server, client) = start().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap(),
        )
        .await
        .unwrap();
    let pod = create_pod(&client, "default", "p", json!({"nodeName": "n1"})).await;
    let sa = Api::<ServiceAccount>::namespaced(client.clone(), "default")
        .get("default")
        .await
        .unwrap();

    let before = jiff::Timestamp::now().as_second();
    let out = token_for(&client, "default", "default", &request(None, Some(&pod))).await;
    assert_eq!(out.metadata.name.as_deref(), Some("default"));
    assert_eq!(out.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(out.spec.audiences, [ISSUER]);
    assert_eq!(out.spec.expiration_seconds, Some(3600));
    let status = out.status.unwrap();
    let expires = status.expiration_timestamp.0.as_second();
    assert!(
        (before + 3600..=before + 3602).contains(&expires),
        "{expires}"
    );

    let token = &status.token;
    assert_eq!(
        jwt_part(token, 0),
        json!({"alg": "ES256", "kid": server.service_account_key_id(), "typ": "JWT"})
    );
    let claims = jwt_part(token, 1);
    let iat = claims["iat"].as_i64().unwrap();
    assert_eq!(claims["nbf"], iat);
    assert_eq!(claims["exp"], iat + 3600);
    assert_eq!(claims["iss"], ISSUER);
    assert_eq!(claims["aud"], json!([ISSUER]));
    assert_eq!(claims["sub"], "system:serviceaccount:default:default");
    assert_eq!(claims["jti"].as_str().unwrap().len(), 36, "{claims}");
    assert_eq!(
        claims["kubernetes.io"],
        json!({
            "namespace": "default",
            "serviceaccount": {"name": "default", "uid": sa.metadata.uid},
            "pod": {"name": "p", "uid": pod.metadata.uid},
            "node": {"name": "n1", "uid": node.metadata.uid},
        })
    );

    // What the kubelet asks for its projected volume: a year's token that
    // warns after the hour; the status still says the hour.
    let out = token_for(
        &client,
        "default",
        "default",
        &request(Some(3607), Some(&pod)),
    )
    .await;
    let claims = jwt_part(&out.status.as_ref().unwrap().token, 1);
    let iat = claims["iat"].as_i64().unwrap();
    assert_eq!(claims["exp"], iat + 365 * 24 * 3600);
    assert_eq!(claims["kubernetes.io"]["warnafter"], iat + 3607);
    assert_eq!(out.spec.expiration_seconds, Some(3607));

    // Discovery lists the subresource as the real /api/v1 does.
    let v1: Value = serde_json::from_str(
        &client
            .request_text(http::Request::get("/api/v1").body(Vec::new()).unwrap())
            .await
            .unwrap(),
    )
    .unwrap();
    let entry = v1["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "serviceaccounts/token")
        .unwrap();
    assert_eq!(
        (
            &entry["group"],
            &entry["version"],
            &entry["kind"],
            &entry["verbs"]
        ),
        (
            &json!("authentication.k8s.io"),
            &json!("v1"),
            &json!("TokenRequest"),
            &json!(["create"])
        )
    );

    // Own audiences are kept; an unbound token has no pod claim.
    let mut custom = request(Some(600), None);
    custom.spec.audiences = vec!["vault".into()];
    let out = token_for(&client, "default", "default", &custom).await;
    let claims = jwt_part(&out.status.unwrap().token, 1);
    assert_eq!(claims["aud"], json!(["vault"]));
    assert!(claims["kubernetes.io"]["pod"].is_null(), "{claims}");
}

#[tokio::test]
async fn token_requests_are_refused_like_upstream() {
    let (_server, client) = start().await;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    let refusal = |req: TokenRequest, sa: &'static str| {
        let sas = sas.clone();
        async move {
            match sas
                .create_token_request(sa, &PostParams::default(), &req)
                .await
                .unwrap_err()
            {
                kube::Error::Api(s) => (s.code, s.message),
                other => panic!("{other:?}"),
            }
        }
    };
    let (status, message) = refusal(request(Some(599), None), "default").await;
    assert_eq!(status, 422);
    assert!(
        message.contains(
            "spec.expirationSeconds: Invalid value: 599: may not specify a duration less than 10 minutes"
        ),
        "{message}"
    );
    let (status, message) = refusal(request(None, None), "nobody").await;
    assert_eq!(
        (status, message.as_str()),
        (404, "serviceaccounts \"nobody\" not found")
    );

    let pod = create_pod(&client, "default", "p", json!({})).await;
    let mut stale = pod.clone();
    stale.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
    let (status, message) = refusal(request(None, Some(&stale)), "default").await;
    assert_eq!(status, 409);
    assert!(
        message.contains("does not match the UID in record"),
        "{message}"
    );
    stale.metadata.name = Some("gone".into());
    let (status, message) = refusal(request(None, Some(&stale)), "default").await;
    assert_eq!((status, message.as_str()), (404, "pods \"gone\" not found"));

    let mut secret = request(None, Some(&pod));
    secret.spec.bound_object_ref.as_mut().unwrap().kind = Some("Secret".into());
    let (status, message) = refusal(secret, "default").await;
    assert_eq!(status, 400);
    assert!(message.contains("spec.boundObjectRef.kind"), "{message}");

    // The pod runs as "default", so a token of another account cannot be
    // bound to it.
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap(),
    )
    .await
    .unwrap();
    let (status, message) = refusal(request(None, Some(&pod)), "other").await;
    assert_eq!(status, 400);
    assert!(message.contains("different serviceaccount"), "{message}");
}

#[tokio::test]
async fn max_token_expiration_caps_what_is_issued() {
    let (_server, client) = start_with(Options {
        max_token_expiration: Some(Duration::from_secs(60)),
        ..Options::default()
    })
    .await;
    let out = token_for(&client, "default", "default", &request(Some(3600), None)).await;
    assert_eq!(out.spec.expiration_seconds, Some(60));
    let claims = jwt_part(&out.status.unwrap().token, 1);
    assert_eq!(
        claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap(),
        60
    );
}

#[tokio::test]
async fn bound_tokens_authenticate_while_their_pod_lives() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = create_pod(&client, "default", "p", json!({})).await;
    let token = token_for(&client, "default", "default", &request(None, Some(&pod)))
        .await
        .status
        .unwrap()
        .token;
    let as_pod = client_with_token(&server, server.ca_pem(), &token).await;
    assert_eq!(list_pods(&as_pod).await, Ok(1));
    assert!(
        server
            .requests_by_user()
            .iter()
            .any(|(user, r)| user == "system:serviceaccount:default:default"
                && r.starts_with("GET /api/v1/namespaces/default/pods")),
        "{:?}",
        server.requests_by_user()
    );

    // Across an outage: the signing key is the server's, not the run's.
    server.stop().await;
    server.restart().await.unwrap();
    assert_eq!(list_pods(&as_pod).await, Ok(1));

    // Unbound (so deleted at once), then recreated under the same name.
    pods.delete("p", &DeleteParams::default()).await.unwrap();
    assert_eq!(list_pods(&as_pod).await, Err(401));
    create_pod(&client, "default", "p", json!({})).await;
    assert_eq!(list_pods(&as_pod).await, Err(401));

    // Tokens for other audiences, or that were never ours, are refused.
    let mut vault = request(None, None);
    vault.spec.audiences = vec!["vault".into()];
    let vault = token_for(&client, "default", "default", &vault).await;
    let as_vault = client_with_token(&server, server.ca_pem(), &vault.status.unwrap().token).await;
    assert_eq!(list_pods(&as_vault).await, Err(401));
    let forged = client_with_token(&server, server.ca_pem(), "e30.e30.AAAA").await;
    assert_eq!(list_pods(&forged).await, Err(401));
}

#[tokio::test]
async fn tokens_outlive_a_graceful_delete_but_not_their_account() {
    let (server, client) = start().await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = create_pod(&client, "default", "p", json!({"nodeName": "n1"})).await;
    let token = token_for(&client, "default", "default", &request(None, Some(&pod)))
        .await
        .status
        .unwrap()
        .token;
    let as_pod = client_with_token(&server, server.ca_pem(), &token).await;
    // A bound pod terminates for its grace period; its token works meanwhile.
    pods.delete("p", &DeleteParams::default()).await.unwrap();
    assert!(
        pods.get("p")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    assert_eq!(list_pods(&as_pod).await, Ok(1));

    // The account deleted (and put back with a new uid by the controller).
    let unbound = token_for(&client, "default", "default", &request(None, None))
        .await
        .status
        .unwrap()
        .token;
    let unbound = client_with_token(&server, server.ca_pem(), &unbound).await;
    assert_eq!(list_pods(&unbound).await, Ok(1));
    Api::<ServiceAccount>::namespaced(client.clone(), "default")
        .delete("default", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(list_pods(&unbound).await, Err(401));
    assert_eq!(list_pods(&as_pod).await, Err(401));
}

#[tokio::test]
async fn every_namespace_gets_a_default_account_and_the_root_ca() {
    let (server, client) = start().await;
    let rv = server.resource_version().to_string();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "fresh"}})).unwrap(),
        )
        .await
        .unwrap();
    for ns in [
        "default",
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "fresh",
    ] {
        let sa = Api::<ServiceAccount>::namespaced(client.clone(), ns)
            .get("default")
            .await;
        assert!(sa.is_ok(), "{ns}: {sa:?}");
        let cm = Api::<ConfigMap>::namespaced(client.clone(), ns)
            .get("kube-root-ca.crt")
            .await
            .unwrap();
        assert_eq!(
            cm.data.unwrap()["ca.crt"],
            server.ca_pem(),
            "{ns}/kube-root-ca.crt"
        );
    }

    // Watches see them arrive after the namespace.
    let cms: Api<ConfigMap> = Api::all(client.clone());
    let mut events = cms
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    match events.next().await.unwrap().unwrap() {
        WatchEvent::Added(cm) => {
            assert_eq!(cm.metadata.namespace.as_deref(), Some("fresh"));
            assert_eq!(cm.metadata.name.as_deref(), Some("kube-root-ca.crt"));
            assert!(
                cm.metadata
                    .resource_version
                    .unwrap()
                    .parse::<u64>()
                    .unwrap()
                    > rv.parse().unwrap()
            );
        }
        other => panic!("{other:?}"),
    }

    // The ConfigMap's CA is enough to trust the server (as a pod would).
    let cm = Api::<ConfigMap>::namespaced(client.clone(), "fresh")
        .get("kube-root-ca.crt")
        .await
        .unwrap();
    let ca = cm.data.unwrap()["ca.crt"].clone();
    let in_pod = client_with_token(&server, &ca, server.token()).await;
    assert_eq!(list_pods(&in_pod).await, Ok(0));

    // The controllers put back what is deleted.
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "fresh");
    let old = sas.get("default").await.unwrap();
    sas.delete("default", &DeleteParams::default())
        .await
        .unwrap();
    let new = sas.get("default").await.unwrap();
    assert_ne!(old.metadata.uid, new.metadata.uid);
    let cms: Api<ConfigMap> = Api::namespaced(client, "fresh");
    cms.delete("kube-root-ca.crt", &DeleteParams::default())
        .await
        .unwrap();
    assert!(cms.get("kube-root-ca.crt").await.is_ok());
}

fn volumes(pod: &Pod) -> Vec<Value> {
    let spec = pod.spec.as_ref().unwrap();
    spec.volumes
        .iter()
        .flatten()
        .map(|v| serde_json::to_value(v).unwrap())
        .collect()
}

fn mounts(c: &k8s_openapi::api::core::v1::Container) -> Vec<Value> {
    c.volume_mounts
        .iter()
        .flatten()
        .map(|m| serde_json::to_value(m).unwrap())
        .collect()
}

#[tokio::test]
async fn pods_get_an_account_and_a_token_volume() {
    let (_server, client) = start().await;
    let pod = create_pod(
        &client,
        "default",
        "p",
        json!({
            "initContainers": [{"name": "init", "image": "busybox:1"}],
            "containers": [
                {"name": "a", "image": "busybox:1"},
                {"name": "b", "image": "busybox:1", "volumeMounts": [{"name": "own", "mountPath": MOUNT_PATH}]},
            ],
            "volumes": [{"name": "own", "emptyDir": {}}],
        }),
    )
    .await;
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    assert_eq!(spec.service_account.as_deref(), Some("default"));
    let vols = volumes(&pod);
    assert_eq!(vols.len(), 2, "{vols:?}");
    let name = vols[1]["name"].as_str().unwrap().to_string();
    let suffix = name.strip_prefix("kube-api-access-").unwrap();
    assert_eq!(suffix.len(), 5);
    assert!(
        suffix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    );
    assert_eq!(
        vols[1]["projected"],
        json!({"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ]})
    );
    let injected = json!({"name": name, "readOnly": true, "mountPath": MOUNT_PATH});
    let init = &spec.init_containers.as_ref().unwrap()[0];
    assert_eq!(mounts(init), std::slice::from_ref(&injected));
    assert_eq!(mounts(&spec.containers[0]), [injected]);
    assert_eq!(
        mounts(&spec.containers[1]),
        [json!({"name": "own", "mountPath": MOUNT_PATH})]
    );

    // automountServiceAccountToken: the pod's says, else its account's.
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(
            json!({"metadata": {"name": "quiet"}, "automountServiceAccountToken": false}),
        )
        .unwrap(),
    )
    .await
    .unwrap();
    let off = create_pod(
        &client,
        "default",
        "off",
        json!({"automountServiceAccountToken": false}),
    )
    .await;
    assert!(volumes(&off).is_empty());
    let quiet = create_pod(
        &client,
        "default",
        "quiet",
        json!({"serviceAccountName": "quiet"}),
    )
    .await;
    assert!(volumes(&quiet).is_empty());
    assert_eq!(
        quiet.spec.as_ref().unwrap().service_account.as_deref(),
        Some("quiet")
    );
    let on = create_pod(
        &client,
        "default",
        "on",
        json!({"serviceAccountName": "quiet", "automountServiceAccountToken": true}),
    )
    .await;
    assert_eq!(volumes(&on).len(), 1);

    // A missing account refuses the pod.
    let err = Api::<Pod>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &pod_json("lost", json!({"serviceAccountName": "ghost"})),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        status.message,
        "pods \"lost\" is forbidden: error looking up service account default/ghost: serviceaccount \"ghost\" not found"
    );

    // Mirror pods are left alone, and may not use an account.
    let mut mirror = pod_json("static-n1", json!({}));
    mirror.metadata.annotations =
        Some([("kubernetes.io/config.mirror".to_string(), "x".to_string())].into());
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let created = pods.create(&PostParams::default(), &mirror).await.unwrap();
    assert!(
        created
            .spec
            .as_ref()
            .unwrap()
            .service_account_name
            .is_none()
    );
    assert!(volumes(&created).is_empty());
    mirror.metadata.name = Some("static-n2".into());
    mirror.spec.as_mut().unwrap().service_account_name = Some("default".into());
    let err = pods
        .create(&PostParams::default(), &mirror)
        .await
        .unwrap_err();
    assert_eq!(code(err), 403);
}
