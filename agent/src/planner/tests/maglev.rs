//! Planner tests for Maglev tables: written whole after the slots and
//! before the master that asks for them, rebuilt only when the backends a
//! new flow may pick change, removed after the master stops asking, and
//! restored only when they are exactly what the master and slots call for.
use std::{net::IpAddr, sync::Arc};

use weir_abi::{SVC_F_EXTERNAL, SVC_F_MAGLEV};

use super::*;
use crate::model::FrontendKind;

fn lb_fe() -> Frontend {
    Frontend {
        addr: "198.51.100.7".parse::<IpAddr>().unwrap(),
        port: 443,
        proto: Protocol::Tcp,
        scope: crate::model::Scope::All,
    }
}

fn lb(backends: Vec<Backend>, maglev: Option<u32>) -> DesiredFrontend {
    DesiredFrontend {
        kind: FrontendKind::LoadBalancer,
        maglev,
        ..DesiredFrontend::plain(lb_fe(), backends)
    }
}

/// Backend ids of the frontend's table, position by position, up to the
/// size its master gives (the map holds whole chunks, padded with 0).
fn table_of(w: &World) -> Arc<[u32]> {
    let m = w.master(lb_fe());
    let held = &w.maps.state.maglev[&m.rev_nat_id];
    let (table, padding) = held.split_at(m.table_size as usize);
    assert!(padding.iter().all(|id| *id == 0), "padding past the size");
    table.into()
}

#[test]
fn golden_maglev_table_between_slots_and_master() {
    let mut w = World::new();
    let mut t = Transcript::default();

    let p = w.set_desired(&lb(active(&[1, 2, 3]), Some(251)));
    t.record("LB with Maglev, three backends", &p, &w.maps);
    assert_eq!(short(&p.ops), ["B+1", "B+2", "B+3", "R+1", "T+1", "M+"]);
    let m = w.master(lb_fe());
    assert_eq!(
        (m.flags, m.table_size),
        (SVC_F_EXTERNAL | SVC_F_MAGLEV, 251)
    );
    assert_eq!(table_of(&w).len(), 251);

    // Unchanged backends: nothing to write.
    let p = w.set_desired(&lb(active(&[1, 2, 3]), Some(251)));
    assert!(p.ops.is_empty(), "{:?}", short(&p.ops));

    let p = w.set_desired(&lb(active(&[1, 3]), Some(251)));
    t.record(
        "a backend goes: new table before the master shrinks",
        &p,
        &w.maps,
    );
    assert_eq!(short(&p.ops), ["T+1", "M+", "B-2"]);
    assert!(!table_of(&w).contains(&2));

    let p = w.set_desired(&lb([active(&[1]), terminating(&[3])].concat(), Some(251)));
    t.record("a backend terminates: out of the table", &p, &w.maps);
    assert!(table_of(&w).iter().all(|id| *id == 1));

    let p = w.set_desired(&lb(active(&[1, 3]), Some(509)));
    t.record("another table size", &p, &w.maps);
    assert_eq!(short(&p.ops), ["B+3", "T+1", "M+"]);
    assert_eq!(table_of(&w).len(), 509);

    let p = w.set_desired(&lb(active(&[1, 3]), None));
    t.record(
        "back to random: the master first, then the table",
        &p,
        &w.maps,
    );
    assert_eq!(short(&p.ops), ["M+", "T-1"]);
    assert!(w.maps.state.maglev.is_empty());

    let p = w.set_desired(&lb(active(&[1, 3]), Some(251)));
    t.record("Maglev again", &p, &w.maps);
    let p = w.delete(lb_fe());
    t.record("delete", &p, &w.maps);
    assert_eq!(short(&p.ops), ["M-", "T-1", "B-1", "B-3", "R-1"]);
    assert_eq!(w.maps.state, Snapshot::default());
    check_golden("maglev", &t.0);
}

#[test]
fn no_table_without_backends_or_on_a_cluster_ip() {
    let mut w = World::new();
    w.set_desired(&lb(Vec::new(), Some(251)));
    let m = w.master(lb_fe());
    assert_eq!((m.flags & SVC_F_MAGLEV, m.table_size), (0, 0));
    assert!(w.maps.state.maglev.is_empty());
    w.set_desired(&DesiredFrontend {
        maglev: Some(251),
        ..DesiredFrontend::plain(lb_fe(), active(&[1]))
    });
    assert!(
        w.maps.state.maglev.is_empty(),
        "ClusterIP frontends pick at random"
    );
}

#[test]
fn restore_keeps_a_matching_table_and_replaces_a_stale_one() {
    let mut w = World::new();
    let d = lb(active(&[1, 2, 3]), Some(251));
    w.set_desired(&d);

    let mut r = restore(&w.maps.state);
    assert!(r.orphans.is_empty(), "{:?}", r.orphans);
    assert_eq!(r.images, w.images);
    let p = plan(lb_fe(), r.images.get(&lb_fe()), Some(&d), &mut r.ids);
    assert!(p.ops.is_empty(), "{:?}", short(&p.ops));

    // An agent stopped between a table and its master: the table names
    // other backends than the slots. It goes, and the first plan writes
    // the right one before anything else could rely on it.
    let rev = w.master(lb_fe()).rev_nat_id;
    let mut stale = w.maps.state.clone();
    stale.maglev.insert(rev, vec![1; 1000].into());
    // And a table no frontend asks for, of three chunks.
    stale.maglev.insert(77, vec![9; 3000].into());
    let mut r = restore(&stale);
    assert_eq!(
        r.orphans,
        [
            MapOp::DeleteMaglev(rev, 0..1),
            MapOp::DeleteMaglev(77, 0..3)
        ]
    );
    let p = plan(lb_fe(), r.images.get(&lb_fe()), Some(&d), &mut r.ids);
    assert_eq!(short(&p.ops), [format!("T+{rev}")]);
}

#[test]
fn a_shrunk_table_drops_its_last_chunks_once_the_master_has_its_size() {
    let mut w = World::new();
    w.set_desired(&lb(active(&[1, 2, 3]), Some(2003)));
    let rev = w.master(lb_fe()).rev_nat_id;
    assert_eq!(w.maps.state.maglev[&rev].len(), 3000, "three chunks");

    let p = w.set_desired(&lb(active(&[1, 2, 3]), Some(251)));
    assert_eq!(
        short(&p.ops),
        [format!("T+{rev}"), "M+".to_owned(), format!("T-{rev}@1..3")]
    );
    let held = &w.maps.state.maglev[&rev];
    assert_eq!(held.len(), 1000);
    let spec = w.images[&lb_fe()].maglev.clone().expect("a table");
    assert_eq!(**held, *spec.padded());

    // Growing back writes every chunk before the master asks for them.
    let p = w.set_desired(&lb(active(&[1, 2, 3]), Some(2003)));
    assert_eq!(short(&p.ops), [format!("T+{rev}"), "M+".to_owned()]);
    assert_eq!(w.maps.state.maglev[&rev].len(), 3000);
}

#[test]
fn tables_count_against_the_map_in_chunks() {
    use crate::{maps::MapName, planner::growth};
    let img = |size| {
        let mut w = World::new();
        w.set_desired(&lb(active(&[1, 2]), Some(size)));
        w.images[&lb_fe()].clone()
    };
    let (small, big) = (img(251), img(2003));
    assert_eq!(growth(None, Some(&big)).get(MapName::Maglev), 3);
    assert_eq!(growth(Some(&small), Some(&big)).get(MapName::Maglev), 2);
    assert_eq!(growth(Some(&big), Some(&small)).get(MapName::Maglev), 0);
}
