//! Retry policies at the job API: a create's policy checked and kept in
//! the job's `drover.retry` header, and a failure by the policy sent to the
//! partition, which decides it ([`crate::core::retry`]).
//!
//! The decision is the engine's. Only while a member of the cluster is
//! older than data version 17 (during a rolling upgrade) does this API make
//! it, from a read of the job, with the same function, and send the
//! decided failure as any worker's.

use super::{ApiError, JobApi};
use crate::core::retry::{retry_policy, Backoff, RetryPolicy, RETRY_POLICIES, RETRY_POLICY_HEADER};
use crate::core::{Command, FailReason, JobKey};
use crate::proto::gateway as pb;

/// The longest error type a failure names.
pub const MAX_ERROR_TYPE_LEN: usize = crate::core::retry::MAX_ERROR_TYPE_LEN;

/// Puts a create's retry policy in its custom headers, or checks the one a
/// client (or an adapter) put there; they must agree when both are given.
pub(super) fn policy_header(
    headers: &mut Vec<(String, String)>,
    policy: Option<pb::RetryPolicy>,
) -> Result<(), ApiError> {
    let given = headers.iter().find(|(name, _)| name == RETRY_POLICY_HEADER).map(|(_, text)| text.clone());
    let given = match given {
        Some(text) => Some(RetryPolicy::decode(&text).ok_or_else(|| {
            ApiError::InvalidArgument(format!(
                "the custom header {RETRY_POLICY_HEADER} is the job's retry policy, as a create's retry_policy \
                 writes it; {text:?} is not one (give retry_policy instead)"
            ))
        })?),
        None => None,
    };
    let Some(policy) = policy else { return Ok(()) };
    let policy = from_pb(policy)?;
    match given {
        Some(given) if given != policy => Err(ApiError::InvalidArgument(format!(
            "retry_policy and the custom header {RETRY_POLICY_HEADER} disagree; give one"
        ))),
        Some(_) => Ok(()),
        None => {
            headers.push((RETRY_POLICY_HEADER.to_string(), policy.encode()));
            Ok(())
        }
    }
}

/// The engine's policy a create's names, or why it is not one.
pub fn from_pb(policy: pb::RetryPolicy) -> Result<RetryPolicy, ApiError> {
    let default = RetryPolicy::default();
    let backoff = match policy.backoff.as_str() {
        "" | "exponential" => Backoff::Exponential,
        "linear" => Backoff::Linear,
        "constant" => Backoff::Constant,
        other => {
            return Err(ApiError::InvalidArgument(format!(
                "retry_policy.backoff must be exponential, linear or constant, got {other:?}"
            )))
        }
    };
    let policy = RetryPolicy {
        backoff,
        initial_ms: policy.initial_interval.unwrap_or(default.initial_ms),
        coefficient: policy.backoff_coefficient.unwrap_or(default.coefficient),
        max_ms: policy.max_interval.unwrap_or(default.max_ms),
        jitter: policy.jitter.unwrap_or(default.jitter),
        non_retryable: policy.non_retryable_errors,
    };
    policy.validate().map_err(|why| ApiError::InvalidArgument(format!("retry_policy: {why}")))?;
    Ok(policy)
}

/// A failure by the job's policy, as the engine takes it.
pub(super) fn by_policy(
    key: JobKey,
    attempt: u32,
    request: pb::FailJobRequest,
    variables: bytes::Bytes,
    max_payload_bytes: u64,
) -> Result<Command, ApiError> {
    // Retries -1 is how a client makes an older gateway, which does not know
    // by_policy, refuse the request rather than fail the job for good.
    if !matches!(request.retries, 0 | -1) || request.retry_back_off != 0 || !request.reason.is_empty() {
        return Err(ApiError::InvalidArgument(
            "a failure by_policy leaves retries (or sends -1), retry_back_off and reason out: the job's retry \
             policy decides them"
                .into(),
        ));
    }
    if request.error_type.len() > MAX_ERROR_TYPE_LEN {
        return Err(ApiError::InvalidArgument(format!(
            "error_type is {} bytes; at most {MAX_ERROR_TYPE_LEN}",
            request.error_type.len()
        )));
    }
    Ok(Command::FailByPolicy {
        key,
        attempt,
        error_message: request.error_message,
        error_type: request.error_type,
        retryable: !request.not_retryable,
        jitter: rand::random::<u16>(),
        variables,
        max_payload_bytes,
    })
}

impl JobApi {
    /// `command` as this cluster can take it: a failure by policy stays one
    /// once every member reads it; before, it is decided here, from a read
    /// of the job, and sent as the failure it decided.
    pub(super) async fn as_cluster_takes(
        &self,
        command: Command,
        deadline: std::time::Instant,
    ) -> Result<Command, ApiError> {
        if !matches!(command, Command::FailByPolicy { .. }) {
            return Ok(command);
        }
        let older = self.ctx.transport.peers.versions().cluster_version() < RETRY_POLICIES;
        if !older && crate::failpoints::fire("retry_policy_at_gateway").is_none() {
            return Ok(command);
        }
        let Command::FailByPolicy {
            key,
            attempt,
            error_message,
            error_type,
            retryable,
            jitter,
            variables,
            max_payload_bytes,
        } = command
        else {
            return Ok(command);
        };
        let job = crate::leaders::describe(&self.ctx, key, deadline).await?;
        let policy = retry_policy(&job.spec).unwrap_or_default();
        let (retries, back_off_ms) = policy.decide(job.retries, job.attempt, &error_type, retryable, jitter);
        Ok(Command::Fail {
            key,
            attempt,
            retries,
            error_message,
            back_off_ms,
            variables,
            max_payload_bytes,
            reason: FailReason::Failed,
        })
    }
}
