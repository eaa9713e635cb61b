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
    /// A websocket exec in `v5.channel.k8s.io`: `stdout`, then success.
    WebSocketExec { stdout: String },
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
        Reply::WebSocketExec { stdout } => websocket_exec(&mut req, stdout),
    };
    Ok(resp)
}

/// RFC 6455's accept key.
fn accept_key(key: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11").as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
}

/// One unmasked, final frame, as a server sends it.
fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => f.push(n as u8),
        n if n < 65536 => {
            f.push(126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(payload);
    f
}

fn websocket_exec(req: &mut Request<Incoming>, stdout: String) -> Response<Body> {
    let key = req
        .headers()
        .get("sec-websocket-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let on = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let mut io = TokioIo::new(on.await.unwrap());
        // Channel 1 is stdout, 3 the error stream that ends the exec.
        let mut out = frame(0x2, &[&[1u8][..], stdout.as_bytes()].concat());
        let status = br#"{"metadata":{},"status":"Success"}"#;
        out.extend(frame(0x2, &[&[3u8][..], &status[..]].concat()));
        out.extend(frame(0x8, &1000u16.to_be_bytes()));
        io.write_all(&out).await.unwrap();
        // Whatever the client sends (its close frame) until it hangs up.
        let mut buf = [0u8; 1024];
        while matches!(io.read(&mut buf).await, Ok(n) if n > 0) {}
        let _ = io.shutdown().await;
    });
    Response::builder()
        .status(101)
        .header("upgrade", "websocket")
        .header("connection", "Upgrade")
        .header("sec-websocket-accept", accept_key(&key))
        .header("sec-websocket-protocol", "v5.channel.k8s.io")
        .body(full(Bytes::new()))
        .unwrap()
}
