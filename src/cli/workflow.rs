//! `drover workflow ...`: workflows: create one (a chain, group or batch of
//! jobs), show one with its steps, list them, cancel one.

use clap::Subcommand;
use drover::client::Client;
use drover::proto::gateway::*;

use super::{status_error, time, Target};

#[derive(Subcommand)]
pub(crate) enum WorkflowCommand {
    /// Create a KIND (chain, group or batch) of jobs of the given TYPEs, in
    /// order: `drover workflow create chain fetch parse store`.
    Create {
        kind: String,
        #[arg(required = true)]
        types: Vec<String>,
        /// The variables every step starts with, a JSON object.
        #[arg(long, default_value = "{}")]
        variables: String,
        /// Retries of each step's job.
        #[arg(long)]
        retries: Option<i32>,
        /// A batch's callbacks: a job of this type when every step ended ...
        #[arg(long)]
        on_complete: Option<String>,
        /// ... when every step completed ...
        #[arg(long)]
        on_success: Option<String>,
        /// ... when one did not.
        #[arg(long)]
        on_failure: Option<String>,
        /// An id of your choosing (a repeat with it answers the same workflow).
        #[arg(long, default_value = "")]
        id: String,
        #[arg(long, default_value = "")]
        name: String,
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Print one workflow with its steps as JSON.
    Get {
        id: String,
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Print the workflows the token may read, newest first.
    List {
        #[arg(long)]
        tenant: Option<String>,
        /// Only those still running.
        #[arg(long)]
        running: bool,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Cancel a running workflow: steps not made never are, waiting jobs are
    /// cancelled, a job a worker holds may finish.
    Cancel {
        id: String,
        #[arg(long)]
        tenant: Option<String>,
    },
}

fn print(workflows: &[Workflow]) {
    println!(
        "{:<16} {:<38} {:<6} {:<10} {:>6} {:>9} {:>6} {:<22} {:<22}",
        "TENANT", "ID", "KIND", "STATE", "STEPS", "COMPLETED", "FAILED", "CREATED", "ENDED"
    );
    for w in workflows {
        println!(
            "{:<16} {:<38} {:<6} {:<10} {:>6} {:>9} {:>6} {:<22} {:<22}",
            w.tenant_id,
            w.id,
            w.kind,
            w.state,
            w.steps.len(),
            w.steps_completed,
            w.steps_failed,
            time(w.created_at),
            time(w.ended_at)
        );
    }
}

fn as_json(w: &Workflow) -> serde_json::Value {
    let step = |s: &WorkflowStep| {
        serde_json::json!({
            "name": s.name, "type": s.r#type, "state": s.state, "jobKey": s.job_key.to_string(),
            "createdAt": s.created_at, "endedAt": s.ended_at, "result": s.result, "error": s.error,
        })
    };
    serde_json::json!({
        "id": w.id, "tenantId": w.tenant_id, "kind": w.kind, "name": w.name, "state": w.state,
        "steps": w.steps.iter().map(step).collect::<Vec<_>>(),
        "callbacks": w.callbacks.iter().map(step).collect::<Vec<_>>(),
        "createdAt": w.created_at, "endedAt": w.ended_at, "createdBy": w.created_by,
        "stepsCompleted": w.steps_completed, "stepsFailed": w.steps_failed, "partitionId": w.partition_id,
    })
}

pub(crate) async fn workflow(command: WorkflowCommand, target: &Target) -> anyhow::Result<()> {
    let client = Client::connect_lazy(&target.address)?;
    let mut raw = client.raw();
    let named = |id: String, tenant: Option<String>| GetWorkflowRequest { id, tenant_id: tenant.unwrap_or_default() };
    match command {
        WorkflowCommand::Create {
            kind,
            types,
            variables,
            retries,
            on_complete,
            on_success,
            on_failure,
            id,
            name,
            tenant,
        } => {
            let job = |job_type: String| CreateJobRequest {
                r#type: job_type,
                variables: variables.clone(),
                retries,
                ..Default::default()
            };
            let request = CreateWorkflowRequest {
                kind,
                name,
                tenant_id: tenant.unwrap_or_default(),
                steps: types.into_iter().map(job).collect(),
                on_complete: on_complete.map(job),
                on_success: on_success.map(job),
                on_failure: on_failure.map(job),
                id,
            };
            let made = raw.create_workflow(request).await.map_err(status_error)?.into_inner();
            println!("{}", serde_json::to_string_pretty(&as_json(&made))?);
        }
        WorkflowCommand::Get { id, tenant } => {
            let w = raw.get_workflow(named(id, tenant)).await.map_err(status_error)?.into_inner();
            println!("{}", serde_json::to_string_pretty(&as_json(&w))?);
        }
        WorkflowCommand::List { tenant, running, limit } => {
            let request = ListWorkflowsRequest { tenant_id: tenant.unwrap_or_default(), running, limit };
            print(&raw.list_workflows(request).await.map_err(status_error)?.into_inner().workflows);
        }
        WorkflowCommand::Cancel { id, tenant } => {
            let w = raw.cancel_workflow(named(id, tenant)).await.map_err(status_error)?.into_inner();
            println!("cancelled");
            print(&[w]);
        }
    }
    Ok(())
}
