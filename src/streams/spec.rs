//! What a worker asks of a stream or a poll, the limits on how many jobs a
//! stream holds, and the form an activated job leaves for its worker in.

use bytes::Bytes;
use serde_json::value::RawValue;

use crate::core::{ActivatedJobData, SessionId};
use crate::proto::gateway as pb;

/// Jobs a worker stream holds at once when it names no limit.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;
/// The largest `max_jobs_in_flight` a stream may ask for.
pub const MAX_IN_FLIGHT_LIMIT: usize = 1000;

/// What a worker asked for, shared by polling and streaming.
#[derive(Clone, Debug)]
pub struct WorkerSpec {
    pub job_type: String,
    pub worker: String,
    pub timeout_ms: i64,
    pub fetch_variables: Vec<String>,
    pub tenants: Vec<String>,
    /// The worker's session (0: none).
    pub session: SessionId,
    /// The worker's `name:value` labels, sorted, without repeats.
    pub labels: Vec<String>,
}

/// Keeps only the named top-level variables; all of them when `names` is empty.
pub fn filter_variables(variables: &Bytes, names: &[String]) -> String {
    let text = std::str::from_utf8(variables).unwrap_or("{}");
    if names.is_empty() {
        return text.to_string();
    }
    let Ok(all) = serde_json::from_str::<std::collections::BTreeMap<&str, &RawValue>>(text) else {
        return text.to_string();
    };
    let kept: std::collections::BTreeMap<&str, &RawValue> =
        all.into_iter().filter(|(name, _)| names.iter().any(|n| n == name)).collect();
    serde_json::to_string(&kept).unwrap_or_else(|_| "{}".into())
}

pub fn activated_job(job: &ActivatedJobData, fetch_variables: &[String]) -> pb::ActivatedJob {
    pb::ActivatedJob {
        key: job.key.0,
        r#type: job.spec.job_type.clone(),
        variables: filter_variables(&job.spec.variables, fetch_variables),
        custom_headers: job.spec.custom_headers.iter().cloned().collect(),
        worker: job.worker.clone(),
        retries: job.retries,
        deadline: job.deadline,
        attempt: job.attempt,
        tenant_id: job.spec.tenant.clone(),
        priority: job.spec.priority,
        traceparent: job.spec.traceparent.clone(),
        created_at: job.created_at,
        stage: job.stage.clone(),
        // Minted where the job leaves for its worker, if tokens are on.
        job_token: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetch_variables_keep_only_named_ones() {
        let vars = Bytes::from_static(br#"{"a":1,"b":{"c":[1,2]},"d":"x"}"#);
        assert_eq!(filter_variables(&vars, &["b".into(), "d".into()]), r#"{"b":{"c":[1,2]},"d":"x"}"#);
        assert_eq!(filter_variables(&vars, &[]), r#"{"a":1,"b":{"c":[1,2]},"d":"x"}"#);
    }
}
