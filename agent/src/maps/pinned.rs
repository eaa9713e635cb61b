//! The kernel's maps, opened from their pins.
use std::{io, path::Path};

use aya::maps::{HashMap, LpmTrie, Map, MapData, MapError as AyaMapError, lpm_trie::Key as LpmKey};
use weir_abi::{Backend, RevNat, ServiceKey, ServiceValue, SrcRangeKey};

use super::{Capacity, LbMaps, MapError, MapName, MapOp, Snapshot, SrcRange};

pub struct PinnedMaps {
    services: HashMap<MapData, ServiceKey, ServiceValue>,
    backends: HashMap<MapData, u32, Backend>,
    revnat: HashMap<MapData, u32, RevNat>,
    src_ranges: LpmTrie<MapData, SrcRangeKey, u8>,
    capacity: Capacity,
}

impl PinnedMaps {
    /// Opens the maps pinned in `dir` (see [`crate::datapath::pins`]).
    pub fn open(dir: &Path) -> Result<Self, MapError> {
        let (services, s) = open(dir, MapName::Services)?;
        let (backends, b) = open(dir, MapName::Backends)?;
        let (revnat, r) = open(dir, MapName::RevNat)?;
        let (src_data, sr) = open_data(dir, MapName::SrcRanges)?;
        let src_ranges = LpmTrie::try_from(Map::LpmTrie(src_data)).map_err(|e| MapError::Read {
            map: MapName::SrcRanges,
            source: to_io(e),
        })?;
        Ok(Self {
            services,
            backends,
            revnat,
            src_ranges,
            capacity: Capacity {
                services: s,
                backends: b,
                revnat: r,
                src_ranges: sr,
            },
        })
    }
}

fn open<K: aya::Pod, V: aya::Pod>(
    dir: &Path,
    name: MapName,
) -> Result<(HashMap<MapData, K, V>, u32), MapError> {
    let read = |source: AyaMapError| MapError::Read {
        map: name,
        source: to_io(source),
    };
    let (data, capacity) = open_data(dir, name)?;
    let map = Map::from_map_data(data).map_err(read)?;
    Ok((HashMap::try_from(map).map_err(read)?, capacity))
}

fn open_data(dir: &Path, name: MapName) -> Result<(MapData, u32), MapError> {
    let read = |source: AyaMapError| MapError::Read {
        map: name,
        source: to_io(source),
    };
    let data = MapData::from_pin(dir.join(name.pin_name())).map_err(read)?;
    let capacity = data.info().map_err(read)?.max_entries();
    Ok((data, capacity))
}

impl LbMaps for PinnedMaps {
    fn apply(&mut self, op: &MapOp) -> Result<(), MapError> {
        let res = match op {
            MapOp::UpsertService(k, v) => self.services.insert(k, v, 0),
            MapOp::UpsertBackend(k, v) => self.backends.insert(k, v, 0),
            MapOp::UpsertRevNat(k, v) => self.revnat.insert(k, v, 0),
            MapOp::DeleteService(k) => absent_ok(self.services.remove(k)),
            MapOp::DeleteBackend(k) => absent_ok(self.backends.remove(k)),
            MapOp::DeleteRevNat(k) => absent_ok(self.revnat.remove(k)),
            MapOp::UpsertSrcRange(r) => self.src_ranges.insert(&lpm_key(r), 1u8, 0),
            MapOp::DeleteSrcRange(r) => absent_ok(self.src_ranges.remove(&lpm_key(r))),
        };
        res.map_err(|e| {
            let map = op.map();
            let source = to_io(e);
            // A full hash map refuses new keys with E2BIG, a full LPM trie
            // with ENOSPC.
            if matches!(source.raw_os_error(), Some(libc::E2BIG | libc::ENOSPC)) {
                MapError::Full {
                    map,
                    capacity: self.capacity.of(map),
                }
            } else {
                MapError::Write { map, source }
            }
        })
    }

    fn snapshot(&self) -> Result<Snapshot, MapError> {
        Ok(Snapshot {
            services: collect(&self.services, MapName::Services)?,
            backends: collect(&self.backends, MapName::Backends)?,
            revnat: collect(&self.revnat, MapName::RevNat)?,
            src_ranges: self
                .src_ranges
                .iter()
                .map(|r| {
                    r.map(|(k, _)| SrcRange {
                        prefix_len: k.prefix_len(),
                        key: k.data(),
                    })
                    .map_err(|e| MapError::Read {
                        map: MapName::SrcRanges,
                        source: to_io(e),
                    })
                })
                .collect::<Result<_, _>>()?,
        })
    }

    fn capacity(&self) -> Capacity {
        self.capacity
    }
}

fn collect<K: aya::Pod + Ord, V: aya::Pod>(
    m: &HashMap<MapData, K, V>,
    name: MapName,
) -> Result<std::collections::BTreeMap<K, V>, MapError> {
    m.iter()
        .map(|r| {
            r.map_err(|e| MapError::Read {
                map: name,
                source: to_io(e),
            })
        })
        .collect()
}

const fn lpm_key(r: &SrcRange) -> LpmKey<SrcRangeKey> {
    LpmKey::new(r.prefix_len, r.key)
}

fn absent_ok(r: Result<(), AyaMapError>) -> Result<(), AyaMapError> {
    match r {
        Err(AyaMapError::KeyNotFound | AyaMapError::ElementNotFound) => Ok(()),
        Err(AyaMapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {
            Ok(())
        }
        other => other,
    }
}

fn to_io(e: AyaMapError) -> io::Error {
    match e {
        AyaMapError::SyscallError(s) => s.io_error,
        AyaMapError::IoError(e) => e,
        other => io::Error::other(other),
    }
}
