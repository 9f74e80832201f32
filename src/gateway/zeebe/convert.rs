//! Translation between Zeebe's `gateway_protocol` messages and drover.v1's:
//! job keys with their attempt's tag, Zeebe's defaults and clamps, replies
//! cut to a Zeebe client's message size, and the topology.

use crate::config::Limits;
use crate::core::{attempt_tag, FailReason, JobKey, TAGGED_ATTEMPT};
use crate::gateway::api::ApiError;
use crate::proto::gateway as pb;
use crate::proto::zeebe as zb;

/// The version Topology reports for the gateway and every broker.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Where a Zeebe job key carries its activation's tag.
const TAG_SHIFT: u32 = 60;
const TAG_BITS: u64 = 0b111 << TAG_SHIFT;

/// The key a Zeebe client gets for an activation: the job's key with the
/// attempt's tag in bits 60..62.
pub fn activation_key(key: JobKey, attempt: u32) -> i64 {
    (key.0 | (u64::from(attempt_tag(attempt)) << TAG_SHIFT)) as i64
}

/// The job a Zeebe job key names, and the fence (see
/// [`crate::core::fence_admits`]) its tag sets: 0 for a key without one.
pub fn job_of(key: i64) -> Result<(JobKey, u32), ApiError> {
    if key <= 0 {
        return Err(ApiError::NotFound(format!("no job with key {key}: job keys are positive")));
    }
    let key = key as u64;
    let tag = ((key & TAG_BITS) >> TAG_SHIFT) as u32;
    let fence = if tag == 0 { 0 } else { TAGGED_ATTEMPT | tag };
    Ok((JobKey(key & !TAG_BITS), fence))
}

/// `maxJobsToActivate` as Drover takes it: above the limit clamps to it.
/// Below 1 is refused, as Zeebe refuses it.
pub fn max_jobs(requested: i32, limit: i32) -> Result<i32, ApiError> {
    if requested < 1 {
        return Err(ApiError::InvalidArgument(format!("maxJobsToActivate must be greater than zero, got {requested}")));
    }
    Ok(requested.min(limit))
}

/// Zeebe's `requestTimeout` as Drover's long poll: 0 is the default,
/// negative is none (answer at once).
pub fn long_poll_ms(request_timeout: i64, default_ms: i64) -> i64 {
    match request_timeout {
        0 => default_ms,
        ms if ms < 0 => 0,
        ms => ms,
    }
}

/// A JSON object string, `{}` for none.
fn object_or_empty(text: String) -> String {
    if text.trim().is_empty() {
        "{}".into()
    } else {
        text
    }
}

/// A native activation as Zeebe's `ActivatedJob`.
pub fn activated_job(job: pb::ActivatedJob) -> zb::ActivatedJob {
    let custom_headers = if job.custom_headers.is_empty() {
        "{}".to_string()
    } else {
        let headers: serde_json::Map<String, serde_json::Value> =
            job.custom_headers.into_iter().map(|(k, v)| (k, serde_json::Value::String(v))).collect();
        serde_json::Value::Object(headers).to_string()
    };
    zb::ActivatedJob {
        key: activation_key(JobKey(job.key), job.attempt),
        r#type: job.r#type,
        process_instance_key: 0,
        bpmn_process_id: String::new(),
        process_definition_version: 0,
        process_definition_key: 0,
        element_id: String::new(),
        element_instance_key: 0,
        custom_headers,
        worker: job.worker,
        retries: job.retries,
        deadline: job.deadline,
        variables: object_or_empty(job.variables),
        tenant_id: job.tenant_id,
    }
}

/// `labels`: what a Zeebe worker, which names none, is labelled with here
/// ([`crate::context::Topology::default_worker_labels`]).
pub fn activate_request(
    r: zb::ActivateJobsRequest,
    limits: &Limits,
    labels: Vec<String>,
) -> Result<pb::ActivateJobsRequest, ApiError> {
    Ok(pb::ActivateJobsRequest {
        r#type: r.r#type,
        worker: r.worker,
        timeout: r.timeout,
        max_jobs_to_activate: max_jobs(r.max_jobs_to_activate, limits.max_jobs_to_activate)?,
        fetch_variable: r.fetch_variable,
        request_timeout: long_poll_ms(r.request_timeout, limits.zeebe_long_poll_ms),
        tenant_ids: r.tenant_ids,
        session_id: 0,
        labels,
    })
}

pub fn stream_request(r: zb::StreamActivatedJobsRequest, labels: Vec<String>) -> pb::StreamActivatedJobsRequest {
    pb::StreamActivatedJobsRequest {
        r#type: r.r#type,
        worker: r.worker,
        timeout: r.timeout,
        fetch_variable: r.fetch_variable,
        tenant_ids: r.tenant_ids,
        // The same per-stream limit as a native stream that names none.
        max_jobs_in_flight: 0,
        session_id: 0,
        labels,
    }
}

pub fn complete_request(r: zb::CompleteJobRequest) -> Result<pb::CompleteJobRequest, ApiError> {
    let (key, fence) = job_of(r.job_key)?;
    Ok(pb::CompleteJobRequest { key: key.0, variables: r.variables, attempt: fence, override_fence: fence == 0 })
}

pub fn fail_request(r: zb::FailJobRequest) -> Result<pb::FailJobRequest, ApiError> {
    let (key, fence) = job_of(r.job_key)?;
    Ok(pb::FailJobRequest {
        key: key.0,
        attempt: fence,
        override_fence: fence == 0,
        retries: r.retries.max(0),
        error_message: r.error_message,
        retry_back_off: r.retry_back_off.max(0),
        variables: r.variables,
        reason: String::new(),
        ..Default::default()
    })
}

pub fn throw_request(r: zb::ThrowErrorRequest) -> Result<pb::FailJobRequest, ApiError> {
    let (key, fence) = job_of(r.job_key)?;
    if r.error_code.trim().is_empty() {
        return Err(ApiError::InvalidArgument("errorCode is required to throw an error".into()));
    }
    let error_message = if r.error_message.is_empty() {
        format!("error {} thrown by the worker", r.error_code)
    } else {
        format!("error {} thrown by the worker: {}", r.error_code, r.error_message)
    };
    Ok(pb::FailJobRequest {
        key: key.0,
        attempt: fence,
        override_fence: fence == 0,
        retries: 0,
        error_message,
        retry_back_off: 0,
        variables: r.variables,
        reason: FailReason::BusinessError.as_str().into(),
        ..Default::default()
    })
}

pub fn retries_request(r: zb::UpdateJobRetriesRequest) -> Result<pb::UpdateJobRetriesRequest, ApiError> {
    Ok(pb::UpdateJobRetriesRequest { key: job_of(r.job_key)?.0 .0, retries: r.retries })
}

pub fn timeout_request(r: zb::UpdateJobTimeoutRequest) -> Result<pb::UpdateJobTimeoutRequest, ApiError> {
    let (key, fence) = job_of(r.job_key)?;
    Ok(pb::UpdateJobTimeoutRequest { key: key.0, timeout: r.timeout, attempt: fence, override_fence: fence == 0 })
}

/// Activated jobs cut into replies of at most `max_bytes` each, in order, and
/// the jobs too large for any reply.
pub fn split_replies(
    jobs: Vec<zb::ActivatedJob>,
    max_bytes: usize,
) -> (Vec<zb::ActivateJobsResponse>, Vec<zb::ActivatedJob>) {
    let mut replies: Vec<zb::ActivateJobsResponse> = Vec::new();
    let mut too_large = Vec::new();
    let mut bytes = 0;
    for job in jobs {
        // The job as field 1 of the reply: its tag, its length and itself.
        let size = prost::encoding::message::encoded_len(1, &job);
        if size > max_bytes {
            too_large.push(job);
            continue;
        }
        match replies.last_mut() {
            Some(reply) if bytes + size <= max_bytes => {
                bytes += size;
                reply.jobs.push(job);
            }
            _ => {
                bytes = size;
                replies.push(zb::ActivateJobsResponse { jobs: vec![job] });
            }
        }
    }
    (replies, too_large)
}

fn role(role: &str) -> zb::partition::PartitionBrokerRole {
    use zb::partition::PartitionBrokerRole as Role;
    match role {
        "leader" => Role::Leader,
        "follower" => Role::Follower,
        _ => Role::Inactive,
    }
}

fn host_port(address: &str) -> (String, i32) {
    match address.rsplit_once(':') {
        Some((host, port)) => (host.trim_matches(['[', ']']).to_string(), port.parse().unwrap_or(0)),
        None => (address.to_string(), 0),
    }
}

/// Drover's cluster view as Zeebe's topology. Zeebe numbers partitions from
/// 1, so partition `p` is reported as `p + 1`.
pub fn topology(
    brokers: Vec<pb::BrokerInfo>,
    cluster_size: u32,
    partitions: u32,
    replication_factor: u32,
) -> zb::TopologyResponse {
    use zb::partition::PartitionBrokerHealth as Health;
    let brokers = brokers
        .into_iter()
        .map(|broker| {
            let (host, port) = host_port(&broker.address);
            zb::BrokerInfo {
                node_id: broker.node_id as i32,
                host,
                port,
                partitions: broker
                    .partitions
                    .iter()
                    .map(|p| zb::Partition {
                        partition_id: p.partition_id as i32 + 1,
                        role: role(&p.role) as i32,
                        health: if p.health == "healthy" { Health::Healthy } else { Health::Unhealthy } as i32,
                    })
                    .collect(),
                version: VERSION.into(),
            }
        })
        .collect();
    zb::TopologyResponse {
        brokers,
        cluster_size: cluster_size as i32,
        partitions_count: partitions as i32,
        replication_factor: replication_factor as i32,
        gateway_version: VERSION.into(),
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::super::MAX_MESSAGE_BYTES;
    use super::*;
    use crate::core::{fence_admits, MAX_PARTITIONS};

    fn native_job() -> pb::ActivatedJob {
        pb::ActivatedJob {
            key: JobKey::new(3, 42).0,
            r#type: "payment".into(),
            variables: r#"{"amount":5}"#.into(),
            custom_headers: [("region".to_string(), "eu".to_string())].into_iter().collect(),
            worker: "w-1".into(),
            retries: 2,
            deadline: 1_700_000_000_000,
            attempt: 9,
            tenant_id: "acme".into(),
            priority: 7,
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            created_at: 1_600_000_000_000,
            stage: "charged".into(),
            job_token: String::new(),
        }
    }

    #[test]
    fn an_activation_key_carries_the_attempts_tag_and_names_the_job_and_that_tag() {
        for partition in [0, 1, MAX_PARTITIONS - 1] {
            for counter in [1, 2, (1 << 48) - 1] {
                let job = JobKey::new(partition, counter);
                assert_eq!(job.0 & TAG_BITS, 0, "a Drover key never uses the tag's bits");
                for attempt in 1..=30 {
                    let key = activation_key(job, attempt);
                    assert!(key > 0, "{key} must be a positive int64");
                    let (decoded, fence) = job_of(key).unwrap();
                    assert_eq!(decoded, job);
                    assert!(fence_admits(fence, attempt), "attempt {attempt} admitted by its own key");
                    assert!(!fence_admits(fence, attempt + 1), "the next attempt is fenced off");
                    assert!(fence_admits(fence, attempt + 7), "tags repeat every seven attempts");
                }
                // The key `drover job create` prints names any activation.
                assert_eq!(job_of(job.0 as i64).unwrap(), (job, 0));
            }
        }
        for invalid in [0, -1, i64::MIN] {
            assert!(matches!(job_of(invalid), Err(ApiError::NotFound(_))), "{invalid}");
        }
    }

    #[test]
    fn an_activated_job_maps_every_field_and_zeroes_the_process_fields() {
        let job = activated_job(native_job());
        assert_eq!(job.key, activation_key(JobKey::new(3, 42), 9));
        assert_eq!(job.r#type, "payment");
        assert_eq!(job.variables, r#"{"amount":5}"#);
        assert_eq!(job.custom_headers, r#"{"region":"eu"}"#);
        assert_eq!(job.worker, "w-1");
        assert_eq!(job.retries, 2);
        assert_eq!(job.deadline, 1_700_000_000_000);
        assert_eq!(job.tenant_id, "acme");
        assert_eq!((job.process_instance_key, job.process_definition_key, job.process_definition_version), (0, 0, 0));
        assert_eq!((job.bpmn_process_id.as_str(), job.element_id.as_str(), job.element_instance_key), ("", "", 0));

        let bare = activated_job(pb::ActivatedJob { variables: String::new(), ..native_job() });
        assert_eq!(bare.variables, "{}", "no variables is an empty object, never an empty string");
        let bare = activated_job(pb::ActivatedJob { custom_headers: Default::default(), ..native_job() });
        assert_eq!(bare.custom_headers, "{}");
        let quoted = activated_job(pb::ActivatedJob {
            custom_headers: [("a\"b".to_string(), "x\ny".to_string())].into_iter().collect(),
            ..native_job()
        });
        let parsed: serde_json::Value = serde_json::from_str(&quoted.custom_headers).unwrap();
        assert_eq!(parsed["a\"b"], "x\ny", "headers are escaped as JSON");
    }

    #[test]
    fn activation_requests_clamp_what_zeebe_clients_send() {
        let limits = Limits { max_jobs_to_activate: 1000, zeebe_long_poll_ms: 10_000, ..Limits::default() };
        let zeebe = zb::ActivateJobsRequest {
            r#type: "t".into(),
            worker: String::new(),
            timeout: 30_000,
            max_jobs_to_activate: 32,
            fetch_variable: vec!["a".into()],
            request_timeout: 0,
            tenant_ids: vec!["acme".into()],
        };
        let native = activate_request(zeebe.clone(), &limits, vec![]).unwrap();
        assert_eq!(native.r#type, "t");
        assert_eq!(native.worker, "", "a blank worker is accepted (Drover names it \"default\")");
        assert_eq!(native.timeout, 30_000);
        assert_eq!(native.max_jobs_to_activate, 32);
        assert_eq!(native.fetch_variable, ["a"]);
        assert_eq!(native.request_timeout, 10_000, "0 is the default long poll");
        assert_eq!(native.tenant_ids, ["acme"]);
        assert_eq!(native.session_id, 0);

        let clamp = |max, poll| {
            let r = zb::ActivateJobsRequest { max_jobs_to_activate: max, request_timeout: poll, ..zeebe.clone() };
            activate_request(r, &limits, vec![]).map(|n| (n.max_jobs_to_activate, n.request_timeout))
        };
        assert_eq!(clamp(5000, -1).unwrap(), (1000, 0), "over the limit clamps; negative polls not at all");
        assert_eq!(clamp(1, 2500).unwrap(), (1, 2500));
        assert!(matches!(clamp(0, 0), Err(ApiError::InvalidArgument(_))), "Zeebe refuses 0 jobs too");
    }

    #[test]
    fn job_requests_carry_the_fence_and_clamp_negative_failures() {
        let key = activation_key(JobKey::new(1, 7), 2);
        let fence = job_of(key).unwrap().1;
        let complete =
            complete_request(zb::CompleteJobRequest { job_key: key, variables: r#"{"ok":true}"#.into() }).unwrap();
        assert_eq!(
            (complete.key, complete.attempt, complete.variables.as_str()),
            (JobKey::new(1, 7).0, fence, r#"{"ok":true}"#)
        );

        let fail = fail_request(zb::FailJobRequest {
            job_key: key,
            retries: -3,
            error_message: "boom".into(),
            retry_back_off: -10,
            variables: r#"{"n":1}"#.into(),
        })
        .unwrap();
        assert_eq!((fail.retries, fail.retry_back_off), (0, 0), "negative retries and back-off clamp to 0");
        assert_eq!((fail.key, fail.attempt, fail.error_message.as_str()), (JobKey::new(1, 7).0, fence, "boom"));
        assert_eq!((fail.variables.as_str(), fail.reason.as_str()), (r#"{"n":1}"#, ""));
        let kept =
            fail_request(zb::FailJobRequest { job_key: key, retries: 4, retry_back_off: 250, ..Default::default() })
                .unwrap();
        assert_eq!((kept.retries, kept.retry_back_off), (4, 250));

        let thrown = throw_request(zb::ThrowErrorRequest {
            job_key: key,
            error_code: "NO_FUNDS".into(),
            error_message: "balance 0".into(),
            variables: "{}".into(),
        })
        .unwrap();
        assert_eq!((thrown.retries, thrown.reason.as_str()), (0, "business-error"));
        assert_eq!(thrown.error_message, "error NO_FUNDS thrown by the worker: balance 0");
        assert_eq!(thrown.attempt, fence);
        assert!(matches!(
            throw_request(zb::ThrowErrorRequest { job_key: key, ..Default::default() }),
            Err(ApiError::InvalidArgument(_))
        ));

        let timeout = timeout_request(zb::UpdateJobTimeoutRequest { job_key: key, timeout: 5000 }).unwrap();
        assert_eq!((timeout.key, timeout.timeout, timeout.attempt), (JobKey::new(1, 7).0, 5000, fence));
        let retries = retries_request(zb::UpdateJobRetriesRequest { job_key: key, retries: 3 }).unwrap();
        assert_eq!((retries.key, retries.retries), (JobKey::new(1, 7).0, 3), "retries are not fenced");

        let stream = stream_request(
            zb::StreamActivatedJobsRequest {
                r#type: "t".into(),
                worker: "w".into(),
                timeout: 100,
                fetch_variable: vec!["x".into()],
                tenant_ids: vec!["acme".into()],
            },
            vec!["region:eu".into()],
        );
        assert_eq!(stream.labels, vec!["region:eu"], "a Zeebe worker has its gateway's region");
        assert_eq!((stream.r#type.as_str(), stream.worker.as_str(), stream.timeout), ("t", "w", 100));
        assert_eq!((stream.fetch_variable, stream.tenant_ids), (vec!["x".to_string()], vec!["acme".to_string()]));
        assert_eq!((stream.max_jobs_in_flight, stream.session_id), (0, 0));
    }

    #[test]
    fn replies_are_cut_to_the_message_limit_and_a_job_too_large_for_one_is_set_apart() {
        let job = |bytes: usize| zb::ActivatedJob {
            variables: format!(r#"{{"b":"{}"}}"#, "x".repeat(bytes)),
            ..Default::default()
        };
        let jobs = vec![job(1_500_000), job(1_500_000), job(1_500_000), job(5_000_000), job(10)];
        let (replies, too_large) = split_replies(jobs, MAX_MESSAGE_BYTES);
        assert_eq!(too_large.len(), 1);
        assert_eq!(replies.iter().map(|r| r.jobs.len()).collect::<Vec<_>>(), [2, 2]);
        for reply in &replies {
            assert!(reply.encoded_len() <= MAX_MESSAGE_BYTES, "a reply of {} bytes", reply.encoded_len());
        }
        assert_eq!(replies[1].jobs[1].variables.len(), r#"{"b":""}"#.len() + 10, "order is kept");
        assert!(split_replies(Vec::new(), MAX_MESSAGE_BYTES).0.is_empty(), "no jobs, no message");
    }

    #[test]
    fn topology_sets_every_role_and_numbers_partitions_from_one() {
        use zb::partition::{PartitionBrokerHealth as Health, PartitionBrokerRole as Role};
        let part = |id, role: &str, health: &str| pb::PartitionInfo {
            partition_id: id,
            role: role.into(),
            health: health.into(),
            ..Default::default()
        };
        let brokers = vec![
            pb::BrokerInfo {
                node_id: 2,
                address: "10.0.0.2:26500".into(),
                partitions: vec![part(0, "follower", "healthy"), part(1, "candidate", "unhealthy")],
                data_version: 7,
            },
            pb::BrokerInfo {
                node_id: 3,
                address: "[::1]:26501".into(),
                partitions: vec![part(0, "leader", "healthy")],
                data_version: 7,
            },
        ];
        let roles =
            |b: &zb::BrokerInfo| b.partitions.iter().map(|p| (p.partition_id, p.role, p.health)).collect::<Vec<_>>();
        let answer = topology(brokers, 3, 2, 3);
        assert_eq!((answer.cluster_size, answer.partitions_count, answer.replication_factor), (3, 2, 3));
        assert_eq!(answer.gateway_version, VERSION);
        let mapped = answer.brokers;
        assert_eq!((mapped[0].host.as_str(), mapped[0].port), ("10.0.0.2", 26500));
        assert_eq!((mapped[1].host.as_str(), mapped[1].port), ("::1", 26501));
        assert_eq!(
            roles(&mapped[0]),
            [(1, Role::Follower as i32, Health::Healthy as i32), (2, Role::Inactive as i32, Health::Unhealthy as i32)]
        );
        assert_eq!(roles(&mapped[1]), [(1, Role::Leader as i32, Health::Healthy as i32)]);
        assert!(mapped.iter().all(|b| b.version == VERSION));
        assert!(VERSION.split('.').count() == 3 && VERSION.split('.').all(|p| p.parse::<u32>().is_ok()));
    }
}
