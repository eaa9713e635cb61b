//! The kubelet API's TLS: the serving certificate (from `tlsCertFile` and
//! `tlsPrivateKeyFile`, or self-signed for the node's hostname as the kubelet
//! does without them) and client-certificate authentication against
//! `authentication.x509.clientCAFile`.
use std::{net::IpAddr, path::Path, sync::Arc};

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, SanType};
use rustls::{
    RootCertStore, ServerConfig,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, pem::PemObject},
    server::WebPkiClientVerifier,
};

use super::{PemFile, ServerError};
use crate::config::{Config, TlsFiles};

pub(super) fn server_config(
    config: &Config,
    hostname: &str,
) -> Result<Arc<ServerConfig>, ServerError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(ServerError::Tls)?;
    let builder = match &config.client_ca_file {
        Some(path) => builder.with_client_cert_verifier(client_verifier(path, provider)?),
        // No certificate can authenticate without a CA, so none is asked
        // for: every request is anonymous and gets 401.
        None => builder.with_no_client_auth(),
    };
    let mut server = match &config.tls {
        Some(files) => {
            let (chain, key) = load_serving(files)?;
            builder.with_single_cert(chain, key).map_err(|source| {
                ServerError::ServingCertificate {
                    cert: files.cert_file.clone(),
                    key: files.key_file.clone(),
                    source,
                }
            })?
        }
        None => {
            let (chain, key) = self_signed(hostname, config.address)?;
            builder
                .with_single_cert(chain, key)
                .map_err(ServerError::Tls)?
        }
    };
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(server))
}

/// Client certificates are optional at the TLS layer so that an anonymous
/// client completes the handshake and is told 401 in HTTP, as the kubelet
/// does; a certificate that is presented must chain to the CA.
fn client_verifier(
    path: &Path,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, ServerError> {
    let mut roots = RootCertStore::empty();
    for ca in read_certs(PemFile::ClientCa, path)? {
        roots.add(ca).map_err(|source| ServerError::ClientCa {
            path: path.to_owned(),
            source,
        })?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|source| ServerError::ClientVerifier {
            path: path.to_owned(),
            source,
        })
}

fn read_certs(file: PemFile, path: &Path) -> Result<Vec<CertificateDer<'static>>, ServerError> {
    let pem_err = |source| ServerError::Pem {
        file,
        path: path.to_owned(),
        source,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem_err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_err)?;
    if certs.is_empty() {
        return Err(pem_err(rustls::pki_types::pem::Error::NoItemsFound));
    }
    Ok(certs)
}

type Serving = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn load_serving(files: &TlsFiles) -> Result<Serving, ServerError> {
    let chain = read_certs(PemFile::Certificate, &files.cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&files.key_file).map_err(|source| ServerError::Pem {
        file: PemFile::PrivateKey,
        path: files.key_file.clone(),
        source,
    })?;
    Ok((chain, key))
}

/// Like the kubelet's `<hostname>@<unix time>` certificate, but kept in
/// memory: it changes on every start, so there is nothing worth keeping.
fn self_signed(hostname: &str, address: IpAddr) -> Result<Serving, ServerError> {
    let err = |source| ServerError::SelfSign {
        hostname: hostname.to_owned(),
        source,
    };
    // `new` turns a name that parses as an IP into an IP SAN, as the kubelet does.
    let mut params = CertificateParams::new(vec![hostname.to_owned()]).map_err(err)?;
    if !address.is_unspecified()
        && !params
            .subject_alt_names
            .contains(&SanType::IpAddress(address))
    {
        params.subject_alt_names.push(SanType::IpAddress(address));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{hostname}@{now}"));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(err)?;
    let cert = params.self_signed(&key).map_err(err)?;
    Ok((
        vec![cert.der().clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    ))
}

/// The name the self-signed certificate is for: the kernel's hostname,
/// lowercased as the kubelet's node name is.
pub(super) fn node_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_lowercase())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}
