//! The datapath outlives the agent: pinned maps and links keep serving while it
//! is down, and a new agent takes over the links atomically.
use std::{process::Command, time::Duration};

use anyhow::Result;
use weir_integration::{Agent, Topology, bin, manifest, topology::Probe};

const VIP: &str = "10.96.0.10";

fn link_ids(topo: &Topology) -> Result<Vec<(u64, u64)>> {
    let mut ids = Vec::new();
    for hook in ["connect4", "sendmsg4", "recvmsg4", "getpeername4"] {
        let path = topo.pin_dir().join("links").join(hook);
        let v = weir_integration::bpftool(&[
            "link".as_ref(),
            "show".as_ref(),
            "pinned".as_ref(),
            path.as_os_str(),
        ])?;
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
    let eps = topo.ready_endpoints();
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

/// The last "initial sync complete" line's `key=value` field.
fn last_sync_field(log: &str, key: &str) -> Option<u64> {
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("initial sync complete"))?;
    let v = line.split(&format!("{key}=")).nth(1)?;
    v.split_whitespace().next()?.parse().ok()
}

#[test]
fn a_restart_rewrites_only_what_changed_while_the_agent_was_down() -> Result<()> {
    let topo = Topology::new(3)?;
    let (be1, be2, be3) = (
        topo.backend("be1").ip,
        topo.backend("be2").ip,
        topo.backend("be3").ip,
    );
    for (name, ip) in [("a", "10.96.0.1"), ("b", "10.96.0.2"), ("c", "10.96.0.3")] {
        topo.write_manifest(&format!("{name}.yaml"), &manifest::service(name, ip))?;
        let eps = [(be1, manifest::READY), (be2, manifest::READY)];
        topo.write_manifest(
            &format!("{name}-slice.yaml"),
            &manifest::slice(&format!("{name}-1"), name, &eps),
        )?;
    }
    let mut agent = Agent::start(&topo, &[])?;

    // Unchanged input: the restarted agent writes nothing.
    agent.restart()?;
    assert_eq!(
        last_sync_field(&agent.log_text(), "map_ops"),
        Some(0),
        "{}",
        agent.log_text()
    );

    // While it is down, b is deleted and c gains a backend.
    agent.stop(libc::SIGTERM)?;
    topo.remove_manifest("b.yaml")?;
    let eps = [
        (be1, manifest::READY),
        (be2, manifest::READY),
        (be3, manifest::READY),
    ];
    topo.write_manifest("c-slice.yaml", &manifest::slice("c-1", "c", &eps))?;
    // Read from the pins alone, with no agent running: each frontend still
    // names its Service port and type.
    let a_before = weir_integration::agent::inspect(&topo.pin_dir())?;
    let named = |views: &[weir_integration::ServiceView]| -> Vec<String> {
        let mut out: Vec<String> = views
            .iter()
            .map(|v| {
                let part = |p: &Option<String>| p.clone().unwrap_or_else(|| "?".into());
                format!(
                    "{}:{}/{} {}/{}:{} {}",
                    v.vip,
                    v.port,
                    v.protocol,
                    part(&v.namespace),
                    part(&v.name),
                    part(&v.port_name),
                    part(&v.kind)
                )
            })
            .collect();
        out.sort();
        out
    };
    let labelled = |svcs: &[(&str, &str)]| -> Vec<String> {
        let mut out: Vec<String> = svcs
            .iter()
            .flat_map(|(name, ip)| {
                [
                    format!("{ip}:53/UDP default/{name}:dns ClusterIP"),
                    format!("{ip}:80/TCP default/{name}:http ClusterIP"),
                ]
            })
            .collect();
        out.sort();
        out
    };
    assert_eq!(
        named(&a_before),
        labelled(&[("a", "10.96.0.1"), ("b", "10.96.0.2"), ("c", "10.96.0.3")])
    );
    let mut agent = Agent::start(&topo, &[])?;
    let log = agent.log_text();
    assert_eq!(
        last_sync_field(&log, "stale_removed"),
        Some(2),
        "b's two frontends: {log}"
    );
    let views = agent.inspect()?;
    let fe = |v: &[weir_integration::ServiceView], ip: &str| {
        v.iter()
            .filter(|s| s.vip.to_string() == ip)
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(fe(&views, "10.96.0.1"), fe(&a_before, "10.96.0.1"));
    assert_eq!(
        named(&views),
        labelled(&[("a", "10.96.0.1"), ("c", "10.96.0.3")])
    );
    assert!(fe(&views, "10.96.0.2").is_empty(), "{views:#?}");
    assert!(
        fe(&views, "10.96.0.3")
            .iter()
            .all(|s| s.backends.len() == 3),
        "{views:#?}"
    );
    assert_eq!(
        topo.probe("tcp", "10.96.0.2:80", 1)?
            .errors
            .get("ENETUNREACH"),
        Some(&1)
    );
    assert_eq!(topo.probe("tcp", "10.96.0.3:80", 150)?.backends.len(), 3);

    // cleanup detaches everything and removes every pin: the VIPs are plain
    // unroutable addresses again.
    agent.stop(libc::SIGTERM)?;
    let out = cleanup(&topo)?;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        // Nine socket hooks (v4 and v6, and sock_release) and twelve maps
        // plus those links.
        "detached 9 links, removed 22 pins"
    );
    assert!(!topo.pin_dir().exists(), "pins left behind");
    assert_eq!(
        topo.probe("tcp", "10.96.0.1:80", 1)?
            .errors
            .get("ENETUNREACH"),
        Some(&1)
    );
    let cg_progs = Command::new("bpftool")
        .args(["cgroup", "show"])
        .arg(&topo.cgroup.path)
        .output()?;
    assert!(
        String::from_utf8_lossy(&cg_progs.stdout).trim().is_empty(),
        "programs still attached: {}",
        String::from_utf8_lossy(&cg_progs.stdout)
    );
    Ok(())
}

/// `weir-agent cleanup` on the topology's pins; its output, once it succeeded.
fn cleanup(topo: &Topology) -> Result<std::process::Output> {
    let out = Command::new(bin("weir-agent"))
        .args(["cleanup", "--bpffs"])
        .arg(topo.pin_dir())
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out)
}

/// The flags of the map pinned at `name`.
fn map_flags(topo: &Topology, name: &str) -> Result<u64> {
    let v = weir_integration::pinned_map_show(&topo.pin_dir().join("maps").join(name))?;
    v["flags"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("no flags for {name}: {v}"))
}

/// Earlier agents pinned the services and backends maps unpreallocated, and
/// the backends map as a hash. A new agent takes the services map over as it
/// is (the layout is the same) and says how to get the faster kind; it
/// carries the backends over to an array; and it serves. A cleanup and a
/// start give the faster services map.
#[test]
fn maps_pinned_without_preallocation_by_an_older_agent_keep_serving() -> Result<()> {
    const NO_PREALLOC: u64 = 1;
    let topo = Topology::new(2)?;
    let eps = topo.ready_endpoints();
    topo.write_manifest("web.yaml", &manifest::service("web", VIP))?;
    topo.write_manifest("web-slice.yaml", &manifest::slice("web-1", "web", &eps))?;
    let maps = topo.pin_dir().join("maps");
    std::fs::create_dir_all(&maps)?;
    // This build's layouts and default sizes, as the older agent made them.
    for (name, key, value, entries) in [
        (
            weir_abi::MAP_SERVICES,
            size_of::<weir_abi::ServiceKey>(),
            size_of::<weir_abi::ServiceValue>(),
            weir_abi::DEFAULT_MAX_SERVICES,
        ),
        (
            weir_abi::MAP_BACKENDS,
            size_of::<u32>(),
            size_of::<weir_abi::Backend>(),
            weir_abi::DEFAULT_MAX_BACKENDS,
        ),
    ] {
        let out = Command::new("bpftool")
            .args(["map", "create"])
            .arg(maps.join(name))
            .args([
                "type",
                "hash",
                "key",
                &key.to_string(),
                "value",
                &value.to_string(),
            ])
            .args(["entries", &entries.to_string(), "name", name, "flags", "1"])
            .output()?;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let mut agent = Agent::start(&topo, &[])?;
    let log = agent.log_text();
    assert_eq!(map_flags(&topo, "WEIR_SVC")?, NO_PREALLOC);
    assert!(
        log.lines()
            .any(|l| l.contains("allocates per entry") && l.contains("WEIR_SVC")),
        "no warning for WEIR_SVC: {log}"
    );
    assert!(log.contains("carried the backends"), "{log}");
    let backends = topo.pin_dir().join("maps").join("WEIR_BACKEND");
    assert_eq!(
        weir_integration::pinned_map_show(&backends)?["type"],
        "array"
    );
    let p = topo.probe("tcp", &format!("{VIP}:80"), 40)?;
    assert_eq!((p.ok, p.backends.len()), (40, 2), "{p:?}");

    agent.stop(libc::SIGTERM)?;
    cleanup(&topo)?;
    let agent = Agent::start(&topo, &[])?;
    // The log goes on from the first agent's: its warning, no more.
    let log = agent.log_text();
    assert_eq!(log.matches("allocates per entry").count(), 1, "{log}");
    assert_eq!(map_flags(&topo, "WEIR_SVC")?, 0);
    // One entry a frontend, sized like the services map: allocated as used.
    assert_eq!(map_flags(&topo, "WEIR_REVNAT")?, NO_PREALLOC);
    let p = topo.probe("tcp", &format!("{VIP}:80"), 40)?;
    assert_eq!((p.ok, p.backends.len()), (40, 2), "{p:?}");
    Ok(())
}

/// `weir-agent inspect status -o json`, asking the agent at `agent`.
fn status(topo: &Topology, agent: std::net::SocketAddr, json: bool) -> Result<String> {
    let mut cmd = Command::new(bin("weir-agent"));
    cmd.args(["inspect", "status", "--agent", &agent.to_string()]);
    if json {
        cmd.args(["-o", "json"]);
    }
    let out = cmd.arg("--bpffs").arg(topo.pin_dir()).output()?;
    anyhow::ensure!(
        out.status.success(),
        "inspect status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// Entries of `map` in an `inspect status` JSON.
fn entries(status: &serde_json::Value, map: &str) -> Option<u64> {
    status["maps"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == map)?["entries"]
        .as_u64()
}

#[test]
fn inspect_status_shows_the_running_agent_then_the_pins_alone() -> Result<()> {
    let topo = Topology::new(2)?;
    topo.write_manifest("web.yaml", &manifest::service("web", VIP))?;
    let eps = [
        (topo.backend("be1").ip, manifest::READY),
        (topo.backend("be2").ip, manifest::READY),
    ];
    topo.write_manifest("web-slice.yaml", &manifest::slice("web-1", "web", &eps))?;
    let mut agent = Agent::start(&topo, &[])?;

    let s: serde_json::Value = serde_json::from_str(&status(&topo, agent.metrics_addr, true)?)?;
    let a = &s["agent"];
    assert_eq!(a["source"]["kind"], "manifests", "{s:#}");
    assert_eq!(
        (&a["healthy"], &a["node_eligible"]),
        (&true.into(), &true.into())
    );
    assert!(a["last_sync"].as_f64().is_some_and(|t| t > 1e9), "{s:#}");
    assert_eq!(s["socket_hooks"].as_array().map(Vec::len), Some(9), "{s:#}");
    // Two ports, so two frontends, each a master holding both backends.
    let want = [
        ("WEIR_SVC", 2),
        ("WEIR_BACKEND", 4),
        ("WEIR_REVNAT", 2),
        ("WEIR_SVC_LABEL", 2),
    ];
    for (map, n) in want {
        assert_eq!(entries(&s, map), Some(n), "{map}: {s:#}");
    }
    let screen = status(&topo, agent.metrics_addr, false)?;
    for line in ["Agent:      running, weir-agent", "Health:     healthy"] {
        assert!(screen.contains(line), "{screen}");
    }

    // With the agent gone, the pins still answer, and the screen says the
    // agent does not.
    let addr = agent.metrics_addr;
    agent.stop(libc::SIGTERM)?;
    let s: serde_json::Value = serde_json::from_str(&status(&topo, addr, true)?)?;
    assert!(s["agent"].is_null(), "{s:#}");
    assert!(
        s["agent_error"]
            .as_str()
            .is_some_and(|e| e.contains("refused")),
        "{s:#}"
    );
    for (map, n) in want {
        assert_eq!(entries(&s, map), Some(n), "{map}: {s:#}");
    }
    let screen = status(&topo, addr, false)?;
    assert!(
        screen.starts_with(&format!("Agent:      not answering at {addr}")),
        "{screen}"
    );

    // Pins from an agent that made no labels: inspect reads them without
    // names, and the next agent creates the map and names every frontend.
    std::fs::remove_file(topo.pin_dir().join("maps").join(weir_abi::MAP_SVC_LABELS))?;
    let views = weir_integration::agent::inspect(&topo.pin_dir())?;
    assert_eq!(views.len(), 2);
    assert!(views.iter().all(|v| v.name.is_none()), "{views:#?}");
    let agent = Agent::start(&topo, &[])?;
    let views = agent.inspect()?;
    assert!(
        views.iter().all(|v| v.name.as_deref() == Some("web")),
        "{views:#?}"
    );
    Ok(())
}
