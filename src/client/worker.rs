//! A job worker over `StreamActivatedJobs`, with a worker session: runs a
//! handler per job, at most `concurrency` at a time, and asks the gateway to
//! hold no more than twice that for it (`max_jobs_in_flight`), so a busy
//! worker is "not ready" and jobs go to others instead of waiting in its
//! buffers. Reconnects with back-off when the stream breaks.
//!
//! The session: the worker registers, then beats every heartbeat interval
//! with the jobs it holds, which keeps them its own however long they run.
//! It obeys the state the server directs (quiet: take no new jobs;
//! terminate: shut down) and the local [`Control`] (signals, in
//! `drover worker`). A job the server reports revoked (cancelled,
//! reassigned) is stopped: its handler is dropped, which kills a child
//! process spawned with `kill_on_drop`. A session the server no longer knows
//! (it missed its beats) loses every job it held; the worker stops them and
//! registers again.
//!
//! Shutting down: take no new jobs, wait up to the grace period for those
//! in flight, fail the rest with reason `worker-shutdown` (no retry used),
//! deregister.
//!
//! A pushed job of another type or tenant than the worker asked for never
//! reaches the handler: it is handed back at once (failed with its retries
//! unchanged and no back-off), so another worker gets it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::AbortHandle;
use tracing::Instrument;

use super::Client;
use crate::proto::gateway::{
    ActivatedJob, DeregisterWorkerRequest, HeartbeatRequest, HeldJob, RegisterWorkerRequest, StreamActivatedJobsRequest,
};

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
    /// Fail, and let the job's retry policy decide the retries and the
    /// back-off, where the job lives (`FailJobRequest.by_policy`):
    /// `error_type` is matched against the policy's non-retryable errors.
    FailByPolicy { error_type: String, message: String },
    /// Report nothing: the job is no longer this worker's (a checkpoint or
    /// another call was refused as superseded), or the handler has reported
    /// its outcome itself.
    Abandon,
}

/// What the worker's owner wants of it (signals, in `drover worker`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Control {
    Run,
    /// Take no new jobs; finish those held.
    Quiet,
    /// Take no new jobs, finish or fail those held within the grace period,
    /// deregister and return.
    Shutdown,
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
    /// Whether to run with a worker session (heartbeats, recovery in seconds
    /// if it dies, server-directed quiet and terminate).
    pub session: bool,
    /// `name:value` labels of the session.
    pub labels: Vec<String>,
    /// Heartbeat interval and dead-after asked of the server (0: its defaults).
    pub heartbeat_ms: i64,
    pub dead_after_ms: i64,
    /// How long a shutdown waits for jobs in flight before failing them.
    pub grace_period: Duration,
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
            session: true,
            labels: Vec::new(),
            heartbeat_ms: 0,
            dead_after_ms: 0,
            grace_period: Duration::from_secs(25),
        }
    }

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

/// The jobs being worked on: key -> (attempt, the handler's task).
#[derive(Default)]
struct InFlight {
    jobs: Mutex<HashMap<u64, (u32, AbortHandle)>>,
    emptied: Notify,
    /// Each held job's newest job token (from its activation, then from
    /// heartbeats): its outcome is reported with it, so the worker's own
    /// token is not what touches the job.
    tokens: Mutex<HashMap<u64, (u32, String)>>,
}

impl InFlight {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (u32, AbortHandle)>> {
        self.jobs.lock().expect("in-flight lock")
    }
    fn held(&self) -> Vec<HeldJob> {
        self.lock().iter().map(|(key, (attempt, _))| HeldJob { key: *key, attempt: *attempt }).collect()
    }
    fn set_token(&self, key: u64, attempt: u32, token: String) {
        if !token.is_empty() {
            self.tokens.lock().expect("job tokens").insert(key, (attempt, token));
        }
    }
    /// The client to report `key`'s outcome with: its job token's, if it has one.
    fn client_for(&self, client: &Client, key: u64, attempt: u32) -> Client {
        let tokens = self.tokens.lock().expect("job tokens");
        match tokens.get(&key) {
            Some((a, token)) if *a == attempt => client.with_token(token).unwrap_or_else(|_| client.clone()),
            _ => client.clone(),
        }
    }
    /// Forgets a job whose outcome is reported (or that was stopped).
    fn done(&self, key: u64, attempt: u32) {
        let mut tokens = self.tokens.lock().expect("job tokens");
        if tokens.get(&key).is_some_and(|(a, _)| *a == attempt) {
            tokens.remove(&key);
        }
        drop(tokens);
        let mut jobs = self.lock();
        if jobs.get(&key).is_some_and(|(a, _)| *a == attempt) {
            jobs.remove(&key);
        }
        if jobs.is_empty() {
            self.emptied.notify_waiters();
        }
    }
    /// Stops jobs and forgets them; none of their outcomes is reported.
    fn stop(&self, keys: &[u64]) -> Vec<(u64, u32)> {
        let mut tokens = self.tokens.lock().expect("job tokens");
        for key in keys {
            tokens.remove(key);
        }
        drop(tokens);
        let mut jobs = self.lock();
        let mut stopped = Vec::new();
        for key in keys {
            if let Some((attempt, task)) = jobs.remove(key) {
                task.abort();
                stopped.push((*key, attempt));
            }
        }
        if jobs.is_empty() {
            self.emptied.notify_waiters();
        }
        stopped
    }
    fn keys(&self) -> Vec<u64> {
        self.lock().keys().copied().collect()
    }
    async fn wait_empty(&self) {
        loop {
            let emptied = self.emptied.notified();
            if self.lock().is_empty() {
                return;
            }
            emptied.await;
        }
    }
}

/// What the heartbeat task learned from the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Server {
    /// The directed state: running, quiet or terminate (as Control::Shutdown).
    Directs(Control),
    /// The session is over: everything held is lost.
    Lost,
}

pub struct Worker {
    client: Client,
    options: WorkerOptions,
    control: watch::Sender<Control>,
}

impl Worker {
    pub fn new(client: Client, options: WorkerOptions) -> Self {
        Worker { client, options, control: watch::Sender::new(Control::Run) }
    }

    /// A handle to steer the worker while it runs: quiet, resume, shut down.
    pub fn controller(&self) -> watch::Sender<Control> {
        self.control.clone()
    }

    /// Runs until `stop` resolves (then shuts down gracefully) or a shutdown
    /// is asked through [`Worker::controller`] or by the server. Each job's
    /// outcome is reported with its activation's fencing token.
    pub async fn run<H, F>(self, handler: H, stop: impl Future<Output = ()> + Send + 'static)
    where
        H: Fn(ActivatedJob) -> F + Send + Sync + 'static,
        F: Future<Output = JobOutcome> + Send + 'static,
    {
        let control = self.control.clone();
        let stopper = tokio::spawn(async move {
            stop.await;
            control.send_replace(Control::Shutdown);
        });
        let handler = Arc::new(handler);
        let in_flight = Arc::new(InFlight::default());
        loop {
            let session = if self.options.session {
                match self.register().await {
                    Some(session) => session,
                    None => break,
                }
            } else {
                0
            };
            // Held here until the session ends, so the channel stays open
            // (also without a session, when nothing beats).
            let (server_tx, server) = watch::channel(Server::Directs(Control::Run));
            let beats = (session != 0).then(|| {
                tokio::spawn(heartbeats(
                    self.client.clone(),
                    session,
                    self.options.heartbeat_interval(),
                    Arc::clone(&in_flight),
                    self.control.subscribe(),
                    server_tx.clone(),
                ))
            });
            let lost = self.work(session, &handler, &in_flight, server).await;
            drop(server_tx);
            if !lost {
                // Beats go on through the grace period: the jobs stay ours.
                self.shut_down(session, &in_flight).await;
                if let Some(beats) = beats {
                    beats.abort();
                }
                break;
            }
            if let Some(beats) = beats {
                beats.abort();
            }
            // Every job the session held is handed back by the server.
            let stopped = in_flight.stop(&in_flight.keys());
            tracing::warn!(
                session = %format!("{session:x}"),
                stopped = stopped.len(),
                "the worker session is over (missed heartbeats?); stopped its jobs, registering again"
            );
        }
        stopper.abort();
    }

    /// Registers a session, retrying with back-off; `None` when a shutdown
    /// is asked first.
    async fn register(&self) -> Option<u64> {
        let mut control = self.control.subscribe();
        let mut back_off = Duration::from_millis(50);
        loop {
            if *control.borrow_and_update() == Control::Shutdown {
                return None;
            }
            let request = RegisterWorkerRequest {
                worker_id: self.options.worker.clone(),
                hostname: hostname(),
                pid: std::process::id(),
                job_types: vec![self.options.job_type.clone()],
                concurrency: self.options.concurrency as u32,
                labels: self.options.labels.clone(),
                tenant_ids: self.options.tenant_ids.clone(),
                heartbeat_interval: self.options.heartbeat_ms,
                dead_after: self.options.dead_after_ms,
            };
            match self.client.raw().register_worker(request).await {
                Ok(reply) => {
                    let reply = reply.into_inner();
                    tracing::info!(
                        session = %format!("{:x}", reply.session_id),
                        heartbeat_ms = reply.heartbeat_interval,
                        dead_after_ms = reply.dead_after,
                        "worker session registered"
                    );
                    return Some(reply.session_id);
                }
                Err(status) if status.code() == tonic::Code::InvalidArgument => {
                    tracing::error!("the worker's registration is refused: {}", status.message());
                    return None;
                }
                Err(status) => tracing::warn!("registering the worker failed: {status}; retrying in {back_off:?}"),
            }
            tokio::select! {
                _ = tokio::time::sleep(back_off) => {}
                _ = control.changed() => {}
            }
            back_off = (back_off * 2).min(self.options.max_back_off);
        }
    }

    /// Takes and runs jobs until a shutdown (false) or the session is lost (true).
    async fn work<H, F>(
        &self,
        session: u64,
        handler: &Arc<H>,
        in_flight: &Arc<InFlight>,
        mut server: watch::Receiver<Server>,
    ) -> bool
    where
        H: Fn(ActivatedJob) -> F + Send + Sync + 'static,
        F: Future<Output = JobOutcome> + Send + 'static,
    {
        let permits = Arc::new(Semaphore::new(self.options.concurrency.max(1)));
        let mut control = self.control.subscribe();
        let mut back_off = Duration::from_millis(50);
        loop {
            // What to do now: the stronger of the local wish and the server's.
            let local = *control.borrow_and_update();
            let directed = match *server.borrow_and_update() {
                Server::Lost => return true,
                Server::Directs(state) => state,
            };
            match local.max(directed) {
                Control::Shutdown => return false,
                Control::Quiet => {
                    // No stream while quiet: buffered jobs go back to others.
                    tokio::select! {
                        _ = control.changed() => {}
                        _ = server.changed() => {}
                    }
                    continue;
                }
                Control::Run => {}
            }
            let request = StreamActivatedJobsRequest {
                r#type: self.options.job_type.clone(),
                worker: self.options.worker.clone(),
                timeout: self.options.timeout_ms,
                fetch_variable: self.options.fetch_variables.clone(),
                tenant_ids: self.options.tenant_ids.clone(),
                // The gateway sends no more than the worker can start soon.
                max_jobs_in_flight: (self.options.concurrency.max(1) * 2).min(1000) as i32,
                session_id: session,
                labels: self.options.labels.clone(),
            };
            let mut raw = self.client.raw();
            let opened = tokio::select! {
                opened = raw.stream_activated_jobs(request) => opened,
                _ = control.changed() => continue,
                _ = server.changed() => continue,
            };
            let mut stream = match opened {
                Ok(response) => response.into_inner(),
                Err(status) => {
                    tracing::warn!("opening the job stream failed: {status}; retrying in {back_off:?}");
                    tokio::select! {
                        _ = tokio::time::sleep(back_off) => {}
                        _ = control.changed() => {}
                        _ = server.changed() => {}
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
                    _ = control.changed() => break,
                    _ = server.changed() => break,
                };
                let message = tokio::select! {
                    message = stream.message() => message,
                    _ = control.changed() => break,
                    _ = server.changed() => break,
                };
                let job = match message {
                    Ok(Some(job)) => job,
                    Ok(None) | Err(_) => {
                        tracing::info!("job stream closed; reconnecting");
                        break;
                    }
                };
                self.start(job, handler, in_flight, permit);
            }
        }
    }

    /// Runs one job's handler and reports its outcome.
    fn start<H, F>(
        &self,
        job: ActivatedJob,
        handler: &Arc<H>,
        in_flight: &Arc<InFlight>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) where
        H: Fn(ActivatedJob) -> F + Send + Sync + 'static,
        F: Future<Output = JobOutcome> + Send + 'static,
    {
        let client = self.client.clone();
        if let Some(reason) = self.options.refusal(&job) {
            tracing::warn!(key = job.key, attempt = job.attempt, "handing back a pushed job: {reason}");
            tokio::spawn(async move {
                if let Err(status) = client.fail(job.key, job.attempt, job.retries, &reason, 0).await {
                    tracing::warn!(key = job.key, "handing back the job failed: {status}");
                }
                drop(permit);
            });
            return;
        }
        let handler = Arc::clone(handler);
        let span = tracing::info_span!("job.work", key = job.key, attempt = job.attempt, job_type = %job.r#type);
        #[cfg(feature = "otel")]
        crate::trace_context::continue_trace(&span, &job.traceparent);
        let (key, attempt) = (job.key, job.attempt);
        in_flight.set_token(key, attempt, job.job_token.clone());
        let tracked = Arc::clone(in_flight);
        let max_back_off = self.options.max_back_off;
        // Registered before the task runs, so a fast job's `done` finds it.
        let mut jobs = in_flight.lock();
        let task = tokio::spawn(async move {
            let outcome = handler(job).instrument(span.clone()).await;
            #[cfg(feature = "otel")]
            let traceparent = crate::trace_context::traceparent_of(&span);
            #[cfg(not(feature = "otel"))]
            let traceparent = String::new();
            drop(span);
            // A report whose fate is unknown is sent again (a repeat of one
            // that took effect answers OK); meanwhile the job stays held, and
            // heartbeats keep it this worker's.
            let mut back_off = Duration::from_millis(100);
            loop {
                let client = tracked.client_for(&client, key, attempt);
                let result = match &outcome {
                    JobOutcome::Complete(variables) => {
                        client.complete_traced(key, attempt, variables, &traceparent).await
                    }
                    JobOutcome::Fail { retries, message, back_off_ms } => {
                        client.fail(key, attempt, *retries, message, *back_off_ms).await
                    }
                    JobOutcome::FailFor { reason, retries, message, back_off_ms } => {
                        client.fail_for(reason, key, attempt, *retries, message, *back_off_ms).await
                    }
                    JobOutcome::FailByPolicy { error_type, message } => {
                        client.fail_by_policy(key, attempt, error_type, message).await.map(drop)
                    }
                    JobOutcome::Abandon => Ok(()),
                };
                match result {
                    Ok(()) => break,
                    Err(status) if !worth_repeating(&status) => {
                        tracing::warn!(key, attempt, "reporting the job's outcome was refused: {status}");
                        break;
                    }
                    Err(status) => {
                        tracing::warn!(
                            key,
                            attempt,
                            "reporting the job's outcome failed: {status}; again in {back_off:?}"
                        );
                        tokio::time::sleep(back_off).await;
                        back_off = (back_off * 2).min(max_back_off);
                    }
                }
            }
            tracked.done(key, attempt);
            drop(permit);
        });
        jobs.insert(key, (attempt, task.abort_handle()));
    }

    /// Waits up to the grace period for jobs in flight, fails the rest with
    /// `worker-shutdown`, and ends the session.
    async fn shut_down(&self, session: u64, in_flight: &Arc<InFlight>) {
        let waiting = in_flight.keys().len();
        tracing::info!(waiting, grace = ?self.options.grace_period, "worker shutting down");
        let finished = tokio::time::timeout(self.options.grace_period, in_flight.wait_empty()).await.is_ok();
        if !finished {
            let stopped = in_flight.stop(&in_flight.keys());
            tracing::warn!(count = stopped.len(), "jobs outlasted the grace period; failing them as worker-shutdown");
            let fails = stopped.into_iter().map(|(key, attempt)| {
                let client = self.client.clone();
                async move {
                    let message = "the worker shut down before the job finished";
                    if let Err(status) = client.fail_for("worker-shutdown", key, attempt, 0, message, 0).await {
                        tracing::warn!(key, "failing the job as worker-shutdown failed: {status}");
                    }
                }
            });
            futures::future::join_all(fails).await;
        }
        if session != 0 {
            if let Err(status) =
                self.client.raw().deregister_worker(DeregisterWorkerRequest { session_id: session }).await
            {
                tracing::warn!("deregistering the worker failed: {status}");
            }
        }
    }
}

impl WorkerOptions {
    fn heartbeat_interval(&self) -> Duration {
        // The server's default when the worker asks for none.
        let ms = if self.heartbeat_ms > 0 { self.heartbeat_ms } else { 5_000 };
        Duration::from_millis(ms as u64)
    }
}

/// Beats until the session is lost (then says so and returns) or the task
/// is aborted. Each answer updates `server` and stops revoked jobs.
async fn heartbeats(
    client: Client,
    session: u64,
    interval: Duration,
    in_flight: Arc<InFlight>,
    control: watch::Receiver<Control>,
    server: watch::Sender<Server>,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let state = match *control.borrow() {
            Control::Run => "running",
            Control::Quiet | Control::Shutdown => "quiet",
        };
        let request = HeartbeatRequest { session_id: session, state: state.into(), jobs: in_flight.held() };
        let mut call = tonic::Request::new(request);
        call.set_timeout(interval.max(Duration::from_secs(1)));
        match client.raw().heartbeat(call).await {
            Ok(reply) => {
                let reply = reply.into_inner();
                for renewed in reply.job_tokens {
                    in_flight.set_token(renewed.key, renewed.attempt, renewed.token);
                }
                if !reply.revoked.is_empty() {
                    let stopped = in_flight.stop(&reply.revoked);
                    if !stopped.is_empty() {
                        tracing::info!(?stopped, "stopped jobs the server revoked (cancelled or reassigned)");
                    }
                }
                let directed = match reply.state.as_str() {
                    "quiet" => Control::Quiet,
                    "terminate" => Control::Shutdown,
                    _ => Control::Run,
                };
                server.send_if_modified(|current| {
                    let changed = *current != Server::Directs(directed);
                    *current = Server::Directs(directed);
                    changed
                });
            }
            Err(status) if status.code() == tonic::Code::NotFound => {
                server.send_replace(Server::Lost);
                return;
            }
            Err(status) => tracing::warn!("heartbeat failed: {status}"),
        }
    }
}

/// Whether a failed call may succeed if sent again: the gateway or the
/// partition was unreachable, busy, or lost the answer.
fn worth_repeating(status: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        status.code(),
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Unknown
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Cancelled
    )
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default()
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
