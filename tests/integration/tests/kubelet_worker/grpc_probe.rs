//! gRPC probes end to end: the worker probes a real gRPC health server (tonic
//! in this process, on the node's loopback) for a host-network pod on a real
//! containerd, and readiness and liveness follow what the server reports.
use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::{ServingStatus, server::health_reporter};
use weir_integration::images;

use super::support::*;

const MIN: Duration = Duration::from_secs(60);

/// Runs inside the node namespace (the worker's threads are there), so the
/// server listens on the node's loopback, where the worker's `node_ip`
/// sends host-network probes.
pub(crate) async fn grpc_probes_follow_the_health_server(k: &Kubelet) -> Result<()> {
    let (health, service) = health_reporter();
    health
        .set_service_status("", ServingStatus::NotServing)
        .await;
    health
        .set_service_status("shop.Live", ServingStatus::Serving)
        .await;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );

    let p = pod(
        "grpc",
        json!({
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": images::BUSYBOX, "command": sh("exec sleep 1000"),
                "readinessProbe": {"grpc": {"port": port}, "periodSeconds": 1},
                "livenessProbe": {"grpc": {"port": port, "service": "shop.Live"},
                                  "periodSeconds": 1, "failureThreshold": 1},
            }],
        }),
    );
    let uid = uid_of(&p);
    k.events.send(upsert(&p)).await?;
    k.rec
        .wait(&uid, MIN, "Running, not Ready", |s| {
            phase(s) == "Running" && !condition(s, "Ready")
        })
        .await?;
    // NOT_SERVING for a few periods: still not Ready, never restarted.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = k.rec.latest(&uid).unwrap_or_default();
    ensure!(!condition(&s, "Ready") && restarts(&s, "c") == 0);

    health.set_service_status("", ServingStatus::Serving).await;
    k.rec
        .wait(&uid, MIN, "Ready once SERVING", |s| condition(s, "Ready"))
        .await?;

    // The liveness service stops serving: the container is restarted.
    health
        .set_service_status("shop.Live", ServingStatus::NotServing)
        .await;
    k.rec
        .wait(&uid, MIN, "restarted by liveness", |s| {
            restarts(s, "c") >= 1
        })
        .await?;
    server.abort();
    Ok(())
}
