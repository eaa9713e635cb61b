//! `httpGet` probes and hooks as pkg/probe/http does them, on hyper's
//! HTTP/1.1 client: a fresh connection per request (the kubelet disables
//! keep-alives), HTTPS without verifying the certificate (the kubelet's
//! `InsecureSkipVerify`), and redirects followed up to 10 times while they
//! stay on the probed host. A redirect to another host is not followed: its
//! 3xx counts as success, as the kubelet's "probe terminated redirects"
//! warning does.
use std::{net::IpAddr, sync::Arc, time::Duration};

use http_body_util::{BodyExt as _, Empty};
use hyper::{
    Request, StatusCode,
    body::Bytes,
    header::{self, HeaderName, HeaderValue},
};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::USER_AGENT;
use crate::pod::{HttpGet, Scheme, probe::ProbeOutcome};

/// Go's http.Client stops after 10 redirects.
const MAX_REDIRECTS: usize = 10;
/// The kubelet reads at most this much of a body.
const MAX_BODY: usize = 10 * 1024;

/// `httpGet`: success for 200–399, everything within `timeout`.
pub async fn http_get(h: &HttpGet, pod_ip: IpAddr, timeout: Duration) -> ProbeOutcome {
    let host = h.host.clone().unwrap_or_else(|| pod_ip.to_string());
    let first = Url {
        scheme: h.scheme,
        host,
        port: h.port,
        path: h.path.clone(),
    };
    let url = first.to_string();
    match tokio::time::timeout(timeout, follow(first, &h.headers)).await {
        Ok(Ok(code)) if (200..400).contains(&code.as_u16()) => ProbeOutcome::Success,
        Ok(Ok(code)) => ProbeOutcome::Failure {
            message: format!("HTTP probe failed with statuscode: {}", code.as_u16()),
        },
        Ok(Err(e)) => ProbeOutcome::Failure {
            message: format!("Get \"{url}\": {e}"),
        },
        Err(_) => ProbeOutcome::Failure {
            message: format!(
                "Get \"{url}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
            ),
        },
    }
}

/// Where a request goes: the parts of a URL a probe can have.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Url {
    scheme: Scheme,
    host: String,
    port: u16,
    /// Path and query, starting with `/`.
    path: String,
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = match self.scheme {
            Scheme::Http => "http",
            Scheme::Https => "https",
        };
        write!(f, "{scheme}://{}{}", self.authority(), self.path)
    }
}

impl Url {
    fn authority(&self) -> String {
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// `location` (absolute, scheme-relative, absolute-path or relative)
    /// against this URL, as a redirect's target.
    fn join(&self, location: &str) -> Option<Self> {
        if let Some((scheme, rest)) = location.split_once("://") {
            let scheme = match scheme.to_ascii_lowercase().as_str() {
                "http" => Scheme::Http,
                "https" => Scheme::Https,
                _ => return None,
            };
            return Self::with_authority(scheme, rest);
        }
        if let Some(rest) = location.strip_prefix("//") {
            return Self::with_authority(self.scheme, rest);
        }
        let path = if location.starts_with('/') {
            location.to_owned()
        } else {
            // Relative to the current path's directory, query dropped.
            let current = self.path.split(['?', '#']).next().unwrap_or("/");
            let dir = &current[..=current.rfind('/').unwrap_or(0)];
            format!("{dir}{location}")
        };
        Some(Self {
            path,
            ..self.clone()
        })
    }

    fn with_authority(scheme: Scheme, rest: &str) -> Option<Self> {
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let authority: hyper::http::uri::Authority = authority.parse().ok()?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let port = authority.port_u16().unwrap_or(match scheme {
            Scheme::Http => 80,
            Scheme::Https => 443,
        });
        let path = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        };
        Some(Self {
            scheme,
            host: host.to_owned(),
            port,
            path,
        })
    }
}

type Error = Box<dyn std::error::Error + Send + Sync>;

async fn follow(first: Url, headers: &[(String, String)]) -> Result<StatusCode, Error> {
    let mut url = first.clone();
    for _ in 0..=MAX_REDIRECTS {
        let (code, location) = request(&url, headers).await?;
        let Some(location) = location.filter(|_| code.is_redirection()) else {
            return Ok(code);
        };
        let next = url
            .join(&location)
            .ok_or_else(|| format!("unsupported redirect location {location:?}"))?;
        if next.host != first.host {
            tracing::debug!(%url, %location, "probe terminated redirects: another host");
            return Ok(code);
        }
        url = next;
    }
    Err(format!("stopped after {MAX_REDIRECTS} redirects").into())
}

/// One GET on a new connection: the status and any `Location`.
async fn request(
    url: &Url,
    headers: &[(String, String)],
) -> Result<(StatusCode, Option<String>), Error> {
    let req = build(url, headers)?;
    let tcp = TcpStream::connect(url.authority()).await?;
    match url.scheme {
        Scheme::Http => send(tcp, req).await,
        Scheme::Https => {
            let name = rustls::pki_types::ServerName::try_from(url.host.clone())?;
            let tls = tokio_rustls::TlsConnector::from(insecure_tls())
                .connect(name, tcp)
                .await?;
            send(tls, req).await
        }
    }
}

fn build(url: &Url, headers: &[(String, String)]) -> Result<Request<Empty<Bytes>>, Error> {
    let mut req = Request::get(url.path.as_str()).body(Empty::new())?;
    let h = req.headers_mut();
    // Go's http.Header.Set: a header the probe names replaces the default
    // (an empty Host means the default, as in Go; an empty User-Agent
    // suppresses it, as Go's does).
    h.insert(header::HOST, HeaderValue::from_str(&url.authority())?);
    h.insert(header::USER_AGENT, HeaderValue::from_static(USER_AGENT));
    h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
    let mut named = std::collections::HashSet::new();
    for (n, v) in headers {
        // Values with a line break are refused here, so a header cannot
        // smuggle a second request.
        let name = HeaderName::from_bytes(n.as_bytes());
        let value = HeaderValue::from_str(v);
        let (Ok(name), Ok(value)) = (name, value) else {
            return Err(format!("invalid header {n:?}: {v:?}").into());
        };
        if name == header::HOST && v.is_empty() {
            continue;
        }
        if named.insert(name.clone()) {
            h.insert(name, value);
        } else {
            h.append(name, value);
        }
    }
    if h.get(header::USER_AGENT).is_some_and(|v| v.is_empty()) {
        h.remove(header::USER_AGENT);
    }
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    Ok(req)
}

async fn send<S>(
    stream: S,
    req: Request<Empty<Bytes>>,
) -> Result<(StatusCode, Option<String>), Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        // Go writes canonical header names (User-Agent), and some probed
        // servers only match those.
        .title_case_headers(true)
        .handshake(TokioIo::new(stream))
        .await?;
    let driver = tokio::spawn(conn);
    let res = sender.send_request(req).await?;
    let code = res.status();
    let location = res
        .headers()
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    // Read (and drop) a bounded part of the body, as the kubelet does; the
    // connection closes with the driver.
    let mut body = res.into_body();
    let mut read = 0;
    while read < MAX_BODY {
        match body.frame().await {
            Some(Ok(f)) => read += f.data_ref().map_or(0, Bytes::len),
            _ => break,
        }
    }
    driver.abort();
    Ok((code, location))
}

/// TLS that accepts any certificate, once per process: the kubelet probes
/// with `InsecureSkipVerify`, since pods serve self-signed certificates.
fn insecure_tls() -> Arc<rustls::ClientConfig> {
    static CONFIG: std::sync::OnceLock<Arc<rustls::ClientConfig>> = std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth();
            Arc::new(config)
        })
        .clone()
}

/// Accepts every certificate, but still checks that the server holds the
/// key of the one it sent (Go's InsecureSkipVerify does the same).
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
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
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests;
