//! The datapath outlives the agent: pinned maps and links keep serving while it
//! is down, and a new agent takes over the links atomically.
use std::{process::Command, time::Duration};

use anyhow::Result;
use weir_integration::{Agent, Topology, bin, manifest, topology::Probe};

const VIP: &str = "10.96.0.10";

fn link_ids(topo: &Topology) -> Result<Vec<(u64, u64)>> {
    let mut ids = Vec::new();
    for hook in ["connect4", "sendmsg4", "recvmsg4", "getpeername4"] {
        let out = Command::new("bpftool")
            .args(["-j", "link", "show", "pinned"])
            .arg(topo.pin_dir().join("links").join(hook))
            .output()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        ids.push((
            v["id"].as_u64().unwrap_or(0),
            v["prog_id"].as_u64().unwrap_or(0),
        ));
    }
    Ok(ids)
}

#[test]
fn connections_survive_sigkill_and_restarts_under_load() -> Result<()> {
    let topo = Topology::new(3)?;
    let eps: Vec<_> = topo
        .backends
        .iter()
        .map(|b| (b.ip, manifest::READY))
        .collect();
    topo.write_manifest("web.yaml", &manifest::service("web", VIP))?;
    topo.write_manifest("web-slice.yaml", &manifest::slice("web-1", "web", &eps))?;
    let mut agent = Agent::start(&topo, &[])?;
    let before = link_ids(&topo)?;

    agent.stop(libc::SIGKILL)?;
    let p = topo.probe("tcp", &format!("{VIP}:80"), 100)?;
    assert_eq!(p.ok, 100, "with the agent killed: {p:?}");
    assert_eq!(p.backends.len(), 3, "{p:?}");

    // A client connects in a loop while the agent is restarted three times.
    let client = topo
        .client(bin("weir-testclient"))
        .args([
            "tcp",
            "--target",
            &format!("{VIP}:80"),
            "--duration-ms",
            "6000",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..3 {
        agent.restart()?;
        std::thread::sleep(Duration::from_millis(300));
    }
    let p = Probe::parse(&client.wait_with_output()?)?;
    assert!(p.attempts > 100, "too few attempts to mean anything: {p:?}");
    assert_eq!(
        p.ok, p.attempts,
        "connections failed across restarts: {p:?}"
    );

    // Same links, new programs: the takeover was a BPF_LINK_UPDATE, not a
    // detach and re-attach.
    let after = link_ids(&topo)?;
    for ((l0, p0), (l1, p1)) in before.iter().zip(&after) {
        assert_eq!(l0, l1, "link was replaced: {before:?} → {after:?}");
        assert_ne!(p0, p1, "program was not updated: {before:?} → {after:?}");
    }
    assert!(agent.is_running());
    Ok(())
}
