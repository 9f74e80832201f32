//! Worker sessions and job payload schemas, as one partition knows them.
//!
//! A session is a registered worker process. Every partition keeps its own
//! copy of every session: the registration, the state the server directs it
//! to, and a lease renewed by each heartbeat. The jobs a worker holds are
//! spread over all partitions, and each partition recovers its own share by
//! its own replicated clock when the lease runs out, so recovery needs no
//! message between partitions that a leader's death could lose. Gateways fan
//! registrations, heartbeats, directions and ends out to every partition.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::ids::SessionId;

use super::ids::Millis;

/// The data version from which a new leader restarts only the leases its
/// gap threatens ([`super::Command::RenewLeases`]); before it, a take-over
/// restarted every lease in the partition or none.
pub const LEASES_BY_MARGIN: u16 = 18;

/// What a worker is doing, or what the server wants it to do. Ordered by
/// strength: when the worker and the server disagree, the stronger wins.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum WorkerState {
    /// Takes new jobs.
    #[default]
    Running,
    /// Takes no new jobs; finishes those it holds.
    Quiet,
    /// Takes no new jobs, finishes or fails those it holds within its grace
    /// period, and deregisters.
    Terminate,
}

impl WorkerState {
    pub const ALL: [WorkerState; 3] = [WorkerState::Running, WorkerState::Quiet, WorkerState::Terminate];
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Running => "running",
            WorkerState::Quiet => "quiet",
            WorkerState::Terminate => "terminate",
        }
    }
    pub fn parse(name: &str) -> Option<WorkerState> {
        WorkerState::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// What a worker said about itself when it registered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    pub id: SessionId,
    /// The worker's name (recorded on the jobs it activates).
    pub worker: String,
    pub hostname: String,
    pub pid: u32,
    pub job_types: Vec<String>,
    /// Jobs it runs at once.
    pub concurrency: u32,
    /// `name:value` labels, such as `region:eu-west-1`.
    pub labels: Vec<String>,
    pub tenants: Vec<String>,
    /// How often it beats.
    pub heartbeat_ms: Millis,
    /// How long without a beat before it is declared dead.
    pub dead_after_ms: Millis,
}

/// A session as a partition holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Session {
    pub info: Arc<SessionInfo>,
    pub registered_at: Millis,
    /// Leader time of the last beat this partition applied (or of the registration).
    pub last_beat: Millis,
    /// The state the worker reported in its last beat.
    pub reported: WorkerState,
    /// The state an operator directed it to.
    pub directed: WorkerState,
}

impl SessionInfo {
    /// How long a gap with no leader this session's lease rides out: it last
    /// beat at most one interval before the partition's last entry and beats
    /// again about one interval after a new leader took over, so what is
    /// left of its lease for the gap is `dead_after - 2 * heartbeat`.
    pub fn gap_margin(&self) -> Millis {
        self.dead_after_ms.saturating_sub(self.heartbeat_ms.saturating_mul(2))
    }
    /// Whether a gap of `gap` ms with no leader could end this session's
    /// lease though the worker kept beating. Judged at half the margin, so a
    /// hand-over's few milliseconds harm none but the sessions with no
    /// margin at all (a dead-after of exactly twice the heartbeat).
    pub fn threatened_by(&self, gap: Millis) -> bool {
        gap.saturating_mul(2) >= self.gap_margin()
    }
}

impl Session {
    pub fn new(info: Arc<SessionInfo>, now: Millis) -> Self {
        Session {
            info,
            registered_at: now,
            last_beat: now,
            reported: WorkerState::Running,
            directed: WorkerState::Running,
        }
    }
    /// When this partition declares the worker dead, unless it beats first.
    pub fn expires_at(&self) -> Millis {
        self.last_beat.saturating_add(self.info.dead_after_ms.max(1))
    }
    /// The stronger of what the worker reported and what it was directed to.
    pub fn effective(&self) -> WorkerState {
        self.reported.max(self.directed)
    }
    /// Whether it may be handed new jobs.
    pub fn takes_jobs(&self) -> bool {
        self.effective() == WorkerState::Running
    }
}

/// Which sessions an operator's direction covers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionTarget {
    One(SessionId),
    /// Every session with this `name:value` label.
    Label(String),
    All,
}

impl SessionTarget {
    pub fn matches(&self, info: &SessionInfo) -> bool {
        match self {
            SessionTarget::One(id) => info.id == *id,
            SessionTarget::Label(label) => info.labels.iter().any(|l| l == label),
            SessionTarget::All => true,
        }
    }
}

impl fmt::Display for SessionTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionTarget::One(id) => write!(f, "session {id:x}"),
            SessionTarget::Label(label) => write!(f, "sessions labelled {label:?}"),
            SessionTarget::All => write!(f, "every session"),
        }
    }
}

/// A JSON Schema registered for a job type, compiled once per replica.
#[derive(Clone)]
pub struct Schema {
    /// The schema as registered (a JSON document).
    pub source: Bytes,
    validator: Arc<jsonschema::Validator>,
}

impl fmt::Debug for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schema").field("bytes", &self.source.len()).finish()
    }
}

impl Schema {
    /// Compiles a schema; the error says what is wrong with it.
    pub fn compile(source: Bytes) -> Result<Schema, String> {
        let document: serde_json::Value =
            serde_json::from_slice(&source).map_err(|e| format!("the schema is not JSON: {e}"))?;
        if !document.is_object() && !document.is_boolean() {
            return Err("a JSON Schema is an object (or true/false)".into());
        }
        let validator =
            jsonschema::validator_for(&document).map_err(|e| format!("the schema is not a valid JSON Schema: {e}"))?;
        Ok(Schema { source, validator: Arc::new(validator) })
    }

    /// Checks a job's variables; the error names the first failing path.
    pub fn check(&self, variables: &[u8]) -> Result<(), String> {
        let instance: serde_json::Value =
            serde_json::from_slice(variables).map_err(|e| format!("the variables are not JSON: {e}"))?;
        self.validator.validate(&instance).map_err(|error| {
            let path = error.instance_path().to_string();
            let path = if path.is_empty() { "/".to_string() } else { path };
            format!("at {path}: {error}")
        })
    }
}

/// The sessions and schemas of a partition as stored and snapshotted.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Registry {
    pub sessions: Vec<Session>,
    /// (job type, schema source).
    pub schemas: Vec<(String, Bytes)>,
    /// (session, the principal that owns it): sessions registered with
    /// [`crate::core::Command::RegisterOwned`]. Stored and snapshotted on
    /// their own, from data version [`OWNED_SESSIONS`] on, so the layout
    /// above stays that of older versions.
    #[serde(skip)]
    pub owners: Vec<(SessionId, String)>,
    /// (tenant, job type, paused at) of each paused queue. Stored and
    /// snapshotted on their own, from data version
    /// [`crate::core::PAUSED_QUEUES`] on, like `owners`.
    #[serde(skip)]
    pub paused: Vec<(String, String, Millis)>,
    /// Cron schedules. Stored and snapshotted on their own, from data
    /// version [`crate::core::SCHEDULES`] on, like `owners`.
    #[serde(skip)]
    pub schedules: Vec<crate::core::Schedule>,
    /// Workflows, running and retained. Stored one record each, and
    /// snapshotted on their own from data version
    /// [`crate::core::workflow::WORKFLOWS`] on, like `owners`.
    #[serde(skip)]
    pub workflows: Vec<crate::core::workflow::Workflow>,
    /// Queue limits with their buckets. Stored one record each, and
    /// snapshotted on their own from data version
    /// [`crate::core::limit::LIMITS`] on, like `owners`.
    #[serde(skip)]
    pub limits: Vec<crate::core::limit::LimitRecord>,
    /// The cluster plan (partition 0's). Stored as one record, and
    /// snapshotted on its own from data version [`crate::core::plan::PLANS`]
    /// on, like `owners`.
    #[serde(skip)]
    pub plan: Option<Box<crate::core::plan::ClusterPlan>>,
}

/// The data version from which sessions have owners: registrations travel
/// as [`crate::core::Command::RegisterOwned`], and snapshots holding owners
/// are written at this version or later.
pub const OWNED_SESSIONS: u16 = 9;
