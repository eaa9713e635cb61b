//! Returning freed heap to the kernel after the first sync.
//!
//! Loading 100k Services parses and drops several times the memory the
//! agent keeps, in millions of small allocations interleaved with the ones
//! it keeps. glibc returns memory to the kernel only from the top of each
//! arena, so without help the resident size after the sync stays near the
//! peak for the agent's whole life, and that is what a memory limit sees.

/// Releases free pages in every arena (`malloc_trim(0)`); a no-op where the
/// C library is not glibc.
pub fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}
