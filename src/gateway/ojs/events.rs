//! OJS's events: Drover's lifecycle events ([`crate::gateway::api::events`]) in
//! OJS's envelope and vocabulary, read page by page
//! (`GET /ojs/v1/events`) or watched as server-sent events
//! (`GET /ojs/v1/events/stream`, resumed with `Last-Event-ID`).
//!
//! OJS names a job by its OJS id and type, which a Drover event does not
//! carry: each event's job is read for them (once per job per page; once
//! per event on the stream).

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as Sse, KeepAlive};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{json, Value};

use super::time::rfc3339;
use super::{envelope, reply, Ojs, OjsCall, OjsError};
use crate::gateway::api::events::{Cursor, EventFilter};
use crate::proto::gateway as pb;

const DEFAULT_LIMIT: usize = 100;
const MAX_LIMIT: usize = 1000;

#[derive(serde::Deserialize, Default)]
pub(super) struct EventsQuery {
    #[serde(default)]
    types: String,
    #[serde(default)]
    queues: String,
    #[serde(default)]
    limit: Option<usize>,
    #[serde(default)]
    cursor: String,
}

/// OJS's name for a Drover event kind.
fn ojs_type(kind: &str) -> &'static str {
    match kind {
        "created" => "job.enqueued",
        "activated" => "job.started",
        "completed" => "job.completed",
        "failed" | "timed_out" => "job.failed",
        "retrying" => "job.retrying",
        "incident" | "expired" => "job.discarded",
        "cancelled" => "job.cancelled",
        "queue_paused" => "queue.paused",
        "queue_resumed" => "queue.resumed",
        _ => "events.gap",
    }
}

/// What a reader asked to see, in OJS's terms.
struct Wanted {
    /// OJS types, each exact or a prefix ending in `*`.
    types: Vec<String>,
    queues: Vec<String>,
}

impl Wanted {
    fn of(query: &EventsQuery) -> Wanted {
        let list = |text: &str| text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
        Wanted { types: list(&query.types), queues: list(&query.queues) }
    }

    fn admits(&self, event: &pb::LifecycleEvent) -> bool {
        let kind = ojs_type(&event.kind);
        let typed = self.types.is_empty()
            || self.types.iter().any(|t| t.strip_suffix('*').map_or(t == kind, |prefix| kind.starts_with(prefix)));
        typed && (event.gap || self.queues.is_empty() || self.queues.contains(&event.r#type))
    }
}

/// The jobs of a page's events, read once each, for their OJS ids and types.
#[derive(Default)]
struct Jobs(HashMap<u64, Option<Value>>);

impl Jobs {
    async fn of(&mut self, ojs: &Ojs, call: &OjsCall, key: u64) -> Option<&Value> {
        if key == 0 {
            return None;
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = self.0.entry(key) {
            let request = pb::GetJobRequest { key, ..Default::default() };
            slot.insert(ojs.api.get(call, request).await.ok().map(|job| envelope::job(&job)));
        }
        self.0.get(&key).and_then(Option::as_ref)
    }
}

async fn envelope(ojs: &Ojs, call: &OjsCall, jobs: &mut Jobs, e: &pb::LifecycleEvent) -> Value {
    let job = jobs.of(ojs, call, e.key).await;
    let id = job.and_then(|j| j.get("id")).cloned().unwrap_or(Value::Null);
    let job_type = job.and_then(|j| j.get("type")).cloned().unwrap_or_else(|| json!(e.r#type));
    let mut data = json!({ "job_id": id, "job_type": job_type, "queue": e.r#type, "attempt": e.attempt });
    match e.kind.as_str() {
        "activated" => data["worker_id"] = json!(e.text),
        "completed" => data["duration_ms"] = json!(e.detail),
        "failed" => data["error"] = json!({ "code": "handler_error", "message": e.text }),
        "timed_out" => data["error"] = json!({ "code": "timeout", "message": "its visibility timeout passed" }),
        "retrying" => data["next_retry_at"] = json!(rfc3339(e.detail)),
        "cancelled" => data["cancelled_by"] = json!(e.text),
        "incident" => data["total_attempts"] = json!(e.attempt),
        "queue_paused" | "queue_resumed" => data = json!({ "queue": e.r#type }),
        _ => {}
    }
    if e.gap {
        data = json!({ "message": e.text });
    }
    json!({
        "specversion": "1.0",
        "id": format!("evt_{}", e.id),
        "type": ojs_type(&e.kind),
        "source": "ojs://drover/partitions",
        "time": rfc3339(if e.at == 0 { super::now_ms() } else { e.at }),
        "subject": if e.key == 0 { json!(e.r#type) } else { id },
        "data": data,
        "cursor": e.cursor,
    })
}

fn filter(call: &OjsCall) -> Result<EventFilter, OjsError> {
    Ok(EventFilter::new(&call.principal, &[], Vec::new(), call.scope())?)
}

/// `GET /ojs/v1/events?types=&queues=&limit=&cursor=`: up to `limit` kept
/// events after `cursor` (the oldest kept without one), and the cursor to
/// read on from.
pub(super) async fn list(
    State(ojs): State<Ojs>,
    call: OjsCall,
    Query(query): Query<EventsQuery>,
) -> Result<Response, OjsError> {
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(OjsError::invalid(format!("limit must be from 1 to {MAX_LIMIT}, got {limit}")));
    }
    let wanted = Wanted::of(&query);
    let filter = filter(&call)?;
    let mut cursor = Cursor::parse(&query.cursor, &ojs.ctx.topology)?;
    let (mut shown, mut jobs) = (Vec::new(), Jobs::default());
    loop {
        let round = ojs.api.read_events(&call, &cursor, &filter).await?;
        let moved = round.cursor != cursor;
        for event in round.events.iter().filter(|e| wanted.admits(e)) {
            if shown.len() == limit {
                break;
            }
            shown.push(envelope(&ojs, &call, &mut jobs, event).await);
            cursor = Cursor::parse(&event.cursor, &ojs.ctx.topology)?;
        }
        if shown.len() == limit {
            break;
        }
        cursor = round.cursor;
        if !moved {
            break;
        }
    }
    Ok(reply(StatusCode::OK, json!({ "events": shown, "count": shown.len(), "cursor": cursor.text() })))
}

/// `GET /ojs/v1/events/stream?types=&queues=&cursor=`: server-sent events,
/// each with its cursor as its id; a client that reconnects sends the last
/// one as `Last-Event-ID` and misses nothing still kept (it may see the
/// events of one entry again). Without either, it starts at the newest.
pub(super) async fn stream(
    State(ojs): State<Ojs>,
    call: OjsCall,
    headers: HeaderMap,
    Query(query): Query<EventsQuery>,
) -> Result<Response, OjsError> {
    let wanted = Wanted::of(&query);
    let filter = filter(&call)?;
    let resume = headers.get("last-event-id").and_then(|v| v.to_str().ok()).map(str::to_string);
    let cursor = match resume.or((!query.cursor.is_empty()).then_some(query.cursor.clone())) {
        Some(text) => Cursor::parse(&text, &ojs.ctx.topology)?,
        None => ojs.api.events_now(&call).await?,
    };
    let events = ojs.api.watch_events(&call, cursor, filter)?.filter(move |e| {
        let keep = e.as_ref().map_or(true, |e| wanted.admits(e));
        std::future::ready(keep)
    });
    let sse = events.then(move |event| {
        let (ojs, call) = (ojs.clone(), call.clone());
        async move {
            let mut jobs = Jobs::default();
            let sse = match event {
                Ok(e) => {
                    let body = envelope(&ojs, &call, &mut jobs, &e).await;
                    Sse::default().id(e.cursor.clone()).event(ojs_type(&e.kind)).data(body.to_string())
                }
                Err(status) => Sse::default().event("error").data(json!({ "message": status.message() }).to_string()),
            };
            Ok::<_, Infallible>(sse)
        }
    });
    Ok(axum::response::sse::Sse::new(sse)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}
