//! The job API's activations: polls (`ActivateJobs`, with long polling) and
//! worker streams of pushed jobs (`StreamActivatedJobs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::broadcast::error::RecvError;

use super::jobs::AWAIT_MARGIN;
use super::sessions;
use super::validate;
use super::ApiError;
use super::Call;
use super::JobApi;
use crate::auth::{Principal, Verb};
use crate::core::{ActivatedJobData, Command, CommandResult, JobKey, YieldReason};
use crate::leaders;
use crate::leaders::yields::hand_back;
use crate::proto::gateway as pb;
use crate::streams::{ClientStream, WorkerSpec};

impl JobApi {
    /// Activates up to `max_jobs_to_activate` jobs, waiting up to the
    /// request's `request_timeout` for some when none is there (a long
    /// poll): an empty answer when none came, never an error.
    pub async fn activate(
        &self,
        call: &Call,
        request: pb::ActivateJobsRequest,
    ) -> Result<Vec<pb::ActivatedJob>, ApiError> {
        let principal = &call.principal;
        principal.require_job(Verb::Work, &request.r#type)?;
        principal.require_tenants(&request.tenant_ids)?;
        let limits = &self.ctx.settings.limits;
        if request.max_jobs_to_activate <= 0 || request.max_jobs_to_activate > limits.max_jobs_to_activate {
            return Err(ApiError::InvalidArgument(format!(
                "max_jobs_to_activate must be between 1 and {}, got {}",
                limits.max_jobs_to_activate, request.max_jobs_to_activate
            )));
        }
        if request.request_timeout < 0 {
            return Err(ApiError::InvalidArgument(format!(
                "request_timeout must be zero (no long polling) or more, got {}",
                request.request_timeout
            )));
        }
        let spec = validate::worker_spec(
            request.r#type,
            request.worker,
            request.timeout,
            request.fetch_variable,
            request.tenant_ids,
            request.session_id,
            request.labels,
        )?;
        sessions::check_owner(&self.ctx, &call.principal, spec.session, call.deadline).await?;
        let max = request.max_jobs_to_activate as u32;
        let poll_for = Duration::from_millis(request.request_timeout.min(limits.max_request_timeout_ms) as u64);
        let request_timeout = self.ctx.settings.request_timeout;
        let mut poll_deadline =
            crate::leaders::deadline_after(poll_for).unwrap_or_else(|| Instant::now() + request_timeout);
        if let Some(caller) = call.caller_deadline {
            // A poll longer than the caller waits ends empty in time for the
            // caller to hear it, rather than with the caller's own deadline.
            poll_deadline = poll_deadline.min(caller.checked_sub(AWAIT_MARGIN).unwrap_or_else(Instant::now));
        }
        // Subscribe before the first attempt, so a job created between an empty
        // attempt and parking still wakes us.
        let mut available = self.ctx.gateway.available.subscribe();
        loop {
            let jobs = self.activate_round(&call.principal, &spec, max, Instant::now() + request_timeout).await?;
            if !jobs.is_empty() || Instant::now() >= poll_deadline {
                return Ok(jobs);
            }
            metrics::gauge!("drover_gateway_parked_long_polls").increment(1.0);
            let mut stopping = self.ctx.stopping.clone();
            let woken = loop {
                let next = tokio::select! {
                    next = tokio::time::timeout_at(poll_deadline.into(), available.recv()) => next,
                    _ = stopping.wait_for(|s| *s) => break false,
                };
                match next {
                    Err(_) => break false,
                    Ok(Ok((_, job_type))) if *job_type == *spec.job_type => break true,
                    Ok(Ok(_)) => continue,
                    Ok(Err(RecvError::Lagged(_))) => break true,
                    Ok(Err(RecvError::Closed)) => break false,
                }
            };
            metrics::gauge!("drover_gateway_parked_long_polls").decrement(1.0);
            if !woken {
                // Time is up: one last look, then an empty answer, never an error.
                return self.activate_round(&call.principal, &spec, max, Instant::now() + request_timeout).await;
            }
        }
    }

    /// Opens a worker's stream of pushed jobs (`StreamActivatedJobs` and its
    /// batch form): checks, adds it to its aggregate (registered with every
    /// broker when new), and hands back on close what never reached the worker.
    pub async fn open_stream(
        &self,
        call: &Call,
        request: pb::StreamActivatedJobsRequest,
    ) -> Result<ClientStream, ApiError> {
        let principal = &call.principal;
        principal.require_job(Verb::Work, &request.r#type)?;
        principal.require_tenants(&request.tenant_ids)?;
        let permit = self.ctx.auth.open_stream(principal)?;
        let max_in_flight = validate::max_jobs_in_flight(request.max_jobs_in_flight)?;
        let mut spec = validate::worker_spec(
            request.r#type,
            request.worker,
            request.timeout,
            request.fetch_variable,
            request.tenant_ids,
            request.session_id,
            request.labels,
        )?;
        if spec.session != 0 {
            // An ended session's stream would never be offered a job: say so
            // now. The stream has the session's labels too.
            let deadline = Instant::now() + self.ctx.settings.request_timeout;
            let session = sessions::for_stream(&self.ctx, principal, spec.session, deadline).await?;
            spec.labels.extend(session.labels.iter().cloned());
            spec.labels.sort_unstable();
            spec.labels.dedup();
        }
        let opened = self
            .ctx
            .gateway
            .streams
            .open(&spec, max_in_flight)
            .await
            .map_err(|status| ApiError::from_code(status.code() as i32, status.message().to_string()))?;
        let ctx = Arc::clone(&self.ctx);
        let (stream_id, client_id) = (opened.stream_id, opened.client_id);
        let on_close = Box::new(move |buffered: Vec<(JobKey, u32)>| {
            // The principal's stream slot is free again.
            drop(permit);
            // Jobs that never reached the worker go back at once instead of
            // waiting for their activation timeout.
            tokio::spawn(async move {
                ctx.gateway.streams.close(stream_id, client_id).await;
                for (key, attempt) in &buffered {
                    ctx.gateway.streams.release(*key, *attempt);
                }
                hand_back(&ctx, buffered, YieldReason::StreamClosed).await;
            });
        });
        let stream = ClientStream::new(opened, on_close);
        if !self.ctx.auth.mints_job_tokens() {
            return Ok(stream);
        }
        let ctx = Arc::clone(&self.ctx);
        Ok(stream.with_job_tokens(Arc::new(move |key, attempt, deadline| ctx.job_token(key, attempt, deadline))))
    }

    /// One activation round over every partition, starting at a rotating one.
    /// The reply holds at most `max` jobs and about [`crate::config::Limits::max_request_bytes`]:
    /// each partition activates only what the bytes left allow (at least one
    /// job), so no activation is committed that the reply cannot carry.
    async fn activate_round(
        &self,
        principal: &Arc<Principal>,
        spec: &WorkerSpec,
        max: u32,
        deadline: Instant,
    ) -> Result<Vec<pb::ActivatedJob>, ApiError> {
        let mut jobs = Vec::new();
        let ctx = &self.ctx;
        let partitions = ctx.topology.partition_count();
        let start = ctx.routing.next_partition();
        let mut last_error = None;
        let mut bytes_left = ctx.settings.limits.max_request_bytes() as u64;
        for offset in 0..partitions {
            let remaining = max - jobs.len() as u32;
            if remaining == 0 || bytes_left == 0 {
                break;
            }
            let partition = (start + offset) % partitions;
            let command = Command::Activate(validate::activation(spec, remaining, bytes_left, ctx.topology.node_id));
            match leaders::submit_as(ctx, Some(principal), partition, vec![command], deadline).await {
                Ok(mut results) => {
                    let result = results.pop();
                    if let Some(CommandResult::Rejected(error)) = result {
                        // The worker's session is over: no partition will serve it.
                        return Err(error.into());
                    }
                    if let Some(CommandResult::Activated(activated)) = result {
                        metrics::counter!("drover_gateway_jobs_polled_total").increment(activated.len() as u64);
                        let bytes: usize =
                            activated.iter().map(|j| ActivatedJobData::encoded_len(&j.spec, &j.worker)).sum();
                        bytes_left = bytes_left.saturating_sub(bytes as u64);
                        crate::trace_context::activation_spans(partition, &activated);
                        jobs.extend(activated.iter().map(|j| {
                            let mut job = crate::streams::activated_job(j, &spec.fetch_variables);
                            job.job_token = ctx.job_token(job.key, job.attempt, job.deadline);
                            job
                        }));
                    }
                }
                // One partition without a leader must not hide jobs on others.
                Err(error) => last_error = Some(error),
            }
        }
        match (jobs.is_empty(), last_error) {
            (true, Some(error)) if partitions == 1 => Err(error),
            _ => Ok(jobs),
        }
    }
}
