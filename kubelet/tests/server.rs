//! The kubelet's endpoints against a fake pod worker: plain healthz and
//! read-only /pods, the HTTPS API with client certificates, container logs.
use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use http_body_util::{BodyExt, Empty};
use hyper::{Method, Request, StatusCode, body::Bytes};
use hyper_util::rt::TokioIo;
use k8s_openapi::{
    List,
    api::core::v1::{Container, Pod, PodSpec, PodStatus},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::{
    ClientConfig, RootCertStore,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime},
};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use weir_kubelet::{
    config::{Config, TlsFiles},
    flow::{ContainerRef, PodsView},
    server::{Server, ServerError},
};

const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

#[path = "server/streaming.rs"]
mod streaming;

type Key = (String, String, String);

#[derive(Default)]
struct FakePods {
    pods: Vec<Pod>,
    containers: Mutex<HashMap<Key, ContainerRef>>,
}

fn key(namespace: &str, pod: &str, container: &str) -> Key {
    (namespace.to_owned(), pod.to_owned(), container.to_owned())
}

/// A running container whose log is `log`.
fn running(id: &str, log: &Path) -> ContainerRef {
    ContainerRef {
        id: id.to_owned(),
        running: true,
        log: Some(log.to_owned()),
        previous_log: None,
    }
}

impl PodsView for FakePods {
    fn pods(&self) -> Vec<Pod> {
        self.pods.clone()
    }
    fn container(&self, namespace: &str, pod: &str, container: &str) -> Option<ContainerRef> {
        let c = self.containers.lock().unwrap();
        c.get(&key(namespace, pod, container)).cloned()
    }
    fn sandbox(&self, _: &str, _: &str) -> Option<String> {
        None
    }
}

fn pod(namespace: &str, name: &str, containers: &[&str]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: containers
                .iter()
                .map(|c| Container {
                    name: (*c).to_owned(),
                    image: Some("busybox".to_owned()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".to_owned()),
            pod_ip: Some("10.88.0.7".to_owned()),
            ..Default::default()
        }),
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("weir-kubelet-server-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A CA, a serving certificate for 127.0.0.1 it signed, and client
/// certificates from it and from an unrelated CA.
struct Pki {
    ca_file: PathBuf,
    tls: TlsFiles,
    ca_der: CertificateDer<'static>,
    client: (CertificateDer<'static>, Vec<u8>),
    stranger: (CertificateDer<'static>, Vec<u8>),
}

fn new_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

fn client_cert(
    issuer: &CertifiedIssuer<'static, KeyPair>,
    cn: &str,
) -> (CertificateDer<'static>, Vec<u8>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.der().clone(), key.serialize_der())
}

fn pki(dir: &Path) -> Pki {
    let ca = new_ca("weir-test-kubelet-ca");
    let mut server = CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate().unwrap();
    let server_cert = server.signed_by(&server_key, &ca).unwrap();
    let ca_file = dir.join("ca.crt");
    let tls = TlsFiles {
        cert_file: dir.join("kubelet.crt"),
        key_file: dir.join("kubelet.key"),
    };
    std::fs::write(&ca_file, ca.pem()).unwrap();
    std::fs::write(&tls.cert_file, server_cert.pem()).unwrap();
    std::fs::write(&tls.key_file, server_key.serialize_pem()).unwrap();
    Pki {
        ca_file,
        tls,
        ca_der: ca.der().clone(),
        client: client_cert(&ca, "apiserver-kubelet-client"),
        stranger: client_cert(&new_ca("someone-else"), "intruder"),
    }
}

/// Every endpoint on an ephemeral port of 127.0.0.1.
fn config(pki: Option<&Pki>) -> Config {
    Config {
        address: LOCALHOST,
        port: 0,
        healthz_port: Some(0),
        healthz_bind_address: LOCALHOST,
        read_only_port: Some(0),
        client_ca_file: pki.map(|p| p.ca_file.clone()),
        tls: pki.map(|p| p.tls.clone()),
        ..Config::default()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn client_config(pki: &Pki, cert: Option<&(CertificateDer<'static>, Vec<u8>)>) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    roots.add(pki.ca_der.clone()).unwrap();
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    match cert {
        Some((der, key)) => builder
            .with_client_auth_cert(
                vec![der.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.clone())),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    }
}

type Reply = (StatusCode, String);
type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn request<S>(stream: S, method: Method, path: &str) -> Result<Reply, BoxError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1")
        .body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8(body.to_vec())?))
}

async fn http(addr: SocketAddr, method: Method, path: &str) -> Reply {
    let tcp = TcpStream::connect(addr).await.unwrap();
    request(tcp, method, path).await.unwrap()
}

async fn https(
    addr: SocketAddr,
    client: ClientConfig,
    method: Method,
    path: &str,
) -> Result<Reply, BoxError> {
    let tcp = TcpStream::connect(addr).await?;
    let tls = TlsConnector::from(Arc::new(client))
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await?;
    request(tls, method, path).await
}

fn fake(pods: Vec<Pod>) -> Arc<dyn PodsView> {
    Arc::new(FakePods {
        pods,
        ..FakePods::default()
    })
}

#[tokio::test]
async fn server_healthz_and_read_only_pods() {
    let server = Server::start(
        &config(None),
        fake(vec![pod("kube-system", "web", &["httpd"])]),
    )
    .await
    .unwrap();
    let e = server.endpoints();
    let healthz = e.healthz.unwrap();
    let read_only = e.read_only.unwrap();
    assert_ne!(healthz.port(), 0);

    assert_eq!(
        http(healthz, Method::GET, "/healthz").await,
        (StatusCode::OK, "ok".to_owned())
    );
    assert_eq!(
        http(healthz, Method::GET, "/pods").await.0,
        StatusCode::NOT_FOUND
    );

    let (status, body) = http(read_only, Method::GET, "/pods").await;
    assert_eq!(status, StatusCode::OK);
    let list: List<Pod> = serde_json::from_str(&body).unwrap();
    assert_eq!(list.items.len(), 1);
    let p = &list.items[0];
    assert_eq!(p.metadata.name.as_deref(), Some("web"));
    assert_eq!(p.metadata.namespace.as_deref(), Some("kube-system"));
    let status = p.status.as_ref().unwrap();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert_eq!(status.pod_ip.as_deref(), Some("10.88.0.7"));

    assert_eq!(
        http(read_only, Method::GET, "/healthz").await,
        (StatusCode::OK, "ok".to_owned())
    );
    assert_eq!(
        http(read_only, Method::POST, "/pods").await.0,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        http(
            read_only,
            Method::GET,
            "/containerLogs/kube-system/web/httpd"
        )
        .await
        .0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        http(read_only, Method::GET, "/nope").await.0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn server_disabled_ports_are_not_bound() {
    let config = Config {
        healthz_port: None,
        read_only_port: None,
        ..config(None)
    };
    let server = Server::start(&config, fake(Vec::new())).await.unwrap();
    assert_eq!(server.endpoints().healthz, None);
    assert_eq!(server.endpoints().read_only, None);
}

#[tokio::test]
async fn server_https_api_authenticates_client_certificates() {
    let dir = temp_dir("auth");
    let pki = pki(&dir);
    let server = Server::start(
        &config(Some(&pki)),
        fake(vec![pod("default", "secret-pod", &["app"])]),
    )
    .await
    .unwrap();
    let api = server.endpoints().api;
    let trusted = || client_config(&pki, Some(&pki.client));

    let (status, body) = https(api, trusted(), Method::GET, "/pods").await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let list: List<Pod> = serde_json::from_str(&body).unwrap();
    assert_eq!(list.items[0].metadata.name.as_deref(), Some("secret-pod"));
    assert_eq!(
        https(api, trusted(), Method::GET, "/healthz")
            .await
            .unwrap(),
        (StatusCode::OK, "ok".to_owned())
    );
    assert_eq!(
        https(api, trusted(), Method::DELETE, "/pods")
            .await
            .unwrap()
            .0,
        StatusCode::METHOD_NOT_ALLOWED
    );
    assert_eq!(
        https(api, trusted(), Method::GET, "/exec/default/secret-pod/app")
            .await
            .unwrap()
            .0,
        StatusCode::BAD_REQUEST,
        "exec without a command"
    );

    // Anonymous: the handshake completes and every path answers 401.
    for path in [
        "/pods",
        "/healthz",
        "/containerLogs/default/secret-pod/app",
        "/nope",
    ] {
        let (status, body) = https(api, client_config(&pki, None), Method::GET, path)
            .await
            .unwrap();
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        assert!(!body.contains("secret-pod"), "{path}: {body}");
    }

    // A certificate from another CA fails the handshake. The client sees the
    // server's UnknownCA alert, or a reset when the server closes the socket
    // with the client's request still unread: either way, no answer.
    let refused = https(
        api,
        client_config(&pki, Some(&pki.stranger)),
        Method::GET,
        "/pods",
    )
    .await;
    assert!(refused.is_err(), "{refused:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn server_container_logs_from_cri_files() {
    let dir = temp_dir("logs");
    let pki = pki(&dir);
    let log = dir.join("0.log");
    std::fs::write(
        &log,
        "2026-01-01T00:00:00.000000001Z stdout F hello\n\
         2026-01-01T00:00:01.5Z stdout P a long \n\
         2026-01-01T00:00:02Z stderr F warning\n\
         2026-01-01T00:00:03Z stdout F line, joined\n\
         2026-01-01T00:00:04Z stdout F bye\n",
    )
    .unwrap();
    let view = FakePods {
        pods: vec![pod("ns1", "web", &["httpd", "sidecar"])],
        containers: Mutex::new(HashMap::from([(
            key("ns1", "web", "httpd"),
            running("c1", &log),
        )])),
    };
    let server = Server::start(&config(Some(&pki)), Arc::new(view))
        .await
        .unwrap();
    let api = server.endpoints().api;
    let get = |path: &'static str| {
        let client = client_config(&pki, Some(&pki.client));
        async move { https(api, client, Method::GET, path).await.unwrap() }
    };

    assert_eq!(
        get("/containerLogs/ns1/web/httpd").await,
        (
            StatusCode::OK,
            "hello\na long line, joined\nwarning\nbye\n".to_owned()
        )
    );
    assert_eq!(
        get("/containerLogs/ns1/web/httpd?tailLines=2&timestamps=true").await,
        (
            StatusCode::OK,
            "2026-01-01T00:00:02Z warning\n2026-01-01T00:00:04Z bye\n".to_owned()
        )
    );

    let (status, body) = get("/containerLogs/ns1/web/nginx").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("container \"nginx\" not found"), "{body}");
    let (status, body) = get("/containerLogs/ns1/nginx/httpd").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body.contains("pod \"nginx\" does not exist"), "{body}");
    assert_eq!(
        get("/containerLogs/other/web/httpd").await.0,
        StatusCode::NOT_FOUND
    );
    // Known container without a log yet.
    assert_eq!(
        get("/containerLogs/ns1/web/sidecar").await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        get("/containerLogs/ns1/web/httpd?tailLines=x").await.0,
        StatusCode::BAD_REQUEST
    );

    let (status, body) = https(
        api,
        client_config(&pki, None),
        Method::GET,
        "/containerLogs/ns1/web/httpd",
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(!body.contains("hello"));
    let _ = std::fs::remove_dir_all(dir);
}

/// Accepts any server certificate and keeps the one it saw.
#[derive(Debug, Default)]
struct Insecure(Mutex<Option<CertificateDer<'static>>>);

impl ServerCertVerifier for Insecure {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        *self.0.lock().unwrap() = Some(end_entity.clone().into_owned());
        Ok(ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &provider().signature_verification_algorithms,
        )
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &provider().signature_verification_algorithms,
        )
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[tokio::test]
async fn server_without_client_ca_everything_is_401_over_a_self_signed_certificate() {
    let server = Server::start(&config(None), fake(vec![pod("default", "web", &["c"])]))
        .await
        .unwrap();
    let verifier = Arc::new(Insecure::default());
    let client = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(verifier.clone())
        .with_no_client_auth();
    let (status, body) = https(server.endpoints().api, client, Method::GET, "/pods")
        .await
        .unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(!body.contains("web"));

    // The self-signed certificate names this host, as the kubelet's does.
    let der = verifier.0.lock().unwrap().clone().unwrap();
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_lowercase();
    assert!(
        der.windows(hostname.len())
            .any(|w| w == hostname.as_bytes()),
        "certificate does not name {hostname}"
    );
}

#[tokio::test]
async fn server_start_errors_name_the_file_or_address() {
    let missing = Config {
        client_ca_file: Some("/nonexistent/ca.crt".into()),
        ..config(None)
    };
    let err = Server::start(&missing, fake(Vec::new()))
        .await
        .err()
        .unwrap();
    assert!(matches!(err, ServerError::Pem { .. }), "{err:?}");
    assert!(err.to_string().contains("/nonexistent/ca.crt"), "{err}");

    let dir = temp_dir("errors");
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    let config_empty = Config {
        tls: Some(TlsFiles {
            cert_file: empty.clone(),
            key_file: empty.clone(),
        }),
        ..config(None)
    };
    let err = Server::start(&config_empty, fake(Vec::new()))
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("tlsCertFile"), "{err}");

    let taken = std::net::TcpListener::bind((LOCALHOST, 0)).unwrap();
    let port = taken.local_addr().unwrap().port();
    let busy = Config {
        port,
        ..config(None)
    };
    let err = Server::start(&busy, fake(Vec::new())).await.err().unwrap();
    assert!(matches!(err, ServerError::Bind { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
