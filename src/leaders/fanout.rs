//! Runs commands over partitions: a chunk of per-key commands on their
//! partitions' leaders (per partition, in batches cut to a Raft entry's size
//! and run in order; the partitions at once; the results back in the chunk's
//! order), and one command on every partition ([`everywhere`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use super::error::ApiError;
use super::router;
use crate::auth::Principal;
use crate::context::NodeContext;
use futures::future::join_all;

use crate::core::{Command, CommandResult, PartitionId};
use crate::partition::MAX_ENTRY_BYTES;

/// Runs a chunk of per-key commands: per partition, batches cut by bytes and
/// run in order; the partitions concurrently; results back in the chunk's order.
pub async fn run_chunk(
    ctx: &NodeContext,
    principal: Option<&Arc<Principal>>,
    commands: Vec<Result<(PartitionId, Command), ApiError>>,
    deadline: Instant,
) -> Vec<Result<CommandResult, ApiError>> {
    let mut by_partition: BTreeMap<PartitionId, (Vec<usize>, Vec<Command>)> = BTreeMap::new();
    let mut out: Vec<Option<Result<CommandResult, ApiError>>> = Vec::with_capacity(commands.len());
    for (index, command) in commands.into_iter().enumerate() {
        match command {
            Ok((partition, command)) => {
                let entry = by_partition.entry(partition).or_default();
                entry.0.push(index);
                entry.1.push(command);
                out.push(None);
            }
            Err(e) => out.push(Some(Err(e))),
        }
    }
    // A batch is one outcome and one Raft entry; the partition leader never
    // splits one, so it is cut here to the entry size (which also keeps a
    // forwarded batch within the cluster's message limit).
    // Each batch may travel behind the principal (see `router::submit_as`).
    let max_bytes = MAX_ENTRY_BYTES;
    let carried = principal.map_or(0, |p| p.encoded_len());
    let partitions = by_partition.into_iter().map(|(partition, (indexes, commands))| async move {
        let mut done = Vec::new();
        for (indexes, commands) in split_by_bytes(indexes, commands, carried, max_bytes) {
            done.push((indexes, router::submit_as(ctx, principal, partition, commands, deadline).await));
        }
        done
    });
    for (indexes, result) in futures::future::join_all(partitions).await.into_iter().flatten() {
        match result {
            Ok(results) => {
                for (index, result) in indexes.into_iter().zip(results) {
                    out[index] = Some(match result {
                        CommandResult::Rejected(error) => Err(error.into()),
                        other => Ok(other),
                    });
                }
            }
            Err(error) => {
                let message = error.to_string();
                let code = error.code() as i32;
                for index in indexes {
                    out[index] = Some(Err(ApiError::from_code(code, message.clone())));
                }
            }
        }
    }
    out.into_iter().map(|r| r.unwrap_or_else(|| Err(ApiError::Internal("missing result".into())))).collect()
}

/// Cuts one partition's commands into batches of at most `max_bytes` as
/// encoded, `carried` bytes more for each batch (at least one command each),
/// in order.
fn split_by_bytes(
    indexes: Vec<usize>,
    commands: Vec<Command>,
    carried: usize,
    max_bytes: usize,
) -> Vec<(Vec<usize>, Vec<Command>)> {
    let mut batches: Vec<(Vec<usize>, Vec<Command>)> = Vec::new();
    let mut bytes = 0usize;
    for (index, command) in indexes.into_iter().zip(commands) {
        let size = command.encoded_len();
        match batches.last_mut() {
            Some((indexes, commands)) if bytes.saturating_add(size) <= max_bytes => {
                bytes += size;
                indexes.push(index);
                commands.push(command);
            }
            _ => {
                bytes = carried + size;
                batches.push((vec![index], vec![command]));
            }
        }
    }
    batches
}

/// Runs one command on every partition at once; answers in partition order.
pub async fn everywhere(
    ctx: &NodeContext,
    command: impl FnMut(PartitionId) -> Command,
    deadline: Instant,
) -> Vec<Result<CommandResult, ApiError>> {
    everywhere_as(ctx, None, command, deadline).await
}

/// Like [`everywhere`], for a principal (see [`router::submit_as`]).
pub async fn everywhere_as(
    ctx: &NodeContext,
    principal: Option<&Arc<Principal>>,
    mut command: impl FnMut(PartitionId) -> Command,
    deadline: Instant,
) -> Vec<Result<CommandResult, ApiError>> {
    let runs = (0..ctx.topology.partition_count()).map(|partition| {
        let command = command(partition);
        async move {
            match router::submit_as(ctx, principal, partition, vec![command], deadline).await?.pop() {
                Some(CommandResult::Rejected(error)) => Err(error.into()),
                Some(result) => Ok(result),
                None => Err(ApiError::Internal(format!("partition {partition} returned no result"))),
            }
        }
    });
    join_all(runs).await
}

/// A read run on every partition (see [`everywhere_as`]), each answer's
/// items gathered in partition order: `take` takes them out of the answer,
/// or answers `None` when it is of another kind (an internal error naming
/// `what` and the answer).
pub async fn gather_everywhere<T>(
    ctx: &NodeContext,
    principal: Option<&Arc<Principal>>,
    command: impl FnMut(PartitionId) -> Command,
    deadline: Instant,
    what: &str,
    take: impl Fn(&mut CommandResult) -> Option<Vec<T>>,
) -> Result<Vec<T>, ApiError> {
    let mut gathered = Vec::new();
    for result in everywhere_as(ctx, principal, command, deadline).await {
        let mut answer = result?;
        match take(&mut answer) {
            Some(items) => gathered.extend(items),
            None => return Err(ApiError::Internal(format!("{what} was answered with {answer:?}"))),
        }
    }
    Ok(gathered)
}
