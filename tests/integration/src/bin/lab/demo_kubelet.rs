//! `cargo xtask demo-kubelet`: weir-kubelet's main job. Starts a private
//! containerd in a throwaway node namespace, runs weir-kubelet standalone on
//! a static pod (busybox httpd), shows it Running with its IP and serving,
//! then puts a ClusterIP in front of it with weir-agent and curls that. All
//! traffic stays inside the node namespace; the agent's programs attach to a
//! child cgroup of its own, never the root one. Everything is torn down by
//! guards, on failure too.
use std::{path::Path, process::Command, time::Duration};

use anyhow::{Context as _, Result, ensure};
use weir_integration::{
    Agent,
    containerd::Containerd,
    images::{BUSYBOX, PAUSE},
    kubelet::{self, ConfigOptions, Kubelet, READ_ONLY_PORT, write_config, write_static_pod},
    manifest,
    topology::{Bpffs, Cgroup, DIR_PREFIX, cgroup2_root},
};

const NODE: &str = "demo-node";
const VIP: &str = "10.96.0.50";

pub fn run() -> Result<()> {
    step("Starting a private containerd in a throwaway node namespace");
    // Guards drop in reverse order of these lets: the agent, its cgroup and
    // bpffs, the kubelet, then containerd (which removes every pod).
    let ctrd = Containerd::start()?;
    println!(
        "    netns {}, socket {}, snapshotter {}",
        ctrd.node.name,
        ctrd.socket.display(),
        ctrd.snapshotter
    );
    println!("    images: {BUSYBOX}, {PAUSE} (built locally, no registry)");

    step("Writing a KubeletConfiguration and a static pod: busybox httpd on :8080");
    let static_dir = ctrd.dir.join("manifests");
    std::fs::create_dir_all(&static_dir)?;
    let config = write_config(
        &ctrd,
        &ConfigOptions {
            static_dir: Some(static_dir.clone()),
            read_only_port: Some(READ_ONLY_PORT),
            ..ConfigOptions::default()
        },
    )?;
    for line in std::fs::read_to_string(&config)?.lines() {
        println!("    {line}");
    }
    write_static_pod(&static_dir, "web.yaml", WEB_POD)?;
    println!("    {}:", static_dir.join("web.yaml").display());
    for line in WEB_POD.lines() {
        println!("      {line}");
    }

    step("Starting weir-kubelet standalone (no kubeconfig) in the node namespace");
    let mut k = Kubelet::start(&ctrd, &config, None, NODE)?;
    println!(
        "    pid {}, cgroup parent {}, log {}",
        k.pid().unwrap_or(0),
        ctrd.cgroup_parent(),
        k.log_path().display()
    );

    step(&format!(
        "Polling /pods on the read-only port (127.0.0.1:{READ_ONLY_PORT} in the node namespace)"
    ));
    let name = format!("web-{NODE}");
    let started = std::time::Instant::now();
    let pod = k.poll(
        "the static pod Running",
        Duration::from_secs(60),
        Duration::from_millis(100),
        |pods| {
            kubelet::find(pods, &name)
                .filter(|p| kubelet::running_ip(p).is_some())
                .cloned()
        },
    )?;
    let ip = kubelet::running_ip(&pod).unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    println!(
        "    {name}: phase {} after {:.1} s",
        status.phase.as_deref().unwrap_or("?"),
        started.elapsed().as_secs_f64()
    );
    println!("    podIP {ip}");
    for c in status.container_statuses.iter().flatten() {
        println!(
            "    container {}: {}  ready {}  restartCount {}",
            c.name,
            c.container_id.as_deref().unwrap_or("?"),
            c.ready,
            c.restart_count
        );
    }

    step(&format!("curl http://{ip}:8080/ from the node namespace"));
    let out = ctrd
        .node
        .command(Path::new("curl"))
        .args(["-sS", "-m", "5", &format!("http://{ip}:8080/")])
        .output()?;
    let body = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    println!("    {body}");
    ensure!(
        body.contains("static pod"),
        "the pod did not answer: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    step(&format!(
        "A ClusterIP in front of it: Service web {VIP}:80 → {ip}:8080, weir-agent standalone"
    ));
    // The harness's prefix and this pid: `sweep` removes what a killed demo leaves.
    let work_name = format!("{DIR_PREFIX}{}-kdemo", std::process::id());
    let work = std::env::temp_dir().join(&work_name);
    let manifests = work.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    // Mounted inside `work`: its guard removes `work` once unmounted.
    let bpffs = Bpffs::mount(work.join("bpf"))?;
    let cgroup = Cgroup::create(cgroup2_root()?.join(&work_name))?;
    let pod_ip = ip.parse().context("pod IP")?;
    std::fs::write(manifests.join("web.yaml"), manifest::service("web", VIP))?;
    std::fs::write(
        manifests.join("web-slice.yaml"),
        manifest::slice("web-1", "web", &[(pod_ip, manifest::READY)]),
    )?;
    let pins = bpffs.pin_dir();
    let agent = Agent::start_with(&manifests, &cgroup.path, &pins, work.join("agent.log"), &[])?;
    println!(
        "    agent pid {}, cgroup {}, pins under {}",
        agent.pid().unwrap_or(0),
        cgroup.path.display(),
        pins.display()
    );

    step(&format!(
        "Three curl requests to http://{VIP}/ from a process in that cgroup, in the node namespace"
    ));
    for _ in 0..3 {
        let out = Command::new("sh")
            .args(["-c", r#"echo $$ > "$0" && exec "$@""#])
            .arg(cgroup.path.join("cgroup.procs"))
            .arg("nsenter")
            .arg(format!("--net={}", ctrd.node.path()))
            .args([
                "curl",
                "-sS",
                "-m",
                "3",
                "-w",
                " (peer seen by curl: %{remote_ip}:%{remote_port})",
                &format!("http://{VIP}/"),
            ])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout)
            .trim()
            .replace('\n', "");
        println!("    {text}");
        ensure!(
            text.contains("static pod"),
            "no answer through the ClusterIP: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    step("What the kernel holds: weir-agent inspect services");
    let out = Command::new(weir_integration::bin("weir-agent"))
        .args(["inspect", "services", "--bpffs"])
        .arg(&pins)
        .output()
        .context("running weir-agent inspect")?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        println!("    {line}");
    }

    step("Tearing down (agent, cgroup, bpffs, kubelet, pods, containerd, namespace)");
    drop(agent);
    drop(cgroup);
    drop(bpffs);
    // A clean stop: the pod keeps running, as on a real node, until
    // containerd's guard removes it.
    k.stop()?;
    drop(k);
    drop(ctrd);
    println!("\nDone. Run the kubelet's tests with: cargo xtask test --filter kubelet");
    Ok(())
}

fn step(s: &str) {
    println!("\n==> {s}");
}

/// The static pod, as a user would write it.
const WEB_POD: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: httpd
    image: weir.test/busybox:1
    imagePullPolicy: IfNotPresent
    command:
    - sh
    - -c
    - mkdir -p /www && echo "hello from a static pod ($(hostname))" > /www/index.html && exec httpd -f -p 8080 -h /www
    ports:
    - {name: http, containerPort: 8080}
"#;
