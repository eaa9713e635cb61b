//! Running probes and HTTP hooks: httpGet as a plain HTTP/1.1 GET (200-399 is
//! success, as pkg/probe/http), tcpSocket as a connect (pkg/probe/tcp), and
//! exec through [`ExecRunner`], which the pod worker implements with CRI
//! `ExecSync` (pkg/probe/exec: a timeout is a failure, a runtime error unknown).
use std::{
    future::Future,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use super::{HttpGet, ProbeAction, probe::ProbeOutcome};

/// The User-Agent the kubelet's prober sends (`kube-probe/<major>.<minor>`).
pub const USER_AGENT: &str = "kube-probe/1.35";

/// Enough of the response to read its status line and headers; the kubelet
/// reads at most 10 KiB of body, which we do not need.
const MAX_HEAD: usize = 16 * 1024;

/// How an exec in the container ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecOutcome {
    Exited { exit_code: i32, output: String },
    TimedOut,
}

/// Runs a command in a container (CRI `ExecSync`).
pub trait ExecRunner {
    type Error: std::fmt::Display;
    fn exec_sync(
        &self,
        container_id: &str,
        command: &[String],
        timeout: Duration,
    ) -> impl Future<Output = Result<ExecOutcome, Self::Error>> + Send;
}

/// Where a probe goes.
#[derive(Clone, Copy, Debug)]
pub struct ProbeTarget<'a> {
    pub pod_ip: IpAddr,
    pub container_id: &'a str,
}

/// Runs a probe once.
pub async fn run<E: ExecRunner>(
    action: &ProbeAction,
    target: ProbeTarget<'_>,
    timeout: Duration,
    exec: &E,
) -> ProbeOutcome {
    match action {
        ProbeAction::Exec { command } => {
            match exec.exec_sync(target.container_id, command, timeout).await {
                Ok(ExecOutcome::Exited { exit_code: 0, .. }) => ProbeOutcome::Success,
                Ok(ExecOutcome::Exited { exit_code, output }) => ProbeOutcome::Failure {
                    message: if output.is_empty() {
                        format!("command {command:?} exited with {exit_code}")
                    } else {
                        output
                    },
                },
                Ok(ExecOutcome::TimedOut) => ProbeOutcome::Failure {
                    message: format!("command {command:?} timed out"),
                },
                Err(e) => ProbeOutcome::Unknown {
                    message: e.to_string(),
                },
            }
        }
        ProbeAction::HttpGet(h) => http_get(h, target.pod_ip, timeout).await,
        ProbeAction::TcpSocket { host, port } => {
            tcp_socket(host.as_deref(), target.pod_ip, *port, timeout).await
        }
    }
}

/// `tcpSocket`: success when a connection opens within `timeout`.
pub async fn tcp_socket(
    host: Option<&str>,
    pod_ip: IpAddr,
    port: u16,
    timeout: Duration,
) -> ProbeOutcome {
    let dest = host.map_or_else(
        || SocketAddr::new(pod_ip, port).to_string(),
        |h| join_host_port(h, port),
    );
    match tokio::time::timeout(timeout, TcpStream::connect(&dest)).await {
        Ok(Ok(_)) => ProbeOutcome::Success,
        Ok(Err(e)) => ProbeOutcome::Failure {
            message: format!("dial tcp {dest}: {e}"),
        },
        Err(_) => ProbeOutcome::Failure {
            message: format!("dial tcp {dest}: i/o timeout"),
        },
    }
}

/// `httpGet` (also preStop/postStart httpGet hooks): one GET on a fresh
/// connection, everything within `timeout`. Redirects are not followed; a
/// 3xx is a success, as the kubelet reports a redirect to another host.
pub async fn http_get(h: &HttpGet, pod_ip: IpAddr, timeout: Duration) -> ProbeOutcome {
    let host = h.host.clone().unwrap_or_else(|| pod_ip.to_string());
    let dest = join_host_port(&host, h.port);
    let url = format!("http://{dest}{}", h.path);
    match tokio::time::timeout(timeout, get(&dest, &h.path, &h.headers)).await {
        Ok(Ok(code)) if (200..400).contains(&code) => ProbeOutcome::Success,
        Ok(Ok(code)) => ProbeOutcome::Failure {
            message: format!("HTTP probe failed with statuscode: {code}"),
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

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

async fn get(dest: &str, path: &str, headers: &[(String, String)]) -> std::io::Result<u16> {
    let mut stream = TcpStream::connect(dest).await?;
    let has = |name: &str| headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    let mut req = format!("GET {path} HTTP/1.1\r\n");
    if !has("host") {
        req.push_str(&format!("Host: {dest}\r\n"));
    }
    if !has("user-agent") {
        req.push_str(&format!("User-Agent: {USER_AGENT}\r\n"));
    }
    if !has("accept") {
        req.push_str("Accept: */*\r\n");
    }
    for (n, v) in headers {
        // A header value with a line break would smuggle a second request.
        if n.contains(['\r', '\n', ':']) || v.contains(['\r', '\n']) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("invalid header {n:?}"),
            ));
        }
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("Connection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = buf.windows(2).position(|w| w == b"\r\n") {
            return parse_status_line(&buf[..end]);
        }
        if buf.len() >= MAX_HEAD {
            break;
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "malformed HTTP response",
    ))
}

fn parse_status_line(line: &[u8]) -> std::io::Result<u16> {
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "malformed HTTP response");
    let line = std::str::from_utf8(line).map_err(|_| bad())?;
    let mut parts = line.split(' ');
    if !parts.next().is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Err(bad());
    }
    parts
        .next()
        .filter(|c| c.len() == 3)
        .and_then(|c| c.parse().ok())
        .ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use tokio::net::TcpListener;

    use super::*;

    const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    /// Serves one connection with `response`, and hands back the request.
    async fn serve_once(response: &'static str) -> (u16, tokio::task::JoinHandle<String>) {
        let l = TcpListener::bind((LOCAL, 0)).await.unwrap();
        let port = l.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut req = Vec::new();
            let mut b = [0u8; 512];
            while !req.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut b).await.unwrap();
                if n == 0 {
                    break;
                }
                req.extend_from_slice(&b[..n]);
            }
            s.write_all(response.as_bytes()).await.unwrap();
            String::from_utf8(req).unwrap()
        });
        (port, task)
    }

    fn get_action(port: u16, headers: &[(&str, &str)]) -> HttpGet {
        HttpGet {
            host: None,
            port,
            path: "/healthz?x=1".into(),
            headers: headers
                .iter()
                .map(|(n, v)| ((*n).into(), (*v).into()))
                .collect(),
        }
    }

    #[tokio::test]
    async fn http_success_and_request_shape() {
        let (port, task) = serve_once("HTTP/1.1 204 No Content\r\n\r\n").await;
        let h = get_action(port, &[("X-Probe", "yes")]);
        assert_eq!(
            http_get(&h, LOCAL, Duration::from_secs(2)).await,
            ProbeOutcome::Success
        );
        let req = task.await.unwrap();
        assert!(req.starts_with("GET /healthz?x=1 HTTP/1.1\r\n"), "{req}");
        assert!(
            req.contains(&format!("Host: 127.0.0.1:{port}\r\n")),
            "{req}"
        );
        assert!(req.contains("User-Agent: kube-probe/1.35\r\n"));
        assert!(req.contains("X-Probe: yes\r\n"));
    }

    #[tokio::test]
    async fn http_redirect_is_success_and_500_is_failure() {
        let (port, _t) = serve_once("HTTP/1.0 302 Found\r\nLocation: /x\r\n\r\n").await;
        assert_eq!(
            http_get(&get_action(port, &[]), LOCAL, Duration::from_secs(2)).await,
            ProbeOutcome::Success
        );
        let (port, _t) = serve_once("HTTP/1.1 500 Internal Server Error\r\n\r\n").await;
        assert_eq!(
            http_get(&get_action(port, &[]), LOCAL, Duration::from_secs(2)).await,
            ProbeOutcome::Failure {
                message: "HTTP probe failed with statuscode: 500".into()
            }
        );
        let (port, _t) = serve_once("HTTP/1.1 404 Not Found\r\n\r\n").await;
        assert!(matches!(
            http_get(&get_action(port, &[]), LOCAL, Duration::from_secs(2)).await,
            ProbeOutcome::Failure { .. }
        ));
    }

    #[tokio::test]
    async fn http_user_host_header_replaces_ours() {
        let (port, task) = serve_once("HTTP/1.1 200 OK\r\n\r\n").await;
        let h = get_action(port, &[("Host", "example.com")]);
        assert_eq!(
            http_get(&h, LOCAL, Duration::from_secs(2)).await,
            ProbeOutcome::Success
        );
        let req = task.await.unwrap();
        assert!(
            req.contains("Host: example.com\r\n") && !req.contains("Host: 127"),
            "{req}"
        );
    }

    #[tokio::test]
    async fn http_timeout_and_refusal_fail() {
        // Accepts, never answers.
        let l = TcpListener::bind((LOCAL, 0)).await.unwrap();
        let port = l.local_addr().unwrap().port();
        let _keep = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(s);
        });
        let out = http_get(&get_action(port, &[]), LOCAL, Duration::from_millis(200)).await;
        assert!(
            matches!(&out, ProbeOutcome::Failure { message } if message.contains("deadline")),
            "{out:?}"
        );
        let closed = TcpListener::bind((LOCAL, 0))
            .await
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let out = http_get(&get_action(closed, &[]), LOCAL, Duration::from_secs(2)).await;
        assert!(
            matches!(&out, ProbeOutcome::Failure { message } if message.contains("refused")),
            "{out:?}"
        );
    }

    #[tokio::test]
    async fn http_garbage_fails() {
        let (port, _t) = serve_once("SSH-2.0-OpenSSH\r\n").await;
        assert!(matches!(
            http_get(&get_action(port, &[]), LOCAL, Duration::from_secs(2)).await,
            ProbeOutcome::Failure { .. }
        ));
    }

    #[tokio::test]
    async fn tcp_probe() {
        let l = TcpListener::bind((LOCAL, 0)).await.unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(
            tcp_socket(None, LOCAL, port, Duration::from_secs(1)).await,
            ProbeOutcome::Success
        );
        assert_eq!(
            tcp_socket(Some("127.0.0.1"), LOCAL, port, Duration::from_secs(1)).await,
            ProbeOutcome::Success
        );
        drop(l);
        let out = tcp_socket(None, LOCAL, port, Duration::from_secs(1)).await;
        assert!(
            matches!(&out, ProbeOutcome::Failure { message } if message.starts_with("dial tcp 127.0.0.1:")),
            "{out:?}"
        );
    }

    struct FakeExec(Result<ExecOutcome, &'static str>);

    impl ExecRunner for FakeExec {
        type Error = &'static str;
        fn exec_sync(
            &self,
            container_id: &str,
            command: &[String],
            _timeout: Duration,
        ) -> impl Future<Output = Result<ExecOutcome, Self::Error>> + Send {
            assert_eq!(container_id, "cid");
            assert_eq!(command, ["cat", "/tmp/healthy"]);
            std::future::ready(self.0.clone())
        }
    }

    #[tokio::test]
    async fn exec_probe() {
        let action = ProbeAction::Exec {
            command: vec!["cat".into(), "/tmp/healthy".into()],
        };
        let target = ProbeTarget {
            pod_ip: LOCAL,
            container_id: "cid",
        };
        let run_with = |r| {
            let action = action.clone();
            async move { run(&action, target, Duration::from_secs(1), &FakeExec(r)).await }
        };
        let exited = |code, out: &str| ExecOutcome::Exited {
            exit_code: code,
            output: out.into(),
        };
        assert_eq!(run_with(Ok(exited(0, ""))).await, ProbeOutcome::Success);
        assert_eq!(
            run_with(Ok(exited(1, "No such file"))).await,
            ProbeOutcome::Failure {
                message: "No such file".into()
            }
        );
        assert!(matches!(
            run_with(Ok(ExecOutcome::TimedOut)).await,
            ProbeOutcome::Failure { .. }
        ));
        assert_eq!(
            run_with(Err("container not found")).await,
            ProbeOutcome::Unknown {
                message: "container not found".into()
            }
        );
    }
}
