//! One agent per bpffs directory (issue 12, item 14): a second agent fails
//! fast naming the first one's pid, and `cleanup` refuses a live agent
//! unless `--force`. Needs root.
use std::{
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Result, ensure};
use weir_integration::{
    Agent, Topology,
    agent::{AgentProcess, agent_command, backends_of},
    bin, manifest,
};

const VIP: &str = "10.96.0.10";

fn cleanup(topo: &Topology, force: bool) -> Result<std::process::Output> {
    let mut cmd = Command::new(bin("weir-agent"));
    cmd.arg("cleanup").arg("--bpffs").arg(topo.pin_dir());
    if force {
        cmd.arg("--force");
    }
    Ok(cmd.output()?)
}

#[test]
fn a_second_agent_and_cleanup_refuse_a_live_agents_pins() -> Result<()> {
    let topo = Topology::new(1)?;
    let eps = topo.ready_endpoints();
    topo.write_manifest("web.yaml", &manifest::service("web", VIP))?;
    topo.write_manifest("web-slice.yaml", &manifest::slice("web-1", "web", &eps))?;
    let mut first = Agent::start(&topo, &[])?;
    let first_pid = first.pid().expect("running");

    // The second agent: same pins, its own ports.
    let mut second = AgentProcess::new(topo.dir.join("second.log"));
    let mut cmd = agent_command(None);
    cmd.arg("--manifests")
        .arg(&topo.manifests)
        .arg("--cgroup")
        .arg(&topo.cgroup.path)
        .arg("--bpffs")
        .arg(topo.pin_dir())
        .args([
            "--metrics-addr",
            "127.0.0.1:0",
            "--healthz-addr",
            "127.0.0.1:0",
        ]);
    second.launch(cmd)?;
    let start = Instant::now();
    while second.is_running() {
        ensure!(
            start.elapsed() < Duration::from_secs(5),
            "a second agent on the same pins is still running after 5 s; its log:\n{}",
            second.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = second.log_text();
    ensure!(
        log.contains(&format!("pid {first_pid}"))
            && log.contains(&topo.pin_dir().display().to_string()),
        "the second agent names the first one's pid and the directory:\n{log}"
    );
    ensure!(
        !log.contains("initial sync complete"),
        "the second agent took over:\n{log}"
    );

    // cleanup against the live agent: refused, nothing removed.
    let out = cleanup(&topo, false)?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success(),
        "cleanup of a live agent's pins succeeded"
    );
    ensure!(
        err.contains(&format!("pid {first_pid}")) && err.contains("--force"),
        "{err}"
    );
    ensure!(
        backends_of(&first.inspect()?, VIP, 80, "TCP").is_some_and(|b| b.len() == 1),
        "the pins are intact"
    );
    let p = topo.probe("tcp", &format!("{VIP}:80"), 10)?;
    ensure!(p.ok == 10, "the datapath still serves: {p:?}");
    ensure!(first.is_running());

    // --force does it anyway.
    let out = cleanup(&topo, true)?;
    ensure!(
        out.status.success(),
        "cleanup --force: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(!topo.pin_dir().join("maps").exists(), "maps removed");

    // Once the agent is gone its lock is too: a new agent starts, and a
    // plain cleanup after it stops goes through.
    first.stop(libc::SIGKILL)?;
    let mut third = Agent::start(&topo, &[])?;
    ensure!(
        backends_of(&third.inspect()?, VIP, 80, "TCP").is_some_and(|b| b.len() == 1),
        "the new agent programs the Service"
    );
    third.stop(libc::SIGTERM)?;
    let out = cleanup(&topo, false)?;
    ensure!(
        out.status.success(),
        "cleanup after the agent stopped: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}
