//! The data directory's record of the cluster it belongs to, `cluster.json`
//! beside the database: the settings fixed when the cluster formed, and how
//! far this node has got in forming or joining its partitions' groups (see
//! [`crate::raft::Formation`]). It lives outside RocksDB so that it survives a
//! database that lost its Raft state, which it exists to detect.

use std::io::Write;
use std::path::Path;

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};

use crate::raft::Formation;

const RECORD: &str = "cluster.json";

/// The layout of the records in the database. Raised whenever a stored record
/// changes shape; a node refuses a data directory of another format rather
/// than misread it.
/// 2: jobs carry their user, stages and checkpoints.
/// 3: jobs carry their session and retry back-off; partitions store worker
/// sessions and job schemas.
/// 4: history events name who set retries or cancelled, and which gateway
/// yielded an activation and why.
/// 5: jobs carry required and preferred labels; activations their taker.
/// 6: a job's spec is stored apart from its progress (`job_specs`), once.
pub const FORMAT: u32 = 6;

/// Records written before the format was recorded.
fn first_format() -> u32 {
    1
}

/// What a data directory was formed with; a node refuses to start on a data
/// directory formed with other settings.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Identity {
    pub node_id: u64,
    pub partitions: u32,
    pub replication_factor: u32,
    pub cluster_size: u32,
    /// [`crate::placement::digest`] of where the partitions'
    /// replicas are; 0 (and missing in older records) for the rotation of a
    /// cluster without locations.
    #[serde(default)]
    pub placement: u64,
}

#[derive(Serialize, Deserialize)]
struct Record {
    #[serde(flatten)]
    identity: Identity,
    /// Missing in records written before it existed: those are `New`, and
    /// become `Formed` at the next start, as their groups have Raft state.
    #[serde(default)]
    formation: Formation,
    #[serde(default = "first_format")]
    format: u32,
}

/// Checks the data directory against this node's settings, creating its record
/// on first start, and says what this start may do to form groups.
/// `join_existing` turns a data directory that has not formed its groups into
/// a joining one; it changes nothing once the groups are formed or joined.
pub fn open(dir: &Path, identity: Identity, join_existing: bool) -> anyhow::Result<Formation> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating data directory {}", dir.display()))?;
    let path = dir.join(RECORD);
    let stored = match std::fs::read_to_string(&path) {
        Ok(text) => {
            let record: Record = serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
            check_identity(dir, &record.identity, &identity)?;
            check_format(dir, record.format)?;
            Some(record.formation)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let formation = match stored {
        Some(Formation::Formed) => Formation::Formed,
        _ if join_existing => Formation::Joining,
        stored => stored.unwrap_or(Formation::New),
    };
    if stored != Some(formation) {
        write_record(dir, &Record { identity, formation, format: FORMAT })?;
    }
    Ok(formation)
}

/// Records that every group this node hosts has its Raft state here; from now
/// on a group without it is refused, never formed again. The caller syncs the
/// database first.
pub fn record_formed(dir: &Path, identity: Identity) -> anyhow::Result<()> {
    write_record(dir, &Record { identity, formation: Formation::Formed, format: FORMAT })
}

fn check_format(dir: &Path, format: u32) -> anyhow::Result<()> {
    if format != FORMAT {
        bail!(
            "data directory {} holds records of storage format {format}, and this build of Drover reads format \
             {FORMAT} only. Run the build that wrote it, or start this node on an empty data directory (move \
             this one away) and let it copy its partitions from the other nodes.",
            dir.display()
        );
    }
    Ok(())
}

fn check_identity(dir: &Path, stored: &Identity, identity: &Identity) -> anyhow::Result<()> {
    let same_but_placement = Identity { placement: 0, ..*stored } == Identity { placement: 0, ..*identity };
    if same_but_placement && stored != identity {
        bail!(
            "data directory {} was formed with other member locations (@REGION/ZONE in the member list): the \
             locations decide where each partition's replicas are, and these would move them. Start with the \
             member list the cluster formed with, or use an empty data directory.",
            dir.display()
        );
    }
    if stored != identity {
        bail!(
            "data directory {} was formed as node {} of a {}-node cluster with {} partitions and replication \
             factor {}, but this node is configured as node {} of {} nodes with {} partitions and replication \
             factor {}. These are fixed when a cluster forms: start with the original settings, or use an \
             empty data directory.",
            dir.display(),
            stored.node_id,
            stored.cluster_size,
            stored.partitions,
            stored.replication_factor,
            identity.node_id,
            identity.cluster_size,
            identity.partitions,
            identity.replication_factor
        );
    }
    Ok(())
}

/// Replaces the record durably: a crash leaves the old record or the new one,
/// never a torn one.
fn write_record(dir: &Path, record: &Record) -> anyhow::Result<()> {
    let path = dir.join(RECORD);
    let temporary = dir.join(format!("{RECORD}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(serde_json::to_string_pretty(record)?.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&temporary, &path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity { node_id: 1, partitions: 3, replication_factor: 3, cluster_size: 3, placement: 0 }
    }

    #[test]
    fn a_data_directory_forms_once_and_join_existing_changes_nothing_after() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(open(dir.path(), identity(), false).unwrap(), Formation::New);
        assert_eq!(open(dir.path(), identity(), false).unwrap(), Formation::New, "not formed until recorded");
        record_formed(dir.path(), identity()).unwrap();
        assert_eq!(open(dir.path(), identity(), false).unwrap(), Formation::Formed);
        assert_eq!(open(dir.path(), identity(), true).unwrap(), Formation::Formed);
    }

    #[test]
    fn an_empty_data_directory_joins_with_join_existing_and_stays_joining_until_formed() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(open(dir.path(), identity(), true).unwrap(), Formation::Joining);
        // Restarted without the flag before it caught up: still joining.
        assert_eq!(open(dir.path(), identity(), false).unwrap(), Formation::Joining);
        record_formed(dir.path(), identity()).unwrap();
        assert_eq!(open(dir.path(), identity(), false).unwrap(), Formation::Formed);
    }

    #[test]
    fn a_record_without_formation_reads_as_new() {
        let dir = tempfile::tempdir().unwrap();
        let old =
            format!(r#"{{"node_id":1,"partitions":3,"replication_factor":3,"cluster_size":3,"format":{FORMAT}}}"#);
        std::fs::write(dir.path().join(RECORD), old).unwrap();
        assert_eq!(open(dir.path(), identity(), false).unwrap(), Formation::New);
    }

    #[test]
    fn a_data_directory_of_another_storage_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let old = r#"{"node_id":1,"partitions":3,"replication_factor":3,"cluster_size":3,"formation":"formed"}"#;
        std::fs::write(dir.path().join(RECORD), old).unwrap();
        let error = open(dir.path(), identity(), false).unwrap_err().to_string();
        assert!(error.contains("storage format 1") && error.contains(&format!("format {FORMAT} only")), "{error}");
    }

    #[test]
    fn other_settings_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        open(dir.path(), identity(), false).unwrap();
        let other = Identity { partitions: 6, ..identity() };
        let error = open(dir.path(), other, false).unwrap_err().to_string();
        assert!(error.contains("was formed as node 1") && error.contains("3 partitions"), "{error}");
    }
}
