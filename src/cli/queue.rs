//! `drover queue ...`: queues (a tenant's jobs of one type): their figures,
//! pause and resume, and their rate and concurrency limits.

use clap::Subcommand;
use drover::client::Client;
use drover::proto::gateway::*;

use drover::gateway::api::render::{describe, describe_now};

use super::{status_error, Target};

#[derive(Subcommand)]
pub(crate) enum QueueCommand {
    /// Print every queue the token may read (or TYPE's): jobs by state, the
    /// oldest waiting job's age, the last hour's completions and failures.
    List {
        #[arg(value_name = "TYPE")]
        job_type: Option<String>,
        /// Only this tenant's queues.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Pause TYPE's queue: its jobs wait, none is handed to a worker, until it is resumed.
    Pause {
        #[arg(value_name = "TYPE")]
        job_type: String,
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Resume TYPE's paused queue.
    Resume {
        #[arg(value_name = "TYPE")]
        job_type: String,
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Limit how fast TYPE's queue starts jobs and how many it holds at
    /// once, across the cluster; for the queue as a whole and for each key
    /// (a job's custom header drover.limit_key). Replaces the queue's limit.
    Limit {
        #[arg(value_name = "TYPE")]
        job_type: String,
        #[arg(long)]
        tenant: Option<String>,
        /// Job starts per period (default: a second).
        #[arg(long, default_value_t = 0)]
        rate: u32,
        /// The rate's period in ms.
        #[arg(long, default_value_t = 0)]
        period_ms: i64,
        /// Starts at once, at most (default: a tenth of the rate, at least 1).
        #[arg(long, default_value_t = 0)]
        burst: u32,
        /// Jobs held by workers at once, at most.
        #[arg(long, default_value_t = 0)]
        concurrency: u32,
        /// Each key's job starts per period.
        #[arg(long, default_value_t = 0)]
        key_rate: u32,
        #[arg(long, default_value_t = 0)]
        key_period_ms: i64,
        #[arg(long, default_value_t = 0)]
        key_burst: u32,
        /// Each key's jobs held at once, at most.
        #[arg(long, default_value_t = 0)]
        key_concurrency: u32,
    },
    /// Lift TYPE's queue's limit.
    Unlimit {
        #[arg(value_name = "TYPE")]
        job_type: String,
        #[arg(long)]
        tenant: Option<String>,
    },
}

fn print(queues: &[Queue]) {
    println!(
        "{:<16} {:<28} {:<7} {:>9} {:>7} {:>9} {:>8} {:>9} {:>11} {:>11} {:>11}",
        "TENANT",
        "TYPE",
        "STATE",
        "AVAILABLE",
        "ACTIVE",
        "SCHEDULED",
        "RETRYING",
        "INCIDENTS",
        "OLDEST (s)",
        "DONE (1 h)",
        "FAILED (1 h)"
    );
    for q in queues {
        let hour = q.last_hour.unwrap_or_default();
        let limit = q.limit.as_ref().map(|l| format!("{}; {}", describe(l), describe_now(q))).unwrap_or_default();
        let oldest =
            if q.oldest_available_at == 0 { "-".into() } else { ((q.at - q.oldest_available_at) / 1000).to_string() };
        println!(
            "{:<16} {:<28} {:<7} {:>9} {:>7} {:>9} {:>8} {:>9} {:>11} {:>11} {:>11}",
            q.tenant_id,
            q.r#type,
            if q.paused { "paused" } else { "running" },
            q.available,
            q.active,
            q.scheduled,
            q.retrying,
            q.incidents,
            oldest,
            hour.completed,
            hour.failed
        );
        if !limit.is_empty() {
            println!("  limit: {limit}");
        }
    }
}

pub(crate) async fn queue(command: QueueCommand, target: &Target) -> anyhow::Result<()> {
    let client = Client::connect_lazy(&target.address)?;
    let (job_type, tenant, paused) = match command {
        QueueCommand::List { job_type, tenant } => {
            let request =
                ListQueuesRequest { r#type: job_type.unwrap_or_default(), tenant_id: tenant.unwrap_or_default() };
            let queues = client.raw().list_queues(request).await.map_err(status_error)?.into_inner().queues;
            print(&queues);
            return Ok(());
        }
        QueueCommand::Pause { job_type, tenant } => (job_type, tenant, true),
        QueueCommand::Resume { job_type, tenant } => (job_type, tenant, false),
        QueueCommand::Limit {
            job_type,
            tenant,
            rate,
            period_ms,
            burst,
            concurrency,
            key_rate,
            key_period_ms,
            key_burst,
            key_concurrency,
        } => {
            let limit = QueueLimit {
                queue: Some(LimitLevel { rate, period_ms, burst, concurrency }),
                per_key: Some(LimitLevel {
                    rate: key_rate,
                    period_ms: key_period_ms,
                    burst: key_burst,
                    concurrency: key_concurrency,
                }),
            };
            return set_limit(&client, job_type, tenant, Some(limit)).await;
        }
        QueueCommand::Unlimit { job_type, tenant } => return set_limit(&client, job_type, tenant, None).await,
    };
    let request = SetQueuePausedRequest { r#type: job_type, tenant_id: tenant.unwrap_or_default(), paused };
    let queue = client.raw().set_queue_paused(request).await.map_err(status_error)?.into_inner().queue;
    print(&queue.into_iter().collect::<Vec<_>>());
    Ok(())
}

async fn set_limit(
    client: &Client,
    job_type: String,
    tenant: Option<String>,
    limit: Option<QueueLimit>,
) -> anyhow::Result<()> {
    let request = SetQueueLimitRequest { r#type: job_type, tenant_id: tenant.unwrap_or_default(), limit };
    let queue = client.raw().set_queue_limit(request).await.map_err(status_error)?.into_inner().queue;
    print(&queue.into_iter().collect::<Vec<_>>());
    Ok(())
}
