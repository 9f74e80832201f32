//! The process's heap: how its allocator is set up, and handing memory the
//! program has freed back to the kernel on a schedule. Both are process-wide,
//! so `drover serve` sets them up once, not each [`crate::node::Node`].
//!
//! The node's allocator is jemalloc (the default `jemalloc` feature, for
//! Rust's allocations and RocksDB's alike): it returns freed pages on its own
//! after about a second, the arena limit does not apply, and a trim purges
//! every jemalloc arena at once. Built without it, the allocator is glibc's,
//! and the rest of this note is about that build.
//!
//! glibc keeps memory a program frees for its next allocations. Where the free
//! memory sits between pieces still in use it stays resident: after minutes of
//! steady load a node held 15% more than it used. `malloc_trim(0)` returns
//! every whole free page of every arena; it holds each arena's lock while it
//! walks it, so it is timed (`drover_malloc_trim_seconds`).

use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Sets the allocator up for a node, once, at the start of `drover serve`.
///
/// With jemalloc: starts its background thread, which hands freed pages back
/// to the kernel once their decay (about a second, see `malloc_conf` in
/// main.rs) has passed, not only when the program next allocates (unless
/// `MALLOC_CONF` names `background_thread`, which then decides). It starts
/// here, not from jemalloc's settings at its start: that start is the
/// process's first allocation, made while shared libraries are still
/// starting, and a thread started then reads them half-started
/// (libfaketime, under the fault suite's clock faults, read the wall clock as
/// 1970 in one node of three).
///
/// With glibc: glibc gives each thread that allocates concurrently its own
/// arena, up to eight per core, and memory freed in one is not returned while
/// others hold it: with tokio's and RocksDB's threads, resident memory drifts
/// upward. Two arenas keep it near what is in use, at no measurable cost here.
pub fn setup_allocator() {
    #[cfg(all(target_env = "gnu", not(feature = "jemalloc")))]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
    #[cfg(feature = "jemalloc")]
    if !std::env::var("MALLOC_CONF").is_ok_and(|conf| conf.contains("background_thread")) {
        let mut on = true;
        // SAFETY: the name is NUL-terminated and the new value is a bool, the
        // type jemalloc documents for it; no old value is read.
        let failed = unsafe {
            tikv_jemalloc_sys::mallctl(
                c"background_thread".as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                (&raw mut on).cast(),
                std::mem::size_of::<bool>(),
            )
        };
        if failed != 0 {
            tracing::warn!(error = failed, "could not start jemalloc's background thread");
        }
    }
}

/// What the allocator holds, from jemalloc's statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Bytes the program has allocated and not freed.
    pub allocated: u64,
    /// Bytes of the allocator's pages that are resident: what is allocated,
    /// its metadata, and freed pages it has not handed back yet.
    pub resident: u64,
    /// Bytes of address space it keeps mapped but has handed back to the
    /// kernel (not resident).
    pub retained: u64,
}

/// jemalloc's totals, fresh (its statistics are cached until an "epoch"
/// write); `None` in a build without jemalloc.
pub fn allocator_stats() -> Option<AllocatorStats> {
    #[cfg(feature = "jemalloc")]
    {
        let mut epoch: u64 = 1;
        // SAFETY: the names are NUL-terminated; "epoch" takes a u64 and the
        // "stats.*" totals are size_t, each read into a value of that size.
        unsafe {
            let refresh = tikv_jemalloc_sys::mallctl(
                c"epoch".as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                (&raw mut epoch).cast(),
                std::mem::size_of::<u64>(),
            );
            if refresh != 0 {
                return None;
            }
            let read = |name: &std::ffi::CStr| -> Option<u64> {
                let mut value: libc::size_t = 0;
                let mut len = std::mem::size_of::<libc::size_t>();
                let failed = tikv_jemalloc_sys::mallctl(
                    name.as_ptr(),
                    (&raw mut value).cast(),
                    &raw mut len,
                    std::ptr::null_mut(),
                    0,
                );
                (failed == 0).then_some(value as u64)
            };
            Some(AllocatorStats {
                allocated: read(c"stats.allocated")?,
                resident: read(c"stats.resident")?,
                retained: read(c"stats.retained")?,
            })
        }
    }
    #[cfg(not(feature = "jemalloc"))]
    None
}

/// Resident memory of process `pid` in bytes (its `VmRSS`); 0 where `/proc`
/// does not say.
pub fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

/// What one trim did.
#[derive(Debug, Clone, Copy)]
pub struct Trim {
    /// How long the allocator was busy with it.
    pub took: Duration,
    /// Resident memory before less after (0 if it grew meanwhile).
    pub released: u64,
}

/// Hands every whole free page of the heap back to the kernel now. Does
/// nothing (and reports nothing released) outside glibc without jemalloc.
pub fn trim() -> Trim {
    let before = resident_bytes(std::process::id());
    let start = Instant::now();
    #[cfg(all(target_env = "gnu", not(feature = "jemalloc")))]
    // SAFETY: malloc_trim only walks the allocator's own structures under
    // their locks; any thread may call it at any time.
    unsafe {
        libc::malloc_trim(0);
    }
    #[cfg(feature = "jemalloc")]
    purge_jemalloc();
    let took = start.elapsed();
    let after = resident_bytes(std::process::id());
    Trim { took, released: before.saturating_sub(after) }
}

/// Purges every jemalloc arena's unused pages ("arena.<MALLCTL_ARENAS_ALL>.purge").
#[cfg(feature = "jemalloc")]
fn purge_jemalloc() {
    const PURGE_ALL_ARENAS: &std::ffi::CStr = c"arena.4096.purge";
    // SAFETY: the name is NUL-terminated, and a purge reads and writes no
    // caller memory (all pointers null, length 0).
    let failed = unsafe {
        tikv_jemalloc_sys::mallctl(
            PURGE_ALL_ARENAS.as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    if failed != 0 {
        tracing::warn!(error = failed, "jemalloc purge failed");
    }
}

/// Trims the heap every `interval` until `stop` turns true, recording each
/// trim's duration and what it released.
pub async fn trim_periodically(interval: Duration, mut stop: watch::Receiver<bool>, status: crate::tasks::LoopStatus) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        // A trim of a large heap takes milliseconds: keep it off the runtime's workers.
        let Ok(done) = tokio::task::spawn_blocking(trim).await else { return };
        metrics::histogram!("drover_malloc_trim_seconds").record(done.took.as_secs_f64());
        metrics::counter!("drover_malloc_trim_released_bytes_total").increment(done.released);
        status.set(format!("the last trim released {} KiB in {:?}", done.released >> 10, done.took));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_is_read_and_a_trim_gives_back_freed_pages() {
        assert!(resident_bytes(std::process::id()) > 0, "VmRSS is read from /proc");
        // Many small blocks, touched so they are resident, then every other one
        // freed: the freed ones sit between live ones, where glibc keeps them.
        // Each freed block holds at least three whole pages.
        let mut blocks: Vec<Vec<u8>> = (0..10_000).map(|i| vec![i as u8 | 1; 16_000]).collect();
        let mut kept = Vec::new();
        for (i, block) in blocks.drain(..).enumerate() {
            if i % 2 == 0 {
                kept.push(block);
            }
        }
        let done = trim();
        assert!(
            done.released >= 32 << 20,
            "a trim after freeing 80 MB between live blocks released only {} bytes",
            done.released
        );
        assert_eq!(kept.len(), 5_000);
    }
}
