//! Routing commands to partition leaders, here or on another node.
//!
//! A gateway sends each batch to the node it believes leads the partition: its
//! own leader actor when it has one, otherwise the node named by the latest
//! leader hint, otherwise each replica of the partition in turn.
//!
//! Two kinds of failure are kept apart. "Not the leader" and "no leader known"
//! prove nothing was proposed: the router backs off and tries again until the
//! request's deadline, then answers UNAVAILABLE (safe to retry). A lost
//! connection after sending, a leader that stopped with the batch in flight, or
//! a deadline passed while waiting for the commit leave the outcome unknown:
//! the batch may be in the log and commit under the next leader. Such a batch
//! is sent again, because every command is safe to repeat: a create carries a
//! request id the partition remembers; completions, failures, timeout updates
//! and yields are fenced by the attempt, and a repeat of one that took effect
//! is recognised (by the engine, or for final jobs by the gateway reading
//! the job); retries are set, not added; and a repeated activation hands out
//! other jobs, while those of a first one whose answer was lost come back at
//! their activation timeout, as they would without the repeat. When time runs
//! out after such a failure the answer is DEADLINE_EXCEEDED, "outcome unknown".

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::rpc::CallResult;

use super::error::ApiError;
use crate::auth::{AuthError, Principal, Verb};
use crate::context::NodeContext;
use crate::core::{Command, CommandError, CommandResult, ErrorKind, JobKey, PartitionId, RequestId};
use crate::metrics::stages::{self, Stage};
use crate::partition::{LeaderMsg, SubmitError};

use crate::proto::cluster::ForwardRequest;
use crate::raft::{NodeId, Replica};
use crate::transport::{Delivered, FORWARDS_ON_STREAMS};

pub(super) const FIRST_BACK_OFF: Duration = Duration::from_millis(10);
pub(super) const MAX_BACK_OFF: Duration = Duration::from_millis(250);

/// The outcome of one attempt on one node.
enum Attempt<T> {
    Done(T),
    /// Nothing was proposed: try again, preferably on this node.
    Retry(Option<NodeId>),
    /// This node could not connect to that node at all: nothing was sent.
    NotConnected(NodeId),
    /// The batch may have been proposed; whether it commits is unknown.
    Unknown {
        hint: Option<NodeId>,
        why: String,
    },
}

/// Runs `commands` on the partition's leader; results come back in order.
pub async fn submit(
    ctx: &NodeContext,
    partition: PartitionId,
    commands: Vec<Command>,
    deadline: Instant,
) -> Result<Vec<CommandResult>, ApiError> {
    submit_as(ctx, None, partition, commands, deadline).await
}

/// Like [`submit`], for a principal: the node that runs the batch first
/// refuses each command on a job the principal may not touch (see
/// [`screen`]); those never reach the log.
pub async fn submit_as(
    ctx: &NodeContext,
    principal: Option<&Arc<Principal>>,
    partition: PartitionId,
    commands: Vec<Command>,
    deadline: Instant,
) -> Result<Vec<CommandResult>, ApiError> {
    super::versions::check_commands(ctx, &commands)?;
    // A principal that holds everything is checked by nothing; it travels
    // only with an override of a fence, which the job's history names it for.
    let principal = principal.filter(|p| !p.unrestricted() || commands.iter().any(Command::overrides_fence));
    let started = Instant::now();
    // A create is re-sent only while the partition surely still remembers
    // its request id: within a third of the window from the first send, so
    // the first send and the last re-send apply well inside it, even with
    // some clock skew between leaders. Waiting for a commit is not limited.
    let resend_until = if commands.iter().any(|c| matches!(c, Command::Create(_))) {
        started + ctx.settings.dedupe.request / 3
    } else {
        deadline
    };
    let mut unknown: Option<String> = None;
    let mut back_off = FIRST_BACK_OFF;
    let mut rotation = 0usize;
    let mut refused: BTreeMap<NodeId, u32> = BTreeMap::new();
    loop {
        let attempt = match ctx.routing.local_leader(partition) {
            Some(leader) => {
                let called = Instant::now();
                let attempt = submit_local(ctx, &leader, principal, partition, commands.clone(), deadline).await;
                stages::record(Stage::LeaderCall, called.elapsed());
                attempt?
            }
            None => {
                let target = ctx.routing.leader_hint(partition, rotation);
                rotation += 1;
                match target {
                    Some(node) if node != ctx.topology.node_id => {
                        forward(ctx, node, principal, partition, commands.clone(), deadline).await?
                    }
                    _ => Attempt::Retry(None),
                }
            }
        };
        match attempt {
            Attempt::Done(results) => return Ok(results),
            Attempt::Retry(hint) => ctx.routing.set_leader_hint(partition, hint),
            Attempt::NotConnected(node) => {
                ctx.routing.set_leader_hint(partition, None);
                *refused.entry(node).or_default() += 1;
                // A majority of the replicas cannot be reached from here (a
                // region cut off): say so now rather than at the deadline.
                if unknown.is_none() && majority_unreachable(ctx, partition, &refused) {
                    return Err(ApiError::OutOfReach(format!(
                        "partition {partition} is out of reach: this node cannot connect to a majority of its \
                         replicas (nodes {:?} refused or timed out), so no leader it can reach can commit; retry \
                         with back-off, or through a gateway on the other side",
                        refused.keys().collect::<Vec<_>>()
                    )));
                }
            }
            Attempt::Unknown { why, .. } if Instant::now() >= resend_until => {
                return Err(ApiError::outcome_unknown(partition, &why));
            }
            Attempt::Unknown { hint, why } => {
                tracing::debug!(partition, "outcome unknown, sending again: {why}");
                metrics::counter!("drover_gateway_resent_total").increment(1);
                ctx.routing.set_leader_hint(partition, hint);
                unknown = Some(why);
            }
        }
        if Instant::now() + back_off >= deadline {
            return Err(match unknown {
                Some(why) => ApiError::outcome_unknown(partition, &why),
                None => ApiError::no_leader(partition, started.elapsed().as_millis()),
            });
        }
        ctx.routing.back_off_for_leader(partition, back_off).await;
        back_off = (back_off * 2).min(MAX_BACK_OFF);
    }
}

/// Whether the replicas of `partition` this node could not connect to (twice
/// each, so one dropped connection does not count) leave fewer than a
/// majority it might reach, itself included when it holds a replica.
fn majority_unreachable(ctx: &NodeContext, partition: PartitionId, refused: &BTreeMap<NodeId, u32>) -> bool {
    let replicas = ctx.topology.replica_nodes(partition);
    let out =
        replicas.iter().filter(|n| **n != ctx.topology.node_id && refused.get(n).is_some_and(|c| *c >= 2)).count();
    replicas.len() - out < replicas.len() / 2 + 1
}

/// Runs commands only if this node leads the partition (for forwarded batches:
/// a forward is never forwarded again).
pub async fn submit_here(
    ctx: &NodeContext,
    principal: Option<&Arc<Principal>>,
    partition: PartitionId,
    commands: Vec<Command>,
    deadline: Instant,
) -> Result<Result<Vec<CommandResult>, Option<NodeId>>, ApiError> {
    let Some(leader) = ctx.routing.local_leader(partition) else {
        return Ok(Err(ctx.routing.known_leader(partition)));
    };
    match submit_local(ctx, &leader, principal, partition, commands, deadline).await? {
        Attempt::Done(results) => Ok(Ok(results)),
        Attempt::Retry(hint) => Ok(Err(hint)),
        Attempt::NotConnected(_) => Ok(Err(None)),
        Attempt::Unknown { why, .. } => Err(ApiError::outcome_unknown(partition, &why)),
    }
}

async fn submit_local(
    ctx: &NodeContext,
    leader: &ractor::ActorRef<LeaderMsg>,
    principal: Option<&Arc<Principal>>,
    partition: PartitionId,
    commands: Vec<Command>,
    deadline: Instant,
) -> Result<Attempt<Vec<CommandResult>>, ApiError> {
    if let Some(results) = read_here(ctx, principal, partition, &commands, deadline).await {
        return Ok(Attempt::Done(results));
    }
    // The failpoint stands for a gateway whose fast path was wrong: what
    // stops a stranger then is the check at apply.
    let replica = ctx.routing.replica(partition).filter(|_| crate::failpoints::fire("gateway_skip_checks").is_none());
    // A principal that holds everything (carried only for an override's
    // history) has nothing to screen.
    let (commands, refused) = match (principal.filter(|p| !p.unrestricted()), replica) {
        (Some(principal), Some(replica)) => screen_once_applied(&replica, principal, commands, deadline).await?,
        _ => (commands, Vec::new()),
    };
    let (commands, mut refused) = match ctx.routing.replica(partition) {
        Some(replica) => bound_dedupe(&replica, &ctx.settings.dedupe, commands, refused),
        None => (commands, refused),
    };
    let commands = match principal {
        Some(by) if !commands.is_empty() && ctx.transport.peers.versions().cluster_version() >= AUTHORIZED_AT_APPLY => {
            vec![Command::As { by: Arc::clone(by), commands }]
        }
        _ => commands,
    };
    if commands.is_empty() && !refused.is_empty() {
        return Ok(Attempt::Done(refused.into_iter().map(|r| r.expect("every command was refused")).collect()));
    }
    let wait = deadline.saturating_duration_since(Instant::now());
    match leader.call(|reply| LeaderMsg::Submit { commands, reply }, Some(wait)).await {
        Ok(CallResult::Success(Ok(results))) if refused.is_empty() => Ok(Attempt::Done(results)),
        Ok(CallResult::Success(Ok(results))) => {
            // Put the leader's answers in the gaps the refusals left.
            let mut results = results.into_iter();
            for slot in refused.iter_mut().filter(|slot| slot.is_none()) {
                *slot = results.next();
            }
            let merged: Option<Vec<CommandResult>> = refused.into_iter().collect();
            merged.map(Attempt::Done).ok_or_else(|| ApiError::Internal("partition returned too few results".into()))
        }
        Ok(CallResult::Success(Err(SubmitError::NotLeader { leader, .. }))) => Ok(Attempt::Retry(leader)),
        Ok(CallResult::Success(Err(error @ SubmitError::Overloaded { .. }))) => Err(error.into()),
        Ok(CallResult::Success(Err(SubmitError::Stopped { message, .. }))) => Ok(Attempt::Unknown {
            hint: ctx.routing.known_leader(partition),
            why: format!("the leader stopped with the batch in flight: {message}"),
        }),
        Ok(CallResult::Timeout) => {
            Err(ApiError::outcome_unknown(partition, "the request's deadline passed before the batch committed"))
        }
        // The leader actor was gone before it took the batch.
        Err(_) => Ok(Attempt::Retry(ctx.routing.known_leader(partition))),
        Ok(CallResult::SenderError) => Ok(Attempt::Unknown {
            hint: ctx.routing.known_leader(partition),
            why: "the leader actor stopped with the batch in flight".into(),
        }),
    }
}

/// The answers to a batch of reads only ([`Command::is_read`]: queue
/// figures, limits, schedules, workflows, sessions, a schema), from this
/// node's replica of a partition it leads, with no log entry: once a
/// majority confirms it still leads and it applied all that was committed
/// by then ([`Replica::confirm_leading`]), its state sees every write
/// acknowledged before the read, as an entry would. `None` (go through the
/// log) when it cannot confirm that within the deadline.
async fn read_here(
    ctx: &NodeContext,
    principal: Option<&Arc<Principal>>,
    partition: PartitionId,
    commands: &[Command],
    deadline: Instant,
) -> Option<Vec<CommandResult>> {
    if commands.is_empty() || !commands.iter().all(Command::is_read) {
        return None;
    }
    let replica = ctx.routing.replica(partition)?;
    if !replica.confirm_leading(deadline).await {
        return None;
    }
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let by = principal.map(|p| &**p);
    replica.state().read(|state| commands.iter().map(|c| state.answer_read(by, c, now)).collect())
}

async fn forward(
    ctx: &NodeContext,
    node: NodeId,
    principal: Option<&Arc<Principal>>,
    partition: PartitionId,
    commands: Vec<Command>,
    deadline: Instant,
) -> Result<Attempt<Vec<CommandResult>>, ApiError> {
    let Some(mut client) = ctx.transport.peers.client(node) else { return Ok(Attempt::Retry(None)) };
    let encoded = bincode::serialize(&commands).map_err(|e| ApiError::Internal(e.to_string()))?;
    let principal = match principal {
        Some(principal) => bincode::serialize(&**principal).map_err(|e| ApiError::Internal(e.to_string()))?.into(),
        None => Default::default(),
    };
    let within = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    let request = ForwardRequest {
        partition_id: partition,
        commands: encoded.into(),
        principal,
        timeout_ms: within.as_millis().max(1) as u64,
    };
    let sent = Instant::now();
    // On the node's delivery stream to the leader when it has one and reads
    // forwards there, as a call otherwise.
    let on_stream = ctx.transport.peers.versions().spoke_at_least(node, FORWARDS_ON_STREAMS);
    let delivered = match on_stream {
        true => ctx.transport.deliveries.forward(&ctx.transport.peers, node, request.clone(), within).await,
        false => Delivered::UseCall,
    };
    let reply = match delivered {
        Delivered::Reply(reply) => Ok(reply),
        Delivered::NotSent(reason) => {
            stages::record(Stage::GatewayForward, sent.elapsed());
            tracing::debug!(partition, node, "forward not sent: {reason}");
            return Ok(Attempt::NotConnected(node));
        }
        Delivered::Failed(status) => Err(status),
        Delivered::UseCall => {
            let mut request = tonic::Request::new(ForwardRequest { timeout_ms: 0, ..request });
            request.set_timeout(within);
            client.forward(request).await.map(tonic::Response::into_inner)
        }
    };
    stages::record(Stage::GatewayForward, sent.elapsed());
    let reply = match reply {
        Ok(reply) => reply,
        Err(status) if never_connected(&status) => {
            tracing::debug!(partition, node, "forward not sent: {status}");
            return Ok(Attempt::NotConnected(node));
        }
        // The request may have reached the leader and been proposed.
        Err(status) => {
            tracing::debug!(partition, node, "forward failed: {status}");
            return Ok(Attempt::Unknown {
                hint: None,
                why: format!("node {node} did not answer: {}", status.message()),
            });
        }
    };
    if let Some(hold) = crate::failpoints::fire("forward_lose_reply") {
        tokio::time::sleep(hold).await;
        return Ok(Attempt::Unknown { hint: None, why: format!("the reply from node {node} was lost (failpoint)") });
    }
    if reply.code != 0 {
        let error = ApiError::from_code(reply.code, reply.message);
        return match error {
            ApiError::Unavailable(_) => Ok(Attempt::Retry(reply.leader_hint)),
            ApiError::OutcomeUnknown(why) => Ok(Attempt::Unknown { hint: reply.leader_hint, why }),
            other => Err(other),
        };
    }
    let results = bincode::deserialize(&reply.results).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok(Attempt::Done(results))
}

/// Splits a batch into what `principal` may run and, in the command order,
/// refusals for the rest (`None` where a command runs). A job of another
/// tenant is NOT_FOUND, as if it did not exist; one of its tenants without
/// the scope is PERMISSION_DENIED. A job's type and tenant never change, so
/// this read needs no commit. A key this partition never created is
/// NOT_FOUND; while `creates_pending`, a key it may be about to create (its
/// create proposed, not applied here yet) is [`Screened::NotApplied`]:
/// nothing runs until the job, and so whose it is, is known, or a stranger
/// could act on a job in the instant before its create applies.
/// [`screen`], waiting while a key's create may be in flight here: until it
/// applies, or for at most [`CREATE_APPLY_WAIT`] (and the deadline), after
/// which a key still unknown was never made and is NOT_FOUND, never a wait
/// to the deadline and "no leader".
async fn screen_once_applied(
    replica: &Replica,
    principal: &Principal,
    commands: Vec<Command>,
    deadline: Instant,
) -> Result<(Vec<Command>, Vec<Option<CommandResult>>), ApiError> {
    let until = deadline.min(Instant::now() + CREATE_APPLY_WAIT);
    let mut applied = replica.applying();
    loop {
        let waiting = Instant::now() < until;
        match screen(replica, principal, commands.clone(), waiting)? {
            Screened::Ready(commands, refused) => return Ok((commands, refused)),
            // Its create is in flight here: screen again once more has applied.
            Screened::NotApplied => {
                if !matches!(tokio::time::timeout_at(until.into(), applied.changed()).await, Ok(Ok(()))) {
                    // Out of time (or the group stopped): the next screen says NOT_FOUND.
                    tokio::time::sleep_until(until.into()).await;
                }
            }
        }
    }
}

/// How long a command on a key just past the partition's counter waits for
/// that key's create to apply before the key counts as never made.
const CREATE_APPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn screen(
    replica: &Replica,
    principal: &Principal,
    commands: Vec<Command>,
    creates_pending: bool,
) -> Result<Screened, ApiError> {
    let keys: Vec<Option<(JobKey, Option<u32>, Verb)>> = commands.iter().map(Command::acts_on).collect();
    if keys.iter().all(Option::is_none) {
        return Ok(Screened::Ready(commands, Vec::new()));
    }
    let state = replica.state();
    let (mut owners, next_counter): (Vec<Option<(String, String)>>, u64) = state.read(|s| {
        let owners = keys
            .iter()
            .map(|k| k.and_then(|(key, _, _)| s.job(key)).map(|j| (j.spec.tenant.clone(), j.spec.job_type.clone())))
            .collect();
        (owners, s.meta().next_counter)
    });
    let in_flight = |key: JobKey| {
        creates_pending
            && key.partition() == replica.partition
            && (next_counter..next_counter.saturating_add(CREATES_IN_FLIGHT)).contains(&key.counter())
    };
    if keys.iter().zip(&owners).any(|(k, owner)| owner.is_none() && k.is_some_and(|(key, _, _)| in_flight(key))) {
        return Ok(Screened::NotApplied);
    }
    for (owner, needed) in owners.iter_mut().zip(&keys) {
        if let (None, Some((key, _, _))) = (&owner, needed) {
            *owner = state.lookup(*key)?.map(|j| (j.spec.tenant.clone(), j.spec.job_type.clone()));
        }
    }
    let mut allowed = Vec::with_capacity(commands.len());
    let mut results = Vec::with_capacity(commands.len());
    let mut any_refused = false;
    for ((command, needed), owner) in commands.into_iter().zip(keys).zip(owners) {
        let verdict = match (needed, owner) {
            (Some((key, attempt, verb)), Some((tenant, job_type))) => {
                principal.check_command(verb, &tenant, &job_type, key.0, attempt)
            }
            // A job token names one job: a key not known here is not it.
            (Some((key, attempt, verb)), None) if principal.job.is_some() => {
                principal.check_command(verb, "", "", key.0, attempt)
            }
            // Never created here, or created and long gone.
            (Some((key, _, _)), None) => Err(AuthError::NotFound(format!("no job with key {key}"))),
            _ => Ok(()),
        };
        match verdict {
            Ok(()) => {
                allowed.push(command);
                results.push(None);
            }
            Err(error) => {
                any_refused = true;
                let kind = match error {
                    AuthError::NotFound(_) => ErrorKind::NotFound,
                    _ => ErrorKind::PermissionDenied,
                };
                results.push(Some(CommandResult::Rejected(CommandError { kind, message: error.to_string() })));
            }
        }
    }
    if !any_refused {
        results.clear();
    }
    Ok(Screened::Ready(allowed, results))
}

/// Refuses, RESOURCE_EXHAUSTED, each create with an idempotency key that
/// would add an entry to a de-duplication table that holds `max_keys`
/// already, or to its tenant's share of it (`max_keys_per_tenant`): the
/// table is bounded by its size as well as its window, one tenant cannot
/// use it all up, and a client told so may retry once entries expire. A repeat of a remembered
/// key is not refused (it adds nothing), nor is a create without a key (its
/// entry lasts the request window, seconds, so creates go on while keys fill
/// the table). Judged here, on the leader, against the applied table, so the
/// table may pass the bound by the creates in flight and the keyless creates
/// of one request window, never by more.
/// `refused` is as [`screen`] leaves it: a slot per command of the request,
/// `None` where a command of `commands` runs (empty: all of them run).
fn bound_dedupe(
    replica: &Replica,
    limits: &crate::config::DedupeWindows,
    commands: Vec<Command>,
    refused: Vec<Option<CommandResult>>,
) -> (Vec<Command>, Vec<Option<CommandResult>>) {
    let key_of = |c: &Command| match c {
        Command::Create(job) => match &job.request {
            Some(request @ RequestId::Key { tenant, .. }) => Some((request.clone(), tenant.clone())),
            _ => None,
        },
        _ => None,
    };
    let keys: Vec<Option<(RequestId, String)>> = commands.iter().map(key_of).collect();
    if keys.iter().all(Option::is_none) {
        return (commands, refused);
    }
    // Per command: whether it adds a key (new here), and the room left in
    // the table and in each tenant's share.
    let (held, adds, mut tenant_room) = replica.state().read(|s| {
        let adds: Vec<bool> =
            keys.iter().map(|k| k.as_ref().is_some_and(|(request, _)| s.request(request).is_none())).collect();
        let mut tenant_room: HashMap<String, usize> = HashMap::new();
        for (_, tenant) in keys.iter().flatten() {
            let share = (limits.max_keys_per_tenant as usize).saturating_sub(s.keys_of_tenant(tenant));
            tenant_room.insert(tenant.clone(), share);
        }
        (s.requests_len(), adds, tenant_room)
    });
    let mut table_room = (limits.max_keys as usize).saturating_sub(held);
    let mut verdicts: Vec<Option<String>> = Vec::with_capacity(commands.len());
    for (key, adds) in keys.iter().zip(&adds) {
        let verdict = match key {
            Some((_, tenant)) if *adds => {
                let room = tenant_room.get_mut(tenant).expect("every tenant of the batch was read");
                if table_room == 0 {
                    Some(format!(
                        "partition {} remembers {held} creates for de-duplication, its limit \
                         (--idempotency-max-keys {}): a new idempotency key has no room until older ones \
                         expire; retry later, or raise the limit",
                        replica.partition, limits.max_keys
                    ))
                } else if *room == 0 {
                    Some(format!(
                        "tenant {tenant:?} holds its share of partition {}'s idempotency keys \
                         (--idempotency-max-keys-per-tenant {}): a new key has no room until its older ones \
                         expire; retry later, or raise the share",
                        replica.partition, limits.max_keys_per_tenant
                    ))
                } else {
                    table_room -= 1;
                    *room -= 1;
                    None
                }
            }
            _ => None,
        };
        verdicts.push(verdict);
    }
    if verdicts.iter().all(Option::is_none) {
        return (commands, refused);
    }
    let mut slots = if refused.is_empty() { vec![None; commands.len()] } else { refused };
    let mut allowed = Vec::with_capacity(commands.len());
    let mut commands = commands.into_iter().zip(verdicts);
    for slot in slots.iter_mut().filter(|slot| slot.is_none()) {
        let Some((command, verdict)) = commands.next() else { break };
        match verdict {
            Some(why) => *slot = Some(CommandResult::Rejected(CommandError::exhausted(why))),
            None => allowed.push(command),
        }
    }
    (allowed, slots)
}

/// What [`screen`] decided for a batch.
enum Screened {
    /// The commands that may run, and refusals in command order (`None`
    /// where a command runs; empty when none was refused).
    Ready(Vec<Command>, Vec<Option<CommandResult>>),
    /// A key's create has not applied here yet.
    NotApplied,
}

/// The data version from which commands travel with their principal
/// ([`Command::As`]) and are authorized again at apply: until every member
/// reads it, the gateway's [`screen`] is the only check.
const AUTHORIZED_AT_APPLY: u16 = 8;

/// How far past the last key a partition applied a key may be and still be
/// one of its creates in flight (proposed, not yet applied): more than the
/// creates of the batches a leader keeps in flight. Keys further on were
/// never handed out: NOT_FOUND at once.
const CREATES_IN_FLIGHT: u64 = 1 << 20;

/// Whether a failed call never reached its peer: the connection could not be
/// made (refused, or the connect failed), so nothing was sent on it.
fn never_connected(status: &tonic::Status) -> bool {
    if status.message().contains("tcp connect error") {
        return true;
    }
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        source = error.source();
    }
    false
}
