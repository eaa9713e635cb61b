//! `cargo xtask cluster up|down|status`: a [`LocalCluster`] served by a
//! detached `weir-lab cluster serve` process until `down`.
//!
//! ```text
//!   up ──spawn (setsid)──> serve: LocalCluster::up … writes <state>/ready, waits for SIGTERM
//!    └─ polls <state>/ready, prints it          down ──SIGTERM──┘ (guards clean up), then sweep
//! ```
//! The state directory (default target/cluster) holds `pid`, `ready`,
//! `serve.log` and the kubeconfig; nothing of the cluster itself lives
//! there, so a removed checkout leaves nothing running that `sweep` cannot
//! find.
use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Subcommand;
use weir_integration::cluster::{LocalCluster, Options, SAMPLE_IMAGE};

#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Start the API server, the control plane and N node namespaces, each
    /// running weir-kubelet on its own containerd, and install weir-agent
    /// from the chart; returns once every agent pod is Ready.
    Up {
        #[arg(long, default_value_t = 2)]
        nodes: u8,
        /// Where to write the cluster's kubeconfig.
        #[arg(long, default_value = "target/cluster/kubeconfig")]
        kubeconfig: PathBuf,
    },
    /// Stop the cluster and remove every namespace, process, mount and pin.
    Down,
    /// Nodes, pods and Services, as kubectl shows them.
    Status,
    /// The process `up` starts (not for direct use).
    #[command(hide = true)]
    Serve {
        #[arg(long)]
        nodes: u8,
        #[arg(long)]
        kubeconfig: PathBuf,
    },
}

fn state_dir() -> PathBuf {
    crate::root().join("target/cluster")
}

pub fn run(cmd: ClusterCmd) -> Result<()> {
    match cmd {
        ClusterCmd::Up { nodes, kubeconfig } => up(nodes, &crate::root().join(kubeconfig)),
        ClusterCmd::Down => down(),
        ClusterCmd::Status => status(),
        ClusterCmd::Serve { nodes, kubeconfig } => serve(nodes, &kubeconfig),
    }
}

/// The serving process's pid, if one runs.
fn running() -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(state_dir().join("pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // The pid file outlives a killed server; /proc tells.
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    String::from_utf8_lossy(&cmdline)
        .contains("serve")
        .then_some(pid)
}

fn up(nodes: u8, kubeconfig: &Path) -> Result<()> {
    if let Some(pid) = running() {
        bail!("a cluster is already up (pid {pid}): `cargo xtask cluster down` first");
    }
    let state = state_dir();
    std::fs::create_dir_all(&state)?;
    for f in ["ready", "pid"] {
        let _ = std::fs::remove_file(state.join(f));
    }
    let log = std::fs::File::create(state.join("serve.log"))?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args([
        "cluster",
        "serve",
        "--nodes",
        &nodes.to_string(),
        "--kubeconfig",
    ])
    .arg(kubeconfig)
    .stdin(Stdio::null())
    .stdout(log.try_clone()?)
    .stderr(log);
    // SAFETY: setsid is async-signal-safe. A session of its own: the
    // cluster outlives this command and the terminal's signals.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting weir-lab cluster serve")?;
    std::fs::write(state.join("pid"), child.id().to_string())?;
    let start = Instant::now();
    let mut shown = 0;
    loop {
        let log = std::fs::read_to_string(state.join("serve.log")).unwrap_or_default();
        for line in log.lines().skip(shown) {
            println!("{line}");
        }
        shown = log.lines().count();
        if state.join("ready").exists() {
            break;
        }
        if let Some(status) = child.try_wait()? {
            bail!(
                "the cluster did not come up ({status}); its log: {}",
                state.join("serve.log").display()
            );
        }
        if start.elapsed() > Duration::from_secs(600) {
            bail!("the cluster did not come up within 10 minutes; `cargo xtask cluster down`");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("cluster up in {:.1} s", start.elapsed().as_secs_f64());
    print!("{}", std::fs::read_to_string(state.join("ready"))?);
    Ok(())
}

fn serve(nodes: u8, kubeconfig: &Path) -> Result<()> {
    let options = Options {
        nodes,
        ..Options::default()
    };
    let cluster = LocalCluster::up(&options, |step| println!("==> {step}"))?;
    if let Some(dir) = kubeconfig.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::copy(cluster.kubeconfig(), kubeconfig)?;
    let names: Vec<&str> = cluster.nodes.iter().map(|n| n.name.as_str()).collect();
    let ready = format!(
        "nodes: {}\nkubeconfig: {k}\nsample image: {SAMPLE_IMAGE}\n\
         try: kubectl --kubeconfig {k} create deployment web --image={SAMPLE_IMAGE} --replicas=3\n\
         \x20    kubectl --kubeconfig {k} expose deployment web --port=80 --target-port=8080\n\
         stop it: cargo xtask cluster down\n",
        names.join(", "),
        k = kubeconfig.display(),
    );
    let tmp = state_dir().join(".ready");
    std::fs::write(&tmp, ready)?;
    std::fs::rename(&tmp, state_dir().join("ready"))?;
    cluster.api.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        anyhow::Ok(())
    })?;
    println!("==> stopping");
    drop(cluster);
    println!("==> stopped");
    Ok(())
}

fn down() -> Result<()> {
    let state = state_dir();
    match running() {
        None => println!("no cluster is running"),
        Some(pid) => {
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let start = Instant::now();
            while Path::new(&format!("/proc/{pid}")).exists() {
                if start.elapsed() > Duration::from_secs(120) {
                    // SAFETY: as above.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    std::thread::sleep(Duration::from_millis(500));
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            println!("cluster stopped in {:.1} s", start.elapsed().as_secs_f64());
        }
    }
    // Whatever a killed server left (its pid is gone now, so sweep sees it).
    weir_integration::sweep::sweep();
    for f in ["ready", "pid"] {
        let _ = std::fs::remove_file(state.join(f));
    }
    Ok(())
}

fn status() -> Result<()> {
    let Some(pid) = running() else {
        println!("no cluster is running: `cargo xtask cluster up`");
        return Ok(());
    };
    let ready = std::fs::read_to_string(state_dir().join("ready")).unwrap_or_default();
    let Some(kubeconfig) = ready.lines().find_map(|l| l.strip_prefix("kubeconfig: ")) else {
        println!(
            "the cluster (pid {pid}) is still starting: {}",
            state_dir().join("serve.log").display()
        );
        return Ok(());
    };
    for args in [
        &["get", "nodes", "-o", "wide"][..],
        &["get", "pods", "-A", "-o", "wide"],
        &["get", "services", "-A"],
    ] {
        println!("$ kubectl {}", args.join(" "));
        let ok = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .status()?
            .success();
        if !ok {
            bail!("kubectl {} failed", args.join(" "));
        }
        println!();
    }
    Ok(())
}
