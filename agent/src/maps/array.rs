//! A BPF array written through a shared mapping (`BPF_F_MMAPABLE`), as the
//! backends map is. Long runs of writes are plain stores into a window mapped
//! for the run: 5 ms for a million elements, against 200 ms as batches and
//! 460 ms into a preallocated hash (measured side by side). Short runs, such
//! as one Service's endpoints, are one batch, since mapping a window costs
//! more than that. Reads of the whole map are a copy out of a mapping too.
//!
//! A sync of many Services writes one short run per Service; while the
//! controller says one is under way ([`MmapArray::hold`]), a window of
//! [`HELD_WINDOW`] stays mapped and moves along with the ids written (the
//! allocator hands them out densely, so consecutive Services write nearby).
//! Otherwise a window is unmapped when its run ends. Windows stay small
//! because every mapped page counts in the agent's RSS, and the whole array
//! is tens of megabytes at high Service counts (24 MB at a million).
//!
//! An element of zeros is a free index: deleting writes zeros, and reads
//! leave such elements out.
use std::{
    io,
    marker::PhantomData,
    mem::size_of,
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
    sync::atomic::{Ordering, fence},
};

use aya::maps::{Array, Map, MapData, MapError as AyaMapError};

use super::batch::Batch;

/// `BPF_MAP_TYPE_ARRAY` in `enum bpf_map_type`.
pub const BPF_MAP_TYPE_ARRAY: u32 = 2;
/// `BPF_F_MMAPABLE` in include/uapi/linux/bpf.h.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

/// Runs at least this long are written through a window.
const MMAP_MIN: usize = 64;

/// Bytes of the window held during a bulk sync: about 43,000 backends,
/// remapped (a fraction of a millisecond) two dozen times for a million.
const HELD_WINDOW: usize = 1 << 20;

pub struct MmapArray<V: aya::Pod> {
    map: Array<MapData, V>,
    batch: Batch<u32, V>,
    /// The kernel takes batch commands (5.6 and later); cleared at the
    /// first refusal.
    batched: bool,
    max_entries: u32,
    /// Whether the map was created mmapable; without it every write is a
    /// syscall and every read a lookup.
    mmapable: bool,
    /// A sync of many Services is under way: keep `held` mapped.
    bulk: bool,
    /// The window of a bulk sync, around the ids last written.
    held: Option<Window>,
    _types: PhantomData<fn(V)>,
}

impl<V: aya::Pod> MmapArray<V> {
    /// Opens the array pinned at `pin`. `Array::try_from` checks the value
    /// size, which the window's stride relies on.
    pub fn open(pin: &Path) -> Result<Self, AyaMapError> {
        Self::from_data(MapData::from_pin(pin)?)
    }

    fn from_data(data: MapData) -> Result<Self, AyaMapError> {
        let info = data.info()?;
        let fd = data
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(AyaMapError::IoError)?;
        let map = Array::try_from(Map::Array(data))?;
        Ok(Self {
            map,
            batch: Batch::new(fd),
            batched: true,
            max_entries: info.max_entries(),
            mmapable: info.map_flags() & BPF_F_MMAPABLE != 0,
            bulk: false,
            held: None,
            _types: PhantomData,
        })
    }

    /// A sync of many Services starts (`true`) or ends: between the two,
    /// every run is written through the held window.
    pub fn hold(&mut self, on: bool) {
        self.bulk = on;
        if !on {
            self.held = None;
        }
    }

    pub const fn max_entries(&self) -> u32 {
        self.max_entries
    }

    /// The kernel lays elements out every `round_up(value_size, 8)` bytes.
    const STRIDE: usize = size_of::<V>().next_multiple_of(8);

    /// Writes every `(index, value)` in order. On failure: how many were
    /// written, and why the next was not; an index past the end is
    /// `E2BIG`, as the kernel refuses it.
    pub fn write(&mut self, items: &[(u32, V)]) -> Result<(), (usize, io::Error)> {
        let fit = items
            .iter()
            .position(|&(i, _)| i >= self.max_entries)
            .unwrap_or(items.len());
        let (head, rest) = items.split_at(fit);
        if head.is_empty() {
            // Nothing to map a window around.
        } else if self.mmapable && (self.bulk || head.len() >= MMAP_MIN) {
            match self.write_mapped(head) {
                Ok(()) => {}
                // No room for a window: the syscalls still work.
                Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => self.write_each(head)?,
                Err(e) => return Err((0, e)),
            }
        } else if self.batched && head.len() > 1 {
            let (keys, values): (Vec<u32>, Vec<V>) = head.iter().copied().unzip();
            match self.batch.update(&keys, &values) {
                Ok(()) => {}
                Err((0, e)) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.batched = false;
                    self.write_each(head)?;
                }
                Err(e) => return Err(e),
            }
        } else {
            self.write_each(head)?;
        }
        match rest.is_empty() {
            true => Ok(()),
            false => Err((fit, io::Error::from_raw_os_error(libc::E2BIG))),
        }
    }

    fn write_each(&mut self, items: &[(u32, V)]) -> Result<(), (usize, io::Error)> {
        for (n, (i, v)) in items.iter().enumerate() {
            self.map.set(*i, v, 0).map_err(|e| (n, to_io(e)))?;
        }
        Ok(())
    }

    /// `items` is not empty.
    fn write_mapped(&mut self, items: &[(u32, V)]) -> io::Result<()> {
        const RW: libc::c_int = libc::PROT_READ | libc::PROT_WRITE;
        let (lo, hi) = items
            .iter()
            .fold((u32::MAX, 0), |(lo, hi), &(i, _)| (lo.min(i), hi.max(i)));
        let local;
        let w = if self.bulk {
            let covered = self
                .held
                .as_ref()
                .is_some_and(|w| w.covers::<V>(lo..hi + 1));
            if !covered {
                // Unmapped first, so the two never count in RSS together.
                self.held = None;
                let span = (HELD_WINDOW / Self::STRIDE) as u32;
                let end = hi.saturating_add(1).max(lo.saturating_add(span));
                let w = Window::map(self, lo..end.min(self.max_entries), RW)?;
                self.held = Some(w);
            }
            self.held.as_ref().expect("mapped above")
        } else {
            local = Window::map(self, lo..hi + 1, RW)?;
            &local
        };
        for &(i, v) in items {
            // SAFETY: `i` lies in the window, at an element boundary; the
            // kernel and its programs are the only other parties, and they
            // read elements as bytes (see the eBPF crate's maps.rs on torn
            // reads). Volatile: the stores are for another party to see.
            unsafe { w.element::<V>(i).write_volatile(v) };
        }
        // The programs must see these stores before the writes of the
        // slots that will name them, which are syscalls made next.
        fence(Ordering::SeqCst);
        Ok(())
    }

    /// Every element that is not all zeros, by index. Read in place: a
    /// cold start's array is all zeros, and a copy of a million of them
    /// (24 MB of fresh pages) was most of reading the maps back.
    pub fn entries(&self) -> io::Result<Vec<(u32, V)>> {
        let mut out = Vec::new();
        self.each_element(|i, v| {
            if !is_zero(&v) {
                out.push((i, v));
            }
        })?;
        Ok(out)
    }

    /// Every element, zeros too, by index.
    pub fn elements(&self) -> io::Result<Vec<V>> {
        let mut out = Vec::with_capacity(self.max_entries as usize);
        self.each_element(|_, v| out.push(v))?;
        Ok(out)
    }

    /// Hands out every element in index order, read through windows of
    /// [`HELD_WINDOW`] in turn, so that the mapping adds little to the
    /// reader's RSS.
    fn each_element(&self, mut f: impl FnMut(u32, V)) -> io::Result<()> {
        let span = (HELD_WINDOW / Self::STRIDE) as u32;
        let mut lo = 0;
        while self.mmapable && lo < self.max_entries {
            let hi = lo.saturating_add(span).min(self.max_entries);
            let w = match Window::map(self, lo..hi, libc::PROT_READ) {
                Ok(w) => w,
                Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => break,
                Err(e) => return Err(e),
            };
            for i in lo..hi {
                // SAFETY: every index of `lo..hi` lies in the window.
                f(i, unsafe { w.element::<V>(i).read_volatile() });
            }
            lo = hi;
        }
        for i in lo..self.max_entries {
            f(i, self.map.get(&i, 0).map_err(to_io)?);
        }
        Ok(())
    }
}

/// Whether an element is free: all zeros.
pub fn is_zero<V: aya::Pod>(v: &V) -> bool {
    // SAFETY: a `Pod` is plain bytes with no padding the kernel did not write.
    let bytes =
        unsafe { std::slice::from_raw_parts(std::ptr::from_ref(v).cast::<u8>(), size_of::<V>()) };
    bytes.iter().all(|&b| b == 0)
}

/// The pages of an array that hold a range of its elements, mapped until
/// dropped.
struct Window {
    ptr: *mut libc::c_void,
    len: usize,
    /// Byte offset of the first mapped page within the array.
    start: usize,
}

impl Window {
    fn map<V: aya::Pod>(
        a: &MmapArray<V>,
        elems: std::ops::Range<u32>,
        prot: libc::c_int,
    ) -> io::Result<Self> {
        let page = page_size();
        let stride = MmapArray::<V>::STRIDE;
        let start = elems.start as usize * stride / page * page;
        let end = (elems.end as usize * stride).next_multiple_of(page);
        // SAFETY: a new shared mapping of the map's fd, page-aligned within
        // the array's pages (the kernel refuses anything past them).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                end - start,
                prot,
                libc::MAP_SHARED,
                a.batch.as_fd().as_raw_fd(),
                start as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            ptr,
            len: end - start,
            start,
        })
    }

    /// Whether elements `elems` lie within the window.
    fn covers<V>(&self, elems: std::ops::Range<u32>) -> bool {
        let stride = size_of::<V>().next_multiple_of(8);
        self.start <= elems.start as usize * stride
            && elems.end as usize * stride <= self.start + self.len
    }

    /// # Safety
    /// Element `i` must lie within the window.
    unsafe fn element<V>(&self, i: u32) -> *mut V {
        let at = i as usize * size_of::<V>().next_multiple_of(8) - self.start;
        debug_assert!(at + size_of::<V>() <= self.len);
        // SAFETY: in bounds by the caller's promise; the kernel aligns
        // elements to 8 bytes and the mapping to a page.
        unsafe { self.ptr.cast::<u8>().add(at).cast::<V>() }
    }
}

// SAFETY: a mapping belongs to the process, not to the thread that made it;
// and a shared `Window` only hands out its address: `MmapArray` writes
// through it from `&mut self` alone.
unsafe impl Send for Window {}
unsafe impl Sync for Window {}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

fn to_io(e: AyaMapError) -> io::Error {
    match e {
        AyaMapError::SyscallError(s) => s.io_error,
        AyaMapError::IoError(e) => e,
        AyaMapError::OutOfBounds { .. } => io::Error::from_raw_os_error(libc::E2BIG),
        other => io::Error::other(other),
    }
}

/// Against the kernel: needs root (CAP_BPF), as every datapath test does.
#[cfg(test)]
mod tests {
    use weir_abi::Backend;

    use super::*;

    /// An unpinned array of `Backend`s, gone with its fd.
    fn array(max_entries: u32, flags: u32) -> MmapArray<Backend> {
        let fd = super::super::batch::create_map::<Backend>(BPF_MAP_TYPE_ARRAY, max_entries, flags);
        MmapArray::from_data(MapData::from_fd(fd).unwrap()).unwrap()
    }

    fn backend(i: u32) -> Backend {
        Backend {
            port: (i as u16).to_be(),
            rev_nat_id: i,
            ..Backend::default()
        }
    }

    fn items(ids: impl IntoIterator<Item = u32>) -> Vec<(u32, Backend)> {
        ids.into_iter().map(|i| (i, backend(i))).collect()
    }

    /// Long runs go through a window, short ones through syscalls; either
    /// way the kernel's lookups see the same, and zeros read as absent.
    #[test]
    fn writes_through_a_window_or_syscalls_read_back_alike() {
        for flags in [BPF_F_MMAPABLE, 0] {
            let mut a = array(5000, flags);
            assert_eq!(a.mmapable, flags != 0);
            assert!(a.entries().unwrap().is_empty());
            // Past the first page, and not from its start.
            a.write(&items(1000..3000)).unwrap();
            a.write(&items([7, 4999])).unwrap();
            let mut want = items(1000..3000);
            want.insert(0, (7, backend(7)));
            want.push((4999, backend(4999)));
            assert_eq!(a.entries().unwrap(), want, "flags {flags}");
            assert_eq!(a.map.get(&2345, 0).unwrap(), backend(2345));
            // Deleting is writing zeros, in a long run and a short one.
            let zeros: Vec<_> = (1000..2000).map(|i| (i, Backend::default())).collect();
            a.write(&zeros).unwrap();
            a.write(&[(7, Backend::default())]).unwrap();
            assert_eq!(a.entries().unwrap().first(), Some(&(2000, backend(2000))));
            assert_eq!(a.entries().unwrap().len(), 1001);
        }
    }

    /// A bulk sync writes short runs through one held window, which moves
    /// when a run falls outside it; what the kernel holds is the same.
    #[test]
    fn a_held_window_moves_with_the_ids_written() {
        let n = 3 * (HELD_WINDOW / 24) as u32;
        let mut a = array(n, BPF_F_MMAPABLE);
        a.hold(true);
        a.write(&items(1..11)).unwrap();
        let first = a.held.as_ref().map(|w| w.start);
        a.write(&items([n - 2, n - 1])).unwrap();
        let far = a.held.as_ref().map(|w| w.start);
        assert_ne!(first, far, "the window moved");
        a.write(&items(20..23)).unwrap();
        a.write(&[(5, Backend::default())]).unwrap();
        a.hold(false);
        assert!(a.held.is_none());
        let mut want: Vec<u32> = (1..11).filter(|&i| i != 5).collect();
        want.extend([20, 21, 22, n - 2, n - 1]);
        let got: Vec<u32> = a.entries().unwrap().into_iter().map(|(i, _)| i).collect();
        assert_eq!(got, want);
        // The kernel's own lookup agrees with the stores.
        assert_eq!(a.map.get(&(n - 1), 0).unwrap(), backend(n - 1));
    }

    #[test]
    fn an_index_past_the_end_stops_the_run_where_it_is() {
        let mut a = array(100, BPF_F_MMAPABLE);
        let (done, e) = a.write(&items(1..150)).unwrap_err();
        assert_eq!((done, e.raw_os_error()), (99, Some(libc::E2BIG)));
        assert_eq!(a.entries().unwrap(), items(1..100));
        let (done, e) = a.write(&items([3, 100])).unwrap_err();
        assert_eq!((done, e.raw_os_error()), (1, Some(libc::E2BIG)));
        // During a bulk sync too, and with nothing before the refused one.
        a.hold(true);
        let (done, e) = a.write(&items([100])).unwrap_err();
        assert_eq!((done, e.raw_os_error()), (0, Some(libc::E2BIG)));
        a.write(&items([5, 98])).unwrap();
        a.hold(false);
        assert!(a.held.is_none());
        assert_eq!(a.entries().unwrap().len(), 99);
    }
}
