//! The planner fed random histories of desired states (`arbitrary` op
//! sequences) for a few frontends, applied to the fake maps the unit tests use.
//! Oracles: `planner::check` (make-before-break order; every reader racing a
//! plan reaches an old or new backend and never finds the frontend empty), the
//! other frontends stay untouched, the result serves exactly the new backends
//! (through its Maglev table too, when it has one), and `restore` reads back
//! what the planner thinks the maps hold.
#![no_main]

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use weir_agent::{
    maps::{Capacity, LbMaps as _, MapOp, fake::FakeMaps},
    model::{
        Backend, BackendState, Cidr, DesiredFrontend, Frontend, FrontendKind, Protocol, Scope,
    },
    planner::{self, FrontendImage, Ids, check, service_key},
};

#[derive(Arbitrary, Debug)]
enum Op {
    Set {
        fe: u8,
        kind: u8,
        local: bool,
        affinity: Option<u32>,
        maglev: bool,
        ranges: Vec<(u8, u8)>,
        backends: Vec<(u8, bool, u8)>,
    },
    Delete {
        fe: u8,
    },
}

/// Two scopes of one address (eTP=Local), the other families and protocols.
fn frontends() -> [Frontend; 4] {
    let v4: IpAddr = [10, 96, 0, 10].into();
    let v6: IpAddr = "fd00::10".parse().expect("address");
    let lb: IpAddr = [198, 51, 100, 1].into();
    [
        Frontend::new(v4, 80, Protocol::Tcp),
        Frontend::new(v4, 80, Protocol::Tcp).in_scope(Scope::External),
        Frontend::new(v6, 53, Protocol::Udp),
        Frontend::new(lb, 443, Protocol::Sctp),
    ]
}

/// Backends of the frontend's family, one per address and port, as the store
/// hands them over; at most 8, so the torn-read check stays fast.
fn backends(fe: Frontend, raw: &[(u8, bool, u8)]) -> Vec<Backend> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for &(host, tls, state) in raw {
        let host = host % 8 + 1;
        let addr = match fe.addr {
            IpAddr::V4(_) => IpAddr::from([10, 0, 0, host]),
            IpAddr::V6(_) => IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 1, u16::from(host)]),
        };
        let port = if tls { 8443 } else { 8080 };
        let state = match state % 3 {
            0 => BackendState::Active,
            1 => BackendState::Terminating,
            _ => BackendState::Draining,
        };
        if out.len() < 8 && seen.insert((addr, port)) {
            out.push(Backend { addr, port, state });
        }
    }
    out
}

fn desired(fe: Frontend, op: &Op) -> Option<DesiredFrontend> {
    let Op::Set {
        kind,
        local,
        affinity,
        maglev,
        ranges,
        backends: raw,
        ..
    } = op
    else {
        return None;
    };
    let kind = match kind % 4 {
        0 => FrontendKind::ClusterIp,
        1 => FrontendKind::NodePort,
        2 => FrontendKind::ExternalIp,
        _ => FrontendKind::LoadBalancer,
    };
    // Source ranges only reach load-balancer frontends, in their family.
    let source_ranges = if kind == FrontendKind::LoadBalancer {
        let ranges: BTreeSet<Cidr> = ranges
            .iter()
            .take(4)
            .filter_map(|&(net, len)| {
                let s = match fe.addr {
                    IpAddr::V4(_) => format!("10.{net}.0.0/{}", len % 33),
                    IpAddr::V6(_) => format!("2001:db8:{net:x}::/{}", len % 129),
                };
                Cidr::parse(&s)
            })
            .collect();
        ranges.into_iter().collect()
    } else {
        Vec::new()
    };
    Some(DesiredFrontend {
        backends: backends(fe, raw),
        kind,
        local: *local,
        affinity: affinity.map(|a| a % 86_400 + 1),
        source_ranges,
        // The smallest size: the fake builds every table it is given.
        maglev: maglev.then_some(251),
        ..DesiredFrontend::plain(fe, Vec::new())
    })
}

fn serves(d: Option<&DesiredFrontend>) -> bool {
    d.is_some_and(|d| d.backends.iter().any(|b| b.state.serves()))
}

fn reach(maps: &FakeMaps, fe: Frontend) -> Vec<String> {
    (0..8)
        .map(|roll| format!("{:?}", maps.connect(service_key(fe, 0), roll)))
        .collect()
}

const ROOMY: Capacity = Capacity {
    services: 4096,
    backends: 4096,
    revnat: 4096,
    src_ranges: 4096,
    maglev: 4096,
};

fuzz_target!(|ops: Vec<Op>| {
    let fes = frontends();
    let mut maps = FakeMaps::new(ROOMY);
    let mut ids = Ids::default();
    let mut images: BTreeMap<Frontend, FrontendImage> = BTreeMap::new();
    let mut current: BTreeMap<Frontend, DesiredFrontend> = BTreeMap::new();
    for (step, op) in ops.iter().take(32).enumerate() {
        let (Op::Set { fe, .. } | Op::Delete { fe }) = op;
        let fe = fes[usize::from(*fe) % fes.len()];
        let new = desired(fe, op);
        let old = current.get(&fe);
        let ctx = format!("step {step}: {fe} {old:?} -> {new:?}");
        let others: Vec<(Frontend, Vec<String>)> = fes
            .iter()
            .filter(|&&o| o != fe)
            .map(|&o| (o, reach(&maps, o)))
            .collect();

        let p = planner::plan(fe, images.get(&fe), new.as_ref(), &mut ids);
        check::assert_phases(&p.ops);
        let mut states = vec![maps.state.clone()];
        for op in &p.ops {
            maps.apply(op).expect("roomy fake maps accept every op");
            states.push(maps.state.clone());
        }
        if serves(old) && serves(new.as_ref()) {
            let both = old.into_iter().chain(&new).flat_map(|d| &d.backends);
            check::check_torn_reads(&states, fe, &check::endpoints(both), &ctx);
        }
        for (o, before) in others {
            assert_eq!(reach(&maps, o), before, "{ctx}: {o} changed");
        }
        if let Some(d) = new.as_ref().filter(|d| serves(Some(d))) {
            let want = check::pickable(&d.backends);
            let got: BTreeSet<check::Endpoint> = (0..64)
                .map(|roll| match maps.connect(service_key(fe, 0), roll) {
                    Ok(Some(b)) => check::endpoint(&b),
                    other => panic!("{ctx}: roll {roll} got {other:?}"),
                })
                .collect();
            assert!(
                got.is_subset(&want),
                "{ctx}: reached {got:?}, want {want:?}"
            );
            // A Maglev table spreads new flows over exactly those backends.
            let master = maps.state.services[&service_key(fe, 0)];
            if master.flags & weir_abi::SVC_F_MAGLEV != 0 {
                let addr = service_key(fe, 0).addr;
                let by_table: BTreeSet<check::Endpoint> = (0..master.table_size)
                    .map(|h| {
                        let p = weir_abi::pick::maglev_backend(&maps.state, &master, &addr, h)
                            .unwrap_or_else(|| panic!("{ctx}: position {h} has no backend"));
                        check::endpoint(&maps.state.backends[&p.backend_id])
                    })
                    .collect();
                assert_eq!(by_table, want, "{ctx}: the table's backends");
            }
        }

        for op in &p.ops {
            match *op {
                MapOp::DeleteBackend(id) => ids.backends.release(id),
                MapOp::DeleteRevNat(id) => ids.revnat.release(id),
                _ => {}
            }
        }
        match p.image {
            Some(img) => drop(images.insert(fe, img)),
            None => drop(images.remove(&fe)),
        }
        match new {
            Some(d) => drop(current.insert(fe, d)),
            None => drop(current.remove(&fe)),
        }

        let r = planner::restore(&maps.state);
        assert!(r.orphans.is_empty(), "{ctx}: orphans {:?}", r.orphans);
        assert_eq!(r.images, images, "{ctx}: restore differs");
    }
});
