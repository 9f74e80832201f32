//! Reading a backup back: [`verify`] (every part whole, as long and with the
//! SHA-256 the manifest says, and decoding as a restore would read it) and
//! [`restore`] of one node's data directory for a new cluster.
//!
//! A restore builds the node's data directory beside the one it is for
//! (`DATA_DIR.restoring`), writes each partition this node hosts from its
//! part as a follower installs a snapshot, as the whole state of a new group
//! of the new cluster's replicas, records the directory as formed at the
//! backup's cluster version, and only then renames it into place. A restore
//! cut short leaves no data directory a node would start on, and the next
//! one starts over.

use std::io::{BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};

use super::{Destination, Manifest};
use crate::config::NodeConfig;
use crate::core::{ClusterPlan, Member, PlanChange};
use crate::node::{data_dir, Layout};
use crate::raft::PartitionBackup;

/// What [`verify`] read.
#[derive(Debug)]
pub struct Verified {
    pub manifest: Manifest,
    /// Each part's records as decoded (equal to the manifest's).
    pub records: u64,
}

/// Opens `part`'s file, once its length and SHA-256 are what the manifest
/// says (read through once to check them).
async fn open_part(destination: &Destination, part: &PartitionBackup) -> anyhow::Result<std::fs::File> {
    let name = Destination::part_name(part.partition);
    let missing = || format!("backup {}'s part for partition {} ({destination} {name})", part.backup, part.partition);
    let mut file =
        destination.open_file(&part.backup, &name).await?.with_context(|| format!("{} is missing", missing()))?;
    let (bytes, sha256) = super::digest_of(&mut file).with_context(|| format!("reading {}", missing()))?;
    if bytes != part.bytes {
        bail!("{} is {bytes} bytes, but the manifest says {}: it is truncated or damaged", missing(), part.bytes);
    }
    if sha256 != part.sha256 {
        bail!("{} has SHA-256 {sha256}, but the manifest says {}: it is damaged", missing(), part.sha256);
    }
    file.seek(SeekFrom::Start(0))?;
    Ok(file)
}

/// Reads every part of backup `id` as a restore would and checks each one
/// whole; an error names the first part that is not.
pub async fn verify(destination: &Destination, id: &str) -> anyhow::Result<Verified> {
    let manifest = destination.manifest(id).await?;
    let mut records = 0;
    for part in &manifest.parts {
        let file = open_part(destination, part).await?;
        let size = part.bytes;
        let read = tokio::task::spawn_blocking(move || {
            crate::raft::check_snapshot_from(&mut BufReader::with_capacity(1 << 20, file), size)
        })
        .await?
        .map_err(|e| anyhow::anyhow!("backup {id}'s part for partition {} does not read: {e}", part.partition))?;
        if read as u64 != part.records {
            bail!(
                "backup {id}'s part for partition {} holds {read} jobs, but the manifest says {}",
                part.partition,
                part.records
            );
        }
        records += read as u64;
    }
    Ok(Verified { manifest, records })
}

/// Fills `config`'s (empty) data directory from backup `id`: the partitions
/// this node hosts in the new cluster `config` describes. Every node of the
/// new cluster is restored so, then started. Returns the jobs restored here.
pub async fn restore(destination: &Destination, id: &str, config: &NodeConfig) -> anyhow::Result<u64> {
    let manifest = destination.manifest(id).await?;
    if manifest.formed_partitions() != config.partitions {
        bail!(
            "backup {id} is of a cluster formed with {} partitions; restore it into a cluster of {} partitions \
             (--partitions), as a job's key names its partition{}",
            manifest.formed_partitions(),
            manifest.formed_partitions(),
            match manifest.partitions_count {
                count if count != manifest.formed_partitions() => {
                    format!(" (the {count} it had when backed up are restored: partitions were added to it)")
                }
                _ => String::new(),
            }
        );
    }
    let dir = &config.data_dir;
    if std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some()) {
        bail!(
            "data directory {} is not empty: a restore builds a new node's data directory, and never writes over \
             one (move it away first)",
            dir.display()
        );
    }
    let staging = staging_dir(dir);
    match std::fs::remove_dir_all(&staging) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("clearing {} from a restore cut short", staging.display()))
        }
        _ => {}
    }
    std::fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    let (layout, plan) = restored_layout(config, &manifest);
    if let Some(plan) = &plan {
        data_dir::record_plan(&staging, plan)?;
    }
    let restored = match fill(destination, &manifest, config, (&layout, plan.as_ref()), &staging).await {
        Ok(restored) => restored,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(e);
        }
    };
    data_dir::record_restored(&staging, layout.identity, manifest.cluster_version)?;
    std::fs::rename(&staging, dir)
        .with_context(|| format!("moving the restored {} to {}", staging.display(), dir.display()))?;
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(restored)
}

/// Where the new cluster's partitions go: its member list's placement; and,
/// when the backed-up cluster had partitions added, a cluster plan placing
/// the added ones too (by the same rules, the same on every node), which
/// partition 0 keeps and every node follows from its start.
fn restored_layout(config: &NodeConfig, manifest: &Manifest) -> (Layout, Option<ClusterPlan>) {
    let cluster_addr = config.cluster_addr.to_string();
    let layout = Layout::of(config, &cluster_addr);
    if manifest.partitions_count == config.partitions {
        return (layout, None);
    }
    let members = layout
        .members
        .iter()
        .map(|(n, addr)| {
            let at = config.locations.get(n).cloned().unwrap_or_default();
            (*n, Member { addr: addr.clone(), region: at.region, zone: at.zone })
        })
        .collect();
    let formed = ClusterPlan::initial(members, layout.placement.clone(), config.replication_factor);
    let grown = formed
        .changed(&PlanChange::AddPartitions { to: manifest.partitions_count })
        .expect("more partitions than the cluster formed with, none forming");
    let first_added = config.partitions as usize;
    let plan =
        grown.reported(config.partitions, &grown.target[first_added].clone()).expect("the added partitions form");
    (Layout::planned(config, &cluster_addr, Some(&plan)), Some(plan))
}

/// Writes the partitions this node hosts into a database in `staging`.
async fn fill(
    destination: &Destination,
    manifest: &Manifest,
    config: &NodeConfig,
    (layout, plan): (&Layout, Option<&ClusterPlan>),
    staging: &Path,
) -> anyhow::Result<u64> {
    let store = crate::storage::Store::open_with(&staging.join("db"), config.storage_memory)
        .with_context(|| format!("creating the database in {}", staging.display()))?;
    let mut restored = 0;
    for partition in crate::placement::partitions_of(&layout.placement, config.node_id) {
        let part = manifest.parts[partition as usize].clone();
        let file = open_part(destination, &part).await?;
        let voters = layout.placement[partition as usize].iter().map(|n| (*n, layout.members[n].clone())).collect();
        let (store, node, plan) = (std::sync::Arc::clone(&store), config.node_id, plan.cloned());
        let jobs = tokio::task::spawn_blocking(move || -> anyhow::Result<u64> {
            let mut input = BufReader::with_capacity(1 << 20, file);
            let at = (part.term, part.leader, part.index);
            let jobs =
                crate::raft::restore(&store, partition, at, &mut input, part.bytes, (node, &voters, plan.as_ref()))
                    .with_context(|| format!("restoring partition {partition} from backup {}", part.backup))?;
            Ok(jobs)
        })
        .await??;
        tracing::info!(partition, jobs, "restored this partition from the backup");
        restored += jobs;
    }
    // Synced as written; flushed so that the node's start finds it in tables.
    store.flush();
    Ok(restored)
}

fn staging_dir(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().map(|n| n.to_os_string()).unwrap_or_else(|| "data".into());
    name.push(".restoring");
    dir.with_file_name(name)
}
