//! The entries of one frontend, held by what varies between them.
//!
//! The reconciler keeps every frontend's entries as written, to plan the next
//! change as a diff and to roll a failed one back. As two `BTreeMap`s per
//! frontend that was 58 MB of leaves at 100k Services × 10 endpoints, and
//! most of it repeated what the frontend already says: a slot value only
//! names backends (every other field is the rev-NAT id or zero), and every
//! backend carries its frontend's protocol and rev-NAT id, mostly with an
//! IPv4 address in 16 bytes.
//!
//! So what [`super::FrontendImage::build`] writes is held as the master's
//! fields and the backend ids in position order (4 bytes a backend), and,
//! per backend, id, address, port and state
//! (12 bytes for IPv4, 24 for IPv6); values are rebuilt on read. Anything
//! else (entries restored from maps an older agent wrote, or left by a
//! failed rollback) is held as it is, in a map: correctness never depends
//! on the compact form, only memory does. Each set of entries has exactly
//! one form, so comparing forms compares entries.
use std::collections::BTreeMap;
use std::fmt;

use weir_abi::{Addr, Backend, SVC_IDS, ServiceValue, position_slot, service_entries};

/// Services-map values by slot; slot 0 is the master.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Slots(SlotRepr);

#[derive(Clone, PartialEq, Eq)]
enum SlotRepr {
    /// The master is `head` with the first [`SVC_IDS`] of `ids`; slot `s`
    /// is `{ rev_nat_id, ids: ids[s * SVC_IDS ..] }`, all else zero, for as
    /// many slots as `ids` fills.
    Plain { head: Head, ids: Box<[u32]> },
    /// Any other entries, by slot (the master's included).
    Explicit(BTreeMap<u16, ServiceValue>),
}

impl Default for SlotRepr {
    fn default() -> Self {
        Self::Explicit(BTreeMap::new())
    }
}

/// A master without its ids: 20 bytes where the value takes 64.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Head {
    table_size: u32,
    count: u16,
    qcount: u16,
    rev_nat_id: u32,
    flags: u16,
    affinity_timeout: u32,
}

impl Head {
    fn of(v: &ServiceValue) -> Self {
        Self {
            table_size: v.table_size,
            count: v.count,
            qcount: v.qcount,
            rev_nat_id: v.rev_nat_id,
            flags: v.flags,
            affinity_timeout: v.affinity_timeout,
        }
    }

    fn with(&self, ids: [u32; SVC_IDS]) -> ServiceValue {
        ServiceValue {
            table_size: self.table_size,
            count: self.count,
            qcount: self.qcount,
            rev_nat_id: self.rev_nat_id,
            flags: self.flags,
            _pad: [0; 2],
            affinity_timeout: self.affinity_timeout,
            ids,
        }
    }
}

/// The ids of entry `slot`: `ids[slot * SVC_IDS ..]`, zero past the end.
fn chunk(ids: &[u32], slot: usize) -> [u32; SVC_IDS] {
    let mut out = [0; SVC_IDS];
    let from = (slot * SVC_IDS).min(ids.len());
    let part = &ids[from..ids.len().min(from + SVC_IDS)];
    out[..part.len()].copy_from_slice(part);
    out
}

impl Slots {
    /// `master` holding `ids` in position order, with the slots they spill
    /// into. The master's own ids are ignored.
    pub fn plain(master: ServiceValue, ids: Vec<u32>) -> Self {
        Self(SlotRepr::Plain {
            head: Head::of(&master),
            ids: ids.into_boxed_slice(),
        })
    }

    /// Any values by slot, in the compact form when they have one.
    pub fn from_map(map: BTreeMap<u16, ServiceValue>) -> Self {
        if let Some(master) = map.get(&0) {
            // Ids run on from entry to entry; id 0 is never a backend's, so
            // the first 0 ends them.
            let ids: Vec<u32> = map
                .values()
                .flat_map(|v| v.ids)
                .take_while(|&id| id != 0)
                .collect();
            let plain = Self::plain(*master, ids);
            if plain.iter().eq(map.iter().map(|(&s, &v)| (s, v))) {
                return plain;
            }
        }
        Self(SlotRepr::Explicit(map))
    }

    pub fn to_map(&self) -> BTreeMap<u16, ServiceValue> {
        self.iter().collect()
    }

    pub fn get(&self, slot: u16) -> Option<ServiceValue> {
        match &self.0 {
            SlotRepr::Plain { head, ids } => {
                let s = usize::from(slot);
                if s >= service_entries(ids.len()) {
                    return None;
                }
                let ids = chunk(ids, s);
                Some(if s == 0 {
                    head.with(ids)
                } else {
                    slot_value(head.rev_nat_id, ids)
                })
            }
            SlotRepr::Explicit(map) => map.get(&slot).copied(),
        }
    }

    /// The backend id at `position` (see `weir_abi::SVC_IDS`), as a reader
    /// of these entries finds it.
    pub fn position(&self, position: usize) -> Option<u32> {
        let (slot, index) = position_slot(position)?;
        Some(self.get(slot)?.ids[index])
    }

    pub fn contains(&self, slot: u16) -> bool {
        match &self.0 {
            SlotRepr::Plain { ids, .. } => usize::from(slot) < service_entries(ids.len()),
            SlotRepr::Explicit(map) => map.contains_key(&slot),
        }
    }

    pub fn len(&self) -> usize {
        match &self.0 {
            SlotRepr::Plain { ids, .. } => service_entries(ids.len()),
            SlotRepr::Explicit(map) => map.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Slots `1..` in order.
    pub fn slots(&self) -> impl Iterator<Item = (u16, ServiceValue)> + '_ {
        self.iter().filter(|&(s, _)| s != 0)
    }

    /// Every entry, the master first.
    pub fn iter(&self) -> impl Iterator<Item = (u16, ServiceValue)> + '_ {
        let (plain, explicit) = match &self.0 {
            SlotRepr::Plain { ids, .. } => (Some(0..service_entries(ids.len())), None),
            SlotRepr::Explicit(map) => (None, Some(map)),
        };
        // Entries are built on the way: a slot's value is not stored.
        let plain = plain.into_iter().flatten().filter_map(|s| {
            let slot = u16::try_from(s).ok()?;
            Some((slot, self.get(slot)?))
        });
        let explicit = explicit
            .into_iter()
            .flat_map(|m| m.iter().map(|(&s, &v)| (s, v)));
        plain.chain(explicit)
    }
}

/// The value of a slot past the master.
const fn slot_value(rev_nat_id: u32, ids: [u32; SVC_IDS]) -> ServiceValue {
    ServiceValue {
        table_size: 0,
        count: 0,
        qcount: 0,
        rev_nat_id,
        flags: 0,
        _pad: [0; 2],
        affinity_timeout: 0,
        ids,
    }
}

impl fmt::Debug for Slots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// Backends-map values by backend id.
#[derive(Clone, PartialEq, Eq)]
pub struct Backends(BackendRepr);

#[derive(Clone, PartialEq, Eq)]
enum BackendRepr {
    /// Sorted by id; every address IPv4-mapped.
    V4(Shared, Box<[Entry<u32>]>),
    /// Sorted by id; some address not IPv4-mapped.
    V6(Shared, Box<[Entry<Addr>]>),
    /// Backends that differ in protocol or rev-NAT id.
    Explicit(BTreeMap<u32, Backend>),
}

/// What every backend of a compact set has in common.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
struct Shared {
    proto: u8,
    rev_nat_id: u32,
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct Entry<A> {
    id: u32,
    addr: A,
    /// Network order, as in [`Backend::port`].
    port: u16,
    state: u8,
}

/// An address as a compact entry holds it.
trait Packed: Copy {
    fn pack(addr: Addr) -> Option<Self>;
    fn unpack(self) -> Addr;
}

impl Packed for u32 {
    fn pack(addr: Addr) -> Option<Self> {
        addr.is_v4().then(|| addr.v4())
    }

    fn unpack(self) -> Addr {
        Addr::from_v4(self)
    }
}

impl Packed for Addr {
    fn pack(addr: Addr) -> Option<Self> {
        Some(addr)
    }

    fn unpack(self) -> Addr {
        self
    }
}

impl<A: Packed> Entry<A> {
    fn pack(id: u32, b: &Backend, shared: Shared) -> Option<Self> {
        (b.proto == shared.proto && b.rev_nat_id == shared.rev_nat_id).then_some(())?;
        Some(Self {
            id,
            addr: A::pack(b.addr)?,
            port: b.port,
            state: b.state,
        })
    }

    fn unpack(&self, shared: Shared) -> (u32, Backend) {
        let b = Backend {
            addr: self.addr.unpack(),
            port: self.port,
            proto: shared.proto,
            state: self.state,
            rev_nat_id: shared.rev_nat_id,
        };
        (self.id, b)
    }
}

/// `backends` sorted by id with distinct ids, packed if every one packs.
fn pack_all<A: Packed>(backends: &[(u32, Backend)], shared: Shared) -> Option<Box<[Entry<A>]>> {
    backends
        .iter()
        .map(|(id, b)| Entry::pack(*id, b, shared))
        .collect()
}

impl Default for Backends {
    fn default() -> Self {
        Self(BackendRepr::V4(Shared::default(), Box::default()))
    }
}

impl Backends {
    /// Any backends; of two with one id the later wins, as in a map.
    pub fn from_unsorted(mut backends: Vec<(u32, Backend)>) -> Self {
        // Stable, so that among equal ids the later one stays last.
        backends.sort_by_key(|(id, _)| *id);
        backends.dedup_by(|later, earlier| {
            let same = later.0 == earlier.0;
            if same {
                *earlier = *later;
            }
            same
        });
        let Some((_, first)) = backends.first() else {
            return Self::default();
        };
        let shared = Shared {
            proto: first.proto,
            rev_nat_id: first.rev_nat_id,
        };
        if let Some(v4) = pack_all(&backends, shared) {
            Self(BackendRepr::V4(shared, v4))
        } else if let Some(v6) = pack_all(&backends, shared) {
            Self(BackendRepr::V6(shared, v6))
        } else {
            Self(BackendRepr::Explicit(backends.into_iter().collect()))
        }
    }

    pub fn from_map(map: BTreeMap<u32, Backend>) -> Self {
        Self::from_unsorted(map.into_iter().collect())
    }

    pub fn to_map(&self) -> BTreeMap<u32, Backend> {
        self.iter().collect()
    }

    pub fn get(&self, id: u32) -> Option<Backend> {
        fn find<A: Packed>(e: &[Entry<A>], s: Shared, id: u32) -> Option<Backend> {
            let i = e.binary_search_by_key(&id, |e| e.id).ok()?;
            Some(e[i].unpack(s).1)
        }
        match &self.0 {
            BackendRepr::V4(s, e) => find(e, *s, id),
            BackendRepr::V6(s, e) => find(e, *s, id),
            BackendRepr::Explicit(map) => map.get(&id).copied(),
        }
    }

    pub fn contains(&self, id: u32) -> bool {
        match &self.0 {
            BackendRepr::V4(_, e) => e.binary_search_by_key(&id, |e| e.id).is_ok(),
            BackendRepr::V6(_, e) => e.binary_search_by_key(&id, |e| e.id).is_ok(),
            BackendRepr::Explicit(map) => map.contains_key(&id),
        }
    }

    pub fn len(&self) -> usize {
        match &self.0 {
            BackendRepr::V4(_, e) => e.len(),
            BackendRepr::V6(_, e) => e.len(),
            BackendRepr::Explicit(map) => map.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// By id.
    pub fn iter(&self) -> impl Iterator<Item = (u32, Backend)> + '_ {
        let (v4, v6, explicit) = match &self.0 {
            BackendRepr::V4(s, e) => (Some((*s, e)), None, None),
            BackendRepr::V6(s, e) => (None, Some((*s, e)), None),
            BackendRepr::Explicit(map) => (None, None, Some(map)),
        };
        let v4 = v4
            .into_iter()
            .flat_map(|(s, e)| e.iter().map(move |e| e.unpack(s)));
        let v6 = v6
            .into_iter()
            .flat_map(|(s, e)| e.iter().map(move |e| e.unpack(s)));
        let explicit = explicit
            .into_iter()
            .flat_map(|m| m.iter().map(|(&id, &b)| (id, b)));
        v4.chain(v6).chain(explicit)
    }

    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.iter().map(|(id, _)| id)
    }
}

impl fmt::Debug for Backends {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use weir_abi::{BACKEND_STATE_ACTIVE, BACKEND_STATE_DRAINING};

    use super::*;

    fn backend(ip: [u8; 4], rev_nat_id: u32) -> Backend {
        Backend {
            addr: Addr::from(IpAddr::from(ip)),
            port: 8080u16.to_be(),
            proto: 6,
            state: BACKEND_STATE_ACTIVE,
            rev_nat_id,
        }
    }

    #[test]
    fn built_entries_take_the_compact_form_and_read_back_as_written() {
        let mut v6 = backend([0; 4], 7);
        v6.addr = Addr::from("2001:db8::1".parse::<IpAddr>().unwrap());
        v6.state = BACKEND_STATE_DRAINING;
        let v4 = backend([10, 0, 0, 1], 7);
        for set in [vec![(9, v4), (3, v4)], vec![(9, v4), (3, v6)]] {
            let b = Backends::from_unsorted(set.clone());
            assert!(!matches!(b.0, BackendRepr::Explicit(_)), "{b:?}");
            let want: BTreeMap<u32, Backend> = set.into_iter().collect();
            assert_eq!(b.to_map(), want);
            assert_eq!(b.get(3), want.get(&3).copied());
            assert!(b.contains(9) && !b.contains(4) && b.get(4).is_none());
            assert_eq!(b, Backends::from_map(want));
        }
        let mut later = v4;
        later.state = BACKEND_STATE_DRAINING;
        let b = Backends::from_unsorted(vec![(3, v4), (1, v4), (3, later)]);
        assert_eq!(
            b.to_map(),
            BTreeMap::from([(1, v4), (3, later)]),
            "as a map would"
        );
        let master = ServiceValue {
            count: 13,
            rev_nat_id: 7,
            ..ServiceValue::default()
        };
        let ids: Vec<u32> = (101..=113).collect();
        let slots = Slots::plain(master, ids.clone());
        assert!(matches!(slots.0, SlotRepr::Plain { .. }));
        let entries = slots.iter().collect::<Vec<_>>();
        let mut first = master;
        first.ids = std::array::from_fn(|i| ids[i]);
        assert_eq!(
            entries,
            [
                (0, first),
                (1, slot_value(7, [112, 113, 0, 0, 0, 0, 0, 0, 0, 0, 0])),
            ]
        );
        assert_eq!(slots, Slots::from_map(slots.to_map()));
        assert_eq!(
            (slots.get(2), slots.contains(1), slots.len()),
            (None, true, 2)
        );
        assert_eq!(
            (slots.position(0), slots.position(12), slots.position(13)),
            (Some(101), Some(113), Some(0))
        );
        // No backends: the master alone.
        let empty = Slots::plain(master, Vec::new());
        assert_eq!(
            empty.to_map(),
            BTreeMap::from([(
                0,
                ServiceValue {
                    ids: [0; SVC_IDS],
                    ..master
                }
            )])
        );
        assert_eq!(empty, Slots::from_map(empty.to_map()));
    }

    #[test]
    fn anything_else_is_held_as_written() {
        // Another frontend's backend, a slot gap and a slot with flags: what
        // a half-applied or foreign state can hold.
        let mixed = BTreeMap::from([
            (1, backend([10, 0, 0, 1], 7)),
            (2, backend([10, 0, 0, 2], 8)),
        ]);
        let b = Backends::from_map(mixed.clone());
        assert!(matches!(b.0, BackendRepr::Explicit(_)));
        assert_eq!(b.to_map(), mixed);
        let one = |ids: &[u32], rev| {
            let mut v = slot_value(rev, [0; SVC_IDS]);
            v.ids[..ids.len()].copy_from_slice(ids);
            v
        };
        let full: Vec<u32> = (1..=11).collect();
        let mut flagged = one(&[4], 7);
        flagged.flags = 1;
        for map in [
            // No master; a slot after a master that is not full; another
            // rev-NAT id; flags on a slot.
            BTreeMap::from([(1, one(&[4], 7))]),
            BTreeMap::from([(0, one(&[4], 7)), (1, one(&[5], 7))]),
            BTreeMap::from([(0, one(&full, 7)), (1, one(&[5], 8))]),
            BTreeMap::from([(0, one(&full, 7)), (1, flagged)]),
        ] {
            let s = Slots::from_map(map.clone());
            assert!(matches!(s.0, SlotRepr::Explicit(_)), "{map:?}");
            assert_eq!(s.to_map(), map);
            assert!(map.keys().all(|&k| s.get(k) == map.get(&k).copied()));
            assert_eq!(s.len(), map.len());
        }
    }
}
