//! Keeping glibc's heap near what the agent holds.
//!
//! Loading 100k Services decodes and drops several times the memory the
//! agent keeps, in millions of small allocations interleaved with the ones
//! it keeps, on several threads. Two things keep the resident size near the
//! peak for the agent's whole life, and that is what a memory limit sees:
//! each thread that allocates gets an arena of its own (up to 8 per core),
//! and glibc returns memory to the kernel only from the top of an arena.
//!
//! Measured with 100k Services × 10 endpoints from manifests (RSS after the
//! sync): 429 MiB with glibc's defaults, 375 MiB with two arenas; mimalloc
//! held 369 MiB there but 62 MiB instead of 17 at 1,000 Services, where
//! most clusters are.

/// Above this a block is mapped on its own rather than taken from an arena.
const MMAP_THRESHOLD: i32 = 32 << 20;
/// Free memory an arena keeps at its top between [`release_free_memory`]
/// calls.
const TRIM_THRESHOLD: i32 = 64 << 20;

/// Tunes glibc's allocator for how the agent loads; called before any
/// thread starts. A no-op where the C library is not glibc; a parameter
/// set in the environment (`MALLOC_ARENA_MAX`, `MALLOC_MMAP_THRESHOLD_`,
/// `MALLOC_TRIM_THRESHOLD_`) wins, as glibc reads those itself.
///
/// - At most four arenas, one each for the controller thread and the
///   runtime's workers (two on two cores) that load, rather than one per
///   thread that ever allocates. Two were tried first: the loading threads
///   then queued on each other's arena lock, and futex waits and wake-ups
///   took about a tenth of a cold sync (perf, 100k Services from
///   manifests). Four synced in 3.34-3.44 s where two took 2.99-4.04 s,
///   side by side, with the same RSS after the sync (191 MB).
/// - Blocks up to 32 MiB come from the arenas, and an arena keeps up to
///   64 MiB free at its top. A list page's body (1.4 MB for 500 slices of
///   10 endpoints) was otherwise mapped for each page, faulted in and
///   zeroed by the kernel, and unmapped again: perf put page clearing at
///   14% of a cold sync from the API server. The sync ends with
///   [`release_free_memory`], which returns what loading left free.
pub fn tune() {
    #[cfg(target_env = "gnu")]
    for (var, param, value) in [
        ("MALLOC_ARENA_MAX", libc::M_ARENA_MAX, 4),
        (
            "MALLOC_MMAP_THRESHOLD_",
            libc::M_MMAP_THRESHOLD,
            MMAP_THRESHOLD,
        ),
        (
            "MALLOC_TRIM_THRESHOLD_",
            libc::M_TRIM_THRESHOLD,
            TRIM_THRESHOLD,
        ),
    ] {
        if std::env::var_os(var).is_none() {
            // SAFETY: mallopt only sets an allocator parameter.
            unsafe {
                libc::mallopt(param, value);
            }
        }
    }
}

/// Releases free pages in every arena (`malloc_trim(0)`); a no-op where the
/// C library is not glibc.
pub fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}
