//! `cargo xtask demo-datapath`: the datapath alone. Makes a throwaway topology (a node
//! namespace and three backend namespaces), runs the agent on a sample
//! manifests directory, shows requests through a ClusterIP landing on different
//! backends, prints the pinned maps, scales the Service, and tears it all down.
//! Then the per-packet datapath (demo_packet.rs): NodePort and LB IP from an
//! external client, SNAT against externalTrafficPolicy Local, conntrack, XDP.
use std::{process::Command, time::Duration};

use anyhow::{Context as _, Result};
use weir_integration::{Agent, Topology, manifest};

use crate::demo_packet;

const VIP: &str = "10.96.0.10";

pub fn run() -> Result<()> {
    step("Creating a node namespace with three backend namespaces (be1..be3)");
    let mut topo = Topology::new(3)?;
    for b in &topo.backends {
        println!(
            "    {} at {} (TCP 8080 answers HTTP with its name, UDP 5353 echoes it)",
            b.name, b.ip
        );
    }

    step(&format!(
        "Writing the sample manifests: Service web {VIP} (80/TCP, 53/UDP) and its EndpointSlice"
    ));
    let eps = topo.ready_endpoints();
    topo.write_manifest("web.yaml", &manifest::service("web", VIP))?;
    topo.write_manifest("web-slice.yaml", &manifest::slice("web-1", "web", &eps))?;
    println!("    {}", topo.manifests.display());

    step("Starting weir-agent in standalone mode on a child cgroup of the node");
    let agent = Agent::start(&topo, &[])?;
    println!(
        "    pid {}, pins under {}",
        agent.pid().unwrap_or(0),
        topo.pin_dir().display()
    );

    step(&format!(
        "Six curl requests to http://{VIP}/ from inside the cgroup"
    ));
    for _ in 0..6 {
        let out = topo
            .client("curl")
            .args([
                "-sS",
                "-m",
                "3",
                "-w",
                " (peer seen by curl: %{remote_ip}:%{remote_port})",
                &format!("http://{VIP}/"),
            ])
            .output()?;
        println!(
            "    answered by {}",
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .replace('\n', "")
        );
    }

    step("300 new TCP connections and 300 UDP datagrams through the ClusterIP");
    for (mode, target) in [("tcp", format!("{VIP}:80")), ("udp", format!("{VIP}:53"))] {
        let p = topo.probe(mode, &target, 300)?;
        println!(
            "    {mode:<3} ok {}/{}  per backend {:?}  peer shown as the VIP: {}",
            p.ok,
            p.attempts,
            p.backends,
            p.peer_mismatch == 0
        );
    }

    step("What the kernel holds: weir-agent inspect services (read from the pinned maps)");
    print_inspect(&topo)?;

    step("Scaling to five backends: the slice file is rewritten, the agent applies it");
    topo.add_backend()?;
    topo.add_backend()?;
    let eps = topo.ready_endpoints();
    topo.write_manifest("web-slice.yaml", &manifest::slice("web-1", "web", &eps))?;
    let took = agent.wait_for(Duration::from_secs(5), |v| {
        v.iter().all(|s| s.backends.len() == 5)
    })?;
    println!("    applied in {:.0} ms", took.as_secs_f64() * 1000.0);
    let p = topo.probe("tcp", &format!("{VIP}:80"), 300)?;
    println!(
        "    tcp ok {}/{}  per backend {:?}",
        p.ok, p.attempts, p.backends
    );

    step("Removing the Service: connections are no longer translated");
    topo.remove_manifest("web.yaml")?;
    agent.wait_for(Duration::from_secs(5), <[_]>::is_empty)?;
    print_inspect(&topo)?;

    step("Tearing down (agent, namespaces, cgroup, bpffs)");
    drop(agent);
    drop(topo);

    demo_packet::run()?;
    println!("\nDone. Run the tests with: cargo xtask test");
    Ok(())
}

fn step(s: &str) {
    println!("\n==> {s}");
}

fn print_inspect(topo: &Topology) -> Result<()> {
    let out = Command::new(weir_integration::bin("weir-agent"))
        .args(["inspect", "services", "--bpffs"])
        .arg(topo.pin_dir())
        .output()
        .context("running weir-agent inspect")?;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        println!("    {line}");
    }
    Ok(())
}
