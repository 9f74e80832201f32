//! The recorded history: every client operation as an invocation and one
//! completion (`ok`, `fail`: certainly did not happen, `info`: unknown), and
//! every node's final view of every job.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Create,
    Activate,
    Complete,
    Fail,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Invoke,
    Ok,
    Fail,
    Info,
}

/// One event. `id` is the job's unique id (carried in its variables); `key`
/// is Drover's job key once known; `attempt` the activation's fencing token.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
}

/// A job as one node's replica holds it after the faults healed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalJob {
    /// The unique id from the job's variables.
    pub id: u64,
    pub state: String,
}

/// Node -> job key -> what that node holds. Keyed by job key, not id: a create
/// retried after a lost answer can make two jobs with one id.
pub type FinalReads = BTreeMap<usize, BTreeMap<u64, FinalJob>>;
