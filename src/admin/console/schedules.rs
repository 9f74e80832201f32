//! The console's schedules page: each cron schedule with its expression,
//! time zone, next and last runs and counts, with pause, resume and delete.

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
pub(super) struct SchedulesQuery {
    #[serde(default)]
    done: String,
    #[serde(default)]
    schedule: String,
}

pub(super) async fn schedules(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Extension(call): Extension<crate::gateway::api::Call>,
    Query(query): Query<SchedulesQuery>,
) -> Response {
    let api = crate::gateway::api::JobApi::new(Arc::clone(&ctx));
    let schedules = match api.list_schedules(&call, ListSchedulesRequest::default()).await {
        Ok(schedules) => schedules,
        Err(error) => return failure(&ctx, &principal, "Schedules", &error.into()),
    };
    let now = crate::auth::now_ms() as i64;
    let rows: Vec<Value> = schedules
        .iter()
        .map(|s| {
            context! {
                tenant => &s.tenant_id,
                name => &s.name,
                expression => &s.expression,
                timezone => &s.timezone,
                job_type => s.job.as_ref().map(|j| j.r#type.clone()).unwrap_or_default(),
                paused => s.paused,
                next => time::utc(s.next_run_at),
                next_in => time::ago(now, s.next_run_at),
                last => time::utc(s.last_run_at),
                last_ago => time::ago(now, s.last_run_at),
                last_job => if s.last_job_key == 0 { String::new() } else { s.last_job_key.to_string() },
                runs => s.runs,
                skipped => s.skipped,
                missed => s.missed,
                overlap => &s.overlap,
                misfire => &s.misfire,
                last_error => &s.last_error,
            }
        })
        .collect();
    let notice = match query.done.as_str() {
        "paused" => Some(format!("Schedule {} paused: no tick makes a job until it is resumed.", query.schedule)),
        "resumed" => Some(format!("Schedule {} resumed.", query.schedule)),
        "deleted" => Some(format!("Schedule {} deleted; the jobs it made stay.", query.schedule)),
        _ => None,
    };
    render(&ctx, Some(&principal), "schedules.html", context! { schedules => rows, notice => notice })
}

#[derive(Deserialize)]
pub(super) struct ScheduleForm {
    name: String,
    #[serde(default)]
    tenant: String,
    /// "pause", "resume" or "delete".
    action: String,
}

pub(super) async fn act(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
    Extension(call): Extension<crate::gateway::api::Call>,
    Form(form): Form<ScheduleForm>,
) -> Response {
    let api = crate::gateway::api::JobApi::new(Arc::clone(&ctx));
    let label = format!("{}/{}", form.tenant, form.name);
    let (name, tenant_id) = (form.name, form.tenant);
    let result = match form.action.as_str() {
        "pause" | "resume" => {
            let request = SetSchedulePausedRequest { name, tenant_id, paused: form.action == "pause" };
            api.set_schedule_paused(&call, request).await.map(|_| ())
        }
        "delete" => api.delete_schedule(&call, GetScheduleRequest { name, tenant_id }).await.map(|_| ()),
        other => Err(crate::gateway::api::ApiError::InvalidArgument(format!("no schedule action {other:?}"))),
    };
    match result {
        Ok(()) => {
            let done = match form.action.as_str() {
                "pause" => "paused",
                "resume" => "resumed",
                _ => "deleted",
            };
            Redirect::to(&format!("/console/schedules?done={done}&schedule={}", encode(&label))).into_response()
        }
        Err(error) => failure(&ctx, &principal, "Changing a schedule", &error.into()),
    }
}
