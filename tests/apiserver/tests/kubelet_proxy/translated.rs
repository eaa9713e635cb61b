//! The stream translation: a WebSocket client in `v5.channel.k8s.io` (here
//! tokio-tungstenite) gets its channels while the kubelet, `spdy.rs`'s
//! remote command server, gets an SPDY/3.1 session in `v4.channel.k8s.io`;
//! a port-forward WebSocket tunnels its bytes to an SPDY upgrade.
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{SinkExt as _, StreamExt as _};
use http::Method;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio_tungstenite::{
    WebSocketStream,
    tungstenite::{
        Message,
        protocol::{Role, frame::coding::CloseCode},
    },
};

use super::{
    Cluster, PODS, Reply,
    spdy::{Script, Transcript},
    status, text, websocket,
};

type Ws = WebSocketStream<TokioIo<Upgraded>>;

/// A kubelet whose exec and attach run `script`, and the transcript.
async fn cluster(greeting: &str, exit: u8) -> (Cluster, Arc<Mutex<Transcript>>) {
    let transcript: Arc<Mutex<Transcript>> = Arc::default();
    let script = Script {
        greeting: greeting.into(),
        exit,
        transcript: transcript.clone(),
    };
    let c = Cluster::start(move |s| {
        if s.header_values("upgrade") == ["SPDY/3.1"] {
            Reply::Spdy(script.clone())
        } else {
            Reply::Text {
                status: 400,
                headers: vec![],
                body: "SPDY only\n".into(),
            }
        }
    })
    .await;
    (c, transcript)
}

/// Opens `path` as a WebSocket offering `protocols`, checking the
/// handshake's answer.
async fn open(c: &Cluster, path: &str, protocols: &str, chosen: &str) -> Ws {
    let resp = c
        .send(websocket(Method::GET, &format!("{PODS}/{path}"), protocols))
        .await;
    assert_eq!(resp.status(), 101, "{path}");
    let h = resp.headers();
    assert_eq!(h["upgrade"], "websocket");
    assert_eq!(h["sec-websocket-accept"], "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    assert_eq!(h["sec-websocket-protocol"], chosen);
    let io = TokioIo::new(hyper::upgrade::on(resp).await.unwrap());
    WebSocketStream::from_raw_socket(io, Role::Client, None).await
}

async fn recv(ws: &mut Ws) -> Message {
    tokio::time::timeout(Duration::from_secs(20), ws.next())
        .await
        .expect("a message in time")
        .expect("a message")
        .expect("no error")
}

/// The next message, which must be a binary one on `channel`: its payload.
async fn on(ws: &mut Ws, channel: u8) -> Vec<u8> {
    match recv(ws).await {
        Message::Binary(b) => {
            assert_eq!(b.first(), Some(&channel), "{b:?}");
            b[1..].to_vec()
        }
        other => panic!("expected channel {channel}, got {other:?}"),
    }
}

async fn send(ws: &mut Ws, bytes: &[u8]) {
    ws.send(Message::Binary(bytes.to_vec().into()))
        .await
        .unwrap();
}

/// The session ends with a normal close, and nothing after it.
async fn closed(ws: &mut Ws) {
    match recv(ws).await {
        Message::Close(Some(f)) => assert_eq!(f.code, CloseCode::Normal),
        other => panic!("expected the close frame, got {other:?}"),
    }
    let end = tokio::time::timeout(Duration::from_secs(20), ws.next())
        .await
        .expect("the end in time");
    assert!(end.is_none(), "{end:?}");
}

#[tokio::test]
async fn a_websocket_v5_exec_runs_over_spdy_to_the_kubelet() {
    let (c, transcript) = cluster("hello\n", 3).await;
    let mut ws = open(
        &c,
        "p/exec?command=cat&stdin=true&stdout=true&stderr=true",
        "v5.channel.k8s.io",
        "v5.channel.k8s.io",
    )
    .await;
    // The session is up: an empty message on stdout, then the command's.
    assert_eq!(on(&mut ws, 1).await, b"");
    assert_eq!(on(&mut ws, 1).await, b"hello\n");
    send(&mut ws, b"\x00ping").await;
    assert_eq!(on(&mut ws, 1).await, b"ping");
    // Channels nobody reads are dropped; a text message counts as binary.
    send(&mut ws, b"\x01to stdout?").await;
    ws.send(Message::text("\u{0}pong")).await.unwrap();
    assert_eq!(on(&mut ws, 1).await, b"pong");
    // The close signal for stdin: its end of input.
    send(&mut ws, &[255, 0]).await;
    let status: Value = serde_json::from_slice(&on(&mut ws, 3).await).unwrap();
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(status["details"]["causes"][0]["message"], "3");
    closed(&mut ws).await;

    let t = transcript.lock().unwrap().clone();
    assert_eq!(t.streams, ["error", "stdin", "stdout", "stderr"]);
    assert!(t.header_names.iter().all(|n| n == "streamtype"), "{t:?}");
    assert_eq!(t.stdin, b"pingpong");
    assert!(t.stdin_fin && t.pong, "{t:?}");

    let seen = c.kubelet.seen().pop().unwrap();
    assert_eq!(
        (seen.method.as_str(), seen.uri.as_str()),
        (
            "POST",
            "/exec/default/p/c?command=cat&error=1&input=1&output=1"
        )
    );
    assert_eq!(seen.header_values("upgrade"), ["SPDY/3.1"]);
    assert_eq!(seen.header_values("connection"), ["Upgrade"]);
    assert_eq!(
        seen.header_values("x-stream-protocol-version"),
        ["v4.channel.k8s.io"]
    );
    assert!(seen.headers.get("sec-websocket-key").is_none());
    assert!(seen.headers.get("authorization").is_none());
}

#[tokio::test]
async fn a_terminal_gets_a_resize_stream_and_no_stderr() {
    let (c, transcript) = cluster("$ ", 0).await;
    let mut ws = open(
        &c,
        "p/attach?stdin=1&stdout=1&stderr=1&tty=1",
        "v4.channel.k8s.io,v5.channel.k8s.io",
        "v5.channel.k8s.io",
    )
    .await;
    assert_eq!(on(&mut ws, 1).await, b"");
    assert_eq!(on(&mut ws, 1).await, b"$ ");
    let size = br#"{"Width":80,"Height":24}"#;
    send(&mut ws, &[&[4u8][..], size].concat()).await;
    send(&mut ws, &[255, 4]).await;
    send(&mut ws, &[255, 0]).await;
    assert_eq!(
        on(&mut ws, 3).await,
        br#"{"metadata":{},"status":"Success"}"#
    );
    closed(&mut ws).await;
    let t = transcript.lock().unwrap().clone();
    assert_eq!(t.streams, ["error", "stdin", "stdout", "resize"]);
    assert_eq!(t.resize, size);
    assert!(t.stdin_fin);
    assert_eq!(
        c.kubelet.uris(),
        ["/attach/default/p/c?error=1&input=1&output=1&tty=1"]
    );
}

#[tokio::test]
async fn without_stdin_the_command_ends_by_itself() {
    let (c, transcript) = cluster("out\n", 0).await;
    let mut ws = open(
        &c,
        "p/exec?command=date&stdout=1&stderr=1",
        "v5.channel.k8s.io",
        "v5.channel.k8s.io",
    )
    .await;
    assert_eq!(on(&mut ws, 1).await, b"");
    assert_eq!(on(&mut ws, 1).await, b"out\n");
    on(&mut ws, 3).await;
    closed(&mut ws).await;
    let t = transcript.lock().unwrap().clone();
    assert_eq!(t.streams, ["error", "stdout", "stderr"]);
}

#[tokio::test]
async fn a_refused_spdy_upgrade_reaches_the_client_as_sent() {
    let c = Cluster::start(|_| Reply::Text {
        status: 403,
        headers: vec![("content-type", "text/plain")],
        body: "unable to upgrade: unable to negotiate protocol\n".into(),
    })
    .await;
    let resp = c
        .send(websocket(
            Method::GET,
            &format!("{PODS}/p/exec?command=ls&stdout=1"),
            "v5.channel.k8s.io",
        ))
        .await;
    assert_eq!(resp.status(), 403);
    assert_eq!(
        text(resp).await,
        "unable to upgrade: unable to negotiate protocol\n"
    );
    let seen = c.kubelet.seen().pop().unwrap();
    assert_eq!(
        (seen.method.as_str(), seen.header_values("upgrade")),
        ("POST", vec!["SPDY/3.1".to_string()])
    );

    // A 101 that is no SPDY upgrade.
    let c = Cluster::start(|_| {
        Reply::Echo(vec![
            ("upgrade", "websocket".into()),
            ("connection", "Upgrade".into()),
        ])
    })
    .await;
    let resp = c
        .send(websocket(
            Method::POST,
            &format!("{PODS}/p/attach?stdout=1"),
            "v5.channel.k8s.io",
        ))
        .await;
    assert_eq!(
        status(resp).await,
        (
            500,
            "unable to upgrade connection: missing upgrade headers in response".into()
        )
    );

    // A handshake without a key is refused before the kubelet is asked.
    let mut req = websocket(
        Method::GET,
        &format!("{PODS}/p/exec?command=ls&stdout=1"),
        "v5.channel.k8s.io",
    );
    req.headers_mut().remove("sec-websocket-key");
    let (code, _) = status(c.send(req).await).await;
    assert_eq!(code, 400);
    assert_eq!(c.kubelet.seen().len(), 1);
}

#[tokio::test]
async fn a_port_forward_websocket_tunnels_to_an_spdy_upgrade() {
    let c = Cluster::start(|_| {
        Reply::Echo(vec![
            ("upgrade", "SPDY/3.1".into()),
            ("connection", "Upgrade".into()),
            ("x-stream-protocol-version", "portforward.k8s.io".into()),
        ])
    })
    .await;
    let mut ws = open(
        &c,
        "p/portforward?ports=8080",
        "SPDY/3.1+portforward.k8s.io",
        "SPDY/3.1+portforward.k8s.io",
    )
    .await;
    // Payloads travel raw: no channel byte either way.
    send(&mut ws, b"\x80\x03\x00\x01spdy bytes").await;
    let mut echoed = Vec::new();
    while echoed.len() < 14 {
        match recv(&mut ws).await {
            Message::Binary(b) => echoed.extend_from_slice(&b),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(echoed, b"\x80\x03\x00\x01spdy bytes");
    ws.close(None).await.unwrap();

    let seen = c.kubelet.seen().pop().unwrap();
    assert_eq!(
        (seen.method.as_str(), seen.uri.as_str()),
        ("POST", "/portForward/default/p?port=8080")
    );
    assert_eq!(seen.header_values("upgrade"), ["SPDY/3.1"]);
    assert_eq!(
        seen.header_values("x-stream-protocol-version"),
        ["portforward.k8s.io"]
    );
    assert!(seen.headers.get("sec-websocket-protocol").is_none());
}

#[tokio::test]
async fn stopping_the_server_cuts_a_tunnel() {
    let c = Cluster::start(|_| {
        Reply::Echo(vec![
            ("upgrade", "SPDY/3.1".into()),
            ("connection", "Upgrade".into()),
            ("x-stream-protocol-version", "portforward.k8s.io".into()),
        ])
    })
    .await;
    let mut ws = open(
        &c,
        "p/portforward?ports=80",
        "SPDY/3.1+portforward.k8s.io",
        "SPDY/3.1+portforward.k8s.io",
    )
    .await;
    send(&mut ws, b"x").await;
    assert_eq!(recv(&mut ws).await, Message::Binary(b"x".to_vec().into()));
    c.server.stop().await;
    // The server stopping cuts the session: the socket just ends.
    let end = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
    assert!(end.is_ok(), "still open after stop");
}
