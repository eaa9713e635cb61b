//! Planner tests for external frontends: master flags and affinity timeout,
//! source-range entries written before the master that needs them and pruned
//! after it, family filtering, and restore of all of it.
use std::net::IpAddr;

use weir_abi::{SVC_F_AFFINITY, SVC_F_EXTERNAL, SVC_F_LOCAL, SVC_F_NODEPORT, SVC_F_SRC_RANGES};

use super::*;
use crate::model::{Cidr, FrontendKind};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn lb_fe() -> Frontend {
    Frontend {
        addr: ip("198.51.100.1"),
        port: 443,
        proto: Protocol::Tcp,
        scope: crate::model::Scope::All,
    }
}

fn cidrs(list: &[&str]) -> Vec<Cidr> {
    list.iter().map(|c| Cidr::parse(c).unwrap()).collect()
}

fn lb(ranges: &[&str]) -> DesiredFrontend {
    DesiredFrontend {
        kind: FrontendKind::LoadBalancer,
        source_ranges: cidrs(ranges),
        ..DesiredFrontend::plain(lb_fe(), active(&[1]))
    }
}

#[test]
fn master_flags_follow_kind_policy_and_affinity() {
    let node_port = Frontend {
        addr: ip("192.168.0.10"),
        port: 30080,
        proto: Protocol::Tcp,
        scope: crate::model::Scope::All,
    };
    let cases = [
        (FrontendKind::ClusterIp, false, None, 0, 0),
        // LOCAL means nothing on a ClusterIP frontend.
        (FrontendKind::ClusterIp, true, Some(60), SVC_F_AFFINITY, 60),
        (
            FrontendKind::NodePort,
            true,
            None,
            SVC_F_EXTERNAL | SVC_F_NODEPORT | SVC_F_LOCAL,
            0,
        ),
        (FrontendKind::ExternalIp, false, None, SVC_F_EXTERNAL, 0),
        (
            FrontendKind::LoadBalancer,
            false,
            Some(10_800),
            SVC_F_EXTERNAL | SVC_F_AFFINITY,
            10_800,
        ),
    ];
    for (kind, local, affinity, flags, timeout) in cases {
        let mut w = World::new();
        w.set_desired(&DesiredFrontend {
            kind,
            local,
            affinity,
            ..DesiredFrontend::plain(node_port, active(&[1, 2]))
        });
        let m = w.master(node_port);
        assert_eq!(
            (m.flags, m.affinity_timeout),
            (flags, timeout),
            "{kind:?} local={local}"
        );
        assert!(w.maps.state.src_ranges.is_empty());
    }
}

#[test]
fn golden_source_ranges_make_before_break() {
    let mut w = World::new();
    let mut t = Transcript::default();

    // The IPv6 range does not apply to an IPv4 frontend.
    let p = w.set_desired(&lb(&["203.0.113.0/24", "10.0.0.0/8", "2001:db8::/32"]));
    t.record(
        "LB with two IPv4 ranges (the IPv6 one is ignored)",
        &p,
        &w.maps,
    );
    assert_eq!(
        short(&p.ops),
        ["B+1", "R+1", "L+10.0.0.0/8", "L+203.0.113.0/24", "M+"]
    );
    assert_eq!(w.master(lb_fe()).flags, SVC_F_EXTERNAL | SVC_F_SRC_RANGES);

    let p = w.set_desired(&lb(&["203.0.113.0/24", "192.0.2.0/24"]));
    t.record("swap 10.0.0.0/8 for 192.0.2.0/24", &p, &w.maps);
    // The new range exists before the old one goes; the master is unchanged.
    assert_eq!(short(&p.ops), ["L+192.0.2.0/24", "L-10.0.0.0/8"]);

    let p = w.set_desired(&lb(&[]));
    t.record("no ranges: the master stops checking first", &p, &w.maps);
    assert_eq!(short(&p.ops), ["M+", "L-192.0.2.0/24", "L-203.0.113.0/24"]);
    assert_eq!(w.master(lb_fe()).flags, SVC_F_EXTERNAL);

    let p = w.set_desired(&lb(&["203.0.113.0/24"]));
    t.record("ranges again: entries before the master", &p, &w.maps);
    assert_eq!(short(&p.ops), ["L+203.0.113.0/24", "M+"]);

    let p = w.delete(lb_fe());
    t.record("delete", &p, &w.maps);
    assert_eq!(short(&p.ops), ["M-", "B-1", "L-203.0.113.0/24", "R-1"]);
    assert_eq!(w.maps.state, Snapshot::default());
    check_golden("source_ranges", &t.0);
}

#[test]
fn a_frontend_never_gets_a_backend_of_the_other_family() {
    let mut w = World::new();
    let mixed = vec![
        be(1, BackendState::Active),
        Backend {
            addr: ip("fd00::1"),
            port: 8080,
            state: BackendState::Active,
        },
        Backend {
            addr: ip("::ffff:10.0.0.9").to_canonical(),
            port: 8080,
            state: BackendState::Terminating,
        },
    ];
    w.set(web(), &mixed);
    let m = w.master(web());
    assert_eq!((m.count, m.qcount), (1, 1));
    assert!(w.maps.state.backends.values().all(|b| b.addr.is_v4()));

    let v6 = Frontend {
        addr: ip("fd00::10"),
        port: 80,
        proto: Protocol::Tcp,
        scope: crate::model::Scope::All,
    };
    w.set(v6, &mixed);
    let m = w.master(v6);
    assert_eq!((m.count, m.qcount), (1, 0));
    let id = w.maps.state.positions(service_key(v6, 0))[0];
    assert_eq!(IpAddr::from(w.maps.state.backends[&id].addr), ip("fd00::1"));
    assert!(dump::render(&w.maps.state).contains(&format!(
        "svc     [fd00::10]:80/TCP slot=0 count=1 qcount=0 revnat={} backends={id}",
        m.rev_nat_id
    )));
}

#[test]
fn restore_rebuilds_flags_and_ranges_and_drops_stray_ranges() {
    let mut w = World::new();
    w.set_desired(&DesiredFrontend {
        affinity: Some(30),
        ..lb(&["203.0.113.0/24", "2001:db8::/32"])
    });
    let v6 = Frontend {
        addr: ip("2001:db8::1"),
        port: 443,
        proto: Protocol::Tcp,
        scope: crate::model::Scope::All,
    };
    let v6_lb = DesiredFrontend {
        kind: FrontendKind::LoadBalancer,
        source_ranges: cidrs(&["2001:db8::/32"]),
        ..DesiredFrontend::plain(
            v6,
            vec![Backend {
                addr: ip("fd00::1"),
                port: 8443,
                state: BackendState::Active,
            }],
        )
    };
    w.set_desired(&v6_lb);

    let r = restore(&w.maps.state);
    assert!(r.orphans.is_empty(), "{:?}", r.orphans);
    assert_eq!(r.images, w.images);

    // A range of a rev-NAT id no frontend has is an orphan.
    let mut state = w.maps.state.clone();
    let stray = crate::maps::SrcRange::new(99, Cidr::parse("10.0.0.0/8").unwrap());
    state.src_ranges.insert(stray);
    let mut r = restore(&state);
    assert_eq!(r.orphans, [MapOp::DeleteSrcRange(stray)]);
    assert_eq!(r.images, w.images);

    // Replanning the restored state writes nothing.
    let p = plan(v6, r.images.get(&v6), Some(&v6_lb), &mut r.ids);
    assert!(p.ops.is_empty(), "{:?}", p.ops);
}

#[test]
fn growth_counts_new_source_ranges() {
    let mut ids = Ids::default();
    let mut allocated = Vec::new();
    let one = FrontendImage::build(&lb(&["10.0.0.0/8"]), None, &mut ids, &mut allocated);
    let two = FrontendImage::build(
        &lb(&["10.0.0.0/8", "192.0.2.0/24"]),
        Some(&one),
        &mut ids,
        &mut allocated,
    );
    let g = growth(Some(&one), Some(&two));
    assert_eq!(g.get(crate::maps::MapName::SrcRanges), 1);
    assert_eq!(g.get(crate::maps::MapName::Services), 0);
}

/// xorshift64, as in the invariant tests.
fn next(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}

#[test]
fn a_client_admitted_before_and_after_is_admitted_throughout() {
    const POOL: [&str; 7] = [
        "0.0.0.0/0",
        "10.0.0.0/8",
        "10.1.0.0/16",
        "192.0.2.0/24",
        "192.0.2.128/25",
        "203.0.113.7/32",
        "2001:db8::/32",
    ];
    let clients: Vec<IpAddr> = [
        "10.1.2.3",
        "10.9.9.9",
        "192.0.2.200",
        "192.0.2.1",
        "203.0.113.7",
        "8.8.8.8",
    ]
    .iter()
    .map(|c| ip(c))
    .collect();
    let mut rng = 0x5851_f42d_4c95_7f2d_u64;
    let mut w = World::new();
    w.set_desired(&lb(&[]));
    for round in 0..300 {
        let ranges: Vec<&str> = POOL
            .iter()
            .copied()
            .filter(|_| next(&mut rng).is_multiple_of(3))
            .collect();
        let affinity = (next(&mut rng).is_multiple_of(2)).then_some(60);
        let new = DesiredFrontend {
            affinity,
            ..lb(&ranges)
        };
        let key = service_key(lb_fe(), 0);
        let before: Vec<bool> = clients.iter().map(|&c| w.maps.admits(key, c)).collect();
        let p = plan(lb_fe(), w.images.get(&lb_fe()), Some(&new), &mut w.ids);
        assert_phases(&p.ops);
        let mut after_maps = w.maps.clone();
        for op in &p.ops {
            after_maps.apply(op).unwrap();
        }
        let after: Vec<bool> = clients.iter().map(|&c| after_maps.admits(key, c)).collect();
        // The IPv4 frontend with no IPv4 range admits everyone.
        let v4_ranges = new
            .source_ranges
            .iter()
            .filter(|c| c.family() == crate::model::IpFamily::V4);
        for (i, &c) in clients.iter().enumerate() {
            let want = v4_ranges.clone().count() == 0 || v4_ranges.clone().any(|r| r.contains(c));
            assert_eq!(after[i], want, "round {round}: {c} with {ranges:?}");
        }
        for (n, op) in p.ops.iter().enumerate() {
            w.maps.apply(op).unwrap();
            for (i, &c) in clients.iter().enumerate() {
                if before[i] && after[i] {
                    assert!(
                        w.maps.admits(key, c),
                        "round {round}: {c} refused after op {n} ({op:?})"
                    );
                }
            }
        }
        w.settle(&p);
        let r = restore(&w.maps.state);
        assert!(r.orphans.is_empty(), "round {round}: {:?}", r.orphans);
        assert_eq!(r.images, w.images, "round {round}");
    }
}

#[test]
fn golden_etp_local_scopes() {
    // An eTP=Local NodePort frontend: the External scope (this node's
    // endpoint) and the All scope (every endpoint), same flags, each with its
    // own rev-NAT id and backend ids; written External first, as the
    // reconciler does.
    let all = Frontend::new(ip("192.168.0.10"), 30080, Protocol::Tcp);
    let ext = all.in_scope(crate::model::Scope::External);
    let d = |fe, hosts: &[u8]| DesiredFrontend {
        kind: FrontendKind::NodePort,
        local: true,
        affinity: Some(60),
        ..DesiredFrontend::plain(fe, active(hosts))
    };
    let mut w = World::new();
    let mut t = Transcript::default();
    let p = w.set_desired(&d(ext, &[1]));
    t.record("external scope: the local endpoint", &p, &w.maps);
    let p = w.set_desired(&d(all, &[1, 2]));
    t.record("all scope: every endpoint", &p, &w.maps);
    let (m_all, m_ext) = (w.master(all), w.master(ext));
    assert_eq!(m_all.flags, m_ext.flags);
    assert_ne!(m_all.rev_nat_id, m_ext.rev_nat_id);
    assert_eq!((m_all.count, m_ext.count), (2, 1));
    // The backend 10.0.0.1 is in both, under two ids.
    assert_eq!(w.maps.state.backends.len(), 3);
    // Restore tells the scopes apart.
    let r = restore(&w.maps.state);
    assert!(r.orphans.is_empty(), "{:?}", r.orphans);
    assert_eq!(r.images, w.images);
    assert_eq!(r.images.keys().copied().collect::<Vec<_>>(), [all, ext]);
    // Back to eTP=Cluster: the All master stops saying LOCAL, then the
    // local view goes (the reconciler's order).
    let p = w.set_desired(&DesiredFrontend {
        local: false,
        ..d(all, &[1, 2])
    });
    t.record("eTP=Cluster: all scope without LOCAL", &p, &w.maps);
    let p = w.delete(ext);
    t.record("then the external scope goes", &p, &w.maps);
    check_golden("etp_local_scopes", &t.0);
}
