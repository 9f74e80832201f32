//! `drover job ...`: create, read, finish and list jobs from the shell.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use drover::client::Client;
use drover::proto::gateway::*;

use super::{print_json, status_error, Target};

/// Which jobs a listing or bulk command covers.
#[derive(clap::Args)]
pub(crate) struct FilterArgs {
    /// scheduled, activatable, activated, completed, incident or cancelled.
    #[arg(long)]
    state: Option<String>,
    #[arg(long = "type", short = 't')]
    job_type: Option<String>,
    #[arg(long)]
    tenant: Option<String>,
    /// The last committed stage.
    #[arg(long)]
    stage: Option<String>,
    /// A substring of the last failure's message.
    #[arg(long)]
    error: Option<String>,
    /// Created at or after this time (Unix epoch, ms).
    #[arg(long)]
    created_from: Option<i64>,
    /// Created before this time (Unix epoch, ms).
    #[arg(long)]
    created_to: Option<i64>,
}

impl FilterArgs {
    fn filter(self) -> JobFilter {
        JobFilter {
            state: self.state.unwrap_or_default(),
            r#type: self.job_type.unwrap_or_default(),
            tenant_id: self.tenant.unwrap_or_default(),
            stage: self.stage.unwrap_or_default(),
            error_contains: self.error.unwrap_or_default(),
            created_from: self.created_from.unwrap_or_default(),
            created_to: self.created_to.unwrap_or_default(),
        }
    }
}

/// A job named by the idempotency key its producer gave.
#[derive(clap::Args)]
pub(crate) struct ByIdempotencyKey {
    #[arg(long, conflicts_with = "key")]
    idempotency_key: Option<String>,
    #[arg(long, default_value = "")]
    tenant: String,
    #[arg(long, default_value = "")]
    user: String,
}

impl ByIdempotencyKey {
    /// A read of the job with `key`, or of the one this idempotency key names.
    fn get_request(self, key: Option<u64>) -> GetJobRequest {
        GetJobRequest {
            key: key.unwrap_or_default(),
            idempotency_key: self.idempotency_key.unwrap_or_default(),
            tenant_id: self.tenant,
            user: self.user,
            include_history: false,
        }
    }
}

#[derive(Subcommand)]
pub(crate) enum JobCommand {
    /// Create a job and print its key.
    Create {
        /// The job type.
        #[arg(long = "type", short = 't')]
        job_type: String,
        /// Variables, a JSON object.
        #[arg(long, default_value = "{}")]
        variables: String,
        /// Retries before an incident.
        #[arg(long)]
        retries: Option<i32>,
        #[arg(long, default_value_t = 0)]
        priority: i32,
        /// Delay in ms before the job is activatable.
        #[arg(long, default_value_t = 0)]
        delay: i64,
        /// A custom header, KEY=VALUE (repeatable).
        #[arg(long = "header", value_parser = parse_header)]
        headers: Vec<(String, String)>,
        #[arg(long, default_value = "")]
        tenant: String,
        /// Makes the create idempotent: within the key's window, the same key
        /// (and tenant and user) answers with the first job instead of making another.
        #[arg(long, default_value = "")]
        idempotency_key: String,
        /// Who initiated the job; part of the idempotency key's scope.
        #[arg(long, default_value = "")]
        user: String,
        /// A stage the job's worker checkpoints, in order (repeatable).
        #[arg(long = "stage")]
        stages: Vec<String>,
        /// A name:value label the job's worker must have, such as
        /// region:eu-west-1 (repeatable).
        #[arg(long = "require")]
        required_labels: Vec<String>,
        /// A name:value label the job would rather its worker had (repeatable).
        #[arg(long = "prefer")]
        preferred_labels: Vec<String>,
    },
    /// Print a job as JSON, by key or by idempotency key.
    Get {
        #[arg(required_unless_present = "idempotency_key")]
        key: Option<u64>,
        #[command(flatten)]
        by: ByIdempotencyKey,
    },
    /// Show what happened to a job, oldest first, with times relative to its creation.
    History {
        #[arg(required_unless_present = "idempotency_key")]
        key: Option<u64>,
        #[command(flatten)]
        by: ByIdempotencyKey,
        /// Print the events as JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// List jobs matching a filter, over every partition, in key order.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// Jobs per page (at most 1000).
        #[arg(long, default_value_t = 100)]
        page_size: i32,
        /// Continue from a previous page's token.
        #[arg(long, default_value = "")]
        page_token: String,
        /// Page through every match instead of printing one page.
        #[arg(long)]
        all: bool,
        /// One JSON object per job instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Make every incident matching a filter activatable again.
    RetryAll {
        #[command(flatten)]
        filter: FilterArgs,
        /// Retries each job gets.
        #[arg(long, default_value_t = 1)]
        retries: i32,
        /// Only count the matching jobs.
        #[arg(long)]
        dry_run: bool,
    },
    /// Cancel every job matching a filter that is not final.
    CancelAll {
        #[command(flatten)]
        filter: FilterArgs,
        /// Only count the matching jobs.
        #[arg(long)]
        dry_run: bool,
    },
    /// Wait until a job is completed or cancelled, then print it. Exits 0 when
    /// it completed, 3 when it was cancelled, 4 when the wait ended first.
    Wait {
        #[arg(required_unless_present = "idempotency_key")]
        key: Option<u64>,
        #[command(flatten)]
        by: ByIdempotencyKey,
        /// How long to wait, in ms (at most 600000).
        #[arg(long, default_value_t = 60_000)]
        timeout_ms: i64,
    },
    /// Complete an activated job.
    Complete {
        key: u64,
        #[arg(long, default_value = "{}")]
        variables: String,
        #[command(flatten)]
        fence: Fence,
    },
    /// Fail an activated job.
    Fail {
        key: u64,
        /// Retries left after this failure; 0 raises an incident.
        #[arg(long, required_unless_present = "by_policy")]
        retries: Option<i32>,
        #[arg(long, default_value = "")]
        message: String,
        /// Back-off in ms before the retry.
        #[arg(long, default_value_t = 0)]
        back_off: i64,
        #[command(flatten)]
        fence: Fence,
        /// failed, malformed-payload (an incident at once), resource-unavailable,
        /// intermittent, worker-shutdown (no retry used) or internal-error.
        #[arg(long, default_value = "failed")]
        reason: String,
        /// Let the job's retry policy decide the retries and back-off, on the
        /// partition (see FailJobRequest.by_policy).
        #[arg(long, conflicts_with_all = ["retries", "back_off"])]
        by_policy: bool,
        /// With --by-policy: the error's type, matched against the policy's
        /// non-retryable errors.
        #[arg(long, default_value = "", requires = "by_policy")]
        error_type: String,
    },
    /// Give a job retries (resolves an incident).
    Retries { key: u64, retries: i32 },
    /// Set an activated job's deadline to now + TIMEOUT ms.
    Timeout {
        key: u64,
        timeout: i64,
        #[command(flatten)]
        fence: Fence,
    },
    /// Cancel a job.
    Cancel { key: u64 },
    /// Activate jobs once (long polling up to --wait ms) and print them.
    Activate {
        #[arg(long = "type", short = 't')]
        job_type: String,
        #[arg(long, default_value_t = 10)]
        max: i32,
        #[arg(long, default_value_t = 60_000)]
        timeout: i64,
        #[arg(long, default_value_t = 0)]
        wait: i64,
        #[arg(long, default_value = "cli")]
        worker: String,
    },
}

/// Which activation a worker's command is for.
#[derive(clap::Args, Debug)]
pub(crate) struct Fence {
    /// The activation's fencing token (ActivatedJob.attempt): a command for an
    /// attempt that was superseded is refused.
    #[arg(long, required_unless_present = "override_fence", conflicts_with = "override_fence")]
    attempt: Option<u32>,
    /// An operator's override: act whatever the job's attempt, over the worker
    /// that holds it. With tokens on it needs jobs:manage for the job's type;
    /// the job's history names who did it.
    #[arg(long)]
    override_fence: bool,
}

impl Fence {
    /// The request's `attempt` and `override_fence`.
    fn fields(&self) -> (u32, bool) {
        (self.attempt.unwrap_or(0), self.override_fence)
    }
}

pub(crate) fn parse_header(value: &str) -> Result<(String, String), String> {
    value.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| "use KEY=VALUE".into())
}

/// A job's history as a timeline: seconds since the first event, then what happened.
pub(crate) fn print_history(history: &GetJobHistoryResponse, json: bool) {
    let start = history.events.first().map_or(0, |e| e.at);
    for (i, e) in history.events.iter().enumerate() {
        if json {
            println!("{}", serde_json::to_string(&event_json(e)).unwrap_or_default());
            continue;
        }
        let what = drover::client::describe_event(e, start);
        println!("{:>+10.3}s  {what}", (e.at - start) as f64 / 1000.0);
        if i + 1 == 8 && history.dropped > 0 {
            println!("{:>11}  ... {} events not kept ...", "", history.dropped);
        }
    }
}

pub(crate) fn event_json(e: &JobEvent) -> serde_json::Value {
    serde_json::json!({
        "at": e.at, "kind": e.kind, "attempt": e.attempt, "worker": e.worker,
        "session": format!("{:x}", e.session_id), "via": e.via, "gateway": e.gateway_node_id,
        "stream": e.stream_id, "reason": e.reason, "message": e.message, "retries": e.retries,
        "back_off": e.back_off, "stage": e.stage, "deadline": e.deadline, "count": e.count,
        "user": e.user, "idempotency_key": e.idempotency_key,
    })
}

pub(crate) fn job_json(job: &drover::proto::gateway::Job) -> serde_json::Value {
    serde_json::json!({
        "key": job.key,
        "type": job.r#type,
        "state": job.state,
        "tenantId": job.tenant_id,
        "variables": serde_json::from_str::<serde_json::Value>(&job.variables).unwrap_or(serde_json::Value::Null),
        "customHeaders": job.custom_headers,
        "retries": job.retries,
        "priority": job.priority,
        "attempt": job.attempt,
        "worker": job.worker,
        "deadline": job.deadline,
        "dueAt": job.due_at,
        "createdAt": job.created_at,
        "errorMessage": job.error_message,
        "result": serde_json::from_str::<serde_json::Value>(&job.result).unwrap_or(serde_json::Value::Null),
        "partitionId": job.partition_id,
        "failureReason": job.failure_reason,
        "idempotencyKey": job.idempotency_key,
        "user": job.user,
        "stages": job.stages,
        "stage": job.stage,
        "requiredLabels": job.required_labels,
        "preferredLabels": job.preferred_labels,
        "checkpoints": job.checkpoints.iter().map(|c| serde_json::json!({
            "stage": c.stage, "attempt": c.attempt, "at": c.at,
        })).collect::<Vec<_>>(),
    })
}

pub(crate) fn print_bulk(verb: &str, dry_run: bool, answer: &BulkJobsResponse) {
    if dry_run {
        println!("{} jobs match (dry run: nothing changed)", answer.matched);
        return;
    }
    println!("{} jobs matched, {} {verb}, {} failed", answer.matched, answer.changed, answer.failed);
    for error in &answer.errors {
        eprintln!("  {error}");
    }
}

pub(crate) async fn job(command: JobCommand, target: &Target) -> anyhow::Result<()> {
    let client = Client::connect(&target.address)
        .await
        .with_context(|| format!("connecting to {} (is a node running? set --address)", target.address))?;
    let mut raw = client.raw();
    match command {
        JobCommand::Create {
            job_type,
            variables,
            retries,
            priority,
            delay,
            headers,
            tenant,
            idempotency_key,
            user,
            stages,
            required_labels,
            preferred_labels,
        } => {
            let request = CreateJobRequest {
                r#type: job_type,
                variables,
                custom_headers: headers.into_iter().collect::<HashMap<_, _>>(),
                retries,
                priority,
                delay,
                tenant_id: tenant,
                idempotency_key,
                user,
                stages,
                required_labels,
                preferred_labels,
                ..Default::default()
            };
            let reply = raw.create_job(request).await.map_err(status_error)?.into_inner();
            if !reply.created {
                eprintln!("job {} already existed: the idempotency key names it", reply.key);
            }
            println!("{}", reply.key);
        }
        JobCommand::Get { key, by } => {
            let request = by.get_request(key);
            let job = raw.get_job(request).await.map_err(status_error)?.into_inner().job;
            print_json(&job_json(&job.context("GetJob answered no job")?));
        }
        JobCommand::History { key, by, json } => {
            let request = by.get_request(key);
            let history = raw.get_job_history(request).await.map_err(status_error)?.into_inner();
            print_history(&history, json);
        }
        JobCommand::List { filter, page_size, mut page_token, all, json } => {
            let filter = filter.filter();
            if !json {
                println!(
                    "{:<20} {:<20} {:<12} {:>7} {:>7} {:<16} error",
                    "key", "type", "state", "retries", "attempt", "stage"
                );
            }
            loop {
                let request = ListJobsRequest { filter: Some(filter.clone()), page_size, page_token };
                let page = raw.list_jobs(request).await.map_err(status_error)?.into_inner();
                for job in &page.jobs {
                    if json {
                        println!("{}", job_json(job));
                    } else {
                        println!(
                            "{:<20} {:<20} {:<12} {:>7} {:>7} {:<16} {}",
                            job.key, job.r#type, job.state, job.retries, job.attempt, job.stage, job.error_message
                        );
                    }
                }
                page_token = page.next_page_token;
                if page_token.is_empty() {
                    break;
                }
                if !all {
                    eprintln!("more: --page-token {page_token}");
                    break;
                }
            }
        }
        JobCommand::RetryAll { filter, retries, dry_run } => {
            let request = RetryJobsRequest { filter: Some(filter.filter()), retries, dry_run };
            let answer = raw.retry_jobs(request).await.map_err(status_error)?.into_inner();
            print_bulk("retried", dry_run, &answer);
        }
        JobCommand::CancelAll { filter, dry_run } => {
            let request = CancelJobsRequest { filter: Some(filter.filter()), dry_run };
            let answer = raw.cancel_jobs(request).await.map_err(status_error)?.into_inner();
            print_bulk("cancelled", dry_run, &answer);
        }
        JobCommand::Wait { key, by, timeout_ms } => {
            let request = AwaitJobRequest {
                key: key.unwrap_or_default(),
                idempotency_key: by.idempotency_key.unwrap_or_default(),
                tenant_id: by.tenant,
                user: by.user,
                timeout: timeout_ms,
            };
            let mut call = tonic::Request::new(request);
            call.set_timeout(Duration::from_millis(timeout_ms.max(0) as u64 + 10_000));
            let mut answers = raw.await_job(call).await.map_err(status_error)?.into_inner();
            let reply = answers.message().await.map_err(status_error)?.context("AwaitJob sent no answer")?;
            let job = reply.job.context("AwaitJob answered no job")?;
            print_json(&job_json(&job));
            match (reply.r#final, job.state.as_str()) {
                (true, "completed") => {}
                (true, _) => std::process::exit(3),
                (false, _) => {
                    eprintln!("job {} is still {} after {timeout_ms} ms", job.key, job.state);
                    std::process::exit(4);
                }
            }
        }
        JobCommand::Complete { key, variables, fence } => {
            let (attempt, override_fence) = fence.fields();
            raw.complete_job(CompleteJobRequest { key, variables, attempt, override_fence })
                .await
                .map_err(status_error)?;
            println!("completed {key}");
        }
        JobCommand::Fail { key, retries, message, back_off, fence, reason, by_policy, error_type } => {
            let (attempt, override_fence) = fence.fields();
            let request = FailJobRequest {
                key,
                attempt,
                override_fence,
                // With --by-policy, -1: an older gateway refuses it instead of
                // failing the job for good.
                retries: retries.unwrap_or(-1),
                error_message: message,
                retry_back_off: back_off,
                reason: if by_policy { String::new() } else { reason.clone() },
                by_policy,
                error_type,
                ..Default::default()
            };
            let decided = raw.fail_job(request).await.map_err(status_error)?.into_inner();
            if by_policy {
                println!(
                    "failed {key} by its retry policy: {} retries left, due again in {} ms",
                    decided.retries, decided.retry_back_off
                );
            } else {
                println!("failed {key} ({reason})");
            }
        }
        JobCommand::Retries { key, retries } => {
            raw.update_job_retries(UpdateJobRetriesRequest { key, retries }).await.map_err(status_error)?;
            println!("job {key} has {retries} retries");
        }
        JobCommand::Timeout { key, timeout, fence } => {
            let (attempt, override_fence) = fence.fields();
            let reply = raw
                .update_job_timeout(UpdateJobTimeoutRequest { key, timeout, attempt, override_fence })
                .await
                .map_err(status_error)?
                .into_inner();
            println!("job {key} now times out at {}", reply.deadline);
        }
        JobCommand::Cancel { key } => {
            raw.cancel_job(CancelJobRequest { key }).await.map_err(status_error)?;
            println!("cancelled {key}");
        }
        JobCommand::Activate { job_type, max, timeout, wait, worker } => {
            let jobs = client.activate(&job_type, &worker, max, timeout, wait).await.map_err(status_error)?;
            let jobs: Vec<_> = jobs
                .iter()
                .map(|j| {
                    serde_json::json!({
                        "key": j.key, "type": j.r#type, "attempt": j.attempt, "retries": j.retries,
                        "deadline": j.deadline, "worker": j.worker,
                        "variables": serde_json::from_str::<serde_json::Value>(&j.variables).unwrap_or_default(),
                        "customHeaders": j.custom_headers,
                    })
                })
                .collect();
            print_json(&serde_json::Value::Array(jobs));
        }
    }
    Ok(())
}
