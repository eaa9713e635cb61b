//! httpGet against local servers: plain HTTP, TLS with a self-signed
//! certificate, and redirects.
use std::net::{IpAddr, Ipv4Addr};

use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _},
    net::TcpListener,
    sync::mpsc,
};

use super::*;

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
const SECONDS: Duration = Duration::from_secs(2);

/// A listener whose every connection gets `answer(request head)`; the heads
/// come out of the receiver, one per request. TLS with a fresh self-signed
/// certificate when `tls`.
async fn server(
    tls: bool,
    answer: impl Fn(&str) -> String + Send + Sync + 'static,
) -> (u16, mpsc::UnboundedReceiver<String>) {
    let l = TcpListener::bind((LOCAL, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    let acceptor = tls.then(self_signed);
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            let (tx, answer) = (tx.clone(), answer.clone());
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                match acceptor {
                    Some(a) => {
                        if let Ok(s) = a.accept(s).await {
                            serve(s, &*answer, &tx).await;
                        }
                    }
                    None => serve(s, &*answer, &tx).await,
                }
            });
        }
    });
    (port, rx)
}

async fn serve(
    mut s: impl AsyncRead + AsyncWrite + Unpin,
    answer: &(dyn Fn(&str) -> String + Send + Sync),
    tx: &mpsc::UnboundedSender<String>,
) {
    let mut head = Vec::new();
    let mut b = [0u8; 512];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut b).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&b[..n]),
        }
    }
    let head = String::from_utf8(head).unwrap();
    let response = answer(&head);
    let _ = tx.send(head);
    let _ = s.write_all(response.as_bytes()).await;
    let _ = s.shutdown().await;
}

fn self_signed() -> tokio_rustls::TlsAcceptor {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["pod.local".into()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

fn reply(status: &str, extra: &str) -> String {
    format!("HTTP/1.1 {status}\r\n{extra}Content-Length: 2\r\n\r\nok")
}

fn get_action(scheme: Scheme, port: u16, headers: &[(&str, &str)]) -> HttpGet {
    HttpGet {
        scheme,
        host: None,
        port,
        path: "/healthz?x=1".into(),
        headers: headers
            .iter()
            .map(|(n, v)| ((*n).into(), (*v).into()))
            .collect(),
    }
}

fn failure(out: &ProbeOutcome) -> &str {
    match out {
        ProbeOutcome::Failure { message } => message,
        other => panic!("not a failure: {other:?}"),
    }
}

#[tokio::test]
async fn request_is_shaped_as_the_kubelets() {
    let (port, mut heads) = server(false, |_| reply("204 No Content", "")).await;
    let h = get_action(Scheme::Http, port, &[("X-Probe", "yes")]);
    assert_eq!(http_get(&h, LOCAL, SECONDS).await, ProbeOutcome::Success);
    let head = heads.recv().await.unwrap();
    assert!(head.starts_with("GET /healthz?x=1 HTTP/1.1\r\n"), "{head}");
    for line in [
        format!("Host: 127.0.0.1:{port}\r\n"),
        "User-Agent: kube-probe/1.35\r\n".into(),
        "Accept: */*\r\n".into(),
        "X-Probe: yes\r\n".into(),
    ] {
        assert!(head.contains(&line), "{line:?} missing from {head}");
    }
}

#[tokio::test]
async fn a_host_header_replaces_ours_and_a_broken_header_fails() {
    let (port, mut heads) = server(false, |_| reply("200 OK", "")).await;
    let h = get_action(Scheme::Http, port, &[("Host", "example.com")]);
    assert_eq!(http_get(&h, LOCAL, SECONDS).await, ProbeOutcome::Success);
    let head = heads.recv().await.unwrap();
    assert!(head.contains("Host: example.com\r\n") && !head.contains("Host: 127"));
    // A value with a line break would smuggle a second request.
    let h = get_action(Scheme::Http, port, &[("X-A", "b\r\nX-B: c")]);
    assert!(failure(&http_get(&h, LOCAL, SECONDS).await).contains("invalid"));
}

#[tokio::test]
async fn status_codes_decide() {
    for (status, ok) in [
        ("200 OK", true),
        ("399 Odd", true),
        ("404 Not Found", false),
        ("500 Internal Server Error", false),
    ] {
        let (port, _heads) = server(false, move |_| reply(status, "")).await;
        let out = http_get(&get_action(Scheme::Http, port, &[]), LOCAL, SECONDS).await;
        assert_eq!(out == ProbeOutcome::Success, ok, "{status}: {out:?}");
    }
    let (port, _heads) = server(false, |_| reply("503 Unavailable", "")).await;
    let out = http_get(&get_action(Scheme::Http, port, &[]), LOCAL, SECONDS).await;
    assert_eq!(failure(&out), "HTTP probe failed with statuscode: 503");
}

#[tokio::test]
async fn https_takes_a_self_signed_certificate_and_http_to_it_fails() {
    let (port, mut heads) = server(true, |_| reply("200 OK", "")).await;
    let h = get_action(Scheme::Https, port, &[]);
    assert_eq!(http_get(&h, LOCAL, SECONDS).await, ProbeOutcome::Success);
    assert!(heads.recv().await.unwrap().starts_with("GET /healthz?x=1 "));
    let plain = get_action(Scheme::Http, port, &[]);
    failure(&http_get(&plain, LOCAL, SECONDS).await);
}

#[tokio::test]
async fn redirects_on_the_same_host_are_followed() {
    let (port, mut heads) = server(false, |head| {
        if head.starts_with("GET /healthz") {
            reply("302 Found", "Location: /moved/here\r\n")
        } else if head.starts_with("GET /moved/here ") {
            reply("301 Moved", "Location: there?y=2\r\n")
        } else {
            reply("500 Broken", "")
        }
    })
    .await;
    let out = http_get(&get_action(Scheme::Http, port, &[]), LOCAL, SECONDS).await;
    assert_eq!(failure(&out), "HTTP probe failed with statuscode: 500");
    let mut paths = Vec::new();
    while let Ok(head) = heads.try_recv() {
        paths.push(head.split(' ').nth(1).unwrap().to_owned());
    }
    assert_eq!(paths, ["/healthz?x=1", "/moved/here", "/moved/there?y=2"]);
}

#[tokio::test]
async fn a_redirect_to_another_host_is_a_success_not_followed() {
    let (port, mut heads) = server(false, |_| {
        reply("302 Found", "Location: http://192.0.2.1:8080/elsewhere\r\n")
    })
    .await;
    let out = http_get(&get_action(Scheme::Http, port, &[]), LOCAL, SECONDS).await;
    assert_eq!(out, ProbeOutcome::Success);
    heads.recv().await.unwrap();
    assert!(heads.try_recv().is_err(), "followed to another host");
}

#[tokio::test]
async fn a_redirect_loop_stops_after_ten() {
    let (port, _heads) = server(false, |_| reply("302 Found", "Location: /again\r\n")).await;
    let out = http_get(&get_action(Scheme::Http, port, &[]), LOCAL, SECONDS).await;
    assert!(
        failure(&out).ends_with("stopped after 10 redirects"),
        "{out:?}"
    );
}

#[tokio::test]
async fn timeout_refusal_and_garbage_fail() {
    // Accepts, never answers.
    let l = TcpListener::bind((LOCAL, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let _keep = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        drop(s);
    });
    let out = http_get(
        &get_action(Scheme::Http, port, &[]),
        LOCAL,
        Duration::from_millis(200),
    )
    .await;
    assert!(failure(&out).contains("deadline"), "{out:?}");

    let closed = TcpListener::bind((LOCAL, 0))
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = http_get(&get_action(Scheme::Http, closed, &[]), LOCAL, SECONDS).await;
    assert!(failure(&out).contains("refused"), "{out:?}");

    let (port, _heads) = server(false, |_| "SSH-2.0-OpenSSH\r\n\r\n".into()).await;
    failure(&http_get(&get_action(Scheme::Http, port, &[]), LOCAL, SECONDS).await);
}

#[test]
fn redirect_locations_resolve_as_a_browser_would() {
    let base = Url {
        scheme: Scheme::Http,
        host: "10.0.0.5".into(),
        port: 8080,
        path: "/a/b?q=1".into(),
    };
    let j = |l: &str| base.join(l).map(|u| u.to_string());
    assert_eq!(j("/c").as_deref(), Some("http://10.0.0.5:8080/c"));
    assert_eq!(j("c?d=1").as_deref(), Some("http://10.0.0.5:8080/a/c?d=1"));
    assert_eq!(
        j("https://10.0.0.5/x").as_deref(),
        Some("https://10.0.0.5:443/x")
    );
    assert_eq!(
        j("//[fd00::1]:9/y").as_deref(),
        Some("http://[fd00::1]:9/y")
    );
    assert_eq!(j("HTTP://h").as_deref(), Some("http://h:80/"));
    assert_eq!(j("ftp://h/x"), None);
}
