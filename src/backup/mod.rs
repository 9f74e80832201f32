//! Backups as `drover backup` keeps them: where they are stored (a
//! directory or an S3-compatible bucket, [`Destination`]), what a backup holds
//! ([`Manifest`] and one part per partition), and the commands' work —
//! [`create`] through a gateway, [`verify`], [`list`], [`delete`], and
//! [`restore`] of a node's data directory for a new cluster.
//!
//! A backup `ID` in a destination is a folder `ID/` of files (in a bucket,
//! objects named `PREFIX/ID/...`):
//! `p<N>.snap` (partition N's state at its mark, in the snapshot format)
//! and `manifest.json`, written last: a backup without it is incomplete and
//! is neither verified nor restored. The cluster's side (marks in the logs,
//! staged parts) is [`crate::gateway::JobApi::start_backup`] and
//! [`crate::raft::PartitionBackup`]; docs/backups.md is the operator's view.

mod create;
mod restore;
pub mod s3;

use std::io::Write as _;
use std::path::{Path, PathBuf};

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
    /// The partition count the cluster formed with, when partitions were
    /// added since (0: `partitions_count`, as before partitions could be).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub formed_partitions: u32,
    pub replication_factor: u32,
    pub cluster_size: u32,
    /// One per partition, by partition id.
    pub parts: Vec<PartitionBackup>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Manifest {
    /// The partition count the backed-up cluster formed with.
    pub fn formed_partitions(&self) -> u32 {
        match self.formed_partitions {
            0 => self.partitions_count,
            formed => formed,
        }
    }
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
        if self.formed_partitions > self.partitions_count {
            bail!(
                "the manifest of backup {id} says its cluster formed with {} partitions and had {} when backed up: \
                 partitions are only ever added, so it is damaged",
                self.formed_partitions,
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

/// A place backups are kept: a directory (local, or a mounted volume), or
/// an S3-compatible bucket ([`s3`]). In a directory each file is written
/// beside its final name and renamed into place once synced, so a name never
/// holds half a file; in a bucket each object is put whole, from a local
/// file the part was first written to.
pub struct Destination {
    place: Place,
}

enum Place {
    Dir(PathBuf),
    Bucket(s3::Bucket),
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.place {
            Place::Dir(dir) => write!(f, "{}", dir.display()),
            Place::Bucket(bucket) => write!(f, "{bucket}"),
        }
    }
}

/// A file of a backup being written, with the length and SHA-256 of what it
/// holds: [`Destination::finish`] puts it in place.
pub(crate) struct Staged {
    out: std::io::BufWriter<std::fs::File>,
    /// Where a bucket's object waits to be put (deleted when dropped).
    spool: Option<tempfile::TempPath>,
    digest: ring::digest::Context,
    bytes: u64,
}

impl Staged {
    /// The length and SHA-256 (hex) of what was written so far.
    pub(crate) fn digest(&self) -> (u64, String) {
        (self.bytes, hex(self.digest.clone().finish().as_ref()))
    }
}

impl std::io::Write for Staged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.digest.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// The length and SHA-256 (hex) of what `input` holds from where it is.
fn digest_of(input: &mut impl std::io::Read) -> std::io::Result<(u64, String)> {
    let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buffer = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = input.read(&mut buffer)?;
        if n == 0 {
            return Ok((bytes, hex(digest.finish().as_ref())));
        }
        digest.update(&buffer[..n]);
        bytes += n as u64;
    }
}

/// `seconds` since the epoch as a civil date (proleptic Gregorian, UTC):
/// (year, month, day, h, m, s).
pub(crate) fn civil(seconds: i64) -> (i64, i64, i64, i64, i64, i64) {
    let (year, month, day, h, m, s, _) = crate::calendar::utc_parts(seconds.saturating_mul(1000));
    (year, i64::from(month), i64::from(day), h, m, s)
}

impl Destination {
    /// A directory, or `s3://BUCKET/PREFIX` (see [`s3`] for the environment
    /// it reads).
    pub fn open(spec: &str) -> anyhow::Result<Destination> {
        if spec.starts_with("s3://") {
            return Ok(Destination { place: Place::Bucket(s3::Bucket::from_url(spec)?) });
        }
        if let Some((scheme, _)) = spec.split_once("://") {
            bail!("backup destination {spec}: {scheme}:// is not supported; give a directory or s3://BUCKET/PREFIX");
        }
        let dir = PathBuf::from(spec);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating the backup directory {}", dir.display()))?;
        Ok(Destination { place: Place::Dir(dir) })
    }

    fn path(dir: &Path, id: &str, name: &str) -> PathBuf {
        dir.join(id).join(name)
    }

    fn part_name(partition: u32) -> String {
        format!("p{partition}.snap")
    }

    /// A writer for `id/name`; [`Destination::finish`] puts it in place.
    pub(crate) fn create(&self, id: &str, name: &str) -> anyhow::Result<Staged> {
        let (file, spool) = match &self.place {
            Place::Dir(dir) => {
                let folder = dir.join(id);
                std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
                let temporary = Self::path(dir, id, &format!("{name}.tmp"));
                let file =
                    std::fs::File::create(&temporary).with_context(|| format!("creating {}", temporary.display()))?;
                (file, None)
            }
            Place::Bucket(_) => {
                let (file, path) = tempfile::NamedTempFile::new().context("creating a local file")?.into_parts();
                (file, Some(path))
            }
        };
        Ok(Staged {
            out: std::io::BufWriter::with_capacity(1 << 20, file),
            spool,
            digest: ring::digest::Context::new(&ring::digest::SHA256),
            bytes: 0,
        })
    }

    /// Syncs what `staged` holds and puts it at `id/name`, durably.
    pub(crate) async fn finish(&self, id: &str, name: &str, staged: Staged) -> anyhow::Result<()> {
        let digest = staged.digest();
        let file = staged.out.into_inner().map_err(|e| e.into_error())?;
        match &self.place {
            Place::Dir(dir) => {
                let path = Self::path(dir, id, name);
                let done = || -> std::io::Result<()> {
                    file.sync_all()?;
                    std::fs::rename(Self::path(dir, id, &format!("{name}.tmp")), &path)?;
                    std::fs::File::open(dir.join(id))?.sync_all()?;
                    std::fs::File::open(dir)?.sync_all()
                };
                done().with_context(|| format!("writing {}", path.display()))
            }
            Place::Bucket(bucket) => {
                drop(file);
                let spool = staged.spool.context("a bucket's file is spooled")?;
                let key = bucket.key(&format!("{id}/{name}"));
                bucket.put_file(&key, &spool, digest).await.with_context(|| format!("putting {bucket}{id}/{name}"))
            }
        }
    }

    /// File `id/name`, or `None` if there is none: a bucket's object is
    /// copied into a local temporary file first.
    async fn open_file(&self, id: &str, name: &str) -> anyhow::Result<Option<std::fs::File>> {
        match &self.place {
            Place::Dir(dir) => match std::fs::File::open(Self::path(dir, id, name)) {
                Ok(file) => Ok(Some(file)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e).with_context(|| format!("opening {}", Self::path(dir, id, name).display())),
            },
            Place::Bucket(bucket) => bucket.get_file(&bucket.key(&format!("{id}/{name}"))).await,
        }
    }

    /// Backup `id`'s manifest; an error that says so when the backup is
    /// missing or incomplete.
    pub async fn manifest(&self, id: &str) -> anyhow::Result<Manifest> {
        match self.find(id).await? {
            Found::Complete(manifest) => Ok(manifest),
            Found::Incomplete => bail!(
                "backup {id} in {self} is incomplete: it has no {MANIFEST} (its creation did not finish). Delete \
                 it and take another."
            ),
            Found::Missing => bail!("there is no backup {id} in {self} (drover backup list --from {self})"),
        }
    }

    async fn find(&self, id: &str) -> anyhow::Result<Found> {
        check_id(id)?;
        let bytes = match &self.place {
            Place::Dir(dir) => {
                let path = Self::path(dir, id, MANIFEST);
                match std::fs::read(&path) {
                    Ok(bytes) => Some(bytes),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                    Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
                }
            }
            Place::Bucket(bucket) => bucket.get_bytes(&bucket.key(&format!("{id}/{MANIFEST}"))).await?,
        };
        let Some(bytes) = bytes else {
            return Ok(if self.files(id).await?.is_empty() { Found::Missing } else { Found::Incomplete });
        };
        let manifest: Manifest = serde_json::from_slice(&bytes)
            .with_context(|| format!("the manifest of backup {id} in {self} is not a backup manifest: damaged"))?;
        manifest.check(id)?;
        Ok(Found::Complete(manifest))
    }

    /// The names of backup `id`'s files.
    async fn files(&self, id: &str) -> anyhow::Result<Vec<String>> {
        match &self.place {
            Place::Dir(dir) => match std::fs::read_dir(dir.join(id)) {
                Ok(entries) => Ok(entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
                Err(e) => Err(e).with_context(|| format!("listing backup {id} in {self}")),
            },
            Place::Bucket(bucket) => {
                let folder = bucket.key(&format!("{id}/"));
                let (keys, _) = bucket.list(&folder, None).await?;
                Ok(keys.into_iter().filter_map(|k| k.strip_prefix(&folder).map(str::to_string)).collect())
            }
        }
    }

    /// The ids of the backups (complete or not) in the destination.
    async fn ids(&self) -> anyhow::Result<Vec<String>> {
        let mut ids: Vec<String> = match &self.place {
            Place::Dir(dir) => std::fs::read_dir(dir)
                .with_context(|| format!("listing {self}"))?
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter_map(|e| e.file_name().into_string().ok())
                .collect(),
            Place::Bucket(bucket) => {
                let (_, prefixes) = bucket.list(&bucket.key(""), Some("/")).await?;
                let within = bucket.key("");
                prefixes.iter().filter_map(|p| p.strip_prefix(&within)?.strip_suffix('/').map(str::to_string)).collect()
            }
        };
        ids.sort();
        Ok(ids)
    }

    async fn put_manifest(&self, manifest: &Manifest) -> anyhow::Result<()> {
        let mut out = self.create(&manifest.backup_id, MANIFEST)?;
        out.write_all(&serde_json::to_vec_pretty(manifest)?)?;
        self.finish(&manifest.backup_id, MANIFEST, out).await
    }

    /// Deletes file `id/name`.
    async fn remove(&self, id: &str, name: &str) -> anyhow::Result<()> {
        match &self.place {
            Place::Dir(dir) => {
                let path = Self::path(dir, id, name);
                std::fs::remove_file(&path).with_context(|| format!("deleting {}", path.display()))?;
                std::fs::File::open(dir.join(id))?.sync_all()?;
                Ok(())
            }
            Place::Bucket(bucket) => bucket.delete(&bucket.key(&format!("{id}/{name}"))).await,
        }
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
pub async fn list(destination: &Destination) -> anyhow::Result<Vec<Listed>> {
    let mut backups = Vec::new();
    for id in destination.ids().await? {
        backups.push(match destination.find(&id).await {
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
pub async fn delete(destination: &Destination, id: &str) -> anyhow::Result<usize> {
    check_id(id)?;
    let mut files = destination.files(id).await?;
    if files.is_empty() {
        bail!("there is no backup {id} in {destination}");
    }
    // The manifest first: a deletion cut short leaves an incomplete backup.
    files.sort_by_key(|name| name != MANIFEST);
    for name in &files {
        destination.remove(id, name).await?;
    }
    if let Place::Dir(dir) = &destination.place {
        let folder = dir.join(id);
        std::fs::remove_dir(&folder).with_context(|| format!("deleting {}", folder.display()))?;
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(files.len())
}

#[cfg(test)]
mod manifest_tests {
    use super::Manifest;
    use crate::raft::PartitionBackup;

    #[test]
    fn a_manifest_that_formed_with_more_partitions_than_it_has_is_damaged() {
        let part = |partition| PartitionBackup {
            backup: "b".into(),
            partition,
            term: 1,
            leader: 0,
            index: 1,
            bytes: 0,
            sha256: String::new(),
            records: 0,
            data_version: crate::codec::DATA_VERSION,
        };
        let mut manifest = Manifest {
            backup_id: "b".into(),
            created_at_ms: 0,
            drover_version: String::new(),
            cluster_version: crate::codec::DATA_VERSION,
            partitions_count: 4,
            formed_partitions: 2,
            replication_factor: 1,
            cluster_size: 1,
            parts: (0..4).map(part).collect(),
        };
        manifest.check("b").expect("grown from 2 to 4");
        manifest.formed_partitions = 8;
        let error = manifest.check("b").expect_err("formed with more than it has").to_string();
        assert!(error.contains("formed with 8 partitions and had 4") && error.contains("damaged"), "{error}");
    }
}
