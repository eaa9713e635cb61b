//! Devices that appear, vanish and come back while the agent runs get the TC
//! program, lose it and get it again as soon as the kernel announces the
//! change (the periodic rescan is pushed out to an hour here, so only the
//! link notifications can be what attaches them), and their addresses become
//! NodePort addresses.
use anyhow::{Result, ensure};
use weir_abi::{STAT_NEW_FLOW, STAT_PROG_TC_INGRESS};
use weir_integration::packet_topology::{
    BRIDGE_NODE4, BRIDGE_NODE6, LPOD, Ns, PacketAgent, PacketTopology, RPOD,
    manifests::{Ep, READY, Svc},
};

use crate::support::{SETTLE, alive, linked_program, poll, publish, serving, who};

const DEV: &str = "wlate0";
const NODE_PORT: u16 = 30490;

#[test]
fn devices_get_the_program_as_the_kernel_announces_them_and_lose_it_when_they_go() -> Result<()> {
    let topo = PacketTopology::new()?;
    let svc = Svc::node_port(
        "late",
        "10.96.6.10",
        "fd00:96::6:10",
        [NODE_PORT, 30763, 30463],
    );
    publish(&topo, &svc, &[Ep::of(LPOD, READY), Ep::of(RPOD, READY)])?;
    let mut agent = PacketAgent::start(
        &topo,
        &[
            "--devices",
            &format!("wext,wpod,wnode2,{DEV}"),
            "--device-rescan-interval",
            "1h",
        ],
    )?;
    agent.wait_for_log_line(
        0,
        &[
            "WARN",
            &format!("device {DEV} (from --devices) does not exist"),
        ],
        SETTLE,
    )?;
    // Subscribed: without notifications it would list every 5 s instead.
    agent.wait_for_log_line(0, &["re-reading devices on every change"], SETTLE)?;
    let pin = agent.pin_dir().join("links").join(format!("tc-{DEV}"));
    ensure!(
        !pin.exists(),
        "{} pinned before {DEV} existed",
        pin.display()
    );

    // It appears (a bridge with one port towards the client).
    topo.add_device_without_xdp(DEV)?;
    attached(&agent)?;
    translates_through_it(&topo, &agent)?;

    // Gone: its pinned link with it.
    topo.remove_device_without_xdp(DEV, &format!("{DEV}p"))?;
    poll(SETTLE, &format!("{} removed", pin.display()), || {
        Ok(if pin.exists() { Err(()) } else { Ok(()) })
    })?;

    // Back, as a new device (a new ifindex; the old link died with the old
    // device): attached again, and traffic through it is translated again.
    topo.add_device_without_xdp(DEV)?;
    attached(&agent)?;
    translates_through_it(&topo, &agent)?;
    alive(&mut agent)
}

/// `--devices=auto` finds a device whose only default route lives in
/// another routing table (policy routing, as VRFs and multi-homed nodes
/// have it), which `/proc/net/route` never showed; it is attached as soon
/// as the route appears, and not before.
#[test]
fn auto_finds_a_default_route_in_another_routing_table() -> Result<()> {
    let topo = PacketTopology::new()?;
    topo.add_device_without_xdp(DEV)?;
    let mut agent =
        PacketAgent::start(&topo, &["--devices=auto", "--device-rescan-interval", "1h"])?;
    agent.wait_for_log_line(0, &["re-reading devices on every change"], SETTLE)?;
    // The pods' veths are attached at the first listing; the bridge, with
    // no default route anywhere, is not.
    poll(SETTLE, "a veth attached", || {
        let any_tc = std::fs::read_dir(agent.pin_dir().join("links"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("tc-"));
        Ok(if any_tc {
            Ok(())
        } else {
            Err("no tc link yet")
        })
    })?;
    let pin = agent.pin_dir().join("links").join(format!("tc-{DEV}"));
    ensure!(!pin.exists(), "{DEV} attached without a default route");

    topo.node.sh(&format!(
        "ip route add default dev {DEV} table 100 && ip rule add from 192.0.2.0/24 table 100 \
         && ip -6 route add default dev {DEV} table 100"
    ))?;
    attached(&agent)?;
    alive(&mut agent)
}

/// Waits until the agent has pinned a tcx link on [`DEV`] running
/// `weir_tc_ingress`.
fn attached(agent: &PacketAgent) -> Result<()> {
    poll(SETTLE, &format!("weir_tc_ingress on {DEV}"), || {
        Ok(match linked_program(agent, &format!("tc-{DEV}")) {
            Ok(p) if p == "weir_tc_ingress" => Ok(()),
            Ok(p) => Err(p),
            Err(e) => Err(e.to_string()),
        })
    })
}

/// The NodePort on the bridge's addresses (new node addresses) answers in
/// both families, and the TC program made the flows: nothing else on the node
/// translates NodePorts.
fn translates_through_it(topo: &PacketTopology, agent: &PacketAgent) -> Result<()> {
    for ip in [BRIDGE_NODE4, BRIDGE_NODE6] {
        serving(topo, Ns::Client, ip, NODE_PORT)?;
        let before = agent.stat(STAT_PROG_TC_INGRESS, STAT_NEW_FLOW)?;
        const N: u64 = 3;
        for _ in 0..N {
            who(topo, Ns::Client, ip, NODE_PORT)?;
        }
        let after = agent.stat(STAT_PROG_TC_INGRESS, STAT_NEW_FLOW)?;
        ensure!(
            after >= before + N,
            "{ip}:{NODE_PORT} through {DEV}: tc-ingress new-flow went from {before} to {after} for {N} flows"
        );
    }
    Ok(())
}
