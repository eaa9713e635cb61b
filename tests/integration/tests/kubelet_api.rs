//! weir-kubelet as a binary against real containerd and the test API server:
//! the kubelet runs in the node namespace, reaches the API server through a
//! loopback relay, registers its Node, renews its Lease, runs a static pod
//! with a mirror pod and an API pod, survives SIGKILL without restarting
//! containers, terminates gracefully, and refuses anonymous API clients.
//! Needs root.
use std::{
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Node, Pod, Secret},
};
use kube::{Api, api::DeleteParams};
use serde_json::json;
use weir_integration::{
    api::{Cluster, Relay},
    containerd::Containerd,
    images::BUSYBOX,
    kubelet::{ConfigOptions, Kubelet, READ_ONLY_PORT, until, write_config},
};

const NODE: &str = "node-k";
/// The API server as the kubelet sees it, inside the node namespace.
const API_PORT: u16 = 6443;

fn httpd(text: &str) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!("mkdir -p /www && echo {text} > /www/index.html && exec httpd -f -p 8080 -h /www"),
    ]
}

fn running_ip(pod: &Pod) -> Option<String> {
    let st = pod.status.as_ref()?;
    (st.phase.as_deref() == Some("Running")).then(|| st.pod_ip.clone())?
}

fn container_ids(pod: &Pod) -> Vec<(String, i32)> {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .map(|c| (c.container_id.clone().unwrap_or_default(), c.restart_count))
        .collect()
}

fn curl_in(ctrd: &Containerd, url: &str, extra: &[&str]) -> Result<(String, String)> {
    let out = ctrd
        .node
        .command(Path::new("curl"))
        .args(["-sS", "--max-time", "5", "-w", "\n%{http_code}"])
        .args(extra)
        .arg(url)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", ""));
    Ok((body.to_owned(), code.to_owned()))
}

#[test]
fn kubelet_registers_runs_static_and_api_pods_and_survives_sigkill() -> Result<()> {
    let ctrd = Containerd::start()?;
    let cluster = Cluster::start()?;
    let _relay = Relay::start_in_netns(&ctrd.node, API_PORT, cluster.server.addr())?;
    let kubeconfig = cluster.kubeconfig_via(
        &format!("https://127.0.0.1:{API_PORT}"),
        &ctrd.dir.join("kc"),
    )?;
    let static_dir = ctrd.dir.join("manifests");
    std::fs::create_dir_all(&static_dir)?;
    std::fs::write(
        static_dir.join("web.yaml"),
        serde_json::to_string(&json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web"},
            // httpd is PID 1 without a SIGTERM handler: only the grace
            // period's end stops it.
            "spec": {"terminationGracePeriodSeconds": 2,
                     "containers": [{"name": "httpd", "image": BUSYBOX,
                                      "imagePullPolicy": "IfNotPresent",
                                      "command": httpd("static")}]},
        }))?,
    )?;
    let config = write_config(
        &ctrd,
        &ConfigOptions {
            static_dir: Some(static_dir.clone()),
            read_only_port: Some(READ_ONLY_PORT),
            ..ConfigOptions::default()
        },
    )?;
    let mut kubelet = Kubelet::start(&ctrd, &config, Some(&kubeconfig), NODE)?;

    // The Node registers with what the machine and the runtime say.
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let node = until(&kubelet, "Node registered", Duration::from_secs(30), || {
        Ok(cluster.block_on(nodes.get_opt(NODE))?)
    })?;
    let status = node.status.clone().unwrap_or_default();
    let info = status.node_info.clone().context("nodeInfo")?;
    ensure!(
        info.container_runtime_version.starts_with("containerd://"),
        "{info:?}"
    );
    let cap = status.capacity.clone().unwrap_or_default();
    ensure!(
        cap.get("pods").map(|q| q.0.as_str()) == Some("110"),
        "{cap:?}"
    );
    ensure!(
        cap.contains_key("cpu") && cap.contains_key("memory"),
        "{cap:?}"
    );
    let port = status
        .daemon_endpoints
        .and_then(|d| d.kubelet_endpoint)
        .map(|e| e.port);
    ensure!(port == Some(10250), "{port:?}");

    // The static pod runs and shows up as a mirror pod with its status.
    let pods: Api<Pod> = cluster.api("default");
    let mirror = until(
        &kubelet,
        "mirror pod Running",
        Duration::from_secs(60),
        || {
            Ok(cluster
                .block_on(pods.get_opt(&format!("web-{NODE}")))?
                .filter(|p| running_ip(p).is_some()))
        },
    )?;
    let annotations = mirror.metadata.annotations.clone().unwrap_or_default();
    ensure!(
        annotations.contains_key("kubernetes.io/config.mirror"),
        "{annotations:?}"
    );
    let owner = mirror.metadata.owner_references.clone().unwrap_or_default();
    ensure!(
        owner.iter().any(|o| o.kind == "Node" && o.name == NODE),
        "{owner:?}"
    );
    let static_ip = running_ip(&mirror).unwrap_or_default();
    ensure!(static_ip.starts_with("10.88.0."), "{static_ip}");
    let (body, code) = curl_in(&ctrd, &format!("http://{static_ip}:8080/"), &[])?;
    ensure!(code == "200" && body.trim() == "static", "{code} {body}");

    // An API pod bound to this node: Running and Ready reach the API server.
    let hostdir = ctrd.dir.join("prestop");
    std::fs::create_dir_all(&hostdir)?;
    // Its page comes from a ConfigMap volume; readiness needs a Secret as a
    // volume and as env too (both read through the API).
    cluster.upsert(
        &cluster.api::<ConfigMap>("default"),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "site", "namespace": "default"},
               "data": {"index.html": "api from configmap\n"}}),
    )?;
    cluster.upsert(
        &cluster.api::<Secret>("default"),
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "token", "namespace": "default"},
               "data": {"token": "czNjcmV0"}}),
    )?;
    let ready_check = r#"grep -qx s3cret /secret/token && [ "$TOKEN" = s3cret ] && wget -qO- http://127.0.0.1:8080/ >/dev/null"#;
    cluster.upsert(
        &pods,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "api-web", "namespace": "default"},
            "spec": {
                "nodeName": NODE,
                "terminationGracePeriodSeconds": 30,
                "volumes": [
                    {"name": "out", "hostPath": {"path": hostdir.display().to_string()}},
                    {"name": "site", "configMap": {"name": "site"}},
                    {"name": "token", "secret": {"secretName": "token"}},
                ],
                "containers": [{
                    "name": "httpd", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                    "command": ["httpd", "-f", "-p", "8080", "-h", "/www"],
                    "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "token", "key": "token"}}}],
                    "volumeMounts": [
                        {"name": "out", "mountPath": "/out"},
                        {"name": "site", "mountPath": "/www", "readOnly": true},
                        {"name": "token", "mountPath": "/secret", "readOnly": true},
                    ],
                    "readinessProbe": {"exec": {"command": ["sh", "-c", ready_check]}, "periodSeconds": 1},
                    "lifecycle": {"preStop": {"exec": {"command": ["sh", "-c", "echo bye > /out/prestop"]}}},
                }],
            },
        }),
    )?;
    let api_pod = until(&kubelet, "API pod Ready", Duration::from_secs(60), || {
        let p = cluster.block_on(pods.get("api-web"))?;
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        Ok((ready && running_ip(&p).is_some()).then_some(p))
    })?;
    let before = container_ids(&api_pod);
    ensure!(
        before.len() == 1 && before[0].0.starts_with("containerd://") && before[0].1 == 0,
        "{before:?}"
    );
    let api_ip = running_ip(&api_pod).unwrap_or_default();
    let (body, _) = curl_in(&ctrd, &format!("http://{api_ip}:8080/"), &[])?;
    ensure!(body.trim() == "api from configmap", "{body}");

    // The kubelet API refuses anonymous clients; the read-only port serves /pods.
    let (body, code) = curl_in(&ctrd, "https://127.0.0.1:10250/pods", &["-k"])?;
    ensure!(code == "401" && !body.contains("api-web"), "{code} {body}");
    let (body, code) = curl_in(&ctrd, "http://127.0.0.1:10255/pods", &[])?;
    ensure!(code == "200" && body.contains("api-web"), "{code}");

    // The Lease exists, is owned by the Node and renews about every 10 s.
    let leases: Api<Lease> = cluster.api("kube-node-lease");
    let renew = || -> Result<Option<String>> {
        let Some(l) = cluster.block_on(leases.get_opt(NODE))? else {
            return Ok(None);
        };
        let owners = l.metadata.owner_references.unwrap_or_default();
        ensure!(
            owners.iter().any(|o| o.kind == "Node" && o.name == NODE),
            "{owners:?}"
        );
        Ok(l.spec.and_then(|s| s.renew_time).map(|t| format!("{t:?}")))
    };
    let first = until(&kubelet, "Lease", Duration::from_secs(20), &renew)?;
    let second = until(&kubelet, "Lease renewal", Duration::from_secs(15), || {
        Ok(renew()?.filter(|t| *t != first))
    })?;
    let t0 = Instant::now();
    until(
        &kubelet,
        "second Lease renewal",
        Duration::from_secs(15),
        || Ok(renew()?.filter(|t| *t != second)),
    )?;
    let gap = t0.elapsed();
    ensure!(
        gap > Duration::from_secs(7) && gap < Duration::from_secs(13),
        "renewed {gap:?} apart"
    );

    // SIGKILL and restart: containers keep running and are adopted as they are.
    kubelet.kill9();
    let (body, _) = curl_in(&ctrd, &format!("http://{api_ip}:8080/"), &[])?;
    ensure!(
        body.trim() == "api from configmap",
        "pods serve while the kubelet is dead: {body}"
    );
    kubelet.spawn()?;
    std::thread::sleep(Duration::from_secs(6));
    let after = container_ids(&cluster.block_on(pods.get("api-web"))?);
    ensure!(after == before, "no restart: {before:?} -> {after:?}");
    let mirror_after = cluster.block_on(pods.get(&format!("web-{NODE}")))?;
    ensure!(running_ip(&mirror_after) == Some(static_ip.clone()));

    // Graceful delete: preStop runs, httpd (PID 1, no SIGTERM handler)
    // outlives SIGTERM until the grace period ends, then the kubelet deletes
    // the pod for good.
    let t0 = Instant::now();
    cluster.block_on(pods.delete("api-web", &DeleteParams::default().grace_period(4)))?;
    until(&kubelet, "API pod deleted", Duration::from_secs(30), || {
        Ok(cluster
            .block_on(pods.get_opt("api-web"))?
            .is_none()
            .then_some(()))
    })?;
    let took = t0.elapsed();
    ensure!(
        took >= Duration::from_secs(3),
        "grace period honoured: gone after {took:?}"
    );
    ensure!(
        std::fs::read_to_string(hostdir.join("prestop"))?.trim() == "bye",
        "preStop ran"
    );
    let (_, code) = curl_in(&ctrd, &format!("http://{api_ip}:8080/"), &[])?;
    ensure!(code != "200", "the container is gone");

    // Removing the static file stops the pod and deletes the mirror pod.
    std::fs::remove_file(static_dir.join("web.yaml"))?;
    until(
        &kubelet,
        "mirror pod deleted",
        Duration::from_secs(30),
        || {
            Ok(cluster
                .block_on(pods.get_opt(&format!("web-{NODE}")))?
                .is_none()
                .then_some(()))
        },
    )?;
    Ok(())
}

/// Issue 12 item 8: a pod force-deleted from the API while the kubelet is
/// down is gone from the desired state; the restarted kubelet must stop and
/// remove its sandbox once it has its first complete pod list (the kubelet's
/// `HandlePodCleanups`), and leave the pods it still runs alone.
#[test]
fn pods_deleted_while_the_kubelet_was_down_are_reaped() -> Result<()> {
    use weir_integration::containerd::block_on;
    use weir_kubelet::cri::{CriRuntime, Runtime as _, SandboxFilter};

    let ctrd = Containerd::start()?;
    let cluster = Cluster::start()?;
    let _relay = Relay::start_in_netns(&ctrd.node, API_PORT, cluster.server.addr())?;
    let kubeconfig = cluster.kubeconfig_via(
        &format!("https://127.0.0.1:{API_PORT}"),
        &ctrd.dir.join("kc"),
    )?;
    let config = write_config(&ctrd, &ConfigOptions::default())?;
    let mut kubelet = Kubelet::start(&ctrd, &config, Some(&kubeconfig), NODE)?;
    let pods: Api<Pod> = cluster.api("default");
    for name in ["orphan", "keeper"] {
        cluster.upsert(
            &pods,
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                         "containers": [{"name": "c", "image": BUSYBOX,
                                          "imagePullPolicy": "IfNotPresent",
                                          "command": ["sleep", "1000"]}]},
            }),
        )?;
    }
    let sandboxes = |name: &'static str| -> Result<Vec<String>> {
        let ep = ctrd.endpoint();
        let filter = SandboxFilter {
            labels: [("io.kubernetes.pod.name".to_owned(), name.to_owned())].into(),
            ..Default::default()
        };
        let list =
            block_on(async move { CriRuntime::new(&ep)?.list_pod_sandboxes(&filter).await })?;
        Ok(list.into_iter().map(|s| s.id).collect())
    };
    let mut keeper_ids = Vec::new();
    for name in ["orphan", "keeper"] {
        let p = until(
            &kubelet,
            &format!("{name} Running"),
            Duration::from_secs(60),
            || {
                Ok(cluster
                    .block_on(pods.get_opt(name))?
                    .filter(|p| running_ip(p).is_some()))
            },
        )?;
        if name == "keeper" {
            keeper_ids = container_ids(&p);
        }
    }
    let keeper_sandboxes = sandboxes("keeper")?;

    kubelet.kill9();
    cluster.block_on(pods.delete("orphan", &DeleteParams::default().grace_period(0)))?;
    ensure!(
        cluster.block_on(pods.get_opt("orphan"))?.is_none(),
        "force delete took effect"
    );
    ensure!(!sandboxes("orphan")?.is_empty(), "the orphan runs on");
    kubelet.spawn()?;
    until(
        &kubelet,
        "the orphan's sandbox reaped",
        Duration::from_secs(30),
        || Ok(sandboxes("orphan")?.is_empty().then_some(())),
    )?;
    ensure!(
        sandboxes("keeper")? == keeper_sandboxes,
        "the keeper's sandbox kept"
    );
    let keeper = cluster.block_on(pods.get("keeper"))?;
    ensure!(
        container_ids(&keeper) == keeper_ids,
        "the keeper was not restarted: {keeper_ids:?} -> {:?}",
        container_ids(&keeper)
    );
    Ok(())
}
