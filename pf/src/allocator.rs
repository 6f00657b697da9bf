//! The process allocator's free memory, given back to the OS.
//!
//! The daemon allocates with mimalloc (`proxy/src/main.rs`). After a burst of connections
//! closes, mimalloc keeps what they used: empty pages stay in the heap of the thread that
//! allocated them (blocks freed by another thread wait there until their owner runs the
//! allocator again), and freed pages are decommitted only when some thread next allocates
//! after `purge_delay`. A daemon that goes quiet after a burst would hold all of it.

/// Gives back what the calling thread's heap holds free (its empty pages, and blocks other
/// threads freed into its pages), and decommits every freed page of the process's arenas.
/// Live memory is untouched. It walks every page the thread holds (~13 ms for 60 MB on the
/// daemon's main worker): call it when a thread is idle, not on every request. Tested in
/// `pf/tests/allocator.rs`, with mimalloc as the process allocator.
pub fn release_free_memory() {
    #[allow(unsafe_code)]
    // SAFETY: `mi_collect` takes no pointer and touches none of our memory: it walks the
    // calling thread's own heap and mimalloc's arenas under mimalloc's own locks, and is
    // documented as callable from any thread at any time ("eagerly free memory").
    unsafe {
        libmimalloc_sys::mi_collect(true)
    };
}
