//! `BPF_MAP_{UPDATE,DELETE,LOOKUP}_BATCH` through the raw `bpf(2)` syscall:
//! aya 0.14 has no batch operations, and a single-element write costs a
//! syscall each (2.2 M of them for 100k Services × 10 endpoints).
//!
//! The kernel applies a batch's elements in order and stops at the first
//! failure, reporting how many it applied, so a batch keeps the make-before-
//! break order of the operations it carries and a failure still names the
//! one operation that failed, as single writes did.
use std::{
    io,
    marker::PhantomData,
    mem::{MaybeUninit, size_of},
    os::fd::{AsRawFd as _, OwnedFd},
};

// `enum bpf_cmd` in include/uapi/linux/bpf.h.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// How many elements one syscall carries at most. The kernel copies each
/// element on its own and reschedules between them, so the size only bounds
/// how long one syscall holds the map's fd.
const CHUNK: usize = 8192;

/// A hash map's batch interface. `K` and `V` must be the map's key and value
/// types (checked against the map when opened, see [`Self::new`]).
pub struct Batch<K, V> {
    fd: OwnedFd,
    _types: PhantomData<fn(K, V)>,
}

impl<K: aya::Pod, V: aya::Pod> Batch<K, V> {
    pub const fn new(fd: OwnedFd) -> Self {
        Self {
            fd,
            _types: PhantomData,
        }
    }

    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd as _;
        self.fd.as_fd()
    }

    fn call(&self, cmd: libc::c_long, attr: &mut BatchAttr) -> io::Result<()> {
        attr.map_fd = self.fd.as_raw_fd() as u32;
        // SAFETY: `attr` is a valid `bpf_attr.batch` of the size passed, and
        // the pointers in it are valid for `count` elements of the map's key
        // and value sizes, which `K` and `V` are.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                std::ptr::from_mut(attr),
                size_of::<BatchAttr>(),
            )
        };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Writes every `(key, value)`, in order. On failure: how many were
    /// written, and why the next one was not.
    pub fn update(&self, keys: &[K], values: &[V]) -> Result<(), (usize, io::Error)> {
        assert_eq!(keys.len(), values.len());
        let mut done = 0;
        while done < keys.len() {
            let n = (keys.len() - done).min(CHUNK);
            let mut attr = BatchAttr {
                keys: keys[done..].as_ptr() as u64,
                values: values[done..].as_ptr() as u64,
                count: n as u32,
                ..BatchAttr::default()
            };
            let r = self.call(BPF_MAP_UPDATE_BATCH, &mut attr);
            // On failure `count` says how many the kernel applied first.
            done += (attr.count as usize).min(n);
            r.map_err(|e| (done, e))?;
        }
        Ok(())
    }

    /// Deletes every key, in order; a key that is not there counts as
    /// deleted, as the single-element deletes treat it.
    pub fn delete(&self, keys: &[K]) -> Result<(), (usize, io::Error)> {
        let mut done = 0;
        while done < keys.len() {
            let n = (keys.len() - done).min(CHUNK);
            let mut attr = BatchAttr {
                keys: keys[done..].as_ptr() as u64,
                count: n as u32,
                ..BatchAttr::default()
            };
            let r = self.call(BPF_MAP_DELETE_BATCH, &mut attr);
            done += (attr.count as usize).min(n);
            match r {
                Ok(()) => {}
                // The batch stopped at an absent key: skip it and go on.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => done += 1,
                Err(e) => return Err((done, e)),
            }
        }
        Ok(())
    }

    /// Every entry of the map. Not a snapshot: entries written meanwhile may
    /// or may not be seen, as with a key-by-key walk.
    pub fn lookup_all(&self) -> io::Result<Vec<(K, V)>> {
        self.iter().collect()
    }

    /// The entries, a chunk per syscall, without holding the whole map (the
    /// conntrack walk keeps only what it needs of a million entries).
    pub const fn iter(&self) -> BatchIter<'_, K, V> {
        BatchIter {
            batch: self,
            chunk: Vec::new(),
            token: None,
            size: CHUNK,
            done: false,
        }
    }
}

/// See [`Batch::iter`]. Yields one error and stops if a read fails.
pub struct BatchIter<'a, K, V> {
    batch: &'a Batch<K, V>,
    /// The current chunk, reversed, so `pop` yields it in order.
    chunk: Vec<(K, V)>,
    /// Where the next chunk starts; `None` before the first. The hash map's
    /// token is its bucket index (a u32); 8 bytes hold any map type's.
    token: Option<u64>,
    size: usize,
    done: bool,
}

impl<K: aya::Pod, V: aya::Pod> BatchIter<'_, K, V> {
    /// Reads the next chunk into `self.chunk`.
    fn fill(&mut self) -> io::Result<()> {
        loop {
            let mut keys: Vec<MaybeUninit<K>> = Vec::new();
            let mut values: Vec<MaybeUninit<V>> = Vec::new();
            keys.resize_with(self.size, MaybeUninit::uninit);
            values.resize_with(self.size, MaybeUninit::uninit);
            let token = [self.token.unwrap_or(0)];
            let mut next = [0u64; 1];
            let mut attr = BatchAttr {
                in_batch: if self.token.is_some() {
                    token.as_ptr() as u64
                } else {
                    0
                },
                out_batch: next.as_mut_ptr() as u64,
                keys: keys.as_mut_ptr() as u64,
                values: values.as_mut_ptr() as u64,
                count: self.size as u32,
                ..BatchAttr::default()
            };
            let r = self.batch.call(BPF_MAP_LOOKUP_BATCH, &mut attr);
            let got = (attr.count as usize).min(self.size);
            match &r {
                // One bucket holds more than a chunk's worth: ask for more.
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && got == 0 => {
                    self.size *= 2;
                    continue;
                }
                Ok(()) => {}
                // The walk reached the end.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => self.done = true,
                Err(_) => return r,
            }
            self.chunk.clear();
            for i in (0..got).rev() {
                // SAFETY: the kernel wrote the first `count` keys and values.
                self.chunk
                    .push(unsafe { (keys[i].assume_init(), values[i].assume_init()) });
            }
            self.token = Some(next[0]);
            return Ok(());
        }
    }
}

impl<K: aya::Pod, V: aya::Pod> Iterator for BatchIter<'_, K, V> {
    type Item = io::Result<(K, V)>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.chunk.is_empty() {
            if self.done {
                return None;
            }
            if let Err(e) = self.fill() {
                self.done = true;
                return Some(Err(e));
            }
        }
        self.chunk.pop().map(Ok)
    }
}

/// An unpinned map of `u32 → V`, for tests against the kernel; gone with
/// its fd.
#[cfg(test)]
pub(super) fn create_map<V>(map_type: u32, max_entries: u32, flags: u32) -> OwnedFd {
    use std::os::fd::FromRawFd as _;
    const BPF_MAP_CREATE: libc::c_long = 0;
    #[repr(C)]
    struct CreateAttr {
        map_type: u32,
        key_size: u32,
        value_size: u32,
        max_entries: u32,
        map_flags: u32,
    }
    let attr = CreateAttr {
        map_type,
        key_size: size_of::<u32>() as u32,
        value_size: size_of::<V>() as u32,
        max_entries,
        map_flags: flags,
    };
    // SAFETY: a valid `bpf_attr` prefix for BPF_MAP_CREATE.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_CREATE,
            std::ptr::from_ref(&attr),
            size_of::<CreateAttr>(),
        )
    };
    assert!(fd >= 0, "BPF_MAP_CREATE: {}", io::Error::last_os_error());
    // SAFETY: a new fd that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// Against the kernel: needs root (CAP_BPF), as every datapath test does.
#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use weir_abi::Backend;

    use super::*;

    const BPF_MAP_TYPE_HASH: u32 = 1;

    /// An unpinned hash map of `u32 → Backend`, gone with its fd.
    fn hash_map(max_entries: u32) -> Batch<u32, Backend> {
        Batch::new(create_map::<Backend>(BPF_MAP_TYPE_HASH, max_entries, 0))
    }

    fn backend(i: u32) -> Backend {
        Backend {
            port: (i as u16).to_be(),
            rev_nat_id: i,
            ..Backend::default()
        }
    }

    fn contents(b: &Batch<u32, Backend>) -> BTreeMap<u32, Backend> {
        b.lookup_all().unwrap().into_iter().collect()
    }

    #[test]
    fn more_than_a_chunk_is_written_and_read_back() {
        let n = CHUNK as u32 * 2 + 17;
        let map = hash_map(n);
        assert!(contents(&map).is_empty());
        let keys: Vec<u32> = (1..=n).collect();
        let values: Vec<Backend> = keys.iter().map(|&k| backend(k)).collect();
        map.update(&keys, &values).unwrap();
        let want: BTreeMap<u32, Backend> = keys.iter().map(|&k| (k, backend(k))).collect();
        assert_eq!(contents(&map), want);
        // Overwrites in place, in order: the later value of a key wins.
        map.update(&[5, 5], &[backend(6), backend(7)]).unwrap();
        assert_eq!(contents(&map)[&5], backend(7));
    }

    #[test]
    fn a_full_map_stops_the_batch_at_the_first_refused_key() {
        let map = hash_map(100);
        let keys: Vec<u32> = (0..150).collect();
        let values: Vec<Backend> = keys.iter().map(|&k| backend(k)).collect();
        let (done, e) = map.update(&keys, &values).unwrap_err();
        assert_eq!(done, 100);
        assert_eq!(e.raw_os_error(), Some(libc::E2BIG));
        let got = contents(&map);
        assert_eq!(
            got.keys().copied().collect::<Vec<_>>(),
            (0..100).collect::<Vec<_>>()
        );
    }

    #[test]
    fn deleting_absent_keys_goes_on_with_the_rest() {
        let map = hash_map(64);
        let keys: Vec<u32> = (0..40).collect();
        let values: Vec<Backend> = keys.iter().map(|&k| backend(k)).collect();
        map.update(&keys, &values).unwrap();
        // 1000 and 2000 are not there, one of them first.
        map.delete(&[1000, 1, 2, 2000, 3, 2]).unwrap();
        let left: Vec<u32> = contents(&map).into_keys().collect();
        assert_eq!(
            left,
            (0..40).filter(|k| !(1..=3).contains(k)).collect::<Vec<_>>()
        );
    }
}
