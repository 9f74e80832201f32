//! What a partition tells subscribers: each job's lifecycle transitions
//! (made, activated, completed, failed, retrying, incident, cancelled, timed
//! out) and queue pauses, as a batch applies them. The state machine keeps
//! them for the retention window (`raft::state_machine::events`); the
//! engine only says what happened.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::ids::{JobKey, Millis};
use super::job::JobSpec;

/// A transition subscribers hear of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Lifecycle {
    Created,
    Activated,
    Completed,
    /// An attempt failed (retried or not: [`Lifecycle::Retrying`] or
    /// [`Lifecycle::Incident`] follows).
    Failed,
    /// The job waits out a back-off before another attempt (`detail`: when it is due).
    Retrying,
    /// Out of retries: an incident.
    Incident,
    Cancelled,
    /// An activation timed out: the job is activatable again.
    TimedOut,
    /// A queue of the tenant and type was paused (on partition 0 only).
    QueuePaused,
    QueueResumed,
    /// Not activated by its expiry time: discarded (data version 12 on).
    Expired,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Created => "created",
            Lifecycle::Activated => "activated",
            Lifecycle::Completed => "completed",
            Lifecycle::Failed => "failed",
            Lifecycle::Retrying => "retrying",
            Lifecycle::Incident => "incident",
            Lifecycle::Cancelled => "cancelled",
            Lifecycle::TimedOut => "timed_out",
            Lifecycle::QueuePaused => "queue_paused",
            Lifecycle::QueueResumed => "queue_resumed",
            Lifecycle::Expired => "expired",
        }
    }

    pub fn parse(name: &str) -> Option<Lifecycle> {
        ALL.into_iter().find(|l| l.as_str() == name)
    }
}

/// Every kind, in a job's usual order.
pub fn lifecycle_kinds() -> [Lifecycle; 11] {
    ALL
}

const ALL: [Lifecycle; 11] = [
    Lifecycle::Created,
    Lifecycle::Activated,
    Lifecycle::Completed,
    Lifecycle::Failed,
    Lifecycle::Retrying,
    Lifecycle::Incident,
    Lifecycle::Cancelled,
    Lifecycle::TimedOut,
    Lifecycle::Expired,
    Lifecycle::QueuePaused,
    Lifecycle::QueueResumed,
];

/// One transition as a batch applied it.
#[derive(Clone, Debug)]
pub struct Happened {
    pub lifecycle: Lifecycle,
    /// 0 for a queue's event.
    pub key: JobKey,
    /// The job's spec (its type and tenant), shared with the job.
    pub spec: Arc<JobSpec>,
    pub attempt: u32,
    /// Completed: ms from activation; retrying: when it is due; activated:
    /// the activation's deadline; otherwise 0.
    pub detail: Millis,
    /// Activated: the worker; failed: the error message (cut to
    /// [`MAX_EVENT_TEXT`] bytes); otherwise empty.
    pub text: String,
}

/// The longest text an event keeps.
pub const MAX_EVENT_TEXT: usize = 256;

/// `text` cut to [`MAX_EVENT_TEXT`] bytes at a character boundary.
pub fn event_text(text: &str) -> String {
    let mut end = text.len().min(MAX_EVENT_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}
