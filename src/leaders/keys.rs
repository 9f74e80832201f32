//! Idempotency keys across partition counts. A key hashes to a partition
//! over the count in force; after partitions are added it may have been made
//! under an older count, on another partition. For the longest idempotency
//! window after a count changed (and [`KEY_COUNT_SLACK`]), a create with a
//! key first asks the partitions it hashed to under the older counts
//! ([`crate::core::Command::ProbeKey`]): one that made its job answers the
//! create; one that did not remembers where the key went, so a create from
//! a gateway still routing by the older count follows it there. Reads by
//! key look under each count, newest first (`docs/membership.md`).

use std::time::{Duration, Instant};

use super::error::ApiError;
use super::router;
use crate::context::NodeContext;
use crate::core::{payload_fingerprint, Command, CommandResult, JobRef, PartitionId, RequestId};

/// The partitions an idempotency key may have been made on, newest first:
/// where it hashes under the partition count in force, then under each
/// older count that routed work within the longest idempotency window.
pub fn key_partitions(ctx: &NodeContext, request: &RequestId) -> Vec<PartitionId> {
    let window = ctx.settings.dedupe.idempotency + KEY_COUNT_SLACK;
    let counts = ctx.topology.key_counts(crate::auth::now_ms() as i64, window.as_millis() as i64);
    let mut partitions: Vec<PartitionId> = Vec::with_capacity(counts.len());
    for count in counts {
        let partition = JobRef::Request(request.clone()).partition(count);
        if !partitions.contains(&partition) {
            partitions.push(partition);
        }
    }
    partitions
}

/// How long past the idempotency window an older partition count is still
/// looked under: a gateway that learned the newer count late may have made
/// a key's job under the older one until then.
pub const KEY_COUNT_SLACK: Duration = Duration::from_secs(120);

/// For a create with an idempotency key bound for `partition`: the job a
/// partition made for the key under an older partition count, with that
/// partition, if one did. `None`: the create goes on to `partition` (and
/// every older partition now sends the key's creates there).
pub async fn made_under_older_count(
    ctx: &NodeContext,
    command: &Command,
    partition: PartitionId,
    deadline: Instant,
) -> Result<Option<(PartitionId, CommandResult)>, ApiError> {
    let Command::Create(job) = command else { return Ok(None) };
    let Some(request @ RequestId::Key { .. }) = &job.request else { return Ok(None) };
    let older: Vec<PartitionId> = key_partitions(ctx, request).into_iter().filter(|p| *p != partition).collect();
    if older.is_empty() {
        return Ok(None);
    }
    let fingerprint = payload_fingerprint(&job.spec);
    let window_ms = ctx.settings.dedupe.idempotency.as_millis() as i64;
    for old in older {
        let probe = Command::ProbeKey { request: request.clone(), to: partition, window_ms, fingerprint };
        match router::submit(ctx, old, vec![probe], deadline).await?.pop() {
            Some(created @ CommandResult::Created { .. }) => return Ok(Some((old, created))),
            Some(CommandResult::Elsewhere(_)) => {}
            Some(CommandResult::Rejected(error)) => return Err(error.into()),
            other => return Err(ApiError::Internal(format!("unexpected answer to a key probe: {other:?}"))),
        }
    }
    Ok(None)
}
