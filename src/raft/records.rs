//! How a job is laid out in the state machine's tables.
//!
//! A job's spec (type, variables, headers, labels: [`JobSpec`]) is written
//! once, to `job_specs`, when the job is created, and again only when a
//! worker's failure or checkpoint replaces its variables. What changes at
//! every step (state, attempt, deadline, history: the rest of [`Job`]) is
//! its *progress*, written to `jobs` while the job lives and to `jobs_done`
//! once it is final. So an activation or a completion rewrites a few hundred
//! bytes, not the variables, and a final record is as small as its progress
//! and result. Both records of a job leave together, when its final record
//! is pruned.

use std::sync::Arc;

use crate::core::{Checkpoint, FailReason, History, Job, JobKey, JobSpec, JobState, Millis, SessionId};
use crate::storage::{self, StorageError};

/// Every field of a job but its spec, in two tuples (serde's tuples end at 16).
type Head = (JobKey, JobState, i32, u32, String, Millis, Millis, Millis);
type Tail = ((String, bytes::Bytes, Millis, u32, Millis, FailReason, Vec<Checkpoint>), SessionId, History);

/// The job's progress record: every field but its spec. A field added to
/// [`Job`] must be added to [`Head`] or [`Tail`] for [`decode_progress`] to
/// build a job, and here, for the round-trip test to pass.
pub fn encode_progress(job: &Job) -> Vec<u8> {
    let j = job;
    let head = (j.key, j.state, j.retries, j.attempt, &j.worker, j.deadline, j.due_at, j.created_at);
    let tail =
        (&j.error_message, &j.result, j.activated_at, j.failed_attempt, j.timeout_ms, j.fail_reason, &j.checkpoints);
    storage::encode(&(head, (tail, j.session, &j.history)))
}

/// The job whose progress record is `bytes` and whose spec is `spec`.
pub fn decode_progress(spec: Arc<JobSpec>, bytes: &[u8]) -> Result<Job, StorageError> {
    let (head, tail): (Head, Tail) = storage::decode("job record", bytes)?;
    let (key, state, retries, attempt, worker, deadline, due_at, created_at) = head;
    let ((error_message, result, activated_at, failed_attempt, timeout_ms, fail_reason, checkpoints), session, history) =
        tail;
    Ok(Job {
        key,
        spec,
        state,
        retries,
        attempt,
        worker,
        deadline,
        due_at,
        created_at,
        error_message,
        result,
        activated_at,
        failed_attempt,
        timeout_ms,
        fail_reason,
        checkpoints,
        session,
        history,
    })
}

/// A job's spec from its `job_specs` record, which every job record has.
pub fn decode_spec(job: u64, bytes: Option<Vec<u8>>) -> Result<Arc<JobSpec>, StorageError> {
    let bytes = bytes.ok_or_else(|| {
        StorageError::Io(std::io::Error::other(format!(
            "job {job} has a record but no spec record: the database is damaged"
        )))
    })?;
    Ok(Arc::new(storage::decode("job spec", &bytes)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{EventKind, JobSpec};

    #[test]
    fn progress_and_spec_make_the_whole_job_again() {
        let spec = Arc::new(JobSpec {
            job_type: "email".into(),
            variables: r#"{"to":"a@b.c","body":"a long enough body"}"#.into(),
            custom_headers: vec![("channel".into(), "ops".into())],
            ..Default::default()
        });
        let mut history = History::default();
        history.record(5, EventKind::Completed { attempt: 2 });
        let job = Job {
            key: JobKey(77),
            spec: Arc::clone(&spec),
            state: JobState::Completed,
            retries: 2,
            attempt: 2,
            worker: "w".into(),
            deadline: 9,
            due_at: 3,
            created_at: 1,
            error_message: "e".into(),
            result: r#"{"ok":true}"#.into(),
            activated_at: 4,
            failed_attempt: 1,
            timeout_ms: 1_000,
            fail_reason: FailReason::WorkerDied,
            checkpoints: vec![Checkpoint { stage: "s".into(), attempt: 2, at: 4 }],
            session: 12,
            history,
        };
        let progress = encode_progress(&job);
        assert_eq!(decode_progress(Arc::clone(&spec), &progress).unwrap(), job);
        // The spec is not in the progress record: it is the bytes saved per write.
        // (Each record carries its own version header.)
        let header = crate::codec::HEADER_LEN;
        assert!(progress.len() + storage::encode(&*spec).len() <= storage::encode(&job).len() + header);
        assert!(!progress.windows(5).any(|w| w == b"email"));
        let missing = decode_spec(77, None).unwrap_err().to_string();
        assert!(missing.contains("job 77") && missing.contains("no spec record"), "{missing}");
    }
}
