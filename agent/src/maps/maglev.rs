//! The kernel's Maglev tables: `WEIR_MAGLEV`, a hash of maps from rev-NAT id
//! to an array of backend ids.
//!
//! A table is never edited where the programs read it: each write builds a
//! new array, fills it with one batch, and swaps it in with one update of
//! the outer map, so a packet sees the old table or the new one. The old
//! array is freed by the kernel once no program holds it.
use std::{
    collections::BTreeMap,
    io,
    os::fd::{AsFd as _, OwnedFd},
    path::Path,
    sync::Arc,
};

use aya::maps::{HashOfMaps, Map, MapData, MapError as AyaMapError};
use aya_obj::generated::{BPF_F_INNER_MAP, bpf_map_type::BPF_MAP_TYPE_ARRAY};

use super::{
    MapError, MapName,
    batch::Batch,
    pinned::{absent_ok, to_io},
};
use crate::planner::maglev::TableSpec;

pub struct MaglevTables {
    outer: HashOfMaps<MapData, u32, MapData>,
    pub capacity: u32,
}

const NAME: MapName = MapName::Maglev;

impl MaglevTables {
    pub fn open(dir: &Path) -> Result<Self, MapError> {
        let data = MapData::from_pin(dir.join(NAME.pin_name())).map_err(read)?;
        let capacity = data.info().map_err(read)?.max_entries();
        let outer = HashOfMaps::try_from(Map::HashOfMaps(data)).map_err(read)?;
        Ok(Self { outer, capacity })
    }

    /// Builds `spec`'s table and swaps it in.
    pub fn set(&mut self, spec: &TableSpec) -> Result<(), MapError> {
        let inner = new_array(&spec.build())?;
        self.outer
            .insert(spec.rev_nat_id, &inner, 0)
            .map_err(|e| write(to_io(e)))
    }

    pub fn remove(&mut self, rev_nat_id: u32) -> Result<(), MapError> {
        absent_ok(self.outer.remove(&rev_nat_id)).map_err(|e| write(to_io(e)))
    }

    /// Every table, read back from the kernel.
    pub fn read_all(&self) -> Result<BTreeMap<u32, Arc<[u32]>>, MapError> {
        let mut out = BTreeMap::new();
        for key in self.outer.keys() {
            let id = key.map_err(read)?;
            let inner = match self.outer.get(&id, 0) {
                Ok(m) => m,
                // Removed since the walk listed it.
                Err(AyaMapError::KeyNotFound) => continue,
                Err(e) => return Err(read(e)),
            };
            let mut table = Batch::<u32, u32>::new(dup(&inner)?)
                .lookup_all()
                .map_err(|source| MapError::Read { map: NAME, source })?;
            table.sort_unstable_by_key(|(k, _)| *k);
            out.insert(id, table.into_iter().map(|(_, v)| v).collect());
        }
        Ok(out)
    }
}

/// A new inner array holding `table`, filled with one batch; referenced by
/// nothing yet.
pub fn new_array(table: &[u32]) -> Result<MapData, MapError> {
    let size = u32::try_from(table.len()).map_err(|_| write(io::Error::other("too large")))?;
    let obj = aya_obj::Map::new_from_params(BPF_MAP_TYPE_ARRAY as u32, 4, 4, size, BPF_F_INNER_MAP);
    let inner = MapData::create(obj, "weir_maglev", None).map_err(|e| write(to_io(e)))?;
    let keys: Vec<u32> = (0..size).collect();
    Batch::<u32, u32>::new(dup(&inner)?)
        .update(&keys, table)
        .map_err(|(_, e)| write(e))?;
    Ok(inner)
}

fn dup(m: &MapData) -> Result<OwnedFd, MapError> {
    m.fd()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| MapError::Read { map: NAME, source })
}

fn read(e: AyaMapError) -> MapError {
    MapError::Read {
        map: NAME,
        source: to_io(e),
    }
}

const fn write(source: io::Error) -> MapError {
    MapError::Write { map: NAME, source }
}
