//! A job worker over `StreamActivatedJobs`: runs a handler per job, at most
//! `concurrency` at a time, and asks the gateway to hold no more than twice
//! that for it (`max_jobs_in_flight`), so a busy worker is "not ready" and jobs
//! go to others instead of waiting in its buffers. Reconnects with back-off
//! when the stream breaks.
//!
//! A pushed job of another type or tenant than the worker asked for never
//! reaches the handler: it is handed back at once (failed with its retries
//! unchanged and no back-off), so another worker gets it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tracing::Instrument;

use super::Client;
use crate::proto::gateway::{ActivatedJob, StreamActivatedJobsRequest};

/// The tenant of jobs created without one (as the gateway names it).
const DEFAULT_TENANT: &str = "<default>";

/// What the handler decided for a job.
#[derive(Clone, Debug)]
pub enum JobOutcome {
    /// Complete with these result variables (a JSON object).
    Complete(String),
    /// Fail; `retries` is what remains after this failure.
    Fail { retries: i32, message: String, back_off_ms: i64 },
    /// Fail for a reason other than "failed" (see `FailJobRequest.reason`):
    /// `malformed-payload` makes an incident at once, `worker-shutdown`
    /// hands the job back without using a retry.
    FailFor { reason: &'static str, retries: i32, message: String, back_off_ms: i64 },
    /// Report nothing: the job is no longer this worker's (a checkpoint or
    /// another call was refused as superseded), or the handler has reported
    /// its outcome itself.
    Abandon,
}

#[derive(Clone, Debug)]
pub struct WorkerOptions {
    pub job_type: String,
    pub worker: String,
    pub timeout_ms: i64,
    pub fetch_variables: Vec<String>,
    /// Tenants whose jobs this worker takes; empty means the default tenant.
    pub tenant_ids: Vec<String>,
    /// Jobs handled at once.
    pub concurrency: usize,
    pub max_back_off: Duration,
}

impl WorkerOptions {
    pub fn new(job_type: &str) -> Self {
        WorkerOptions {
            job_type: job_type.into(),
            worker: format!("{}-{}", job_type, std::process::id()),
            timeout_ms: 60_000,
            fetch_variables: Vec::new(),
            tenant_ids: Vec::new(),
            concurrency: 8,
            max_back_off: Duration::from_secs(5),
        }
    }
}

impl WorkerOptions {
    /// Why this worker must not run `job`, if it must not: a job of another
    /// type or tenant than it asked for.
    fn refusal(&self, job: &ActivatedJob) -> Option<String> {
        if job.r#type != self.job_type {
            return Some(format!("this worker handles type {:?}, not {:?}", self.job_type, job.r#type));
        }
        let serves = if self.tenant_ids.is_empty() {
            job.tenant_id == DEFAULT_TENANT
        } else {
            self.tenant_ids.contains(&job.tenant_id)
        };
        (!serves).then(|| format!("this worker does not serve tenant {:?}", job.tenant_id))
    }
}

pub struct Worker {
    client: Client,
    options: WorkerOptions,
}

impl Worker {
    pub fn new(client: Client, options: WorkerOptions) -> Self {
        Worker { client, options }
    }

    /// Runs until `stop` resolves. Each job's outcome is reported with its
    /// activation's fencing token.
    pub async fn run<H, F>(self, handler: H, stop: impl Future<Output = ()>)
    where
        H: Fn(ActivatedJob) -> F + Send + Sync + 'static,
        F: Future<Output = JobOutcome> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let permits = Arc::new(Semaphore::new(self.options.concurrency.max(1)));
        tokio::pin!(stop);
        let mut back_off = Duration::from_millis(50);
        loop {
            let request = StreamActivatedJobsRequest {
                r#type: self.options.job_type.clone(),
                worker: self.options.worker.clone(),
                timeout: self.options.timeout_ms,
                fetch_variable: self.options.fetch_variables.clone(),
                tenant_ids: self.options.tenant_ids.clone(),
                // The gateway sends no more than the worker can start soon.
                max_jobs_in_flight: (self.options.concurrency.max(1) * 2).min(1000) as i32,
            };
            let mut raw = self.client.raw();
            let opened = tokio::select! {
                opened = raw.stream_activated_jobs(request) => opened,
                _ = &mut stop => return,
            };
            let mut stream = match opened {
                Ok(response) => response.into_inner(),
                Err(status) => {
                    tracing::warn!("opening the job stream failed: {status}; retrying in {back_off:?}");
                    tokio::select! {
                        _ = tokio::time::sleep(back_off) => {}
                        _ = &mut stop => return,
                    }
                    back_off = (back_off * 2).min(self.options.max_back_off);
                    continue;
                }
            };
            back_off = Duration::from_millis(50);
            loop {
                // Wait for room before reading: a busy worker stops reading.
                let permit = tokio::select! {
                    permit = Arc::clone(&permits).acquire_owned() => permit.expect("semaphore open"),
                    _ = &mut stop => return,
                };
                let message = tokio::select! {
                    message = stream.message() => message,
                    _ = &mut stop => return,
                };
                let job = match message {
                    Ok(Some(job)) => job,
                    Ok(None) | Err(_) => break,
                };
                let client = self.client.clone();
                if let Some(reason) = self.options.refusal(&job) {
                    tracing::warn!(key = job.key, attempt = job.attempt, "handing back a pushed job: {reason}");
                    tokio::spawn(async move {
                        if let Err(status) = client.fail(job.key, job.attempt, job.retries, &reason, 0).await {
                            tracing::warn!(key = job.key, "handing back the job failed: {status}");
                        }
                        drop(permit);
                    });
                    continue;
                }
                let handler = Arc::clone(&handler);
                let span =
                    tracing::info_span!("job.work", key = job.key, attempt = job.attempt, job_type = %job.r#type);
                #[cfg(feature = "otel")]
                crate::trace_context::continue_trace(&span, &job.traceparent);
                tokio::spawn(async move {
                    let (key, attempt) = (job.key, job.attempt);
                    let outcome = handler(job).instrument(span.clone()).await;
                    #[cfg(feature = "otel")]
                    let traceparent = crate::trace_context::traceparent_of(&span);
                    #[cfg(not(feature = "otel"))]
                    let traceparent = String::new();
                    drop(span);
                    let result = match outcome {
                        JobOutcome::Complete(variables) => {
                            client.complete_traced(key, attempt, &variables, &traceparent).await
                        }
                        JobOutcome::Fail { retries, message, back_off_ms } => {
                            client.fail(key, attempt, retries, &message, back_off_ms).await
                        }
                        JobOutcome::FailFor { reason, retries, message, back_off_ms } => {
                            client.fail_for(reason, key, attempt, retries, &message, back_off_ms).await
                        }
                        JobOutcome::Abandon => Ok(()),
                    };
                    if let Err(status) = result {
                        tracing::warn!(key, attempt, "reporting the job's outcome failed: {status}");
                    }
                    drop(permit);
                });
            }
            tracing::info!("job stream closed; reconnecting");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_refuses_jobs_of_other_types_and_tenants() {
        let mut options = WorkerOptions::new("email");
        let job = |job_type: &str, tenant: &str| ActivatedJob {
            r#type: job_type.into(),
            tenant_id: tenant.into(),
            ..Default::default()
        };
        assert_eq!(options.refusal(&job("email", DEFAULT_TENANT)), None);
        assert!(options.refusal(&job("sms", DEFAULT_TENANT)).is_some());
        assert!(options.refusal(&job("email", "t1")).is_some(), "only the default tenant when none is named");
        options.tenant_ids = vec!["t1".into(), "t2".into()];
        assert_eq!(options.refusal(&job("email", "t2")), None);
        assert!(options.refusal(&job("email", DEFAULT_TENANT)).is_some());
    }
}
