//! The kernel's maps, opened from their pins.
use std::{
    io,
    os::fd::{AsFd as _, OwnedFd},
    path::Path,
};

use aya::maps::{HashMap, LpmTrie, Map, MapData, MapError as AyaMapError, lpm_trie::Key as LpmKey};
use weir_abi::{Backend, RevNat, ServiceKey, ServiceValue, SrcRangeKey, SvcLabel};

use crate::parallel::both;

use super::{
    Capacity, LbMaps, MapError, MapName, MapOp, Snapshot, SrcRange, array::MmapArray, batch::Batch,
    maglev::MaglevTables,
};

pub struct PinnedMaps {
    services: HashMap<MapData, ServiceKey, ServiceValue>,
    backends: MmapArray<Backend>,
    revnat: HashMap<MapData, u32, RevNat>,
    src_ranges: LpmTrie<MapData, SrcRangeKey, u8>,
    maglev: MaglevTables,
    /// `None` under pins an agent from before labels made: `inspect` still
    /// reads them; an agent always has it (the loader creates it).
    labels: Option<LabelMap>,
    batches: Batches,
    /// The kernel takes batch commands (5.6 and later); cleared at the
    /// first refusal, after which runs are written one element at a time.
    batched: bool,
    capacity: Capacity,
}

struct Batches {
    services: Batch<ServiceKey, ServiceValue>,
    revnat: Batch<u32, RevNat>,
}

struct LabelMap {
    map: HashMap<MapData, u32, SvcLabel>,
    batch: Batch<u32, SvcLabel>,
}

/// Runs shorter than this are written element by element: a batch needs its
/// keys and values copied into arrays first.
const MIN_BATCH: usize = 3;

/// Consecutive operations of one kind form a run that one batch writes. The
/// LPM trie has no batch commands, so its operations are never grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Run {
    UpsertService,
    DeleteService,
    UpsertBackend,
    DeleteBackend,
    UpsertRevNat,
    DeleteRevNat,
    Single,
}

/// `ops` cut into runs of one kind, in order; each is one batch.
fn runs(ops: &[MapOp]) -> Vec<(Run, std::ops::Range<usize>)> {
    let mut out: Vec<(Run, std::ops::Range<usize>)> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let run = run_of(op);
        match out.last_mut() {
            Some((last, range)) if *last == run && run != Run::Single => range.end = i + 1,
            _ => out.push((run, i..i + 1)),
        }
    }
    out
}

const fn run_of(op: &MapOp) -> Run {
    match op {
        MapOp::UpsertService(..) => Run::UpsertService,
        MapOp::DeleteService(_) => Run::DeleteService,
        MapOp::UpsertBackend(..) => Run::UpsertBackend,
        MapOp::DeleteBackend(_) => Run::DeleteBackend,
        MapOp::UpsertRevNat(..) => Run::UpsertRevNat,
        MapOp::DeleteRevNat(_) => Run::DeleteRevNat,
        MapOp::UpsertSrcRange(_)
        | MapOp::DeleteSrcRange(_)
        | MapOp::SetMaglev(_)
        | MapOp::DeleteMaglev(..) => Run::Single,
    }
}

impl PinnedMaps {
    /// Opens the maps pinned in `dir` (see [`crate::datapath::pins`]).
    pub fn open(dir: &Path) -> Result<Self, MapError> {
        let (services, s, services_fd) = open(dir, MapName::Services)?;
        let backends = MmapArray::open(&dir.join(MapName::Backends.pin_name())).map_err(|e| {
            MapError::Read {
                map: MapName::Backends,
                source: to_io(e),
            }
        })?;
        // Id 0 is never handed out, and the array has an element for it.
        let b = backends.max_entries().saturating_sub(1);
        let (revnat, r, revnat_fd) = open(dir, MapName::RevNat)?;
        let (src_data, sr) = open_data(dir, MapName::SrcRanges)?;
        let src_ranges = LpmTrie::try_from(Map::LpmTrie(src_data)).map_err(|e| MapError::Read {
            map: MapName::SrcRanges,
            source: to_io(e),
        })?;
        let maglev = MaglevTables::open(dir)?;
        let m = maglev.capacity;
        let labels = dir
            .join(MapName::Labels.pin_name())
            .exists()
            .then(|| open(dir, MapName::Labels))
            .transpose()?
            .map(|(map, _, fd)| LabelMap {
                map,
                batch: Batch::new(fd),
            });
        Ok(Self {
            services,
            backends,
            revnat,
            src_ranges,
            maglev,
            labels,
            batches: Batches {
                services: Batch::new(services_fd),
                revnat: Batch::new(revnat_fd),
            },
            batched: true,
            capacity: Capacity {
                services: s,
                backends: b,
                revnat: r,
                src_ranges: sr,
                maglev: m,
            },
        })
    }
}

pub(super) type Opened<K, V> = (HashMap<MapData, K, V>, u32, OwnedFd);

/// The typed map, its capacity, and a second fd for the batch commands
/// (aya's typed maps do not lend theirs). `HashMap::try_from` checks the
/// key and value sizes, which the batches rely on.
pub(super) fn open<K: aya::Pod, V: aya::Pod>(
    dir: &Path,
    name: MapName,
) -> Result<Opened<K, V>, MapError> {
    let read = |source: AyaMapError| MapError::Read {
        map: name,
        source: to_io(source),
    };
    let (data, capacity) = open_data(dir, name)?;
    let fd = data
        .fd()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|source| MapError::Read { map: name, source })?;
    let map = Map::from_map_data(data).map_err(read)?;
    Ok((HashMap::try_from(map).map_err(read)?, capacity, fd))
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
            MapOp::UpsertBackend(k, v) => return self.write_backends(&[(*k, *v)]),
            MapOp::UpsertRevNat(k, v) => self.revnat.insert(k, v, 0),
            MapOp::DeleteService(k) => absent_ok(self.services.remove(k)),
            MapOp::DeleteBackend(k) => return self.write_backends(&[(*k, Backend::default())]),
            MapOp::DeleteRevNat(k) => absent_ok(self.revnat.remove(k)),
            MapOp::UpsertSrcRange(r) => self.src_ranges.insert(&lpm_key(r), 1u8, 0),
            MapOp::DeleteSrcRange(r) => absent_ok(self.src_ranges.remove(&lpm_key(r))),
            MapOp::SetMaglev(t) => {
                return self.maglev.set(t).map_err(|e| match e {
                    MapError::Write { map, source } => self.write_error(map, source),
                    other => other,
                });
            }
            MapOp::DeleteMaglev(id, chunks) => return self.maglev.remove(*id, chunks.clone()),
        };
        res.map_err(|e| self.write_error(op.map(), to_io(e)))
    }

    fn apply_all(&mut self, ops: &[MapOp]) -> Result<(), (usize, MapError)> {
        for (run, range) in runs(ops) {
            // Backends are an array with its own way of writing runs.
            let array = matches!(run, Run::UpsertBackend | Run::DeleteBackend);
            if !array && (run == Run::Single || range.len() < MIN_BATCH || !self.batched) {
                for (j, op) in ops.iter().enumerate().take(range.end).skip(range.start) {
                    self.apply(op).map_err(|e| (j, e))?;
                }
            } else {
                let start = range.start;
                self.apply_run(run, &ops[range])
                    .map_err(|(n, e)| (start + n, e))?;
            }
        }
        Ok(())
    }

    fn snapshot(&self) -> Result<Snapshot, MapError> {
        // At 100k Services each of the two holds a million entries, and the
        // kernel's walk of one takes half a second of CPU: they are read at
        // once, and each thread orders what it read.
        let (services, backends) = both(
            || self.service_entries().map(|v| v.into_iter().collect()),
            || self.backend_entries().map(|v| v.into_iter().collect()),
        );
        Ok(Snapshot {
            services: services?,
            backends: backends?,
            revnat: self
                .read_all(&self.batches.revnat, &self.revnat, MapName::RevNat)?
                .into_iter()
                .collect(),
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
            maglev: self.maglev.read_all()?,
        })
    }

    fn capacity(&self) -> Capacity {
        self.capacity
    }

    fn write_labels(&mut self, writes: &[(u32, Option<SvcLabel>)]) -> Result<(), MapError> {
        let capacity = self.capacity.revnat;
        let err = |source: io::Error| write_error(MapName::Labels, capacity, source);
        // Order only matters within one id, and each id is written once.
        let (mut keys, mut values, mut deletes) = (Vec::new(), Vec::new(), Vec::new());
        for &(id, label) in writes {
            match label {
                Some(l) => {
                    keys.push(id);
                    values.push(l);
                }
                None => deletes.push(id),
            }
        }
        let Some(labels) = self.labels.as_mut() else {
            return Err(err(io::Error::from_raw_os_error(libc::ENOENT)));
        };
        if self.batched {
            labels
                .batch
                .update(&keys, &values)
                .map_err(|(_, e)| err(e))?;
            return labels.batch.delete(&deletes).map_err(|(_, e)| err(e));
        }
        for (k, v) in keys.iter().zip(&values) {
            labels.map.insert(k, v, 0).map_err(|e| err(to_io(e)))?;
        }
        for k in &deletes {
            absent_ok(labels.map.remove(k)).map_err(|e| err(to_io(e)))?;
        }
        Ok(())
    }

    fn bulk(&mut self, on: bool) {
        self.backends.hold(on);
    }

    fn visit_labels(&self, f: &mut dyn FnMut(u32, SvcLabel)) -> Result<(), MapError> {
        let read = |source| MapError::Read {
            map: MapName::Labels,
            source,
        };
        let Some(labels) = &self.labels else {
            return Ok(());
        };
        if self.batched {
            for entry in labels.batch.iter() {
                let (id, l) = entry.map_err(read)?;
                f(id, l);
            }
        } else {
            for entry in labels.map.iter() {
                let (id, l) = entry.map_err(|e| read(to_io(e)))?;
                f(id, l);
            }
        }
        Ok(())
    }
}

impl PinnedMaps {
    fn write_error(&self, map: MapName, source: io::Error) -> MapError {
        write_error(map, self.capacity.of(map), source)
    }

    /// Writes backends (a free id is all zeros) in order.
    fn write_backends(&mut self, items: &[(u32, Backend)]) -> Result<(), MapError> {
        self.write_backend_run(items).map_err(|(_, e)| e)
    }

    fn write_backend_run(&mut self, items: &[(u32, Backend)]) -> Result<(), (usize, MapError)> {
        let capacity = self.capacity.backends;
        self.backends
            .write(items)
            .map_err(|(n, e)| (n, write_error(MapName::Backends, capacity, e)))
    }

    /// Writes one run of operations of the same kind with one batch.
    fn apply_run(&mut self, run: Run, ops: &[MapOp]) -> Result<(), (usize, MapError)> {
        match run {
            Run::UpsertBackend | Run::DeleteBackend => {
                let items: Vec<(u32, Backend)> = ops
                    .iter()
                    .map(|op| match *op {
                        MapOp::UpsertBackend(k, v) => (k, v),
                        MapOp::DeleteBackend(k) => (k, Backend::default()),
                        _ => unreachable!("a run holds one kind"),
                    })
                    .collect();
                return self.write_backend_run(&items);
            }
            _ => {}
        }
        let b = &self.batches;
        let r = match run {
            Run::UpsertService => upsert(&b.services, ops, |op| match *op {
                MapOp::UpsertService(k, v) => (k, v),
                _ => unreachable!("a run holds one kind"),
            }),
            Run::UpsertRevNat => upsert(&b.revnat, ops, |op| match *op {
                MapOp::UpsertRevNat(k, v) => (k, v),
                _ => unreachable!("a run holds one kind"),
            }),
            Run::DeleteService => b.services.delete(&keys(ops, |op| match *op {
                MapOp::DeleteService(k) => k,
                _ => unreachable!("a run holds one kind"),
            })),
            Run::DeleteRevNat => b.revnat.delete(&keys(ops, |op| match *op {
                MapOp::DeleteRevNat(k) => k,
                _ => unreachable!("a run holds one kind"),
            })),
            Run::Single | Run::UpsertBackend | Run::DeleteBackend => {
                unreachable!("single operations and backends are not batched")
            }
        };
        match r {
            Ok(()) => Ok(()),
            // Before 5.6 the kernel knows no batch command: write this run
            // and every later one element by element.
            Err((0, e)) if e.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(
                    "the kernel refuses BPF map batch writes ({e}); writing one entry at a time"
                );
                self.batched = false;
                self.apply_all(ops)
            }
            Err((n, e)) => Err((n, self.write_error(ops[n].map(), e))),
        }
    }

    /// Every entry of the services map, unordered.
    pub fn service_entries(&self) -> Result<Vec<(ServiceKey, ServiceValue)>, MapError> {
        self.read_all(&self.batches.services, &self.services, MapName::Services)
    }

    /// Every label, unordered; none under pins made before labels.
    pub fn label_entries(&self) -> Result<Vec<(u32, SvcLabel)>, MapError> {
        match &self.labels {
            Some(l) => self.read_all(&l.batch, &l.map, MapName::Labels),
            None => Ok(Vec::new()),
        }
    }

    /// Every backend, by id.
    pub fn backend_entries(&self) -> Result<Vec<(u32, Backend)>, MapError> {
        self.backends.entries().map_err(|source| MapError::Read {
            map: MapName::Backends,
            source,
        })
    }

    /// The backends array as it is, indexed by id; a free id is all zeros.
    pub fn backend_table(&self) -> Result<Vec<Backend>, MapError> {
        self.backends.elements().map_err(|source| MapError::Read {
            map: MapName::Backends,
            source,
        })
    }

    /// Every entry of a hash map: with batch lookups when the kernel has
    /// them, else key by key.
    fn read_all<K: aya::Pod, V: aya::Pod>(
        &self,
        batch: &Batch<K, V>,
        m: &HashMap<MapData, K, V>,
        name: MapName,
    ) -> Result<Vec<(K, V)>, MapError> {
        if self.batched {
            match batch.lookup_all() {
                Ok(all) => return Ok(all),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(source) => return Err(MapError::Read { map: name, source }),
            }
        }
        m.iter()
            .map(|r| {
                r.map_err(|e| MapError::Read {
                    map: name,
                    source: to_io(e),
                })
            })
            .collect()
    }
}

fn write_error(map: MapName, capacity: u32, source: io::Error) -> MapError {
    // A full hash map refuses new keys with E2BIG, a full LPM trie with
    // ENOSPC.
    if matches!(source.raw_os_error(), Some(libc::E2BIG | libc::ENOSPC)) {
        MapError::Full { map, capacity }
    } else {
        MapError::Write { map, source }
    }
}

fn upsert<K: aya::Pod, V: aya::Pod>(
    batch: &Batch<K, V>,
    ops: &[MapOp],
    kv: impl Fn(&MapOp) -> (K, V),
) -> Result<(), (usize, io::Error)> {
    let (k, v): (Vec<K>, Vec<V>) = ops.iter().map(kv).unzip();
    batch.update(&k, &v)
}

fn keys<K>(ops: &[MapOp], key: impl Fn(&MapOp) -> K) -> Vec<K> {
    ops.iter().map(key).collect()
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

#[cfg(test)]
mod tests {
    use weir_abi::{Backend, RevNat, ServiceKey, ServiceValue};

    use super::*;

    #[test]
    fn a_plan_is_cut_into_runs_that_keep_its_order() {
        let svc = |slot| {
            MapOp::UpsertService(
                ServiceKey {
                    slot,
                    ..ServiceKey::default()
                },
                ServiceValue::default(),
            )
        };
        let src = SrcRange {
            prefix_len: 32,
            key: SrcRangeKey::default(),
        };
        // A plan's shape: backends, rev-NAT, ranges, slots, master, prunes.
        let ops = [
            MapOp::UpsertBackend(1, Backend::default()),
            MapOp::UpsertBackend(2, Backend::default()),
            MapOp::UpsertRevNat(7, RevNat::default()),
            MapOp::UpsertSrcRange(src),
            MapOp::UpsertSrcRange(src),
            svc(1),
            svc(2),
            svc(0),
            MapOp::DeleteService(ServiceKey {
                slot: 3,
                ..ServiceKey::default()
            }),
            MapOp::DeleteBackend(3),
            MapOp::DeleteBackend(4),
        ];
        let got: Vec<(Run, std::ops::Range<usize>)> = runs(&ops);
        assert_eq!(
            got,
            [
                (Run::UpsertBackend, 0..2),
                (Run::UpsertRevNat, 2..3),
                (Run::Single, 3..4),
                (Run::Single, 4..5),
                (Run::UpsertService, 5..8),
                (Run::DeleteService, 8..9),
                (Run::DeleteBackend, 9..11),
            ]
        );
        assert!(runs(&[]).is_empty());
    }
}
