//! The job: what a producer asked for, its record as the partition keeps it,
//! the activation a worker receives, and the filters listings match jobs by.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::failure::FailReason;
use super::history::History;
use super::ids::SessionId;
use super::ids::{JobKey, Millis, RequestId, StableHash};
use super::routing::Routing;

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
    /// Not activated by its expiry time (see [`EXPIRES_AT_HEADER`]): discarded
    /// unrun; final. Data version 12 and later.
    Expired,
}

/// The custom header that gives a job's expiry (Unix ms): a job not
/// activated by then is never handed out and ends [`JobState::Expired`].
/// The gateway sets it from `CreateJobRequest.expires_at`.
pub const EXPIRES_AT_HEADER: &str = "drover.expires_at";

/// A job's expiry, if its spec names one.
pub fn expires_at(spec: &JobSpec) -> Option<Millis> {
    spec.custom_headers.iter().find(|(name, _)| name == EXPIRES_AT_HEADER).and_then(|(_, at)| at.parse().ok())
}

/// The custom header that gives how long each activation of the job holds
/// it (ms, above 0), whatever timeout the activation that takes it asks:
/// the producer knows how long its job runs, the worker's poll does not.
/// The gateway sets it from `CreateJobRequest.activation_timeout` (the Open
/// Job Spec's `timeout_ms`).
pub const ACTIVATION_TIMEOUT_HEADER: &str = "drover.activation_timeout";

/// The data version from which a job may carry its own activation timeout
/// ([`ACTIVATION_TIMEOUT_HEADER`]): a replica of an older build would give
/// its activations the taker's timeout instead, so such a create is sent
/// only once every member reads it.
pub const JOB_TIMEOUTS: u16 = 19;

/// The activation timeout a job's spec names, if any.
pub fn activation_timeout(spec: &JobSpec) -> Option<Millis> {
    spec.custom_headers
        .iter()
        .find(|(name, _)| name == ACTIVATION_TIMEOUT_HEADER)
        .and_then(|(_, ms)| ms.parse().ok())
        .filter(|ms| *ms > 0)
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
            JobState::Expired => "expired",
        }
    }
    pub fn is_final(self) -> bool {
        matches!(self, JobState::Completed | JobState::Cancelled | JobState::Expired)
    }
    pub const ALL: [JobState; 7] = [
        JobState::Scheduled,
        JobState::Activatable,
        JobState::Activated,
        JobState::Completed,
        JobState::Incident,
        JobState::Cancelled,
        JobState::Expired,
    ];
    /// The state [`JobState::as_str`] names.
    pub fn parse(name: &str) -> Option<JobState> {
        JobState::ALL.into_iter().find(|s| s.as_str() == name)
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

impl NewJob {
    /// A test's create of `spec`: 3 retries, due at once, no request id;
    /// change the rest with `..`.
    pub fn plain(spec: JobSpec) -> NewJob {
        NewJob { spec: Arc::new(spec), retries: 3, run_at: None, delay_ms: 0, request: None, dedupe_window_ms: 0 }
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
pub(super) fn field_len(bytes: usize) -> usize {
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

impl ActivatedJobData {
    /// The bytes an activation of a job with `spec` for `worker` takes when
    /// encoded, within a few.
    pub fn encoded_len(spec: &JobSpec, worker: &str) -> usize {
        // The committed stage is one of the declared ones.
        let stage = spec.stages.iter().map(String::len).max().unwrap_or(0);
        spec.encoded_len() + field_len(worker.len()) + field_len(stage) + 40
    }
}
