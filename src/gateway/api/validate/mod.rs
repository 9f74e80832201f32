//! Validation of client input and conversion between the wire and the engine.

use std::sync::Arc;

use bytes::Bytes;

use super::ApiError;
use crate::config::{DedupeWindows, Limits};
use crate::core::{
    Activation, JobFilter, JobSpec, JobState, NewJob, PartitionId, RequestId, Routing, SessionId, Taker, Via,
    ACTIVATION_TIMEOUT_HEADER, DEFAULT_TENANT, EXPIRES_AT_HEADER, MAX_JOB_LABELS,
};
use crate::proto::gateway as pb;
use crate::streams::WorkerSpec;

pub const MAX_TYPE_LEN: usize = 255;
/// Longest tenant id, in bytes.
pub const MAX_TENANT_LEN: usize = 255;
/// Most tenants one worker may name. Every replica walks the list for each job
/// it activates, so the list is bounded like any other per-job cost.
pub const MAX_TENANTS_PER_WORKER: usize = 100;

pub fn job_type(value: &str) -> Result<(), ApiError> {
    if value.is_empty() {
        return Err(ApiError::InvalidArgument("type must not be empty".into()));
    }
    name("type", value, MAX_TYPE_LEN)
}

/// A client-chosen name (type, tenant id, idempotency key): at most `max`
/// bytes, no control characters.
pub fn name(field: &str, value: &str, max: usize) -> Result<(), ApiError> {
    if value.len() > max {
        return Err(ApiError::InvalidArgument(format!(
            "{field} is {} bytes long; at most {max} are allowed",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(ApiError::InvalidArgument(format!("{field} must not contain control characters")));
    }
    Ok(())
}

/// Checks that `text` is a JSON object (empty means `{}`) and returns its bytes
/// without copying.
pub fn json_object(field: &str, text: String) -> Result<Bytes, ApiError> {
    if text.trim().is_empty() {
        return Ok(Bytes::from_static(b"{}"));
    }
    if !text.trim_start().starts_with('{') {
        return Err(ApiError::InvalidArgument(format!("{field} must be a JSON object, like {{\"order\": 42}}")));
    }
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&text) {
        return Err(ApiError::InvalidArgument(format!("{field} is not valid JSON: {e}")));
    }
    Ok(Bytes::from(text))
}

/// A tenant id as a client sent it: empty means the default tenant.
pub fn tenant_id(field: &str, value: String) -> Result<String, ApiError> {
    if value.is_empty() {
        return Ok(DEFAULT_TENANT.to_string());
    }
    name(field, &value, MAX_TENANT_LEN)?;
    Ok(value)
}

/// Variables to merge into a job's (of a failure or a checkpoint, `what`):
/// empty (none) or a JSON object within the payload limit. The engine merges
/// them into the job's and checks the merged size.
pub fn merged_variables(what: &str, text: String, limits: &Limits) -> Result<Bytes, ApiError> {
    if text.trim().is_empty() {
        return Ok(Bytes::new());
    }
    if text.len() > limits.max_payload_bytes {
        return Err(ApiError::ResourceExhausted(format!(
            "the {what}'s variables are {} bytes; this node accepts at most {} (setting max_payload_bytes)",
            text.len(),
            limits.max_payload_bytes
        )));
    }
    json_object("variables", text)
}

pub fn tenants(requested: Vec<String>) -> Result<Vec<String>, ApiError> {
    if requested.len() > MAX_TENANTS_PER_WORKER {
        return Err(ApiError::InvalidArgument(format!(
            "tenant_ids names {} tenants; a worker may name at most {MAX_TENANTS_PER_WORKER}; \
             run one worker per group of tenants",
            requested.len()
        )));
    }
    let mut tenants: Vec<String> =
        requested.into_iter().map(|t| tenant_id("each of tenant_ids", t)).collect::<Result<_, _>>()?;
    if tenants.is_empty() {
        tenants.push(DEFAULT_TENANT.to_string());
    }
    tenants.sort();
    tenants.dedup();
    Ok(tenants)
}

/// The tenants a listing covers: the one it names (which `principal` must
/// act for), or every tenant `principal` acts for ("*" for all of them).
pub fn listed_tenants(principal: &crate::auth::Principal, named: String) -> Result<Vec<String>, ApiError> {
    if named.is_empty() {
        return Ok(if principal.in_tenant("*") { vec!["*".to_string()] } else { principal.tenants.clone() });
    }
    let tenant = tenant_id("tenant_id", named)?;
    principal.require_tenant(&tenant)?;
    Ok(vec![tenant])
}

/// What a create's job weighs against `max_payload_bytes`: its variables and
/// custom headers.
pub fn payload_bytes(request: &pb::CreateJobRequest) -> usize {
    let headers: usize = request.custom_headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    request.variables.len() + headers
}

/// Validates a create. `gateway_request` names it when it carries no
/// idempotency key.
pub fn new_job(
    request: pb::CreateJobRequest,
    traceparent: String,
    limits: &Limits,
    dedupe: &DedupeWindows,
    gateway_request: impl FnOnce() -> RequestId,
) -> Result<NewJob, ApiError> {
    job_type(&request.r#type)?;
    let payload = payload_bytes(&request);
    if payload > limits.max_payload_bytes {
        return Err(ApiError::ResourceExhausted(format!(
            "the job's variables and custom headers are {payload} bytes; this node accepts at most {} \
             (setting max_payload_bytes); store large data elsewhere and pass a reference",
            limits.max_payload_bytes
        )));
    }
    if request.retry_back_off < 0 {
        return Err(ApiError::InvalidArgument(format!(
            "retry_back_off must be zero or more (ms), got {}",
            request.retry_back_off
        )));
    }
    let retries = request.retries.unwrap_or(3);
    if retries < 0 {
        return Err(ApiError::InvalidArgument(format!("retries must be zero or more, got {retries}")));
    }
    if request.delay < 0 || request.run_at < 0 {
        return Err(ApiError::InvalidArgument("delay and run_at must be zero or more".into()));
    }
    if request.delay > 0 && request.run_at > 0 {
        return Err(ApiError::InvalidArgument("give either run_at or delay, not both".into()));
    }
    let variables = json_object("variables", request.variables)?;
    let mut custom_headers: Vec<(String, String)> = request.custom_headers.into_iter().collect();
    expiry(&mut custom_headers, request.expires_at)?;
    activation_timeout(&mut custom_headers, request.activation_timeout)?;
    super::retry::policy_header(&mut custom_headers, request.retry_policy)?;
    custom_headers.sort();
    let tenant = tenant_id("tenant_id", request.tenant_id)?;
    name("user", &request.user, MAX_USER_LEN)?;
    let stages = stages(request.stages)?;
    let routing = routing(request.required_labels, request.preferred_labels)?;
    let (request_id, dedupe_window_ms) = if request.idempotency_key.is_empty() {
        if request.idempotency_window != 0 {
            return Err(ApiError::InvalidArgument("idempotency_window needs an idempotency_key".into()));
        }
        (gateway_request(), millis(dedupe.request))
    } else {
        idempotency_key(&request.idempotency_key)?;
        let window = match request.idempotency_window {
            0 => millis(dedupe.idempotency),
            ms if (MIN_IDEMPOTENCY_WINDOW_MS..=millis(dedupe.idempotency)).contains(&ms) => ms,
            ms => {
                return Err(ApiError::InvalidArgument(format!(
                    "idempotency_window must be between {MIN_IDEMPOTENCY_WINDOW_MS} ms and this node's window, \
                     {} ms (0 for that), got {ms}",
                    millis(dedupe.idempotency)
                )))
            }
        };
        let key =
            RequestId::Key { tenant: tenant.clone(), user: request.user.clone(), key: request.idempotency_key.clone() };
        (key, window)
    };
    let spec = JobSpec {
        job_type: request.r#type,
        tenant,
        variables,
        custom_headers,
        priority: request.priority,
        idempotency_key: request.idempotency_key,
        traceparent,
        user: request.user,
        stages,
        retry_back_off_ms: request.retry_back_off,
        routing,
    };
    stored_size(&spec, limits)?;
    Ok(NewJob {
        spec: Arc::new(spec),
        retries,
        run_at: (request.run_at > 0).then_some(request.run_at),
        delay_ms: request.delay,
        request: Some(request_id),
        dedupe_window_ms,
    })
}

/// Puts a create's expiry in its custom headers (see
/// [`crate::core::EXPIRES_AT_HEADER`]), or checks the one a client put there.
fn expiry(headers: &mut Vec<(String, String)>, expires_at: i64) -> Result<(), ApiError> {
    let field = HeaderField {
        field: "expires_at",
        header: EXPIRES_AT_HEADER,
        what: "expiry",
        unit: "a Unix time in ms above 0",
    };
    field.put(headers, expires_at, 1..=i64::MAX)
}

/// The longest activation timeout a job may name (ms): what an activation's
/// own timeout may be.
pub const MAX_ACTIVATION_TIMEOUT_MS: i64 = i32::MAX as i64;

/// Puts a create's activation timeout in its custom headers (see
/// [`crate::core::ACTIVATION_TIMEOUT_HEADER`]), or checks the one a client
/// put there.
fn activation_timeout(headers: &mut Vec<(String, String)>, timeout: i64) -> Result<(), ApiError> {
    let field = HeaderField {
        field: "activation_timeout",
        header: ACTIVATION_TIMEOUT_HEADER,
        what: "activation timeout",
        unit: "whole ms from 1 to 2147483647",
    };
    field.put(headers, timeout, 1..=MAX_ACTIVATION_TIMEOUT_MS)
}

/// A create's field that the job keeps as a custom header, which a client
/// may give instead: 0 in the field is "not given".
struct HeaderField {
    field: &'static str,
    header: &'static str,
    what: &'static str,
    unit: &'static str,
}

impl HeaderField {
    /// Puts `value` in `headers`, or checks the header a client gave: in
    /// `valid` (which `unit` says in words), and the same as `value` when
    /// both are given.
    fn put(
        &self,
        headers: &mut Vec<(String, String)>,
        value: i64,
        valid: std::ops::RangeInclusive<i64>,
    ) -> Result<(), ApiError> {
        let HeaderField { field, header, what, unit } = self;
        let given = headers.iter().find(|(name, _)| name == header).map(|(_, text)| text.clone());
        match given {
            None if value == 0 => Ok(()),
            None if valid.contains(&value) => {
                headers.push((header.to_string(), value.to_string()));
                Ok(())
            }
            None => Err(ApiError::InvalidArgument(format!("{field} must be 0 (none) or {unit}, got {value}"))),
            Some(text) => match text.parse::<i64>() {
                Ok(given) if valid.contains(&given) && (value == 0 || value == given) => Ok(()),
                Ok(given) if valid.contains(&given) => Err(ApiError::InvalidArgument(format!(
                    "{field} {value} and the custom header {header} ({given}) disagree; give one"
                ))),
                _ => Err(ApiError::InvalidArgument(format!(
                    "the custom header {header} is the job's {what}: {unit}, got {text:?}"
                ))),
            },
        }
    }
}

pub const MAX_USER_LEN: usize = 255;
pub const MAX_STAGES: usize = 32;
pub const MAX_STAGE_LEN: usize = 255;

/// A job's declared stages: a chain of distinct, non-empty names.
fn stages(stages: Vec<String>) -> Result<Vec<String>, ApiError> {
    if stages.len() > MAX_STAGES {
        return Err(ApiError::InvalidArgument(format!(
            "stages names {} stages; a job may declare at most {MAX_STAGES}",
            stages.len()
        )));
    }
    for (i, stage) in stages.iter().enumerate() {
        stage_name(stage)?;
        if stages[..i].contains(stage) {
            return Err(ApiError::InvalidArgument(format!("stage {stage:?} is declared twice; stages are a chain")));
        }
    }
    Ok(stages)
}

/// A stage name, as declared or checkpointed.
pub fn stage_name(stage: &str) -> Result<(), ApiError> {
    if stage.is_empty() {
        return Err(ApiError::InvalidArgument("a stage name must not be empty".into()));
    }
    name("stage", stage, MAX_STAGE_LEN)
}

/// A listing's filter as a client sent it.
pub fn job_filter(filter: Option<pb::JobFilter>) -> Result<JobFilter, ApiError> {
    let filter = filter.unwrap_or_default();
    let state = match filter.state.as_str() {
        "" => None,
        name => Some(JobState::parse(name).ok_or_else(|| {
            let names: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
            ApiError::InvalidArgument(format!("state {name:?} is not one of {}", names.join(", ")))
        })?),
    };
    if filter.created_from < 0 || filter.created_to < 0 {
        return Err(ApiError::InvalidArgument("created_from and created_to must be zero or more".into()));
    }
    Ok(JobFilter {
        state,
        job_type: filter.r#type,
        tenant: filter.tenant_id,
        stage: filter.stage,
        error_contains: filter.error_contains,
        created_from: filter.created_from,
        created_to: filter.created_to,
    })
}

/// The request id an idempotency key names, as a producer gives it.
pub fn idempotency_request(key: String, tenant: String, user: String) -> Result<RequestId, ApiError> {
    idempotency_key(&key)?;
    name("user", &user, MAX_USER_LEN)?;
    Ok(RequestId::Key { tenant: tenant_id("tenant_id", tenant)?, user, key })
}

/// The partition a keyless create with an ordering key goes to (`None`:
/// no ordering key, or an idempotency key, which places the job itself).
pub fn ordering_partition(request: &pb::CreateJobRequest, partitions: u32) -> Result<Option<PartitionId>, ApiError> {
    if request.ordering_key.is_empty() {
        return Ok(None);
    }
    name("ordering_key", &request.ordering_key, MAX_IDEMPOTENCY_KEY_LEN)?;
    if !request.idempotency_key.is_empty() {
        return Ok(None);
    }
    let key = format!("ordering:{}", request.ordering_key);
    Ok(Some(crate::core::idempotency_partition(&request.tenant_id, "", &key, partitions)))
}

/// The shortest window a create may ask for its idempotency key.
pub const MIN_IDEMPOTENCY_WINDOW_MS: i64 = 60_000;
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

fn idempotency_key(key: &str) -> Result<(), ApiError> {
    name("idempotency_key", key, MAX_IDEMPOTENCY_KEY_LEN)
}

fn millis(duration: std::time::Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// Refuses a job that would take more than [`Limits::max_request_bytes`] as
/// stored, which only many tiny custom headers or a huge tenant id reach
/// within the payload limit: every message that carries one job must hold it.
fn stored_size(spec: &JobSpec, limits: &Limits) -> Result<(), ApiError> {
    let stored = spec.encoded_len();
    if stored > limits.max_request_bytes() {
        return Err(ApiError::ResourceExhausted(format!(
            "the job takes {stored} bytes as stored (variables, custom headers at 16 bytes each besides their \
             text, type, tenant and trace context); this node accepts at most {}: use fewer custom headers and \
             store large data elsewhere",
            limits.max_request_bytes()
        )));
    }
    Ok(())
}

/// A stream's `max_jobs_in_flight`: 0 means the default.
pub fn max_jobs_in_flight(requested: i32) -> Result<usize, ApiError> {
    use crate::streams::{DEFAULT_MAX_IN_FLIGHT, MAX_IN_FLIGHT_LIMIT};
    match requested {
        0 => Ok(DEFAULT_MAX_IN_FLIGHT),
        n if n > 0 && n as usize <= MAX_IN_FLIGHT_LIMIT => Ok(n as usize),
        n => Err(ApiError::InvalidArgument(format!(
            "max_jobs_in_flight must be between 1 and {MAX_IN_FLIGHT_LIMIT} (0 for the default, \
             {DEFAULT_MAX_IN_FLIGHT}), got {n}"
        ))),
    }
}

pub fn worker_spec(
    job_type_value: String,
    worker: String,
    timeout_ms: i64,
    mut fetch_variables: Vec<String>,
    tenant_ids: Vec<String>,
    session: SessionId,
    worker_labels: Vec<String>,
) -> Result<WorkerSpec, ApiError> {
    job_type(&job_type_value)?;
    if timeout_ms <= 0 {
        return Err(ApiError::InvalidArgument(format!(
            "timeout must be greater than zero (ms the job stays with the worker), got {timeout_ms}"
        )));
    }
    fetch_variables.sort();
    fetch_variables.dedup();
    Ok(WorkerSpec {
        job_type: job_type_value,
        worker: if worker.is_empty() { "default".into() } else { worker },
        timeout_ms,
        fetch_variables,
        tenants: tenants(tenant_ids)?,
        session,
        labels: labels("labels", worker_labels, MAX_WORKER_LABELS)?,
    })
}

/// A worker has at most this many labels.
pub const MAX_WORKER_LABELS: usize = 32;

/// `name:value` labels (such as `region:eu-west-1`), sorted, without repeats.
pub fn labels(field: &str, mut labels: Vec<String>, max: usize) -> Result<Vec<String>, ApiError> {
    labels.sort_unstable();
    labels.dedup();
    if labels.len() > max {
        return Err(ApiError::InvalidArgument(format!(
            "{field} names {} labels; at most {max} are accepted",
            labels.len()
        )));
    }
    for label in &labels {
        name("a label", label, MAX_LABEL_LEN)?;
        match label.split_once(':') {
            Some((name, value)) if !name.is_empty() && !value.is_empty() => {}
            _ => {
                return Err(ApiError::InvalidArgument(format!(
                    "label {label:?} in {field} is not name:value (for example region:eu-west-1 or pool:critical)"
                )))
            }
        }
    }
    Ok(labels)
}

const MAX_LABEL_LEN: usize = 255;

/// A job's required and preferred labels.
fn routing(required: Vec<String>, preferred: Vec<String>) -> Result<Routing, ApiError> {
    let routing = Routing::new(
        labels("required_labels", required, MAX_JOB_LABELS)?,
        labels("preferred_labels", preferred, MAX_JOB_LABELS)?,
    );
    if routing.required.len() + routing.preferred.len() > MAX_JOB_LABELS {
        return Err(ApiError::InvalidArgument(format!(
            "a job may name at most {MAX_JOB_LABELS} required and preferred labels together"
        )));
    }
    Ok(routing)
}

/// A poll's activation through gateway node `gateway`.
pub fn activation(spec: &WorkerSpec, max_jobs: u32, max_bytes: u64, gateway: u64) -> Activation {
    Activation {
        job_type: spec.job_type.clone(),
        tenants: spec.tenants.clone(),
        worker: spec.worker.clone(),
        timeout_ms: spec.timeout_ms,
        max_jobs,
        max_bytes,
        session: spec.session,
        via: Via::Poll { gateway },
        // The partition leader says whether the gateway is in its region,
        // and which other takers are open.
        taker: Taker::new(spec.labels.clone(), false),
        rivals: Vec::new(),
    }
}

#[cfg(test)]
mod tests;
