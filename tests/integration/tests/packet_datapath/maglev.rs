//! Maglev (`weir.dev/lb-algorithm: maglev`): the per-packet programs send
//! each new flow from outside to the backend its tuple hashes to in the
//! frontend's table, and a second node's agent, fed the same Service, builds
//! a table that sends every tuple to the same backend.
use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr},
    path::Path,
};

use anyhow::{Context as _, Result, ensure};
use aya::maps::{Array, HashMap, Map, MapData};
use weir_abi::{
    Addr, Backend, PROTO_TCP, SCOPE_ALL, SVC_F_MAGLEV, ServiceKey, ServiceValue,
    maglev::{CHUNK, MaglevChunk, MaglevKey, flow_hash},
    pick::{self, LbMapsView},
};
use weir_integration::packet_topology::{
    CLIENT4, LPOD, Ns, PacketAgent, PacketTopology, RPOD,
    clients::CurlOpts,
    manifests::{Ep, READY, Svc},
};

use crate::support::{alive, publish, serving};

const LB4: &str = "192.168.70.40";
const PORT: u16 = 80;

fn svc() -> Svc {
    let mut s = Svc::load_balancer(
        "web-maglev",
        "10.96.1.40",
        "fd00:96::1:40",
        [30480, 30481, 30482],
        &[LB4, "fd00:70::40"],
    );
    s.annotations = vec![("weir.dev/lb-algorithm".into(), "maglev".into())];
    s
}

/// One agent's maps, read from its pins: what its programs would pick.
struct Pinned {
    services: HashMap<MapData, ServiceKey, ServiceValue>,
    backends: Array<MapData, Backend>,
    /// `WEIR_MAGLEV` as read once: (rev-NAT id, chunk) → chunk.
    chunks: BTreeMap<(u32, u32), MaglevChunk>,
}

impl Pinned {
    fn open(pin_dir: &Path) -> Result<Self> {
        let data = |name: &str| {
            let p = pin_dir.join("maps").join(name);
            MapData::from_pin(&p).with_context(|| format!("opening {}", p.display()))
        };
        let services = HashMap::try_from(Map::HashMap(data(weir_abi::MAP_SERVICES)?))?;
        let backends = Array::try_from(Map::Array(data(weir_abi::MAP_BACKENDS)?))?;
        let maglev: HashMap<MapData, MaglevKey, MaglevChunk> =
            HashMap::try_from(Map::HashMap(data(weir_abi::MAP_MAGLEV)?))?;
        let chunks = maglev
            .iter()
            .map(|kv| kv.map(|(k, v)| ((k.rev_nat_id, k.chunk), v)))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            services,
            backends,
            chunks,
        })
    }

    /// The backend (address, port) a new TCP flow from `client:sport` to
    /// `LB4:PORT` gets through the frontend's table, by the programs' own
    /// pick.
    fn pick(&self, client: Ipv4Addr, sport: u16) -> Option<(IpAddr, u16)> {
        let vip = Addr::from(LB4.parse::<IpAddr>().ok()?);
        let key = ServiceKey {
            addr: vip,
            port: PORT.to_be(),
            slot: 0,
            proto: PROTO_TCP,
            scope: SCOPE_ALL,
            _pad: [0; 2],
        };
        let master = self.service(&key)?;
        let from = Addr::from(IpAddr::V4(client));
        let hash = flow_hash(&from, &vip, sport.to_be(), PORT.to_be(), PROTO_TCP);
        let p = pick::maglev_backend(self, &master, &vip, hash)?;
        Some((IpAddr::from(p.addr), u16::from_be(p.port)))
    }
}

impl LbMapsView for Pinned {
    fn service(&self, key: &ServiceKey) -> Option<ServiceValue> {
        self.services.get(key, 0).ok()
    }
    // As the programs read it: zeros are a free id.
    fn backend(&self, id: u32) -> Option<Backend> {
        self.backends.get(&id, 0).ok().filter(|b| b.rev_nat_id != 0)
    }
    // As the programs look a position up.
    fn maglev(&self, rev_nat_id: u32, index: u32) -> Option<u32> {
        let chunk = self.chunks.get(&(rev_nat_id, index / CHUNK))?;
        chunk.ids.get((index % CHUNK) as usize).copied()
    }
}

fn pod_named(ip: IpAddr) -> &'static str {
    if ip.to_string() == LPOD.v4 {
        "lpod"
    } else {
        "rpod"
    }
}

#[test]
fn flows_from_outside_follow_the_table_and_two_nodes_agree() -> Result<()> {
    let topo = PacketTopology::new()?;
    publish(
        &topo,
        &svc(),
        &[Ep::local(LPOD, READY), Ep::remote(RPOD, READY)],
    )?;
    let mut agent = PacketAgent::start(&topo, &["--maglev-table-size=4093"])?;
    let mut node2 = PacketAgent::start_node2(&topo, &["--maglev-table-size=4093"])?;
    serving(&topo, Ns::Client, LB4, PORT)?;

    let here = Pinned::open(agent.pin_dir())?;
    let master = here
        .services
        .iter()
        .filter_map(Result::ok)
        .find(|(k, _)| IpAddr::from(k.addr) == LB4.parse::<IpAddr>().unwrap() && k.slot == 0)
        .map(|(_, v)| v)
        .context("no master for the LB IP")?;
    ensure!(
        master.flags & SVC_F_MAGLEV != 0 && master.table_size == 4093,
        "the LB frontend has no 4093-position table: {master:?}"
    );
    // Five chunks of 1000 positions, the last one padded with 0 past 4093.
    let rev = master.rev_nat_id;
    let held: Vec<u32> = here
        .chunks
        .range((rev, 0)..=(rev, u32::MAX))
        .map(|(k, _)| k.1)
        .collect();
    assert_eq!(held, [0, 1, 2, 3, 4]);
    let (table, padding) = here.chunks[&(rev, 4)].ids.split_at(93);
    assert!(table.iter().all(|&id| id != 0), "a hole in the table");
    assert!(padding.iter().all(|&id| id == 0), "ids past the end");

    // The kernel: every connection lands where the table says. Two
    // backends, so 24 agreeing connections by chance would be 1 in 16
    // million; both backends must turn up, or the ports tell nothing.
    let client: Ipv4Addr = CLIENT4.parse()?;
    let mut reached = BTreeMap::<&str, usize>::new();
    for sport in (40_000..).step_by(7).take(24) {
        let want = here
            .pick(client, sport)
            .map(|(ip, _)| pod_named(ip))
            .context("no Maglev pick for the flow")?;
        let c = topo.curl(
            Ns::Client,
            &format!("{LB4}:{PORT}/peer"),
            CurlOpts {
                local_port: Some(sport),
                ..CurlOpts::default()
            },
        )?;
        let (got, _) = c
            .who()
            .filter(|_| c.ok())
            .with_context(|| format!("curl from port {sport}: {c:?}"))?;
        assert_eq!(got, want, "flow from {CLIENT4}:{sport}");
        *reached.entry(want).or_default() += 1;
    }
    assert_eq!(reached.len(), 2, "one backend only: {reached:?}");

    // Another node, other backend ids maybe, same backend for every tuple.
    let there = Pinned::open(node2.pin_dir())?;
    let mut differ = 0;
    for i in 0..10_000u32 {
        let c = Ipv4Addr::from(0xc0a8_0000 | (i % 251 + 1) | ((i / 251) << 8));
        let sport = 1024 + (i * 37 % 60_000) as u16;
        let (a, b) = (here.pick(c, sport), there.pick(c, sport));
        ensure!(a.is_some(), "no pick on node1 for {c}:{sport}");
        differ += usize::from(a != b);
    }
    assert_eq!(differ, 0, "the nodes disagree on {differ} of 10,000 tuples");

    // A removed backend: the table is rebuilt without it on both nodes.
    publish(&topo, &svc(), &[Ep::local(LPOD, READY)])?;
    crate::support::poll(crate::support::SETTLE, "a table of lpod only", || {
        let t = Pinned::open(agent.pin_dir())?;
        let all_lpod = (0..200).all(|p| {
            t.pick(client, 50_000 + p)
                .is_some_and(|(ip, _)| pod_named(ip) == "lpod")
        });
        Ok(if all_lpod {
            Ok(())
        } else {
            Err("rpod still in the table")
        })
    })?;
    alive(&mut node2)?;
    alive(&mut agent)
}
