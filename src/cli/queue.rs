//! `drover queue ...`: queues (a tenant's jobs of one type): their figures,
//! pause and resume.

use clap::Subcommand;
use drover::client::Client;
use drover::proto::gateway::*;

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
    };
    let request = SetQueuePausedRequest { r#type: job_type, tenant_id: tenant.unwrap_or_default(), paused };
    let queue = client.raw().set_queue_paused(request).await.map_err(status_error)?.into_inner().queue;
    print(&queue.into_iter().collect::<Vec<_>>());
    Ok(())
}
