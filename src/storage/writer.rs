//! Group commit: one WAL sync for every append waiting, from every partition.
//!
//! Callers write their batch to RocksDB themselves, unsynced (it is readable at
//! once), then ask this thread to make it durable. The thread takes every
//! request waiting, syncs the WAL once, and tells each caller. A Raft leader
//! therefore sends entries to its followers while its own sync is under way,
//! instead of after it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

use rocksdb::DB;

/// Runs once the batch is durable (or failed to be).
pub type Completion = Box<dyn FnOnce(Result<(), String>) + Send>;

/// Requests answered per sync, capped so one huge drain cannot starve callers.
const MAX_BATCHES_PER_SYNC: usize = 1024;

#[derive(Default)]
struct Counters {
    syncs: AtomicU64,
    batches: AtomicU64,
    sync_micros: AtomicU64,
}

/// Totals since start, for `jobs per sync` and sync latency.
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncStats {
    pub syncs: u64,
    pub batches: u64,
    pub sync_micros: u64,
}

/// The WAL group-commit thread. Dropping the last handle stops it after it has
/// synced what it already took.
pub struct SyncWriter {
    tx: Option<Sender<Completion>>,
    thread: Option<std::thread::JoinHandle<()>>,
    counters: Arc<Counters>,
}

impl Drop for SyncWriter {
    /// Stops the thread and waits for it, so its handle on the database is
    /// released before the database is closed.
    fn drop(&mut self) {
        self.tx.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl SyncWriter {
    pub fn start(db: Arc<DB>) -> SyncWriter {
        let (tx, rx) = mpsc::channel::<Completion>();
        let counters = Arc::new(Counters::default());
        let thread_counters = Arc::clone(&counters);
        let thread = std::thread::Builder::new()
            .name("drover-wal-sync".into())
            .spawn(move || run(db, rx, thread_counters))
            .expect("spawn the WAL writer thread");
        SyncWriter { tx: Some(tx), thread: Some(thread), counters }
    }

    /// Syncs everything written to the WAL before this call, then runs `done`.
    pub fn sync(&self, done: Completion) {
        let unsent = match &self.tx {
            Some(tx) => tx.send(done).err().map(|mpsc::SendError(done)| done),
            None => Some(done),
        };
        if let Some(done) = unsent {
            done(Err("the storage writer has stopped".into()));
        }
    }

    pub fn stats(&self) -> SyncStats {
        SyncStats {
            syncs: self.counters.syncs.load(Ordering::Relaxed),
            batches: self.counters.batches.load(Ordering::Relaxed),
            sync_micros: self.counters.sync_micros.load(Ordering::Relaxed),
        }
    }
}

fn run(db: Arc<DB>, rx: Receiver<Completion>, counters: Arc<Counters>) {
    let mut waiting: Vec<Completion> = Vec::with_capacity(MAX_BATCHES_PER_SYNC);
    while let Ok(first) = rx.recv() {
        let started = Instant::now();
        waiting.push(first);
        while waiting.len() < MAX_BATCHES_PER_SYNC {
            let Ok(next) = rx.try_recv() else { break };
            waiting.push(next);
        }
        // Every request was written before it was sent, so this one sync
        // covers all of them.
        let result = db.flush_wal(true).map_err(|e| e.to_string());
        let elapsed = started.elapsed();
        counters.syncs.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("drover_storage_wal_syncs_total").increment(1);
        counters.batches.fetch_add(waiting.len() as u64, Ordering::Relaxed);
        counters.sync_micros.fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
        metrics::histogram!("drover_storage_write_sync_seconds").record(elapsed.as_secs_f64());
        metrics::histogram!("drover_storage_appends_per_sync").record(waiting.len() as f64);
        for done in waiting.drain(..) {
            done(result.clone());
        }
    }
}
