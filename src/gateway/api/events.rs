//! The job API's lifecycle events: each partition's kept events (see
//! `raft::state_machine::events`) read from its leader after a cursor,
//! filtered to what the caller may read, merged in time order, and watched
//! as a stream that polls the partitions while it is open.
//!
//! A cursor is one log index per partition, written as the indexes joined by
//! `.`: reading after it gives every event of later entries. An event's own
//! cursor resumes after it; within an entry of several events it resumes at
//! the entry's start, so a subscriber may see an entry's events again, never
//! miss one (at least once, as OJS's events ask).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;

use super::ApiError;
use super::Call;
use super::JobApi;
use crate::auth::{Principal, Verb};
use crate::context::NodeContext;
use crate::core::{Lifecycle, PartitionId};
use crate::leaders;
use crate::proto::gateway as pb;
use crate::raft::ReadEvent;

/// Events read from one partition per round.
const READ_PER_PARTITION: usize = 500;
/// How soon an open watch asks the partitions again after a round that
/// found something; each round that finds nothing doubles the wait, up to
/// [`WATCH_IDLE_POLL`], so an idle watch costs a read per partition a
/// second, not ten.
const WATCH_POLL: Duration = Duration::from_millis(100);
const WATCH_IDLE_POLL: Duration = Duration::from_secs(1);

/// Where a reader is: the last log index read, per partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cursor(pub Vec<u64>);

impl Cursor {
    pub fn start(partitions: u32) -> Cursor {
        Cursor(vec![0; partitions as usize])
    }

    /// A cursor as an event carried it, for the partitions `topology` routes
    /// over; one taken before partitions were added (as long as a count the
    /// cluster had) reads the added ones from their start.
    pub fn parse(text: &str, topology: &crate::context::Topology) -> Result<Cursor, ApiError> {
        let partitions = topology.partition_count();
        if text.is_empty() {
            return Ok(Cursor::start(partitions));
        }
        let bad = || {
            ApiError::InvalidArgument(format!(
                "cursor {text:?} is not one an event carried (one log index per partition, joined by '.'); \
                 start without one"
            ))
        };
        let mut indexes: Vec<u64> = text.split('.').map(|i| i.parse().map_err(|_| bad())).collect::<Result<_, _>>()?;
        let known = topology.counts().iter().any(|(count, _)| *count as usize == indexes.len());
        if indexes.len() > partitions as usize || !known {
            return Err(bad());
        }
        indexes.resize(partitions as usize, 0);
        Ok(Cursor(indexes))
    }

    pub fn text(&self) -> String {
        self.0.iter().map(u64::to_string).collect::<Vec<_>>().join(".")
    }
}

/// Which events a reader wants, and may see.
pub struct EventFilter {
    pub kinds: Vec<Lifecycle>,
    pub types: Vec<String>,
    pub tenant: String,
    principal: Arc<Principal>,
}

impl EventFilter {
    pub fn new(
        principal: &Arc<Principal>,
        kinds: &[String],
        types: Vec<String>,
        tenant: String,
    ) -> Result<Self, ApiError> {
        let kinds = kinds
            .iter()
            .map(|k| {
                Lifecycle::parse(k).ok_or_else(|| {
                    let known: Vec<&str> = crate::core::lifecycle_kinds().iter().map(|l| l.as_str()).collect();
                    ApiError::InvalidArgument(format!("{k:?} is not an event kind; the kinds: {}", known.join(", ")))
                })
            })
            .collect::<Result<_, _>>()?;
        if types.is_empty() {
            principal.require_some(Verb::Read)?;
        }
        for job_type in &types {
            principal.require_job(Verb::Read, job_type)?;
        }
        if !tenant.is_empty() {
            principal.require_tenant(&tenant)?;
        }
        Ok(EventFilter { kinds, types, tenant, principal: Arc::clone(principal) })
    }

    fn admits(&self, e: &ReadEvent) -> bool {
        let event = &e.event;
        (self.kinds.is_empty() || self.kinds.contains(&event.lifecycle))
            && (self.types.is_empty() || self.types.contains(&event.job_type))
            && (self.tenant.is_empty() || self.tenant == event.tenant)
            && self.principal.in_tenant(&event.tenant)
            && self.principal.may(Verb::Read, &event.job_type)
    }
}

/// One round's events: gap markers, then what `filter` admits in time
/// order, each with the cursor that resumes after it; and the cursor after
/// the round.
pub struct Round {
    pub events: Vec<pb::LifecycleEvent>,
    pub cursor: Cursor,
}

impl JobApi {
    /// Where a `WatchEvents` call starts, and what it is shown.
    pub async fn events_request(
        &self,
        call: &Call,
        request: pb::WatchEventsRequest,
    ) -> Result<(Cursor, EventFilter), ApiError> {
        let tenant = match request.tenant_id.is_empty() {
            true => String::new(),
            false => super::validate::tenant_id("tenant_id", request.tenant_id)?,
        };
        let filter = EventFilter::new(&call.principal, &request.kinds, request.types, tenant)?;
        let cursor = match request.from_now {
            true => self.events_now(call).await?,
            false => Cursor::parse(&request.cursor, &self.ctx.topology)?,
        };
        Ok((cursor, filter))
    }

    /// One read of every partition after `cursor`.
    pub async fn read_events(&self, call: &Call, cursor: &Cursor, filter: &EventFilter) -> Result<Round, ApiError> {
        read_round(&self.ctx, cursor, filter, call.deadline).await
    }

    /// The cursor after every event kept now: each partition leader's last
    /// applied entry.
    pub async fn events_now(&self, call: &Call) -> Result<Cursor, ApiError> {
        let partitions = self.ctx.topology.partition_count();
        let reads = (0..partitions).map(|p| leaders::events(&self.ctx, p, 0, 0, call.deadline));
        let pages = futures::future::join_all(reads).await;
        Ok(Cursor(pages.into_iter().map(|page| page.map(|p| p.applied)).collect::<Result<_, _>>()?))
    }

    /// Opens a watch for `call`'s principal: rounds from `cursor` on, then
    /// a round every [`WATCH_POLL`] to [`WATCH_IDLE_POLL`] while the caller
    /// listens and the node runs. A watch holds one of the principal's
    /// stream permits (`--principal-streams`) while it is open:
    /// RESOURCE_EXHAUSTED when it holds as many as allowed.
    pub fn watch_events(
        &self,
        call: &Call,
        mut cursor: Cursor,
        filter: EventFilter,
    ) -> Result<impl Stream<Item = Result<pb::LifecycleEvent, tonic::Status>> + Send + 'static, ApiError> {
        let permit = self.ctx.auth.open_stream(&call.principal)?;
        let ctx = Arc::clone(&self.ctx);
        let (sender, receiver) = tokio::sync::mpsc::channel(256);
        tokio::spawn(async move {
            let _permit = permit;
            let mut stopping = ctx.stopping.clone();
            let mut idle = WATCH_POLL;
            loop {
                let deadline = Instant::now() + ctx.settings.request_timeout;
                let round = match read_round(&ctx, &cursor, &filter, deadline).await {
                    Ok(round) => round,
                    Err(error) => {
                        let _ = sender.send(Err(tonic::Status::from(error))).await;
                        return;
                    }
                };
                let moved = round.cursor != cursor;
                for event in round.events {
                    if sender.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
                cursor = round.cursor;
                if moved {
                    idle = WATCH_POLL;
                    continue;
                }
                tokio::select! {
                    _ = tokio::time::sleep(idle) => idle = (idle * 2).min(WATCH_IDLE_POLL),
                    _ = sender.closed() => return,
                    _ = stopping.wait_for(|s| *s) => return,
                }
            }
        });
        Ok(tokio_stream::wrappers::ReceiverStream::new(receiver))
    }
}

async fn read_round(
    ctx: &NodeContext,
    cursor: &Cursor,
    filter: &EventFilter,
    deadline: Instant,
) -> Result<Round, ApiError> {
    let partitions = ctx.topology.partition_count();
    // A watch that began before partitions were added reads them from their start.
    let mut padded = cursor.clone();
    if padded.0.len() < partitions as usize {
        padded.0.resize(partitions as usize, 0);
    }
    let cursor = &padded;
    let reads = (0..partitions).map(|p| leaders::events(ctx, p, cursor.0[p as usize], READ_PER_PARTITION, deadline));
    let pages = futures::future::join_all(reads).await;
    let mut next = cursor.clone();
    // Where each partition's events resume: past a gap once it is reported.
    let mut at = cursor.clone();
    let mut events = Vec::new();
    let mut read: Vec<(PartitionId, ReadEvent)> = Vec::new();
    for (p, page) in pages.into_iter().enumerate() {
        let page = page?;
        let after = cursor.0[p];
        if page.gap_after(after) {
            events.push(gap(p as PartitionId, page.from, cursor));
            at.0[p] = page.from - 1;
        }
        next.0[p] = page.through.max(at.0[p]);
        read.extend(page.events.into_iter().map(|e| (p as PartitionId, e)));
    }
    // In time order across partitions; a partition's own (log) order is kept.
    read.sort_by_key(|(p, e)| (e.at, *p, e.index, e.seq));
    // Whether each event ends its entry: no later event read is of it.
    let mut last_of_entry = vec![true; read.len()];
    let mut seen = std::collections::HashSet::new();
    for i in (0..read.len()).rev() {
        last_of_entry[i] = seen.insert((read[i].0, read[i].1.index));
    }
    // Each event's cursor: past every entry this reader has seen all of.
    for (i, (p, event)) in read.into_iter().enumerate() {
        let position = &mut at.0[p as usize];
        *position = if last_of_entry[i] { event.index } else { (*position).max(event.index.saturating_sub(1)) };
        if filter.admits(&event) {
            events.push(shown(p, event, &at));
        }
    }
    Ok(Round { events, cursor: next })
}

fn gap(p: PartitionId, from: u64, cursor: &Cursor) -> pb::LifecycleEvent {
    pb::LifecycleEvent {
        id: format!("gap-{p}-{from}"),
        kind: "gap".into(),
        text: format!(
            "partition {p} keeps events from log index {from} on; the cursor was at {}: events between are lost \
             to this reader (older than the retention, or before a replica's snapshot)",
            cursor.0[p as usize]
        ),
        cursor: cursor.text(),
        gap: true,
        ..Default::default()
    }
}

fn shown(p: PartitionId, event: ReadEvent, at: &Cursor) -> pb::LifecycleEvent {
    let e = event.event;
    pb::LifecycleEvent {
        id: format!("{p}-{}-{}", event.index, event.seq),
        kind: e.lifecycle.as_str().into(),
        key: e.key,
        r#type: e.job_type,
        tenant_id: e.tenant,
        attempt: e.attempt,
        at: event.at,
        detail: e.detail,
        text: e.text,
        cursor: at.text(),
        gap: false,
    }
}
