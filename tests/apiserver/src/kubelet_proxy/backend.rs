//! The kubelet side of the proxy: one TLS connection per request, with this
//! server's kubelet client certificate, and the splice of two upgraded
//! connections.
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    time::Duration,
};

use http_body_util::{BodyExt as _, StreamBody};
use hyper::{Request, Response, body::Incoming, upgrade::OnUpgrade};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::{net::TcpStream, sync::watch, task::AbortHandle};
use tokio_rustls::TlsConnector;

use crate::http::Body;

/// upstream's GenericHttpResponseChecker reads no more of an error body.
const MAX_ERROR_BODY: usize = 50_000;

/// kube-apiserver's kubelet dialer gives up after 30 s too, rather than
/// the kernel's minutes for an address that never answers.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a kubelet is: the node's address and port as the location names
/// them, and the route the connection really takes, if the node has one.
pub struct Target {
    host: String,
    port: u16,
    route: Option<SocketAddr>,
}

impl Target {
    pub fn new(host: &str, port: u16, route: Option<SocketAddr>) -> Self {
        Target {
            host: host.to_string(),
            port,
            route,
        }
    }

    /// `host:port`, IPv6 in brackets, as Go's `net.JoinHostPort`.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    pub fn base_url(&self) -> String {
        format!("https://{}", self.authority())
    }

    fn dial_addr(&self) -> String {
        self.route
            .map_or_else(|| self.authority(), |r| r.to_string())
    }
}

/// Why a request to a kubelet got no answer.
#[derive(Debug)]
pub enum Failed {
    /// TCP or TLS.
    Dial(String),
    /// Sending the request or reading the answer's head.
    Exchange(String),
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failed::Dial(e) | Failed::Exchange(e) => f.write_str(e),
        }
    }
}

/// Aborts the task driving a kubelet connection, closing it, when the
/// response (or its streamed body) is dropped: the client went away.
struct AbortOnDrop(Option<AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.abort();
        }
    }
}

/// A kubelet's answer, with the connection it came on.
pub struct Upstream {
    pub response: Response<Incoming>,
    conn: AbortOnDrop,
}

/// Go's wording for the commonest dial failure, which test output matches on.
fn io_error(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connect: connection refused".into(),
        std::io::ErrorKind::TimedOut => "i/o timeout".into(),
        _ => e.to_string(),
    }
}

impl Upstream {
    pub async fn request<B>(
        tls: &TlsConnector,
        target: &Target,
        req: Request<B>,
    ) -> Result<Self, Failed>
    where
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let addr = target.dial_addr();
        let dial = |e: String| Failed::Dial(format!("dial tcp {addr}: {e}"));
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr.as_str()))
            .await
            .map_err(|_| dial("i/o timeout".into()))?
            .map_err(|e| dial(io_error(&e)))?;
        let _ = tcp.set_nodelay(true);
        // SNI as Go sends it: the location's host (none for an IP).
        let name = ServerName::try_from(target.host.clone())
            .unwrap_or_else(|_| ServerName::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST).into()));
        let stream = tls
            .connect(name, tcp)
            .await
            .map_err(|e| Failed::Dial(format!("tls: {e}")))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| Failed::Exchange(e.to_string()))?;
        let task = tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!("kubelet connection ended: {e}");
            }
        });
        let conn = AbortOnDrop(Some(task.abort_handle()));
        let response = sender
            .send_request(req)
            .await
            .map_err(|e| Failed::Exchange(e.to_string()))?;
        Ok(Upstream { response, conn })
    }

    /// The connection now belongs to the upgrade: it must outlive this.
    pub fn detach(&mut self) {
        self.conn.0 = None;
    }

    /// The start of an error body, as text.
    pub async fn text(self) -> String {
        let mut body = self.response.into_body();
        let mut out = Vec::new();
        while out.len() < MAX_ERROR_BODY {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        out.extend_from_slice(&data);
                    }
                }
                _ => break,
            }
        }
        out.truncate(MAX_ERROR_BODY);
        String::from_utf8_lossy(&out).into_owned()
    }

    /// The body, each chunk passed on as it arrives (`kubectl logs -f`
    /// prints lines as the container writes them); dropping it closes the
    /// kubelet connection.
    pub fn into_body(self) -> Body {
        let Upstream { response, conn } = self;
        let chunks =
            futures::stream::unfold(Some((response.into_body(), conn)), |state| async move {
                let (mut body, conn) = state?;
                match body.frame().await? {
                    Ok(frame) => Some((Ok(frame), Some((body, conn)))),
                    Err(e) => Some((Err(std::io::Error::other(e)), None)),
                }
            });
        StreamBody::new(chunks).boxed_unsync()
    }
}

/// Copies bytes both ways between the client's and the kubelet's upgraded
/// connections. An end of input on one side is passed on as a half-close
/// to the other, which may go on sending; an error on either ends both, as
/// does the server stopping.
pub async fn splice(client: OnUpgrade, backend: OnUpgrade, mut shutdown: watch::Receiver<bool>) {
    let (client, backend) = match tokio::join!(client, backend) {
        (Ok(c), Ok(b)) => (c, b),
        (c, b) => {
            tracing::debug!(client = ?c.err(), kubelet = ?b.err(), "upgrade not completed");
            return;
        }
    };
    let mut client = TokioIo::new(client);
    let mut backend = TokioIo::new(backend);
    tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut client, &mut backend) => match copied {
            Ok((up, down)) => tracing::debug!(up, down, "upgraded connection closed"),
            Err(e) => tracing::debug!("upgraded connection broken: {e}"),
        },
        _ = shutdown.wait_for(|stop| *stop) => {}
    }
}
