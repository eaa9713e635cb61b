//! The kernel's Maglev tables: `WEIR_MAGLEV`, a hash from (rev-NAT id,
//! chunk) to [`weir_abi::maglev::CHUNK`] backend ids.
//!
//! A table is written in place, a batch of whole chunks, after the slots it
//! names and before the master that sizes it (see the ABI for why a reader
//! seeing two tables' chunks at once is harmless). Chunks past a shrunk
//! table's end and a removed table's chunks go once no master asks for them.
use std::{
    collections::BTreeMap,
    io,
    mem::size_of,
    ops::Range,
    os::fd::{AsFd as _, BorrowedFd},
    path::Path,
    sync::Arc,
};

use weir_abi::maglev::{CHUNK, MaglevChunk, MaglevKey};

use super::{MapError, MapName, batch::Batch, pinned};
use crate::planner::maglev::TableSpec;

pub struct MaglevTables {
    batch: Batch<MaglevKey, MaglevChunk>,
    /// In chunks.
    pub capacity: u32,
}

const NAME: MapName = MapName::Maglev;

impl MaglevTables {
    pub fn open(dir: &Path) -> Result<Self, MapError> {
        // Opened typed for the key and value size check only.
        let (_, capacity, fd) = pinned::open::<MaglevKey, MaglevChunk>(dir, NAME)?;
        Ok(Self {
            batch: Batch::new(fd),
            capacity,
        })
    }

    /// A map of `WEIR_MAGLEV`'s layout, pinned nowhere: for benches.
    pub fn create(capacity: u32) -> Result<Self, MapError> {
        use aya_obj::generated::{BPF_F_NO_PREALLOC, bpf_map_type::BPF_MAP_TYPE_HASH};
        let obj = aya_obj::Map::new_from_params(
            BPF_MAP_TYPE_HASH as u32,
            size_of::<MaglevKey>() as u32,
            size_of::<MaglevChunk>() as u32,
            capacity,
            BPF_F_NO_PREALLOC,
        );
        let data = aya::maps::MapData::create(obj, "weir_maglev", None)
            .map_err(|e| write(io::Error::other(e)))?;
        let fd = data.fd().as_fd().try_clone_to_owned().map_err(write)?;
        Ok(Self {
            batch: Batch::new(fd),
            capacity,
        })
    }

    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.batch.as_fd()
    }

    /// Writes `spec`'s table over whatever the map holds for its rev-NAT id.
    pub fn set(&mut self, spec: &TableSpec) -> Result<(), MapError> {
        self.write(spec.rev_nat_id, &spec.padded())
    }

    /// Writes a table built and padded ([`TableSpec::padded`]) already.
    pub fn write(&mut self, rev_nat_id: u32, padded: &[u32]) -> Result<(), MapError> {
        let (keys, values) = chunked(rev_nat_id, padded);
        self.batch.update(&keys, &values).map_err(|(_, e)| write(e))
    }

    /// Deletes chunks `chunks` of `rev_nat_id`'s table; absent ones count as
    /// deleted.
    pub fn remove(&mut self, rev_nat_id: u32, chunks: Range<u32>) -> Result<(), MapError> {
        let keys: Vec<MaglevKey> = chunks
            .map(|chunk| MaglevKey { rev_nat_id, chunk })
            .collect();
        self.batch.delete(&keys).map_err(|(_, e)| write(e))
    }

    /// Every table, read back from the kernel: see [`assemble`].
    pub fn read_all(&self) -> Result<BTreeMap<u32, Arc<[u32]>>, MapError> {
        Ok(assemble(self.batch.lookup_all().map_err(read)?))
    }
}

/// A padded table as the map's keys and chunks.
fn chunked(rev_nat_id: u32, table: &[u32]) -> (Vec<MaglevKey>, Vec<MaglevChunk>) {
    table
        .chunks_exact(CHUNK as usize)
        .zip(0..)
        .map(|(ids, chunk)| {
            let mut value = MaglevChunk::default();
            value.ids.copy_from_slice(ids);
            (MaglevKey { rev_nat_id, chunk }, value)
        })
        .unzip()
}

/// Tables from chunks: position → backend id over whole chunks, so a table
/// reads as [`TableSpec::padded`] does. A missing chunk reads as zeros (no
/// backend id is 0), so a torn table never looks whole.
pub fn assemble(entries: Vec<(MaglevKey, MaglevChunk)>) -> BTreeMap<u32, Arc<[u32]>> {
    let mut by_id: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for (k, v) in entries {
        let t = by_id.entry(k.rev_nat_id).or_default();
        let at = k.chunk as usize * CHUNK as usize;
        if t.len() < at + CHUNK as usize {
            t.resize(at + CHUNK as usize, 0);
        }
        t[at..at + CHUNK as usize].copy_from_slice(&v.ids);
    }
    by_id.into_iter().map(|(id, t)| (id, t.into())).collect()
}

const fn read(source: io::Error) -> MapError {
    MapError::Read { map: NAME, source }
}

const fn write(source: io::Error) -> MapError {
    MapError::Write { map: NAME, source }
}
