//! Planner tests: golden map dumps, the make-before-break invariant under torn
//! reads, and restore round trips. Run with `UPDATE_GOLDEN=1` to rewrite the
//! files in `testdata/` after an intended change, then review the diff.
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::IpAddr,
    path::PathBuf,
};

use weir_abi::{Addr, RevNat, ServiceKey, ServiceValue};

use super::{check::assert_phases, *};
use crate::{
    maps::{Capacity, LbMaps as _, MapOp, Snapshot, dump, fake::FakeMaps},
    model::{Backend, BackendState, DesiredFrontend, Frontend, Protocol},
};

const ROOMY: Capacity = Capacity {
    services: 4096,
    backends: 4096,
    revnat: 4096,
    src_ranges: 4096,
    maglev: 4096,
};

fn vip(last: u8, port: u16, proto: Protocol) -> Frontend {
    Frontend {
        addr: IpAddr::from([10, 96, 0, last]),
        port,
        proto,
        scope: crate::model::Scope::All,
    }
}

fn web() -> Frontend {
    vip(10, 80, Protocol::Tcp)
}

fn be(last: u8, state: BackendState) -> Backend {
    Backend {
        addr: IpAddr::from([10, 0, 0, last]),
        port: 8080,
        state,
    }
}

fn active(lasts: &[u8]) -> Vec<Backend> {
    lasts.iter().map(|&l| be(l, BackendState::Active)).collect()
}

fn draining(lasts: &[u8]) -> Vec<Backend> {
    lasts
        .iter()
        .map(|&l| be(l, BackendState::Draining))
        .collect()
}

fn terminating(lasts: &[u8]) -> Vec<Backend> {
    lasts
        .iter()
        .map(|&l| be(l, BackendState::Terminating))
        .collect()
}

/// The planner plus the bookkeeping the reconciler does around it.
struct World {
    maps: FakeMaps,
    ids: Ids,
    images: BTreeMap<Frontend, FrontendImage>,
}

impl World {
    fn new() -> Self {
        Self {
            maps: FakeMaps::new(ROOMY),
            ids: Ids::default(),
            images: BTreeMap::new(),
        }
    }

    fn plan(&mut self, fe: Frontend, backends: Option<&[Backend]>) -> Plan {
        let d = backends.map(|b| DesiredFrontend::plain(fe, b.to_vec()));
        plan(fe, self.images.get(&fe), d.as_ref(), &mut self.ids)
    }

    /// Records a plan whose ops have all been applied; frees the ids it deleted.
    fn settle(&mut self, p: &Plan) {
        for op in &p.ops {
            match *op {
                MapOp::DeleteBackend(id) => self.ids.backends.release(id),
                MapOp::DeleteRevNat(id) => self.ids.revnat.release(id),
                _ => {}
            }
        }
        match &p.image {
            Some(img) => drop(self.images.insert(p.frontend, img.clone())),
            None => drop(self.images.remove(&p.frontend)),
        }
    }

    fn run(&mut self, fe: Frontend, backends: Option<&[Backend]>) -> Plan {
        let p = self.plan(fe, backends);
        assert_phases(&p.ops);
        for op in &p.ops {
            self.maps
                .apply(op)
                .expect("roomy fake maps accept every op");
        }
        self.settle(&p);
        p
    }

    /// Plans and applies a frontend with options (flags, ranges).
    fn set_desired(&mut self, d: &DesiredFrontend) -> Plan {
        let fe = d.frontend;
        let p = plan(fe, self.images.get(&fe), Some(d), &mut self.ids);
        assert_phases(&p.ops);
        for op in &p.ops {
            self.maps
                .apply(op)
                .expect("roomy fake maps accept every op");
        }
        self.settle(&p);
        p
    }

    fn set(&mut self, fe: Frontend, backends: &[Backend]) -> Plan {
        self.run(fe, Some(backends))
    }

    fn delete(&mut self, fe: Frontend) -> Plan {
        self.run(fe, None)
    }

    fn master(&self, fe: Frontend) -> ServiceValue {
        self.maps.state.services[&service_key(fe, 0)]
    }
}

/// A compact spelling of ops for exact-order assertions: `B+4` upserts backend
/// 4, `S-3` deletes slot 3, `M+` writes the master, `R-1` deletes rev-NAT 1.
fn short(ops: &[MapOp]) -> Vec<String> {
    ops.iter()
        .map(|op| match op {
            MapOp::UpsertBackend(id, _) => format!("B+{id}"),
            MapOp::UpsertRevNat(id, _) => format!("R+{id}"),
            MapOp::UpsertService(k, _) if k.slot == 0 => "M+".to_owned(),
            MapOp::UpsertService(k, _) => format!("S+{}", k.slot),
            MapOp::DeleteService(k) if k.slot == 0 => "M-".to_owned(),
            MapOp::DeleteService(k) => format!("S-{}", k.slot),
            MapOp::DeleteBackend(id) => format!("B-{id}"),
            MapOp::DeleteRevNat(id) => format!("R-{id}"),
            MapOp::UpsertSrcRange(r) => format!("L+{}", cidr_of(r)),
            MapOp::DeleteSrcRange(r) => format!("L-{}", cidr_of(r)),
            MapOp::SetMaglev(t) => format!("T+{}", t.rev_nat_id),
            MapOp::DeleteMaglev(id, c) if c.start == 0 => format!("T-{id}"),
            MapOp::DeleteMaglev(id, c) => format!("T-{id}@{}..{}", c.start, c.end),
        })
        .collect()
}

fn cidr_of(r: &crate::maps::SrcRange) -> String {
    r.cidr().map_or_else(|| "?".to_owned(), |c| c.to_string())
}

fn frontend_of(k: &ServiceKey) -> Frontend {
    Frontend {
        addr: IpAddr::from(k.addr),
        port: u16::from_be(k.port),
        proto: Protocol::from_ip_proto(k.proto).expect("known protocol"),
        scope: crate::model::Scope::from_abi(k.scope).expect("known scope"),
    }
}

/// One op as a line, in the map dump's own format for upserts.
fn render_op(op: &MapOp) -> String {
    let mut one = Snapshot::default();
    match *op {
        MapOp::UpsertBackend(id, b) => drop(one.backends.insert(id, b)),
        MapOp::UpsertRevNat(id, r) => drop(one.revnat.insert(id, r)),
        MapOp::UpsertService(k, v) => drop(one.services.insert(k, v)),
        MapOp::DeleteService(k) => {
            return format!("delete svc     {} slot={}", frontend_of(&k), k.slot);
        }
        MapOp::DeleteBackend(id) => return format!("delete backend {id}"),
        MapOp::DeleteRevNat(id) => return format!("delete revnat  {id}"),
        MapOp::UpsertSrcRange(r) => drop(one.src_ranges.insert(r)),
        MapOp::DeleteSrcRange(r) => {
            return format!("delete srcrng  revnat={} {}", r.rev_nat_id(), cidr_of(&r));
        }
        MapOp::SetMaglev(ref t) => drop(one.maglev.insert(t.rev_nat_id, t.padded().into())),
        MapOp::DeleteMaglev(id, ref c) => {
            return format!("delete maglev  revnat={id} chunks={}..{}", c.start, c.end);
        }
    }
    format!("upsert {}", dump::render(&one).trim_end())
}

#[derive(Default)]
struct Transcript(String);

impl Transcript {
    fn record(&mut self, title: &str, plan: &Plan, maps: &FakeMaps) {
        let out = &mut self.0;
        let _ = writeln!(out, "== {title}\nops:");
        for op in &plan.ops {
            let _ = writeln!(out, "  {}", render_op(op));
        }
        let _ = writeln!(out, "maps:");
        for line in dump::render(&maps.state).lines() {
            let _ = writeln!(out, "  {line}");
        }
        out.push('\n');
    }
}

/// Compares `actual` with `testdata/{name}.golden`, or rewrites the file when
/// `UPDATE_GOLDEN=1`.
fn check_golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("src/planner/testdata")
        .join(format!("{name}.golden"));
    if std::env::var("UPDATE_GOLDEN").as_deref() == Ok("1") {
        std::fs::create_dir_all(path.parent().expect("has a parent")).expect("create testdata");
        std::fs::write(&path, actual).expect("write golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; run with UPDATE_GOLDEN=1 to create it",
            path.display()
        )
    });
    if expected == actual {
        return;
    }
    let (exp, act): (Vec<_>, Vec<_>) = (expected.lines().collect(), actual.lines().collect());
    let mut diff = String::new();
    for i in 0..exp.len().max(act.len()) {
        match (exp.get(i), act.get(i)) {
            (Some(e), Some(a)) if e == a => {
                let _ = writeln!(diff, "  {e}");
            }
            (e, a) => {
                if let Some(e) = e {
                    let _ = writeln!(diff, "- {e}");
                }
                if let Some(a) = a {
                    let _ = writeln!(diff, "+ {a}");
                }
            }
        }
    }
    panic!(
        "{} does not match (- golden, + actual):\n{diff}\nIf the change is intended, rerun with UPDATE_GOLDEN=1 and review the diff.",
        path.display()
    );
}

#[test]
fn golden_new_frontend_with_three_active_backends() {
    let mut w = World::new();
    let mut t = Transcript::default();
    let p = w.set(web(), &active(&[3, 1, 2]));
    t.record("new frontend, 3 active backends", &p, &w.maps);
    assert_eq!(short(&p.ops), ["B+1", "B+2", "B+3", "R+1", "M+"]);
    let m = w.master(web());
    assert_eq!((m.count, m.qcount, m.rev_nat_id), (3, 0, 1));
    check_golden("new_frontend_3_active", &t.0);
}

#[test]
fn golden_scale_up_three_to_five() {
    let mut w = World::new();
    let mut t = Transcript::default();
    let p = w.set(web(), &active(&[1, 2, 3]));
    t.record("3 active backends", &p, &w.maps);
    let p = w.set(web(), &active(&[1, 2, 3, 4, 5]));
    t.record("scale to 5", &p, &w.maps);
    // Only what is new is written, and the master last.
    assert_eq!(short(&p.ops), ["B+4", "B+5", "M+"]);
    assert_eq!(w.master(web()).count, 5);
    check_golden("scale_3_to_5", &t.0);
}

#[test]
fn golden_positions_spill_into_a_slot() {
    let mut w = World::new();
    let mut t = Transcript::default();
    let hosts = |r: std::ops::RangeInclusive<u8>| r.collect::<Vec<u8>>();
    let p = w.set(web(), &active(&hosts(1..=10)));
    t.record("10 active backends: the master holds them", &p, &w.maps);
    assert_eq!(w.maps.state.services.len(), 1);
    let p = w.set(web(), &active(&hosts(1..=14)));
    t.record("scale to 14: three spill into slot 1", &p, &w.maps);
    // The slot is there before the master counts it.
    assert_eq!(short(&p.ops), ["B+11", "B+12", "B+13", "B+14", "S+1", "M+"]);
    let p = w.set(web(), &active(&[hosts(1..=4), hosts(6..=14)].concat()));
    t.record(
        "10.0.0.5 leaves: positions shift across both entries",
        &p,
        &w.maps,
    );
    assert_eq!(short(&p.ops), ["S+1", "M+", "B-5"]);
    let p = w.set(web(), &active(&hosts(1..=9)));
    t.record("back to 1-9: the slot goes after the master", &p, &w.maps);
    // The master stops counting the slot before it goes.
    assert_eq!(
        short(&p.ops),
        ["B+5", "M+", "S-1", "B-10", "B-11", "B-12", "B-13", "B-14"]
    );
    check_golden("spill_into_slot", &t.0);
}

#[test]
fn golden_remove_backend_frees_its_id_for_the_next_plan() {
    let mut w = World::new();
    let mut t = Transcript::default();
    let p = w.set(web(), &active(&[1, 2, 3]));
    t.record("3 active backends", &p, &w.maps);
    let p = w.set(web(), &active(&[1, 3]));
    t.record("remove 10.0.0.2 (backend 2)", &p, &w.maps);
    assert_eq!(short(&p.ops), ["M+", "B-2"]);
    let p = w.set(web(), &active(&[1, 3, 9]));
    t.record("add 10.0.0.9: reuses backend id 2", &p, &w.maps);
    assert_eq!(short(&p.ops), ["B+2", "M+"]);
    let b = w.maps.state.backends[&2];
    assert_eq!(IpAddr::from(b.addr), IpAddr::from([10, 0, 0, 9]));
    check_golden("remove_backend_reuse_id", &t.0);
}

#[test]
fn golden_active_and_terminating() {
    let mut w = World::new();
    let mut t = Transcript::default();
    let mix = [terminating(&[1, 3]), active(&[4, 2])].concat();
    let p = w.set(web(), &mix);
    t.record("2 active, 2 terminating", &p, &w.maps);
    let m = w.master(web());
    assert_eq!((m.count, m.qcount), (2, 2));
    // Active positions first, each group by address.
    let slot_addrs: Vec<u8> = (w.maps.state.positions(service_key(web(), 0)).iter())
        .map(|id| w.maps.state.backends[id].addr.v4().to_ne_bytes()[3])
        .collect();
    assert_eq!(slot_addrs, [2, 4, 1, 3]);

    let mix = [terminating(&[1, 2, 3]), active(&[4, 5])].concat();
    let p = w.set(web(), &mix);
    t.record("10.0.0.2 starts terminating, 10.0.0.5 joins", &p, &w.maps);
    let m = w.master(web());
    assert_eq!((m.count, m.qcount), (2, 3));

    let p = w.set(web(), &terminating(&[1, 2]));
    t.record("only terminating backends left", &p, &w.maps);
    let m = w.master(web());
    assert_eq!((m.count, m.qcount), (0, 2));
    check_golden("active_and_terminating", &t.0);
}

#[test]
fn golden_serving_draining_gone() {
    let mut w = World::new();
    let mut t = Transcript::default();
    let p = w.set(web(), &active(&[1, 2, 3]));
    t.record("3 active backends", &p, &w.maps);

    // 10.0.0.2 shuts down gracefully (serving: false, terminating: true):
    // it keeps its id, leaves its slot and turns draining only once the
    // master no longer names that slot.
    let p = w.set(web(), &[active(&[1, 3]), draining(&[2])].concat());
    t.record("10.0.0.2 drains", &p, &w.maps);
    assert_eq!(short(&p.ops), ["M+", "B+2"]);
    assert!(p.allocated.is_empty());
    let m = w.master(web());
    assert_eq!((m.count, m.qcount), (2, 0));
    let b = w.maps.state.backends[&2];
    assert_eq!(
        (b.state, b.rev_nat_id),
        (weir_abi::BACKEND_STATE_DRAINING, m.rev_nat_id)
    );
    assert!(
        w.maps
            .state
            .services
            .iter()
            .all(|(_, v)| !v.ids[..2].contains(&2)),
        "a draining backend is at no position"
    );
    // New connections never reach it.
    for roll in 0..16 {
        let got = w
            .maps
            .connect(service_key(web(), 0), roll)
            .unwrap()
            .unwrap();
        assert_ne!(got.state, weir_abi::BACKEND_STATE_DRAINING);
    }

    // The last serving backend drains too: the frontend refuses new
    // connections; both draining backends stay for their flows.
    let p = w.set(web(), &[active(&[3]), draining(&[1, 2])].concat());
    t.record("10.0.0.1 drains as well", &p, &w.maps);
    assert_eq!(short(&p.ops), ["M+", "B+1"]);
    let p = w.set(web(), &draining(&[1, 2, 3]));
    t.record("every backend drains", &p, &w.maps);
    assert_eq!(short(&p.ops), ["M+", "B+3"]);
    assert!(w.maps.connect(service_key(web(), 0), 0).is_err());
    assert_eq!(w.maps.state.backends.len(), 3);

    // The endpoints leave the slice: gone after the master.
    let p = w.set(web(), &draining(&[3]));
    t.record("10.0.0.1 and 10.0.0.2 leave the slice", &p, &w.maps);
    assert_eq!(short(&p.ops), ["B-1", "B-2"]);
    let p = w.delete(web());
    t.record("delete the frontend", &p, &w.maps);
    assert_eq!(short(&p.ops), ["M-", "B-3", "R-1"]);
    assert_eq!(w.maps.state, Snapshot::default());
    check_golden("serving_draining_gone", &t.0);
}

#[test]
fn restore_keeps_draining_backends_of_restored_frontends_only() {
    let mut w = World::new();
    let dns = vip(11, 53, Protocol::Udp);
    w.set(
        web(),
        &[active(&[1]), terminating(&[2]), draining(&[3, 4])].concat(),
    );
    w.set(dns, &draining(&[5]));
    let clean = w.maps.state.clone();
    let mut s = clean.clone();
    // A draining backend of a rev-NAT id no frontend has: an orphan.
    let mut stray = clean.backends[&3];
    stray.rev_nat_id = 77;
    s.backends.insert(50, stray);

    let r = restore(&s);
    assert_eq!(r.orphans, [MapOp::DeleteBackend(50)]);
    assert_eq!(r.images, w.images);
    let img = &r.images[&web()];
    assert_eq!(img.backends.len(), 4);
    assert_eq!(img.services.len(), 1, "four backends: the master alone");
    assert_eq!(r.images[&dns].backends.len(), 1);
    // Replanning the same state writes nothing and keeps the ids (the
    // flows conntrack tracks to them keep their backend).
    let mut ids = r.ids.clone();
    for (fe, b) in [
        (
            web(),
            [active(&[1]), terminating(&[2]), draining(&[3, 4])].concat(),
        ),
        (dns, draining(&[5])),
    ] {
        let d = DesiredFrontend::plain(fe, b);
        let p = plan(fe, r.images.get(&fe), Some(&d), &mut ids);
        assert!(p.ops.is_empty(), "{fe}: {:?}", p.ops);
    }
    // Once the endpoint leaves, the restored draining backend is pruned.
    let d = DesiredFrontend::plain(
        web(),
        [active(&[1]), terminating(&[2]), draining(&[4])].concat(),
    );
    let p = plan(web(), r.images.get(&web()), Some(&d), &mut ids);
    let gone = w.images[&web()]
        .backends
        .iter()
        .find(|(_, b)| b.addr == Addr::from(IpAddr::from([10, 0, 0, 3])))
        .map(|(id, _)| id)
        .unwrap();
    assert_eq!(p.ops, [MapOp::DeleteBackend(gone)]);
}

#[test]
fn golden_frontend_without_backends() {
    let mut w = World::new();
    let mut t = Transcript::default();
    let p = w.set(web(), &[]);
    t.record("no backends", &p, &w.maps);
    assert_eq!(short(&p.ops), ["R+1", "M+"]);
    let m = w.master(web());
    assert_eq!((m.count, m.qcount, m.rev_nat_id), (0, 0, 1));
    // The datapath refuses rather than letting the VIP through.
    assert!(w.maps.connect(service_key(web(), 0), 7).is_err());

    let p = w.set(web(), &active(&[1]));
    t.record("one backend appears", &p, &w.maps);
    let p = w.set(web(), &[]);
    t.record("and goes away", &p, &w.maps);
    assert_eq!(short(&p.ops), ["M+", "B-1"]);
    check_golden("zero_backends", &t.0);
}

#[test]
fn golden_delete_frontend_removes_everything() {
    let mut w = World::new();
    let mut t = Transcript::default();
    let all = [active(&[1, 2]), terminating(&[3])].concat();
    let p = w.set(web(), &all);
    t.record("2 active, 1 terminating", &p, &w.maps);
    let p = w.delete(web());
    t.record("delete the frontend", &p, &w.maps);
    assert_eq!(short(&p.ops), ["M-", "B-1", "B-2", "B-3", "R-1"]);
    assert_eq!(w.maps.state, Snapshot::default());
    assert!(p.image.is_none());
    check_golden("delete_frontend", &t.0);

    // Every id is free again.
    let p = w.set(vip(11, 80, Protocol::Tcp), &active(&[7]));
    assert_eq!(short(&p.ops), ["B+1", "R+1", "M+"]);
}

#[test]
fn build_reuses_ids_and_reports_only_new_allocations() {
    let mut ids = Ids::default();
    let mut allocated = Vec::new();
    let d = |backends: Vec<Backend>| DesiredFrontend::plain(web(), backends);
    let first = FrontendImage::build(&d(active(&[1, 2])), None, &mut ids, &mut allocated);
    assert_eq!(
        allocated,
        [
            Allocated::RevNat(1),
            Allocated::Backend(1),
            Allocated::Backend(2)
        ]
    );
    assert_eq!(
        first.revnat,
        RevNat {
            addr: Addr::from(IpAddr::from([10, 96, 0, 10])),
            port: 80u16.to_be(),
            _pad: [0; 2],
        }
    );

    // 10.0.0.1 turns terminating: same id, new state; 10.0.0.3 is new.
    allocated.clear();
    let next = [terminating(&[1]), active(&[2, 3])].concat();
    let second = FrontendImage::build(&d(next), Some(&first), &mut ids, &mut allocated);
    assert_eq!(allocated, [Allocated::Backend(3)]);
    assert_eq!(second.rev_nat_id, first.rev_nat_id);
    let positions: Vec<u32> = (0..4)
        .map(|p| second.services.position(p).unwrap())
        .collect();
    assert_eq!(positions, [2, 3, 1, 0]);
    assert_eq!(second.services.len(), 1, "three backends fit in the master");
    assert_eq!(
        second.backends.get(1).unwrap().state,
        weir_abi::BACKEND_STATE_TERMINATING
    );
    assert!(second.services.iter().all(|(_, v)| v.rev_nat_id == 1));
}

#[test]
fn restore_then_replan_same_state_is_a_no_op() {
    let mut w = World::new();
    let dns = vip(11, 53, Protocol::Udp);
    let sctp = vip(12, 3868, Protocol::Sctp);
    let empty = vip(13, 80, Protocol::Tcp);
    let gone = vip(14, 80, Protocol::Tcp);
    let mut desired: BTreeMap<Frontend, Vec<Backend>> = BTreeMap::new();
    desired.insert(web(), [active(&[1, 2, 5]), terminating(&[3])].concat());
    desired.insert(dns, active(&[6, 7]));
    desired.insert(sctp, terminating(&[8, 9]));
    desired.insert(empty, Vec::new());
    w.set(gone, &active(&[20, 21]));
    for (fe, b) in &desired {
        w.set(*fe, b);
    }
    // Leave holes in both id spaces.
    w.delete(gone);
    w.set(web(), &[active(&[1, 5]), terminating(&[3])].concat());
    desired.insert(web(), [active(&[1, 5]), terminating(&[3])].concat());

    let mut r = restore(&w.maps.state);
    assert!(r.orphans.is_empty(), "{:?}", r.orphans);
    assert_eq!(r.images, w.images);
    for (fe, b) in &desired {
        let d = DesiredFrontend::plain(*fe, b.clone());
        let p = plan(*fe, r.images.get(fe), Some(&d), &mut r.ids);
        assert!(p.ops.is_empty(), "{fe}: replanning wrote {:?}", p.ops);
        assert!(p.allocated.is_empty(), "{fe}: {:?}", p.allocated);
    }
    // The restored allocators hand out what the originals would.
    let (mut mine, mut theirs) = (w.ids.clone(), r.ids.clone());
    let take = |ids: &mut Ids| -> Vec<u32> {
        (0..6)
            .map(|i| {
                if i % 2 == 0 {
                    ids.backends.alloc()
                } else {
                    ids.revnat.alloc()
                }
            })
            .collect()
    };
    assert_eq!(take(&mut theirs), take(&mut mine));
}

#[test]
fn restore_lists_orphans_and_reserves_their_ids() {
    let mut w = World::new();
    w.set(web(), &[active(&[1, 2]), terminating(&[3])].concat());
    let clean = w.maps.state.clone();
    let mut s = clean.clone();
    // A slot whose master is gone, pointing at a backend nothing else uses.
    let stray_slot = service_key(vip(99, 80, Protocol::Tcp), 2);
    let mut ids = [0; weir_abi::SVC_IDS];
    ids[0] = 42;
    s.services.insert(
        stray_slot,
        ServiceValue {
            rev_nat_id: 9,
            ids,
            ..ServiceValue::default()
        },
    );
    // A slot of a live frontend beyond its count + qcount.
    let beyond = service_key(web(), 1);
    ids[0] = 1;
    s.services.insert(
        beyond,
        ServiceValue {
            rev_nat_id: 1,
            ids,
            ..ServiceValue::default()
        },
    );
    s.backends.insert(42, clean.backends[&1]);
    s.revnat.insert(9, RevNat::default());

    let r = restore(&s);
    let slots: BTreeSet<ServiceKey> = [stray_slot, beyond].into();
    let mut expected: Vec<MapOp> = slots.into_iter().map(MapOp::DeleteService).collect();
    expected.extend([MapOp::DeleteBackend(42), MapOp::DeleteRevNat(9)]);
    assert_eq!(r.orphans, expected);
    assert_eq!(r.images, w.images, "orphans must not leak into images");

    // Deleting the orphans leaves exactly what the planner wrote.
    let mut fake = FakeMaps::new(ROOMY);
    fake.state = s.clone();
    for op in &r.orphans {
        fake.apply(op).unwrap();
    }
    assert_eq!(fake.state, clean);

    // Nothing allocated before the orphans are deleted collides with them.
    let mut ids = r.ids.clone();
    let backends: Vec<u32> = (0..50).map(|_| ids.backends.alloc()).collect();
    let revnats: Vec<u32> = (0..20).map(|_| ids.revnat.alloc()).collect();
    assert_eq!(backends[0], 4, "lowest unused id first");
    assert_eq!(revnats[0], 2);
    assert!(backends.iter().all(|id| !s.backends.contains_key(id)));
    assert!(revnats.iter().all(|id| !s.revnat.contains_key(id)));
}

mod external;
mod invariant;
mod maglev;
