//! weir-kubelet's CRI client against a real containerd: a sandbox on the CNI
//! bridge, containers that serve, exec, exit and stop, label filters, and a
//! harness that leaves nothing behind.
use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, ensure};
use weir_integration::{
    containerd::{self, Containerd, POD_GATEWAY},
    images,
};
use weir_kubelet::cri::{
    ContainerConfig, ContainerFilter, ContainerSecurity, ContainerState, ContainerStatus,
    CriRuntime, DnsConfig, LinuxResources, Mount, MountPropagation, Runtime as _, SandboxConfig,
    SandboxFilter, SandboxSecurity, SandboxState,
};

const POD_LABEL: &str = "weir.test/pod";
const CONTAINER_LABEL: &str = "weir.test/container";

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

fn sandbox_config(ctrd: &Containerd) -> SandboxConfig {
    SandboxConfig {
        name: "web".into(),
        namespace: "default".into(),
        uid: "4b1e0c4e-0000-4000-8000-000000000001".into(),
        attempt: 0,
        hostname: "web-host".into(),
        labels: labels(&[(POD_LABEL, "web")]),
        annotations: labels(&[("weir.test/note", "cri test")]),
        dns: Some(DnsConfig {
            servers: vec!["10.96.0.10".into()],
            searches: vec!["default.svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        }),
        port_mappings: Vec::new(),
        log_directory: Some(ctrd.dir.join("pod-logs/web")),
        cgroup_parent: Some(format!("{}/pod-web", ctrd.cgroup_parent())),
        security: SandboxSecurity::default(),
    }
}

fn container(name: &str, command: Vec<String>) -> ContainerConfig {
    ContainerConfig {
        name: name.into(),
        image: images::BUSYBOX.into(),
        command,
        env: vec![("GREETING".into(), "hello-weir".into())],
        labels: labels(&[(CONTAINER_LABEL, name)]),
        log_path: Some(format!("{name}/0.log").into()),
        ..Default::default()
    }
}

async fn wait_state(cri: &CriRuntime, id: &str, want: ContainerState) -> Result<ContainerStatus> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let st = cri.container_status(id).await?;
        if st.state == want {
            return Ok(st);
        }
        ensure!(Instant::now() < deadline, "container {id} stayed {st:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An HTTP GET from the node namespace, as a probe or a client on the node would.
fn http_get(ctrd: &Containerd, url: &str) -> Option<String> {
    let out = ctrd
        .node
        .command(Path::new("curl"))
        .args(["-sf", "--max-time", "2", url])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn scenario(ctrd: &Containerd) -> Result<()> {
    let cri = ctrd.runtime();
    let v = cri.version().await?;
    assert_eq!(v.runtime_name, "containerd", "{v:?}");
    assert!(v.runtime_version.starts_with("1."), "{v:?}");

    let busybox = cri
        .image_status(images::BUSYBOX)
        .await?
        .context("busybox")?;
    assert!(
        busybox.repo_tags.iter().any(|t| t == images::BUSYBOX),
        "{busybox:?}"
    );
    assert!(
        busybox.id.starts_with("sha256:") && busybox.size > 1_000_000,
        "{busybox:?}"
    );
    assert_eq!(cri.image_status("weir.test/absent:1").await?, None);
    let all = cri.list_images().await?;
    assert!(
        all.iter()
            .any(|i| i.repo_tags.iter().any(|t| t == images::PAUSE)),
        "{all:?}"
    );
    // No registry is reachable: a pull fails cleanly, not as NotFound of a local object.
    let pull = cri.pull_image("weir.test/absent:1").await.unwrap_err();
    assert!(!pull.is_not_found(), "{pull:?}");

    let cfg = sandbox_config(ctrd);
    let sb = cri.run_pod_sandbox(&cfg).await?;
    let status = cri.pod_sandbox_status(&sb).await?;
    assert_eq!(status.state, SandboxState::Ready);
    assert_eq!(
        (status.name.as_str(), status.uid.as_str()),
        ("web", cfg.uid.as_str())
    );
    assert_eq!(
        status.labels.get(POD_LABEL).map(String::as_str),
        Some("web")
    );
    let Some(IpAddr::V4(ip)) = status.ip else {
        panic!("no IPv4 pod IP: {status:?}");
    };
    assert!(
        ip.octets()[..3] == POD_GATEWAY.octets()[..3] && ip != POD_GATEWAY,
        "pod IP {ip} outside {}",
        containerd::POD_SUBNET
    );

    let httpd = container(
        "httpd",
        sh("mkdir -p /www && echo $GREETING > /www/index.html && exec httpd -f -p 8080 -h /www"),
    );
    let web = cri.create_container(&sb, &httpd, &cfg).await?;
    assert_eq!(
        cri.container_status(&web).await?.state,
        ContainerState::Created
    );
    cri.start_container(&web).await?;
    let st = wait_state(&cri, &web, ContainerState::Running).await?;
    assert!(
        st.started_at.is_some() && st.image_ref.starts_with("sha256:"),
        "{st:?}"
    );
    assert_eq!(
        st.labels.get(CONTAINER_LABEL).map(String::as_str),
        Some("httpd")
    );

    let url = format!("http://{ip}:8080/");
    let deadline = Instant::now() + Duration::from_secs(10);
    let body = loop {
        if let Some(b) = http_get(ctrd, &url) {
            break b;
        }
        ensure!(Instant::now() < deadline, "{url} never answered");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(body, "hello-weir\n");

    let t = Duration::from_secs(10);
    let hi = cri
        .exec_sync(&web, &["echo".into(), "hi".into()], t)
        .await?;
    assert_eq!(
        (hi.exit_code, hi.stdout.as_slice()),
        (0, b"hi\n".as_slice())
    );
    let three = cri.exec_sync(&web, &sh("echo oops >&2; exit 3"), t).await?;
    assert_eq!(
        (three.exit_code, three.stderr.as_slice()),
        (3, b"oops\n".as_slice())
    );
    let conf = cri
        .exec_sync(&web, &sh("cat /etc/resolv.conf; hostname"), t)
        .await?;
    let conf = String::from_utf8_lossy(&conf.stdout);
    for want in [
        "nameserver 10.96.0.10",
        "search default.svc.cluster.local",
        "ndots:5",
        "web-host",
    ] {
        assert!(conf.contains(want), "{want:?} missing from {conf:?}");
    }

    // An exec probe's timeout: the runtime gives up on the command, not the call.
    let started = Instant::now();
    let slow = cri
        .exec_sync(&web, &sh("sleep 30"), Duration::from_secs(1))
        .await;
    let err = slow.expect_err("sleep 30 outlived a 1 s exec timeout");
    assert!(err.is_timeout(), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    locked_down_container(ctrd, &cri, &sb, &cfg).await?;

    let quitter = container("quitter", sh("echo bye; exit 7"));
    let q = cri.create_container(&sb, &quitter, &cfg).await?;
    cri.start_container(&q).await?;
    let st = wait_state(&cri, &q, ContainerState::Exited).await?;
    assert_eq!((st.exit_code, st.reason.as_str()), (7, "Error"), "{st:?}");
    // containerd stamps started_at when the start call returns and finished_at
    // from the exit event, so a process this quick may "finish" before it "started".
    let started = st.started_at.context("started_at")?;
    let finished = st.finished_at.context("finished_at")?;
    let gap = finished
        .duration_since(started)
        .unwrap_or_else(|e| e.duration());
    assert!(gap < Duration::from_secs(5), "{st:?}");
    let log = std::fs::read_to_string(ctrd.dir.join("pod-logs/web/quitter/0.log"))?;
    assert!(log.contains(" stdout F bye"), "CRI log {log:?}");

    let by_label = ContainerFilter {
        labels: labels(&[(CONTAINER_LABEL, "httpd")]),
        ..Default::default()
    };
    let found = cri.list_containers(&by_label).await?;
    assert_eq!(
        found.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        [web.as_str()]
    );
    assert_eq!(found[0].name, "httpd");
    let in_pod = ContainerFilter {
        sandbox_id: Some(sb.clone()),
        ..Default::default()
    };
    assert_eq!(cri.list_containers(&in_pod).await?.len(), 2);
    let running = ContainerFilter {
        state: Some(ContainerState::Running),
        ..in_pod.clone()
    };
    let running = cri.list_containers(&running).await?;
    assert_eq!(
        running.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        [web.as_str()]
    );
    let pods = |v: &str| SandboxFilter {
        labels: labels(&[(POD_LABEL, v)]),
        ..Default::default()
    };
    let listed = cri.list_pod_sandboxes(&pods("web")).await?;
    assert_eq!(
        listed.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        [sb.as_str()]
    );
    assert!(cri.list_pod_sandboxes(&pods("other")).await?.is_empty());

    let missing = cri.container_status("0123456789abcdef").await.unwrap_err();
    assert!(missing.is_not_found(), "{missing:?}");

    // httpd is pid 1 of its namespace with no SIGTERM handler: the grace
    // period runs out and SIGKILL ends it.
    let stop = Instant::now();
    cri.stop_container(&web, Duration::from_secs(2)).await?;
    let st = cri.container_status(&web).await?;
    assert_eq!(st.state, ContainerState::Exited, "{st:?}");
    assert_eq!(st.exit_code, 137, "{st:?}");
    assert!(
        stop.elapsed() >= Duration::from_secs(2),
        "{:?}",
        stop.elapsed()
    );
    assert_eq!(http_get(ctrd, &url), None, "stopped httpd still answers");

    // A process that handles SIGTERM ends well inside its grace period.
    let graceful = container(
        "graceful",
        sh("trap 'exit 0' TERM; touch /tmp/trapped; while true; do sleep 0.1; done"),
    );
    let g = cri.create_container(&sb, &graceful, &cfg).await?;
    cri.start_container(&g).await?;
    wait_state(&cri, &g, ContainerState::Running).await?;
    // Before the trap is set, pid 1 ignores SIGTERM: wait for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while cri
        .exec_sync(&g, &sh("test -f /tmp/trapped"), t)
        .await?
        .exit_code
        != 0
    {
        ensure!(Instant::now() < deadline, "the trap was never set");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stop = Instant::now();
    cri.stop_container(&g, Duration::from_secs(20)).await?;
    let st = cri.container_status(&g).await?;
    assert_eq!(
        (st.state, st.exit_code),
        (ContainerState::Exited, 0),
        "{st:?}"
    );
    assert!(
        stop.elapsed() < Duration::from_secs(5),
        "{:?}",
        stop.elapsed()
    );

    for id in [&web, &q, &g] {
        cri.remove_container(id).await?;
        assert!(cri.container_status(id).await.unwrap_err().is_not_found());
    }
    cri.stop_pod_sandbox(&sb).await?;
    let status = cri.pod_sandbox_status(&sb).await?;
    assert_eq!(status.state, SandboxState::NotReady, "{status:?}");
    cri.remove_pod_sandbox(&sb).await?;
    assert!(
        cri.pod_sandbox_status(&sb)
            .await
            .unwrap_err()
            .is_not_found()
    );
    assert!(
        cri.list_pod_sandboxes(&SandboxFilter::default())
            .await?
            .is_empty()
    );
    Ok(())
}

/// User, read-only root, capabilities, resources, env, working dir and a
/// read-only host mount, each checked where it takes effect.
async fn locked_down_container(
    ctrd: &Containerd,
    cri: &CriRuntime,
    sb: &str,
    cfg: &SandboxConfig,
) -> Result<()> {
    let host_dir = ctrd.dir.join("host-data");
    std::fs::create_dir_all(&host_dir)?;
    std::fs::write(host_dir.join("hello"), "from the host\n")?;
    let mut c = container("locked", sh("exec sleep 1000"));
    c.working_dir = Some("/etc".into());
    c.mounts = vec![Mount {
        host_path: host_dir,
        container_path: "/data".into(),
        readonly: true,
        propagation: MountPropagation::Private,
    }];
    c.resources = LinuxResources {
        cpu_shares: Some(512),
        cpu_quota: Some(50_000),
        cpu_period: Some(100_000),
        memory_limit_bytes: Some(64 << 20),
        oom_score_adj: Some(1000),
    };
    c.security = ContainerSecurity {
        run_as_user: Some(65534),
        readonly_rootfs: true,
        privileged: false,
        capabilities_add: vec!["SYS_TIME".into()],
        capabilities_drop: vec!["CAP_NET_RAW".into()],
        ..Default::default()
    };
    let id = cri.create_container(sb, &c, cfg).await?;
    cri.start_container(&id).await?;
    wait_state(cri, &id, ContainerState::Running).await?;

    let t = Duration::from_secs(10);
    let out = |r: weir_kubelet::cri::ExecResult| {
        (r.exit_code, String::from_utf8_lossy(&r.stdout).into_owned())
    };
    let script = "id -u; pwd; echo $GREETING; cat /data/hello; grep CapBnd /proc/self/status";
    let (code, text) = out(cri.exec_sync(&id, &sh(script), t).await?);
    assert_eq!(code, 0, "{text}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[..4],
        ["65534", "/etc", "hello-weir", "from the host"],
        "{text}"
    );
    let bnd = u64::from_str_radix(lines[4].trim_start_matches("CapBnd:").trim(), 16)?;
    // CAP_SYS_TIME is 25, CAP_NET_RAW 13.
    assert!(bnd & (1 << 25) != 0 && bnd & (1 << 13) == 0, "{text}");
    for target in ["/x", "/data/x"] {
        let (code, _) = out(cri
            .exec_sync(&id, &sh(&format!("touch {target}")), t)
            .await?);
        assert_ne!(code, 0, "{target} is writable");
    }

    let cg = |controller: &str, file: &str| -> Result<String> {
        let parent = cfg.cgroup_parent.as_deref().unwrap_or_default();
        let p = Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(parent.trim_start_matches('/'))
            .join(&id)
            .join(file);
        Ok(std::fs::read_to_string(&p)
            .with_context(|| p.display().to_string())?
            .trim()
            .to_owned())
    };
    assert_eq!(
        cg("memory", "memory.limit_in_bytes")?,
        (64u64 << 20).to_string()
    );
    assert_eq!(cg("cpu", "cpu.cfs_quota_us")?, "50000");
    assert_eq!(cg("cpu", "cpu.shares")?, "512");

    cri.stop_container(&id, Duration::ZERO).await?;
    cri.remove_container(&id).await?;
    Ok(())
}

fn processes_naming(dir: &Path) -> Vec<String> {
    let needle = format!("{}/", dir.display());
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&needle))
        .collect()
}

#[test]
fn cri_client_runs_pods_on_real_containerd() -> Result<()> {
    weir_integration::sweep::sweep();
    let ctrd = Containerd::start()?;
    let (dir, netns, cgroup) = (
        ctrd.dir.clone(),
        ctrd.node.name.clone(),
        ctrd.cgroup_parent(),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let res = rt.block_on(scenario(&ctrd));
    if res.is_err() {
        eprintln!("containerd log:\n{}", ctrd.log());
    }
    // Nothing of containerd's shows on the host while it runs: the one mount
    // there is the kubelet's root dir, made shared as /var/lib/kubelet is.
    let kubelet_dir = ctrd.kubelet_dir().display().to_string();
    let on_host: Vec<String> = containerd::host_mounts_under(&dir)
        .into_iter()
        .filter(|m| *m != kubelet_dir)
        .collect();
    assert_eq!(on_host, Vec::<String>::new());
    drop(rt);
    drop(ctrd);
    res?;

    assert_eq!(containerd::host_mounts_under(&dir), Vec::<String>::new());
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert_eq!(processes_naming(&dir), Vec::<String>::new());
    let netns_list = Command::new("ip").args(["netns", "list"]).output()?;
    let netns_list = String::from_utf8_lossy(&netns_list.stdout);
    assert!(
        !netns_list.contains(&netns),
        "{netns} left behind: {netns_list}"
    );
    for h in ["memory", "pids", "unified"] {
        let p = Path::new("/sys/fs/cgroup")
            .join(h)
            .join(cgroup.trim_start_matches('/'));
        assert!(!p.exists(), "{} left behind", p.display());
    }
    Ok(())
}
