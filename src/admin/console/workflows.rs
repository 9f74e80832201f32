//! The console's workflows page: each workflow with its kind, state and
//! every step's (and callback's) state and job, newest first, with cancel.

use std::sync::Arc;

use axum::extract::{Form, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use minijinja::{context, Value};
use serde::Deserialize;

use super::*;
use crate::auth::Principal;
use crate::context::NodeContext;

#[derive(Deserialize, Default)]
pub(super) struct WorkflowsQuery {
    #[serde(default)]
    done: String,
    #[serde(default)]
    workflow: String,
    /// "1": only running ones.
    #[serde(default)]
    running: String,
}

fn step_row(s: &WorkflowStep) -> Value {
    context! {
        name => &s.name,
        job_type => &s.r#type,
        state => &s.state,
        job => if s.job_key == 0 { String::new() } else { s.job_key.to_string() },
        error => &s.error,
    }
}

pub(super) async fn workflows(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Extension(call): Extension<crate::gateway::api::Call>,
    Query(query): Query<WorkflowsQuery>,
) -> Response {
    let api = crate::gateway::api::JobApi::new(Arc::clone(&ctx));
    let running = query.running == "1";
    let request = ListWorkflowsRequest { running, ..Default::default() };
    let workflows = match api.list_workflows(&call, request).await {
        Ok(workflows) => workflows,
        Err(error) => return failure(&ctx, &principal, "Workflows", &error.into()),
    };
    let now = crate::auth::now_ms() as i64;
    let rows: Vec<Value> = workflows
        .iter()
        .map(|w| {
            context! {
                tenant => &w.tenant_id,
                id => &w.id,
                name => &w.name,
                kind => &w.kind,
                state => &w.state,
                created => time::utc(w.created_at),
                created_ago => time::ago(now, w.created_at),
                ended => time::utc(w.ended_at),
                completed => w.steps_completed,
                failed => w.steps_failed,
                total => w.steps.len(),
                steps => w.steps.iter().map(step_row).collect::<Vec<_>>(),
                callbacks => w.callbacks.iter().map(step_row).collect::<Vec<_>>(),
                partition => w.partition_id,
            }
        })
        .collect();
    let notice = match query.done.as_str() {
        "cancelled" => Some(format!(
            "Workflow {} cancelled: steps not made never will be, waiting jobs are cancelled.",
            query.workflow
        )),
        _ => None,
    };
    render(
        &ctx,
        Some(&principal),
        "workflows.html",
        context! { workflows => rows, notice => notice, running => running },
    )
}

#[derive(Deserialize)]
pub(super) struct WorkflowForm {
    id: String,
    #[serde(default)]
    tenant: String,
}

/// Cancels a workflow.
pub(super) async fn cancel(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Extension(call): Extension<crate::gateway::api::Call>,
    Form(form): Form<WorkflowForm>,
) -> Response {
    let api = crate::gateway::api::JobApi::new(Arc::clone(&ctx));
    let label = format!("{}/{}", form.tenant, form.id);
    let request = GetWorkflowRequest { id: form.id, tenant_id: form.tenant };
    match api.cancel_workflow(&call, request).await {
        Ok(_) => {
            Redirect::to(&format!("/console/workflows?done=cancelled&workflow={}", encode(&label))).into_response()
        }
        Err(error) => failure(&ctx, &principal, "Cancelling a workflow", &error.into()),
    }
}
