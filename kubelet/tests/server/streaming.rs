//! `/containerLogs?follow=true|previous=true`, and `/exec`, `/attach` proxied
//! to a runtime streaming server, over the real HTTPS API.
use std::time::Duration;

use hyper::{body::Incoming, header};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
    sync::mpsc,
};
use tokio_rustls::client::TlsStream;
use weir_kubelet::cri::{ContainerConfig, FakeRuntime, Runtime as _, SandboxConfig};

use super::*;

/// Waits for whatever a test waits on, so that a hang fails instead.
const WITHIN: Duration = Duration::from_secs(10);

async fn tls(api: SocketAddr, pki: &Pki) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(api).await.unwrap();
    TlsConnector::from(Arc::new(client_config(pki, Some(&pki.client))))
        .connect(ServerName::IpAddress(api.ip().into()), tcp)
        .await
        .unwrap()
}

async fn send(api: SocketAddr, pki: &Pki, req: Request<Empty<Bytes>>) -> hyper::Response<Incoming> {
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(tls(api, pki).await))
            .await
            .unwrap();
    tokio::spawn(conn.with_upgrades());
    sender.send_request(req).await.unwrap()
}

fn get(path: &str) -> Request<Empty<Bytes>> {
    Request::get(path)
        .header(header::HOST, "127.0.0.1")
        .body(Empty::new())
        .unwrap()
}

async fn next_chunk(body: &mut Incoming) -> Option<String> {
    loop {
        let frame = tokio::time::timeout(WITHIN, body.frame())
            .await
            .expect("a log chunk in time")?
            .unwrap();
        if let Ok(data) = frame.into_data() {
            return Some(String::from_utf8(data.to_vec()).unwrap());
        }
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

#[tokio::test]
async fn server_follows_a_log_until_the_container_stops() {
    let dir = temp_dir("follow");
    let pki = pki(&dir);
    let log = dir.join("0.log");
    std::fs::write(&log, "t1 stdout F one\nt2 stdout F tw").unwrap();
    let view = Arc::new(FakePods {
        pods: vec![pod("ns1", "web", &["httpd"])],
        containers: Mutex::new(HashMap::from([(
            key("ns1", "web", "httpd"),
            running("c1", &log),
        )])),
    });
    let server = Server::start(&config(Some(&pki)), view.clone())
        .await
        .unwrap();
    let api = server.endpoints().api;

    let resp = send(
        api,
        &pki,
        get("/containerLogs/ns1/web/httpd?follow=true&timestamps=true"),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    // The record being written at the end waits for its line end; a line
    // the runtime split (P, then F) arrives once, with its first timestamp.
    assert_eq!(next_chunk(&mut body).await.unwrap(), "t1 one\n");
    append(&log, "o\nt3 stdout P thr\n");
    append(&log, "t4 stdout F ee\n");
    let mut got = String::new();
    while got.len() < "t2 two\nt3 three\n".len() {
        got += &next_chunk(&mut body).await.unwrap();
    }
    assert_eq!(got, "t2 two\nt3 three\n");

    // Rotated: renamed away, a new file at the path.
    std::fs::rename(&log, dir.join("0.log.1")).unwrap();
    std::fs::write(&log, "t5 stdout F four\n").unwrap();
    assert_eq!(next_chunk(&mut body).await.unwrap(), "t5 four\n");

    // The container stops: what it wrote last arrives, then the body ends.
    append(&log, "t6 stderr F last\n");
    view.containers
        .lock()
        .unwrap()
        .get_mut(&key("ns1", "web", "httpd"))
        .unwrap()
        .running = false;
    assert_eq!(next_chunk(&mut body).await.unwrap(), "t6 last\n");
    assert_eq!(next_chunk(&mut body).await, None);

    // Without follow, or for a stopped container, the log is read once.
    let (status, text) = https(
        api,
        client_config(&pki, Some(&pki.client)),
        Method::GET,
        "/containerLogs/ns1/web/httpd?follow=true",
    )
    .await
    .unwrap();
    assert_eq!((status, text.as_str()), (StatusCode::OK, "four\nlast\n"));
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn server_previous_log_is_the_exited_instance() {
    let dir = temp_dir("previous");
    let pki = pki(&dir);
    let (now, before) = (dir.join("1.log"), dir.join("0.log"));
    std::fs::write(&now, "t stdout F second run\n").unwrap();
    std::fs::write(&before, "t stdout F first run\nt stderr F crashed\n").unwrap();
    let mut c = running("c2", &now);
    c.previous_log = Some(before);
    let view = FakePods {
        pods: vec![pod("ns1", "web", &["httpd", "fresh"])],
        containers: Mutex::new(HashMap::from([
            (key("ns1", "web", "httpd"), c),
            (key("ns1", "web", "fresh"), running("c3", &now)),
        ])),
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
        get("/containerLogs/ns1/web/httpd?previous=true").await,
        (StatusCode::OK, "first run\ncrashed\n".to_owned())
    );
    assert_eq!(
        get("/containerLogs/ns1/web/httpd?previous=true&follow=true").await,
        (StatusCode::OK, "first run\ncrashed\n".to_owned())
    );
    let (status, body) = get("/containerLogs/ns1/web/fresh?previous=true").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        body.contains("previous terminated container \"fresh\" in pod \"web\" not found"),
        "{body}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// One connection of a runtime streaming server: reports the request head,
/// then refuses `/attach/...` with 403 and upgrades anything else, echoing
/// bytes until the client half-closes, then says "bye".
async fn streaming_server(listener: TcpListener, heads: mpsc::UnboundedSender<String>) {
    loop {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            if conn.read(&mut b).await.unwrap() == 0 {
                break;
            }
            head.push(b[0]);
        }
        let head = String::from_utf8(head).unwrap();
        let refuse = head.starts_with("GET /attach/") || head.starts_with("POST /attach/");
        heads.send(head).unwrap();
        if refuse {
            conn.write_all(
                b"HTTP/1.1 403 Forbidden\r\nContent-Length: 25\r\n\r\nunsupported protocol v5\r\n",
            )
            .await
            .unwrap();
            continue;
        }
        conn.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
              X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n",
        )
        .await
        .unwrap();
        let mut buf = [0u8; 1024];
        loop {
            let n = conn.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            conn.write_all(&buf[..n]).await.unwrap();
        }
        conn.write_all(b"bye").await.unwrap();
    }
}

fn upgrade(method: Method, path: &str) -> Request<Empty<Bytes>> {
    Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, "127.0.0.1")
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "SPDY/3.1")
        .header("X-Stream-Protocol-Version", "v4.channel.k8s.io")
        .header("X-Stream-Protocol-Version", "v3.channel.k8s.io")
        .header(header::AUTHORIZATION, "Bearer for-the-kubelet")
        .body(Empty::new())
        .unwrap()
}

#[tokio::test]
async fn server_exec_and_attach_are_proxied_to_the_runtime() {
    let dir = temp_dir("exec");
    let pki = pki(&dir);
    let runtime = Arc::new(FakeRuntime::default());
    runtime.add_image("busybox");
    let sandbox = runtime
        .run_pod_sandbox(&SandboxConfig::default())
        .await
        .unwrap();
    let id = runtime
        .create_container(
            &sandbox,
            &ContainerConfig {
                image: "busybox".into(),
                ..ContainerConfig::default()
            },
            &SandboxConfig::default(),
        )
        .await
        .unwrap();
    runtime.start_container(&id).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    runtime.set_stream_server(&format!("http://{}", listener.local_addr().unwrap()));
    let (heads_tx, mut heads) = mpsc::unbounded_channel();
    tokio::spawn(streaming_server(listener, heads_tx));

    let log = dir.join("0.log");
    std::fs::write(&log, "").unwrap();
    let view = FakePods {
        pods: vec![pod("ns1", "web", &["httpd", "stopped"])],
        containers: Mutex::new(HashMap::from([
            (key("ns1", "web", "httpd"), running(&id, &log)),
            (
                key("ns1", "web", "stopped"),
                ContainerRef {
                    running: false,
                    ..running("c9", &log)
                },
            ),
        ])),
    };
    let server = Server::start_streaming(
        &config(Some(&pki)),
        Arc::new(view),
        Some(runtime.clone()),
        None,
    )
    .await
    .unwrap();
    let api = server.endpoints().api;

    // Upgraded: the runtime's 101 reaches the client, and bytes flow both
    // ways until the client half-closes.
    let mut resp = send(
        api,
        &pki,
        upgrade(
            Method::POST,
            "/exec/ns1/web/httpd?command=sh&command=-c&command=echo%20hi&input=1&output=1&tty=1",
        ),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(
        resp.headers()["x-stream-protocol-version"],
        "v4.channel.k8s.io"
    );
    let head = tokio::time::timeout(WITHIN, heads.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        head.starts_with(&format!("POST /exec/{id} HTTP/1.1\r\n")),
        "{head}"
    );
    let lower = head.to_ascii_lowercase();
    assert!(
        lower.contains("x-stream-protocol-version: v4.channel.k8s.io\r\n"),
        "{head}"
    );
    assert!(
        lower.contains("x-stream-protocol-version: v3.channel.k8s.io\r\n"),
        "{head}"
    );
    assert!(
        !lower.contains("authorization"),
        "credentials leaked to the runtime: {head}"
    );
    let mut io = TokioIo::new(hyper::upgrade::on(&mut resp).await.unwrap());
    io.write_all(b"ping").await.unwrap();
    io.shutdown().await.unwrap();
    let mut echoed = Vec::new();
    tokio::time::timeout(WITHIN, io.read_to_end(&mut echoed))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(echoed, b"pingbye");
    assert!(
        runtime.calls().contains(&"Exec".to_owned()),
        "{:?}",
        runtime.calls()
    );

    // A refused upgrade goes back as it came, so a client can fall back.
    let resp = send(
        api,
        &pki,
        upgrade(Method::GET, "/attach/ns1/web/httpd?output=1"),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"unsupported protocol v5\r\n");
    let head = tokio::time::timeout(WITHIN, heads.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        head.starts_with(&format!("GET /attach/{id} HTTP/1.1\r\n")),
        "{head}"
    );

    // Refused by the kubelet itself, before the runtime is asked.
    let (status, body) = https(
        api,
        client_config(&pki, Some(&pki.client)),
        Method::POST,
        "/exec/ns1/web/httpd?command=ls&output=1",
    )
    .await
    .unwrap();
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::BAD_REQUEST, "Upgrade request required\n")
    );
    let refused = |path: &'static str| {
        let pki = &pki;
        async move { send(api, pki, upgrade(Method::POST, path)).await }
    };
    let resp = refused("/exec/ns1/web/httpd?output=1").await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let resp = refused("/exec/ns1/web/stopped?command=ls&output=1").await;
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let resp = refused("/exec/ns1/web/nginx?command=ls&output=1").await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let resp = refused("/portForward/ns1/web").await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    let (status, _) = https(
        api,
        client_config(&pki, Some(&pki.client)),
        Method::PUT,
        "/exec/ns1/web/httpd?command=ls",
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    // Anonymous clients get 401, not a stream.
    let (status, _) = https(
        api,
        client_config(&pki, None),
        Method::POST,
        "/exec/ns1/web/httpd?command=ls&output=1",
    )
    .await
    .unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(
        heads.try_recv().is_err(),
        "the runtime saw a request the kubelet refused"
    );
    let _ = std::fs::remove_dir_all(dir);
}
