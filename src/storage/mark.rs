//! The synced mark: a RocksDB sequence number the WAL is known to have been
//! synced past, kept in a small file of its own in the database directory.
//!
//! Why it exists: RocksDB cannot tell a WAL that was cut short (its synced
//! tail lost to a truncation or a bad disk) from one whose last write was torn
//! by a crash. Both open as a torn tail, and the node would come back with a
//! shorter log and an older vote than it acknowledged. The mark is the
//! out-of-band record that tells them apart: an open that recovers less than
//! the mark has lost synced writes, and is refused as damage.
//!
//! The mark trails the WAL. The group-commit writer publishes the sequence it
//! synced; [`MarkWriter`] writes it down at most every [`INTERVAL`], off the
//! commit path, so acknowledgements never wait for it. A cut that removes only
//! the writes of that last interval is not caught (docs/operations.md says
//! so, under "Storage"); one that reaches further back is.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

/// The mark's file name, in the database directory. RocksDB leaves files it
/// does not know alone.
pub const FILE: &str = "DROVER-SYNCED";

/// How often, at most, the mark is written while the WAL is being synced.
pub const INTERVAL: Duration = Duration::from_millis(20);

/// Ties the checksum to this file, so a stray 16 bytes do not pass for a mark.
const MAGIC: u64 = 0x6472_6f76_6572_2d73;

fn encode(sequence: u64) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&sequence.to_le_bytes());
    bytes[8..].copy_from_slice(&check(sequence).to_le_bytes());
    bytes
}

fn check(sequence: u64) -> u64 {
    (sequence ^ MAGIC).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(29)
}

/// The mark in `dir`: `None` when there is none yet (a new database, or one
/// written before marks existed). A mark that does not check out is an error
/// that names the file.
pub fn read(dir: &Path) -> Result<Option<u64>, String> {
    let path = dir.join(FILE);
    let mut bytes = Vec::with_capacity(16);
    match File::open(&path) {
        Ok(file) => file.take(17).read_to_end(&mut bytes).map_err(|e| format!("reading {}: {e}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("opening {}: {e}", path.display())),
    };
    let damaged =
        || format!("{} is damaged: it holds {} bytes that are not a synced mark", path.display(), bytes.len());
    let bytes: [u8; 16] = bytes.as_slice().try_into().map_err(|_| damaged())?;
    let sequence = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    if u64::from_le_bytes(bytes[8..].try_into().expect("8 bytes")) != check(sequence) {
        return Err(damaged());
    }
    Ok(Some(sequence))
}

/// The writer's side: the sequence the WAL was last synced past, published
/// by the group-commit thread and written down by [`MarkWriter`].
#[derive(Default)]
pub struct Synced(AtomicU64);

impl Synced {
    /// Records that every write up to `sequence` is synced in the WAL.
    pub fn advance(&self, sequence: u64) {
        self.0.fetch_max(sequence, Ordering::Release);
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// The thread that writes the mark down. Dropping it writes the last
/// sequence published, then stops it.
pub struct MarkWriter {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MarkWriter {
    /// Starts writing `synced` to the mark in `dir`, beginning from `from`
    /// (the mark already there, or the sequence the database opened at).
    pub fn start(dir: &Path, synced: Arc<Synced>, from: u64) -> std::io::Result<MarkWriter> {
        let mut file = MarkFile::open(dir, from)?;
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new().name("drover-synced-mark".into()).spawn(move || loop {
            let last = matches!(stopped.recv_timeout(INTERVAL), Ok(()) | Err(RecvTimeoutError::Disconnected));
            let sequence = synced.get();
            if sequence > file.written {
                if let Err(e) = file.write(sequence) {
                    super::writer::fail_stop("synced mark write", &e);
                }
            }
            if last {
                return;
            }
        })?;
        Ok(MarkWriter { stop: Some(stop), thread: Some(thread) })
    }
}

impl Drop for MarkWriter {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct MarkFile {
    file: File,
    written: u64,
}

impl MarkFile {
    /// Opens the mark, creating it (synced, with its directory entry) at
    /// `from` if it is not there.
    fn open(dir: &Path, from: u64) -> std::io::Result<MarkFile> {
        let path: PathBuf = dir.join(FILE);
        let created = !path.exists();
        let file = OpenOptions::new().create(true).truncate(false).write(true).open(&path)?;
        let mut mark = MarkFile { file, written: 0 };
        if created {
            mark.write(from)?;
            File::open(dir)?.sync_all()?;
        }
        mark.written = from;
        Ok(mark)
    }

    /// Overwrites the mark in place and syncs it. Sixteen bytes at offset
    /// 0 sit in one sector: a crash leaves the old mark or the new one.
    fn write(&mut self, sequence: u64) -> std::io::Result<()> {
        self.file.write_all_at(&encode(sequence), 0)?;
        self.file.sync_data()?;
        self.written = sequence;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_reads_back_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), Ok(None), "no mark yet");
        let synced = Arc::new(Synced::default());
        let writer = MarkWriter::start(dir.path(), Arc::clone(&synced), 7).unwrap();
        assert_eq!(read(dir.path()), Ok(Some(7)), "a new mark starts where the database opened");
        synced.advance(42);
        synced.advance(40);
        drop(writer);
        assert_eq!(read(dir.path()), Ok(Some(42)), "dropping the writer writes the highest sequence published");

        let path = dir.path().join(FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[3] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(read(dir.path()).unwrap_err().contains("is damaged"));
        std::fs::write(&path, b"short").unwrap();
        assert!(read(dir.path()).unwrap_err().contains("5 bytes"));
    }
}
