//! A node agent's pod on a real containerd: host network, privilege and
//! capabilities, hostPath types, the node's resolv.conf, a named-port probe on
//! the node's address, gRPC probes (`grpc_probe`), and mount propagation both
//! ways.
//!
//! The node's mount namespace here is containerd's own (it runs under
//! `unshare --mount`, and the root namespace's `/` is private, so nothing
//! propagates between the two): the shared host directory and the mounts
//! "made on the host" are made there, through its /proc/<pid>/ns/mnt, and
//! never touch the root mount namespace. All of it sits in the test's work
//! directory and is unmounted on drop, failed test or not.
use std::{os::unix::fs::MetadataExt as _, path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context as _, Result, ensure};
use serde_json::json;
use tokio::sync::mpsc;
use weir_integration::{
    containerd::{Containerd, node_sh},
    images,
};
use weir_kubelet::worker::Worker;

use super::support::*;

const MIN: Duration = Duration::from_secs(60);

/// A directory that is a shared mount in the node's mount namespace, with
/// whatever gets mounted below it unmounted on drop.
struct SharedHostDir {
    /// containerd's pid: the node's mount namespace is its.
    pid: u32,
    dir: PathBuf,
}

impl SharedHostDir {
    fn new(ctrd: &Containerd, name: &str) -> Result<Self> {
        let d = Self {
            pid: ctrd.pid(),
            dir: ctrd.dir.join(name),
        };
        std::fs::create_dir_all(&d.dir)?;
        ctrd.share_host_dir(&d.dir)?;
        Ok(d)
    }

    /// Runs `script` in the node's mount namespace.
    fn sh(&self, script: &str) -> Result<String> {
        node_sh(self.pid, script)
    }
}

impl Drop for SharedHostDir {
    fn drop(&mut self) {
        // Recursive and lazy: the tmpfs mounts below it go too, even while a
        // container still holds them.
        if std::path::Path::new(&format!("/proc/{}", self.pid)).exists() {
            let _ = self.sh(&format!("umount -R -l {}", self.dir.display()));
        }
    }
}

fn pod_status_message(s: &k8s_openapi::api::core::v1::PodStatus, name: &str) -> Option<String> {
    container(s, name)
        .state
        .as_ref()?
        .waiting
        .as_ref()?
        .message
        .clone()
}

async fn node_agent_pod(ctrd: &Containerd, host: &SharedHostDir, k: &Kubelet) -> Result<()> {
    let cri = ctrd.runtime();
    let d = host.dir.display().to_string();
    let lock = ctrd.dir.join("node-run/xtables.lock");
    std::fs::create_dir_all(lock.parent().context("parent")?)?;
    let p = pod(
        "agent",
        json!({
            "nodeName": "node1",
            "hostNetwork": true,
            "dnsPolicy": "Default",
            "serviceAccountName": "weir",
            "priorityClassName": "system-node-critical",
            "tolerations": [{"operator": "Exists"}],
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "volumes": [
                {"name": "node", "hostPath": {"path": d, "type": "Directory"}},
                {"name": "state", "hostPath": {"path": ctrd.dir.join("node-run/state"), "type": "DirectoryOrCreate"}},
                {"name": "lock", "hostPath": {"path": lock, "type": "FileOrCreate"}},
            ],
            "containers": [
                {
                    "name": "agent", "image": images::BUSYBOX, "imagePullPolicy": "Never",
                    "command": sh("mkdir -p /tmp/www && echo ok > /tmp/www/index.html && exec httpd -f -p 18080 -h /tmp/www"),
                    "securityContext": {"privileged": true},
                    "env": [
                        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
                    ],
                    "ports": [{"name": "healthz", "containerPort": 18080}],
                    "readinessProbe": {"httpGet": {"path": "/", "port": "healthz"}, "periodSeconds": 1},
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
                    "volumeMounts": [
                        {"name": "node", "mountPath": "/host", "mountPropagation": "HostToContainer"},
                        {"name": "node", "mountPath": "/bidi", "mountPropagation": "Bidirectional"},
                        {"name": "state", "mountPath": "/state"},
                        {"name": "lock", "mountPath": "/run/xtables.lock"},
                    ],
                },
                {
                    // Capabilities without privilege, and a private view of
                    // the same directory: it never sees later host mounts.
                    "name": "caps", "image": images::BUSYBOX, "imagePullPolicy": "Never",
                    "command": sh("exec sleep 1000"),
                    "securityContext": {
                        "allowPrivilegeEscalation": false,
                        "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]},
                        "appArmorProfile": {"type": "Unconfined"},
                        "seLinuxOptions": {"type": "spc_t", "level": "s0"},
                    },
                    "volumeMounts": [{"name": "node", "mountPath": "/host"}],
                },
            ],
        }),
    );
    let uid = uid_of(&p);
    k.events.send(upsert(&p)).await?;
    let s = k
        .rec
        .wait(&uid, MIN, "Running and Ready", |s| {
            phase(s) == "Running" && condition(s, "Ready")
        })
        .await?;
    ensure!(
        s.pod_ip.as_deref() == Some("127.0.0.1"),
        "a host-network pod has the node's IP: {:?}",
        s.pod_ip
    );
    let agent = cri_id(&s, "agent");
    let caps = cri_id(&s, "caps");

    // The node's network namespace, not one of the pod's own.
    let node_ns = std::fs::metadata(ctrd.node.path())?.ino();
    for id in [&agent, &caps] {
        let (_, ns) = exec(&cri, id, "readlink /proc/self/ns/net").await?;
        ensure!(ns.trim() == format!("net:[{node_ns}]"), "{id}: {ns}");
    }
    let (_, env) = exec(&cri, &agent, "echo $NODE_NAME $POD_NAMESPACE $SA").await?;
    ensure!(env.trim() == "node1 default weir", "{env}");
    let (_, resolv) = exec(&cri, &agent, "cat /etc/resolv.conf").await?;
    ensure!(
        resolv.contains("nameserver 192.0.2.53") && resolv.contains("search node.example"),
        "dnsPolicy Default gives the node's resolv.conf: {resolv}"
    );
    // Privileged: every capability the node has (SYS_ADMIN among them); the
    // other exactly what it added (NET_ADMIN 12, NET_RAW 13), no_new_privs set.
    let caps_of = |status: &str| {
        let hex = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .unwrap_or_default();
        u64::from_str_radix(hex.trim(), 16).unwrap_or(0)
    };
    let (_, status) = exec(&cri, &agent, "cat /proc/self/status").await?;
    ensure!(caps_of(&status) & (1 << 21) != 0, "privileged: {status}");
    let (_, status) = exec(&cri, &caps, "cat /proc/self/status").await?;
    ensure!(
        caps_of(&status) == (1 << 12) | (1 << 13) && status.contains("NoNewPrivs:\t1"),
        "capabilities: {status}"
    );
    ensure!(
        lock.is_file() && ctrd.dir.join("node-run/state").is_dir(),
        "FileOrCreate and DirectoryOrCreate made their paths"
    );

    // HostToContainer: a mount made on the node after the container started.
    host.sh(&format!(
        "mkdir -p {d}/from-host && mount -t tmpfs -o size=1m node {d}/from-host && echo node-side > {d}/from-host/file"
    ))?;
    let (code, seen) = exec(&cri, &agent, "cat /host/from-host/file").await?;
    ensure!(
        code == 0 && seen.trim() == "node-side",
        "HostToContainer: {code} {seen:?}"
    );
    let (_, private) = exec(&cri, &caps, "ls /host/from-host").await?;
    ensure!(
        private.trim().is_empty(),
        "a private mount saw it: {private:?}"
    );

    // Bidirectional: a mount made in the container shows on the node.
    let (code, out) = exec(
        &cri,
        &agent,
        "mkdir -p /bidi/from-pod && mount -t tmpfs -o size=1m pod /bidi/from-pod && echo pod-side > /bidi/from-pod/file",
    )
    .await?;
    ensure!(code == 0, "mount in the container: {out}");
    let on_node = host.sh(&format!("cat {d}/from-pod/file"))?;
    ensure!(on_node.trim() == "pod-side", "Bidirectional: {on_node:?}");
    let mounts = host.sh("cat /proc/self/mountinfo")?;
    ensure!(
        mounts.contains(&format!("{d}/from-pod ")),
        "the node's mount table lacks {d}/from-pod"
    );
    Ok(())
}

/// containerd refuses HostToContainer from a source that is neither shared
/// nor slave; the container waits with the runtime's reason.
async fn propagation_needs_a_shared_source(ctrd: &Containerd, k: &Kubelet) -> Result<()> {
    let plain = ctrd.dir.join("not-shared");
    std::fs::create_dir_all(&plain)?;
    let p = pod(
        "unshared",
        json!({
            "hostNetwork": true,
            "volumes": [{"name": "v", "hostPath": {"path": plain, "type": "Directory"}}],
            "containers": [{"name": "c", "image": images::BUSYBOX, "command": sh("exec sleep 1000"),
                "volumeMounts": [{"name": "v", "mountPath": "/v", "mountPropagation": "HostToContainer"}]}],
        }),
    );
    let uid = uid_of(&p);
    k.events.send(upsert(&p)).await?;
    let s = k
        .rec
        .wait(&uid, MIN, "a waiting message", |s| {
            pod_status_message(s, "c").is_some_and(|m| !m.is_empty())
        })
        .await?;
    let msg = pod_status_message(&s, "c").unwrap_or_default();
    let reason = container(&s, "c")
        .state
        .as_ref()
        .and_then(|st| st.waiting.as_ref())
        .and_then(|w| w.reason.clone());
    eprintln!("unshared source: {reason:?}: {msg}");
    ensure!(
        msg.contains("is not a shared or slave mount"),
        "{reason:?}: {msg}"
    );
    Ok(())
}

#[test]
fn node_agent_pods_on_the_host_network() -> Result<()> {
    weir_integration::sweep::sweep();
    let ctrd = Containerd::start()?;
    // Dropped before `ctrd`: its mounts go while containerd's namespace lives.
    let host = SharedHostDir::new(&ctrd, "node-shared")?;
    let resolv = ctrd.dir.join("node-resolv.conf");
    std::fs::write(&resolv, "nameserver 192.0.2.53\nsearch node.example\n")?;
    on_node(&ctrd, || async {
        let mut cfg = worker_config(&ctrd);
        // The node's address as probes and status see it for host-network pods.
        cfg.node_ip = "127.0.0.1".parse().ok();
        cfg.resolv_conf = resolv.clone();
        let rec = Arc::new(Recorder::default());
        let (events, rx) = mpsc::channel(64);
        let worker = Worker::spawn(Arc::new(ctrd.runtime()), cfg, rec.clone(), rx);
        let k = Kubelet {
            worker,
            events,
            rec,
        };
        let r = tokio::join!(
            node_agent_pod(&ctrd, &host, &k),
            propagation_needs_a_shared_source(&ctrd, &k),
            super::grpc_probe::grpc_probes_follow_the_health_server(&k),
        );
        r.0.context("node agent pod")?;
        r.1.context("unshared source")?;
        r.2.context("grpc probes")?;
        Ok(())
    })
}
