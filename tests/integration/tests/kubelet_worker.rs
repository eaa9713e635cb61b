//! weir-kubelet's pod worker on a real containerd: pods reach Running with an
//! IP on the CNI bridge, probes restart and gate readiness, restart policies,
//! init containers, graceful deletion, adoption by a new worker after the old
//! one was dropped (a killed kubelet), and the standalone binary end to end.
//!
//! The worker runs in-process on threads moved into the node namespace, so
//! its httpGet probes reach pod IPs as the kubelet's would on the node.
use std::{
    collections::BTreeMap,
    fs::File,
    net::IpAddr,
    path::Path,
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use serde_json::json;
use weir_integration::{
    containerd::{Containerd, POD_GATEWAY},
    images,
};
use weir_kubelet::cri::{CriRuntime, Runtime as _, SandboxFilter};

// A directory module: cargo builds each file directly under tests/ as its own
// test, so the shared pieces live one level down.
#[path = "kubelet_worker/grpc_probe.rs"]
mod grpc_probe;
#[path = "kubelet_worker/log_rotation.rs"]
mod log_rotation;
#[path = "kubelet_worker/node_agent.rs"]
mod node_agent;
#[path = "kubelet_worker/security.rs"]
mod security;
#[path = "kubelet_worker/support.rs"]
mod support;
#[allow(clippy::wildcard_imports)]
use support::*;

const MIN: Duration = Duration::from_secs(60);

/// A pod reaches Running with an IP on the bridge, and its status says so.
async fn running_with_status(k: &Kubelet, cri: &CriRuntime) -> Result<()> {
    let p = pod(
        "web",
        json!({"containers": [{
            "name": "httpd", "image": images::BUSYBOX,
            "command": sh("mkdir -p /www && echo $GREETING > /www/index.html && exec httpd -f -p 8080 -h /www"),
            "env": [
                {"name": "GREETING", "value": "hello"},
                {"name": "MY_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            ],
            "ports": [{"containerPort": 8080}],
        }]}),
    );
    let uid = uid_of(&p);
    k.events.send(upsert(&p)).await?;
    let s = k
        .rec
        .wait(&uid, MIN, "Running and Ready", |s| {
            phase(s) == "Running" && condition(s, "Ready")
        })
        .await?;
    let ip: IpAddr = s.pod_ip.as_deref().context("podIP")?.parse()?;
    let IpAddr::V4(v4) = ip else {
        bail!("{ip} is not IPv4")
    };
    ensure!(
        v4.octets()[..3] == POD_GATEWAY.octets()[..3] && v4 != POD_GATEWAY,
        "{ip} outside 10.88.0.0/24"
    );
    ensure!(
        s.pod_ips
            .as_ref()
            .is_some_and(|l| l[0].ip == ip.to_string()),
        "{s:?}"
    );
    for c in [
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "Ready",
        "PodScheduled",
    ] {
        ensure!(condition(&s, c), "{c} not True: {:?}", s.conditions);
    }
    let c = container(&s, "httpd");
    ensure!(
        c.container_id
            .as_deref()
            .is_some_and(|i| i.starts_with("containerd://")),
        "{c:?}"
    );
    ensure!(
        !c.image_id.is_empty() && c.image == images::BUSYBOX,
        "{c:?}"
    );
    ensure!(
        c.started == Some(true) && c.ready && c.restart_count == 0,
        "{c:?}"
    );
    ensure!(
        c.state.as_ref().and_then(|s| s.running.as_ref()).is_some(),
        "{c:?}"
    );
    ensure!(s.start_time.is_some() && s.qos_class.as_deref() == Some("BestEffort"));
    // The fieldRef saw the pod IP, and the pod serves on it.
    let id = cri_id(&s, "httpd");
    let (_, env_ip) = exec(cri, &id, "echo -n $MY_IP").await?;
    ensure!(env_ip == ip.to_string(), "MY_IP={env_ip:?}, podIP {ip}");
    let (_, resolv) = exec(cri, &id, "cat /etc/resolv.conf").await?;
    ensure!(
        resolv.contains("nameserver 10.96.0.10") && resolv.contains("default.svc.cluster.local"),
        "{resolv}"
    );
    let view = k.worker.view();
    let listed = view.pods();
    ensure!(
        listed
            .iter()
            .any(|p| uid_of(p) == uid && p.status.as_ref().is_some_and(|s| phase(s) == "Running")),
        "PodsView: {listed:?}"
    );
    let c = view
        .container("default", "web", "httpd")
        .context("container in the view")?;
    ensure!(c.running && !c.id.is_empty(), "{c:?}");
    let log = c.log.context("log path")?;
    ensure!(log.exists(), "{} missing", log.display());
    Ok(())
}

/// An exec liveness failure kills the container; restarts back off.
async fn liveness_restarts(k: &Kubelet) -> Result<()> {
    let p = pod(
        "liveness",
        json!({"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "c", "image": images::BUSYBOX,
            "command": sh("touch /tmp/alive; sleep 2; rm /tmp/alive; exec sleep 1000"),
            "livenessProbe": {"exec": {"command": ["cat", "/tmp/alive"]},
                               "periodSeconds": 1, "failureThreshold": 1},
        }]}),
    );
    let uid = uid_of(&p);
    k.events.send(upsert(&p)).await?;
    let first = Instant::now();
    k.rec
        .wait(&uid, MIN, "restartCount 1", |s| restarts(s, "c") >= 1)
        .await?;
    let one = Instant::now();
    let s = k
        .rec
        .wait(&uid, MIN, "CrashLoopBackOff", |s| {
            container(s, "c")
                .state
                .as_ref()
                .and_then(|st| st.waiting.as_ref())
                .is_some_and(|w| w.reason.as_deref() == Some("CrashLoopBackOff"))
        })
        .await?;
    let last = container(&s, "c")
        .last_state
        .as_ref()
        .and_then(|l| l.terminated.as_ref())
        .context("lastState.terminated")?;
    ensure!(last.exit_code == 137, "{last:?}");
    k.rec
        .wait(&uid, MIN, "restartCount 2", |s| restarts(s, "c") >= 2)
        .await?;
    let two = Instant::now();
    // The second restart waited out the 10 s backoff; the first did not.
    ensure!(
        two - one >= Duration::from_secs(10),
        "restarts at {:?} and {:?}",
        one - first,
        two - first
    );
    Ok(())
}

/// Readiness over httpGet to the pod IP toggles Ready both ways.
async fn readiness_toggles(k: &Kubelet, cri: &CriRuntime) -> Result<()> {
    let p = pod(
        "ready",
        json!({"containers": [{
            "name": "httpd", "image": images::BUSYBOX,
            "command": sh("mkdir -p /www && exec httpd -f -p 8080 -h /www"),
            "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080},
                                "periodSeconds": 1},
        }]}),
    );
    let uid = uid_of(&p);
    k.events.send(upsert(&p)).await?;
    let s = k
        .rec
        .wait(&uid, MIN, "Running, not Ready", |s| {
            phase(s) == "Running" && !condition(s, "Ready")
        })
        .await?;
    let id = cri_id(&s, "httpd");
    // Not ready for a few periods while /ready is missing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(!condition(&k.rec.latest(&uid).unwrap(), "Ready"));
    exec(cri, &id, "touch /www/ready").await?;
    k.rec
        .wait(&uid, MIN, "Ready", |s| condition(s, "Ready"))
        .await?;
    exec(cri, &id, "rm /www/ready").await?;
    let s = k
        .rec
        .wait(&uid, MIN, "not Ready again", |s| !condition(s, "Ready"))
        .await?;
    ensure!(restarts(&s, "httpd") == 0 && phase(&s) == "Running");
    Ok(())
}

/// Never: a failure is final. OnFailure: a failure restarts, a success ends.
async fn restart_policies(k: &Kubelet) -> Result<()> {
    let never = pod(
        "never",
        json!({"restartPolicy": "Never", "containers": [{
            "name": "c", "image": images::BUSYBOX, "command": sh("exit 1")}]}),
    );
    let never_ok = pod(
        "never-ok",
        json!({"restartPolicy": "Never", "containers": [{
            "name": "c", "image": images::BUSYBOX, "command": sh("exit 0")}]}),
    );
    let on_failure = pod(
        "onfailure",
        json!({"restartPolicy": "OnFailure",
               "volumes": [{"name": "data", "emptyDir": {}}],
               "containers": [{
            "name": "c", "image": images::BUSYBOX,
            "command": sh("if [ -f /data/ran ]; then exit 0; fi; touch /data/ran; exit 1"),
            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}),
    );
    for p in [&never, &never_ok, &on_failure] {
        k.events.send(upsert(p)).await?;
    }
    let s = k
        .rec
        .wait(&uid_of(&never), MIN, "Failed", |s| phase(s) == "Failed")
        .await?;
    let t = container(&s, "c")
        .state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .context("terminated")?;
    ensure!(t.exit_code == 1 && restarts(&s, "c") == 0, "{s:?}");
    let s = k
        .rec
        .wait(&uid_of(&never_ok), MIN, "Succeeded", |s| {
            phase(s) == "Succeeded"
        })
        .await?;
    ensure!(restarts(&s, "c") == 0, "{s:?}");
    let s = k
        .rec
        .wait(&uid_of(&on_failure), MIN, "Succeeded", |s| {
            phase(s) == "Succeeded"
        })
        .await?;
    ensure!(restarts(&s, "c") == 1, "{s:?}");
    // Terminal pods stay so: no restart, no new sandbox.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = k.rec.latest(&uid_of(&never)).unwrap();
    ensure!(phase(&s) == "Failed" && restarts(&s, "c") == 0, "{s:?}");
    Ok(())
}

/// Init containers run in order, each to completion, before the app.
async fn init_containers(k: &Kubelet, cri: &CriRuntime) -> Result<()> {
    let step = |n: &str| {
        json!({"name": n, "image": images::BUSYBOX,
               "command": sh(&format!("echo {n} >> /data/log")),
               "volumeMounts": [{"name": "data", "mountPath": "/data"}]})
    };
    let p = pod(
        "init",
        json!({"volumes": [{"name": "data", "emptyDir": {}}],
               "initContainers": [step("init1"), step("init2")],
               "containers": [{"name": "app", "image": images::BUSYBOX,
                   "command": sh("echo app >> /data/log; exec sleep 1000"),
                   "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}),
    );
    let uid = uid_of(&p);
    k.events.send(upsert(&p)).await?;
    let s = k
        .rec
        .wait(&uid, MIN, "Running", |s| phase(s) == "Running")
        .await?;
    ensure!(condition(&s, "Initialized"), "{:?}", s.conditions);
    for n in ["init1", "init2"] {
        let t = container(&s, n)
            .state
            .as_ref()
            .and_then(|st| st.terminated.as_ref())
            .context("init terminated")?;
        ensure!(
            t.exit_code == 0 && t.reason.as_deref() == Some("Completed"),
            "{t:?}"
        );
    }
    let (_, log) = exec(cri, &cri_id(&s, "app"), "cat /data/log").await?;
    ensure!(log == "init1\ninit2\napp\n", "{log:?}");
    Ok(())
}

/// A bad spec gets CreateContainerConfigError and nothing runs.
async fn bad_spec(k: &Kubelet, cri: &CriRuntime) -> Result<()> {
    let p = pod(
        "bad",
        json!({"containers": [
            {"name": "a", "image": images::BUSYBOX},
            {"name": "a", "image": images::BUSYBOX}]}),
    );
    let uid = uid_of(&p);
    k.events.send(upsert(&p)).await?;
    let s = k
        .rec
        .wait(&uid, MIN, "CreateContainerConfigError", |s| {
            s.container_statuses.iter().flatten().any(|c| {
                c.state
                    .as_ref()
                    .and_then(|st| st.waiting.as_ref())
                    .is_some_and(|w| w.reason.as_deref() == Some("CreateContainerConfigError"))
            })
        })
        .await?;
    ensure!(phase(&s) == "Pending", "{s:?}");
    ensure!(sandboxes_of(cri, &uid).await? == 0);
    Ok(())
}

/// Graceful delete: preStop runs, and a container that ignores SIGTERM is
/// killed once the grace period is over.
async fn graceful_delete(k: &Kubelet, cri: &CriRuntime, host_dir: &Path) -> Result<()> {
    std::fs::create_dir_all(host_dir)?;
    let mut p = pod(
        "grace",
        json!({"terminationGracePeriodSeconds": 30,
               "volumes": [{"name": "host", "hostPath": {"path": host_dir.to_str().unwrap()}}],
               "containers": [{"name": "stubborn", "image": images::BUSYBOX,
                   "command": sh("trap '' TERM; while true; do sleep 1; done"),
                   "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                   "lifecycle": {"preStop": {"exec": {"command":
                       ["sh", "-c", "date +%s > /host/prestop"]}}}}]}),
    );
    let uid = uid_of(&p);
    k.events.send(upsert(&p)).await?;
    k.rec
        .wait(&uid, MIN, "Running", |s| phase(s) == "Running")
        .await?;
    // The API's graceful delete: a deletion timestamp and a 4 s grace period.
    p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        weir_kubelet::pod::timestamp_now(),
    ));
    p.metadata.deletion_grace_period_seconds = Some(4);
    let asked = Instant::now();
    k.events.send(upsert(&p)).await?;
    let deadline = asked + MIN;
    let done = loop {
        if let Some(t) = k.rec.terminated.lock().unwrap().get(&uid) {
            break *t;
        }
        ensure!(Instant::now() < deadline, "never terminated");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = done - asked;
    ensure!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(15),
        "terminated after {took:?}"
    );
    ensure!(host_dir.join("prestop").exists(), "preStop did not run");
    ensure!(sandboxes_of(cri, &uid).await? == 0, "sandbox left behind");
    let s = k.rec.latest(&uid).unwrap();
    let t = container(&s, "stubborn")
        .state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .context("terminated state")?;
    ensure!(t.exit_code == 137, "SIGKILL expected: {t:?}");
    Ok(())
}

#[test]
fn worker_runs_pods_on_real_containerd() -> Result<()> {
    weir_integration::sweep::sweep();
    let ctrd = Containerd::start()?;
    let host_dir = ctrd.dir.join("grace-host");
    on_node(&ctrd, || async {
        let k = start_worker(&ctrd);
        let cri = ctrd.runtime();
        let r = tokio::join!(
            running_with_status(&k, &cri),
            liveness_restarts(&k),
            readiness_toggles(&k, &cri),
            restart_policies(&k),
            init_containers(&k, &cri),
            bad_spec(&k, &cri),
            graceful_delete(&k, &cri, &host_dir),
        );
        let results = [
            ("running", r.0),
            ("liveness", r.1),
            ("readiness", r.2),
            ("restart policies", r.3),
            ("init containers", r.4),
            ("bad spec", r.5),
            ("graceful delete", r.6),
        ];
        let mut failed = Vec::new();
        for (name, r) in results {
            match r {
                Ok(()) => eprintln!("ok: {name}"),
                Err(e) => {
                    eprintln!("FAILED: {name}: {e:#}");
                    failed.push(name);
                }
            }
        }
        ensure!(failed.is_empty(), "failed: {failed:?}");
        Ok(())
    })
}

/// A dropped worker (a killed kubelet) leaves the pod running; a new one
/// adopts it without a restart and with the same restart count.
#[test]
fn new_worker_adopts_running_pods() -> Result<()> {
    weir_integration::sweep::sweep();
    let ctrd = Containerd::start()?;
    on_node(&ctrd, || async {
        let cri = ctrd.runtime();
        let p = pod(
            "adopt",
            json!({"volumes": [{"name": "data", "emptyDir": {}}],
                   "containers": [{"name": "c", "image": images::BUSYBOX,
                "command": sh("if [ -f /data/ran ]; then exec sleep 1000; fi; touch /data/ran; exit 1"),
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}),
        );
        let uid = uid_of(&p);
        let k = start_worker(&ctrd);
        k.events.send(upsert(&p)).await?;
        let before = k
            .rec
            .wait(&uid, MIN, "Running after one restart", |s| {
                phase(s) == "Running" && restarts(s, "c") == 1 && condition(s, "Ready")
            })
            .await?;
        let id = cri_id(&before, "c");
        drop(k);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let st = cri.container_status(&id).await?;
        ensure!(
            st.state == weir_kubelet::cri::ContainerState::Running,
            "{st:?}"
        );

        let k = start_worker(&ctrd);
        k.events.send(upsert(&p)).await?;
        let after = k
            .rec
            .wait(&uid, MIN, "Running", |s| {
                phase(s) == "Running" && condition(s, "Ready")
            })
            .await?;
        ensure!(cri_id(&after, "c") == id, "container replaced: {after:?}");
        ensure!(restarts(&after, "c") == 1, "{after:?}");
        tokio::time::sleep(Duration::from_secs(3)).await;
        let later = k.rec.latest(&uid).unwrap();
        ensure!(cri_id(&later, "c") == id && restarts(&later, "c") == 1);
        ensure!(sandboxes_of(&cri, &uid).await? == 1, "a second sandbox");
        Ok(())
    })
}

/// The binary, standalone: a static pod file runs, and its removal stops it.
#[test]
fn standalone_binary_runs_static_pods() -> Result<()> {
    weir_integration::sweep::sweep();
    let bin = weir_integration::bin("weir-kubelet");
    ensure!(
        bin.exists(),
        "{} missing: cargo build -p weir-kubelet --bins",
        bin.display()
    );
    let ctrd = Containerd::start()?;
    let manifests = ctrd.dir.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let config = ctrd.dir.join("kubelet.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             staticPodPath: {}\nfileCheckFrequency: 2s\ncontainerRuntimeEndpoint: {}\n\
             clusterDNS: [10.96.0.10]\nclusterDomain: cluster.local\nreadOnlyPort: 10255\n",
            manifests.display(),
            ctrd.endpoint()
        ),
    )?;
    let spawn = || -> Result<std::process::Child> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(ctrd.dir.join("kubelet.log"))?;
        Ok(ctrd
            .node
            .command(&bin)
            .arg("--config")
            .arg(&config)
            .args(["--hostname-override", "Node1"])
            .arg("--root-dir")
            .arg(ctrd.dir.join("kubelet"))
            .arg("--pod-logs-dir")
            .arg(ctrd.dir.join("pod-logs"))
            .args(["--cgroup-root", &ctrd.cgroup_parent()])
            .stderr(log)
            .spawn()?)
    };
    let child = Mutex::new(spawn()?);
    let res = on_node(&ctrd, || async {
        let cri = ctrd.runtime();
        std::fs::write(
            manifests.join("web.yaml"),
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  \
                 - name: httpd\n    image: {}\n    command: [sh, -c, 'mkdir -p /www && echo static > /www/index.html && exec httpd -f -p 80 -h /www']\n",
                images::BUSYBOX
            ),
        )?;
        let by_name = SandboxFilter {
            labels: BTreeMap::from([("io.kubernetes.pod.name".to_owned(), "web-node1".to_owned())]),
            ..Default::default()
        };
        // A malformed file is logged with its path; the good pod still runs.
        std::fs::write(manifests.join("bad.yaml"), "kind: Pod\nspec: [\n")?;
        let (uid, ip) = running_sandbox(&cri, &by_name, None).await?;
        // The read-only port shows it Running with that IP.
        let deadline = Instant::now() + MIN;
        loop {
            let out = ctrd
                .node
                .command(Path::new("curl"))
                .args(["-sf", "--max-time", "2", "http://127.0.0.1:10255/pods"])
                .output()?;
            let body = String::from_utf8_lossy(&out.stdout);
            if body.contains("\"Running\"") && body.contains(&ip.to_string()) {
                break;
            }
            ensure!(Instant::now() < deadline, "/pods never showed it: {body}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let log = std::fs::read_to_string(ctrd.dir.join("kubelet.log"))?;
        ensure!(
            log.contains(&manifests.join("bad.yaml").display().to_string()),
            "bad.yaml not logged"
        );
        // SIGKILL the kubelet: the pod keeps running, and the next kubelet
        // adopts it without restarting anything.
        let running = || async {
            let f = weir_kubelet::cri::ContainerFilter {
                state: Some(weir_kubelet::cri::ContainerState::Running),
                ..Default::default()
            };
            let mut ids: Vec<String> = cri
                .list_containers(&f)
                .await?
                .into_iter()
                .map(|c| c.id)
                .collect();
            ids.sort();
            anyhow::Ok(ids)
        };
        let before = running().await?;
        {
            let mut c = child.lock().unwrap();
            c.kill()?;
            c.wait()?;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        ensure!(
            running().await? == before,
            "containers changed with no kubelet"
        );
        *child.lock().unwrap() = spawn()?;
        // Long enough for a scan, several relists and the orphan reap.
        tokio::time::sleep(Duration::from_secs(8)).await;
        ensure!(
            running().await? == before,
            "the new kubelet restarted containers"
        );
        let (uid_after, _) = running_sandbox(&cri, &by_name, None).await?;
        ensure!(uid_after == uid);
        // A changed file: the old pod is killed, a new one (new UID) created.
        let text = std::fs::read_to_string(manifests.join("web.yaml"))?;
        std::fs::write(
            manifests.join("web.yaml"),
            text.replace("name: web\n", "name: web\n  labels: {v: \"2\"}\n"),
        )?;
        let (uid2, _) = running_sandbox(&cri, &by_name, Some(&uid)).await?;
        ensure!(uid2 != uid);
        std::fs::remove_file(manifests.join("web.yaml"))?;
        let deadline = Instant::now() + MIN;
        while !cri.list_pod_sandboxes(&by_name).await?.is_empty() {
            ensure!(
                Instant::now() < deadline,
                "pod not stopped after its file went"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    });
    let mut child = child.into_inner().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    if res.is_err() || std::env::var_os("WEIR_TEST_SHOW_LOG").is_some() {
        eprintln!(
            "kubelet log:\n{}",
            std::fs::read_to_string(ctrd.dir.join("kubelet.log")).unwrap_or_default()
        );
    }
    res
}

/// Waits until the pod's only sandbox (by `filter`), with a UID other than
/// `not`, runs a container; returns its UID and IP.
async fn running_sandbox(
    cri: &CriRuntime,
    filter: &SandboxFilter,
    not: Option<&str>,
) -> Result<(String, IpAddr)> {
    let deadline = Instant::now() + MIN;
    loop {
        let sbs = cri.list_pod_sandboxes(filter).await?;
        if let [sb] = sbs.as_slice()
            && Some(sb.uid.as_str()) != not
        {
            let running = cri
                .list_containers(&weir_kubelet::cri::ContainerFilter {
                    sandbox_id: Some(sb.id.clone()),
                    state: Some(weir_kubelet::cri::ContainerState::Running),
                    ..Default::default()
                })
                .await?;
            if !running.is_empty() {
                let ip = cri.pod_sandbox_status(&sb.id).await?.ip.context("pod IP")?;
                return Ok((sb.uid.clone(), ip));
            }
        }
        ensure!(
            Instant::now() < deadline,
            "no single running sandbox (not {not:?}): {sbs:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
