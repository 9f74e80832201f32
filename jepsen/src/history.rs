//! The recorded history: every client operation as an invocation and one
//! completion (`ok`, `fail`: certainly did not happen, `info`: unknown), and
//! every node's final view of every job.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    #[default]
    Create,
    Activate,
    Complete,
    Fail,
    /// A stage committed with CheckpointJob.
    Checkpoint,
    /// A streaming worker ended its session: whatever it held goes back
    /// at once (its `process`, no key).
    Release,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    #[default]
    Invoke,
    Ok,
    Fail,
    Info,
}

/// One event. `id` is the job's unique id (carried in its variables as its
/// marker); `key` is Drover's job key once known; `attempt` the activation's
/// fencing token.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Op {
    pub time_ms: u64,
    pub process: u64,
    pub node: usize,
    pub kind: Kind,
    pub phase: Phase,
    pub id: u64,
    #[serde(default)]
    pub key: Option<u64>,
    #[serde(default)]
    pub attempt: u32,
    /// On a create, the job type it asked for; on an activation, the type the
    /// worker asked to receive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_type: Option<String>,
    /// On an activation, the worker name the worker asked for; on a create
    /// sent through OJS, `ojs-producer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// On an activation, the worker name Drover put on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assigned_worker: Option<String>,
    /// On a checkpoint, the stage; on an activation, the stage it resumes after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// On an activation a poll returned: when that poll was sent. The
    /// activation's lease began after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_ms: Option<u64>,
    /// On a create: the delay it asked for; on a failure: the back-off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// On a create: the expiry it asked for (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// On a failure: the retries the worker asked to leave the job (0: none,
    /// an incident).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<i32>,
    /// On an activation: the type of the job as handed out (what the worker
    /// asked for is `job_type`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handed_type: Option<String>,
    /// On an activation: the tenant of the job as handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// A job as one node's replica holds it after the faults healed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalJob {
    /// The unique id from the job's variables.
    pub id: u64,
    pub state: String,
    #[serde(default)]
    pub job_type: String,
    /// Committed stages with the attempt that committed each, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpoints: Vec<(String, u32)>,
    /// Activations so far: for a completed job, the attempt that completed it.
    #[serde(default)]
    pub attempt: u32,
    /// Its timer events in the partition's time: created, failed (with the
    /// back-off asked for), due.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timers: Vec<TimerEvent>,
    /// Its tenant (empty: the default tenant).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tenant: String,
    /// Who acted on it, from the history the replica holds: principals,
    /// workers, failure messages (see `attacker`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub actors: Vec<String>,
    /// Its variables or result carry the attacker's mark.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forged: bool,
    /// Its expiry (Unix ms, partition time; 0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub expires_at: i64,
    /// When each of its activations began, in the partition's time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub activated_at: Vec<i64>,
    /// Each activation the replica records: (attempt, the worker name it was
    /// made out to), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub activations: Vec<(u32, String)>,
    /// Each failure of an attempt the replica records, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<FailureEvent>,
}

/// A failed attempt as a replica's history of the job records it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureEvent {
    pub attempt: u32,
    /// Drover's reason (`worker-error`, `worker-died`, ...).
    pub reason: String,
    /// The retries it left the job.
    pub retries: i32,
    /// Who failed it: the failure's message (a worker's own words).
    #[serde(default)]
    pub message: String,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerEvent {
    pub kind: String,
    pub at: i64,
    #[serde(default)]
    pub back_off: i64,
}

/// Node -> job key -> what that node holds. Keyed by job key, not id, so that
/// two jobs made by one create are both seen.
pub type FinalReads = BTreeMap<usize, BTreeMap<u64, FinalJob>>;
