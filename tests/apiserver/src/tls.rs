//! A throwaway PKI (CA, serving certificate, admin client certificate,
//! kubelet client certificate, service-account signing key), the rustls
//! server and kubelet-client configurations, and the kubeconfig clients use.
use std::{net::IpAddr, sync::Arc};

use base64::Engine as _;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use rustls::{
    ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme,
    client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime},
    server::WebPkiClientVerifier,
};

use crate::{error::Error, tokens::SigningKey};

/// The user the kubelet client certificate names.
pub const KUBELET_CLIENT_USER: &str = "kube-apiserver-kubelet-client";

/// Everything a client needs to trust and authenticate to the server.
pub struct Pki {
    pub ca_pem: String,
    ca_der: CertificateDer<'static>,
    server_der: CertificateDer<'static>,
    server_key_der: Vec<u8>,
    pub client_cert_pem: String,
    pub client_key_pem: String,
    /// `--kubelet-client-certificate`: what this server shows a kubelet.
    kubelet_client_der: CertificateDer<'static>,
    kubelet_client_key_der: Vec<u8>,
    pub token: String,
    /// Signs and verifies service-account tokens; kept for the server's
    /// life, so tokens stay valid across a restart.
    pub service_account_key: Arc<SigningKey>,
}

impl Pki {
    /// `names` are extra DNS names or IP addresses for the serving certificate.
    pub fn generate(names: &[String]) -> Result<Self, Error> {
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "weir-test-ca");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;

        let mut server = CertificateParams::new(vec![
            "localhost".to_string(),
            "kubernetes.default.svc".to_string(),
        ])?;
        server
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let mut ips: Vec<IpAddr> =
            vec![[127, 0, 0, 1].into(), std::net::Ipv6Addr::LOCALHOST.into()];
        for n in names {
            match n.parse::<IpAddr>() {
                Ok(ip) if !ips.contains(&ip) => ips.push(ip),
                Ok(_) => {}
                Err(_) => server
                    .subject_alt_names
                    .push(SanType::DnsName(n.clone().try_into()?)),
            }
        }
        server
            .subject_alt_names
            .extend(ips.into_iter().map(SanType::IpAddress));
        let server_key = KeyPair::generate()?;
        let server_cert = server.signed_by(&server_key, &ca)?;

        let mut client = CertificateParams::new(Vec::<String>::new())?;
        client
            .distinguished_name
            .push(DnType::CommonName, "weir-test-admin");
        client
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_key = KeyPair::generate()?;
        let client_cert = client.signed_by(&client_key, &ca)?;

        // kubeadm's name and group for it: a kubelet's webhook authorizer
        // then allows it nodes/proxy as a superuser.
        let mut kubelet_client = CertificateParams::new(Vec::<String>::new())?;
        kubelet_client
            .distinguished_name
            .push(DnType::CommonName, KUBELET_CLIENT_USER);
        kubelet_client
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        kubelet_client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let kubelet_client_key = KeyPair::generate()?;
        let kubelet_client_cert = kubelet_client.signed_by(&kubelet_client_key, &ca)?;

        Ok(Pki {
            ca_pem: ca.pem(),
            ca_der: ca.der().clone(),
            server_der: server_cert.der().clone(),
            server_key_der: server_key.serialize_der(),
            client_cert_pem: client_cert.pem(),
            client_key_pem: client_key.serialize_pem(),
            kubelet_client_der: kubelet_client_cert.der().clone(),
            kubelet_client_key_der: kubelet_client_key.serialize_der(),
            token: uuid::Uuid::new_v4().simple().to_string(),
            service_account_key: Arc::new(SigningKey::generate()?),
        })
    }

    /// Client certificates are optional at the TLS layer (a bearer token may
    /// authenticate instead) but must chain to our CA when presented.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        roots.add(self.ca_der.clone())?;
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .allow_unauthenticated()
                .build()?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.server_key_der.clone()));
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![self.server_der.clone(), self.ca_der.clone()], key)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// How this server dials kubelets: HTTP/1.1 (upgrades need it), the
    /// kubelet client certificate, and no check of the kubelet's serving
    /// certificate, as kube-apiserver without `--kubelet-certificate-authority`.
    pub fn kubelet_client_config(&self) -> Result<Arc<ClientConfig>, Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
            self.kubelet_client_key_der.clone(),
        ));
        let mut config = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServerCert(provider)))
            .with_client_auth_cert(
                vec![self.kubelet_client_der.clone(), self.ca_der.clone()],
                key,
            )?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// A kubeconfig whose current context authenticates with the client
    /// certificate; context `weir-test-token` uses the bearer token instead.
    pub fn kubeconfig(&self, server_url: &str) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: weir-test
  cluster:
    server: {server_url}
    certificate-authority-data: {ca}
users:
- name: weir-test-admin
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
- name: weir-test-token
  user:
    token: {token}
contexts:
- name: weir-test
  context:
    cluster: weir-test
    user: weir-test-admin
    namespace: default
- name: weir-test-token
  context:
    cluster: weir-test
    user: weir-test-token
    namespace: default
current-context: weir-test
preferences: {{}}
",
            ca = b64(&self.ca_pem),
            cert = b64(&self.client_cert_pem),
            key = b64(&self.client_key_pem),
            token = self.token,
        )
    }
}

/// Accepts any serving certificate, but still checks that the handshake is
/// signed by its key, so the TLS session itself is sound.
#[derive(Debug)]
struct AnyServerCert(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
