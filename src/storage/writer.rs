//! Group commit: one WAL sync for every append waiting, from every partition.
//!
//! Callers write their batch to RocksDB themselves, unsynced (it is readable at
//! once), then ask this thread to make it durable. The thread takes every
//! request waiting, syncs the WAL once, and tells each caller. A follower
//! answers its leader only after that answer; a leader replicates its entries
//! while the sync runs and counts itself in the quorum after it (the change
//! Drover makes to openraft, `vendor/openraft/DROVER.md`). What group commit
//! saves is syncs: the appends of every partition that arrive during one sync
//! share the next.
//!
//! A sync that fails ends the process ([`fail_stop`]) before any caller
//! waiting on it is answered.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::Instant;

use rocksdb::DB;

use super::mark::Synced;

/// Runs once the batch is durable. It gets an error only if the writer
/// thread is gone; a failed sync ends the process instead.
pub type Completion = Box<dyn FnOnce(Result<(), String>) + Send>;

/// Requests answered per sync, capped so one huge drain cannot starve callers.
const MAX_BATCHES_PER_SYNC: usize = 1024;

/// The exit code of a node whose storage failed a write or a sync (EX_IOERR).
pub const EXIT_STORAGE_FAILED: i32 = 74;

/// Test only: `DROVER_FAILPOINT_WAL_SYNC_FAIL_AFTER=N` makes the N-th group
/// commit sync of the process report an error, as a failing disk would
/// (RocksDB's rust bindings offer no fault-injecting `Env`). Read once, when
/// the writer starts; never set it on a node that holds data you need.
const FAILPOINT_SYNC_FAIL_AFTER: &str = "DROVER_FAILPOINT_WAL_SYNC_FAIL_AFTER";

/// Test only: `DROVER_FAILPOINT_SKIP_WAL_SYNC=1` turns every WAL sync into a
/// no-op that reports success, so appends are acknowledged while they are
/// still only in the page cache. It exists to show that the fault suite's
/// power-failure nemesis finds lost writes; a node run with it loses
/// acknowledged jobs when its machine loses power.
const FAILPOINT_SKIP_WAL_SYNC: &str = "DROVER_FAILPOINT_SKIP_WAL_SYNC";

/// Whether [`FAILPOINT_SKIP_WAL_SYNC`] is set (read once).
pub fn skip_wal_sync() -> bool {
    static SKIP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SKIP.get_or_init(|| {
        let skip = std::env::var_os(FAILPOINT_SKIP_WAL_SYNC).is_some_and(|v| v == "1");
        if skip {
            tracing::error!(
                "test failpoint {FAILPOINT_SKIP_WAL_SYNC}=1: the WAL is never synced, and a power failure loses \
                 acknowledged writes"
            );
        }
        skip
    })
}

/// Ends the process after a failed write or sync, with one line at error
/// level and [`EXIT_STORAGE_FAILED`].
///
/// Why not return the error: openraft turns a storage error into a fatal
/// error of that partition's group, and the node would go on answering with
/// no groups (a zombie its supervisor never restarts). Nothing is lost by
/// stopping: whatever was waiting on the failed sync is never acknowledged,
/// and a restart recovers what was synced before it or refuses to open.
/// `_exit`, not `exit`: RocksDB's and Tokio's threads are still running, and
/// `exit` would run C++ static destructors under them.
pub fn fail_stop(what: &str, error: &dyn std::fmt::Display) -> ! {
    tracing::error!(
        "storage {what} failed: {error}; stopping the node (exit code {EXIT_STORAGE_FAILED}) so that nothing \
         more is acknowledged from storage that may have lost writes"
    );
    // SAFETY: `_exit` ends the process at once; it touches no Rust state.
    unsafe { libc::_exit(EXIT_STORAGE_FAILED) }
}

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
    /// Starts the thread; after each sync it advances `synced` to the
    /// sequence the sync covered.
    pub fn start(db: Arc<DB>, synced: Arc<Synced>) -> SyncWriter {
        let (tx, rx) = mpsc::channel::<Completion>();
        let counters = Arc::new(Counters::default());
        let thread_counters = Arc::clone(&counters);
        let thread = std::thread::Builder::new()
            .name("drover-wal-sync".into())
            .spawn(move || run(db, rx, &synced, thread_counters, sync_failpoint(), skip_wal_sync()))
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

/// The sync, counted from 1, that [`FAILPOINT_SYNC_FAIL_AFTER`] makes fail.
fn sync_failpoint() -> Option<u64> {
    let value = std::env::var(FAILPOINT_SYNC_FAIL_AFTER).ok()?;
    match value.parse() {
        Ok(n) => {
            tracing::warn!("test failpoint {FAILPOINT_SYNC_FAIL_AFTER}={n}: WAL sync {n} will fail");
            Some(n)
        }
        Err(_) => fail_stop("failpoint setup", &format!("{FAILPOINT_SYNC_FAIL_AFTER}={value:?} is not a number")),
    }
}

fn run(
    db: Arc<DB>,
    rx: Receiver<Completion>,
    synced: &Synced,
    counters: Arc<Counters>,
    fail_sync: Option<u64>,
    skip_sync: bool,
) {
    let mut waiting: Vec<Completion> = Vec::with_capacity(MAX_BATCHES_PER_SYNC);
    let mut attempt = 0u64;
    while let Ok(first) = rx.recv() {
        let started = Instant::now();
        waiting.push(first);
        while waiting.len() < MAX_BATCHES_PER_SYNC {
            let Ok(next) = rx.try_recv() else { break };
            waiting.push(next);
        }
        // Every request was written before it was sent, so this one sync
        // covers all of them, and every write up to this sequence.
        let sequence = db.latest_sequence_number();
        if let Some(hold) = crate::failpoints::fire("wal_sync_hold") {
            std::thread::sleep(hold);
        }
        attempt += 1;
        let result = if fail_sync == Some(attempt) {
            Err(format!("injected by {FAILPOINT_SYNC_FAIL_AFTER}={attempt}"))
        } else {
            db.flush_wal(!skip_sync).map_err(|e| e.to_string())
        };
        if let Err(e) = result {
            fail_stop("WAL sync", &e);
        }
        if !skip_sync {
            synced.advance(sequence);
        }
        let elapsed = started.elapsed();
        counters.syncs.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("drover_storage_wal_syncs_total").increment(1);
        counters.batches.fetch_add(waiting.len() as u64, Ordering::Relaxed);
        counters.sync_micros.fetch_add(elapsed.as_micros() as u64, Ordering::Relaxed);
        metrics::histogram!("drover_storage_write_sync_seconds").record(elapsed.as_secs_f64());
        metrics::histogram!("drover_storage_appends_per_sync").record(waiting.len() as f64);
        for done in waiting.drain(..) {
            done(Ok(()));
        }
    }
}
