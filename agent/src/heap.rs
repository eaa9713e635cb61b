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

/// At most two arenas: the parse threads and the runtime's workers then
/// share them instead of each keeping its own partly used one. Called
/// before any thread starts; a no-op where the C library is not glibc, or
/// where `MALLOC_ARENA_MAX` is set (glibc reads it itself).
pub fn limit_arenas() {
    #[cfg(target_env = "gnu")]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
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
