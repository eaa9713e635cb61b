//! The chart's pod, run for real ([`ChartNode`]): rendered by Helm's engine,
//! bound to a node, run by weir-kubelet on containerd from the image `cargo
//! xtask images` builds. The agent inside comes up, passes its probes through
//! the kubelet, programs a Service from the API server, and a pod on the node
//! reaches it.
use std::time::Duration;

use anyhow::{Result, ensure};
use serde_json::json;
use weir_integration::{
    chart_node::{ChartNode, NAMESPACE},
    helm, release_images,
};

const VIP: &str = "10.96.0.77";

#[test]
fn the_charts_pod_runs_under_weir_kubelet_and_serves_a_cluster_ip() -> Result<()> {
    let mut node = ChartNode::start()?;
    let docs = node.render(&json!({}))?;
    let image =
        &helm::object(&docs, "DaemonSet")?["spec"]["template"]["spec"]["containers"][0]["image"];
    ensure!(
        *image == release_images::reference("weir-agent"),
        "the chart's default image {image} is not the one `cargo xtask images` builds"
    );

    // The init container mounts nothing here (bpffs and cgroup2 are there
    // already) and exits 0; the agent is Ready only once its readiness probe
    // (its /healthz, through the kubelet) passes.
    let name = node.install(&json!({}))?;
    let agent = node.wait_ready(NAMESPACE, &name, Duration::from_secs(120))?;
    let status = agent.status.unwrap_or_default();
    let init = status.init_container_statuses.unwrap_or_default();
    ensure!(
        !init.is_empty()
            && init.iter().all(|s| s
                .state
                .as_ref()
                .and_then(|st| st.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0)),
        "init containers: {init:?}"
    );
    let main = status.container_statuses.unwrap_or_default();
    ensure!(
        main.iter().all(|s| s.ready && s.restart_count == 0),
        "agent container: {main:?}"
    );

    node.web_service(VIP)?;
    node.client_reaches("client", VIP, Duration::from_secs(60))?;
    let services = node.inspect_services()?;
    ensure!(services.contains(VIP), "inspect services:\n{services}");
    Ok(())
}
