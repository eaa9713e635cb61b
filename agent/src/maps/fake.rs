//! In-memory maps with the kernel's capacity rule and injectable write failures,
//! plus a model of the socket hook's backend choice, for tests without a kernel.
use std::{collections::BTreeMap, io};

use weir_abi::{Backend, ServiceKey, ServiceValue, SvcLabel, pick};

use super::{Capacity, LbMaps, MapError, MapName, MapOp, Snapshot};

/// The datapath would fail the call with `ECONNREFUSED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused;

#[derive(Clone, Debug)]
pub struct FakeMaps {
    pub state: Snapshot,
    capacity: Capacity,
    /// Fail the write after this many more successful ones.
    fail_after: Option<usize>,
    /// Every operation applied, in order.
    pub log: Vec<MapOp>,
    /// The labels map, which the plans do not write.
    pub labels: BTreeMap<u32, SvcLabel>,
    /// Label writes fail with EIO while set.
    pub fail_labels: bool,
    /// Labels written or deleted, counted one by one.
    pub label_writes: usize,
}

impl FakeMaps {
    pub fn new(capacity: Capacity) -> Self {
        Self {
            state: Snapshot::default(),
            capacity,
            fail_after: None,
            log: Vec::new(),
            labels: BTreeMap::new(),
            fail_labels: false,
            label_writes: 0,
        }
    }

    /// Makes the write after `n` more successful ones fail with EIO.
    pub fn fail_after(&mut self, n: usize) {
        self.fail_after = Some(n);
    }

    /// What `connect()` to `key`'s frontend would reach with random number
    /// `roll`: `Ok(None)` when the frontend is unknown (no translation),
    /// `Err(Refused)` when the datapath refuses the connection. The pick is
    /// the programs' own (`weir_abi::pick`), over this snapshot.
    pub fn connect(&self, key: ServiceKey, roll: u32) -> Result<Option<Backend>, Refused> {
        let mut master_key = ServiceKey { slot: 0, ..key };
        let Some(master) = self.state.services.get(&master_key) else {
            return Ok(None);
        };
        let pick = pick::pick_backend(&self.state, &mut master_key, master, roll).ok_or(Refused)?;
        Ok(self.state.backends.get(&pick.backend_id).copied())
    }
}

impl pick::LbMapsView for Snapshot {
    fn service(&self, key: &ServiceKey) -> Option<ServiceValue> {
        self.services.get(key).copied()
    }

    fn backend(&self, id: u32) -> Option<Backend> {
        self.backends.get(&id).copied()
    }

    fn maglev(&self, rev_nat_id: u32, index: u32) -> Option<u32> {
        self.maglev.get(&rev_nat_id)?.get(index as usize).copied()
    }
}

impl FakeMaps {
    /// What a new flow from outside the node to `key`'s frontend would reach
    /// in the packet programs: they use the `SCOPE_EXTERNAL` entries when the
    /// `SCOPE_ALL` master has `SVC_F_LOCAL` (a missing local view drops, as
    /// a local view without endpoints does), the `SCOPE_ALL` ones otherwise.
    pub fn connect_from_outside(
        &self,
        key: ServiceKey,
        roll: u32,
    ) -> Result<Option<Backend>, Refused> {
        let all = ServiceKey {
            scope: weir_abi::SCOPE_ALL,
            ..key
        };
        match self.state.services.get(&ServiceKey { slot: 0, ..all }) {
            Some(m) if m.flags & weir_abi::SVC_F_LOCAL != 0 => {
                let external = ServiceKey {
                    scope: weir_abi::SCOPE_EXTERNAL,
                    ..key
                };
                match self.connect(external, roll)? {
                    None => Err(Refused),
                    found => Ok(found),
                }
            }
            _ => self.connect(all, roll),
        }
    }
}

impl FakeMaps {
    /// Whether the datapath would admit a new flow from `client` to `key`'s
    /// frontend as far as `loadBalancerSourceRanges` go: a master with
    /// `SVC_F_SRC_RANGES` needs a range of its rev-NAT id holding the client
    /// (what the LPM lookup of `(rev_nat_id, client)` finds).
    pub fn admits(&self, key: ServiceKey, client: std::net::IpAddr) -> bool {
        let Some(master) = self.state.services.get(&ServiceKey { slot: 0, ..key }) else {
            return true;
        };
        if master.flags & weir_abi::SVC_F_SRC_RANGES == 0 {
            return true;
        }
        self.state.src_ranges.iter().any(|r| {
            r.rev_nat_id() == master.rev_nat_id && r.cidr().is_some_and(|c| c.contains(client))
        })
    }
}

impl LbMaps for FakeMaps {
    fn apply(&mut self, op: &MapOp) -> Result<(), MapError> {
        if let Some(n) = self.fail_after.as_mut() {
            if *n == 0 {
                self.fail_after = None;
                return Err(MapError::Write {
                    map: op.map(),
                    source: io::Error::from_raw_os_error(libc::EIO),
                });
            }
            *n -= 1;
        }
        let cap = self.capacity.of(op.map());
        match op {
            MapOp::UpsertService(k, v) => {
                insert(&mut self.state.services, *k, *v, cap, MapName::Services)?
            }
            MapOp::UpsertBackend(k, v) => {
                insert(&mut self.state.backends, *k, *v, cap, MapName::Backends)?
            }
            MapOp::UpsertRevNat(k, v) => {
                insert(&mut self.state.revnat, *k, *v, cap, MapName::RevNat)?
            }
            MapOp::DeleteService(k) => drop(self.state.services.remove(k)),
            MapOp::DeleteBackend(k) => drop(self.state.backends.remove(k)),
            MapOp::DeleteRevNat(k) => drop(self.state.revnat.remove(k)),
            MapOp::UpsertSrcRange(r) => {
                let ranges = &mut self.state.src_ranges;
                if !ranges.contains(r) && ranges.len() >= cap as usize {
                    return Err(MapError::Full {
                        map: MapName::SrcRanges,
                        capacity: cap,
                    });
                }
                ranges.insert(*r);
            }
            MapOp::DeleteSrcRange(r) => drop(self.state.src_ranges.remove(r)),
            MapOp::SetMaglev(t) => set_maglev(&mut self.state.maglev, t, cap)?,
            MapOp::DeleteMaglev(id, chunks) => {
                delete_maglev(&mut self.state.maglev, *id, chunks.clone());
            }
        }
        self.log.push(op.clone());
        Ok(())
    }

    fn snapshot(&self) -> Result<Snapshot, MapError> {
        Ok(self.state.clone())
    }

    fn capacity(&self) -> Capacity {
        self.capacity
    }

    fn write_labels(&mut self, writes: &[(u32, Option<SvcLabel>)]) -> Result<(), MapError> {
        if self.fail_labels {
            return Err(MapError::Write {
                map: MapName::Labels,
                source: io::Error::from_raw_os_error(libc::EIO),
            });
        }
        let cap = self.capacity.of(MapName::Labels);
        self.label_writes += writes.len();
        for (id, label) in writes {
            match label {
                Some(l) => insert(&mut self.labels, *id, *l, cap, MapName::Labels)?,
                None => drop(self.labels.remove(id)),
            }
        }
        Ok(())
    }

    fn visit_labels(&self, f: &mut dyn FnMut(u32, SvcLabel)) -> Result<(), MapError> {
        for (id, l) in &self.labels {
            f(*id, *l);
        }
        Ok(())
    }
}

fn insert<K: Ord, V>(
    m: &mut BTreeMap<K, V>,
    k: K,
    v: V,
    capacity: u32,
    map: MapName,
) -> Result<(), MapError> {
    if !m.contains_key(&k) && m.len() >= capacity as usize {
        return Err(MapError::Full { map, capacity });
    }
    m.insert(k, v);
    Ok(())
}

type Tables = BTreeMap<u32, std::sync::Arc<[u32]>>;

/// As the kernel's chunk map: the table's chunks are overwritten, chunks
/// past its end stay, and the map counts chunks against its capacity.
fn set_maglev(
    tables: &mut Tables,
    t: &crate::planner::maglev::TableSpec,
    capacity: u32,
) -> Result<(), MapError> {
    let chunk = weir_abi::maglev::CHUNK as usize;
    let held = |t: &Tables| t.values().map(|v| v.len() / chunk).sum::<usize>();
    let mut table = tables
        .get(&t.rev_nat_id)
        .map(|v| v.to_vec())
        .unwrap_or_default();
    let new = t.padded();
    let before = table.len() / chunk;
    if table.len() < new.len() {
        table.resize(new.len(), 0);
    }
    let grows = table.len() / chunk - before;
    if held(tables) + grows > capacity as usize {
        return Err(MapError::Full {
            map: MapName::Maglev,
            capacity,
        });
    }
    table[..new.len()].copy_from_slice(&new);
    tables.insert(t.rev_nat_id, table.into());
    Ok(())
}

fn delete_maglev(tables: &mut Tables, id: u32, chunks: std::ops::Range<u32>) {
    let chunk = weir_abi::maglev::CHUNK as usize;
    let Some(t) = tables.get(&id) else { return };
    let mut t = t.to_vec();
    let (from, to) = (chunks.start as usize * chunk, chunks.end as usize * chunk);
    if to >= t.len() {
        t.truncate(from.min(t.len()));
    } else {
        t[from..to].fill(0);
    }
    if t.is_empty() {
        tables.remove(&id);
    } else {
        tables.insert(id, t.into());
    }
}
