//! The job model, the commands that change it and their results.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// A partition id, `0..partition_count`.
pub type PartitionId = u32;

/// Milliseconds since the Unix epoch, as stamped by a partition leader.
pub type Millis = i64;

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
}

/// What a producer asked for; immutable once the job exists, so it is shared
/// (`Arc`) between the job record and every activation handed out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    },
    UpdateTimeout {
        key: JobKey,
        attempt: u32,
        timeout_ms: i64,
    },
    UpdateRetries {
        key: JobKey,
        retries: i32,
    },
    Cancel {
        key: JobKey,
    },
    /// A pushed activation no client could take: activatable again, no retry used.
    Yield {
        key: JobKey,
        attempt: u32,
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
}

impl Batch {
    /// A batch under the default retention.
    pub fn at(now: Millis, commands: Vec<Command>) -> Self {
        Batch { now, retention: Retention::default(), commands }
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
}

/// The outcome of one command, in the order of the batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CommandResult {
    Created {
        key: JobKey,
    },
    Activated(Vec<ActivatedJobData>),
    Done,
    /// The new deadline after `UpdateTimeout`.
    Deadline(Millis),
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
        }
    }
}
