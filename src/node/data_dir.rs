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
/// The cluster plan this node last followed, once the plan was changed: its
/// members and placement replace the member list's at the next start.
const PLAN: &str = "plan.json";
/// The partition counts this node has seen in force.
const COUNTS: &str = "partition_counts.json";

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
/// 7: every record carries its data version ([`crate::codec`]); a directory
/// of format 6 is migrated in place at start.
pub const FORMAT: u32 = 7;
/// The format this build migrates from (every older one went through the
/// build of the format after it).
pub const MIGRATES_FROM: u32 = 6;

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
    /// Set while the records are migrated from this format to `format`: a
    /// build of the old format refuses the directory (it names the new
    /// one), and this build resumes the migration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    migrating_from: Option<u32>,
    /// The cluster version this node saw every member reach (0: none yet):
    /// it never speaks down to an older one again (`transport::Versions`).
    #[serde(default)]
    cluster_version: u16,
}

/// What the data directory says this start must do, besides forming.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Opened {
    pub formation: Formation,
    /// The format the records are to be migrated from before the database
    /// serves, when they are.
    pub migrate_from: Option<u32>,
    /// The cluster version recorded as reached (0: none).
    pub cluster_version: u16,
}

/// Checks the data directory against this node's settings, creating its record
/// on first start, and says what this start may do to form groups and
/// whether the records need migrating first. `join_existing` turns a data
/// directory that has not formed its groups into a joining one; it changes
/// nothing once the groups are formed or joined.
pub fn open(dir: &Path, identity: Identity, join: Join) -> anyhow::Result<Opened> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating data directory {}", dir.display()))?;
    let stored = read_record(dir)?;
    // Under a plan the members and placement are the plan's, not those the
    // directory formed with: the node's id and the partitions still hold.
    let planned = join == Join::Plan || read_plan(dir)?.is_some();
    let identity = match &stored {
        Some(record) if planned => {
            let fixed = |i: &Identity| (i.node_id, i.partitions, i.replication_factor);
            if fixed(&record.identity) != fixed(&identity) {
                check_identity(dir, &record.identity, &identity)?;
            }
            record.identity
        }
        _ => identity,
    };
    if let Some(record) = &stored {
        check_identity(dir, &record.identity, &identity)?;
        check_format(dir, record.format)?;
    }
    let formation = match stored.as_ref().map(|r| r.formation) {
        Some(Formation::Formed) => Formation::Formed,
        // It forms no group: each replica the plan places here is copied
        // from its leader (and votes once it caught up).
        _ if join == Join::Plan => Formation::Formed,
        _ if join == Join::Existing => Formation::Joining,
        stored => stored.unwrap_or(Formation::New),
    };
    let migrate_from = match &stored {
        Some(record) if record.format == MIGRATES_FROM => Some(MIGRATES_FROM),
        Some(record) => record.migrating_from,
        None => None,
    };
    let cluster_version = stored.as_ref().map_or(0, |r| r.cluster_version);
    let record = Record { identity, formation, format: FORMAT, migrating_from: migrate_from, cluster_version };
    if stored
        .as_ref()
        .is_none_or(|s| s.formation != formation || s.format != FORMAT || s.migrating_from != migrate_from)
    {
        // Before any record is rewritten: an older build now refuses the
        // directory instead of misreading a half-migrated one.
        write_record(dir, &record)?;
    }
    Ok(Opened { formation, migrate_from, cluster_version })
}

/// How a start on an empty data directory comes into the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Join {
    /// It forms the cluster with the other members (first start).
    Form,
    /// `--join-existing`: it re-seeds its groups from their leaders.
    Existing,
    /// `--join-plan`: it is being added; it hosts what the plan places here.
    Plan,
}

/// The cluster plan this node last followed, if the plan was ever changed.
pub fn read_plan(dir: &Path) -> anyhow::Result<Option<crate::core::ClusterPlan>> {
    read_json(dir, PLAN)
}

/// The partition counts this node has seen in force, each with when it
/// first saw it (see [`crate::context::Topology::key_counts`]).
pub fn read_counts(dir: &Path) -> anyhow::Result<Option<Vec<(u32, i64)>>> {
    read_json(dir, COUNTS)
}

/// Records the partition counts seen, durably.
pub fn record_counts(dir: &Path, counts: &[(u32, i64)]) -> anyhow::Result<()> {
    write_durably(dir, COUNTS, serde_json::to_string(counts)?.as_bytes())
}

fn read_json<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> anyhow::Result<Option<T>> {
    let path = dir.join(name);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Records the cluster plan this node follows now, durably.
pub fn record_plan(dir: &Path, plan: &crate::core::ClusterPlan) -> anyhow::Result<()> {
    write_durably(dir, PLAN, serde_json::to_string_pretty(plan)?.as_bytes())
}

fn read_record(dir: &Path) -> anyhow::Result<Option<Record>> {
    let path = dir.join(RECORD);
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok(Some(serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Rewrites the record with `change` made to it.
fn update(dir: &Path, change: impl FnOnce(&mut Record)) -> anyhow::Result<()> {
    let mut record = read_record(dir)?.with_context(|| format!("{} has no {RECORD}", dir.display()))?;
    change(&mut record);
    write_record(dir, &record)
}

/// Records that every group this node hosts has its Raft state here; from now
/// on a group without it is refused, never formed again. The caller syncs the
/// database first.
pub fn record_formed(dir: &Path, identity: Identity) -> anyhow::Result<()> {
    update(dir, |record| {
        record.identity = identity;
        record.formation = Formation::Formed;
    })
}

/// Creates the record of a data directory restored from a backup taken at
/// cluster version `cluster_version`: formed (its groups' Raft state is in
/// the database), at this build's format.
pub fn record_restored(dir: &Path, identity: Identity, cluster_version: u16) -> anyhow::Result<()> {
    let record =
        Record { identity, formation: Formation::Formed, format: FORMAT, migrating_from: None, cluster_version };
    write_record(dir, &record)
}

/// Records that the records' migration finished (the caller synced them).
pub fn record_migrated(dir: &Path) -> anyhow::Result<()> {
    update(dir, |record| record.migrating_from = None)
}

/// Records that every member of the cluster reached data version `version`.
pub fn record_cluster_version(dir: &Path, version: u16) -> anyhow::Result<()> {
    update(dir, |record| record.cluster_version = record.cluster_version.max(version))
}

fn check_format(dir: &Path, format: u32) -> anyhow::Result<()> {
    if format > FORMAT {
        bail!(
            "data directory {} holds records of storage format {format}, written by a newer build of Drover; this build reads formats {MIGRATES_FROM} (migrating them) and {FORMAT}. Run a build of format {format} or later; going back to an older build after an upgrade is not possible (docs/upgrades.md).",
            dir.display()
        );
    }
    if format < MIGRATES_FROM {
        bail!(
            "data directory {} holds records of storage format {format}; this build migrates format {MIGRATES_FROM} and reads {FORMAT}. Upgrade through the builds in between, one format at a time (each migrates the one before it), or start this node on an empty data directory and let it copy its partitions from the other nodes.",
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
    write_durably(dir, RECORD, serde_json::to_string_pretty(record)?.as_bytes())
}

fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
    let path = dir.join(name);
    let temporary = dir.join(format!("{name}.tmp"));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
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
        let formation =
            |join| open(dir.path(), identity(), if join { Join::Existing } else { Join::Form }).unwrap().formation;
        assert_eq!(formation(false), Formation::New);
        assert_eq!(formation(false), Formation::New, "not formed until recorded");
        record_formed(dir.path(), identity()).unwrap();
        assert_eq!(formation(false), Formation::Formed);
        assert_eq!(formation(true), Formation::Formed);
    }

    #[test]
    fn an_empty_data_directory_joins_with_join_existing_and_stays_joining_until_formed() {
        let dir = tempfile::tempdir().unwrap();
        let formation =
            |join| open(dir.path(), identity(), if join { Join::Existing } else { Join::Form }).unwrap().formation;
        assert_eq!(formation(true), Formation::Joining);
        // Restarted without the flag before it caught up: still joining.
        assert_eq!(formation(false), Formation::Joining);
        record_formed(dir.path(), identity()).unwrap();
        assert_eq!(formation(false), Formation::Formed);
    }

    #[test]
    fn a_record_without_formation_reads_as_new() {
        let dir = tempfile::tempdir().unwrap();
        let old =
            format!(r#"{{"node_id":1,"partitions":3,"replication_factor":3,"cluster_size":3,"format":{FORMAT}}}"#);
        std::fs::write(dir.path().join(RECORD), old).unwrap();
        assert_eq!(open(dir.path(), identity(), Join::Form).unwrap().formation, Formation::New);
    }

    #[test]
    fn a_data_directory_of_the_previous_format_migrates_until_recorded_and_older_ones_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let six =
            r#"{"node_id":1,"partitions":3,"replication_factor":3,"cluster_size":3,"formation":"formed","format":6}"#;
        std::fs::write(dir.path().join(RECORD), six).unwrap();
        let opened = open(dir.path(), identity(), Join::Form).unwrap();
        assert_eq!((opened.formation, opened.migrate_from), (Formation::Formed, Some(6)));
        let record = std::fs::read_to_string(dir.path().join(RECORD)).unwrap();
        assert!(
            record.contains(&format!("\"format\": {FORMAT}")) && record.contains("\"migrating_from\": 6"),
            "{record}"
        );
        // Interrupted: the next start migrates again, resuming.
        assert_eq!(open(dir.path(), identity(), Join::Form).unwrap().migrate_from, Some(6));
        record_migrated(dir.path()).unwrap();
        assert_eq!(open(dir.path(), identity(), Join::Form).unwrap().migrate_from, None);
        record_cluster_version(dir.path(), 7).unwrap();
        record_formed(dir.path(), identity()).unwrap();
        assert_eq!(open(dir.path(), identity(), Join::Form).unwrap().cluster_version, 7, "kept by later records");

        let old = r#"{"node_id":1,"partitions":3,"replication_factor":3,"cluster_size":3,"formation":"formed"}"#;
        std::fs::write(dir.path().join(RECORD), old).unwrap();
        let error = open(dir.path(), identity(), Join::Form).unwrap_err().to_string();
        assert!(error.contains("storage format 1") && error.contains("one format at a time"), "{error}");
        let newer = format!(
            r#"{{"node_id":1,"partitions":3,"replication_factor":3,"cluster_size":3,"format":{}}}"#,
            FORMAT + 1
        );
        std::fs::write(dir.path().join(RECORD), newer).unwrap();
        let error = open(dir.path(), identity(), Join::Form).unwrap_err().to_string();
        assert!(error.contains("written by a newer build"), "{error}");
    }

    #[test]
    fn other_settings_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        open(dir.path(), identity(), Join::Form).unwrap();
        let other = Identity { partitions: 6, ..identity() };
        let error = open(dir.path(), other, Join::Form).unwrap_err().to_string();
        assert!(error.contains("was formed as node 1") && error.contains("3 partitions"), "{error}");
    }

    #[test]
    fn under_a_plan_the_members_may_change_but_the_node_and_partitions_may_not() {
        let dir = tempfile::tempdir().unwrap();
        open(dir.path(), identity(), Join::Form).unwrap();
        let grown = Identity { cluster_size: 5, placement: 42, ..identity() };
        assert!(open(dir.path(), grown, Join::Form).is_err(), "no plan yet: the member list is fixed");
        let members = [(1, crate::core::Member { addr: "a:1".into(), ..Default::default() })].into();
        record_plan(dir.path(), &crate::core::ClusterPlan::initial(members, vec![vec![1]; 3], 3)).unwrap();
        assert_eq!(read_plan(dir.path()).unwrap().unwrap().members.len(), 1);
        open(dir.path(), grown, Join::Form).unwrap();
        let other = Identity { partitions: 6, ..grown };
        assert!(open(dir.path(), other, Join::Form).unwrap_err().to_string().contains("3 partitions"));
        let joined = tempfile::tempdir().unwrap();
        assert_eq!(open(joined.path(), identity(), Join::Plan).unwrap().formation, Formation::Formed);
    }
}
