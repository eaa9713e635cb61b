//! The BPF maps as the reconciler sees them: a list of operations to apply and a
//! snapshot to restore from. [`pinned::PinnedMaps`] is the kernel; [`fake::FakeMaps`]
//! is an in-memory stand-in with the same failure modes for tests.
pub mod dump;
pub mod fake;
pub mod pinned;

use std::{collections::BTreeMap, fmt, io};

use weir_abi::{Backend4, RevNat4, Service4Key, Service4Value};

/// One write to one map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapOp {
    UpsertBackend(u32, Backend4),
    UpsertRevNat(u32, RevNat4),
    UpsertService(Service4Key, Service4Value),
    DeleteBackend(u32),
    DeleteRevNat(u32),
    DeleteService(Service4Key),
}

impl MapOp {
    pub const fn map(&self) -> MapName {
        match self {
            Self::UpsertBackend(..) | Self::DeleteBackend(_) => MapName::Backends,
            Self::UpsertRevNat(..) | Self::DeleteRevNat(_) => MapName::RevNat,
            Self::UpsertService(..) | Self::DeleteService(_) => MapName::Services,
        }
    }
}

/// The agent-written maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MapName {
    Services,
    Backends,
    RevNat,
}

impl MapName {
    pub const ALL: [Self; 3] = [Self::Services, Self::Backends, Self::RevNat];

    /// The pin name, which is also what users see in errors.
    pub const fn pin_name(self) -> &'static str {
        match self {
            Self::Services => weir_abi::MAP_SERVICES4,
            Self::Backends => weir_abi::MAP_BACKENDS4,
            Self::RevNat => weir_abi::MAP_REVNAT4,
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
}

impl Capacity {
    pub const fn of(&self, map: MapName) -> u32 {
        match map {
            MapName::Services => self.services,
            MapName::Backends => self.backends,
            MapName::RevNat => self.revnat,
        }
    }
}

/// Everything in the agent-written maps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub services: BTreeMap<Service4Key, Service4Value>,
    pub backends: BTreeMap<u32, Backend4>,
    pub revnat: BTreeMap<u32, RevNat4>,
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
    fn snapshot(&self) -> Result<Snapshot, MapError>;
    fn capacity(&self) -> Capacity;
}
