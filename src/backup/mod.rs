//! Backups as `drover backup` keeps them: where they are stored (a
//! directory, [`Destination`]), what a backup holds
//! ([`Manifest`] and one part per partition), and the commands' work —
//! [`create`] through a gateway, [`verify`], [`list`], [`delete`], and
//! [`restore`] of a node's data directory for a new cluster.
//!
//! A backup `ID` in a destination is a folder `ID/` of files:
//! `p<N>.snap` (partition N's state at its mark, in the snapshot format)
//! and `manifest.json`, written last: a backup without it is incomplete and
//! is neither verified nor restored. The cluster's side (marks in the logs,
//! staged parts) is [`crate::gateway::JobApi::start_backup`] and
//! [`crate::raft::PartitionBackup`]; docs/backups.md is the operator's view.

mod create;
mod restore;

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};

pub use create::{create, default_id};
pub use restore::{restore, verify, Verified};

use crate::raft::PartitionBackup;

const MANIFEST: &str = "manifest.json";
/// A backup id names a folder (the rule the gateway applies too).
pub fn check_id(id: &str) -> anyhow::Result<()> {
    crate::raft::check_backup_id(id).map_err(anyhow::Error::msg)
}

/// Lower-case hex of a digest.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a backup holds: the cluster's shape when it was taken, and where
/// each partition's part was taken (log position) and what it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub backup_id: String,
    /// When `drover backup create` finished it, milliseconds since the epoch.
    pub created_at_ms: u64,
    /// The `drover` build that wrote it.
    pub drover_version: String,
    /// The cluster version it was taken at; a restored cluster starts there.
    pub cluster_version: u16,
    pub partitions_count: u32,
    pub replication_factor: u32,
    pub cluster_size: u32,
    /// One per partition, by partition id.
    pub parts: Vec<PartitionBackup>,
}

impl Manifest {
    /// The jobs (live and final) the backup holds.
    pub fn records(&self) -> u64 {
        self.parts.iter().map(|p| p.records).sum()
    }

    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.bytes).sum()
    }

    fn check(&self, id: &str) -> anyhow::Result<()> {
        if self.backup_id != id {
            bail!("the manifest of backup {id} names backup {:?}: it was copied or renamed wrongly", self.backup_id);
        }
        let ids: Vec<u32> = self.parts.iter().map(|p| p.partition).collect();
        if ids != (0..self.partitions_count).collect::<Vec<_>>() {
            bail!(
                "the manifest of backup {id} lists parts for partitions {ids:?}, not one for each of its {} \
                 partitions: it is damaged",
                self.partitions_count
            );
        }
        if let Some(part) = self.parts.iter().find(|p| p.data_version > crate::codec::DATA_VERSION) {
            bail!(
                "backup {id}'s partition {} was written at data version {}; this build reads {} and older. \
                 Restore it with a newer build of Drover.",
                part.partition,
                part.data_version,
                crate::codec::DATA_VERSION
            );
        }
        Ok(())
    }
}

/// A place backups are kept: a directory (local, or a mounted volume).
/// Each file is written beside its final name and renamed into place once
/// synced, so a name never holds half a file.
pub struct Destination {
    dir: PathBuf,
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.dir.display())
    }
}

impl Destination {
    pub fn open(spec: &str) -> anyhow::Result<Destination> {
        if let Some((scheme, _)) = spec.split_once("://") {
            bail!(
                "backup destination {spec}: {scheme}:// is not supported by this build; give a directory (an \
                 object store's bucket can be mounted as one)"
            );
        }
        let dir = PathBuf::from(spec);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating the backup directory {}", dir.display()))?;
        Ok(Destination { dir })
    }

    fn path(&self, id: &str, name: &str) -> PathBuf {
        self.dir.join(id).join(name)
    }

    fn part_name(partition: u32) -> String {
        format!("p{partition}.snap")
    }

    /// A writer for `id/name`; [`Destination::finish`] puts it in place.
    fn create(&self, id: &str, name: &str) -> anyhow::Result<std::io::BufWriter<std::fs::File>> {
        let folder = self.dir.join(id);
        std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
        let temporary = self.path(id, &format!("{name}.tmp"));
        let file = std::fs::File::create(&temporary).with_context(|| format!("creating {}", temporary.display()))?;
        Ok(std::io::BufWriter::with_capacity(1 << 20, file))
    }

    /// Syncs what `out` wrote and renames it to `id/name`, durably.
    fn finish(&self, id: &str, name: &str, out: std::io::BufWriter<std::fs::File>) -> anyhow::Result<()> {
        let path = self.path(id, name);
        let done = || -> std::io::Result<()> {
            out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            std::fs::rename(self.path(id, &format!("{name}.tmp")), &path)?;
            std::fs::File::open(self.dir.join(id))?.sync_all()?;
            std::fs::File::open(&self.dir)?.sync_all()
        };
        done().with_context(|| format!("writing {}", path.display()))
    }

    /// Backup `id`'s manifest; an error that says so when the backup is
    /// missing or incomplete.
    pub async fn manifest(&self, id: &str) -> anyhow::Result<Manifest> {
        match self.find(id)? {
            Found::Complete(manifest) => Ok(manifest),
            Found::Incomplete => bail!(
                "backup {id} in {self} is incomplete: it has no {MANIFEST} (its creation did not finish). Delete \
                 it and take another."
            ),
            Found::Missing => bail!("there is no backup {id} in {self} (drover backup list --from {self})"),
        }
    }

    fn find(&self, id: &str) -> anyhow::Result<Found> {
        check_id(id)?;
        let path = self.path(id, MANIFEST);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(if self.dir.join(id).exists() { Found::Incomplete } else { Found::Missing });
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is not a backup manifest: damaged", path.display()))?;
        manifest.check(id)?;
        Ok(Found::Complete(manifest))
    }

    fn put_manifest(&self, manifest: &Manifest) -> anyhow::Result<()> {
        let mut out = self.create(&manifest.backup_id, MANIFEST)?;
        out.write_all(&serde_json::to_vec_pretty(manifest)?)?;
        self.finish(&manifest.backup_id, MANIFEST, out)
    }
}

enum Found {
    Complete(Manifest),
    Incomplete,
    Missing,
}

/// One backup as [`list`] finds it.
#[derive(Debug)]
pub enum Listed {
    Complete(Manifest),
    /// Files without a manifest: a creation that did not finish.
    Incomplete {
        backup_id: String,
    },
    /// A manifest that does not read.
    Damaged {
        backup_id: String,
        error: String,
    },
}

/// The backups in `destination`, by id.
pub fn list(destination: &Destination) -> anyhow::Result<Vec<Listed>> {
    let entries = std::fs::read_dir(&destination.dir).with_context(|| format!("listing {destination}"))?;
    let mut ids: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    ids.sort();
    let mut backups = Vec::new();
    for id in ids {
        backups.push(match destination.find(&id) {
            Ok(Found::Complete(manifest)) => Listed::Complete(manifest),
            Ok(Found::Incomplete) => Listed::Incomplete { backup_id: id },
            Ok(Found::Missing) => continue,
            Err(e) => Listed::Damaged { backup_id: id, error: format!("{e:#}") },
        });
    }
    Ok(backups)
}

/// Deletes backup `id` from `destination`: its manifest first, so that a
/// deletion cut short leaves an incomplete backup, never one that looks
/// whole. Returns the files deleted.
pub fn delete(destination: &Destination, id: &str) -> anyhow::Result<usize> {
    check_id(id)?;
    let folder = destination.dir.join(id);
    if !folder.is_dir() {
        bail!("there is no backup {id} in {destination}");
    }
    let mut files = 0;
    let manifest = destination.path(id, MANIFEST);
    if manifest.exists() {
        std::fs::remove_file(&manifest).with_context(|| format!("deleting {}", manifest.display()))?;
        std::fs::File::open(&folder)?.sync_all()?;
        files += 1;
    }
    for entry in std::fs::read_dir(&folder)? {
        std::fs::remove_file(entry?.path())?;
        files += 1;
    }
    std::fs::remove_dir(&folder).with_context(|| format!("deleting {}", folder.display()))?;
    Ok(files)
}
