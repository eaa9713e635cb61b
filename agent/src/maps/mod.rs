//! The BPF maps as the reconciler sees them: a list of operations to apply and a
//! snapshot to restore from. [`pinned::PinnedMaps`] is the kernel; [`fake::FakeMaps`]
//! is an in-memory stand-in with the same failure modes for tests.
pub mod array;
pub mod batch;
pub mod dump;
pub mod fake;
pub mod labels;
pub mod maglev;
pub mod pinned;

use std::net::IpAddr;
use std::{collections::BTreeMap, fmt, io};

use weir_abi::{Addr, Backend, RevNat, ServiceKey, ServiceValue, SrcRangeKey, SvcLabel};

use crate::{model::Cidr, planner::maglev::TableSpec};

/// One write to one map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MapOp {
    UpsertBackend(u32, Backend),
    UpsertRevNat(u32, RevNat),
    UpsertService(ServiceKey, ServiceValue),
    DeleteBackend(u32),
    DeleteRevNat(u32),
    DeleteService(ServiceKey),
    UpsertSrcRange(SrcRange),
    DeleteSrcRange(SrcRange),
    /// Builds the table and writes it over its rev-NAT id's chunks.
    SetMaglev(std::sync::Arc<TableSpec>),
    /// Removes chunks of a rev-NAT id's table: all of them, or those past
    /// the end of a table that shrank.
    DeleteMaglev(u32, std::ops::Range<u32>),
}

impl MapOp {
    pub const fn map(&self) -> MapName {
        match self {
            Self::UpsertBackend(..) | Self::DeleteBackend(_) => MapName::Backends,
            Self::UpsertRevNat(..) | Self::DeleteRevNat(_) => MapName::RevNat,
            Self::UpsertService(..) | Self::DeleteService(_) => MapName::Services,
            Self::UpsertSrcRange(_) | Self::DeleteSrcRange(_) => MapName::SrcRanges,
            Self::SetMaglev(_) | Self::DeleteMaglev(..) => MapName::Maglev,
        }
    }
}

/// The agent-written maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MapName {
    Services,
    Backends,
    RevNat,
    SrcRanges,
    Maglev,
    /// Not planned: the reconciler writes labels behind the plans (see
    /// `reconciler::labels`), so it is not in [`Self::ALL`].
    Labels,
}

impl MapName {
    /// The maps the planner writes and the reconciler counts.
    pub const ALL: [Self; 5] = [
        Self::Services,
        Self::Backends,
        Self::RevNat,
        Self::SrcRanges,
        Self::Maglev,
    ];

    /// The pin name, which is also what users see in errors.
    pub const fn pin_name(self) -> &'static str {
        match self {
            Self::Services => weir_abi::MAP_SERVICES,
            Self::Backends => weir_abi::MAP_BACKENDS,
            Self::RevNat => weir_abi::MAP_REVNAT,
            Self::SrcRanges => weir_abi::MAP_SRC_RANGES,
            Self::Maglev => weir_abi::MAP_MAGLEV,
            Self::Labels => weir_abi::MAP_SVC_LABELS,
        }
    }

    /// What lets more entries in, for users who hit the capacity.
    pub const fn remedy(self) -> &'static str {
        match self {
            Self::Services | Self::RevNat | Self::Labels => "raise --max-services",
            Self::Backends => "raise --max-backends",
            Self::SrcRanges => "fewer loadBalancerSourceRanges across Services",
            Self::Maglev => "raise --max-maglev-tables",
        }
    }
}

/// Entries in each planned map ([`MapName::ALL`]). An array, not a map
/// keyed by name: the reconciler counts every plan's entries, and four
/// B-tree maps a Service were allocated for it at a cold start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapCounts([u64; MapName::ALL.len()]);

impl MapCounts {
    /// Labels are not planned, so never counted: 0.
    pub fn get(&self, map: MapName) -> u64 {
        map.planned().map_or(0, |i| self.0[i])
    }

    pub fn add(&mut self, map: MapName, n: u64) {
        if let Some(i) = map.planned() {
            self.0[i] += n;
        }
    }

    pub fn add_all(&mut self, other: &Self) {
        self.adjust(other, &Self::default());
    }

    /// `self + add - sub`, per map, never below 0.
    pub fn adjust(&mut self, add: &Self, sub: &Self) {
        for ((u, a), s) in self.0.iter_mut().zip(add.0).zip(sub.0) {
            *u = (*u + a).saturating_sub(s);
        }
    }

    /// Each map with its count, 0 included, in [`MapName::ALL`]'s order.
    pub fn iter(&self) -> impl Iterator<Item = (MapName, u64)> {
        MapName::ALL.into_iter().zip(self.0)
    }
}

impl MapName {
    /// The index in [`Self::ALL`].
    const fn planned(self) -> Option<usize> {
        match self {
            Self::Services => Some(0),
            Self::Backends => Some(1),
            Self::RevNat => Some(2),
            Self::SrcRanges => Some(3),
            Self::Maglev => Some(4),
            Self::Labels => None,
        }
    }
}

impl fmt::Display for MapName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.pin_name())
    }
}

/// Maximum entries of each agent-written map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    pub services: u32,
    pub backends: u32,
    pub revnat: u32,
    pub src_ranges: u32,
    /// Maglev table chunks ([`weir_abi::maglev::CHUNK`] positions each).
    pub maglev: u32,
}

impl Capacity {
    pub const fn of(&self, map: MapName) -> u32 {
        match map {
            MapName::Services => self.services,
            MapName::Backends => self.backends,
            // One label per rev-NAT id, in a map sized alike.
            MapName::RevNat | MapName::Labels => self.revnat,
            MapName::SrcRanges => self.src_ranges,
            MapName::Maglev => self.maglev,
        }
    }
}

/// Everything in the agent-written maps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub services: BTreeMap<ServiceKey, ServiceValue>,
    pub backends: BTreeMap<u32, Backend>,
    pub revnat: BTreeMap<u32, RevNat>,
    pub src_ranges: std::collections::BTreeSet<SrcRange>,
    /// Maglev tables by rev-NAT id: position → backend id over whole chunks
    /// (see [`maglev::assemble`]).
    pub maglev: BTreeMap<u32, std::sync::Arc<[u32]>>,
}

impl Snapshot {
    /// The backend ids frontend `key` (any slot) names, in position order:
    /// what its master counts, read from the master and its slots as the
    /// datapath reads them. 0 where a slot is missing.
    pub fn positions(&self, key: ServiceKey) -> Vec<u32> {
        let master_key = ServiceKey { slot: 0, ..key };
        let Some(master) = self.services.get(&master_key) else {
            return Vec::new();
        };
        let used = usize::from(master.count) + usize::from(master.qcount);
        (0..used)
            .map(|p| {
                let Some((slot, index)) = weir_abi::position_slot(p) else {
                    return 0;
                };
                self.services
                    .get(&ServiceKey { slot, ..master_key })
                    .map_or(0, |v| v.ids[index])
            })
            .collect()
    }
}

/// One entry of the source-range trie: a prefix of `(rev_nat_id, address)`.
/// The value is always 1; presence is what the datapath checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SrcRange {
    /// Bits of `key` that count, from its first byte: 32 for the rev-NAT id
    /// plus the prefix within the 128-bit (IPv4-mapped) address.
    pub prefix_len: u32,
    pub key: SrcRangeKey,
}

impl SrcRange {
    pub fn new(rev_nat_id: u32, cidr: Cidr) -> Self {
        // An IPv4 prefix sits after the 96 bits of `::ffff:`.
        let in_addr = match cidr.addr() {
            IpAddr::V4(_) => 96 + u32::from(cidr.prefix()),
            IpAddr::V6(_) => u32::from(cidr.prefix()),
        };
        Self {
            prefix_len: 32 + in_addr,
            key: SrcRangeKey {
                // Network order: the trie matches bytes from the first.
                rev_nat_id: rev_nat_id.to_be(),
                addr: Addr::from(cidr.addr()),
            },
        }
    }

    pub const fn rev_nat_id(&self) -> u32 {
        u32::from_be(self.key.rev_nat_id)
    }

    /// The range, or `None` for an entry no agent writes (a prefix that ends
    /// inside the rev-NAT id or inside `::ffff:` of an IPv4 address).
    pub fn cidr(&self) -> Option<Cidr> {
        let addr = IpAddr::from(self.key.addr);
        let bits = self.prefix_len.checked_sub(32)?;
        let prefix = match addr {
            IpAddr::V4(_) => bits.checked_sub(96)?,
            IpAddr::V6(_) => bits,
        };
        let c = Cidr::new(addr, u8::try_from(prefix).ok()?)?;
        (Self::new(self.rev_nat_id(), c) == *self).then_some(c)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MapError {
    #[error("map {map} is full ({capacity} entries)")]
    Full { map: MapName, capacity: u32 },
    #[error("writing map {map} failed")]
    Write {
        map: MapName,
        #[source]
        source: io::Error,
    },
    #[error("reading map {map} failed")]
    Read {
        map: MapName,
        #[source]
        source: io::Error,
    },
}

/// Where the reconciler's operations land.
pub trait LbMaps {
    /// Applies one operation. Deleting an absent key succeeds.
    fn apply(&mut self, op: &MapOp) -> Result<(), MapError>;
    /// Applies `ops` in order, as [`Self::apply`] one by one would (the
    /// kernel maps batch runs of them). On failure: how many were applied.
    fn apply_all(&mut self, ops: &[MapOp]) -> Result<(), (usize, MapError)> {
        for (i, op) in ops.iter().enumerate() {
            self.apply(op).map_err(|e| (i, e))?;
        }
        Ok(())
    }
    fn snapshot(&self) -> Result<Snapshot, MapError>;
    fn capacity(&self) -> Capacity;
    /// Writes labels in order: `Some` upserts, `None` deletes (an absent
    /// one counts as deleted).
    fn write_labels(&mut self, writes: &[(u32, Option<SvcLabel>)]) -> Result<(), MapError>;
    /// Calls `f` with every label, unordered, without holding them all.
    fn visit_labels(&self, f: &mut dyn FnMut(u32, SvcLabel)) -> Result<(), MapError>;
    /// A sync of many Services starts (`true`) or ends. The kernel maps keep
    /// the backends array mapped in between (see [`array::MmapArray::hold`]).
    fn bulk(&mut self, _on: bool) {}
}

#[cfg(test)]
mod addr_tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn v4_is_mapped_and_round_trips() {
        let v4 = IpAddr::V4(Ipv4Addr::new(10, 96, 0, 1));
        let a = Addr::from(v4);
        assert!(a.is_v4());
        assert_eq!(a.v4(), u32::from_ne_bytes([10, 96, 0, 1]));
        assert_eq!(IpAddr::from(a), v4);
        let v6: IpAddr = "fd00::1".parse().unwrap();
        assert!(!Addr::from(v6).is_v4());
        assert_eq!(IpAddr::from(Addr::from(v6)), v6);
    }

    #[test]
    fn src_range_prefix_counts_the_id_and_the_v4_mapping() {
        let v4 = Cidr::parse("10.0.0.0/8").unwrap();
        let r = SrcRange::new(7, v4);
        assert_eq!(r.prefix_len, 32 + 96 + 8);
        assert_eq!(r.key.rev_nat_id.to_ne_bytes(), [0, 0, 0, 7]);
        assert_eq!((r.rev_nat_id(), r.cidr()), (7, Some(v4)));
        let v6 = Cidr::parse("2001:db8::/32").unwrap();
        let r = SrcRange::new(7, v6);
        assert_eq!(r.prefix_len, 64);
        assert_eq!(r.cidr(), Some(v6));
        // A prefix that stops inside `::ffff:` is nothing the agent wrote.
        assert_eq!(
            SrcRange {
                prefix_len: 40,
                ..r
            }
            .cidr(),
            None
        );
    }
}
