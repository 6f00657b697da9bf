//! `allocator::release_free_memory` with mimalloc as the process allocator, as in the daemon:
//! memory a thread allocated and another thread freed stays with the allocating thread's heap
//! until that thread gives it back.
#![cfg(target_os = "linux")]

use std::sync::mpsc;

use agenshield_pf::allocator::release_free_memory;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MIB: u64 = 1024;

/// Resident set size of this process, KiB.
fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("resident pages");
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .expect("page size") as u64;
    pages * page / 1024
}

#[test]
fn a_thread_gives_back_what_another_thread_freed_into_its_heap() {
    let before = rss_kib();
    let (blocks_tx, blocks) = mpsc::channel::<Vec<Vec<u8>>>();
    let (go_tx, go) = mpsc::channel::<()>();
    // The owner allocates 64 MiB (a connection's buffers, say) and hands it over...
    let owner = std::thread::spawn(move || {
        let held: Vec<Vec<u8>> = (0..8192u32)
            .map(|i| vec![(i % 251) as u8 + 1; 8 * 1024])
            .collect();
        blocks_tx.send(held).expect("hand over");
        go.recv().expect("go");
        let held = rss_kib();
        release_free_memory();
        (held, rss_kib())
    });
    // ...and this thread frees it (the connection closed on another thread).
    let handed = blocks.recv().expect("blocks");
    assert!(handed.iter().all(|b| b[0] != 0));
    drop(handed);
    let freed = rss_kib();
    go_tx.send(()).expect("go");
    let (held, released) = owner.join().expect("owner");
    assert!(
        held >= before + 48 * MIB && freed >= before + 48 * MIB,
        "freed by another thread, the memory stays resident: before {before} KiB, after the \
         free {freed} KiB, when the owner gives back {held} KiB"
    );
    assert!(
        released + 48 * MIB <= held,
        "the owner gave back what it held free: {held} KiB before, {released} KiB after"
    );
}
