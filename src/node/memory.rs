//! The process's heap: handing memory the program has freed back to the
//! kernel on a schedule. It is process-wide, so `drover serve` sets it up
//! once, not each [`super::Node`].
//!
//! The node's allocator is jemalloc (the `drover` binary installs it), for
//! Rust's allocations and RocksDB's alike. It returns freed pages to the kernel
//! on its own after a decay of seconds; a trim purges every arena at once. It
//! is timed (`drover_malloc_trim_seconds`). jemalloc is built unprefixed, so
//! it is the `malloc` of any process that links this module: this library's
//! test binaries use it too.

use std::time::{Duration, Instant};

use tokio::sync::watch;

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

/// Hands every whole free page of the heap back to the kernel now.
pub fn trim() -> Trim {
    let before = resident_bytes(std::process::id());
    let start = Instant::now();
    // "arena.<MALLCTL_ARENAS_ALL>.purge": every arena's unused dirty and muzzy pages.
    let name = c"arena.4096.purge";
    // SAFETY: the name is NUL-terminated, and a purge reads and writes no
    // caller memory (all pointers null, length 0).
    let failed = unsafe {
        tikv_jemalloc_sys::mallctl(name.as_ptr(), std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), 0)
    };
    if failed != 0 {
        tracing::warn!(error = failed, "jemalloc purge failed");
    }
    let took = start.elapsed();
    let after = resident_bytes(std::process::id());
    Trim { took, released: before.saturating_sub(after) }
}

/// Trims the heap every `interval` until `stop` turns true, recording each
/// trim's duration and what it released.
pub async fn trim_periodically(interval: Duration, mut stop: watch::Receiver<bool>) {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_is_read_and_a_trim_gives_back_freed_pages() {
        assert!(resident_bytes(std::process::id()) > 0, "VmRSS is read from /proc");
        // Many blocks, touched so they are resident, then every other one
        // freed: the freed ones sit between live ones, where an allocator
        // keeps them for a while. Each freed block holds three whole pages.
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
