//! Issue 15, service-account tokens and projected volumes: a pod that runs
//! the real `kubectl` in-cluster (no kubeconfig, only what the kubelet
//! mounts at /var/run/secrets/kubernetes.io/serviceaccount) lists pods with
//! its bound token; the token rotates while the pod runs; `envFrom` and a
//! downwardAPI volume show what they should; and once the pod is deleted,
//! its last token is refused. Real containerd, the test API server (with
//! its ServiceAccount admission, TokenRequest and kube-root-ca.crt) and
//! weir-kubelet; needs root.
use std::{path::Path, time::Duration};

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Api;
use serde_json::json;
use weir_integration::{
    api::{Cluster, Relay},
    containerd::Containerd,
    images::{self, Image},
    kubelet::{ConfigOptions, Kubelet, until, write_config},
};
use weir_test_apiserver::Options;

const NODE: &str = "node-t";
const API_PORT: u16 = 6443;
const KUBECTL_IMAGE: &str = "weir.test/kubectl:1";
/// Lifetime the server grants whatever is asked: the kubelet renews at 80%.
const TOKEN_LIFETIME: Duration = Duration::from_secs(30);

/// busybox with the machine's kubectl (a static Go binary) on the PATH.
fn kubectl_image() -> Result<Image> {
    let kubectl = which("kubectl").context("kubectl is not on PATH")?;
    let bin = std::fs::read(&kubectl).with_context(|| format!("reading {}", kubectl.display()))?;
    images::busybox_plus(KUBECTL_IMAGE, &[("bin/kubectl", 0o755, &bin)])
}

fn which(cmd: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(cmd))
        .find(|p| p.is_file())
        .and_then(|p| std::fs::canonicalize(p).ok())
}

fn read(dir: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(name)).ok()
}

#[test]
fn an_in_cluster_kubectl_uses_its_bound_rotating_token() -> Result<()> {
    let ctrd = Containerd::start()?;
    let cluster = Cluster::start_with(Options {
        max_token_expiration: Some(TOKEN_LIFETIME),
        ..Options::default()
    })?;
    let _relay = Relay::start_in_netns(&ctrd.node, API_PORT, cluster.server.addr())?;
    let kubeconfig = cluster.kubeconfig_via(
        &format!("https://127.0.0.1:{API_PORT}"),
        &ctrd.dir.join("kc"),
    )?;
    let images_dir = ctrd.dir.join("images-kubectl");
    std::fs::create_dir_all(&images_dir)?;
    images::import(
        &ctrd.socket,
        ctrd.snapshotter,
        &images_dir,
        &kubectl_image()?,
    )?;
    let config = write_config(&ctrd, &ConfigOptions::default())?;
    let kubelet = Kubelet::start(&ctrd, &config, Some(&kubeconfig), NODE)?;
    let out = ctrd.dir.join("out");
    std::fs::create_dir_all(&out)?;

    cluster.upsert(
        &cluster.api::<ConfigMap>("default"),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "app", "namespace": "default"},
               "data": {"MODE": "fast", "LEVEL": "3"}}),
    )?;
    // Every step leaves its result in /out, renamed into place whole.
    let script = "export HOME=/tmp; while true; do \
        kubectl get pods -o name > /out/p.tmp 2>&1; echo rc=$? >> /out/p.tmp; mv /out/p.tmp /out/pods; \
        cat /var/run/secrets/kubernetes.io/serviceaccount/token > /out/t.tmp; mv /out/t.tmp /out/token; \
        env | grep ^APP_ | sort > /out/e.tmp; mv /out/e.tmp /out/env; \
        cat /etc/info/labels > /out/l.tmp; mv /out/l.tmp /out/labels; \
        sleep 1; done";
    let pods: Api<Pod> = cluster.api("default");
    cluster.upsert(
        &pods,
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "client", "namespace": "default", "labels": {"app": "client"}},
            "spec": {"nodeName": NODE, "hostNetwork": true, "terminationGracePeriodSeconds": 1,
                     "volumes": [
                         {"name": "out", "hostPath": {"path": out}},
                         {"name": "info", "downwardAPI": {"items": [
                             {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}],
                     "containers": [{"name": "c", "image": KUBECTL_IMAGE,
                         "command": ["sh", "-c", script],
                         // What the `kubernetes` Service's env vars would say;
                         // the relay puts the API server there.
                         "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                                 {"name": "KUBERNETES_SERVICE_PORT", "value": API_PORT.to_string()},
                                 {"name": "APP_LEVEL", "value": "9"}],
                         "envFrom": [{"prefix": "APP_", "configMapRef": {"name": "app"}}],
                         "volumeMounts": [{"name": "out", "mountPath": "/out"},
                                          {"name": "info", "mountPath": "/etc/info"}]}]}
        }),
    )?;

    // The API server's ServiceAccount admission gave the pod its token volume.
    let created = cluster.block_on(pods.get("client"))?;
    let spec = created.spec.context("pod without spec")?;
    ensure!(spec.service_account_name.as_deref() == Some("default"));
    ensure!(
        spec.volumes
            .iter()
            .flatten()
            .any(|v| v.name.starts_with("kube-api-access-") && v.projected.is_some()),
        "no kube-api-access volume: {:?}",
        spec.volumes
    );

    // A whole round of the loop: every file written at least once.
    let listed = until(
        &kubelet,
        "kubectl in the pod lists pods",
        Duration::from_secs(90),
        || {
            let round = ["token", "env", "labels"]
                .iter()
                .all(|f| out.join(f).exists());
            Ok(read(&out, "pods")
                .filter(|p| round && p.contains("pod/client") && p.contains("rc=0")))
        },
    )?;
    println!("in-cluster kubectl: {}", listed.trim().replace('\n', " | "));
    let env = read(&out, "env").unwrap_or_default();
    ensure!(
        env == "APP_LEVEL=9\nAPP_MODE=fast\n",
        "envFrom with env overriding it: {env:?}"
    );
    ensure!(
        read(&out, "labels").as_deref() == Some("app=\"client\""),
        "downwardAPI labels: {:?}",
        read(&out, "labels")
    );

    // Renewed at 80% of its 30 s: a new token in the running container, and
    // kubectl keeps working with it.
    let first = read(&out, "token").context("no token copied")?;
    let rotated = until(
        &kubelet,
        "the token rotates",
        Duration::from_secs(60),
        || Ok(read(&out, "token").filter(|t| !t.is_empty() && *t != first)),
    )?;
    until(
        &kubelet,
        "kubectl works with the new token",
        Duration::from_secs(30),
        || {
            Ok(read(&out, "pods")
                .filter(|p| p.contains("rc=0"))
                .map(|_| ()))
        },
    )?;
    println!("token rotated within its {TOKEN_LIFETIME:?} lifetime");
    let live = read(&out, "token").unwrap_or(rotated.clone());
    let status = bearer_list(&cluster, live.trim())?;
    ensure!(status == 200, "the running pod's token got {status}");

    // Deleted: the pod's tokens die with it.
    cluster.delete(&pods, "client")?;
    until(&kubelet, "the pod is gone", Duration::from_secs(60), || {
        Ok(cluster
            .block_on(pods.get_opt("client"))?
            .is_none()
            .then_some(()))
    })?;
    let last = read(&out, "token").unwrap_or(rotated);
    let status = bearer_list(&cluster, last.trim())?;
    ensure!(status == 401, "a deleted pod's token got {status}, not 401");
    Ok(())
}

/// Lists pods with only `token`; the HTTP status.
fn bearer_list(cluster: &Cluster, token: &str) -> Result<u16> {
    let mut config = cluster.block_on(kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(cluster.kubeconfig())?,
        &kube::config::KubeConfigOptions::default(),
    ))?;
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.to_owned().into()),
        ..Default::default()
    };
    // The client's buffer task needs the runtime.
    let listed = cluster.block_on(async {
        let pods: Api<Pod> = Api::namespaced(kube::Client::try_from(config)?, "default");
        anyhow::Ok(pods.list(&Default::default()).await)
    })?;
    match listed {
        Ok(_) => Ok(200),
        Err(kube::Error::Api(s)) => Ok(s.code),
        Err(e) => Err(e.into()),
    }
}
