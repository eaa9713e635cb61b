//! Bad input is reported with its file, object and field, and costs nothing
//! else its state.
use std::time::Duration;

use anyhow::Result;
use weir_integration::{Agent, Topology, agent::backends_of, manifest};

const GOOD_VIP: &str = "10.96.0.10";

fn service(name: &str, ip: &str, port: &str, proto: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  clusterIP: \"{ip}\"\n  ports: [{{name: http, port: {port}, protocol: {proto}}}]\n"
    )
}

fn assert_logged(log: &str, needles: &[&str]) {
    assert!(
        log.lines().any(|l| needles.iter().all(|n| l.contains(n))),
        "no log line contains all of {needles:?}; log:\n{log}"
    );
}

#[test]
fn each_bad_input_is_named_and_isolated() -> Result<()> {
    let topo = Topology::new(3)?;
    let (be1, be2, be3) = (
        topo.backend("be1").ip,
        topo.backend("be2").ip,
        topo.backend("be3").ip,
    );
    topo.write_manifest("good.yaml", &manifest::service("good", GOOD_VIP))?;
    topo.write_manifest(
        "good-slice.yaml",
        &manifest::slice("good-1", "good", &[(be1, manifest::READY)]),
    )?;
    topo.write_manifest(
        "bad-ip.yaml",
        &service("bad-ip", "10.96.0.999", "80", "TCP"),
    )?;
    topo.write_manifest(
        "bad-port0.yaml",
        &service("bad-port0", "10.96.1.1", "0", "TCP"),
    )?;
    topo.write_manifest(
        "bad-port-big.yaml",
        &service("bad-port-big", "10.96.1.2", "70000", "TCP"),
    )?;
    topo.write_manifest(
        "bad-proto.yaml",
        &service("bad-proto", "10.96.1.3", "80", "FOO"),
    )?;
    topo.write_manifest("garbage.yaml", "this: is: not: yaml: [\n")?;
    // A slice with one bad address keeps its good endpoint.
    topo.write_manifest(
        "mixed-slice.yaml",
        &format!(
            "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: mixed-1\n  labels: {{kubernetes.io/service-name: mixed}}\naddressType: IPv4\nports: [{{name: http, port: 8080, protocol: TCP}}]\nendpoints:\n- addresses: [\"10.77.0.300\"]\n- addresses: [\"{be2}\"]\n"
        ),
    )?;
    topo.write_manifest("mixed.yaml", &service("mixed", "10.96.2.1", "80", "TCP"))?;
    topo.write_manifest(
        "fqdn.yaml",
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: ext-1\n  labels: {kubernetes.io/service-name: good}\naddressType: FQDN\nendpoints:\n- addresses: [\"example.invalid\"]\n",
    )?;
    let mut agent = Agent::start(&topo, &[])?;
    let log = agent.log_text();
    assert_logged(
        &log,
        &[
            "bad-ip.yaml",
            "Service/default/bad-ip",
            "spec.clusterIP",
            "10.96.0.999",
        ],
    );
    assert_logged(
        &log,
        &[
            "bad-port0.yaml",
            "Service/default/bad-port0",
            "spec.ports[0].port",
            "out of range",
        ],
    );
    assert_logged(
        &log,
        &[
            "bad-port-big.yaml",
            "Service/default/bad-port-big",
            "spec.ports[0].port",
            "70000",
        ],
    );
    assert_logged(
        &log,
        &[
            "bad-proto.yaml",
            "Service/default/bad-proto",
            "spec.ports[0].protocol",
            "FOO",
        ],
    );
    assert_logged(&log, &["garbage.yaml", "not valid YAML"]);
    assert_logged(
        &log,
        &[
            "mixed-slice.yaml",
            "EndpointSlice/default/mixed-1",
            "endpoints[0].addresses[0]",
            "10.77.0.300",
        ],
    );
    assert_logged(&log, &["fqdn.yaml", "FQDN"]);

    let views = agent.inspect()?;
    assert_eq!(
        backends_of(&views, GOOD_VIP, 80, "TCP"),
        Some(vec![format!("{be1}:8080")])
    );
    assert_eq!(
        backends_of(&views, "10.96.2.1", 80, "TCP"),
        Some(vec![format!("{be2}:8080")])
    );
    let frontends: Vec<String> = views
        .iter()
        .map(|v| format!("{}:{}/{}", v.vip, v.port, v.protocol))
        .collect();
    assert_eq!(
        frontends,
        ["10.96.0.10:53/UDP", "10.96.0.10:80/TCP", "10.96.2.1:80/TCP"],
        "only the good and the mixed service are programmed"
    );
    assert_eq!(
        topo.probe("tcp", &format!("{GOOD_VIP}:80"), 20)?
            .backends
            .get("be1"),
        Some(&20)
    );

    // A slice whose Service does not exist yet takes effect when it appears.
    topo.write_manifest(
        "late-slice.yaml",
        &manifest::slice("late-1", "late", &[(be3, manifest::READY)]),
    )?;
    std::thread::sleep(Duration::from_millis(300));
    assert!(backends_of(&agent.inspect()?, "10.96.3.1", 80, "TCP").is_none());
    topo.write_manifest("late.yaml", &manifest::service("late", "10.96.3.1"))?;
    agent.wait_for(Duration::from_secs(2), |v| {
        backends_of(v, "10.96.3.1", 80, "TCP").is_some_and(|b| b.len() == 1)
    })?;
    assert_eq!(
        topo.probe("tcp", "10.96.3.1:80", 10)?.backends.get("be3"),
        Some(&10)
    );

    // Breaking a working Service's file keeps its last good version serving.
    topo.write_manifest("good.yaml", &service("good", "not-an-ip", "80", "TCP"))?;
    std::thread::sleep(Duration::from_millis(300));
    assert_logged(
        &agent.log_text(),
        &[
            "good.yaml",
            "Service/default/good",
            "keeping its previous version",
        ],
    );
    assert_eq!(topo.probe("tcp", &format!("{GOOD_VIP}:80"), 10)?.ok, 10);
    assert!(agent.is_running());
    Ok(())
}

/// Entries in a pinned map, read with bpftool rather than through the agent.
fn map_len(topo: &Topology, map: &str) -> Result<usize> {
    weir_integration::pinned_map_len(&topo.pin_dir().join("maps").join(map))
}

#[test]
fn a_full_map_fails_only_the_service_that_does_not_fit() -> Result<()> {
    let topo = Topology::new(3)?;
    let eps = topo.ready_endpoints();
    // "a" needs 2 frontends × 3 backends = 6 backend ids; so does "b". Room
    // for 8 fits one of them; b's two masters take no backend.
    topo.write_manifest("a-slice.yaml", &manifest::slice("a-1", "a", &eps))?;
    topo.write_manifest("a.yaml", &manifest::service("a", "10.96.0.1"))?;
    let mut agent = Agent::start(&topo, &["--max-backends", "8"])?;
    assert_eq!(map_len(&topo, weir_abi::MAP_SERVICES)?, 2);
    // The slice first, so b never exists without its endpoints.
    topo.write_manifest("b-slice.yaml", &manifest::slice("b-1", "b", &eps))?;
    topo.write_manifest("b.yaml", &manifest::service("b", "10.96.0.2"))?;
    agent.wait_for(Duration::from_secs(5), |v| {
        backends_of(v, "10.96.0.2", 80, "TCP").is_some()
    })?;
    assert_logged(
        &agent.log_text(),
        &["default/b", "WEIR_BACKEND", "--max-backends"],
    );
    // b is not half-written: its frontends hold a master each and nothing else,
    // so its VIP refuses connections rather than leaking to the network.
    let views = agent.inspect()?;
    assert_eq!(backends_of(&views, "10.96.0.2", 80, "TCP"), Some(vec![]));
    assert_eq!(backends_of(&views, "10.96.0.2", 53, "UDP"), Some(vec![]));
    assert_eq!(map_len(&topo, weir_abi::MAP_SERVICES)?, 4);
    assert_eq!(
        map_len(&topo, weir_abi::MAP_BACKENDS)?,
        6,
        "only a's backends"
    );
    let p = topo.probe("tcp", "10.96.0.2:80", 5)?;
    assert_eq!(p.errors.get("ECONNREFUSED"), Some(&5), "{p:?}");
    assert_eq!(topo.probe("tcp", "10.96.0.1:80", 30)?.ok, 30);

    // Freeing room lets the retry program b without any change to b.
    topo.remove_manifest("a.yaml")?;
    agent.wait_for(Duration::from_secs(5), |v| {
        backends_of(v, "10.96.0.2", 80, "TCP").is_some_and(|b| b.len() == 3)
    })?;
    assert_eq!(topo.probe("tcp", "10.96.0.2:80", 30)?.ok, 30);
    assert!(agent.is_running());
    Ok(())
}
