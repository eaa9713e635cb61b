//! A kubelet for the proxy tests: HTTPS that insists on a client
//! certificate signed by the API server's CA (as `clientCAFile` makes the
//! real one), records every request, and answers as the test says.
use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::BoxBody};
use hyper::{HeaderMap, Request, Response, body::Frame, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use rcgen::{CertificateParams, KeyPair};
use rustls::{
    RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
    server::WebPkiClientVerifier,
};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
    sync::mpsc,
    task::{JoinHandle, JoinSet},
};
use tokio_rustls::TlsAcceptor;

use crate::spdy;

/// One request as the kubelet got it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// Path and query.
    pub uri: String,
    pub headers: HeaderMap,
    /// The client certificate the API server presented (DER).
    pub peer_cert: Vec<u8>,
}

impl Seen {
    pub fn header_values(&self, name: &str) -> Vec<String> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap_or_default().to_string())
            .collect()
    }
}

pub enum Reply {
    Text {
        status: u16,
        headers: Vec<(&'static str, &'static str)>,
        body: String,
    },
    /// 200, then each chunk as the test sends it; the test sees the
    /// channel close when the API server hangs up.
    Stream(mpsc::Receiver<Bytes>),
    /// 101 with these headers, then every byte echoed until the input
    /// ends, then `bye` and a close of the output.
    Echo(Vec<(&'static str, String)>),
    /// 101 to an SPDY upgrade, then a remote command session in
    /// `v4.channel.k8s.io` (`spdy.rs`).
    Spdy(spdy::Script),
}

type Handler = Arc<dyn Fn(&Seen) -> Reply + Send + Sync>;
type Body = BoxBody<Bytes, Infallible>;

pub struct FakeKubelet {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn tls_config(ca_pem: &str) -> Arc<ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from(pem_to_der(ca_pem))).unwrap();
    // No allow_unauthenticated: a connection without a certificate from
    // this CA fails the handshake.
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    Arc::new(config)
}

pub fn pem_to_der(pem: &str) -> Vec<u8> {
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap()
}

impl FakeKubelet {
    pub async fn start(
        ca_pem: &str,
        handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let acceptor = TlsAcceptor::from(tls_config(ca_pem));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let handler: Handler = Arc::new(handler);
        let task = tokio::spawn({
            let seen = seen.clone();
            async move {
                let mut conns = JoinSet::new();
                while let Ok((tcp, _)) = listener.accept().await {
                    let (acceptor, seen, handler) =
                        (acceptor.clone(), seen.clone(), handler.clone());
                    conns.spawn(async move {
                        let Ok(tls) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let peer_cert = tls
                            .get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .map(|c| c.to_vec())
                            .unwrap_or_default();
                        let service = service_fn(move |req| {
                            let reply = record(&seen, &handler, &req, &peer_cert);
                            answer(req, reply)
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), service)
                            .with_upgrades()
                            .await;
                    });
                }
            }
        });
        FakeKubelet { addr, seen, task }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn uris(&self) -> Vec<String> {
        self.seen().into_iter().map(|s| s.uri).collect()
    }
}

fn record(
    seen: &Mutex<Vec<Seen>>,
    handler: &Handler,
    req: &Request<Incoming>,
    peer_cert: &[u8],
) -> Reply {
    let s = Seen {
        method: req.method().to_string(),
        uri: req.uri().to_string(),
        headers: req.headers().clone(),
        peer_cert: peer_cert.to_vec(),
    };
    let reply = handler(&s);
    seen.lock().unwrap().push(s);
    reply
}

fn full(body: impl Into<Bytes>) -> Body {
    Full::new(body.into()).boxed()
}

async fn answer(mut req: Request<Incoming>, reply: Reply) -> Result<Response<Body>, Infallible> {
    let resp = match reply {
        Reply::Text {
            status,
            headers,
            body,
        } => {
            let mut r = Response::builder().status(status);
            for (k, v) in headers {
                r = r.header(k, v);
            }
            r.body(full(body)).unwrap()
        }
        Reply::Stream(rx) => {
            let chunks = futures::stream::unfold(rx, |mut rx| async move {
                rx.recv()
                    .await
                    .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
            });
            Response::new(StreamBody::new(chunks).boxed())
        }
        Reply::Echo(headers) => {
            let on = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                let mut io = TokioIo::new(on.await.unwrap());
                let mut buf = [0u8; 4096];
                loop {
                    match io.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => io.write_all(&buf[..n]).await.unwrap(),
                    }
                }
                let _ = io.write_all(b"bye").await;
                let _ = io.shutdown().await;
            });
            let mut r = Response::builder().status(101);
            for (k, v) in headers {
                r = r.header(k, v);
            }
            r.body(full(Bytes::new())).unwrap()
        }
        Reply::Spdy(script) => {
            let expected = spdy::expected_streams(&req.uri().to_string());
            let on = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                spdy::serve(TokioIo::new(on.await.unwrap()), expected, script).await;
            });
            Response::builder()
                .status(101)
                .header("connection", "Upgrade")
                .header("upgrade", "SPDY/3.1")
                .header("x-stream-protocol-version", "v4.channel.k8s.io")
                .body(full(Bytes::new()))
                .unwrap()
        }
    };
    Ok(resp)
}
