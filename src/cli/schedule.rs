//! `drover schedule ...`: cron schedules: register (or change), list, show,
//! pause, resume and delete.

use std::collections::HashMap;

use clap::Subcommand;
use drover::client::Client;
use drover::proto::gateway::*;

use super::job::parse_header;
use super::{status_error, time, Target};

#[derive(Subcommand)]
pub(crate) enum ScheduleCommand {
    /// Register schedule NAME, or change the one of that name: a job of
    /// TYPE at each tick of EXPRESSION ("0 9 * * 1-5", "*/30 * * * * *"
    /// with seconds, "@hourly", "@every 90s").
    Put(Box<PutArgs>),
    /// Print the schedules the token may read, with their next and last runs.
    List {
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Print one schedule as JSON.
    Get {
        name: String,
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Pause NAME: no tick makes a job until it is resumed.
    Pause {
        name: String,
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Resume NAME: it ticks next at its first tick after now.
    Resume {
        name: String,
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Delete NAME; the jobs it made stay.
    Delete {
        name: String,
        #[arg(long)]
        tenant: Option<String>,
    },
}

/// What `drover schedule put` takes.
#[derive(clap::Args)]
pub(crate) struct PutArgs {
    name: String,
    expression: String,
    /// The job type each tick makes.
    #[arg(long = "type")]
    job_type: String,
    /// The jobs' variables, a JSON object.
    #[arg(long, default_value = "{}")]
    variables: String,
    /// A custom header of the jobs, KEY=VALUE (repeatable).
    #[arg(long = "header", value_parser = parse_header)]
    headers: Vec<(String, String)>,
    #[arg(long)]
    retries: Option<i32>,
    #[arg(long, default_value_t = 0)]
    priority: i32,
    /// An IANA time zone ("Europe/Berlin"); UTC by default.
    #[arg(long, default_value = "")]
    timezone: String,
    /// skip (default), allow or cancel_previous: what a tick does while
    /// the previous tick's job is still waiting or running.
    #[arg(long, default_value = "")]
    overlap: String,
    /// fire_once (default) or fire_all: what happens when several ticks
    /// passed at once.
    #[arg(long, default_value = "")]
    misfire: String,
    /// Register it paused.
    #[arg(long)]
    paused: bool,
    #[arg(long, default_value = "")]
    description: String,
    #[arg(long)]
    tenant: Option<String>,
}

fn print(schedules: &[Schedule]) {
    println!(
        "{:<16} {:<28} {:<20} {:<16} {:<7} {:<24} {:<24} {:>6} {:>7} {:>6}",
        "TENANT", "NAME", "EXPRESSION", "TIME ZONE", "STATE", "NEXT RUN", "LAST RUN", "RUNS", "SKIPPED", "MISSED"
    );
    for s in schedules {
        println!(
            "{:<16} {:<28} {:<20} {:<16} {:<7} {:<24} {:<24} {:>6} {:>7} {:>6}",
            s.tenant_id,
            s.name,
            s.expression,
            s.timezone,
            if s.paused { "paused" } else { "active" },
            time(s.next_run_at),
            time(s.last_run_at),
            s.runs,
            s.skipped,
            s.missed
        );
        if !s.last_error.is_empty() {
            println!("  last tick made no job: {}", s.last_error);
        }
    }
}

pub(crate) async fn schedule(command: ScheduleCommand, target: &Target) -> anyhow::Result<()> {
    let client = Client::connect_lazy(&target.address)?;
    let mut raw = client.raw();
    let named =
        |name: String, tenant: Option<String>| GetScheduleRequest { name, tenant_id: tenant.unwrap_or_default() };
    let schedule = match command {
        ScheduleCommand::Put(put) => {
            let PutArgs {
                name,
                expression,
                job_type,
                variables,
                headers,
                retries,
                priority,
                timezone,
                overlap,
                misfire,
                paused,
                description,
                tenant,
            } = *put;
            let job = CreateJobRequest {
                r#type: job_type,
                variables,
                custom_headers: headers.into_iter().collect::<HashMap<_, _>>(),
                retries,
                priority,
                ..Default::default()
            };
            let request = PutScheduleRequest {
                name,
                tenant_id: tenant.unwrap_or_default(),
                expression,
                timezone,
                job: Some(job),
                overlap,
                misfire,
                paused,
                description,
            };
            let put = raw.put_schedule(request).await.map_err(status_error)?.into_inner();
            println!("{}", if put.created { "registered" } else { "changed" });
            put.schedule
        }
        ScheduleCommand::List { tenant } => {
            let request = ListSchedulesRequest { tenant_id: tenant.unwrap_or_default() };
            print(&raw.list_schedules(request).await.map_err(status_error)?.into_inner().schedules);
            return Ok(());
        }
        ScheduleCommand::Get { name, tenant } => {
            let s = raw.get_schedule(named(name, tenant)).await.map_err(status_error)?.into_inner();
            let job = s.job.clone().unwrap_or_default();
            let json = serde_json::json!({
                "name": s.name, "tenantId": s.tenant_id, "expression": s.expression, "timezone": s.timezone,
                "type": job.r#type, "variables": job.variables, "customHeaders": job.custom_headers,
                "retries": job.retries, "priority": job.priority, "overlap": s.overlap, "misfire": s.misfire,
                "paused": s.paused, "description": s.description, "nextRunAt": s.next_run_at,
                "lastRunAt": s.last_run_at, "lastJobKey": s.last_job_key.to_string(), "runs": s.runs,
                "skipped": s.skipped, "missed": s.missed, "lastError": s.last_error, "createdAt": s.created_at,
                "updatedAt": s.updated_at, "updatedBy": s.updated_by, "partitionId": s.partition_id,
            });
            println!("{}", serde_json::to_string_pretty(&json)?);
            return Ok(());
        }
        ScheduleCommand::Pause { name, tenant } => Some(set_paused(&client, name, tenant, true).await?),
        ScheduleCommand::Resume { name, tenant } => Some(set_paused(&client, name, tenant, false).await?),
        ScheduleCommand::Delete { name, tenant } => {
            let s = raw.delete_schedule(named(name, tenant)).await.map_err(status_error)?.into_inner();
            println!("deleted");
            Some(s)
        }
    };
    print(&schedule.into_iter().collect::<Vec<_>>());
    Ok(())
}

async fn set_paused(client: &Client, name: String, tenant: Option<String>, paused: bool) -> anyhow::Result<Schedule> {
    let request = SetSchedulePausedRequest { name, tenant_id: tenant.unwrap_or_default(), paused };
    Ok(client.raw().set_schedule_paused(request).await.map_err(status_error)?.into_inner())
}
