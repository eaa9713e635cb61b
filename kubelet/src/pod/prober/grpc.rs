//! `grpc` probes as pkg/probe/grpc: the gRPC health protocol's `Check`
//! (grpc.health.v1.Health) over plaintext HTTP/2 to the pod IP, with the
//! kubelet's User-Agent. Success only for `SERVING`; everything else,
//! a dial that does not complete included, is a failure with the kubelet's
//! message.
use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use tonic::{Code, transport::Endpoint};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use super::USER_AGENT;
use crate::pod::probe::ProbeOutcome;

pub async fn grpc(pod_ip: IpAddr, port: u16, service: &str, timeout: Duration) -> ProbeOutcome {
    let addr = SocketAddr::new(pod_ip, port);
    let failure = |message: String| ProbeOutcome::Failure { message };
    let endpoint = match Endpoint::from_shared(format!("http://{addr}"))
        .and_then(|e| e.user_agent(USER_AGENT))
    {
        Ok(e) => e.connect_timeout(timeout),
        Err(e) => return failure(format!("invalid gRPC target {addr}: {e}")),
    };
    // The kubelet dials and checks within one timeout each.
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return failure(format!(
                "timeout: failed to connect service {addr:?} within {timeout:?}: {e}"
            ));
        }
        Err(_) => {
            return failure(format!(
                "timeout: failed to connect service {addr:?} within {timeout:?}"
            ));
        }
    };
    let request = HealthCheckRequest {
        service: service.to_owned(),
    };
    let mut client = HealthClient::new(channel);
    match tokio::time::timeout(timeout, client.check(request)).await {
        Err(_) => failure(format!(
            "timeout: health rpc did not complete within {timeout:?}"
        )),
        Ok(Err(status)) if status.code() == Code::Unimplemented => failure(format!(
            "this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
            status.message()
        )),
        Ok(Err(status)) if status.code() == Code::DeadlineExceeded => failure(format!(
            "timeout: health rpc did not complete within {timeout:?}"
        )),
        Ok(Err(status)) => failure(format!("health rpc probe failed: {status}")),
        Ok(Ok(resp)) => match resp.into_inner().status() {
            ServingStatus::Serving => ProbeOutcome::Success,
            other => failure(format!(
                "service unhealthy (responded with {:?})",
                other.as_str_name()
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use tokio::net::TcpListener;
    use tokio_stream::wrappers::TcpListenerStream;
    use tonic_health::{ServingStatus as Reported, server::health_reporter};

    use super::*;

    const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
    const SECOND: Duration = Duration::from_secs(1);

    /// A real tonic health server on a loopback port; the whole server and
    /// `shop.Cart` start SERVING, `shop.Cold` NOT_SERVING.
    async fn server() -> (u16, tonic_health::server::HealthReporter) {
        let (reporter, service) = health_reporter();
        reporter
            .set_service_status("shop.Cart", Reported::Serving)
            .await;
        reporter
            .set_service_status("shop.Cold", Reported::NotServing)
            .await;
        let l = TcpListener::bind((LOCAL, 0)).await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(l)),
        );
        (port, reporter)
    }

    #[tokio::test]
    async fn serving_services_pass_and_the_rest_fail_with_the_kubelets_messages() {
        let (port, reporter) = server().await;
        assert_eq!(grpc(LOCAL, port, "", SECOND).await, ProbeOutcome::Success);
        assert_eq!(
            grpc(LOCAL, port, "shop.Cart", SECOND).await,
            ProbeOutcome::Success
        );
        assert_eq!(
            grpc(LOCAL, port, "shop.Cold", SECOND).await,
            ProbeOutcome::Failure {
                message: "service unhealthy (responded with \"NOT_SERVING\")".into()
            }
        );
        // A service the server does not know: NOT_FOUND, a failed rpc.
        let out = grpc(LOCAL, port, "shop.Gone", SECOND).await;
        assert!(
            matches!(&out, ProbeOutcome::Failure { message } if message.starts_with("health rpc probe failed:")),
            "{out:?}"
        );
        // Turning unhealthy is seen on the next probe.
        reporter
            .set_service_status("shop.Cart", Reported::NotServing)
            .await;
        assert!(matches!(
            grpc(LOCAL, port, "shop.Cart", SECOND).await,
            ProbeOutcome::Failure { .. }
        ));
    }

    #[tokio::test]
    async fn nothing_listening_and_a_silent_server_are_failures() {
        let l = std::net::TcpListener::bind((LOCAL, 0)).unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let out = grpc(LOCAL, port, "", SECOND).await;
        assert!(
            matches!(&out, ProbeOutcome::Failure { message } if message.starts_with("timeout: failed to connect service")),
            "{out:?}"
        );

        // Accepts and never answers: the check times out, not the test.
        let silent = TcpListener::bind((LOCAL, 0)).await.unwrap();
        let port = silent.local_addr().unwrap().port();
        let held = tokio::spawn(async move {
            let mut conns = Vec::new();
            while let Ok((c, _)) = silent.accept().await {
                conns.push(c);
            }
        });
        let short = Duration::from_millis(300);
        let out = grpc(LOCAL, port, "", short).await;
        assert!(
            matches!(&out, ProbeOutcome::Failure { message } if message.starts_with("timeout:")),
            "{out:?}"
        );
        held.abort();
    }
}
