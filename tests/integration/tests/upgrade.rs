//! Maps an older agent pinned in a layout this build replaced: the next
//! agent carries their contents over before its programs replace the old
//! ones, or refuses a layout it cannot read and leaves it where it was.
use std::process::Command;

use anyhow::Result;
use weir_integration::{Agent, Topology, manifest};

const VIP: &str = "10.96.0.10";

/// The type of the map pinned at `name`, as bpftool names it.
fn map_type(topo: &Topology, name: &str) -> Result<String> {
    let v = weir_integration::pinned_map_show(&topo.pin_dir().join("maps").join(name))?;
    v["type"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("no type for {name}: {v}"))
}

/// Creates a hash pinned at `pin` with these sizes, as bpftool makes one.
fn create_hash(pin: &std::path::Path, key: usize, value: usize, entries: u32) -> Result<()> {
    let name = pin.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let out = Command::new("bpftool")
        .args(["map", "create"])
        .arg(pin)
        .args(["type", "hash", "key", &key.to_string(), "value"])
        .arg(value.to_string())
        .args(["entries", &entries.to_string(), "name", name])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// An agent from before the backends array left its backends in a hash.
/// The next agent carries them over before its programs replace the old
/// ones, so the Service keeps its backends without a sync having to write
/// them, and no trace of the hash is left.
#[test]
fn an_older_agents_backends_hash_is_carried_over_to_the_array() -> Result<()> {
    use aya::maps::{Array, HashMap, Map, MapData};
    use weir_abi::Backend;

    let topo = Topology::new(2)?;
    let eps = topo.ready_endpoints();
    topo.write_manifest("web.yaml", &manifest::service("web", VIP))?;
    topo.write_manifest("web-slice.yaml", &manifest::slice("web-1", "web", &eps))?;
    let mut agent = Agent::start(&topo, &[])?;
    let p = topo.probe("tcp", &format!("{VIP}:80"), 20)?;
    assert_eq!((p.ok, p.backends.len()), (20, 2), "{p:?}");
    agent.stop(libc::SIGTERM)?;

    // What the older agent would have pinned: the same ids and values, in a
    // hash. The running programs keep their array while unpinned.
    let maps = topo.pin_dir().join("maps");
    let pin = maps.join(weir_abi::MAP_BACKENDS);
    let array: Array<MapData, Backend> = Array::try_from(Map::Array(MapData::from_pin(&pin)?))?;
    let held: Vec<(u32, Backend)> = (0..array.len())
        .map(|i| Ok((i, array.get(&i, 0)?)))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .filter(|(_, b)| *b != Backend::default())
        .collect();
    // Two ports (TCP and UDP), each with both endpoints.
    assert_eq!(held.len(), 4, "{held:?}");
    drop(array);
    std::fs::remove_file(&pin)?;
    create_hash(&pin, 4, size_of::<Backend>(), 1024)?;
    let mut hash: HashMap<MapData, u32, Backend> =
        HashMap::try_from(Map::HashMap(MapData::from_pin(&pin)?))?;
    for (id, b) in &held {
        hash.insert(id, b, 0)?;
    }
    drop(hash);

    let agent = Agent::start(&topo, &[])?;
    let log = agent.log_text();
    assert!(log.contains("carried the backends"), "{log}");
    assert_eq!(map_type(&topo, "WEIR_BACKEND")?, "array");
    assert!(!maps.join("WEIR_BACKEND_LEGACY").exists());
    let array: Array<MapData, Backend> = Array::try_from(Map::Array(MapData::from_pin(&pin)?))?;
    for (id, b) in &held {
        assert_eq!(array.get(id, 0)?, *b, "backend {id}");
    }
    let p = topo.probe("tcp", &format!("{VIP}:80"), 20)?;
    assert_eq!((p.ok, p.backends.len()), (20, 2), "{p:?}");
    Ok(())
}

/// A backends hash of some other layout is not carried over: it goes back
/// where it was, and the agent refuses to start, naming the pin and the
/// remedy, rather than serve from a map its programs cannot read.
#[test]
fn a_backends_hash_of_another_layout_is_refused_and_left_in_place() -> Result<()> {
    let topo = Topology::new(1)?;
    let maps = topo.pin_dir().join("maps");
    std::fs::create_dir_all(&maps)?;
    let pin = maps.join(weir_abi::MAP_BACKENDS);
    create_hash(&pin, 4, 16, 64)?;
    let err = Agent::start(&topo, &[])
        .err()
        .expect("the agent refuses the pin");
    let text = format!("{err:#}");
    for want in ["WEIR_BACKEND", "map type", "weir-agent cleanup"] {
        assert!(text.contains(want), "no {want:?} in {text}");
    }
    assert_eq!(map_type(&topo, "WEIR_BACKEND")?, "hash");
    assert!(!maps.join("WEIR_BACKEND_LEGACY").exists());
    Ok(())
}

/// An agent from before entries held several backends left a master and a
/// slot per backend. The next agent regroups them before its programs
/// replace the old ones: the Service keeps the same backends at the same
/// positions, and its first sync has nothing to write.
#[test]
fn an_older_agents_services_map_is_regrouped() -> Result<()> {
    use aya::maps::{HashMap, Map, MapData};
    use weir_abi::{SVC_IDS, ServiceKey, ServiceValue, ServiceValueV1 as OldServiceValue};

    let topo = Topology::new(3)?;
    let eps = topo.ready_endpoints();
    topo.write_manifest("web.yaml", &manifest::service("web", VIP))?;
    topo.write_manifest("web-slice.yaml", &manifest::slice("web-1", "web", &eps))?;
    let mut agent = Agent::start(&topo, &[])?;
    let p = topo.probe("tcp", &format!("{VIP}:80"), 30)?;
    assert_eq!((p.ok, p.backends.len()), (30, 3), "{p:?}");
    agent.stop(libc::SIGTERM)?;

    let pin = topo.pin_dir().join("maps").join(weir_abi::MAP_SERVICES);
    let map: HashMap<MapData, ServiceKey, ServiceValue> =
        HashMap::try_from(Map::HashMap(MapData::from_pin(&pin)?))?;
    let held: Vec<(ServiceKey, ServiceValue)> = map.iter().collect::<Result<_, _>>()?;
    drop(map);
    // Two ports (TCP and UDP), each a master holding its three backends.
    assert_eq!(held.len(), 2, "{held:?}");
    // What the older agent pinned for the same state.
    let mut old = Vec::new();
    for (k, v) in &held {
        let used = usize::from(v.count + v.qcount);
        assert!(used <= SVC_IDS && used == 3, "{v:?}");
        old.push((
            *k,
            OldServiceValue {
                backend_id: v.table_size,
                count: v.count,
                qcount: v.qcount,
                rev_nat_id: v.rev_nat_id,
                flags: v.flags,
                affinity_timeout: v.affinity_timeout,
                ..OldServiceValue::default()
            },
        ));
        for (p, &id) in v.ids[..used].iter().enumerate() {
            let slot = u16::try_from(p + 1)?;
            let value = OldServiceValue {
                backend_id: id,
                rev_nat_id: v.rev_nat_id,
                ..OldServiceValue::default()
            };
            old.push((ServiceKey { slot, ..*k }, value));
        }
    }
    std::fs::remove_file(&pin)?;
    create_hash(
        &pin,
        size_of::<ServiceKey>(),
        size_of::<OldServiceValue>(),
        1024,
    )?;
    let mut hash: HashMap<MapData, ServiceKey, OldServiceValue> =
        HashMap::try_from(Map::HashMap(MapData::from_pin(&pin)?))?;
    for (k, v) in &old {
        hash.insert(k, v, 0)?;
    }
    drop(hash);

    let agent = Agent::start(&topo, &[])?;
    let log = agent.log_text();
    assert!(
        log.contains("carried an older agent's services map"),
        "{log}"
    );
    assert!(!topo.pin_dir().join("maps/WEIR_SVC_LEGACY").exists());
    let map: HashMap<MapData, ServiceKey, ServiceValue> =
        HashMap::try_from(Map::HashMap(MapData::from_pin(&pin)?))?;
    let mut now: Vec<(ServiceKey, ServiceValue)> = map.iter().collect::<Result<_, _>>()?;
    let mut was = held;
    now.sort();
    was.sort();
    assert_eq!(now, was, "the same entries, regrouped");
    let synced = log
        .lines()
        .rev()
        .find(|l| l.contains("initial sync complete"))
        .unwrap_or_default();
    assert!(synced.contains("map_ops=0"), "{synced}");
    let p = topo.probe("tcp", &format!("{VIP}:80"), 30)?;
    assert_eq!((p.ok, p.backends.len()), (30, 3), "{p:?}");
    Ok(())
}
