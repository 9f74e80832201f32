//! Where a create goes: the one place that places new jobs. A create with
//! an idempotency key goes where its repeats will look for it (the key's
//! partition under the count in force, after asking the partitions it
//! hashed to under older counts whether one made its job: [`super::keys`]);
//! one with an ordering key to the partition its tenant and key hash to;
//! any other to the next partition this node's placement picks
//! (`--create-placement`), and on to the next one when a partition is out of
//! this node's reach. A limited queue's create lands on the queue's home
//! partition: another answers "elsewhere", and the create is sent there.

use std::sync::Arc;
use std::time::Instant;

use super::fanout::run_chunk;
use super::{keys, submit_as, ApiError};
use crate::auth::Principal;
use crate::context::NodeContext;
use crate::core::{Command, CommandResult, JobRef, NewJob, PartitionId, RequestId};

/// The partition a create is sent to first: see the module's doc.
/// `ordering` is the partition its ordering key hashes to, if it has one.
pub fn first_partition(ctx: &NodeContext, job: &NewJob, ordering: Option<PartitionId>) -> PartitionId {
    match &job.request {
        Some(request @ RequestId::Key { .. }) => {
            JobRef::Request(request.clone()).partition(ctx.topology.partition_count())
        }
        _ => ordering.unwrap_or_else(|| ctx.routing.next_create_partition()),
    }
}

/// Makes `job` where it belongs, for `principal`: the partition that
/// answered, and its answer ([`CommandResult::Created`], or a rejection).
pub async fn create(
    ctx: &NodeContext,
    principal: &Arc<Principal>,
    job: NewJob,
    ordering: Option<PartitionId>,
    deadline: Instant,
) -> Result<(PartitionId, Option<CommandResult>), ApiError> {
    let mut partition = first_partition(ctx, &job, ordering);
    let keyless = !matches!(job.request, Some(RequestId::Key { .. }));
    let command = Command::Create(job);
    let partitions = ctx.topology.partition_count();
    let principal = Some(principal);
    if let Some((made_on, result)) = keys::made_under_older_count(ctx, &command, partition, deadline).await? {
        return Ok((made_on, Some(result)));
    }
    let mut submitted = submit_as(ctx, principal, partition, vec![command.clone()], deadline).await;
    // A create without an idempotency key may be made on any partition:
    // one out of this node's reach (its region cut off) sent nothing, so
    // the create goes to the next partition instead.
    for _ in 1..partitions {
        if !(keyless && matches!(submitted, Err(ApiError::OutOfReach(_)))) {
            break;
        }
        partition = (partition + 1) % partitions;
        submitted = submit_as(ctx, principal, partition, vec![command.clone()], deadline).await;
    }
    let mut result = submitted?.pop();
    if let Some(CommandResult::Elsewhere(home)) = result {
        // A limited queue's jobs are made on its home partition.
        partition = home;
        result = submit_as(ctx, principal, home, vec![command], deadline).await?.pop();
    }
    Ok((partition, result))
}

/// Makes a chunk of creates (each a job and its ordering partition, or the
/// error its validation gave), in batches per partition: one answer per
/// create, in order, with the partition that answered it.
pub async fn create_many(
    ctx: &NodeContext,
    principal: &Arc<Principal>,
    creates: Vec<Result<(NewJob, Option<PartitionId>), ApiError>>,
    deadline: Instant,
) -> Vec<(Option<PartitionId>, Result<CommandResult, ApiError>)> {
    let mut commands: Vec<Result<(PartitionId, Command), ApiError>> = creates
        .into_iter()
        .map(|create| create.map(|(job, ordering)| (first_partition(ctx, &job, ordering), Command::Create(job))))
        .collect();
    let mut partitions: Vec<Option<PartitionId>> = commands.iter().map(|c| c.as_ref().ok().map(|(p, _)| *p)).collect();
    let sent: Vec<Option<Command>> = commands.iter().map(|c| c.as_ref().ok().map(|(_, c)| c.clone())).collect();
    // Keys made under an older partition count are answered from there
    // (nothing to probe while the count never changed).
    let mut made_before = Vec::new();
    if ctx.topology.partition_count() != ctx.topology.formed_partitions {
        for (i, command) in commands.iter_mut().enumerate() {
            let Ok((partition, sent)) = command else { continue };
            match keys::made_under_older_count(ctx, sent, *partition, deadline).await {
                Ok(None) => continue,
                Ok(Some((made_on, result))) => made_before.push((i, made_on, Ok(result))),
                Err(error) => made_before.push((i, *partition, Err(error))),
            }
            // Sent nowhere; its answer is filled in below.
            *command = Err(ApiError::Internal("answered by an older partition".into()));
        }
    }
    let mut results = run_chunk(ctx, Some(principal), commands, deadline).await;
    for (i, made_on, result) in made_before {
        partitions[i] = Some(made_on);
        results[i] = result;
    }
    // A limited queue's jobs are made on its home partition: those
    // creates go there now, in one more round.
    let elsewhere: Vec<(usize, PartitionId)> = results
        .iter()
        .enumerate()
        .filter_map(|(i, r)| match r {
            Ok(CommandResult::Elsewhere(home)) => Some((i, *home)),
            _ => None,
        })
        .collect();
    if !elsewhere.is_empty() {
        let again = elsewhere
            .iter()
            .map(|(i, home)| Ok((*home, sent[*i].clone().expect("a sent command was answered"))))
            .collect();
        let answers = run_chunk(ctx, Some(principal), again, deadline).await;
        for ((i, home), answer) in elsewhere.into_iter().zip(answers) {
            partitions[i] = Some(home);
            results[i] = answer;
        }
    }
    partitions.into_iter().zip(results).collect()
}
