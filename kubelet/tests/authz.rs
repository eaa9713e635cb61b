//! Authorization of the kubelet API against the test API server's RBAC: a
//! certificate signed by `clientCAFile` authenticates, but only one granted
//! `nodes/proxy` by a ClusterRoleBinding reads `/pods`.
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
};

use http_body_util::{BodyExt, Empty};
use hyper::{Request, StatusCode, body::Bytes};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::{
    core::v1::Pod,
    rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject},
};
use kube::api::{Api, ObjectMeta, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::{
    ClientConfig, RootCertStore,
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName},
};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use weir_kubelet::{
    config::{AuthorizationMode, Config, TlsFiles},
    flow::{ContainerRef, PodsView},
    server::{ApiServer, Server},
};
use weir_test_apiserver::{Options, TestApiServer};

const NODE: &str = "node-authz";

struct NoPods;

impl PodsView for NoPods {
    fn pods(&self) -> Vec<Pod> {
        Vec::new()
    }
    fn container(&self, _: &str, _: &str, _: &str) -> Option<ContainerRef> {
        None
    }
    fn sandbox(&self, _: &str, _: &str) -> Option<String> {
        None
    }
}

type Cert = (CertificateDer<'static>, Vec<u8>);

fn client_cert(ca: &CertifiedIssuer<'static, KeyPair>, cn: &str, org: Option<&str>) -> Cert {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    if let Some(o) = org {
        params.distinguished_name.push(DnType::OrganizationName, o);
    }
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, ca).unwrap();
    (cert.der().clone(), key.serialize_der())
}

/// The kubelet's client CA and serving certificate, in files as configured.
struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
    config: Config,
    _files: Scratch,
}

/// The test's own directory, removed when the test ends, failed or not.
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pki(mode: Option<AuthorizationMode>) -> Pki {
    // Tests run in parallel: each gets its own files.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("weir-kubelet-authz-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "kubelet-client-ca");
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let mut serving = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = serving.signed_by(&key, &ca).unwrap();
    let tls = TlsFiles {
        cert_file: dir.join("kubelet.crt"),
        key_file: dir.join("kubelet.key"),
    };
    std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
    std::fs::write(&tls.cert_file, cert.pem()).unwrap();
    std::fs::write(&tls.key_file, key.serialize_pem()).unwrap();
    let mut config = Config {
        address: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: 0,
        healthz_port: None,
        client_ca_file: Some(dir.join("ca.crt")),
        tls: Some(tls),
        ..Config::default()
    };
    config.authorization.mode = mode;
    Pki {
        ca,
        config,
        _files: Scratch(dir),
    }
}

async fn get(pki: &Pki, addr: SocketAddr, cert: &Cert, path: &str) -> (StatusCode, String) {
    let mut roots = RootCertStore::empty();
    roots.add(pki.ca.der().clone()).unwrap();
    let client =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(
                vec![cert.0.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.1.clone())),
            )
            .unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = TlsConnector::from(Arc::new(client))
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", "127.0.0.1")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// `nodes/proxy` get for `user`, as `system:kubelet-api-admin` grants it.
async fn grant_proxy(client: &kube::Client, user: &str) {
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(format!("{user}-proxy-reader")),
            ..Default::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["nodes/proxy".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }]),
        ..Default::default()
    };
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(format!("{user}-kubelet-proxy")),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: format!("{user}-proxy-reader"),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: user.into(),
            ..Default::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

#[tokio::test]
async fn webhook_mode_asks_rbac_for_nodes_subresources() {
    let apiserver = TestApiServer::start(Options::default()).await.unwrap();
    let client = apiserver.client().await.unwrap();
    // Unset: the kubelet's default, Webhook, since there is an API server.
    let pki = pki(None);
    let api = ApiServer {
        client: client.clone(),
        node_name: NODE.into(),
    };
    let server = Server::start_with(&pki.config, Arc::new(NoPods), Some(api))
        .await
        .unwrap();
    let addr = server.endpoints().api;

    let mallory = client_cert(&pki.ca, "mallory", Some("developers"));
    let alice = client_cert(&pki.ca, "alice", None);
    grant_proxy(&client, "alice").await;

    // Signed by clientCAFile, so authenticated, but granted nothing.
    assert_eq!(
        get(&pki, addr, &mallory, "/pods").await,
        (
            StatusCode::FORBIDDEN,
            "Forbidden (user=mallory, verb=get, resource=nodes, subresource=proxy)\n".into()
        )
    );
    let (status, body) = get(&pki, addr, &alice, "/pods").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body.contains("\"items\""), "{body}");
    // nodes/proxy does not grant nodes/stats or nodes/log.
    assert_eq!(
        get(&pki, addr, &alice, "/stats/summary").await,
        (
            StatusCode::FORBIDDEN,
            "Forbidden (user=alice, verb=get, resource=nodes, subresource=stats)\n".into()
        )
    );
    assert_eq!(
        get(&pki, addr, &alice, "/logs/").await.0,
        StatusCode::FORBIDDEN
    );
    // A group grant from the certificate's O works the same way.
    let ops = client_cert(&pki.ca, "oscar", Some("system:masters"));
    assert_eq!(get(&pki, addr, &ops, "/pods").await.0, StatusCode::OK);
}

#[tokio::test]
async fn denials_are_remembered_for_the_unauthorized_ttl() {
    let apiserver = TestApiServer::start(Options::default()).await.unwrap();
    let client = apiserver.client().await.unwrap();
    for (user, ttl_secs, after_grant) in [
        ("bob", 3600, StatusCode::FORBIDDEN),
        ("carol", 0, StatusCode::OK),
    ] {
        let mut pki = pki(Some(AuthorizationMode::Webhook));
        pki.config.authorization.cache_unauthorized_ttl = std::time::Duration::from_secs(ttl_secs);
        let api = ApiServer {
            client: client.clone(),
            node_name: NODE.into(),
        };
        let server = Server::start_with(&pki.config, Arc::new(NoPods), Some(api))
            .await
            .unwrap();
        let addr = server.endpoints().api;
        let cert = client_cert(&pki.ca, user, None);
        assert_eq!(
            get(&pki, addr, &cert, "/pods").await.0,
            StatusCode::FORBIDDEN
        );
        grant_proxy(&client, user).await;
        // A remembered denial stands until its TTL runs out; with a zero
        // TTL the grant counts at once.
        assert_eq!(
            get(&pki, addr, &cert, "/pods").await.0,
            after_grant,
            "{user}"
        );
    }
}

#[tokio::test]
async fn always_allow_and_webhook_without_api_server() {
    let pki_allow = pki(Some(AuthorizationMode::AlwaysAllow));
    let server = Server::start(&pki_allow.config, Arc::new(NoPods))
        .await
        .unwrap();
    let anyone = client_cert(&pki_allow.ca, "anyone", None);
    let addr = server.endpoints().api;
    assert_eq!(
        get(&pki_allow, addr, &anyone, "/pods").await.0,
        StatusCode::OK
    );
    // As the kubelet: Webhook needs an API server to ask.
    let pki_webhook = pki(Some(AuthorizationMode::Webhook));
    let e = Server::start(&pki_webhook.config, Arc::new(NoPods))
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("authorization.mode: Webhook"), "{e}");
}
