//! The job model, the commands that change it and their results.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::history::{History, Via, YieldReason};
use super::routing::{Routing, Taker};
use super::session::{Session, SessionId, SessionInfo, SessionTarget, WorkerState};

/// A partition id, `0..partition_count`.
pub type PartitionId = u32;

/// Milliseconds since the Unix epoch, as stamped by a partition leader.
pub type Millis = i64;

/// The most partitions a cluster may have. Their ids fit 12 bits, so the top
/// four bits of every [`JobKey`] are zero (the Zeebe gateway carries an
/// attempt tag there).
pub const MAX_PARTITIONS: u32 = 4096;

/// How many low bits of a [`JobKey`] hold the per-partition counter.
const COUNTER_BITS: u32 = 48;
const COUNTER_MASK: u64 = (1 << COUNTER_BITS) - 1;

/// A job's identity. The partition sits in the high 16 bits and a per-partition
/// counter (starting at 1) in the low 48, so any gateway routes by key alone.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobKey(pub u64);

impl JobKey {
    pub fn new(partition: PartitionId, counter: u64) -> Self {
        JobKey(((partition as u64) << COUNTER_BITS) | (counter & COUNTER_MASK))
    }
    pub fn partition(self) -> PartitionId {
        (self.0 >> COUNTER_BITS) as PartitionId
    }
    pub fn counter(self) -> u64 {
        self.0 & COUNTER_MASK
    }
}

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Set in the attempt a job command carries when it names the activation by
/// its tag ([`attempt_tag`]) rather than exactly: the Zeebe gateway's job keys
/// have room for the tag, and Zeebe's requests have no field for an attempt.
pub const TAGGED_ATTEMPT: u32 = 1 << 31;

/// How many tags there are: attempts `n` and `n + ATTEMPT_TAGS` share one.
pub const ATTEMPT_TAGS: u32 = 7;

/// The tag of an attempt, `1..=ATTEMPT_TAGS`; 0 for attempt 0.
pub fn attempt_tag(attempt: u32) -> u32 {
    if attempt == 0 {
        0
    } else {
        (attempt - 1) % ATTEMPT_TAGS + 1
    }
}

/// Whether a command that names activation `fence` may act on the job's
/// activation `attempt`. `fence` is the attempt the command carries:
/// - 0: any activation (an operator's override);
/// - [`TAGGED_ATTEMPT`] | t: any attempt whose tag is t;
/// - anything else: exactly that attempt.
pub fn fence_admits(fence: u32, attempt: u32) -> bool {
    if fence == 0 {
        true
    } else if fence & TAGGED_ATTEMPT != 0 {
        attempt_tag(attempt) == fence & !TAGGED_ATTEMPT
    } else {
        fence == attempt
    }
}

/// A fence as a person reads it, for error messages.
pub fn describe_fence(fence: u32) -> String {
    if fence & TAGGED_ATTEMPT != 0 {
        format!("the activation tagged {}", fence & !TAGGED_ATTEMPT)
    } else {
        format!("activation attempt {fence}")
    }
}

/// The tenant used when a request names none.
pub const DEFAULT_TENANT: &str = "<default>";

/// Where a job is in its lifecycle.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum JobState {
    /// Due later: `run_at`/delay, or a retry back-off that has not elapsed.
    Scheduled,
    /// Waiting for a worker.
    Activatable,
    /// Held by a worker until its deadline.
    Activated,
    /// Done; final.
    Completed,
    /// Failed with no retries left; waits for `UpdateJobRetries`.
    Incident,
    /// Cancelled by a user; final.
    Cancelled,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Scheduled => "scheduled",
            JobState::Activatable => "activatable",
            JobState::Activated => "activated",
            JobState::Completed => "completed",
            JobState::Incident => "incident",
            JobState::Cancelled => "cancelled",
        }
    }
    pub fn is_final(self) -> bool {
        matches!(self, JobState::Completed | JobState::Cancelled)
    }
    pub const ALL: [JobState; 6] = [
        JobState::Scheduled,
        JobState::Activatable,
        JobState::Activated,
        JobState::Completed,
        JobState::Incident,
        JobState::Cancelled,
    ];
    /// The state [`JobState::as_str`] names.
    pub fn parse(name: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// Why an attempt failed, as its worker says; it decides what happens next.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FailReason {
    /// The work failed: retried after the back-off while retries remain.
    #[default]
    Failed,
    /// The job can never succeed as it is: an incident at once, whatever
    /// retries remain.
    MalformedPayload,
    /// Something the job needs is missing for now: retried with back-off.
    ResourceUnavailable,
    /// A transient failure: retried with back-off.
    Intermittent,
    /// The worker stopped before it finished: activatable again at once, no
    /// retry used.
    WorkerShutdown,
    /// The worker itself failed (a bug, a bad machine): retried with
    /// back-off, and counted per worker so operators see where.
    InternalError,
    /// Set by the broker, never sent by a worker: the worker's session missed
    /// its heartbeats for its dead-after time. A failed attempt: one retry
    /// fewer, after the job's retry back-off.
    WorkerDied,
    /// The worker reports a business error (Zeebe's `ThrowError`): nothing
    /// catches it without a process engine, so it is an incident at once,
    /// its message starting with the error code.
    BusinessError,
    /// Set by the broker, never sent by a worker: the worker ended its
    /// session while holding the job. Activatable again at once, no retry
    /// used.
    SessionEnded,
}

impl FailReason {
    pub const ALL: [FailReason; 9] = [
        FailReason::Failed,
        FailReason::MalformedPayload,
        FailReason::ResourceUnavailable,
        FailReason::Intermittent,
        FailReason::WorkerShutdown,
        FailReason::InternalError,
        FailReason::WorkerDied,
        FailReason::BusinessError,
        FailReason::SessionEnded,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            FailReason::Failed => "failed",
            FailReason::MalformedPayload => "malformed-payload",
            FailReason::ResourceUnavailable => "resource-unavailable",
            FailReason::Intermittent => "intermittent",
            FailReason::WorkerShutdown => "worker-shutdown",
            FailReason::InternalError => "internal-error",
            FailReason::WorkerDied => "worker-died",
            FailReason::BusinessError => "business-error",
            FailReason::SessionEnded => "session-ended",
        }
    }

    /// Whether the broker ended the attempt (its worker's session died or
    /// ended), not the worker by failing it: a worker's own failure of that
    /// attempt arriving after it did not take effect.
    pub fn by_broker(self) -> bool {
        matches!(self, FailReason::WorkerDied | FailReason::SessionEnded)
    }
    /// The reason [`FailReason::as_str`] names, among those a worker may
    /// give (not `worker-died` or `session-ended`); empty is `failed`.
    pub fn parse(name: &str) -> Option<FailReason> {
        if name.is_empty() {
            return Some(FailReason::Failed);
        }
        FailReason::ALL.into_iter().filter(|r| !r.by_broker()).find(|r| r.as_str() == name)
    }
}

/// What a producer asked for; immutable once the job exists, so it is shared
/// (`Arc`) between the job record and every activation handed out.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    pub job_type: String,
    pub tenant: String,
    /// A JSON object, as the bytes the producer sent.
    pub variables: Bytes,
    pub custom_headers: Vec<(String, String)>,
    pub priority: i32,
    pub idempotency_key: String,
    /// W3C traceparent of the creating request, empty if none.
    pub traceparent: String,
    /// Who initiated the job, as the producer named them (empty: nobody
    /// named). Part of an idempotency key's scope.
    pub user: String,
    /// The job's declared stages, in order: a chain a worker checkpoints
    /// along ([`Command::Checkpoint`]). Empty when the job declares none.
    pub stages: Vec<String>,
    /// How long after an attempt whose worker died the job is due again.
    pub retry_back_off_ms: Millis,
    /// Which workers may take it (see [`super::routing`]).
    pub routing: Routing,
}

/// A stage a worker committed: the recovery point the next attempt resumes at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub stage: String,
    /// The activation that committed it.
    pub attempt: u32,
    /// Leader time of the commit.
    pub at: Millis,
}

/// A job's full record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub key: JobKey,
    pub spec: Arc<JobSpec>,
    pub state: JobState,
    pub retries: i32,
    /// Activations so far; the current activation's fencing token.
    pub attempt: u32,
    pub worker: String,
    /// While activated: when the activation times out.
    pub deadline: Millis,
    /// When the job was or will be due (creation, run_at, end of back-off).
    pub due_at: Millis,
    pub created_at: Millis,
    pub error_message: String,
    /// Result variables of a completed job (a JSON object).
    pub result: Bytes,
    /// When the current or last activation began.
    pub activated_at: Millis,
    /// The attempt whose failure was last recorded (0: none), so a repeated
    /// `Fail` of that attempt is answered as done rather than refused.
    pub failed_attempt: u32,
    /// The current or last activation's timeout: what a checkpoint extends
    /// the deadline by.
    pub timeout_ms: Millis,
    /// Why the last failed attempt failed (meaningful once one has).
    pub fail_reason: FailReason,
    /// Committed stages, oldest first; each declared stage at most once, in
    /// the declared order.
    pub checkpoints: Vec<Checkpoint>,
    /// The worker session of the current or last activation (0: none).
    pub session: SessionId,
    /// What happened to the job, bounded (see [`History`]).
    pub history: History,
}

impl Job {
    /// The last committed stage, if any.
    pub fn stage(&self) -> Option<&str> {
        self.checkpoints.last().map(|c| c.stage.as_str())
    }
}

/// A create request after validation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewJob {
    pub spec: Arc<JobSpec>,
    pub retries: i32,
    /// Absolute due time; `None` means due at once.
    pub run_at: Option<Millis>,
    /// Delay from the leader's time; zero means none.
    pub delay_ms: i64,
    /// The create's identity: a repeat of it within `dedupe_window_ms` answers
    /// with the first job instead of making a second. `None` only in tests and
    /// tools that accept duplicates.
    pub request: Option<RequestId>,
    /// How long the partition remembers `request`, from when the job is created.
    pub dedupe_window_ms: Millis,
}

/// What makes two creates "the same request", so a retried create finds the
/// job the first one made. Gateways and producers' idempotency keys share one
/// table: `(request id) -> job key`, replicated with the jobs.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RequestId {
    /// Made by a gateway for a create that carried no idempotency key. The
    /// epoch is drawn at each gateway start, so ids never repeat across restarts.
    Gateway { node: u64, epoch: u64, seq: u64 },
    /// A producer's idempotency key, unique within a tenant and user.
    Key { tenant: String, user: String, key: String },
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Gateway { node, epoch, seq } => write!(f, "request {node}/{epoch:x}/{seq}"),
            RequestId::Key { tenant, user, key } if user.is_empty() => {
                write!(f, "idempotency key {key:?} of tenant {tenant:?}")
            }
            RequestId::Key { tenant, user, key } => {
                write!(f, "idempotency key {key:?} of tenant {tenant:?} and user {user:?}")
            }
        }
    }
}

/// Which jobs a listing or a bulk operation covers; every field that is set
/// must match.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobFilter {
    pub state: Option<JobState>,
    /// Empty: any.
    pub job_type: String,
    /// Empty: any.
    pub tenant: String,
    /// The last committed stage; empty: any.
    pub stage: String,
    /// A substring of the last failure's message; empty: any.
    pub error_contains: String,
    /// Created at or after (ms); 0: no bound.
    pub created_from: Millis,
    /// Created before (ms); 0: no bound.
    pub created_to: Millis,
}

impl JobFilter {
    pub fn matches(&self, job: &Job) -> bool {
        self.state.is_none_or(|state| job.state == state)
            && (self.job_type.is_empty() || job.spec.job_type == self.job_type)
            && (self.tenant.is_empty() || job.spec.tenant == self.tenant)
            && (self.stage.is_empty() || job.stage() == Some(self.stage.as_str()))
            && (self.error_contains.is_empty() || job.error_message.contains(&self.error_contains))
            && (self.created_from == 0 || job.created_at >= self.created_from)
            && (self.created_to == 0 || job.created_at < self.created_to)
    }

    /// Whether jobs in memory (not final) can match.
    pub fn covers_live(&self) -> bool {
        self.state.is_none_or(|state| !state.is_final())
    }

    /// Whether final records can match.
    pub fn covers_final(&self) -> bool {
        self.state.is_none_or(JobState::is_final)
    }
}

/// How a read names a job: by key, or by the request that created it (an
/// idempotency key, within its window).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobRef {
    Key(JobKey),
    Request(RequestId),
}

impl JobRef {
    /// The partition that holds the job, or remembers the request.
    pub fn partition(&self, partitions: u32) -> PartitionId {
        match self {
            JobRef::Key(key) => key.partition(),
            JobRef::Request(RequestId::Key { tenant, user, key }) => {
                idempotency_partition(tenant, user, key, partitions)
            }
            JobRef::Request(RequestId::Gateway { .. }) => 0,
        }
    }
}

impl fmt::Display for JobRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobRef::Key(key) => write!(f, "key {key}"),
            JobRef::Request(request) => write!(f, "{request}"),
        }
    }
}

/// What the partition remembers of a create it has run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deduped {
    pub job: JobKey,
    /// When the entry is forgotten (leader time).
    pub expires_at: Millis,
    /// [`payload_fingerprint`] of the first create: a repeat with other
    /// content under the same idempotency key is a client bug, not a retry.
    pub fingerprint: u64,
}

/// A stable 64-bit FNV-1a hash over length-prefixed parts: the same on
/// every platform and version, so replicas and gateways agree on it.
#[derive(Clone, Copy)]
pub struct StableHash(u64);

impl StableHash {
    pub fn new() -> Self {
        StableHash(0xcbf2_9ce4_8422_2325)
    }
    /// Adds one part; its length goes first, so ("ab","c") and ("a","bc") differ.
    pub fn part(mut self, bytes: &[u8]) -> Self {
        for byte in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        self
    }
    pub fn finish(self) -> u64 {
        self.0
    }
}

impl Default for StableHash {
    fn default() -> Self {
        Self::new()
    }
}

/// What makes a job's content, hashed: type, variables, custom headers,
/// declared stages and labels.
pub fn payload_fingerprint(spec: &JobSpec) -> u64 {
    let mut hash = StableHash::new().part(spec.job_type.as_bytes()).part(&spec.variables);
    for (name, value) in &spec.custom_headers {
        hash = hash.part(name.as_bytes()).part(value.as_bytes());
    }
    // Jobs without stages hash as they did before stages existed.
    for stage in &spec.stages {
        hash = hash.part(b"stage").part(stage.as_bytes());
    }
    // Jobs without labels hash as they did before labels existed.
    for label in &spec.routing.required {
        hash = hash.part(b"require").part(label.as_bytes());
    }
    for label in &spec.routing.preferred {
        hash = hash.part(b"prefer").part(label.as_bytes());
    }
    hash.finish()
}

/// The partition of a create with an idempotency key: every repeat of the
/// key goes to the partition that remembers it.
pub fn idempotency_partition(tenant: &str, user: &str, key: &str, partitions: u32) -> PartitionId {
    let mut hash = StableHash::new().part(tenant.as_bytes()).part(key.as_bytes());
    if !user.is_empty() {
        hash = hash.part(user.as_bytes());
    }
    (hash.finish() % u64::from(partitions.max(1))) as PartitionId
}

/// Who an activation is for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Activation {
    pub job_type: String,
    /// Tenants whose jobs may be activated; never empty after validation.
    pub tenants: Vec<String>,
    pub worker: String,
    pub timeout_ms: i64,
    pub max_jobs: u32,
    /// The activated jobs' [`ActivatedJobData::encoded_len`] together stay
    /// within this, so they fit one message; the first job is taken whatever
    /// its size (the payload limit makes one job always fit).
    pub max_bytes: u64,
    /// The worker's session (0: none). A session that is quiet or told to
    /// terminate gets no jobs; one the partition does not know is refused.
    pub session: SessionId,
    /// How the activation reaches its worker, for the jobs' histories.
    pub via: Via,
    /// Who takes the jobs: only jobs whose routing admits it while
    /// `rivals` are open too are activated (see [`super::routing`]).
    pub taker: Taker,
    /// The other open takers of the type, as the leader knows them.
    pub rivals: Vec<Taker>,
}

/// One change requested of a partition. Commands are replicated in batches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Command {
    Create(NewJob),
    Activate(Activation),
    Complete {
        key: JobKey,
        attempt: u32,
        variables: Bytes,
    },
    /// A failed attempt. `variables` (a JSON object; empty for none) are
    /// merged into the job's: their top-level keys replace the job's, so the
    /// next attempt and `GetJob` see them. The merged variables and custom
    /// headers must fit `max_payload_bytes`, the gateway's limit when it built
    /// the command (so every replica judges alike).
    Fail {
        key: JobKey,
        attempt: u32,
        retries: i32,
        error_message: String,
        back_off_ms: i64,
        variables: Bytes,
        max_payload_bytes: u64,
        /// Overrides `retries` and `back_off_ms` for some reasons: see [`FailReason`].
        reason: FailReason,
    },
    UpdateTimeout {
        key: JobKey,
        attempt: u32,
        timeout_ms: i64,
    },
    UpdateRetries {
        key: JobKey,
        retries: i32,
        /// Who asked (the principal's name), for the job's history.
        by: String,
    },
    Cancel {
        key: JobKey,
        /// Who asked (the principal's name), for the job's history.
        by: String,
    },
    /// A pushed activation no client could take: activatable again, no retry used.
    Yield {
        key: JobKey,
        attempt: u32,
        /// The gateway that handed it back, and why: for the job's history.
        gateway: u64,
        reason: YieldReason,
    },
    /// A worker committed `stage` of an activated job (fenced by `attempt`):
    /// `variables` merge into the job's as with [`Command::Fail`], the stage
    /// becomes the job's recovery point, and the deadline moves to now + the
    /// activation's timeout. Stages only move forward along the declared chain.
    Checkpoint {
        key: JobKey,
        attempt: u32,
        stage: String,
        variables: Bytes,
        max_payload_bytes: u64,
    },
    /// A worker session starts (a repeat of a known id only renews its lease).
    Register(Arc<SessionInfo>),
    /// A session's heartbeat: renews its lease, records the state it reports,
    /// and extends the deadline of each listed job it still holds by the
    /// job's activation timeout. Answers [`CommandResult::Beat`].
    Beat {
        session: SessionId,
        state: WorkerState,
        /// (job, attempt) the worker holds on this partition.
        held: Vec<(JobKey, u32)>,
    },
    /// An operator directs sessions to a state. Answers the sessions it covered.
    Direct {
        target: SessionTarget,
        state: WorkerState,
    },
    /// A session ends: jobs it still holds are activatable again at once,
    /// no retry used. Ending an unknown session does nothing.
    EndSession {
        session: SessionId,
    },
    /// Reads every session (answers [`CommandResult::Sessions`]).
    ListSessions,
    /// Registers (or, with an empty schema, removes) the JSON Schema that
    /// creates of a job type must satisfy.
    SetSchema {
        job_type: String,
        schema: Bytes,
    },
    /// Reads a job type's schema (answers [`CommandResult::Schema`]).
    GetSchema {
        job_type: String,
    },
}

/// One Raft entry's worth of commands, stamped with the leader's clock.
/// Applying a batch first fires every timer due at `now`, then runs the commands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    pub now: Millis,
    /// The leader's retention of final records when it wrote this entry; every
    /// replica prunes by the entry's own value, so they prune alike.
    pub retention: Retention,
    pub commands: Vec<Command>,
    /// Set on a new leader's entries until its first one has applied:
    /// every session's lease restarts from `now` before timers fire. While the partition had no leader, no beat
    /// could commit, and a worker that kept beating must not be declared dead
    /// for it.
    pub renew_sessions: bool,
}

impl Batch {
    /// A batch under the default retention.
    pub fn at(now: Millis, commands: Vec<Command>) -> Self {
        Batch { now, retention: Retention::default(), commands, renew_sessions: false }
    }
}

/// How long a partition keeps the records of completed and cancelled jobs
/// readable (`GetJob`, fencing answers) after they finish: until they are
/// older than `max_age_ms`, or until more than `max_jobs` newer ones finished,
/// whichever comes first. Pruning happens as entries apply, so a record may
/// outlive its age on a partition that sees no writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    pub max_age_ms: Millis,
    pub max_jobs: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention { max_age_ms: 10 * 60 * 1000, max_jobs: 100_000 }
    }
}

/// Why a command was refused. Maps to a gRPC status at the edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    InvalidArgument,
    NotFound,
    FailedPrecondition,
    /// A limit of the node was reached (a payload grew too large).
    ResourceExhausted,
    /// The request's principal may not touch this job (never in the log:
    /// decided before a batch is proposed).
    PermissionDenied,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandError {
    pub kind: ErrorKind,
    pub message: String,
}

impl CommandError {
    pub fn not_found(key: JobKey) -> Self {
        CommandError { kind: ErrorKind::NotFound, message: format!("no job with key {key}") }
    }
    pub fn precondition(message: impl Into<String>) -> Self {
        CommandError { kind: ErrorKind::FailedPrecondition, message: message.into() }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        CommandError { kind: ErrorKind::InvalidArgument, message: message.into() }
    }
    pub fn exhausted(message: impl Into<String>) -> Self {
        CommandError { kind: ErrorKind::ResourceExhausted, message: message.into() }
    }
}

/// An activation handed to a worker. Shares the job's spec; no payload copy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActivatedJobData {
    pub key: JobKey,
    pub spec: Arc<JobSpec>,
    pub worker: String,
    pub retries: i32,
    pub deadline: Millis,
    pub attempt: u32,
    pub created_at: Millis,
    /// The last committed stage (empty: none): where this attempt resumes.
    pub stage: String,
}

/// Bytes of a length-prefixed string or byte field as encoded (bincode: a u64 length).
fn field_len(bytes: usize) -> usize {
    8 + bytes
}

impl JobSpec {
    /// The bytes this spec takes when encoded, within a few: what Raft
    /// entries, pushes and replies count against their limits.
    pub fn encoded_len(&self) -> usize {
        let headers: usize = self.custom_headers.iter().map(|(k, v)| field_len(k.len()) + field_len(v.len())).sum();
        field_len(self.job_type.len())
            + field_len(self.tenant.len())
            + field_len(self.variables.len())
            + field_len(headers)
            + 4
            + field_len(self.idempotency_key.len())
            + field_len(self.traceparent.len())
            + field_len(self.user.len())
            + field_len(self.stages.iter().map(|s| field_len(s.len())).sum())
            + self.routing.encoded_len()
            + 8
    }
}

impl Command {
    /// The bytes this command takes when encoded, within a few.
    pub fn encoded_len(&self) -> usize {
        let body = match self {
            Command::Create(job) => job.spec.encoded_len() + 32,
            Command::Activate(a) => {
                let tenants: usize = a.tenants.iter().map(|t| field_len(t.len())).sum();
                let takers: usize = std::iter::once(&a.taker).chain(&a.rivals).map(Taker::encoded_len).sum();
                field_len(a.job_type.len()) + field_len(tenants) + field_len(a.worker.len()) + field_len(takers) + 32
            }
            Command::Complete { variables, .. } => field_len(variables.len()) + 16,
            Command::Fail { error_message, variables, .. } => {
                field_len(error_message.len()) + field_len(variables.len()) + 32
            }
            Command::Checkpoint { stage, variables, .. } => field_len(stage.len()) + field_len(variables.len()) + 32,
            Command::Register(info) => {
                let strings = [&info.worker, &info.hostname].iter().map(|s| field_len(s.len())).sum::<usize>();
                let lists: usize = [&info.job_types, &info.labels, &info.tenants]
                    .iter()
                    .map(|list| field_len(list.iter().map(|s| field_len(s.len())).sum()))
                    .sum();
                strings + lists + 48
            }
            Command::Beat { held, .. } => field_len(held.len() * 12) + 16,
            Command::Direct { target: SessionTarget::Label(label), .. } => field_len(label.len()) + 16,
            Command::SetSchema { job_type, schema } => field_len(job_type.len()) + field_len(schema.len()),
            Command::GetSchema { job_type } => field_len(job_type.len()),
            Command::UpdateTimeout { .. }
            | Command::UpdateRetries { .. }
            | Command::Cancel { .. }
            | Command::Yield { .. }
            | Command::Direct { .. }
            | Command::EndSession { .. }
            | Command::ListSessions => 32,
        };
        4 + body
    }
}

impl ActivatedJobData {
    /// The bytes an activation of a job with `spec` for `worker` takes when
    /// encoded, within a few.
    pub fn encoded_len(spec: &JobSpec, worker: &str) -> usize {
        // The committed stage is one of the declared ones.
        let stage = spec.stages.iter().map(String::len).max().unwrap_or(0);
        spec.encoded_len() + field_len(worker.len()) + field_len(stage) + 40
    }
}

/// The outcome of one command, in the order of the batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CommandResult {
    /// The job a create made, or, for a repeat of a create the partition
    /// remembers (same request id or idempotency key), the job the first one
    /// made (`created: false`).
    Created {
        key: JobKey,
        created: bool,
        /// The job's state now; `None` for a repeat whose job is final and
        /// out of memory (its record is in storage).
        state: Option<JobState>,
    },
    Activated(Vec<ActivatedJobData>),
    Done,
    /// The new deadline after `UpdateTimeout`.
    Deadline(Millis),
    /// A heartbeat's answer: the state the server wants the worker in, the
    /// listed jobs the worker no longer holds (cancelled, timed out,
    /// reassigned, or finished through another activation): it stops them;
    /// and the listed jobs this session holds under the listed attempt (the
    /// only ones a beat renews, and the only ones it may get job tokens for).
    Beat {
        directed: WorkerState,
        revoked: Vec<JobKey>,
        renewed: Vec<JobKey>,
    },
    /// Sessions, each with how many jobs of this partition it holds.
    Sessions(Vec<(Session, u32)>),
    /// A job type's schema; empty when it has none.
    Schema(Bytes),
    Rejected(CommandError),
}

/// What happened to a job, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Created,
    Activated,
    Completed,
    Failed,
    TimedOut,
    Yielded,
    Incident,
    Cancelled,
    Checkpointed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Activated => "activated",
            Outcome::Completed => "completed",
            Outcome::Failed => "failed",
            Outcome::TimedOut => "timed_out",
            Outcome::Yielded => "yielded",
            Outcome::Incident => "incident",
            Outcome::Cancelled => "cancelled",
            Outcome::Checkpointed => "checkpointed",
        }
    }
}
