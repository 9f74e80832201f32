//! The limits every request is held to before anything is replicated, and
//! the message sizes that follow from them.

/// Room in a request for a job's fields besides its payload (type, tenant,
/// trace context, header framing).
const REQUEST_OVERHEAD: usize = 1 << 20;
/// The smallest limit on node-to-node messages.
const MIN_CLUSTER_MESSAGE: usize = 64 << 20;

/// Limits applied before anything is replicated, and the message sizes that
/// follow from them.
///
/// Every size follows from `max_payload_bytes`, so that one job always fits
/// one message anywhere: a client request and a stored job are at most
/// [`Limits::max_request_bytes`]; a node-to-node message (a Raft append, a
/// forwarded batch, a push, a job record with its result, error and worker
/// name) at most [`Limits::max_cluster_message_bytes`]. Batches of several
/// jobs are cut by bytes to stay within these, never beyond one job.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest variables + custom headers of one job, in bytes.
    pub max_payload_bytes: usize,
    /// Longest long poll a worker may ask for.
    pub max_request_timeout_ms: i64,
    /// Most jobs one ActivateJobs call may ask for.
    pub max_jobs_to_activate: i32,
    /// The long poll of a Zeebe ActivateJobs that asks for the default.
    pub zeebe_long_poll_ms: i64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_payload_bytes: 4 << 20,
            max_request_timeout_ms: 600_000,
            max_jobs_to_activate: 1000,
            zeebe_long_poll_ms: 10_000,
        }
    }
}

impl Limits {
    /// The largest request a gateway accepts, and the largest job as stored
    /// ([`JobSpec::encoded_len`]): one job's payload and room for the rest.
    /// Also the byte budget of one ActivateJobs reply.
    pub fn max_request_bytes(&self) -> usize {
        self.max_payload_bytes.saturating_add(REQUEST_OVERHEAD)
    }

    /// The limit on every node-to-node message, encoded and decoded, on every
    /// cluster client and server, and on gateway replies: room for the
    /// largest record of one job (its variables, result, error message and
    /// worker name can each be as large as a request).
    pub fn max_cluster_message_bytes(&self) -> usize {
        self.max_request_bytes().saturating_mul(4).max(MIN_CLUSTER_MESSAGE)
    }
}
