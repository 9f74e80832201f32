//! `drover backup create`: marks the backup's cut through a gateway, copies
//! each partition's staged part to the destination as it streams, checking
//! its length and SHA-256 against what the replica that staged it says,
//! then writes the manifest and releases the staged parts.

use std::io::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};

use super::{Destination, Found, Manifest};
use crate::client::Client;
use crate::proto::gateway::{ReadBackupRequest, ReleaseBackupRequest, StartBackupRequest};
use crate::raft::PartitionBackup;

/// How long marking the cut in every partition may take.
const MARK_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one partition's part may take to be staged and copied.
const PART_TIMEOUT: Duration = Duration::from_secs(30 * 60);

type Gateway = crate::proto::gateway::gateway_client::GatewayClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, crate::client::Bearer>,
>;

fn status_error(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", status.code(), status.message())
}

/// A backup id for now: `drover-YYYYMMDD-HHMMSS` (UTC).
pub fn default_id() -> String {
    let seconds = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (year, month, day, h, m, s) = super::civil(seconds as i64);
    format!("drover-{year:04}{month:02}{day:02}-{h:02}{m:02}{s:02}")
}

/// Takes backup `id` of the cluster `client` reaches into `destination`.
pub async fn create(client: &Client, destination: &Destination, id: &str) -> anyhow::Result<Manifest> {
    super::check_id(id)?;
    if !matches!(destination.find(id).await?, Found::Missing) {
        bail!("backup {id} already exists in {destination}: choose another id, or delete it first");
    }
    let mut gateway = client.raw();
    let mut start = tonic::Request::new(StartBackupRequest { backup_id: id.to_string() });
    start.set_timeout(MARK_TIMEOUT);
    let started = gateway.start_backup(start).await.map_err(status_error).context("marking the backup's cut")?;
    let started = started.into_inner();
    let copied = copy_parts(&mut gateway, destination, id, started.partitions_count).await;
    // The staged parts go whether the copy worked or not: a retry marks anew.
    let mut release = tonic::Request::new(ReleaseBackupRequest { backup_id: id.to_string() });
    release.set_timeout(MARK_TIMEOUT);
    if let Err(status) = gateway.release_backup(release).await {
        tracing::warn!(
            "the staged parts of backup {id} were not all released ({}); each node deletes them at its next start",
            status.message()
        );
    }
    let parts = copied?;
    let manifest = Manifest {
        backup_id: id.to_string(),
        created_at_ms: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        drover_version: env!("CARGO_PKG_VERSION").to_string(),
        cluster_version: u16::try_from(started.cluster_version).context("the cluster version is out of range")?,
        partitions_count: started.partitions_count,
        formed_partitions: match started.formed_partitions {
            formed if formed == started.partitions_count => 0,
            formed => formed,
        },
        replication_factor: started.replication_factor,
        cluster_size: started.cluster_size,
        parts,
    };
    manifest.check(id)?;
    destination.put_manifest(&manifest).await?;
    Ok(manifest)
}

async fn copy_parts(
    gateway: &mut Gateway,
    destination: &Destination,
    id: &str,
    partitions: u32,
) -> anyhow::Result<Vec<PartitionBackup>> {
    let mut parts = Vec::new();
    for partition in 0..partitions {
        let part = copy_part(gateway, destination, id, partition)
            .await
            .with_context(|| format!("copying partition {partition}'s part of backup {id} to {destination}"))?;
        parts.push(part);
    }
    Ok(parts)
}

async fn copy_part(
    gateway: &mut Gateway,
    destination: &Destination,
    id: &str,
    partition: u32,
) -> anyhow::Result<PartitionBackup> {
    let mut request = tonic::Request::new(ReadBackupRequest { backup_id: id.to_string(), partition_id: partition });
    request.set_timeout(PART_TIMEOUT);
    let mut stream = gateway.read_backup(request).await.map_err(status_error)?.into_inner();
    let name = Destination::part_name(partition);
    let mut out = destination.create(id, &name)?;
    let mut described = None;
    while let Some(chunk) = stream.message().await.map_err(status_error)? {
        out.write_all(&chunk.data)?;
        if chunk.part.is_some() {
            described = chunk.part;
        }
    }
    let part = described.context("the stream ended without describing the part (cut short?)")?;
    let (bytes, sha256) = out.digest();
    if part.bytes != bytes || part.sha256 != sha256 {
        bail!(
            "the part arrived as {bytes} bytes with SHA-256 {sha256}, but was staged as {} bytes with SHA-256 {}",
            part.bytes,
            part.sha256
        );
    }
    destination.finish(id, &name, out).await?;
    Ok(PartitionBackup {
        backup: id.to_string(),
        partition: part.partition_id,
        term: part.term,
        leader: part.leader,
        index: part.index,
        bytes,
        sha256,
        records: part.records,
        data_version: u16::try_from(part.data_version).context("the part's data version is out of range")?,
    })
}
