//! A partition's part of a backup, staged on every replica.
//!
//! A backup's mark ([`crate::core::Command::BackupMark`]) goes through the
//! partition's log like any command. The apply that applies it keeps the
//! partition's state as of that apply: the snapshot header (live jobs,
//! counters, remembered creates, sessions, schemas) taken under the lock,
//! and the final records from a point-in-time view taken at the same moment,
//! written to `snapshots/backups/<id>/p<partition>.snap` by a blocking task
//! while apply goes on. Every replica does it (each at the end of its own
//! apply, so at its own log position, at or just after the mark), so the
//! part can be read from whichever replica answers. A JSON record beside
//! the file, written last, says where the state was taken and what the file
//! holds ([`PartitionBackup`]): until it exists, the part is not ready. A
//! marker file says a part is being written; a reader that finds neither
//! after a short grace (a replica that restarted after the mark cleared its
//! parts and will never write this one) asks another replica.
//!
//! The files are the snapshot format at this build's data version: a restore
//! installs them as a follower installs a snapshot. Staged parts are deleted
//! when the backup is released, and at a node's start.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::snapshot::{header_of, write_snapshot};
use super::{Inner, NodeId, SharedState};
use crate::core::PartitionId;

/// How often a reader looks whether a part is staged yet.
const STAGED_POLL: Duration = Duration::from_millis(50);

/// One partition's part of a backup: where its state was taken, and what its
/// file holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionBackup {
    pub backup: String,
    pub partition: PartitionId,
    /// The log position the state was taken at (term, leader, index).
    pub term: u64,
    pub leader: NodeId,
    pub index: u64,
    /// The file's length and its SHA-256 (hex).
    pub bytes: u64,
    pub sha256: String,
    /// Live and final job records it holds.
    pub records: u64,
    pub data_version: u16,
}

const MAX_ID_LEN: usize = 64;

/// A backup id names folders (staged parts, a backup's files): 1 to 64
/// letters, digits, '.', '_' or '-', not starting with '.'.
pub fn check_id(id: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if id.is_empty() || id.len() > MAX_ID_LEN || !id.chars().all(allowed) || id.starts_with('.') {
        return Err(format!(
            "backup id {id:?} must be 1 to {MAX_ID_LEN} letters, digits, '.', '_' or '-', not starting with '.'"
        ));
    }
    Ok(())
}

/// Where a node stages its parts of backup `id`.
pub fn staged_dir(snapshot_dir: &Path, id: &str) -> PathBuf {
    snapshot_dir.join("backups").join(id)
}

fn part_paths(snapshot_dir: &Path, id: &str, partition: PartitionId) -> (PathBuf, PathBuf) {
    let dir = staged_dir(snapshot_dir, id);
    (dir.join(format!("p{partition}.snap")), dir.join(format!("p{partition}.json")))
}

/// Present while a part is being written: a reader waits for it then, and
/// otherwise only [`APPLY_GRACE`] for the mark to apply here.
fn staging_marker(snapshot_dir: &Path, id: &str, partition: PartitionId) -> PathBuf {
    staged_dir(snapshot_dir, id).join(format!("p{partition}.staging"))
}

/// How long a reader waits for a part that is not being written here: long
/// enough for a mark that committed to apply on this replica. A replica
/// that restarted after applying it has cleared its staged parts and will
/// never write this one; the reader then asks another replica.
const APPLY_GRACE: Duration = Duration::from_secs(5);

/// Stages the state `inner` holds (apply has just written it) for backup
/// `id`: the header and a view of the final records now, the file later.
pub(super) fn stage(shared: &SharedState, inner: &Inner, id: String) {
    let Some(at) = inner.last_applied else { return };
    let header = header_of(inner);
    let view = shared.store.owned_point_in_time();
    let (snapshot_dir, partition) = (shared.snapshot_dir.clone(), shared.partition);
    let marker = staging_marker(&snapshot_dir, &id, partition);
    let marked = std::fs::create_dir_all(staged_dir(&snapshot_dir, &id)).and_then(|()| std::fs::File::create(&marker));
    if let Err(error) = marked {
        tracing::error!(partition, backup = %id, "staging a backup failed: {error}");
        return;
    }
    tokio::task::spawn_blocking(move || {
        let mut part = PartitionBackup {
            backup: id,
            partition,
            term: at.leader_id.term,
            leader: at.leader_id.node_id,
            index: at.index,
            bytes: 0,
            sha256: String::new(),
            records: 0,
            data_version: crate::codec::DATA_VERSION,
        };
        let (file, record) = part_paths(&snapshot_dir, &part.backup, partition);
        let written = (|| -> Result<(), crate::storage::StorageError> {
            std::fs::create_dir_all(file.parent().expect("a file in a directory"))?;
            let temporary = file.with_extension("snap.tmp");
            let mut out =
                Digesting::new(std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&temporary)?));
            part.records = write_snapshot(partition, header, &view, part.data_version, &mut out)?;
            drop(view);
            (part.bytes, part.sha256) = (out.bytes, out.hex());
            out.into_inner().into_inner().map_err(|e| e.into_error())?.sync_all()?;
            std::fs::rename(&temporary, &file)?;
            write_json(&record, &part)?;
            Ok(())
        })();
        match written {
            Ok(()) => tracing::info!(
                partition,
                backup = %part.backup,
                index = part.index,
                bytes = part.bytes,
                "staged this partition's part of the backup"
            ),
            Err(error) => tracing::error!(partition, backup = %part.backup, "staging a backup failed: {error}"),
        }
        // Written or failed, it is not being written any more.
        let _ = std::fs::remove_file(&marker);
    });
}

fn write_json(path: &Path, part: &PartitionBackup) -> std::io::Result<()> {
    let temporary = path.with_extension("json.tmp");
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(&serde_json::to_vec_pretty(part).map_err(std::io::Error::other)?)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// This node's staged part of backup `id` for `partition`, once it is
/// staged, waiting until `until` for it; `None` when it is not there by then.
pub async fn open_staged(
    snapshot_dir: &Path,
    id: &str,
    partition: PartitionId,
    until: Instant,
) -> std::io::Result<Option<(PartitionBackup, std::fs::File)>> {
    checked(id)?;
    let (file, record) = part_paths(snapshot_dir, id, partition);
    let marker = staging_marker(snapshot_dir, id, partition);
    let until_applied = Instant::now() + APPLY_GRACE;
    loop {
        match std::fs::read(&record) {
            Ok(bytes) => {
                let part: PartitionBackup = serde_json::from_slice(&bytes).map_err(std::io::Error::other)?;
                return Ok(Some((part, std::fs::File::open(&file)?)));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let now = Instant::now();
        // The marker before the record: a part finishes by writing its
        // record, then removing its marker.
        if now + STAGED_POLL > until || (now > until_applied && !marker.exists() && !record.exists()) {
            return Ok(None);
        }
        tokio::time::sleep(STAGED_POLL).await;
    }
}

/// An id that would name a folder outside the staging folder (`..`, a
/// path) is refused: it arrives from a peer's request.
fn checked(id: &str) -> std::io::Result<()> {
    check_id(id).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
}

/// Deletes this node's staged parts of backup `id`.
pub fn release_staged(snapshot_dir: &Path, id: &str) -> std::io::Result<()> {
    checked(id)?;
    remove_staged(snapshot_dir, id)
}

fn remove_staged(snapshot_dir: &Path, id: &str) -> std::io::Result<()> {
    match std::fs::remove_dir_all(staged_dir(snapshot_dir, id)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Deletes the staged parts of every backup whose folder has not changed for
/// `ttl`: a backup whose `drover backup create` died before releasing them
/// (a finished or failed one releases its parts). Returns the ids deleted.
pub fn expire_staged(snapshot_dir: &Path, ttl: Duration) -> std::io::Result<Vec<String>> {
    let entries = match std::fs::read_dir(snapshot_dir.join("backups")) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut expired = Vec::new();
    for entry in entries {
        let entry = entry?;
        let age = entry.metadata()?.modified()?.elapsed().unwrap_or_default();
        if age >= ttl {
            let id = entry.file_name().to_string_lossy().into_owned();
            remove_staged(snapshot_dir, &id)?;
            expired.push(id);
        }
    }
    Ok(expired)
}

/// Deletes every staged part (a node's start: a backup in progress across a
/// restart is taken again).
pub fn clear_staged(snapshot_dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(snapshot_dir.join("backups")) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// A writer that counts and hashes what passes through it.
pub struct Digesting<W> {
    inner: W,
    digest: ring::digest::Context,
    pub bytes: u64,
}

impl<W: Write> Digesting<W> {
    pub fn new(inner: W) -> Self {
        Digesting { inner, digest: ring::digest::Context::new(&ring::digest::SHA256), bytes: 0 }
    }

    /// The SHA-256 of what was written, in hex.
    pub fn hex(&self) -> String {
        self.digest.clone().finish().as_ref().iter().map(|b| format!("{b:02x}")).collect()
    }

    pub fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: Write> Write for Digesting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.inner.write(buf)?;
        self.digest.update(&buf[..written]);
        self.bytes += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The bytes of a staged part's file in chunks of `chunk_bytes`, each with
/// whether it is the last (a file of a whole number of chunks ends with an
/// empty last one): what the gateway streams to a backup's reader and the
/// cluster service to another node's gateway.
pub fn staged_chunks(
    file: std::fs::File,
    chunk_bytes: usize,
) -> impl futures::Stream<Item = std::io::Result<(Vec<u8>, bool)>> + Send {
    use tokio::io::AsyncReadExt;
    let file = tokio::fs::File::from_std(file);
    futures::stream::unfold(Some(file), move |state| async move {
        let mut file = state?;
        let mut data = vec![0u8; chunk_bytes];
        let mut filled = 0;
        while filled < data.len() {
            match file.read(&mut data[filled..]).await {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) => return Some((Err(e), None)),
            }
        }
        data.truncate(filled);
        let last = filled < chunk_bytes;
        Some((Ok((data, last)), (!last).then_some(file)))
    })
}

#[cfg(test)]
mod expiry_tests {
    use super::*;

    #[test]
    fn staged_parts_older_than_their_ttl_are_deleted_and_newer_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        for id in ["abandoned", "running"] {
            std::fs::create_dir_all(staged_dir(dir.path(), id)).unwrap();
            std::fs::write(part_paths(dir.path(), id, 0).0, b"part").unwrap();
        }
        // The abandoned backup's folder last changed two hours ago.
        let two_hours_ago = std::time::SystemTime::now() - Duration::from_secs(7_200);
        let folder = std::fs::File::open(staged_dir(dir.path(), "abandoned")).unwrap();
        folder.set_modified(two_hours_ago).unwrap();
        let expired = expire_staged(dir.path(), Duration::from_secs(3_600)).unwrap();
        assert_eq!(expired, vec!["abandoned".to_string()]);
        assert!(!staged_dir(dir.path(), "abandoned").exists());
        assert!(part_paths(dir.path(), "running", 0).0.exists(), "a recent backup's parts stay");
        assert_eq!(expire_staged(&dir.path().join("none"), Duration::ZERO).unwrap(), Vec::<String>::new());
    }
}
