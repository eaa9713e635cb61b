//! Issue 15, streaming: the real `kubectl exec`, `attach`, `port-forward`
//! and `logs -f`/`--previous`, through the test API server (which proxies
//! pods/exec, pods/attach, pods/portforward and pods/log to the node's
//! kubelet with its kubelet client certificate, as kube-apiserver does), to
//! weir-kubelet, which asks containerd for a streaming URL over CRI and
//! proxies the upgraded connection to containerd's streaming server.
//! Real containerd and runc; needs root. All traffic stays on loopback: the
//! API server reaches the kubelet through a relay into the node namespace.
use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Command, Output, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::json;
use weir_integration::{
    api::{Cluster, Relay},
    containerd::Containerd,
    images::BUSYBOX,
    kubelet::{ConfigOptions, Kubelet, until, write_config},
    topology::ChildGuard,
};

const NODE: &str = "node-s";
const API_PORT: u16 = 6443;
const KUBELET_PORT: u16 = 10250;

struct Env {
    cluster: Cluster,
    kubelet: Kubelet,
    // Dropped last: the pods' containers go with it.
    _relays: (Relay, Relay),
    _ctrd: Containerd,
}

impl Env {
    fn start() -> Result<Self> {
        let ctrd = Containerd::start()?;
        let cluster = Cluster::start()?;
        let to_api = Relay::start_in_netns(&ctrd.node, API_PORT, cluster.server.addr())?;
        let to_kubelet = Relay::start_into_netns(&ctrd.node, KUBELET_PORT)?;
        cluster.server.route_kubelet(NODE, to_kubelet.addr);
        let kubeconfig = cluster.kubeconfig_via(
            &format!("https://127.0.0.1:{API_PORT}"),
            &ctrd.dir.join("kc"),
        )?;
        let config = write_config(
            &ctrd,
            &ConfigOptions {
                client_ca_file: Some(cluster.server.ca_path().to_path_buf()),
                ..ConfigOptions::default()
            },
        )?;
        let kubelet = Kubelet::start(&ctrd, &config, Some(&kubeconfig), NODE)?;
        Ok(Self {
            cluster,
            kubelet,
            _relays: (to_api, to_kubelet),
            _ctrd: ctrd,
        })
    }

    fn kubectl(&self) -> Command {
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig").arg(self.cluster.kubeconfig()).args([
            "--namespace",
            "default",
            "--request-timeout",
            "60s",
        ]);
        c
    }

    /// Runs kubectl with `stdin` as its input; its output, whatever the
    /// exit code.
    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<Output> {
        let mut cmd = self.kubectl();
        cmd.args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().context("running kubectl")?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes())?;
        }
        let out = wait_timeout(child, Duration::from_secs(60))?;
        println!(
            "kubectl {}: {:?}\n  stdout: {:?}\n  stderr: {:?}",
            args.join(" "),
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(out)
    }

    fn running(&self, name: &str) -> Result<Pod> {
        let pods: Api<Pod> = self.cluster.api("default");
        until(
            &self.kubelet,
            &format!("pod {name} Running"),
            Duration::from_secs(90),
            || {
                let p = self.cluster.block_on(pods.get(name))?;
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                Ok((phase == Some("Running")).then_some(p))
            },
        )
    }
}

fn wait_timeout(mut child: std::process::Child, within: Duration) -> Result<Output> {
    let start = Instant::now();
    while child.try_wait()?.is_none() {
        if start.elapsed() > within {
            let _ = child.kill();
            let out = child.wait_with_output()?;
            bail!(
                "still running after {within:?}; stdout {:?} stderr {:?}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(child.wait_with_output()?)
}

/// Starts `cmd` (killed when the guard drops) and hands out each line of
/// its stdout with the moment it arrived.
fn spawn_lines(cmd: &mut Command) -> Result<(ChildGuard, mpsc::Receiver<(Instant, String)>)> {
    let mut child = ChildGuard(cmd.stdout(Stdio::piped()).spawn()?);
    let stdout = child.0.stdout.take().context("no stdout pipe")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send((Instant::now(), line));
        }
    });
    Ok((child, rx))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn pod(env: &Env, name: &str, containers: serde_json::Value) -> Result<()> {
    env.cluster.upsert(
        &env.cluster.api::<Pod>("default"),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": NODE, "terminationGracePeriodSeconds": 1,
                     "automountServiceAccountToken": false,
                     "volumes": [{"name": "data", "emptyDir": {}}],
                     "containers": containers},
        }),
    )?;
    Ok(())
}

fn container(name: &str, script: &str) -> serde_json::Value {
    json!({"name": name, "image": BUSYBOX, "command": ["sh", "-c", script],
           "volumeMounts": [{"name": "data", "mountPath": "/data"}]})
}

#[test]
fn kubectl_exec_attach_port_forward_and_logs_reach_containers() -> Result<()> {
    let env = Env::start()?;
    pod(
        &env,
        "web",
        json!([
            container(
                "httpd",
                "echo hello-from-pod > /data/index.html; exec httpd -f -p 8080 -h /data"
            ),
            container(
                "ticker",
                "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.3; done"
            ),
        ]),
    )?;
    // stdin kept open for attach; stdinOnce closes it when the client goes,
    // so `cat` ends and the attach with it.
    let mut cat = container("cat", "cat");
    cat["stdin"] = json!(true);
    cat["stdinOnce"] = json!(true);
    pod(&env, "cat", json!([cat]))?;
    // Counts its runs in an emptyDir: the first exits, the second stays.
    pod(
        &env,
        "crasher",
        json!([container(
            "c",
            "n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n; \
             echo run $n; if [ $n -ge 2 ]; then exec sleep 1000; fi; exit 1"
        )]),
    )?;
    env.running("web")?;

    // exec: output, stderr and the exit code come back, over kubectl's
    // WebSocket in v5.channel.k8s.io (which the API server translates to
    // SPDY for containerd): no fallback to SPDY in kubectl's log.
    let started = Instant::now();
    let out = env.run(
        &[
            "exec",
            "-v=6",
            "web",
            "-c",
            "httpd",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ],
        None,
    )?;
    ensure!(
        out.status.code() == Some(3),
        "exit code {:?}",
        out.status.code()
    );
    ensure!(
        text(&out.stdout) == "out\n",
        "stdout {:?}",
        text(&out.stdout)
    );
    ensure!(
        text(&out.stderr).contains("err\n"),
        "stderr {:?}",
        text(&out.stderr)
    );
    println!("kubectl exec took {:?}", started.elapsed());
    ensure!(
        text(&out.stderr).contains("The subprotocol is v5.channel.k8s.io")
            && !text(&out.stderr).contains("fallback"),
        "kubectl did not use the WebSocket in v5: {:?}",
        text(&out.stderr)
    );

    // exec -i: stdin reaches the command, and its end too (cat returns).
    let out = env.run(
        &[
            "exec",
            "-i",
            "web",
            "-c",
            "httpd",
            "--",
            "sh",
            "-c",
            "cat; echo done",
        ],
        Some("line one\nline two\n"),
    )?;
    ensure!(out.status.success(), "exec -i failed");
    ensure!(
        text(&out.stdout) == "line one\nline two\ndone\n",
        "{:?}",
        text(&out.stdout)
    );

    // exec -it: a terminal inside; `script` gives kubectl one outside.
    let cmdline = format!(
        "kubectl --kubeconfig {} -n default exec -it web -c httpd -- sh -c 'tty; exit 4'",
        env.cluster.kubeconfig().display()
    );
    let tty = Command::new("script")
        .args(["-qec", &cmdline, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let out = wait_timeout(tty, Duration::from_secs(60))?;
    println!("exec -it: {:?} {:?}", out.status.code(), text(&out.stdout));
    ensure!(
        out.status.code() == Some(4),
        "exec -it exit code {:?}",
        out.status.code()
    );
    ensure!(
        text(&out.stdout).contains("/dev/pts/"),
        "no terminal: {:?}",
        text(&out.stdout)
    );

    // attach -i: what we type reaches the container's own process.
    env.running("cat")?;
    let out = env.run(
        &["attach", "-i", "cat", "-c", "cat"],
        Some("attached hello\n"),
    )?;
    ensure!(
        text(&out.stdout).contains("attached hello"),
        "{:?}",
        text(&out.stdout)
    );

    port_forward(&env)?;
    logs_follow(&env)?;
    logs_since(&env)?;
    logs_previous(&env)?;
    Ok(())
}

/// `kubectl port-forward` on the root namespace's loopback, curl through it.
fn port_forward(env: &Env) -> Result<()> {
    let local = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut cmd = env.kubectl();
    // -v=6 shows a fallback from the WebSocket tunnel to SPDY, if any.
    cmd.args(["port-forward", "-v=6", "pod/web", &format!("{local}:8080")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (mut child, rx) = spawn_lines(&mut cmd)?;
    let mut stderr = child.0.stderr.take().context("no stderr pipe")?;
    let log = std::thread::spawn(move || {
        let mut all = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut all);
        all
    });
    let (_, line) = rx
        .recv_timeout(Duration::from_secs(30))
        .context("port-forward printed nothing")?;
    ensure!(
        line.contains(&format!("127.0.0.1:{local} -> 8080")),
        "{line}"
    );
    for round in 0..3 {
        let out = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "10",
                &format!("http://127.0.0.1:{local}/index.html"),
            ])
            .output()?;
        ensure!(
            text(&out.stdout) == "hello-from-pod\n",
            "curl {round} through port-forward: {:?} {:?}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    drop(child);
    let log = log.join().unwrap_or_default();
    ensure!(
        log.contains("Before WebSocket Upgrade Connection"),
        "kubectl port-forward did not try the WebSocket tunnel: {log:?}"
    );
    ensure!(
        !log.contains("fallback"),
        "kubectl port-forward fell back from the WebSocket tunnel: {log:?}"
    );
    Ok(())
}

/// `kubectl logs -f` shows lines as the container writes them.
fn logs_follow(env: &Env) -> Result<()> {
    let mut cmd = env.kubectl();
    cmd.args(["logs", "-f", "web", "-c", "ticker", "--tail", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (child, rx) = spawn_lines(&mut cmd)?;
    let mut lines = Vec::new();
    while lines.len() < 8 {
        lines.push(
            rx.recv_timeout(Duration::from_secs(20))
                .with_context(|| format!("logs -f stalled after {lines:?}"))?,
        );
    }
    drop(child);
    let numbers: Vec<u64> = lines
        .iter()
        .map(|(_, l)| l.strip_prefix("tick ").and_then(|n| n.parse().ok()))
        .collect::<Option<_>>()
        .with_context(|| format!("{lines:?}"))?;
    ensure!(
        numbers.windows(2).all(|w| w[1] == w[0] + 1),
        "not consecutive: {numbers:?}"
    );
    // Eight lines written 0.3 s apart arrive over about two seconds, not at once.
    let spread = lines[7].0 - lines[1].0;
    println!("logs -f: {numbers:?}, lines 2..8 arrived over {spread:?}");
    ensure!(
        spread >= Duration::from_millis(1200),
        "arrived at once: {spread:?}"
    );
    Ok(())
}

/// `kubectl logs --since`: only what the last seconds brought (the ticker
/// writes every 0.3 s and has run for at least 6 s).
fn logs_since(env: &Env) -> Result<()> {
    let count = |args: &[&str]| -> Result<usize> {
        let out = env.run(args, None)?;
        ensure!(out.status.success(), "kubectl {}", args.join(" "));
        Ok(String::from_utf8_lossy(&out.stdout).lines().count())
    };
    // Enough history that "the last 2 s" is a small part of it.
    let mut all = count(&["logs", "web", "-c", "ticker"])?;
    for _ in 0..40 {
        if all >= 20 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
        all = count(&["logs", "web", "-c", "ticker"])?;
    }
    let recent = count(&["logs", "web", "-c", "ticker", "--since=2s"])?;
    println!("logs: {all} lines in all, {recent} in the last 2 s");
    ensure!(
        (3..=10).contains(&recent) && all > recent + 5,
        "{recent} of {all}"
    );
    Ok(())
}

/// `kubectl logs --previous` after a restart.
fn logs_previous(env: &Env) -> Result<()> {
    let pods: Api<Pod> = env.cluster.api("default");
    until(
        &env.kubelet,
        "crasher restarted once",
        Duration::from_secs(90),
        || {
            let p = env.cluster.block_on(pods.get("crasher"))?;
            let restarted = p
                .status
                .and_then(|s| s.container_statuses)
                .unwrap_or_default()
                .iter()
                .any(|c| {
                    c.restart_count >= 1 && c.state.as_ref().is_some_and(|s| s.running.is_some())
                });
            Ok(restarted.then_some(()))
        },
    )?;
    let out = env.run(&["logs", "crasher"], None)?;
    ensure!(
        text(&out.stdout) == "run 2\n",
        "current: {:?}",
        text(&out.stdout)
    );
    let out = env.run(&["logs", "crasher", "--previous"], None)?;
    ensure!(
        text(&out.stdout) == "run 1\n",
        "previous: {:?}",
        text(&out.stdout)
    );
    let out = env.run(&["logs", "web", "-c", "httpd", "--previous"], None)?;
    ensure!(
        !out.status.success(),
        "a container that never restarted has no previous log"
    );
    ensure!(
        text(&out.stderr)
            .contains("previous terminated container \"httpd\" in pod \"web\" not found"),
        "{:?}",
        text(&out.stderr)
    );
    Ok(())
}
