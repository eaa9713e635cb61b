//! Running probes and HTTP hooks: httpGet on hyper's client ([`http`], as
//! pkg/probe/http), tcpSocket as a connect (pkg/probe/tcp), grpc as the
//! health protocol's `Check` on tonic ([`grpc`], as pkg/probe/grpc), and
//! exec through [`ExecRunner`], which the pod worker implements with CRI
//! `ExecSync` (pkg/probe/exec: a timeout is a failure, a runtime error unknown).
use std::{
    future::Future,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use tokio::net::TcpStream;

use super::{ProbeAction, probe::ProbeOutcome};

mod grpc;
mod http;
pub use grpc::grpc;
pub use http::http_get;

/// The User-Agent the kubelet's prober sends (`kube-probe/<major>.<minor>`).
pub const USER_AGENT: &str = "kube-probe/1.35";

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
        ProbeAction::Grpc { port, service } => grpc(target.pod_ip, *port, service, timeout).await,
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

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use tokio::net::TcpListener;

    use super::*;

    const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

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
