//! One partition's job state and the transition function over it.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::history::*;
use super::job::*;
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
    /// type -> (tenant, routing) -> queue: jobs of one tenant with other
    /// labels wait apart, so an activation skips a whole queue its taker
    /// may not serve instead of job by job.
    ready: FastMap<String, FastMap<QueueKey, ReadyQueue>>,
    /// Activated jobs by deadline.
    deadlines: BTreeSet<(Millis, JobKey)>,
    /// Scheduled jobs by due time.
    due: BTreeSet<(Millis, JobKey)>,
    /// Creates remembered for de-duplication: request id -> the job it made.
    requests: HashMap<RequestId, Deduped>,
    /// Entries `requests` could hold when it last grew: it is kept at most
    /// half full of this (see [`PartitionState::remember`]).
    requests_room: usize,
    /// The same entries by [`request_storage_id`], so the earliest to expire
    /// comes first.
    request_expiry: BTreeMap<u64, RequestId>,
    /// Mixed into storage ids, so entries that expire in the same ms differ.
    next_request_seq: u64,
    /// Worker sessions (see [`super::session`]).
    sessions: BTreeMap<SessionId, Session>,
    /// The same sessions by when their lease runs out.
    session_expiry: BTreeSet<(Millis, SessionId)>,
    /// Activated jobs by the session that holds them.
    held: BTreeSet<(SessionId, JobKey)>,
    /// JSON Schemas creates must satisfy, by job type.
    schemas: BTreeMap<String, Schema>,
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

/// Bits of a request entry's storage id below its expiry time.
const REQUEST_SEQ_BITS: u32 = 20;
/// Expiry times fit in the 44 bits above: until the year 2527.
const MAX_REQUEST_EXPIRY: Millis = (1 << (64 - REQUEST_SEQ_BITS)) - 1;

/// Where a request entry is stored: its expiry time in the high bits, so
/// entries are stored in the order they expire, and a sequence number below it.
pub fn request_storage_id(expires_at: Millis, seq: u64) -> u64 {
    let at = expires_at.clamp(0, MAX_REQUEST_EXPIRY) as u64;
    (at << REQUEST_SEQ_BITS) | (seq & ((1 << REQUEST_SEQ_BITS) - 1))
}

/// Request entries with storage ids below this have expired at `now`.
pub fn request_expiry_bound(now: Millis) -> u64 {
    request_storage_id(now.saturating_add(1), 0)
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
    /// Storage ids of the request entries that expired in this batch (every
    /// one below [`request_expiry_bound`] of the batch's time).
    pub requests_expired: Vec<u64>,
    /// (job type, stage) of each checkpoint committed in this batch.
    pub checkpoints: Vec<(String, String)>,
    /// (job type, reason, worker) of each failure recorded in this batch.
    pub failures: Vec<(String, FailReason, String)>,
    /// Whether sessions changed: [`PartitionState::registry`]'s sessions are to be stored.
    pub sessions_changed: bool,
    /// Whether schemas changed: its schemas are to be stored.
    pub schemas_changed: bool,
    /// Sessions this partition declared dead in this batch.
    pub sessions_died: Vec<Arc<SessionInfo>>,
}

impl ApplyOutput {
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
        let mut state = PartitionState {
            partition: meta.partition,
            next_counter: meta.next_counter.max(1),
            clock: meta.clock,
            next_request_seq: meta.next_request_seq,
            ..Default::default()
        };
        for job in jobs {
            if job.state.is_final() {
                continue;
            }
            state.index(&job);
            state.jobs.insert(job.key, job);
        }
        for (id, request, entry) in requests {
            state.request_expiry.insert(id, request.clone());
            state.requests.insert(request, entry);
        }
        state.requests.reserve(state.requests.len());
        state.requests_room = state.requests.capacity();
        for session in registry.sessions {
            state.session_expiry.insert((session.expires_at(), session.info.id));
            state.sessions.insert(session.info.id, session);
        }
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

    /// The sessions and schemas, as snapshotted.
    pub fn registry(&self) -> Registry {
        Registry { sessions: self.session_records(), schemas: self.schema_records() }
    }

    /// The sessions as stored (rewritten whenever one changes).
    pub fn session_records(&self) -> Vec<Session> {
        self.sessions.values().cloned().collect()
    }

    /// The schemas as stored: (job type, source).
    pub fn schema_records(&self) -> Vec<(String, Bytes)> {
        self.schemas.iter().map(|(t, s)| (t.clone(), s.source.clone())).collect()
    }

    pub fn session(&self, id: SessionId) -> Option<&Session> {
        self.sessions.get(&id)
    }

    /// How many jobs of this partition a session holds.
    pub fn held_by(&self, id: SessionId) -> usize {
        self.held.range((id, JobKey(0))..=(id, JobKey(u64::MAX))).count()
    }

    /// Whether a stream of `session` (0: none) may be offered jobs.
    pub fn session_takes_jobs(&self, session: SessionId) -> bool {
        session == 0 || self.sessions.get(&session).is_some_and(Session::takes_jobs)
    }

    pub fn meta(&self) -> StateSnapshot {
        StateSnapshot {
            partition: self.partition,
            next_counter: self.next_counter,
            clock: self.clock,
            next_request_seq: self.next_request_seq,
        }
    }

    /// Every remembered create with its storage id, for snapshots.
    pub fn requests(&self) -> impl Iterator<Item = (u64, &RequestId, &Deduped)> {
        self.request_expiry.iter().map(|(id, request)| (*id, request, &self.requests[request]))
    }

    /// What the partition remembers of a create, if it is within its window.
    pub fn request(&self, request: &RequestId) -> Option<&Deduped> {
        self.requests.get(request)
    }

    pub fn partition(&self) -> PartitionId {
        self.partition
    }

    /// The greatest leader time applied so far.
    pub fn clock(&self) -> Millis {
        self.clock
    }

    pub fn job(&self, key: JobKey) -> Option<&Job> {
        self.jobs.get(&key)
    }

    pub fn jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values()
    }

    /// Whether `key` was ever created here (it may be final and out of memory).
    pub fn was_created(&self, key: JobKey) -> bool {
        key.partition() == self.partition && key.counter() >= 1 && key.counter() < self.next_counter
    }

    /// When the next timer (a due job, an activation deadline or a session's
    /// lease) fires.
    pub fn next_timer(&self) -> Option<Millis> {
        let due = self.due.first().map(|(at, _)| *at);
        let deadline = self.deadlines.first().map(|(at, _)| *at);
        let session = self.session_expiry.first().map(|(at, _)| *at);
        [due, deadline, session].into_iter().flatten().min()
    }

    /// Activatable jobs of a type, over the given tenants (all tenants if empty).
    pub fn activatable_count(&self, job_type: &str, tenants: &[String]) -> usize {
        let Some(queues) = self.ready.get(job_type) else { return 0 };
        queues.iter().filter(|(k, _)| tenants.is_empty() || tenants.contains(&k.tenant)).map(|(_, q)| q.len()).sum()
    }

    /// Activatable jobs of a type over the given tenants that `taker` may take
    /// while `rivals` are open too (see [`crate::core::routing`]).
    pub fn activatable_for(&self, job_type: &str, tenants: &[String], taker: &Taker, rivals: &[Taker]) -> usize {
        let Some(queues) = self.ready.get(job_type) else { return 0 };
        queues
            .iter()
            .filter(|(k, _)| tenants.contains(&k.tenant) && k.routing.admits(&k.tenant, taker, rivals))
            .map(|(_, q)| q.len())
            .sum()
    }

    /// Activatable jobs of a type by their labels (jobs without labels left
    /// out), for telling which of them no open worker may take.
    pub fn activatable_by_routing(&self, job_type: &str) -> Vec<(&Routing, usize)> {
        let Some(queues) = self.ready.get(job_type) else { return Vec::new() };
        let mut by_routing: Vec<(&Routing, usize)> = Vec::new();
        for (key, queue) in queues.iter().filter(|(k, _)| !k.routing.is_empty()) {
            match by_routing.iter_mut().find(|(r, _)| **r == key.routing) {
                Some((_, n)) => *n += queue.len(),
                None => by_routing.push((&key.routing, queue.len())),
            }
        }
        by_routing
    }

    /// Activatable jobs per type, for metrics and for pushing to new streams.
    pub fn activatable_by_type(&self) -> Vec<(String, usize)> {
        self.ready.iter().map(|(ty, by_tenant)| (ty.clone(), by_tenant.values().map(BTreeSet::len).sum())).collect()
    }

    /// Applies one replicated batch: first the timers due at `batch.now`, then
    /// every command in order.
    pub fn apply(&mut self, batch: &Batch) -> ApplyOutput {
        let mut out = ApplyOutput { results: Vec::with_capacity(batch.commands.len()), ..Default::default() };
        // Leaders' clocks differ; never let time run backwards within a partition.
        self.clock = self.clock.max(batch.now);
        self.expire_requests(&mut out);
        if batch.renew_sessions {
            self.renew_sessions(&mut out);
        }
        self.fire_timers(&mut out);
        for command in &batch.commands {
            let result = match self.execute(command, &mut out) {
                Ok(result) => result,
                Err(error) => CommandResult::Rejected(error),
            };
            out.results.push(result);
        }
        out
    }

    fn expire_requests(&mut self, out: &mut ApplyOutput) {
        let bound = request_expiry_bound(self.clock);
        while let Some(entry) = self.request_expiry.first_entry() {
            if *entry.key() >= bound {
                break;
            }
            let (id, request) = entry.remove_entry();
            self.requests.remove(&request);
            out.requests_expired.push(id);
        }
    }

    fn fire_timers(&mut self, out: &mut ApplyOutput) {
        let now = self.clock;
        while let Some(&(at, key)) = self.due.first() {
            if at > now {
                break;
            }
            self.due.pop_first();
            if let Some(job) = self.jobs.get_mut(&key) {
                job.state = JobState::Activatable;
                job.history.record(now, EventKind::Due);
                self.make_ready(key, out);
            }
        }
        while let Some(&(at, key)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(job) = self.jobs.get_mut(&key) {
                // A timeout hands the job back without consuming a retry.
                job.state = JobState::Activatable;
                job.deadline = 0;
                self.held.remove(&(job.session, key));
                job.history.record(now, EventKind::TimedOut { attempt: job.attempt });
                out.count(&job.spec.job_type, Outcome::TimedOut);
                self.make_ready(key, out);
            }
        }
        while let Some(&(at, id)) = self.session_expiry.first() {
            if at > now {
                break;
            }
            self.session_expiry.pop_first();
            let Some(session) = self.sessions.remove(&id) else { continue };
            out.sessions_changed = true;
            let why = format!(
                "worker {:?} (session {id:x} on {:?}, pid {}) died: no heartbeat for {} ms",
                session.info.worker, session.info.hostname, session.info.pid, session.info.dead_after_ms
            );
            for key in self.take_held(id) {
                self.worker_died(key, &why, out);
            }
            out.sessions_died.push(session.info);
        }
    }

    /// Restarts every session's lease from now (a new leader's first entry).
    fn renew_sessions(&mut self, out: &mut ApplyOutput) {
        let now = self.clock;
        for (id, session) in &mut self.sessions {
            if session.last_beat < now {
                self.session_expiry.remove(&(session.expires_at(), *id));
                session.last_beat = now;
                self.session_expiry.insert((session.expires_at(), *id));
                out.sessions_changed = true;
            }
        }
    }

    /// Removes and returns the jobs a session holds here.
    fn take_held(&mut self, id: SessionId) -> Vec<JobKey> {
        let keys: Vec<JobKey> =
            self.held.range((id, JobKey(0))..=(id, JobKey(u64::MAX))).map(|(_, key)| *key).collect();
        for key in &keys {
            self.held.remove(&(id, *key));
        }
        keys
    }

    /// Ends the activation of a job whose worker died: a failed attempt, one
    /// retry fewer, due again after the job's retry back-off; an incident at
    /// no retries left.
    fn worker_died(&mut self, key: JobKey, why: &str, out: &mut ApplyOutput) {
        let now = self.clock;
        let Some(job) = self.jobs.get_mut(&key) else { return };
        if job.state != JobState::Activated {
            return;
        }
        self.deadlines.remove(&(job.deadline, key));
        job.deadline = 0;
        job.retries = (job.retries - 1).max(0);
        job.failed_attempt = job.attempt;
        job.fail_reason = FailReason::WorkerDied;
        job.error_message = why.to_string();
        let back_off_ms = if job.retries == 0 { 0 } else { job.spec.retry_back_off_ms };
        job.history.record(
            now,
            EventKind::Failed {
                attempt: job.attempt,
                reason: FailReason::WorkerDied,
                message: why.to_string(),
                retries: job.retries,
                back_off_ms,
            },
        );
        out.count(&job.spec.job_type, Outcome::Failed);
        out.failures.push((job.spec.job_type.clone(), FailReason::WorkerDied, job.worker.clone()));
        if job.retries == 0 {
            out.count(&job.spec.job_type, Outcome::Incident);
            job.history.record(now, EventKind::Incident);
            job.state = JobState::Incident;
        } else if job.spec.retry_back_off_ms > 0 {
            job.state = JobState::Scheduled;
            job.due_at = now.saturating_add(job.spec.retry_back_off_ms);
            self.due.insert((job.due_at, key));
        } else {
            job.state = JobState::Activatable;
            self.make_ready(key, out);
        }
        out.touched.push(key);
    }

    fn execute(&mut self, command: &Command, out: &mut ApplyOutput) -> Result<CommandResult, CommandError> {
        match command {
            Command::Create(new_job) => self.create(new_job, out),
            Command::Activate(activation) => {
                if activation.session != 0 {
                    match self.sessions.get(&activation.session) {
                        None => return Err(unknown_session(activation.session)),
                        Some(session) if !session.takes_jobs() => return Ok(CommandResult::Activated(Vec::new())),
                        Some(_) => {}
                    }
                }
                Ok(CommandResult::Activated(self.activate(activation, out)))
            }
            Command::Register(info) => {
                self.register(info, out);
                Ok(CommandResult::Done)
            }
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
            Command::SetSchema { job_type, schema } => {
                if schema.is_empty() {
                    self.schemas.remove(job_type);
                } else {
                    let compiled = Schema::compile(schema.clone())
                        .map_err(|e| CommandError::invalid(format!("schema for job type {job_type:?}: {e}")))?;
                    self.schemas.insert(job_type.clone(), compiled);
                }
                out.schemas_changed = true;
                Ok(CommandResult::Done)
            }
            Command::GetSchema { job_type } => {
                Ok(CommandResult::Schema(self.schemas.get(job_type).map(|s| s.source.clone()).unwrap_or_default()))
            }
            Command::Complete { key, attempt, variables } => {
                self.activation_of(*key, *attempt, "complete")?;
                let mut job = self.remove(*key);
                job.state = JobState::Completed;
                job.history.record(self.clock, EventKind::Completed { attempt: job.attempt });
                job.result = variables.clone();
                out.activated_to_completed.push(self.clock - job.activated_at);
                out.count(&job.spec.job_type, Outcome::Completed);
                out.finished.push(job);
                Ok(CommandResult::Done)
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
            } => {
                if *retries < 0 || *back_off_ms < 0 {
                    return Err(CommandError::invalid("retries and retry_back_off must be zero or more"));
                }
                if self.already_failed(*key, *attempt) {
                    // A retried request whose first send took effect.
                    return Ok(CommandResult::Done);
                }
                self.activation_of(*key, *attempt, "fail")?;
                // Decide everything that can refuse the failure before changing the job.
                let spec = if variables.is_empty() {
                    None
                } else {
                    Some(self.spec_with_variables(*key, variables, *max_payload_bytes, "fail")?)
                };
                let now = self.clock;
                let job = self.jobs.get_mut(key).expect("checked by activation_of");
                if let Some(spec) = spec {
                    job.spec = spec;
                    out.specs.push(*key);
                }
                self.deadlines.remove(&(job.deadline, *key));
                self.held.remove(&(job.session, *key));
                job.deadline = 0;
                let (retries, back_off_ms) = match reason {
                    FailReason::MalformedPayload | FailReason::BusinessError => (0, 0),
                    FailReason::WorkerShutdown => (job.retries, 0),
                    _ => (*retries, *back_off_ms),
                };
                job.retries = retries;
                job.failed_attempt = job.attempt;
                job.fail_reason = *reason;
                job.error_message.clone_from(error_message);
                job.history.record(
                    now,
                    EventKind::Failed {
                        attempt: job.attempt,
                        reason: *reason,
                        message: error_message.clone(),
                        retries,
                        back_off_ms: if retries == 0 { 0 } else { back_off_ms },
                    },
                );
                out.count(&job.spec.job_type, Outcome::Failed);
                out.failures.push((job.spec.job_type.clone(), *reason, job.worker.clone()));
                if retries == 0 {
                    out.count(&job.spec.job_type, Outcome::Incident);
                    job.history.record(now, EventKind::Incident);
                    job.state = JobState::Incident;
                } else if back_off_ms > 0 {
                    job.state = JobState::Scheduled;
                    job.due_at = now.saturating_add(back_off_ms);
                    self.due.insert((job.due_at, *key));
                } else {
                    job.state = JobState::Activatable;
                    self.make_ready(*key, out);
                }
                out.touched.push(*key);
                Ok(CommandResult::Done)
            }
            Command::UpdateTimeout { key, attempt, timeout_ms } => {
                if *timeout_ms <= 0 {
                    return Err(CommandError::invalid("timeout must be greater than zero"));
                }
                self.activation_of(*key, *attempt, "update the timeout of")?;
                let deadline = self.clock.saturating_add(*timeout_ms);
                let job = self.jobs.get_mut(key).expect("checked by activation_of");
                self.deadlines.remove(&(job.deadline, *key));
                job.deadline = deadline;
                // Later checkpoints extend by the timeout the worker asked for last.
                job.timeout_ms = *timeout_ms;
                job.history.record(self.clock, EventKind::Extended { attempt: job.attempt, deadline, count: 1 });
                self.deadlines.insert((deadline, *key));
                out.touched.push(*key);
                Ok(CommandResult::Deadline(deadline))
            }
            Command::UpdateRetries { key, retries, by } => {
                if *retries < 0 {
                    return Err(CommandError::invalid("retries must be zero or more"));
                }
                let now = self.clock;
                let job = self.live_job(*key)?;
                job.retries = *retries;
                job.history.record(now, EventKind::RetriesUpdated { retries: *retries, by: by.clone() });
                let revive = job.state == JobState::Incident && *retries > 0;
                if revive {
                    job.state = JobState::Activatable;
                    job.error_message.clear();
                    self.make_ready(*key, out);
                }
                out.touched.push(*key);
                Ok(CommandResult::Done)
            }
            Command::Cancel { key, by } => {
                self.live_job(*key)?;
                let mut job = self.remove(*key);
                job.state = JobState::Cancelled;
                job.history.record(self.clock, EventKind::Cancelled { by: by.clone() });
                out.count(&job.spec.job_type, Outcome::Cancelled);
                out.finished.push(job);
                Ok(CommandResult::Done)
            }
            Command::Checkpoint { key, attempt, stage, variables, max_payload_bytes } => {
                self.checkpoint(*key, *attempt, stage, variables, *max_payload_bytes, out)
            }
            Command::Yield { key, attempt, gateway, reason } => {
                self.activation_of(*key, *attempt, "yield")?;
                let job = self.jobs.get_mut(key).expect("checked by activation_of");
                self.deadlines.remove(&(job.deadline, *key));
                self.held.remove(&(job.session, *key));
                job.deadline = 0;
                job.state = JobState::Activatable;
                job.history.record(
                    self.clock,
                    EventKind::Yielded { attempt: job.attempt, gateway: *gateway, reason: *reason },
                );
                out.count(&job.spec.job_type, Outcome::Yielded);
                self.make_ready(*key, out);
                out.touched.push(*key);
                Ok(CommandResult::Done)
            }
        }
    }

    fn checkpoint(
        &mut self,
        key: JobKey,
        attempt: u32,
        stage: &str,
        variables: &Bytes,
        max_payload_bytes: u64,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        if attempt == 0 {
            return Err(CommandError::invalid(format!(
                "cannot checkpoint job {key} without the activation's attempt: a checkpoint is fenced by it"
            )));
        }
        self.activation_of(key, attempt, "checkpoint")?;
        // The fence may name the activation by its tag; record the attempt itself.
        let attempt = self.jobs[&key].attempt;
        // A retried checkpoint whose first send took effect extends the lease again.
        let repeat = self.jobs[&key].checkpoints.last().is_some_and(|c| c.stage == stage && c.attempt == attempt);
        if !repeat {
            self.check_stage_order(key, stage)?;
        }
        let spec = if variables.is_empty() || repeat {
            None
        } else {
            Some(self.spec_with_variables(key, variables, max_payload_bytes, "checkpoint")?)
        };
        let now = self.clock;
        let job = self.jobs.get_mut(&key).expect("checked by activation_of");
        if let Some(spec) = spec {
            job.spec = spec;
            out.specs.push(key);
        }
        if !repeat {
            job.checkpoints.push(Checkpoint { stage: stage.to_string(), attempt, at: now });
            job.history.record(now, EventKind::Checkpointed { attempt, stage: stage.to_string() });
            out.checkpoints.push((job.spec.job_type.clone(), stage.to_string()));
            out.count(&job.spec.job_type, Outcome::Checkpointed);
        }
        // A checkpoint is a sign of life: the lease runs a full timeout from now.
        self.deadlines.remove(&(job.deadline, key));
        job.deadline = now.saturating_add(job.timeout_ms.max(1));
        self.deadlines.insert((job.deadline, key));
        out.touched.push(key);
        Ok(CommandResult::Deadline(job.deadline))
    }

    fn register(&mut self, info: &Arc<SessionInfo>, out: &mut ApplyOutput) {
        let now = self.clock;
        out.sessions_changed = true;
        if let Some(session) = self.sessions.get_mut(&info.id) {
            // A repeated registration (its first answer was lost): renew the lease.
            self.session_expiry.remove(&(session.expires_at(), info.id));
            session.last_beat = now;
            self.session_expiry.insert((session.expires_at(), info.id));
            return;
        }
        let session = Session::new(Arc::clone(info), now);
        self.session_expiry.insert((session.expires_at(), info.id));
        self.sessions.insert(info.id, session);
        self.offer(info, out);
    }

    /// Marks the types a session serves as available, so leaders offer their
    /// waiting jobs to its streams.
    fn offer(&self, info: &SessionInfo, out: &mut ApplyOutput) {
        for job_type in &info.job_types {
            if !out.available.contains(job_type) {
                out.available.push(job_type.clone());
            }
        }
    }

    fn beat(
        &mut self,
        id: SessionId,
        state: WorkerState,
        held: &[(JobKey, u32)],
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        let now = self.clock;
        let Some(session) = self.sessions.get_mut(&id) else {
            return Err(unknown_session(id));
        };
        self.session_expiry.remove(&(session.expires_at(), id));
        let was_taking = session.takes_jobs();
        session.last_beat = now;
        session.reported = state;
        self.session_expiry.insert((session.expires_at(), id));
        let directed = session.directed;
        if !was_taking && session.takes_jobs() {
            let info = Arc::clone(&session.info);
            self.offer(&info, out);
        }
        out.sessions_changed = true;
        let (mut revoked, mut renewed) = (Vec::new(), Vec::new());
        for &(key, attempt) in held {
            let Some(job) = self.jobs.get_mut(&key) else {
                revoked.push(key);
                continue;
            };
            if job.state != JobState::Activated || job.attempt != attempt {
                revoked.push(key);
                continue;
            }
            if job.session != id {
                // Held through another activation path; not this session's to renew.
                continue;
            }
            renewed.push(key);
            // The visibility timeout: a beat keeps the job a full timeout from now.
            let deadline = now.saturating_add(job.timeout_ms.max(1));
            if deadline > job.deadline {
                self.deadlines.remove(&(job.deadline, key));
                job.deadline = deadline;
                self.deadlines.insert((deadline, key));
                job.history.record(now, EventKind::Extended { attempt, deadline, count: 1 });
                out.touched.push(key);
            }
        }
        Ok(CommandResult::Beat { directed, revoked, renewed })
    }

    fn direct(&mut self, target: &SessionTarget, state: WorkerState, out: &mut ApplyOutput) -> Vec<(Session, u32)> {
        let mut covered = Vec::new();
        let mut resumed = Vec::new();
        for session in self.sessions.values_mut().filter(|s| target.matches(&s.info)) {
            let was_taking = session.takes_jobs();
            session.directed = state;
            if !was_taking && session.takes_jobs() {
                resumed.push(Arc::clone(&session.info));
            }
            covered.push(session.clone());
        }
        for info in resumed {
            self.offer(&info, out);
        }
        out.sessions_changed |= !covered.is_empty();
        covered
            .into_iter()
            .map(|s| {
                let held = self.held_by(s.info.id) as u32;
                (s, held)
            })
            .collect()
    }

    /// Ends a session: what it still holds is handed back at once, no retry used.
    fn end_session(&mut self, id: SessionId, out: &mut ApplyOutput) {
        let Some(session) = self.sessions.remove(&id) else { return };
        self.session_expiry.remove(&(session.expires_at(), id));
        out.sessions_changed = true;
        for key in self.take_held(id) {
            let Some(job) = self.jobs.get_mut(&key) else { continue };
            if job.state != JobState::Activated {
                continue;
            }
            self.deadlines.remove(&(job.deadline, key));
            job.deadline = 0;
            job.failed_attempt = job.attempt;
            job.fail_reason = FailReason::SessionEnded;
            job.error_message = format!("worker {:?} ended its session while holding the job", session.info.worker);
            job.history.record(
                self.clock,
                EventKind::Failed {
                    attempt: job.attempt,
                    reason: FailReason::SessionEnded,
                    message: job.error_message.clone(),
                    retries: job.retries,
                    back_off_ms: 0,
                },
            );
            job.state = JobState::Activatable;
            out.count(&job.spec.job_type, Outcome::Failed);
            out.failures.push((job.spec.job_type.clone(), FailReason::SessionEnded, job.worker.clone()));
            self.make_ready(key, out);
        }
    }

    /// Checks that `stage` is declared by the job and after its last committed one.
    fn check_stage_order(&self, key: JobKey, stage: &str) -> Result<(), CommandError> {
        let job = &self.jobs[&key];
        let declared = &job.spec.stages;
        if declared.is_empty() {
            return Err(CommandError::precondition(format!(
                "cannot checkpoint job {key}: it declares no stages (give stages when creating the job)"
            )));
        }
        let Some(position) = declared.iter().position(|s| s == stage) else {
            return Err(CommandError::invalid(format!(
                "cannot checkpoint job {key} at stage {stage:?}: its stages are {declared:?}"
            )));
        };
        if let Some(last) = job.checkpoints.last() {
            let reached = declared.iter().position(|s| *s == last.stage).unwrap_or(0);
            if position <= reached {
                return Err(CommandError::precondition(format!(
                    "cannot checkpoint job {key} at stage {stage:?}: stage {:?} is already committed (by attempt \
                     {}), and stages only move forward along {declared:?}; resume after it",
                    last.stage, last.attempt
                )));
            }
        }
        Ok(())
    }

    /// The job's spec with `update` merged into its variables (see
    /// [`Command::Fail`]); refused when the result outgrows the payload limit.
    fn spec_with_variables(
        &self,
        key: JobKey,
        update: &[u8],
        max_payload_bytes: u64,
        verb: &str,
    ) -> Result<Arc<JobSpec>, CommandError> {
        let spec = &self.jobs[&key].spec;
        let merged = merge_variables(&spec.variables, update).map_err(|e| {
            CommandError::invalid(format!("cannot {verb} job {key}: variables must be a JSON object ({e})"))
        })?;
        let headers: usize = spec.custom_headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        let payload = (merged.len() + headers) as u64;
        // A job created under a larger limit may keep its size, never grow past this one.
        if payload > max_payload_bytes && merged.len() > spec.variables.len() {
            return Err(CommandError::exhausted(format!(
                "cannot {verb} job {key} with these variables: merged into the job's, its variables and custom \
                 headers would be {payload} bytes; this node accepts at most {max_payload_bytes} (setting \
                 max_payload_bytes); send fewer or smaller variables, or none"
            )));
        }
        Ok(Arc::new(JobSpec { variables: merged, ..JobSpec::clone(spec) }))
    }

    fn create(&mut self, new_job: &NewJob, out: &mut ApplyOutput) -> Result<CommandResult, CommandError> {
        if let Some(request) = &new_job.request {
            if let Some(seen) = self.requests.get(request) {
                if matches!(request, RequestId::Key { .. }) && seen.fingerprint != payload_fingerprint(&new_job.spec) {
                    return Err(CommandError::precondition(format!(
                        "{request} was used for job {} with another type, variables or custom headers; \
                         an idempotency key names one job's content for its whole window",
                        seen.job
                    )));
                }
                let state = self.jobs.get(&seen.job).map(|job| job.state);
                return Ok(CommandResult::Created { key: seen.job, created: false, state });
            }
        }
        if let Some(schema) = self.schemas.get(&new_job.spec.job_type) {
            schema.check(&new_job.spec.variables).map_err(|e| {
                CommandError::invalid(format!(
                    "the variables do not match the schema of job type {:?} {e}",
                    new_job.spec.job_type
                ))
            })?;
        }
        let now = self.clock;
        let key = JobKey::new(self.partition, self.next_counter);
        self.next_counter += 1;
        let due_at = match new_job.run_at {
            Some(at) => at,
            None => now.saturating_add(new_job.delay_ms.max(0)),
        };
        let state = if due_at > now { JobState::Scheduled } else { JobState::Activatable };
        let mut job = Job {
            key,
            spec: Arc::clone(&new_job.spec),
            state,
            retries: new_job.retries,
            attempt: 0,
            worker: String::new(),
            deadline: 0,
            due_at: due_at.max(now),
            created_at: now,
            error_message: String::new(),
            result: Default::default(),
            activated_at: 0,
            failed_attempt: 0,
            timeout_ms: 0,
            fail_reason: FailReason::Failed,
            checkpoints: Vec::new(),
            session: 0,
            history: History::default(),
        };
        let gateway = match &new_job.request {
            Some(RequestId::Gateway { node, .. }) => *node,
            _ => 0,
        };
        job.history.record(
            now,
            EventKind::Created {
                user: new_job.spec.user.clone(),
                gateway,
                idempotency_key: new_job.spec.idempotency_key.clone(),
            },
        );
        out.count(&new_job.spec.job_type, Outcome::Created);
        self.jobs.insert(key, job);
        if state == JobState::Scheduled {
            self.due.insert((due_at, key));
        } else {
            self.make_ready(key, out);
        }
        out.touched.push(key);
        out.specs.push(key);
        if let Some(request) = &new_job.request {
            self.remember(request, key, &new_job.spec, new_job.dedupe_window_ms, out);
        }
        Ok(CommandResult::Created { key, created: true, state: Some(state) })
    }

    fn remember(&mut self, request: &RequestId, job: JobKey, spec: &JobSpec, window: Millis, out: &mut ApplyOutput) {
        let fingerprint = match request {
            RequestId::Key { .. } => payload_fingerprint(spec),
            RequestId::Gateway { .. } => 0,
        };
        let entry = Deduped { job, expires_at: self.clock.saturating_add(window.max(0)), fingerprint };
        let id = request_storage_id(entry.expires_at, self.next_request_seq);
        self.next_request_seq += 1;
        if let Some(displaced) = self.request_expiry.insert(id, request.clone()) {
            // Only when over a million entries expire in one ms: forget the
            // older one rather than keep an entry storage cannot hold.
            self.requests.remove(&displaced);
        }
        // Every entry expires a window after it came, so the table churns at a
        // steady size. Left to itself, a hash table that churns grows only when
        // an insert finds no empty slot, which can be many windows after the
        // entries outgrew half of it (about seven minutes at 500 creates a
        // second): a step of memory long after the load began. Kept at most half
        // full, it reaches its size while the first window fills, and its own
        // clean-ups of removed entries stay in place. (`capacity()` counts
        // removed entries' slots as taken until such a clean-up, so the room is
        // noted when the table grows, the one moment it has none.)
        if self.requests.len() + 1 > self.requests_room / 2 {
            self.requests.reserve(self.requests.len() + 1);
            self.requests_room = self.requests.capacity();
        }
        self.requests.insert(request.clone(), entry);
        out.requests_added.push((id, request.clone(), entry));
    }

    /// Entries the dedupe table can hold before it grows (tests).
    #[cfg(test)]
    pub(crate) fn dedupe_capacity(&self) -> usize {
        self.requests.capacity()
    }

    fn activate(&mut self, activation: &Activation, out: &mut ApplyOutput) -> Vec<ActivatedJobData> {
        let mut activated = Vec::new();
        let timeout_ms = activation.timeout_ms.max(1);
        let deadline = self.clock.saturating_add(timeout_ms);
        let mut bytes = 0u64;
        // The queues this taker may serve, decided once per queue.
        let queues: Vec<QueueKey> = self.ready.get(&activation.job_type).map_or_else(Vec::new, |queues| {
            queues
                .keys()
                .filter(|k| {
                    activation.tenants.contains(&k.tenant)
                        && k.routing.admits(&k.tenant, &activation.taker, &activation.rivals)
                })
                .cloned()
                .collect()
        });
        while (activated.len() as u32) < activation.max_jobs {
            let Some((queue, key)) = self.best_ready(&activation.job_type, &queues) else { break };
            let size = ActivatedJobData::encoded_len(&self.jobs[&key].spec, &activation.worker) as u64;
            // The first job is taken whatever its size: one job always fits a
            // message, and a job that never fit the budget would never run.
            if !activated.is_empty() && bytes.saturating_add(size) > activation.max_bytes {
                break;
            }
            bytes = bytes.saturating_add(size);
            let popped = self.pop_ready(&activation.job_type, &queues[queue]);
            debug_assert_eq!(popped, Some(key));
            let job = self.jobs.get_mut(&key).expect("ready jobs are in memory");
            job.state = JobState::Activated;
            job.attempt += 1;
            job.activated_at = self.clock;
            out.created_to_activated.push(self.clock - job.created_at);
            job.worker.clone_from(&activation.worker);
            job.deadline = deadline;
            job.timeout_ms = timeout_ms;
            job.session = activation.session;
            job.history.record(
                self.clock,
                EventKind::Activated {
                    attempt: job.attempt,
                    worker: activation.worker.clone(),
                    session: activation.session,
                    via: activation.via,
                },
            );
            if activation.session != 0 {
                self.held.insert((activation.session, key));
            }
            self.deadlines.insert((deadline, key));
            out.touched.push(key);
            out.count(&activation.job_type, Outcome::Activated);
            activated.push(ActivatedJobData {
                key,
                spec: Arc::clone(&job.spec),
                worker: job.worker.clone(),
                retries: job.retries,
                deadline,
                attempt: job.attempt,
                created_at: job.created_at,
                stage: job.stage().unwrap_or_default().to_string(),
            });
        }
        activated
    }

    /// The best ready job of a type over the queues (highest priority, then
    /// oldest), with the index of its queue in `queues`.
    fn best_ready(&self, job_type: &str, queues: &[QueueKey]) -> Option<(usize, JobKey)> {
        let ready = self.ready.get(job_type)?;
        queues
            .iter()
            .enumerate()
            .filter_map(|(i, k)| ready.get(k).and_then(|q| q.first()).map(|first| (*first, i)))
            .min_by_key(|(first, _)| *first)
            .map(|((_, key), i)| (i, key))
    }

    /// Takes the first job off one of a type's ready queues (the one
    /// [`Self::best_ready`] named).
    fn pop_ready(&mut self, job_type: &str, queue_key: &QueueKey) -> Option<JobKey> {
        let queues = self.ready.get_mut(job_type)?;
        let queue = queues.get_mut(queue_key)?;
        let (_, key) = queue.pop_first()?;
        if queue.is_empty() {
            queues.remove(queue_key);
            if queues.is_empty() {
                self.ready.remove(job_type);
            }
        }
        Some(key)
    }

    /// Whether attempt `attempt` of `key` already failed, by a worker's own
    /// failure, and nothing has activated the job since. An attempt the
    /// broker ended because its session died or ended is not: the worker's
    /// failure (and its back-off) did not take effect, and it is told so
    /// rather than answered OK.
    fn already_failed(&self, key: JobKey, attempt: u32) -> bool {
        attempt != 0
            && self.jobs.get(&key).is_some_and(|job| {
                job.state != JobState::Activated
                    && fence_admits(attempt, job.attempt)
                    && job.failed_attempt == job.attempt
                    && !job.fail_reason.by_broker()
            })
    }

    /// Checks that `key` is activated under the fence `attempt` (see [`fence_admits`]).
    fn activation_of(&self, key: JobKey, attempt: u32, verb: &str) -> Result<(), CommandError> {
        let Some(job) = self.jobs.get(&key) else {
            return Err(self.absent(key));
        };
        if job.state != JobState::Activated {
            let over =
                if attempt & TAGGED_ATTEMPT != 0 { job.attempt > 0 } else { attempt != 0 && job.attempt >= attempt };
            if over {
                return Err(CommandError::precondition(format!(
                    "cannot {verb} job {key}: {} is over (it timed out or was handed back; the job is {}); \
                     the job is no longer yours",
                    describe_fence(attempt),
                    job.state.as_str()
                )));
            }
            return Err(CommandError::precondition(format!(
                "cannot {verb} job {key}: it is {}, not activated",
                job.state.as_str()
            )));
        }
        if !fence_admits(attempt, job.attempt) {
            return Err(CommandError::precondition(format!(
                "cannot {verb} job {key}: {} was superseded by attempt {} (it timed out and was activated \
                 again); the job is no longer yours",
                describe_fence(attempt),
                job.attempt
            )));
        }
        Ok(())
    }

    fn live_job(&mut self, key: JobKey) -> Result<&mut Job, CommandError> {
        if !self.jobs.contains_key(&key) {
            return Err(self.absent(key));
        }
        Ok(self.jobs.get_mut(&key).expect("just checked"))
    }

    fn absent(&self, key: JobKey) -> CommandError {
        if self.was_created(key) {
            CommandError::precondition(format!("job {key} is already completed or cancelled"))
        } else {
            CommandError::not_found(key)
        }
    }

    /// Removes a job from memory and every index.
    fn remove(&mut self, key: JobKey) -> Job {
        let job = self.jobs.remove(&key).expect("caller checked the job exists");
        self.unindex(&job);
        job
    }

    fn make_ready(&mut self, key: JobKey, out: &mut ApplyOutput) {
        let job = &self.jobs[&key];
        let job_type = &job.spec.job_type;
        if !out.available.iter().any(|t| t == job_type) {
            out.available.push(job_type.clone());
        }
        let entry = (Reverse(job.spec.priority), key);
        // The type's queue usually exists: look it up before cloning names.
        let queue = match self.ready.get_mut(job_type) {
            Some(queues) => queues.entry(QueueKey::of(job)).or_default(),
            None => self.ready.entry(job_type.clone()).or_default().entry(QueueKey::of(job)).or_default(),
        };
        queue.insert(entry);
        out.touched.push(key);
    }

    fn index(&mut self, job: &Job) {
        match job.state {
            JobState::Activatable => {
                self.ready
                    .entry(job.spec.job_type.clone())
                    .or_default()
                    .entry(QueueKey::of(job))
                    .or_default()
                    .insert((Reverse(job.spec.priority), job.key));
            }
            JobState::Activated => {
                self.deadlines.insert((job.deadline, job.key));
                if job.session != 0 {
                    self.held.insert((job.session, job.key));
                }
            }
            JobState::Scheduled => {
                self.due.insert((job.due_at, job.key));
            }
            JobState::Incident | JobState::Completed | JobState::Cancelled => {}
        }
    }

    fn unindex(&mut self, job: &Job) {
        match job.state {
            JobState::Activatable => {
                if let Some(queues) = self.ready.get_mut(&job.spec.job_type) {
                    let key = QueueKey::of(job);
                    if let Some(queue) = queues.get_mut(&key) {
                        queue.remove(&(Reverse(job.spec.priority), job.key));
                        if queue.is_empty() {
                            queues.remove(&key);
                        }
                    }
                    if queues.is_empty() {
                        self.ready.remove(&job.spec.job_type);
                    }
                }
            }
            JobState::Activated => {
                self.deadlines.remove(&(job.deadline, job.key));
                self.held.remove(&(job.session, job.key));
            }
            JobState::Scheduled => {
                self.due.remove(&(job.due_at, job.key));
            }
            JobState::Incident | JobState::Completed | JobState::Cancelled => {}
        }
    }
}

fn unknown_session(id: SessionId) -> CommandError {
    CommandError {
        kind: ErrorKind::NotFound,
        message: format!(
            "no worker session {id:x}: it ended, or missed its heartbeats for its dead-after time; register again"
        ),
    }
}

/// `update`'s top-level keys written over `current`'s (both JSON objects).
/// Values keep the bytes they were sent as; the top level is written anew,
/// keys in order.
fn merge_variables(current: &[u8], update: &[u8]) -> Result<Bytes, serde_json::Error> {
    let mut merged: BTreeMap<String, &RawValue> = serde_json::from_slice(current)?;
    let update: BTreeMap<String, &RawValue> = serde_json::from_slice(update)?;
    merged.extend(update);
    Ok(Bytes::from(serde_json::to_vec(&merged)?))
}
