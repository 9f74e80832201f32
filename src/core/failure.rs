//! Why an attempt failed, and what each reason makes of the job.

use serde::{Deserialize, Serialize};

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
