//! kube-apiserver's stream translation, on by default since 1.30 and 1.31
//! (TranslateStreamCloseWebsocketRequests, PortForwardWebsockets;
//! upstream's `util/proxy/streamtranslator.go` and `streamtunnel.go`).
//!
//! kubectl opens exec and attach as a WebSocket offering only
//! `v5.channel.k8s.io`, which container runtimes' streaming servers do not
//! speak (containerd 1.6 stops at v4): the API server answers that
//! WebSocket itself and runs an SPDY/3.1 session in `v4.channel.k8s.io` to
//! the kubelet, one SPDY stream per channel. A port-forward WebSocket
//! offering `SPDY/3.1+portforward.k8s.io` carries the client's own SPDY:
//! the kubelet gets an SPDY upgrade and the bytes go through, each binary
//! message's payload as it is (client-go's TunnelingConnection: no channel
//! byte). Any other upgrade is spliced as it comes.
//!
//! One difference from upstream, on purpose: the client's handshake is
//! answered only once the kubelet has accepted its upgrade, so a refusal
//! reaches the client as the kubelet sent it and kubectl can still fall
//! back to SPDY (upstream upgrades first and reports such a failure on the
//! error channel).
use std::{sync::Arc, time::Duration};

use bytes::{Bytes, BytesMut};
use futures::{
    SinkExt as _, StreamExt as _,
    stream::{SplitSink, SplitStream},
};
use http_body_util::{BodyExt as _, Empty};
use hyper::{HeaderMap, Request, Response, StatusCode, body::Incoming, header, upgrade::OnUpgrade};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _},
    sync::{Mutex, watch},
};
use tokio_tungstenite::{
    WebSocketStream,
    tungstenite::{
        Message,
        handshake::derive_accept_key,
        protocol::{CloseFrame, Role, WebSocketConfig, frame::coding::CloseCode},
    },
};

use super::{
    Subresource,
    backend::Target,
    options::Streams,
    spdy::{self, FLAG_FIN, Frame},
};
use crate::{
    error::ApiError,
    http::{Body, State},
};

/// The WebSocket remote command protocol with the close signal.
const V5: &str = "v5.channel.k8s.io";
/// What the kubelet is asked for: the newest SPDY remote command protocol.
const V4: &str = "v4.channel.k8s.io";
const SPDY_31: &str = "SPDY/3.1";
/// A tunnelled protocol is offered as this prefix and an SPDY protocol
/// ending in `.k8s.io`.
const TUNNEL_PREFIX: &str = "SPDY/3.1+";
const K8S_SUFFIX: &str = ".k8s.io";
const X_STREAM_PROTOCOL_VERSION: &str = "x-stream-protocol-version";

/// v5's channels, as the first byte of each binary message.
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
/// Followed by one byte, the channel the client is done writing to.
const CLOSE: u8 = 255;

/// The client is untrusted: no message (or frame) of it is held in memory
/// beyond this. client-go writes stdin in 32 KiB pieces.
const MAX_MESSAGE: usize = 1 << 20;

/// How long the client gets, once the kubelet's side has ended and the
/// close frame is sent, to read what is left and close: upstream's
/// `finishTimeout`. Closing at once could make the kernel reset the
/// connection and drop output the client had not read yet.
const FINISH_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// What a request is translated into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// WebSocket v5 for the client, SPDY v4 for the kubelet.
    Exec(Streams),
    /// The SPDY protocols tunnelled, prefix taken off
    /// (`portforward.k8s.io`).
    Tunnel(Vec<String>),
}

/// `Sec-WebSocket-Protocol`, every comma-separated value.
fn offered(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

/// Upstream's `IsWebSocketRequestWithStreamCloseProtocol` (exec, attach)
/// and `IsWebSocketRequestWithTunnelingProtocol` (portforward); None for
/// what is passed through.
pub fn plan(sub: Subresource, headers: &HeaderMap, streams: Streams) -> Option<Plan> {
    let websocket = headers
        .get(header::UPGRADE)
        .is_some_and(|u| u.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if !websocket {
        return None;
    }
    let offered = offered(headers);
    match sub {
        Subresource::Exec | Subresource::Attach => offered
            .iter()
            .any(|p| p == V5)
            .then_some(Plan::Exec(streams)),
        Subresource::PortForward => {
            let spdy: Vec<String> = offered
                .iter()
                .filter_map(|p| p.strip_prefix(TUNNEL_PREFIX))
                .filter(|p| p.ends_with(K8S_SUFFIX))
                .map(String::from)
                .collect();
            (!spdy.is_empty()).then_some(Plan::Tunnel(spdy))
        }
        Subresource::Log => None,
    }
}

/// The handshake's `Sec-WebSocket-Accept`; RFC 6455's checks, with
/// gorilla/websocket's words for a failure.
fn accept_key(headers: &HeaderMap) -> Result<String, ApiError> {
    let version_13 = headers
        .get_all(header::SEC_WEBSOCKET_VERSION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim() == "13");
    if !version_13 {
        return Err(ApiError::BadRequest(
            "websocket: unsupported version: 13 not found in 'Sec-Websocket-Version' header".into(),
        ));
    }
    match headers.get(header::SEC_WEBSOCKET_KEY) {
        Some(key) if !key.is_empty() => Ok(derive_accept_key(key.as_bytes())),
        _ => Err(ApiError::BadRequest(
            "websocket: not a websocket handshake: 'Sec-WebSocket-Key' header must be Base64 encoded value of 16-byte in length"
                .into(),
        )),
    }
}

/// The kubelet's SPDY upgrade request: a POST, as client-go's SPDY
/// executor and upstream's `createSPDYRequest` send. The executor builds a
/// request of its own; the tunnel is the client's request with the
/// WebSocket headers swapped for SPDY's.
fn kubelet_request(
    plan: &Plan,
    location: &str,
    target: &Target,
    client: &HeaderMap,
) -> Result<Request<Empty<Bytes>>, ApiError> {
    let mut req = Request::post(location);
    let protocols = match plan {
        Plan::Exec(_) => vec![V4.to_string()],
        Plan::Tunnel(spdy) => {
            for (name, value) in client {
                let skip = [
                    header::AUTHORIZATION,
                    header::HOST,
                    header::UPGRADE,
                    header::CONNECTION,
                    header::CONTENT_LENGTH,
                    header::TRANSFER_ENCODING,
                    header::SEC_WEBSOCKET_PROTOCOL,
                    header::SEC_WEBSOCKET_KEY,
                    header::SEC_WEBSOCKET_VERSION,
                    header::SEC_WEBSOCKET_EXTENSIONS,
                ]
                .contains(name)
                    || name == X_STREAM_PROTOCOL_VERSION;
                if !skip {
                    req = req.header(name, value);
                }
            }
            spdy.clone()
        }
    };
    req = req
        .header(header::HOST, target.authority())
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, SPDY_31);
    for p in protocols {
        req = req.header(X_STREAM_PROTOCOL_VERSION, p);
    }
    req.body(Empty::new())
        .map_err(|e| ApiError::Internal(e.to_string()))
}

/// Whether a 101 is really the SPDY/3.1 upgrade asked for (upstream's SPDY
/// round tripper checks the same two headers).
fn spdy_upgraded(headers: &HeaderMap) -> bool {
    let has = |name: header::HeaderName, want: &str| {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.to_ascii_lowercase().contains(want))
    };
    has(header::CONNECTION, "upgrade") && has(header::UPGRADE, &SPDY_31.to_ascii_lowercase())
}

/// Upgrades to the kubelet with SPDY and, once it accepted, answers the
/// client's WebSocket handshake and bridges the two.
pub async fn serve(
    state: &Arc<State>,
    target: &Target,
    location: &str,
    plan: Plan,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let accept = accept_key(req.headers())?;
    let forward = kubelet_request(&plan, location, target, req.headers())?;
    let client_upgrade = hyper::upgrade::on(&mut req);
    let mut upstream = super::dial(state, target, forward).await?;
    if upstream.response.status() != StatusCode::SWITCHING_PROTOCOLS {
        return super::refused(upstream).await;
    }
    if !spdy_upgraded(upstream.response.headers()) {
        return Err(super::unknown(
            "unable to upgrade connection: missing upgrade headers in response".into(),
        ));
    }
    let protocol = match &plan {
        Plan::Exec(_) => Some(V5.to_string()),
        // The kubelet's choice, tunnelled (none if it named none).
        Plan::Tunnel(_) => upstream
            .response
            .headers()
            .get(X_STREAM_PROTOCOL_VERSION)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(|v| format!("{TUNNEL_PREFIX}{v}")),
    };
    let backend_upgrade = hyper::upgrade::on(&mut upstream.response);
    upstream.detach();
    tokio::spawn(bridge(
        plan,
        client_upgrade,
        backend_upgrade,
        state.shutdown.clone(),
    ));
    let mut reply = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::UPGRADE, "websocket")
        .header(header::CONNECTION, "Upgrade")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept);
    if let Some(p) = protocol {
        reply = reply.header(header::SEC_WEBSOCKET_PROTOCOL, p);
    }
    Ok(reply
        .body(Empty::new().map_err(|n| match n {}).boxed_unsync())
        .unwrap_or_default())
}

fn websocket_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE))
}

/// Runs one translated session until it ends or the server stops.
async fn bridge(
    plan: Plan,
    client: OnUpgrade,
    kubelet: OnUpgrade,
    mut shutdown: watch::Receiver<bool>,
) {
    let (client, kubelet) = match tokio::join!(client, kubelet) {
        (Ok(c), Ok(k)) => (c, k),
        (c, k) => {
            tracing::debug!(client = ?c.err(), kubelet = ?k.err(), "upgrade not completed");
            return;
        }
    };
    let ws = WebSocketStream::from_raw_socket(
        TokioIo::new(client),
        Role::Server,
        Some(websocket_config()),
    )
    .await;
    let kubelet = TokioIo::new(kubelet);
    let session = async {
        match plan {
            Plan::Exec(streams) => exec(ws, kubelet, streams).await,
            Plan::Tunnel(_) => tunnel(ws, kubelet).await,
        }
    };
    tokio::select! {
        () = session => tracing::debug!("translated stream closed"),
        _ = shutdown.wait_for(|stop| *stop) => {}
    }
}

/// Both directions of a session. The kubelet's side ending ends it: the
/// close frame has gone out, and the client gets FINISH_TIMEOUT to read the
/// rest and answer. The client's side ending first cuts the session: the
/// kubelet connection closes, as a client's SPDY connection closing would.
async fn finish(from_kubelet: impl Future<Output = ()>, from_client: impl Future<Output = ()>) {
    tokio::pin!(from_kubelet, from_client);
    tokio::select! {
        () = &mut from_kubelet => {
            let _ = tokio::time::timeout(FINISH_TIMEOUT, from_client).await;
        }
        () = &mut from_client => {}
    }
}

fn normal_close() -> Message {
    Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }))
}

/// One v5 message: the channel, then the payload.
fn on_channel(channel: u8, data: &[u8]) -> Message {
    let mut m = Vec::with_capacity(data.len() + 1);
    m.push(channel);
    m.extend_from_slice(data);
    Message::Binary(m.into())
}

/// The SPDY streams of one exec or attach.
#[derive(Debug, Default)]
struct Ids {
    error: u32,
    stdin: Option<u32>,
    stdout: Option<u32>,
    stderr: Option<u32>,
    resize: Option<u32>,
}

impl Ids {
    /// Where the kubelet's data on `stream` goes to the client.
    fn channel_of(&self, stream: u32) -> Option<u8> {
        if stream == self.error {
            Some(ERROR)
        } else if Some(stream) == self.stdout {
            Some(STDOUT)
        } else if Some(stream) == self.stderr {
            Some(STDERR)
        } else {
            None
        }
    }
}

/// client-go's v4 stream creation: the error stream, then stdin, stdout,
/// stderr (not with a terminal, which merges it into stdout) and resize
/// (only with one). The kubelet waits for exactly the streams the exec was
/// created with, so the set must match the query.
async fn open_streams<W: AsyncWrite + Unpin>(
    writer: &Mutex<spdy::Writer<W>>,
    s: Streams,
) -> std::io::Result<Ids> {
    let mut w = writer.lock().await;
    let mut open = async |kind: &str, wanted: bool| -> std::io::Result<Option<u32>> {
        if wanted {
            w.open(&[("streamtype", kind)]).await.map(Some)
        } else {
            Ok(None)
        }
    };
    let error = open("error", true).await?.unwrap_or_default();
    Ok(Ids {
        error,
        stdin: open("stdin", s.stdin).await?,
        stdout: open("stdout", s.stdout).await?,
        stderr: open("stderr", s.stderr && !s.tty).await?,
        resize: open("resize", s.tty).await?,
    })
}

/// A Status for the error channel when the kubelet's side failed before
/// it said how the command ended: upstream's `NewInternalError`.
fn internal_error(e: &std::io::Error) -> Message {
    let status = ApiError::Internal(e.to_string()).status();
    on_channel(ERROR, &serde_json::to_vec(&status).unwrap_or_default())
}

type ToClient<C> = SplitSink<WebSocketStream<C>, Message>;
type FromClient<C> = SplitStream<WebSocketStream<C>>;

/// The end of a session on the client's side: the close handshake
/// completed (a reply to the client's close frame is still queued if the
/// client closed first), then a clean TLS and TCP shutdown rather than a
/// connection that just drops.
async fn hang_up<C>(mut to_client: ToClient<C>, from_client: FromClient<C>)
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let bye = async {
        let _ = to_client.close().await;
        if let Ok(mut ws) = to_client.reunite(from_client) {
            let _ = ws.get_mut().shutdown().await;
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), bye).await;
}

/// An exec or attach: v5 channels to the client, SPDY streams to the
/// kubelet.
pub async fn exec<C, K>(ws: WebSocketStream<C>, kubelet: K, streams: Streams)
where
    C: AsyncRead + AsyncWrite + Unpin,
    K: AsyncRead + AsyncWrite + Unpin,
{
    let (mut to_client, mut from_client) = ws.split();
    exec_session(&mut to_client, &mut from_client, kubelet, streams).await;
    hang_up(to_client, from_client).await;
}

async fn exec_session<C, K>(
    to_client: &mut ToClient<C>,
    from_client: &mut FromClient<C>,
    kubelet: K,
    streams: Streams,
) where
    C: AsyncRead + AsyncWrite + Unpin,
    K: AsyncRead + AsyncWrite + Unpin,
{
    let (from_kubelet, to_kubelet) = tokio::io::split(kubelet);
    let writer = Mutex::new(spdy::Writer::new(to_kubelet));
    let ids = match open_streams(&writer, streams).await {
        Ok(ids) => ids,
        Err(e) => {
            let _ = to_client.send(internal_error(&e)).await;
            let _ = to_client.send(normal_close()).await;
            return;
        }
    };
    // As upstream: an empty message on the lowest channel the client reads
    // tells it the session is up.
    let hello = match (streams.stdout, streams.stderr && !streams.tty) {
        (true, _) => STDOUT,
        (false, true) => STDERR,
        _ => ERROR,
    };
    if to_client.send(on_channel(hello, &[])).await.is_err() {
        return;
    }

    let kubelet_to_client = async {
        let mut reader = spdy::Reader::new(from_kubelet);
        // The session is over once the kubelet has ended all of these.
        let mut open: Vec<u32> = [Some(ids.error), ids.stdout, ids.stderr]
            .into_iter()
            .flatten()
            .collect();
        let mut status_sent = false;
        let ended = loop {
            let frame = match reader.next().await {
                Ok(Some(f)) => f,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            };
            match frame {
                Frame::Data {
                    stream,
                    flags,
                    data,
                } => {
                    if let Some(channel) = ids.channel_of(stream)
                        && !data.is_empty()
                    {
                        status_sent |= channel == ERROR;
                        if to_client.send(on_channel(channel, &data)).await.is_err() {
                            return;
                        }
                    }
                    if flags & FLAG_FIN != 0 {
                        open.retain(|s| *s != stream);
                    }
                }
                // spdystream's Close: streams reset (a reset is an end of
                // input), then GOAWAY, after which it reads no more.
                Frame::RstStream { stream, .. } => open.retain(|s| *s != stream),
                Frame::GoAway { .. } => break Ok(()),
                other => {
                    if let Some(pong) = spdy::ping_reply(&other)
                        && let Err(e) = writer.lock().await.send(&pong).await
                    {
                        break Err(e);
                    }
                }
            }
            if open.is_empty() {
                break Ok(());
            }
        };
        if let Err(e) = ended {
            tracing::debug!("kubelet SPDY session broken: {e}");
            if !status_sent {
                let _ = to_client.send(internal_error(&e)).await;
            }
        }
        let _ = to_client.send(normal_close()).await;
    };

    let client_to_kubelet = async {
        let (mut stdin, mut resize) = (ids.stdin, ids.resize);
        while let Some(Ok(message)) = from_client.next().await {
            // Binary is v5's; a text message's bytes are taken alike, as
            // upstream's server takes them.
            let data: Bytes = match message {
                Message::Binary(b) => b,
                Message::Text(t) => t.into(),
                Message::Close(_) => break,
                // Pings are answered by the WebSocket layer.
                _ => continue,
            };
            let Some((&channel, payload)) = data.split_first() else {
                continue;
            };
            let mut w = writer.lock().await;
            let sent = match (channel, payload) {
                (STDIN, _) => match stdin {
                    Some(id) => w.data(id, payload, false).await,
                    None => Ok(()),
                },
                // Terminal sizes as JSON, which the kubelet decodes as a
                // stream of objects: passed on as they are.
                (RESIZE, _) => match resize {
                    Some(id) => w.data(id, payload, false).await,
                    None => Ok(()),
                },
                // The client is done writing to a channel: that stream's
                // half-close (stdin's ends the command's input).
                (CLOSE, &[closed]) => {
                    let id = match closed {
                        STDIN => stdin.take(),
                        RESIZE => resize.take(),
                        _ => None,
                    };
                    match id {
                        Some(id) => w.data(id, &[], true).await,
                        None => Ok(()),
                    }
                }
                // Channels the server does not read: dropped, as upstream.
                _ => Ok(()),
            };
            if let Err(e) = sent {
                // The kubelet side reports how the session ended; the
                // client is still read for its close.
                tracing::debug!("writing to the kubelet: {e}");
            }
        }
    };

    finish(kubelet_to_client, client_to_kubelet).await;
}

/// A port-forward tunnel: the client's SPDY, carried in binary messages.
pub async fn tunnel<C, K>(ws: WebSocketStream<C>, kubelet: K)
where
    C: AsyncRead + AsyncWrite + Unpin,
    K: AsyncRead + AsyncWrite + Unpin,
{
    let (mut to_client, mut from_client) = ws.split();
    tunnel_session(&mut to_client, &mut from_client, kubelet).await;
    hang_up(to_client, from_client).await;
}

async fn tunnel_session<C, K>(
    to_client: &mut ToClient<C>,
    from_client: &mut FromClient<C>,
    kubelet: K,
) where
    C: AsyncRead + AsyncWrite + Unpin,
    K: AsyncRead + AsyncWrite + Unpin,
{
    let (mut from_kubelet, mut to_kubelet) = tokio::io::split(kubelet);
    let kubelet_to_client = async {
        let mut buf = BytesMut::new();
        loop {
            buf.reserve(32 * 1024);
            match from_kubelet.read_buf(&mut buf).await {
                Ok(0) => break,
                Ok(_) => {
                    let data = buf.split().freeze();
                    if to_client.send(Message::Binary(data)).await.is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::debug!("port-forward tunnel, kubelet side: {e}");
                    break;
                }
            }
        }
        let _ = to_client.send(normal_close()).await;
    };
    let client_to_kubelet = async {
        while let Some(Ok(message)) = from_client.next().await {
            let data = match message {
                Message::Binary(b) => b,
                // client-go's tunnel reads binary messages only.
                Message::Text(_) | Message::Close(_) => break,
                _ => continue,
            };
            if to_kubelet.write_all(&data).await.is_err() || to_kubelet.flush().await.is_err() {
                break;
            }
        }
        let _ = to_kubelet.shutdown().await;
    };
    finish(kubelet_to_client, client_to_kubelet).await;
}

#[cfg(test)]
mod tests {
    use hyper::header::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn only_websocket_v5_and_spdy_tunnels_are_translated() {
        let s = Streams {
            stdout: true,
            ..Default::default()
        };
        let ws = |protocols: &str| {
            headers(&[
                ("upgrade", "WebSocket"),
                ("sec-websocket-protocol", protocols),
            ])
        };
        assert_eq!(
            plan(
                Subresource::Exec,
                &ws("v4.channel.k8s.io, v5.channel.k8s.io"),
                s
            ),
            Some(Plan::Exec(s))
        );
        assert_eq!(
            plan(Subresource::Attach, &ws("v5.channel.k8s.io"), s),
            Some(Plan::Exec(s))
        );
        assert_eq!(plan(Subresource::Exec, &ws("v4.channel.k8s.io"), s), None);
        assert_eq!(
            plan(Subresource::Exec, &ws("SPDY/3.1+portforward.k8s.io"), s),
            None
        );
        assert_eq!(
            plan(
                Subresource::PortForward,
                &ws("SPDY/3.1+portforward.k8s.io"),
                s
            ),
            Some(Plan::Tunnel(vec!["portforward.k8s.io".into()]))
        );
        assert_eq!(
            plan(Subresource::PortForward, &ws("portforward.k8s.io"), s),
            None
        );
        let spdy = headers(&[
            ("upgrade", "SPDY/3.1"),
            ("x-stream-protocol-version", "v5.channel.k8s.io"),
        ]);
        assert_eq!(plan(Subresource::Exec, &spdy, s), None);
    }

    #[test]
    fn the_handshake_is_checked_and_answered() {
        let ok = headers(&[
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ]);
        // RFC 6455's example.
        assert_eq!(accept_key(&ok).unwrap(), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        let old = headers(&[("sec-websocket-version", "8"), ("sec-websocket-key", "x")]);
        assert_eq!(accept_key(&old).unwrap_err().code(), 400);
        let keyless = headers(&[("sec-websocket-version", "13")]);
        assert_eq!(accept_key(&keyless).unwrap_err().code(), 400);
    }

    #[test]
    fn the_kubelet_gets_an_spdy_post() {
        let target = Target::new("n1", 10250, None);
        let client = headers(&[
            ("upgrade", "websocket"),
            ("connection", "Upgrade"),
            ("sec-websocket-key", "k"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-protocol", "SPDY/3.1+portforward.k8s.io"),
            ("authorization", "Bearer secret"),
            ("user-agent", "kubectl/v1.32.4"),
        ]);
        let exec = kubelet_request(
            &Plan::Exec(Streams::default()),
            "/exec/ns/p/c?output=1",
            &target,
            &client,
        )
        .unwrap();
        assert_eq!(exec.method(), "POST");
        assert_eq!(exec.uri(), "/exec/ns/p/c?output=1");
        let h = exec.headers();
        assert_eq!(h["upgrade"], "SPDY/3.1");
        assert_eq!(h["connection"], "Upgrade");
        assert_eq!(h["x-stream-protocol-version"], "v4.channel.k8s.io");
        assert_eq!(h["host"], "n1:10250");
        assert_eq!(h.len(), 4, "none of the client's: {h:?}");

        let pf = kubelet_request(
            &Plan::Tunnel(vec!["portforward.k8s.io".into()]),
            "/portForward/ns/p?port=80",
            &target,
            &client,
        )
        .unwrap();
        let h = pf.headers();
        assert_eq!(h["upgrade"], "SPDY/3.1");
        assert_eq!(h["x-stream-protocol-version"], "portforward.k8s.io");
        assert_eq!(h["user-agent"], "kubectl/v1.32.4");
        assert!(h.get("authorization").is_none());
        assert!(h.get("sec-websocket-key").is_none());
        assert!(h.get("sec-websocket-protocol").is_none());
    }

    #[test]
    fn an_spdy_upgrade_is_recognised() {
        assert!(spdy_upgraded(&headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "SPDY/3.1")
        ])));
        assert!(!spdy_upgraded(&headers(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket")
        ])));
        assert!(!spdy_upgraded(&headers(&[("upgrade", "SPDY/3.1")])));
    }
}
