//! Reconciler tests over in-memory maps: capacity, rollback, ownership, restore.
use std::{
    cell::RefCell,
    net::{IpAddr, Ipv4Addr},
    rc::Rc,
};

use super::*;
use crate::{
    maps::{
        Capacity, Snapshot, dump,
        fake::{FakeMaps, Refused},
    },
    model::{Backend, BackendState, Protocol, Scope},
    planner::service_key,
};

mod group;

/// Fake maps the test keeps a handle on while the reconciler owns them.
#[derive(Clone)]
struct Shared(Rc<RefCell<FakeMaps>>, Rc<RefCell<Vec<usize>>>);

impl Shared {
    fn new(capacity: Capacity) -> Self {
        Self::wrap(FakeMaps::new(capacity))
    }

    fn wrap(maps: FakeMaps) -> Self {
        Self(Rc::new(RefCell::new(maps)), Rc::default())
    }

    /// An independent copy of the maps, as a restarted agent finds them.
    fn deep_clone(&self) -> Self {
        Self::wrap(self.0.borrow().clone())
    }

    /// After the next injected failure, fail again after `n` more writes.
    fn then_fail_after(&self, n: usize) {
        self.1.borrow_mut().push(n);
    }

    fn state(&self) -> Snapshot {
        self.0.borrow().state.clone()
    }

    /// What a connect to `key` would reach now.
    fn connect(
        &self,
        key: weir_abi::ServiceKey,
        roll: u32,
    ) -> Result<Option<weir_abi::Backend>, Refused> {
        self.0.borrow().connect(key, roll)
    }

    fn writes(&self) -> usize {
        self.0.borrow().log.len()
    }

    fn fail_after(&self, n: usize) {
        self.0.borrow_mut().fail_after(n);
    }
}

impl LbMaps for Shared {
    fn apply(&mut self, op: &MapOp) -> Result<(), MapError> {
        let mut maps = self.0.borrow_mut();
        let res = maps.apply(op);
        if res.is_err() && !self.1.borrow().is_empty() {
            maps.fail_after(self.1.borrow_mut().remove(0));
        }
        res
    }

    fn snapshot(&self) -> Result<Snapshot, MapError> {
        self.0.borrow().snapshot()
    }

    fn capacity(&self) -> Capacity {
        self.0.borrow().capacity()
    }

    fn write_labels(
        &mut self,
        writes: &[(u32, Option<weir_abi::SvcLabel>)],
    ) -> Result<(), MapError> {
        self.0.borrow_mut().write_labels(writes)
    }

    fn visit_labels(&self, f: &mut dyn FnMut(u32, weir_abi::SvcLabel)) -> Result<(), MapError> {
        self.0.borrow().visit_labels(f)
    }
}

pub(super) const ROOMY: Capacity = Capacity {
    services: 1024,
    backends: 1024,
    revnat: 1024,
    src_ranges: 1024,
    maglev: 1024,
};

fn new(capacity: Capacity) -> (Reconciler<Shared>, Shared) {
    let maps = Shared::new(capacity);
    let rec = Reconciler::restore(maps.clone()).expect("empty maps restore");
    (rec, maps)
}

fn id(name: &str) -> ServiceId {
    ServiceId::new("default", name)
}

fn fe(last: u8, port: u16) -> Frontend {
    Frontend {
        addr: IpAddr::from([10, 96, 0, last]),
        port,
        proto: Protocol::Tcp,
        scope: crate::model::Scope::All,
    }
}

/// A frontend with active backends `10.net.0.host:8080`.
fn want(frontend: Frontend, net: u8, hosts: &[u8]) -> DesiredFrontend {
    DesiredFrontend::plain(
        frontend,
        hosts
            .iter()
            .map(|&h| Backend {
                addr: IpAddr::from([10, net, 0, h]),
                port: 8080,
                state: BackendState::Active,
            })
            .collect(),
    )
}

/// The entries the frontends `fes` reach in `s`.
fn entries_of(s: &Snapshot, fes: &[Frontend]) -> Snapshot {
    let mut out = Snapshot::default();
    for &f in fes {
        let Some(master) = s.services.get(&service_key(f, 0)) else {
            continue;
        };
        if let Some(r) = s.revnat.get(&master.rev_nat_id) {
            out.revnat.insert(master.rev_nat_id, *r);
        }
        let used = usize::from(master.count) + usize::from(master.qcount);
        for slot in 0..weir_abi::service_entries(used) {
            let k = service_key(f, u16::try_from(slot).unwrap());
            out.services.insert(k, s.services[&k]);
        }
        for id in s.positions(service_key(f, 0)) {
            out.backends.insert(id, s.backends[&id]);
        }
    }
    out
}

fn assert_same(before: &Snapshot, after: &Snapshot, what: &str) {
    assert!(
        before == after,
        "{what}\n--- before\n{}--- after\n{}",
        dump::render(before),
        dump::render(after)
    );
}

#[test]
fn map_full_names_the_service_and_map_and_only_refuses_its_new_frontends() {
    let hosts = |n: u8| (1..=n).collect::<Vec<u8>>();
    // Per map: its capacity, how many backends a, b and a grown a have,
    // and what b's refusal reports in use and needed. The services map
    // takes an entry per 11 backends (`SVC_IDS`): a holds 3 entries, b
    // needs 2, and a grown to 45 needs 2 more.
    for (map, capacity, [a, b, grown], (used, needed)) in [
        (
            MapName::Services,
            Capacity {
                services: 4,
                ..ROOMY
            },
            [23, 12, 45],
            (3, 2),
        ),
        (
            MapName::Backends,
            Capacity {
                backends: 4,
                ..ROOMY
            },
            [3, 2, 6],
            (3, 2),
        ),
        (
            MapName::RevNat,
            Capacity { revnat: 1, ..ROOMY },
            [3, 2, 6],
            (1, 1),
        ),
    ] {
        let (mut rec, maps) = new(capacity);
        let a_entries = weir_abi::service_entries(usize::from(a));
        assert_eq!(
            rec.sync_service(&id("a"), &[want(fe(1, 80), 0, &hosts(a))])
                .unwrap(),
            a_entries + usize::from(a) + 1
        );
        let before = maps.state();
        let writes = maps.writes();

        let err = rec
            .sync_service(&id("b"), &[want(fe(2, 80), 1, &hosts(b))])
            .unwrap_err();
        match &err {
            ReconcileError::MapFull {
                service,
                map: m,
                used: u,
                capacity: c,
                needed: n,
            } => {
                assert_eq!(service, &id("b"));
                assert_eq!((*m, *u, *n), (map, used, needed));
                assert_eq!(*c, capacity.of(map));
            }
            other => panic!("{map}: expected MapFull, got {other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains("default/b") && msg.contains(map.pin_name()),
            "{msg}"
        );
        assert!(err.is_transient());
        // b is not half-written: it gets a master without backends, so its
        // VIP refuses connections instead of leaking, when even that fits.
        let after = maps.state();
        let b_master = service_key(fe(2, 80), 0);
        if map == MapName::RevNat {
            assert_eq!(maps.writes(), writes, "{map}: b wrote something");
            assert_same(&before, &after, "a changed");
            assert_eq!(rec.frontend_count(), 1);
        } else {
            let mut a_only = after.clone();
            let master = a_only.services.remove(&b_master).expect("b refuses");
            assert_eq!((master.count, master.qcount), (0, 0), "{map}");
            a_only.revnat.remove(&master.rev_nat_id);
            assert_same(
                &before,
                &a_only,
                "b wrote more than a refusing master, or a changed",
            );
            assert_eq!(maps.connect(b_master, 0), Err(Refused));
            assert_eq!(rec.frontend_count(), 2);
            // Undo, so a's own growth below is checked against a alone.
            rec.sync_service(&id("b"), &[]).unwrap();
            assert_same(&before, &maps.state(), "removing b's refusal");
        }

        // a may not outgrow the map either, and keeps what it had (growing
        // never needs another rev-NAT entry).
        if map != MapName::RevNat {
            let err = rec
                .sync_service(&id("a"), &[want(fe(1, 80), 0, &hosts(grown))])
                .unwrap_err();
            assert!(matches!(err, ReconcileError::MapFull { service, .. } if service == id("a")));
            assert_same(&before, &maps.state(), "a changed by its own failed update");
        }
    }
}

#[test]
fn map_full_gives_back_the_ids_it_reserved() {
    let (mut rec, maps) = new(Capacity {
        services: 4,
        ..ROOMY
    });
    let hosts = |n: u8| (1..=n).collect::<Vec<u8>>();
    // a: a master and a slot (12 backends, 11 an entry).
    rec.sync_service(&id("a"), &[want(fe(1, 80), 0, &hosts(12))])
        .unwrap();
    // b does not fit (2 + 3); it only gets its refusing master (rev-NAT 2).
    rec.sync_service(&id("b"), &[want(fe(2, 80), 1, &hosts(23))])
        .unwrap_err();
    // c fits (3 + 1) and gets the first backend id b would have had.
    rec.sync_service(&id("c"), &[want(fe(3, 80), 2, &[1])])
        .unwrap();
    let s = maps.state();
    assert_eq!(
        s.backends.keys().copied().collect::<Vec<_>>(),
        (1..=13).collect::<Vec<_>>()
    );
    assert_eq!(s.revnat.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(s.positions(service_key(fe(3, 80), 0)), [13]);
}

#[test]
fn too_many_backends_is_rejected_before_planning() {
    let (mut rec, maps) = new(ROOMY);
    let mut d = want(fe(1, 80), 0, &[]);
    d.backends = (0..=u32::from(u16::MAX))
        .map(|i| Backend {
            addr: Ipv4Addr::from(0x0a00_0000 + i).into(),
            port: 80,
            state: BackendState::Active,
        })
        .collect();
    let err = rec.sync_service(&id("a"), &[d]).unwrap_err();
    assert!(
        matches!(err, ReconcileError::TooManyBackends { count: 65_536, .. }),
        "{err:?}"
    );
    assert!(!err.is_transient());
    assert_eq!(maps.writes(), 0);
}

/// `web` before and after an update that touches every kind of entry: port 80
/// (a master and a slot) loses a backend and gains three, which moves
/// positions in both; port 443 goes away, port 8443 is new.
fn web_v1() -> Vec<DesiredFrontend> {
    vec![
        want(fe(10, 80), 0, &(1..=13).collect::<Vec<u8>>()),
        want(fe(10, 443), 0, &[1, 2, 3]),
    ]
}

fn web_v2() -> Vec<DesiredFrontend> {
    let mut hosts: Vec<u8> = (3..=16).collect();
    hosts.insert(0, 1);
    vec![want(fe(10, 80), 0, &hosts), want(fe(10, 8443), 0, &[6, 7])]
}

/// Another service, synced first, that nothing may disturb.
fn setup() -> (Reconciler<Shared>, Shared) {
    let (mut rec, maps) = new(ROOMY);
    rec.sync_service(&id("other"), &[want(fe(20, 53), 9, &[1, 2])])
        .unwrap();
    rec.sync_service(&id("web"), &web_v1()).unwrap();
    (rec, maps)
}

#[test]
fn a_failed_write_rolls_the_update_back_exactly() {
    let (mut reference, ref_maps) = setup();
    let ops = reference.sync_service(&id("web"), &web_v2()).unwrap();
    assert!(
        ops >= 15,
        "the update should be long enough to fail inside: {ops}"
    );
    let expected = ref_maps.state();

    for n in 0..ops {
        let (mut rec, maps) = setup();
        let before = maps.state();
        maps.fail_after(n);
        let err = rec.sync_service(&id("web"), &web_v2()).unwrap_err();
        match &err {
            ReconcileError::Map {
                service,
                source: MapError::Write { .. },
            } => assert_eq!(service, &id("web")),
            other => panic!("failing write {n}: expected Map, got {other:?}"),
        }
        assert!(err.to_string().contains("rolled back"), "{err}");
        assert_same(&before, &maps.state(), &format!("write {n} failed"));

        // Nothing leaked: the retry ends exactly where an unbroken sync does.
        let retried = rec.sync_service(&id("web"), &web_v2()).unwrap();
        assert_eq!(retried, ops, "write {n} failed");
        assert_same(
            &expected,
            &maps.state(),
            &format!("retry after write {n} failed"),
        );
    }
}

#[test]
fn a_failed_rollback_is_repaired_by_the_next_sync() {
    let (mut reference, ref_maps) = setup();
    let ops = reference.sync_service(&id("web"), &web_v2()).unwrap();
    let expected = ref_maps.state();
    let mut rollback_failures = 0;
    for n in 0..ops {
        for r in 0.. {
            let (mut rec, maps) = setup();
            maps.fail_after(n);
            maps.then_fail_after(r);
            let err = rec.sync_service(&id("web"), &web_v2()).unwrap_err();
            if matches!(err, ReconcileError::Map { .. }) {
                break; // r was past the end of the rollback
            }
            assert!(
                matches!(err, ReconcileError::RollbackFailed { .. }),
                "{err:?}"
            );
            rollback_failures += 1;
            let ctx = format!("write {n} failed, then rollback write {r}");
            rec.sync_service(&id("web"), &web_v2())
                .unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert_same(&expected, &maps.state(), &ctx);
        }
    }
    assert!(rollback_failures > ops, "{rollback_failures}");
}

#[test]
fn a_failed_write_while_creating_leaves_no_trace() {
    let (mut reference, ref_maps) = new(ROOMY);
    let ops = reference.sync_service(&id("web"), &web_v1()).unwrap();
    let expected = ref_maps.state();
    for n in 0..ops {
        let (mut rec, maps) = new(ROOMY);
        maps.fail_after(n);
        let err = rec.sync_service(&id("web"), &web_v1()).unwrap_err();
        assert!(matches!(err, ReconcileError::Map { .. }), "{err:?}");
        assert_same(
            &Snapshot::default(),
            &maps.state(),
            &format!("write {n} failed"),
        );
        assert_eq!(rec.frontend_count(), 0);
        rec.sync_service(&id("web"), &web_v1()).unwrap();
        assert_same(
            &expected,
            &maps.state(),
            &format!("retry after write {n} failed"),
        );
    }
}

#[test]
fn a_frontend_belongs_to_one_service() {
    let (mut rec, maps) = new(ROOMY);
    rec.sync_service(&id("a"), &[want(fe(1, 80), 0, &[1, 2])])
        .unwrap();
    let before = maps.state();
    let writes = maps.writes();

    let claim = [want(fe(2, 80), 1, &[1]), want(fe(1, 80), 1, &[7])];
    let err = rec.sync_service(&id("b"), &claim).unwrap_err();
    match &err {
        ReconcileError::FrontendConflict {
            service,
            frontend,
            owner,
        } => {
            assert_eq!((service, frontend, owner), (&id("b"), &fe(1, 80), &id("a")));
        }
        other => panic!("expected FrontendConflict, got {other:?}"),
    }
    assert_eq!(maps.writes(), writes, "b wrote something");
    assert_same(&before, &maps.state(), "a changed");

    // The same VIP and port over another protocol is another frontend.
    let udp = Frontend {
        proto: Protocol::Udp,
        ..fe(1, 80)
    };
    rec.sync_service(&id("b"), &[want(udp, 1, &[1])]).unwrap();
    // Once a lets go, b may take it.
    rec.sync_service(&id("a"), &[]).unwrap();
    rec.sync_service(&id("b"), &[want(udp, 1, &[1]), want(fe(1, 80), 1, &[7])])
        .unwrap();
    let m = maps.state().services[&service_key(fe(1, 80), 0)];
    assert_eq!(m.count, 1);
}

#[test]
fn restore_adopts_claimed_frontends_and_prunes_the_rest() {
    let (mut rec, maps) = new(ROOMY);
    let a = [want(fe(1, 80), 0, &[1, 2, 3])];
    let b = [want(fe(2, 80), 1, &[1, 2]), want(fe(2, 443), 1, &[1, 2])];
    rec.sync_service(&id("a"), &a).unwrap();
    rec.sync_service(&id("b"), &b).unwrap();
    let before = maps.state();
    let b_ids: Vec<u32> = before
        .backends
        .keys()
        .copied()
        .filter(|id| !entries_of(&before, &[fe(1, 80)]).backends.contains_key(id))
        .collect();
    assert_eq!(b_ids, [4, 5, 6, 7]);

    // A restart: a new reconciler over the same maps, plus one stray entry.
    let restarted = maps.deep_clone();
    restarted
        .0
        .borrow_mut()
        .state
        .backends
        .insert(99, before.backends[&1]);
    let mut rec = Reconciler::restore(restarted.clone()).unwrap();
    assert_same(
        &before,
        &restarted.state(),
        "restore must only drop the stray entry",
    );
    assert_eq!((rec.unclaimed(), rec.frontend_count()), (3, 3));

    let writes = restarted.writes();
    assert_eq!(rec.sync_service(&id("a"), &a).unwrap(), 0);
    assert_eq!(restarted.writes(), writes, "re-syncing a wrote something");
    assert_eq!(rec.unclaimed(), 2);

    assert!(rec.prune_unclaimed().is_empty());
    assert_eq!((rec.unclaimed(), rec.frontend_count()), (0, 1));
    let after = restarted.state();
    assert_same(
        &entries_of(&before, &[fe(1, 80)]),
        &after,
        "only a may remain",
    );

    // b's ids are free again: c gets them, lowest first.
    rec.sync_service(&id("c"), &[want(fe(3, 80), 2, &[1, 2, 3, 4])])
        .unwrap();
    let s = restarted.state();
    let c = entries_of(&s, &[fe(3, 80)]);
    assert_eq!(c.backends.keys().copied().collect::<Vec<_>>(), b_ids);
    assert_eq!(c.revnat.keys().copied().collect::<Vec<_>>(), [2]);
    // The original maps were never touched by the restarted agent.
    assert_same(&before, &maps.state(), "the clone leaked into the original");
}

#[test]
fn deleting_a_service_removes_every_entry_it_had() {
    let (mut rec, maps) = new(ROOMY);
    let a_fes = [fe(1, 80), fe(1, 443)];
    let a = [want(a_fes[0], 0, &[1, 2, 3]), want(a_fes[1], 0, &[4])];
    rec.sync_service(&id("a"), &a).unwrap();
    rec.sync_service(&id("b"), &[want(fe(2, 80), 1, &[1, 2])])
        .unwrap();
    let before = maps.state();
    let a_entries = entries_of(&before, &a_fes);
    let a_count = a_entries.services.len() + a_entries.backends.len() + a_entries.revnat.len();

    let ops = rec.sync_service(&id("a"), &[]).unwrap();
    assert_eq!(ops, a_count, "one delete per entry");
    assert_same(
        &entries_of(&before, &[fe(2, 80)]),
        &maps.state(),
        "all of a and nothing of b must go",
    );
    assert_eq!(rec.frontend_count(), 1);
    // Deleting again is a no-op, and b can still be deleted cleanly.
    assert_eq!(rec.sync_service(&id("a"), &[]).unwrap(), 0);
    rec.sync_service(&id("b"), &[]).unwrap();
    assert_same(&Snapshot::default(), &maps.state(), "maps not empty");
    assert_eq!(rec.frontend_count(), 0);
}

/// A load-balancer frontend with source ranges and affinity.
fn lb_with(ranges: &[&str], affinity: Option<u32>, hosts: &[u8]) -> Vec<DesiredFrontend> {
    vec![DesiredFrontend {
        kind: crate::model::FrontendKind::LoadBalancer,
        affinity,
        source_ranges: ranges
            .iter()
            .map(|c| crate::model::Cidr::parse(c).unwrap())
            .collect(),
        ..want(fe(30, 443), 3, hosts)
    }]
}

#[test]
fn a_failed_write_rolls_source_ranges_and_flags_back_exactly() {
    let v1 = lb_with(&["10.0.0.0/8", "192.0.2.0/24"], None, &[1, 2]);
    let v2 = lb_with(&["192.0.2.0/24", "203.0.113.0/24"], Some(60), &[2, 3]);
    let setup = || {
        let (mut rec, maps) = new(ROOMY);
        rec.sync_service(&id("lb"), &v1).unwrap();
        (rec, maps)
    };
    let (mut reference, ref_maps) = setup();
    let ops = reference.sync_service(&id("lb"), &v2).unwrap();
    let expected = ref_maps.state();
    assert_eq!(expected.src_ranges.len(), 2);
    for n in 0..ops {
        let (mut rec, maps) = setup();
        let before = maps.state();
        maps.fail_after(n);
        rec.sync_service(&id("lb"), &v2).unwrap_err();
        assert_same(&before, &maps.state(), &format!("write {n} failed"));
        assert_eq!(rec.sync_service(&id("lb"), &v2).unwrap(), ops);
        assert_same(&expected, &maps.state(), &format!("retry after {n}"));
    }
    // Removing the Service removes its ranges too.
    reference.sync_service(&id("lb"), &[]).unwrap();
    assert_eq!(ref_maps.state(), Snapshot::default());
}

#[test]
fn source_ranges_count_against_their_map() {
    let (mut rec, maps) = new(Capacity {
        src_ranges: 1,
        ..ROOMY
    });
    let err = rec
        .sync_service(
            &id("lb"),
            &lb_with(&["10.0.0.0/8", "192.0.2.0/24"], None, &[1]),
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            ReconcileError::MapFull {
                map: MapName::SrcRanges,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("WEIR_SRC_RANGE"), "{err}");
    // Refused, not leaked: the new frontend has a master without backends,
    // and no range was written.
    let state = maps.state();
    assert!(state.src_ranges.is_empty(), "{:?}", state.src_ranges);
    let master = state.services[&service_key(fe(30, 443), 0)];
    assert_eq!((master.count, master.qcount), (0, 0));
}

/// A NodePort frontend on 192.168.0.10:30080: eTP=Cluster (one `All` scope
/// with backends `10.5.0.{all}`), or eTP=Local (the `All` scope keeps every
/// backend for in-cluster clients, the `External` scope has `local` only).
fn node_port(local: Option<&[u8]>, all: &[u8]) -> Vec<DesiredFrontend> {
    let fe = Frontend::new(IpAddr::from([192, 168, 0, 10]), 30080, Protocol::Tcp);
    let d = DesiredFrontend {
        kind: crate::model::FrontendKind::NodePort,
        local: local.is_some(),
        affinity: Some(60),
        ..want(fe, 5, all)
    };
    let mut out = vec![d.clone()];
    if let Some(hosts) = local {
        out.push(DesiredFrontend {
            frontend: fe.in_scope(Scope::External),
            ..want(fe, 5, hosts)
        });
        let ext = out.last_mut().unwrap();
        ext.kind = d.kind;
        ext.local = true;
        ext.affinity = d.affinity;
    }
    out
}

/// Replays `ops` on `start` one write at a time and checks that a client
/// from outside always finds a frontend with backends (never a LOCAL master
/// without its local view) and one inside always one of `inside`.
fn assert_never_torn(start: &FakeMaps, ops: &[MapOp], inside: &[u8]) {
    let key = service_key(
        Frontend::new(IpAddr::from([192, 168, 0, 10]), 30080, Protocol::Tcp),
        0,
    );
    let mut m = start.clone();
    for (i, op) in ops.iter().enumerate() {
        m.apply(op).unwrap();
        for roll in 0..4 {
            let out = m.connect_from_outside(key, roll);
            assert!(
                matches!(out, Ok(Some(_))),
                "after write {i} ({op:?}): {out:?}"
            );
            let b = m.connect(key, roll).unwrap().unwrap();
            let host = IpAddr::from(b.addr).to_string();
            assert!(
                inside.iter().any(|h| host == format!("10.5.0.{h}")),
                "after write {i}: inside client reached {host}"
            );
        }
    }
}

#[test]
fn etp_local_local_view_is_written_before_and_removed_after_the_all_master() {
    let (mut rec, maps) = new(ROOMY);
    rec.sync_service(&id("np"), &node_port(None, &[1, 2]))
        .unwrap();

    // Cluster -> Local: the External scope first, then the All master turns
    // LOCAL; in-cluster clients keep every backend throughout.
    let start = maps.0.borrow().clone();
    let from = start.log.len();
    rec.sync_service(&id("np"), &node_port(Some(&[1]), &[1, 2]))
        .unwrap();
    let ops = maps.0.borrow().log[from..].to_vec();
    assert_never_torn(&start, &ops, &[1, 2]);
    let s = maps.state();
    let all = service_key(node_port(None, &[]).remove(0).frontend, 0);
    let ext = weir_abi::ServiceKey {
        scope: weir_abi::SCOPE_EXTERNAL,
        ..all
    };
    let (m_all, m_ext) = (s.services[&all], s.services[&ext]);
    assert_eq!((m_all.count, m_ext.count), (2, 1));
    let flags = weir_abi::SVC_F_EXTERNAL
        | weir_abi::SVC_F_NODEPORT
        | weir_abi::SVC_F_LOCAL
        | weir_abi::SVC_F_AFFINITY;
    assert_eq!((m_all.flags, m_ext.flags), (flags, flags));
    // Separate rev-NAT ids and backend ids per scope.
    assert_ne!(m_all.rev_nat_id, m_ext.rev_nat_id);
    let ext_backend = s.positions(ext)[0];
    let all_backends = s.positions(all);
    assert!(!all_backends.contains(&ext_backend));
    assert_eq!(s.backends[&ext_backend].rev_nat_id, m_ext.rev_nat_id);
    assert!(dump::render(&s).contains("192.168.0.10:30080/TCP scope=external slot=0 count=1"));
    assert_eq!(rec.frontend_count(), 2);

    // A restart rebuilds both scopes: re-syncing writes nothing.
    let copy = maps.deep_clone();
    let mut restored = Reconciler::restore(copy.clone()).unwrap();
    assert_eq!(restored.unclaimed(), 2);
    let before = copy.writes();
    assert_eq!(
        restored
            .sync_service(&id("np"), &node_port(Some(&[1]), &[1, 2]))
            .unwrap(),
        0
    );
    assert_eq!(copy.writes(), before);
    assert_eq!(restored.unclaimed(), 0);

    // Local -> Cluster: the All master stops saying LOCAL before the local
    // view goes.
    let start = maps.0.borrow().clone();
    let from = start.log.len();
    rec.sync_service(&id("np"), &node_port(None, &[1, 2]))
        .unwrap();
    let ops = maps.0.borrow().log[from..].to_vec();
    assert_never_torn(&start, &ops, &[1, 2]);
    let s = maps.state();
    assert!(!s.services.keys().any(|k| k.scope != weir_abi::SCOPE_ALL));
    assert_eq!(rec.frontend_count(), 1);

    // Deleting a Local Service: the All master goes first.
    rec.sync_service(&id("np"), &node_port(Some(&[1]), &[1, 2]))
        .unwrap();
    let from = maps.0.borrow().log.len();
    rec.sync_service(&id("np"), &[]).unwrap();
    let log = maps.0.borrow().log[from..].to_vec();
    let first_master_delete = log
        .iter()
        .find_map(|op| match op {
            MapOp::DeleteService(k) if k.slot == 0 => Some(k.scope),
            _ => None,
        })
        .unwrap();
    assert_eq!(first_master_delete, weir_abi::SCOPE_ALL);
    assert_same(&Snapshot::default(), &maps.state(), "maps not empty");
}

#[test]
fn draining_backends_survive_a_restart_and_a_failed_sync_rolls_them_back() {
    let (mut rec, maps) = new(ROOMY);
    let web = fe(1, 80);
    let mut d = want(web, 0, &[1, 2, 3]);
    rec.sync_service(&id("web"), std::slice::from_ref(&d))
        .unwrap();
    let serving = maps.state();

    // 10.0.0.2 stops serving while terminating; the sync fails half-way and
    // is rolled back: 10.0.0.2 is active and at its position again. The
    // sync writes the master, then the draining backend; the second fails.
    d.backends[1].state = BackendState::Draining;
    maps.fail_after(1);
    assert!(
        rec.sync_service(&id("web"), std::slice::from_ref(&d))
            .is_err()
    );
    assert_same(
        &serving,
        &maps.state(),
        "rollback restores the serving state",
    );

    rec.sync_service(&id("web"), std::slice::from_ref(&d))
        .unwrap();
    let drained = maps.state();
    let b = drained
        .backends
        .values()
        .find(|b| b.state == weir_abi::BACKEND_STATE_DRAINING)
        .expect("a draining backend");
    assert_eq!(IpAddr::from(b.addr), IpAddr::from([10, 0, 0, 2]));
    assert_eq!(drained.backends.len(), 3);
    assert_eq!(
        drained.services[&service_key(web, 0)].count,
        2,
        "draining takes no slot"
    );

    // A restart keeps it (it is reachable by rev-NAT id only) and the same
    // desired state writes nothing.
    let restarted = maps.deep_clone();
    let mut rec = Reconciler::restore(restarted.clone()).unwrap();
    assert_same(
        &drained,
        &restarted.state(),
        "restore must keep draining backends",
    );
    let writes = restarted.writes();
    assert_eq!(
        rec.sync_service(&id("web"), std::slice::from_ref(&d))
            .unwrap(),
        0
    );
    assert_eq!(restarted.writes(), writes, "re-syncing a wrote something");
    assert!(rec.prune_unclaimed().is_empty());
    assert_same(&drained, &restarted.state(), "nothing unclaimed");

    // The endpoint leaves the slice: the backend goes.
    d.backends.remove(1);
    rec.sync_service(&id("web"), std::slice::from_ref(&d))
        .unwrap();
    let s = restarted.state();
    assert_eq!(s.backends.len(), 2);
    assert!(
        s.backends
            .values()
            .all(|b| b.state == weir_abi::BACKEND_STATE_ACTIVE)
    );
}
