//! The conntrack garbage collector.
//!
//! The datapath writes two entries per flow (forward and reply) and refreshes
//! their `expires` on every packet, but never deletes anything: finding out
//! that a flow is over needs a clock and a sweep, which belong in userspace.
//! LRU eviction alone would keep dead flows until the map is full, and then
//! evict live ones as readily as dead ones. So every `--ct-gc-interval` the
//! agent walks both tables and deletes each flow whose two entries have both
//! expired. Deleting only complete pairs matters: a flow that is idle in one
//! direction but alive in the other (a UDP stream that only the client sends
//! on, say) keeps its reply entry, so a late reply is still translated.
//!
//! The walk is not a snapshot: the datapath keeps refreshing, replacing and
//! creating entries while it runs. So every entry (and its peer) is read
//! again right before it is deleted, and deleted only if it is still expired
//! and byte-for-byte what the walk saw; a flow that came back to life, or a
//! new flow that reused the tuple, is left alone. The walk reads the table
//! with `BPF_MAP_LOOKUP_BATCH`, a chunk of entries per syscall (key by key,
//! a full table of 512Ki entries cost a million syscalls a sweep), and keeps
//! only the expired candidates, never a copy of the whole table.
use std::{
    collections::{HashMap, HashSet},
    io,
    os::fd::{AsFd as _, OwnedFd},
    path::{Path, PathBuf},
    time::Duration,
};

use aya::maps::{HashMap as BpfHashMap, Map, MapData, MapError};
use tracing::{debug, info, warn};
use weir_abi::{CtKey, CtValue, RevSockKey, RevSockValue};

use crate::maps::batch::Batch;

use crate::inspect::stats::StatView;

#[derive(Debug, thiserror::Error)]
pub enum CtGcError {
    #[error("cannot open map {map}")]
    Open {
        map: &'static str,
        #[source]
        source: MapError,
    },
    #[error("cannot read conntrack map {map}")]
    Read {
        map: &'static str,
        #[source]
        source: io::Error,
    },
}

/// One conntrack table: the typed map for the re-reads and deletes, and its
/// batch interface for the walk.
struct Table {
    proto: &'static str,
    map: &'static str,
    live: BpfHashMap<MapData, CtKey, CtValue>,
    batch: Batch<CtKey, CtValue>,
}

/// What one sweep of one table did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GcReport {
    /// `"tcp"` or `"udp"` (the UDP table also holds SCTP).
    pub proto: &'static str,
    /// Entries found before deleting.
    pub entries: usize,
    /// Entries deleted.
    pub deleted: usize,
}

/// Called after each sweep with every datapath counter (`inspect stats`)
/// and the packets it counted since the previous call (all of them the
/// first time), for the metrics.
type StatsObserver = Box<dyn Fn(&StatView, u64) + Send>;

/// Called after each sweep with the entries of the socket hooks'
/// reverse-translation map and its capacity (its pressure metric).
type RevSockObserver = Box<dyn Fn(usize, u32) + Send>;

/// The two pinned conntrack tables.
pub struct CtGc {
    tables: Vec<Table>,
    maps_dir: PathBuf,
    stats: Option<StatsObserver>,
    revsock: Option<(Batch<RevSockKey, RevSockValue>, u32, RevSockObserver)>,
}

impl CtGc {
    /// Opens `WEIR_CT_TCP` and `WEIR_CT_UDP` pinned in `maps_dir`.
    pub fn open(maps_dir: &Path) -> Result<Self, CtGcError> {
        let mut tables = Vec::new();
        for (proto, map) in [("tcp", weir_abi::MAP_CT_TCP), ("udp", weir_abi::MAP_CT_UDP)] {
            let (live, batch) = open_ct(maps_dir, map)?;
            tables.push(Table {
                proto,
                map,
                live,
                batch,
            });
        }
        Ok(Self {
            tables,
            maps_dir: maps_dir.to_owned(),
            stats: None,
            revsock: None,
        })
    }

    /// Also counts `WEIR_REVSOCK` after every sweep and hands the count and
    /// the capacity to `observe`. The datapath removes a socket's entries
    /// when it closes, so this is how many translated sockets are open; a
    /// full map means the oldest lose their reverse translation. Without
    /// the map (socket LB never loaded) nothing is counted.
    pub fn with_revsock(mut self, observe: impl Fn(usize, u32) + Send + 'static) -> Self {
        let map = weir_abi::MAP_REVSOCK;
        match open_batch(&self.maps_dir, map) {
            Ok((batch, capacity)) => self.revsock = Some((batch, capacity, Box::new(observe))),
            Err(e) => warn!("cannot open {map}: {e}; its pressure is not reported"),
        }
        self
    }

    /// Also hands the datapath's packet counters to `observe` after every
    /// sweep (see [`StatsObserver`]): the same numbers as `weir-agent
    /// inspect stats`, e.g. `drop-snat-ports` when a SNAT range is full.
    pub fn with_stats(mut self, observe: impl Fn(&StatView, u64) + Send + 'static) -> Self {
        self.stats = Some(Box::new(observe));
        self
    }

    /// Every entry of both tables (for `weir-agent inspect conntrack`).
    pub fn entries(&self) -> Result<Vec<(CtKey, CtValue)>, CtGcError> {
        let mut out = Vec::new();
        for t in &self.tables {
            out.extend(read_ct(&t.batch, t.map)?);
        }
        Ok(out)
    }

    /// One sweep of both tables against `now` (CLOCK_MONOTONIC seconds).
    pub fn collect(&mut self, now: u32) -> Result<Vec<GcReport>, CtGcError> {
        let mut reports = Vec::new();
        for t in &mut self.tables {
            let (proto, map) = (t.proto, t.map);
            let (entries, cands) = {
                let live = &t.live;
                let lookup = |k: &CtKey| live.get(k, 0).ok();
                let mut err = None;
                let walk = t.batch.iter().map_while(|item| match item {
                    Ok(kv) => Some(kv),
                    Err(source) => {
                        err = Some(source);
                        None
                    }
                });
                let found = candidates(walk, lookup, now);
                if let Some(source) = err {
                    return Err(CtGcError::Read { map, source });
                }
                found
            };
            let deleted = reap(&cands, &mut LiveTable(&mut t.live), now);
            reports.push(GcReport {
                proto,
                entries,
                deleted,
            });
        }
        Ok(reports)
    }

    /// Sweeps every `interval` on a thread of its own (a sweep is up to a
    /// million bpf() calls, which must not stall the async runtime), handing
    /// each table's report to `observe` (metrics).
    pub fn spawn(
        mut self,
        interval: Duration,
        observe: impl Fn(&GcReport) + Send + 'static,
    ) -> io::Result<()> {
        info!(?interval, "conntrack garbage collection on");
        std::thread::Builder::new()
            .name("weir-ct-gc".into())
            .spawn(move || {
                let mut failing = false;
                let mut last: HashMap<(&'static str, &'static str), u64> = HashMap::new();
                loop {
                    // Sweep first: flows an earlier agent left expired go now,
                    // and the gauges have values from the start.
                    match self.collect(monotonic_secs()) {
                        Ok(reports) => {
                            failing = false;
                            for r in &reports {
                                observe(r);
                                debug!(proto = r.proto, entries = r.entries, deleted = r.deleted, "conntrack sweep");
                            }
                        }
                        // Logged once per failure streak: a broken map stays broken.
                        Err(e) if !failing => {
                            failing = true;
                            warn!("conntrack garbage collection failed: {e}; retrying every {interval:?}");
                        }
                        Err(_) => {}
                    }
                    if let Some(observe) = &self.stats {
                        observe_stats(&self.maps_dir, &mut last, observe);
                    }
                    if let Some((batch, capacity, observe)) = &self.revsock {
                        // A failed walk leaves the gauges at their last value.
                        if let Ok(n) = batch.iter().try_fold(0usize, |n, e| e.map(|_| n + 1)) {
                            observe(n, *capacity);
                        }
                    }
                    std::thread::sleep(interval);
                }
            })
            .map(drop)
    }
}

/// Reads the counters and hands each to `observe` with its increase since
/// `last` (a counter that went back, after a `cleanup`, counts from zero).
fn observe_stats(
    maps_dir: &Path,
    last: &mut HashMap<(&'static str, &'static str), u64>,
    observe: &StatsObserver,
) {
    let Ok(views) = crate::inspect::read_stats(maps_dir) else {
        return;
    };
    for (v, delta) in stat_deltas(last, &views) {
        observe(v, delta);
    }
}

/// Each counter of `views` with its increase since `last`, which it then
/// replaces.
fn stat_deltas<'a>(
    last: &mut HashMap<(&'static str, &'static str), u64>,
    views: &'a [StatView],
) -> Vec<(&'a StatView, u64)> {
    views
        .iter()
        .map(|v| {
            let delta = match last.insert((v.program, v.reason), v.packets) {
                Some(b) if b <= v.packets => v.packets - b,
                _ => v.packets,
            };
            (v, delta)
        })
        .collect()
}

type LiveMap = BpfHashMap<MapData, CtKey, CtValue>;

/// The typed map, and a second fd for the batch walk (aya's typed maps do
/// not lend theirs). `try_from` checks the key and value sizes the batch
/// relies on. Batch lookups need 5.6; tcx, which the datapath needs, 6.6.
fn open_ct(dir: &Path, map: &'static str) -> Result<(LiveMap, Batch<CtKey, CtValue>), CtGcError> {
    let (live, fd, _) = open_typed(dir, map)?;
    Ok((live, Batch::new(fd)))
}

/// A batch reader of any pinned hash map with its capacity.
fn open_batch<K: aya::Pod, V: aya::Pod>(
    dir: &Path,
    map: &'static str,
) -> Result<(Batch<K, V>, u32), CtGcError> {
    // The typed map only checks the sizes.
    let (_, fd, capacity) = open_typed::<K, V>(dir, map)?;
    Ok((Batch::new(fd), capacity))
}

/// A pinned hash map as a typed map (which checks the key and value sizes),
/// a second fd to it, and its capacity.
type Typed<K, V> = (BpfHashMap<MapData, K, V>, OwnedFd, u32);

/// The pinned hash map `map`: see [`Typed`].
fn open_typed<K: aya::Pod, V: aya::Pod>(
    dir: &Path,
    map: &'static str,
) -> Result<Typed<K, V>, CtGcError> {
    let err = |source| CtGcError::Open { map, source };
    let data = MapData::from_pin(dir.join(map)).map_err(err)?;
    let capacity = data.info().map_err(err)?.max_entries();
    let fd = data
        .fd()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| err(MapError::IoError(e)))?;
    let m = Map::from_map_data(data).map_err(err)?;
    Ok((BpfHashMap::try_from(m).map_err(err)?, fd, capacity))
}

/// Every entry of one table. The batch walk goes bucket by bucket, so it
/// ends however the flows churn meanwhile.
fn read_ct(
    table: &Batch<CtKey, CtValue>,
    map: &'static str,
) -> Result<HashMap<CtKey, CtValue>, CtGcError> {
    table
        .iter()
        .collect::<io::Result<_>>()
        .map_err(|source| CtGcError::Read { map, source })
}

/// Read-again and delete, on the live map or (in tests) a `HashMap`.
pub trait CtTable {
    fn lookup(&self, key: &CtKey) -> Option<CtValue>;
    /// Whether an entry was deleted.
    fn delete(&mut self, key: &CtKey) -> bool;
}

struct LiveTable<'a>(&'a mut BpfHashMap<MapData, CtKey, CtValue>);

impl CtTable for LiveTable<'_> {
    fn lookup(&self, key: &CtKey) -> Option<CtValue> {
        self.0.get(key, 0).ok()
    }
    fn delete(&mut self, key: &CtKey) -> bool {
        // Absent: the datapath's LRU evicted it meanwhile; fine.
        self.0.remove(key).is_ok()
    }
}

impl CtTable for HashMap<CtKey, CtValue> {
    fn lookup(&self, key: &CtKey) -> Option<CtValue> {
        self.get(key).copied()
    }
    fn delete(&mut self, key: &CtKey) -> bool {
        self.remove(key).is_some()
    }
}

/// An expired entry the walk found, with its peer as read then (`None`:
/// the peer was gone, evicted by the LRU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub key: CtKey,
    pub value: CtValue,
    pub peer: CtKey,
    pub peer_value: Option<CtValue>,
}

/// Walks `entries` (the live table's iterator) and returns how many there
/// were and every flow that looked dead: an expired entry whose peer,
/// read through `lookup`, is expired or gone. A pair is listed once.
pub fn candidates(
    entries: impl Iterator<Item = (CtKey, CtValue)>,
    lookup: impl Fn(&CtKey) -> Option<CtValue>,
    now: u32,
) -> (usize, Vec<Candidate>) {
    let mut count = 0;
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (key, value) in entries {
        count += 1;
        if !expired(&value, now) || seen.contains(&key) {
            continue;
        }
        let peer = key.peer(&value);
        let peer_value = lookup(&peer);
        if peer_value.is_some_and(|pv| !expired(&pv, now)) {
            continue;
        }
        seen.insert(key);
        seen.insert(peer);
        out.push(Candidate {
            key,
            value,
            peer,
            peer_value,
        });
    }
    (count, out)
}

/// What a second read of an entry says about deleting it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recheck {
    /// Gone meanwhile: nothing to delete.
    Gone,
    /// Still expired and exactly as the walk saw it.
    Delete,
    /// Refreshed, replaced or new: the flow is alive, keep the pair.
    Keep,
}

/// Compares what the walk saw (`seen`, `None` = absent) with a fresh read.
pub fn recheck(seen: Option<&CtValue>, current: Option<&CtValue>, now: u32) -> Recheck {
    match (seen, current) {
        (_, None) => Recheck::Gone,
        (Some(s), Some(c)) if s == c && expired(c, now) => Recheck::Delete,
        // Changed, or (peer) absent during the walk and back now.
        _ => Recheck::Keep,
    }
}

/// Deletes the candidates that are still dead on a second read; returns how
/// many entries went. A pair is kept whole if either side changed.
pub fn reap(cands: &[Candidate], table: &mut impl CtTable, now: u32) -> usize {
    let mut deleted = 0;
    for c in cands {
        let me = recheck(Some(&c.value), table.lookup(&c.key).as_ref(), now);
        let peer = recheck(c.peer_value.as_ref(), table.lookup(&c.peer).as_ref(), now);
        if me == Recheck::Keep || peer == Recheck::Keep {
            continue;
        }
        for (verdict, key) in [(me, &c.key), (peer, &c.peer)] {
            if verdict == Recheck::Delete && table.delete(key) {
                deleted += 1;
            }
        }
    }
    deleted
}

/// Whether `value` has expired at `now` (both in CLOCK_MONOTONIC seconds).
pub const fn expired(value: &CtValue, now: u32) -> bool {
    value.expires < now
}

/// The keys a sweep at `now` would delete from `entries` if nothing changed
/// meanwhile: every expired entry whose peer is expired or gone, with that
/// peer.
pub fn doomed(entries: &HashMap<CtKey, CtValue>, now: u32) -> Vec<CtKey> {
    let (_, cands) = candidates(
        entries.iter().map(|(k, v)| (*k, *v)),
        |k| entries.get(k).copied(),
        now,
    );
    let mut out: Vec<_> = cands
        .iter()
        .flat_map(|c| [Some(c.key), c.peer_value.map(|_| c.peer)])
        .flatten()
        .collect();
    out.sort_unstable();
    out
}

/// `CLOCK_MONOTONIC` in whole seconds, the clock `bpf_ktime_get_ns()` reads.
pub fn monotonic_secs() -> u32 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass; CLOCK_MONOTONIC
    // always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u32::try_from(ts.tv_sec).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use weir_abi::{Addr, CT_DIR_FORWARD, CT_DIR_REPLY, PROTO_UDP};

    use super::*;

    fn a(last: u8) -> Addr {
        Addr::from_v4(u32::from_ne_bytes([10, 0, 0, last]))
    }

    /// A client 10.0.0.1:4000 → frontend 10.0.0.100:53, backend 10.0.0.2:5353,
    /// SNAT to 10.0.0.3:4000. Forward and reply entries with the given expiries.
    fn flow(fwd_exp: u32, rep_exp: u32) -> [(CtKey, CtValue); 2] {
        let fwd_k = CtKey {
            saddr: a(1),
            daddr: a(100),
            sport: 4000u16.to_be(),
            dport: 53u16.to_be(),
            proto: PROTO_UDP,
            dir: CT_DIR_FORWARD,
            ..CtKey::default()
        };
        let fwd_v = CtValue {
            nat_daddr: a(2),
            nat_saddr: a(3),
            nat_dport: 5353u16.to_be(),
            nat_sport: 4000u16.to_be(),
            expires: fwd_exp,
            ..CtValue::default()
        };
        let rep_k = CtKey {
            saddr: a(2),
            daddr: a(3),
            sport: 5353u16.to_be(),
            dport: 4000u16.to_be(),
            proto: PROTO_UDP,
            dir: CT_DIR_REPLY,
            ..CtKey::default()
        };
        let rep_v = CtValue {
            nat_daddr: a(1),
            nat_saddr: a(100),
            nat_dport: 4000u16.to_be(),
            nat_sport: 53u16.to_be(),
            expires: rep_exp,
            ..CtValue::default()
        };
        [(fwd_k, fwd_v), (rep_k, rep_v)]
    }

    #[test]
    fn peers_point_at_each_other() {
        let [(fk, fv), (rk, rv)] = flow(0, 0);
        assert_eq!(fk.peer(&fv), rk);
        assert_eq!(rk.peer(&rv), fk);
    }

    #[test]
    fn deletes_pairs_only_when_both_expired() {
        let now = 1000;
        for (fwd, rep, gone) in [
            (999, 999, 2),
            (999, 1000, 0),
            (1000, 999, 0),
            (2000, 2000, 0),
        ] {
            let m: HashMap<_, _> = flow(fwd, rep).into_iter().collect();
            assert_eq!(doomed(&m, now).len(), gone, "fwd {fwd} rep {rep}");
        }
    }

    #[test]
    fn orphans_go_once_expired() {
        let [fwd, rep] = flow(5, 5);
        for entry in [fwd, rep] {
            let m: HashMap<_, _> = [entry].into_iter().collect();
            assert_eq!(doomed(&m, 10), vec![entry.0]);
            assert!(doomed(&m, 5).is_empty());
        }
    }

    #[test]
    fn unrelated_flows_are_independent() {
        let mut m: HashMap<_, _> = flow(1, 1).into_iter().collect();
        let [(mut k, v), (mut rk, rv)] = flow(100, 100);
        k.sport = 4001u16.to_be();
        rk.dport = 4001u16.to_be();
        m.insert(
            k,
            CtValue {
                nat_sport: 4001u16.to_be(),
                ..v
            },
        );
        m.insert(
            rk,
            CtValue {
                nat_dport: 4001u16.to_be(),
                ..rv
            },
        );
        assert_eq!(doomed(&m, 50).len(), 2);
        assert!(!doomed(&m, 50).contains(&k));
    }

    #[test]
    fn sweep_deletes_dead_pairs() {
        let mut m: HashMap<_, _> = flow(5, 5).into_iter().collect();
        let snap = m.clone();
        let (n, c) = candidates(snap.into_iter(), |k| m.get(k).copied(), 10);
        assert_eq!((n, c.len()), (2, 1));
        assert_eq!(reap(&c, &mut m, 10), 2);
        assert!(m.is_empty());
    }

    #[test]
    fn refreshed_entry_saves_its_pair() {
        let [(fk, fv), (rk, rv)] = flow(5, 5);
        for refreshed in [fk, rk] {
            let mut m: HashMap<_, _> = [(fk, fv), (rk, rv)].into_iter().collect();
            let (_, c) = candidates(m.clone().into_iter(), |k| m.get(k).copied(), 10);
            // A packet arrives between the walk and the delete.
            m.get_mut(&refreshed).unwrap().expires = 100;
            assert_eq!(reap(&c, &mut m, 10), 0);
            assert_eq!(m.len(), 2);
        }
    }

    #[test]
    fn replaced_entry_is_not_deleted() {
        let [(fk, fv), (rk, rv)] = flow(5, 5);
        let mut m: HashMap<_, _> = [(fk, fv), (rk, rv)].into_iter().collect();
        let (_, c) = candidates(m.clone().into_iter(), |k| m.get(k).copied(), 10);
        // A new flow reused the tuple: still expired (say a stale clock
        // read), but not what the walk saw.
        m.insert(
            fk,
            CtValue {
                backend_id: 9,
                ..fv
            },
        );
        assert_eq!(reap(&c, &mut m, 10), 0);
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn peer_that_reappears_keeps_the_entry() {
        let [(fk, fv), (rk, rv)] = flow(5, 5);
        let mut m: HashMap<_, _> = [(fk, fv)].into_iter().collect();
        let (_, c) = candidates(m.clone().into_iter(), |k| m.get(k).copied(), 10);
        assert_eq!(c[0].peer_value, None);
        m.insert(rk, CtValue { expires: 100, ..rv });
        assert_eq!(reap(&c, &mut m, 10), 0);
        // Gone on both sides meanwhile: nothing to do, no error.
        let mut empty = HashMap::new();
        assert_eq!(reap(&c, &mut empty, 10), 0);
    }

    #[test]
    fn recheck_decisions() {
        let v = CtValue {
            expires: 5,
            ..CtValue::default()
        };
        let fresh = CtValue { expires: 50, ..v };
        assert_eq!(recheck(Some(&v), Some(&v), 10), Recheck::Delete);
        assert_eq!(recheck(Some(&v), None, 10), Recheck::Gone);
        assert_eq!(recheck(None, None, 10), Recheck::Gone);
        assert_eq!(recheck(Some(&v), Some(&fresh), 10), Recheck::Keep);
        assert_eq!(recheck(None, Some(&v), 10), Recheck::Keep);
        // Same value but the clock says it is not expired (now went back?): keep.
        assert_eq!(recheck(Some(&v), Some(&v), 5), Recheck::Keep);
    }

    #[test]
    fn stat_deltas_count_increases_and_restart_after_a_reset() {
        let view = |packets| StatView {
            program: "tc-ingress",
            reason: "drop-snat-ports",
            packets,
            bytes: 0,
        };
        let mut last = HashMap::new();
        let d = |last: &mut HashMap<_, _>, n| stat_deltas(last, &[view(n)])[0].1;
        assert_eq!(d(&mut last, 5), 5, "the first read counts everything");
        assert_eq!(d(&mut last, 5), 0);
        assert_eq!(d(&mut last, 9), 4);
        assert_eq!(d(&mut last, 2), 2, "a counter that went back starts over");
    }

    #[test]
    fn monotonic_clock_moves_forward() {
        let t = monotonic_secs();
        assert!(t > 0);
        assert!(monotonic_secs() >= t);
    }
}
