//! One partition's job state and the transition function over it.
//!
//! [`PartitionState`] is one type whose operations are split by what they
//! act on, each file its own `impl` block (as TiKV's raftstore gives each
//! peer operation its own): this file holds the state, [`PartitionState::apply`]
//! and the dispatch of commands, and the indexes every operation keeps;
//! [`authorize`] whether a command's principal may run it (see
//! [`Command::As`]); [`jobs`] the job lifecycle (create, activate, complete, fail, retries,
//! timeouts, yields, checkpoints) with the one failed-attempt path;
//! [`sessions`] worker sessions and schemas; [`dedupe`] the table of
//! creates remembered for their window; [`queues`] paused queues and their
//! figures; [`schedules`] cron schedules and their ticks; [`workflows`]
//! chains, groups and batches and how each advances; [`limits`] queues'
//! rate and concurrency limits and what an activation may take under them;
//! [`timers`] what fires
//! at the batch's time; [`reads`] the read-only views.

mod activation;
mod authorize;
mod dedupe;
mod index;
mod jobs;
mod limits;
mod plan;
mod queues;
mod reads;
mod schedules;
mod sessions;
mod timers;
mod workflows;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use dedupe::{request_expiry_bound, request_storage_id, MemoryRequests, RequestCounts, RequestTable};
use jobs::Failure;

use super::command::*;
use super::failure::*;
use super::ids::*;
use super::job::*;
use super::lifecycle::{Happened, Lifecycle};
use super::principal::Principal;
use super::queue::Window;
use super::routing::*;
use super::session::*;

/// Jobs waiting for a worker, ordered by priority (higher first), then key
/// (older first): FIFO within a priority.
type ReadyQueue = BTreeSet<(Reverse<i32>, JobKey)>;

/// A map whose keys the broker makes (job keys) or that every job looks up
/// (job types and their queues), hashed with foldhash: seeded per process
/// like the standard hasher, and several times quicker on short keys. The
/// request table keeps the standard (SipHash) hasher: its keys include
/// producers' idempotency keys, chosen by clients.
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The in-memory state of one partition: every job that is not final, plus the
/// indexes that answer "what is activatable" and "what timer fires next".
/// Final jobs (completed, cancelled) leave memory through [`ApplyOutput::finished`];
/// storage keeps their records.
#[derive(Debug, Default)]
pub struct PartitionState {
    partition: PartitionId,
    next_counter: u64,
    clock: Millis,
    jobs: FastMap<JobKey, Job>,
    /// The same jobs' keys by tenant, in key order: what a listing pages
    /// through instead of sorting every live job (see `reads`).
    by_tenant: BTreeMap<String, BTreeSet<JobKey>>,
    /// type -> (tenant, routing) -> queue: jobs of one tenant with other
    /// labels wait apart, so an activation skips a whole queue its taker
    /// may not serve instead of job by job.
    ready: FastMap<String, FastMap<QueueKey, ReadyQueue>>,
    /// Activated jobs by deadline.
    deadlines: BTreeSet<(Millis, JobKey)>,
    /// Scheduled jobs by due time.
    due: BTreeSet<(Millis, JobKey)>,
    /// Creates remembered for de-duplication (see [`dedupe`]).
    requests: Box<dyn RequestTable>,
    /// Mixed into storage ids, so entries that expire in the same ms differ.
    next_request_seq: u64,
    /// Worker sessions (see [`super::session`]).
    sessions: BTreeMap<SessionId, Session>,
    /// The same sessions by when their lease runs out.
    session_expiry: BTreeSet<(Millis, SessionId)>,
    /// The principal that owns each session registered with
    /// [`Command::RegisterOwned`] (see `authorize`).
    session_owners: BTreeMap<SessionId, String>,
    /// Activated jobs by the session that holds them.
    held: BTreeSet<(SessionId, JobKey)>,
    /// JSON Schemas creates must satisfy, by job type.
    schemas: BTreeMap<String, Schema>,
    /// Paused queues: type -> tenant -> when it was paused (see `queues`).
    paused: BTreeMap<String, BTreeMap<String, Millis>>,
    /// The ready queues of paused queues, as `ready` would hold them.
    parked: FastMap<String, FastMap<QueueKey, ReadyQueue>>,
    /// What happened in each queue lately: type -> tenant -> window. In
    /// memory only (see [`crate::core::queue`]).
    windows: FastMap<String, FastMap<String, Window>>,
    /// Cron schedules by (tenant, name) (see `schedules`).
    schedules: BTreeMap<(String, String), schedules::Registered>,
    /// The same schedules by their next tick (paused ones left out).
    ticks: BTreeSet<(Millis, (String, String))>,
    /// Jobs with an expiry, by it (see `timers`): an entry may outlive its
    /// job, and is dropped when it fires.
    expiring: BTreeSet<(Millis, JobKey)>,
    /// Whether any job here had an expiry: until one has, making a job
    /// ready reads no header.
    expiries_seen: bool,
    /// Workflows by (tenant, id) (see `workflows`).
    workflows: BTreeMap<workflows::Name, crate::core::workflow::Workflow>,
    /// The live jobs of running steps: which workflow's which step each is.
    step_jobs: FastMap<JobKey, (workflows::Name, crate::core::workflow::StepRef)>,
    /// Finished workflows by when they ended, for forgetting them.
    retired: BTreeSet<(Millis, workflows::Name)>,
    /// Limited queues: type -> tenant -> limit (see `limits`).
    limits: BTreeMap<String, BTreeMap<String, limits::Limited>>,
    /// Activations of limited queues held now: (queue, attempt) by job.
    limit_active: FastMap<JobKey, (limits::QueueName, u32)>,
    /// The cluster plan, on partition 0 once it was first changed (see
    /// `plan`).
    plan: Option<Box<crate::core::ClusterPlan>>,
    /// When a bucket that held jobs back has a token again. In memory
    /// only: a new leader offers every waiting job anyway.
    limit_wake: Option<Millis>,
    /// Bugs planted for the fault suite's negative controls: none outside
    /// its runs (see [`Plants`]).
    plants: Plants,
}

/// Test only: bugs a negative control of the fault suite plants where
/// entries are applied (the state machine sets them from
/// [`crate::failpoints`]). Each acts on what the entry decides (a tick's
/// time, an activation), never on a count or a clock of its own, so every
/// replica applying the same entries acts alike and the bug shows as itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Plants {
    /// Schedules pass over every tick at 7 s into a 10 s period without
    /// making its job, and record it as run.
    pub drop_ticks: bool,
    /// Limited queues let every activation start, whatever the limit.
    pub limit_overrun: bool,
}

/// One ready queue of a type: its jobs' tenant and labels.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct QueueKey {
    tenant: String,
    routing: Routing,
}

impl QueueKey {
    fn of(job: &Job) -> Self {
        QueueKey { tenant: job.spec.tenant.clone(), routing: job.spec.routing.clone() }
    }
}

/// What applying a batch did, for the caller to persist and act on.
#[derive(Debug, Default)]
pub struct ApplyOutput {
    /// One result per command, in order.
    pub results: Vec<CommandResult>,
    /// Keys of non-final jobs whose record changed (may repeat).
    pub touched: Vec<JobKey>,
    /// Keys of jobs whose spec is new (created) or replaced (variables set by
    /// a failure or checkpoint) in this batch, final or not (may repeat): the
    /// spec is stored apart from the rest of the record, and only then.
    pub specs: Vec<JobKey>,
    /// Jobs that reached a final state in this batch, moved out of memory.
    pub finished: Vec<Job>,
    /// Job types that gained an activatable job in this batch (no repeats).
    pub available: Vec<String>,
    /// How many jobs of each type reached each outcome in this batch.
    pub outcomes: Vec<(String, Outcome, u64)>,
    /// Per job activated here: ms since it was created.
    pub created_to_activated: Vec<Millis>,
    /// Per job completed here: ms since its activation.
    pub activated_to_completed: Vec<Millis>,
    /// Request entries made in this batch, with their storage ids.
    pub requests_added: Vec<(u64, RequestId, Deduped)>,
    /// The request entries that expired in this batch (every one below
    /// [`request_expiry_bound`] of the batch's time), and any displaced by
    /// an entry with the same storage id, before it was added.
    pub requests_expired: Vec<(u64, RequestId)>,
    /// (job type, stage) of each checkpoint committed in this batch.
    pub checkpoints: Vec<(String, String)>,
    /// (job type, reason, worker) of each failure recorded in this batch.
    pub failures: Vec<(String, FailReason, String)>,
    /// Whether sessions changed: [`PartitionState::registry`]'s sessions are to be stored.
    pub sessions_changed: bool,
    /// Whether schemas changed: its schemas are to be stored.
    pub schemas_changed: bool,
    /// Whether a queue was paused or resumed: [`PartitionState::paused_records`] are to be stored.
    pub paused_changed: bool,
    /// Whether a schedule changed (registered, deleted, paused or ticked):
    /// [`PartitionState::schedule_records`] are to be stored.
    pub schedules_changed: bool,
    /// (tenant, id) of each workflow created, changed or forgotten in this
    /// batch (may repeat): [`PartitionState::workflow_record`] has it, or
    /// it is to be deleted.
    pub workflows_changed: Vec<(String, String)>,
    /// (kind, what happened: created, completed, failed or cancelled) of
    /// each workflow made or ended in this batch, for counting.
    pub workflows: Vec<(&'static str, &'static str)>,
    /// (tenant, job type) of each limited queue whose limit or buckets
    /// changed in this batch (may repeat): [`PartitionState::limit_records`]
    /// has it, or it is to be deleted.
    pub limits_changed: Vec<(String, String)>,
    /// Whether the cluster plan changed in this batch: it is to be stored.
    pub plan_changed: bool,
    /// How far into `touched` and `finished` ended activations of limited
    /// queues were looked for (see `limits`).
    limits_scanned: (usize, usize),
    /// The lifecycle transitions of this batch, in order, for subscribers.
    pub happened: Vec<Happened>,
    /// Sessions this partition declared dead in this batch.
    pub sessions_died: Vec<Arc<SessionInfo>>,
}

impl ApplyOutput {
    /// Records a job's transition for subscribers.
    fn happen(&mut self, lifecycle: Lifecycle, job: &Job, detail: Millis, text: String) {
        let spec = Arc::clone(&job.spec);
        self.happened.push(Happened { lifecycle, key: job.key, spec, attempt: job.attempt, detail, text });
    }

    fn count(&mut self, job_type: &str, outcome: Outcome) {
        match self.outcomes.iter_mut().find(|(t, o, _)| *o == outcome && t == job_type) {
            Some((_, _, n)) => *n += 1,
            None => self.outcomes.push((job_type.to_string(), outcome, 1)),
        }
    }
}

/// The compact state a snapshot carries besides the job records.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StateSnapshot {
    pub partition: PartitionId,
    pub next_counter: u64,
    pub clock: Millis,
    pub next_request_seq: u64,
}

impl PartitionState {
    pub fn new(partition: PartitionId) -> Self {
        PartitionState { partition, next_counter: 1, ..Default::default() }
    }

    /// Rebuilds the state from its persisted parts: the counters, every
    /// non-final job record and the request entries with their storage ids.
    pub fn restore(
        meta: StateSnapshot,
        jobs: impl IntoIterator<Item = Job>,
        requests: impl IntoIterator<Item = (u64, RequestId, Deduped)>,
        registry: Registry,
    ) -> Self {
        PartitionState::restore_on(meta, jobs, Box::new(MemoryRequests::new(requests)), registry)
    }

    /// [`PartitionState::restore`] with the request entries in `requests`.
    pub fn restore_on(
        meta: StateSnapshot,
        jobs: impl IntoIterator<Item = Job>,
        requests: Box<dyn RequestTable>,
        registry: Registry,
    ) -> Self {
        let mut state = PartitionState {
            partition: meta.partition,
            next_counter: meta.next_counter.max(1),
            clock: meta.clock,
            next_request_seq: meta.next_request_seq,
            requests,
            ..Default::default()
        };
        state.restore_paused(registry.paused);
        state.restore_schedules(registry.schedules);
        state.restore_workflows(registry.workflows);
        state.restore_limits(registry.limits);
        state.plan = registry.plan;
        for job in jobs {
            if job.state.is_final() {
                continue;
            }
            state.index(&job);
            state.list_under_tenant(&job);
            let key = job.key;
            state.jobs.insert(key, job);
            if !state.limits.is_empty() {
                state.restore_held(key);
            }
        }
        for session in registry.sessions {
            state.session_expiry.insert((session.expires_at(), session.info.id));
            state.sessions.insert(session.info.id, session);
        }
        state.session_owners = registry.owners.into_iter().collect();
        for (job_type, source) in registry.schemas {
            match Schema::compile(source) {
                Ok(schema) => {
                    state.schemas.insert(job_type, schema);
                }
                // It compiled when it was set; the same build compiles it again.
                Err(error) => tracing::error!(job_type, "a stored schema does not compile: {error}"),
            }
        }
        state
    }

    /// Plants (or, with the default, removes) test-only bugs (see [`Plants`]).
    pub fn plant(&mut self, plants: Plants) {
        self.plants = plants;
    }

    /// Applies one replicated batch: first the timers due at `batch.now`, then
    /// every command in order.
    pub fn apply(&mut self, batch: &Batch) -> ApplyOutput {
        let mut out = ApplyOutput { results: Vec::with_capacity(batch.commands.len()), ..Default::default() };
        // Leaders' clocks differ; never let time run backwards within a partition.
        self.clock = self.clock.max(batch.now);
        self.expire_requests(&mut out);
        self.renew_leases(batch, &mut out);
        self.fire_timers(&mut out);
        if !self.limit_active.is_empty() {
            self.release_slots(&mut out);
        }
        for command in &batch.commands {
            match command {
                Command::As { by, commands } => {
                    for command in commands {
                        let result = self.execute_as(by, command, &mut out);
                        out.results.push(result.unwrap_or_else(CommandResult::Rejected));
                    }
                }
                command => {
                    let result = self.execute(command, &mut out);
                    out.results.push(result.unwrap_or_else(CommandResult::Rejected));
                }
            }
        }
        if !self.limit_active.is_empty() {
            self.release_slots(&mut out);
        }
        out
    }

    /// `command` on behalf of `by`: authorized first, and an override of
    /// the fence written in the job's history.
    fn execute_as(
        &mut self,
        by: &Principal,
        command: &Command,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        self.authorize(by, command)?;
        let result = self.execute(command, out)?;
        if command.overrides_fence() {
            self.note_override(&by.name, command, out);
        }
        if let Command::RegisterOwned(info) = command {
            // A repeat (its first answer lost) keeps its first owner.
            self.session_owners.entry(info.id).or_insert_with(|| by.name.clone());
        }
        Ok(result)
    }

    fn execute(&mut self, command: &Command, out: &mut ApplyOutput) -> Result<CommandResult, CommandError> {
        match command {
            Command::Create(new_job) => self.create_or_redirect(new_job, out),
            Command::Activate(activation) => self.activate_for(activation, out),
            Command::Complete { key, attempt, variables } => self.complete(*key, *attempt, variables, out),
            Command::CompleteGuarded { key, attempt, variables, guard } => {
                self.complete_guarded(*key, *attempt, variables, guard, out)
            }
            Command::Fail {
                key,
                attempt,
                retries,
                error_message,
                back_off_ms,
                variables,
                max_payload_bytes,
                reason,
            } => self.fail(
                Failure {
                    key: *key,
                    attempt: *attempt,
                    retries: *retries,
                    message: error_message,
                    back_off_ms: *back_off_ms,
                    variables,
                    max_payload_bytes: *max_payload_bytes,
                    reason: *reason,
                },
                out,
            ),
            Command::FailByPolicy {
                key,
                attempt,
                error_message,
                error_type,
                retryable,
                jitter,
                variables,
                max_payload_bytes,
            } => self.fail_by_policy(
                jobs::PolicyFailure {
                    key: *key,
                    attempt: *attempt,
                    message: error_message,
                    error_type,
                    retryable: *retryable,
                    jitter: *jitter,
                    variables,
                    max_payload_bytes: *max_payload_bytes,
                },
                out,
            ),
            Command::UpdateTimeout { key, attempt, timeout_ms } => {
                self.update_timeout(*key, *attempt, *timeout_ms, out)
            }
            Command::UpdateRetries { key, retries, by } => self.update_retries(*key, *retries, by, out),
            Command::Cancel { key, by } => self.cancel(*key, by, out),
            Command::Checkpoint { key, attempt, stage, variables, max_payload_bytes } => {
                self.checkpoint(*key, *attempt, stage, variables, *max_payload_bytes, out)
            }
            Command::Yield { key, attempt, gateway, reason } => self.yield_job(*key, *attempt, *gateway, *reason, out),
            Command::Register(info) | Command::RegisterOwned(info) => {
                self.register(info, out);
                Ok(CommandResult::Done)
            }
            Command::ActAs { session } => match self.sessions.contains_key(session) {
                true => Ok(CommandResult::Done),
                false => Err(sessions::unknown_session(*session)),
            },
            Command::Beat { session, state, held } => self.beat(*session, *state, held, out),
            Command::Direct { target, state } => Ok(CommandResult::Sessions(self.direct(target, *state, out))),
            Command::EndSession { session } => {
                self.end_session(*session, out);
                Ok(CommandResult::Done)
            }
            Command::ListSessions => {
                let sessions = self.sessions.values().map(|s| (s.clone(), self.held_by(s.info.id) as u32)).collect();
                Ok(CommandResult::Sessions(sessions))
            }
            Command::SetSchema { job_type, schema } => self.set_schema(job_type, schema, out),
            Command::GetSchema { job_type } => {
                Ok(CommandResult::Schema(self.schemas.get(job_type).map(|s| s.source.clone()).unwrap_or_default()))
            }
            Command::SetPaused { tenant, job_type, paused } => Ok(self.set_paused(tenant, job_type, *paused, out)),
            Command::QueueStats { tenants, job_type } => Ok(CommandResult::Queues(self.queue_stats(tenants, job_type))),
            Command::PutSchedule { spec, by } => self.put_schedule(spec, by, out),
            Command::DeleteSchedule { tenant, name } => self.delete_schedule(tenant, name, out),
            Command::SetSchedulePaused { tenant, name, paused } => self.set_schedule_paused(tenant, name, *paused, out),
            Command::ListSchedules { tenants } => Ok(CommandResult::Schedules(self.list_schedules(tenants))),
            Command::CreateWorkflow { spec, by, max_payload_bytes } => {
                self.create_workflow(spec, by, *max_payload_bytes, out)
            }
            Command::CancelWorkflow { tenant, id, by, request } => self.cancel_workflow(tenant, id, by, *request, out),
            Command::GetWorkflow { tenant, id } => self.get_workflow(tenant, id),
            Command::ListWorkflows { tenants, running, limit } => {
                Ok(CommandResult::Workflows(self.list_workflows(tenants, *running, *limit)))
            }
            Command::SetLimit { tenant, job_type, limit } => self.set_limit(tenant, job_type, limit, out),
            Command::GetLimits { tenants, job_type } => Ok(CommandResult::Limits(self.limit_states(tenants, job_type))),
            Command::ChangePlan { initial, epoch, change } => self.change_plan(initial, *epoch, change, out),
            Command::ReportVoters { partition, voters } => Ok(self.report_voters(*partition, voters, out)),
            Command::GetPlan => Ok(CommandResult::Plan(self.plan.clone())),
            Command::ProbeKey { request, to, window_ms, fingerprint } => {
                self.probe_key(request, *to, *window_ms, *fingerprint, out)
            }
            Command::GetAdoptable => Ok(CommandResult::Adoptable(Box::new(self.adoptable()))),
            Command::Adopt(adopted) => Ok(self.adopt(adopted, out)),
            // Acted on before the timers fired, when first in its entry.
            Command::RenewLeases { .. } => Ok(CommandResult::Done),
            // The state machine keeps the state for the backup; the engine's
            // state does not change.
            Command::BackupMark { .. } => Ok(CommandResult::Done),
            // Runs are taken apart by `apply`; one inside another is not sent.
            Command::As { .. } => Err(CommandError::invalid("a principal's commands carried inside another's")),
        }
    }

    fn live_job(&mut self, key: JobKey) -> Result<&mut Job, CommandError> {
        if !self.jobs.contains_key(&key) {
            return Err(self.absent(key));
        }
        Ok(self.jobs.get_mut(&key).expect("just checked"))
    }

    fn absent(&self, key: JobKey) -> CommandError {
        if self.was_created(key) {
            CommandError::precondition(format!("job {key} is already completed, cancelled or expired"))
        } else {
            CommandError::not_found(key)
        }
    }

    /// Removes a job from memory and every index.
    fn remove(&mut self, key: JobKey) -> Job {
        let job = self.jobs.remove(&key).expect("caller checked the job exists");
        self.unindex(&job);
        if let Some(keys) = self.by_tenant.get_mut(&job.spec.tenant) {
            keys.remove(&key);
            if keys.is_empty() {
                self.by_tenant.remove(&job.spec.tenant);
            }
        }
        job
    }
}
