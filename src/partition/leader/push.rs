//! A leader's pushes: which stream gets an activation (at random among those
//! with room, preferring near ones), the push to its gateway, and what the
//! answer makes of the jobs (room learnt, refused jobs yielded).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use ractor::ActorRef;
use rand::seq::IndexedRandom;

use super::*;

/// A push on its way: the stream, its claim on the stream's room, and the
/// gateway's offer it answers, if any.
pub struct PushTicket {
    pub(super) stream: Arc<RemoteStream>,
    pub(super) reservation: Reservation,
    pub(super) offer: Option<RpcReplyPort<bool>>,
}

/// What a finished push tells its leader.
pub struct PushReport {
    pub(super) stream: Arc<RemoteStream>,
    pub(super) reservation: Reservation,
    /// The stream's room after the push, when its gateway answered and said.
    pub(super) room: Option<u32>,
    pub(super) activated: usize,
    /// Activations no client took, for certain: yielded.
    pub(super) rejected: Refused,
    /// Activations a client took, or may have.
    pub(super) handed: usize,
    /// The gateway holds no such stream any more.
    pub(super) unknown_stream: bool,
    /// Whether the jobs in `handed` reached a client is not known.
    pub(super) outcome_unknown: bool,
}

impl PushReport {
    pub(super) fn empty(stream: Arc<RemoteStream>, reservation: Reservation) -> Self {
        PushReport {
            stream,
            reservation,
            room: None,
            activated: 0,
            rejected: Refused::none(),
            handed: 0,
            unknown_stream: false,
            outcome_unknown: false,
        }
    }
}

impl LeaderState {
    /// Activates a batch of `job_type` for a randomly picked stream with room.
    pub(super) fn try_push(&mut self, myself: &ActorRef<LeaderMsg>, job_type: &str) {
        if let Some((activation, ticket)) = self.push_activation(myself, job_type, &[]) {
            self.enqueue(vec![activation], ReplyTo::Push(ticket));
            self.flush(myself);
        }
    }

    /// The activation command for a push of `job_type`, if fewer than
    /// [`MAX_PUSHES_PER_TYPE`] pushes of it are in flight and a stream can take
    /// a job: it may take an activatable job or one of `created` (jobs
    /// created in the entry the activation joins), and has room. The stream is picked at random among those that are not
    /// blocked (then swapped for an equivalent on this node's gateway with
    /// `--push-placement local`: [`LeaderState::own_equivalent`]); when the only ones with room are, the type is tried again once
    /// they unblock. When none has room, nothing is activated: the jobs wait,
    /// activatable, for a stream's gateway to offer room.
    pub(super) fn push_activation(
        &mut self,
        myself: &ActorRef<LeaderMsg>,
        job_type: &str,
        created: &[(String, Routing)],
    ) -> Option<(Command, PushTicket)> {
        if self.draining.is_some() {
            return None;
        }
        if self.pushing.get(job_type).copied().unwrap_or(0) >= MAX_PUSHES_PER_TYPE {
            self.push_again.insert(job_type.to_string());
            return None;
        }
        let live = self.streams.live(job_type);
        self.rooms.retain_live(job_type, &live);
        let serving = self.serving(job_type, live, created);
        let now = Instant::now();
        self.blocked.retain(|_, until| *until > now);
        let with_room: Vec<&(Arc<RemoteStream>, Vec<Taker>)> =
            serving.iter().filter(|(s, _)| self.rooms.room(s) > 0).collect();
        let open: Vec<&(Arc<RemoteStream>, Vec<Taker>)> =
            with_room.iter().copied().filter(|(s, _)| !self.blocked.contains_key(&(s.gateway, s.stream_id))).collect();
        let picked = open.choose(&mut rand::rng()).map(|picked| self.own_equivalent(picked, &open));
        let Some((stream, rivals)) = picked.map(|(s, r)| (Arc::clone(s), r.clone())) else {
            if !with_room.is_empty() && self.retry_scheduled.insert(job_type.to_string()) {
                let me = myself.clone();
                let job_type = job_type.to_string();
                tokio::spawn(async move {
                    tokio::time::sleep(BLOCKED_FOR).await;
                    let _ = me.cast(LeaderMsg::RetryPush { job_type });
                });
            }
            return None;
        };
        Some(self.activation(stream, rivals))
    }

    /// With `--push-placement local`, a stream of `open` on this node's
    /// gateway that takes the same jobs as `picked` (the same tenants, labels
    /// and nearness), if there is one; `picked` otherwise. Only equivalents
    /// are swapped, so jobs that only other streams may take still get their
    /// turn at random.
    pub(super) fn own_equivalent<'a>(
        &self,
        picked: &'a (Arc<RemoteStream>, Vec<Taker>),
        open: &[&'a (Arc<RemoteStream>, Vec<Taker>)],
    ) -> &'a (Arc<RemoteStream>, Vec<Taker>) {
        let Some(node) = self.locality.node else { return picked };
        if picked.0.gateway == node {
            return picked;
        }
        let taker = self.locality.taker(&picked.0);
        let equivalent = |s: &RemoteStream| s.tenants == picked.0.tenants && self.locality.taker(s) == taker;
        open.iter().copied().find(|(s, _)| s.gateway == node && equivalent(s)).unwrap_or(picked)
    }

    /// Notes `room` in the stream `(gateway, stream id)` of `job_type`, which
    /// its gateway has just offered, and the activation command for a push
    /// into it, if it serves jobs that are waiting and a push of its type may
    /// start.
    pub(super) fn offered_activation(
        &mut self,
        (gateway, stream_id): (NodeId, u64),
        job_type: &str,
        room: u32,
    ) -> Option<(Command, PushTicket)> {
        let live = self.streams.live(job_type);
        let offered = Arc::clone(live.iter().find(|s| s.gateway == gateway && s.stream_id == stream_id)?);
        self.rooms.offered(&offered, room);
        if self.draining.is_some() {
            return None;
        }
        if self.pushing.get(job_type).copied().unwrap_or(0) >= MAX_PUSHES_PER_TYPE {
            // The type is tried again once a push of it finishes.
            self.push_again.insert(job_type.to_string());
            return None;
        }
        let (stream, rivals) = self
            .serving(job_type, live, &[])
            .into_iter()
            .find(|(s, _)| s.gateway == gateway && s.stream_id == stream_id)?;
        let now = Instant::now();
        self.blocked.retain(|_, until| *until > now);
        if self.blocked.contains_key(&(stream.gateway, stream.stream_id)) || self.rooms.room(&stream) == 0 {
            return None;
        }
        Some(self.activation(stream, rivals))
    }

    /// The streams of `live` that would take a job now: their session takes
    /// jobs, and they may take (see [`crate::core::routing`]) an activatable
    /// job or one of `created` (the tenants and labels of jobs created in the
    /// entry the activation joins); each with the other open streams of the
    /// type, its rivals.
    pub(super) fn serving(
        &self,
        job_type: &str,
        live: Vec<Arc<RemoteStream>>,
        created: &[(String, Routing)],
    ) -> Vec<(Arc<RemoteStream>, Vec<Taker>)> {
        if live.is_empty() {
            return Vec::new();
        }
        self.replica.state().read(|s| {
            // A quiet or terminated session's stream is not offered (no
            // yields spent on it), and is no rival.
            let open: Vec<Arc<RemoteStream>> =
                live.into_iter().filter(|stream| s.session_takes_jobs(stream.session)).collect();
            let rivals = self.rivals(&open);
            open.into_iter()
                .filter(|stream| {
                    let taker = self.locality.taker(stream);
                    created.iter().any(|(t, r)| stream.tenants.contains(t) && r.admits(t, &taker, &rivals))
                        || s.activatable_for(job_type, &stream.tenants, &taker, &rivals) > 0
                })
                .map(|stream| (stream, rivals.clone()))
                .collect()
        })
    }

    /// The open streams as takers, each label set and tenant list once.
    pub(super) fn rivals(&self, open: &[Arc<RemoteStream>]) -> Vec<Taker> {
        let mut rivals: Vec<Taker> = open.iter().map(|s| self.locality.taker(s).serving(&s.tenants)).collect();
        rivals.sort_unstable();
        rivals.dedup();
        rivals
    }

    /// Polls (activations a gateway submitted) are routed like pushes: the
    /// leader says whether the poll's gateway is near and which streams are
    /// open, so a poll takes only what no better stream is there for.
    pub(super) fn route_polls(&self, mut commands: Vec<Command>) -> Vec<Command> {
        for command in commands.iter_mut().flat_map(Command::each_mut) {
            if let Command::Activate(activation) = command {
                if let Via::Poll { gateway } = activation.via {
                    activation.taker.local = self.locality.near(gateway);
                    let live = self.streams.live(&activation.job_type);
                    let open: Vec<Arc<RemoteStream>> = self
                        .replica
                        .state()
                        .read(|s| live.into_iter().filter(|stream| s.session_takes_jobs(stream.session)).collect());
                    activation.rivals = self.rivals(&open);
                }
            }
        }
        commands
    }

    /// An activation of as many jobs as `stream` has room for (at most a
    /// push's batch), with its claim on that room.
    pub(super) fn activation(&mut self, stream: Arc<RemoteStream>, rivals: Vec<Taker>) -> (Command, PushTicket) {
        *self.pushing.entry(stream.job_type.clone()).or_default() += 1;
        let max_jobs = self.rooms.room(&stream).min(PUSH_BATCH);
        let reservation = self.rooms.reserve(&stream, max_jobs);
        let activation = Command::Activate(Activation {
            job_type: stream.job_type.clone(),
            tenants: stream.tenants.clone(),
            worker: stream.worker.clone(),
            timeout_ms: stream.timeout_ms,
            max_jobs,
            max_bytes: PUSH_BATCH_BYTES,
            session: stream.session,
            via: Via::Push { gateway: stream.gateway, stream: stream.stream_id },
            taker: self.locality.taker(&stream),
            rivals,
        });
        (activation, PushTicket { stream, reservation, offer: None })
    }

    /// Skips `stream` for [`BLOCKED_FOR`].
    pub(super) fn block(&mut self, stream: &RemoteStream) {
        self.blocked.insert((stream.gateway, stream.stream_id), Instant::now() + BLOCKED_FOR);
    }

    pub(super) fn send_releases(&mut self) {
        for (gateway, activations) in self.releases.drain() {
            self.link.release(gateway, activations);
        }
    }
}

/// The yields of a push's activations that its stream's gateway refused,
/// until they are written. Dropped unwritten (the actor stopped before it
/// handled the push's report, or with the yields queued, or their write
/// failed), they go to the partition's current leader
/// ([`GatewayLink::yield_elsewhere`]), so no refused job waits for its
/// activation timeout because this leader went away.
pub struct Refused {
    pub(super) yields: Vec<Command>,
    pub(super) to: Option<(PartitionId, Arc<dyn GatewayLink>)>,
}

impl Refused {
    fn none() -> Self {
        Refused { yields: Vec::new(), to: None }
    }

    /// Written: nothing is left to yield elsewhere.
    pub(super) fn written(mut self) {
        self.yields.clear();
    }
}

impl Drop for Refused {
    fn drop(&mut self) {
        if let (false, Some((partition, link))) = (self.yields.is_empty(), &self.to) {
            link.yield_elsewhere(*partition, std::mem::take(&mut self.yields));
        }
    }
}

/// The tenants and labels of the jobs each type gets in `commands`.
pub(super) fn created_by_type(commands: &[Command]) -> Vec<(String, Vec<(String, Routing)>)> {
    let mut created: Vec<(String, Vec<(String, Routing)>)> = Vec::new();
    for command in commands.iter().flat_map(Command::each) {
        if let Command::Create(job) = command {
            let (job_type, kind) = (&job.spec.job_type, (job.spec.tenant.clone(), job.spec.routing.clone()));
            match created.iter_mut().find(|(t, _)| t == job_type) {
                Some((_, kinds)) if kinds.contains(&kind) => {}
                Some((_, kinds)) => kinds.push(kind),
                None => created.push((job_type.clone(), vec![kind])),
            }
        }
    }
    created
}

/// Hands one push's activations to the stream's gateway.
pub(super) async fn push(
    link: Arc<dyn GatewayLink>,
    partition: PartitionId,
    ticket: PushTicket,
    results: Vec<CommandResult>,
    leader: ActorRef<LeaderMsg>,
) {
    let PushTicket { stream, reservation, offer } = ticket;
    let jobs = match results.into_iter().next() {
        Some(CommandResult::Activated(jobs)) => jobs,
        _ => Vec::new(),
    };
    if let Some(offer) = offer {
        let _ = offer.send(!jobs.is_empty());
    }
    let mut report = PushReport::empty(Arc::clone(&stream), reservation);
    report.activated = jobs.len();
    if jobs.is_empty() {
        let _ = leader.cast(LeaderMsg::PushDone(report));
        return;
    }
    crate::trace_context::activation_spans(partition, &jobs);
    let activations: Vec<(JobKey, u32, Millis)> = jobs.iter().map(|j| (j.key, j.attempt, j.deadline)).collect();
    let _ = leader.cast(LeaderMsg::Handing { gateway: stream.gateway, activations: activations.clone() });
    if let Some(hold) = crate::failpoints::fire("leader_push_hold") {
        tokio::time::sleep(hold).await;
    }
    let pushed = Instant::now();
    let outcome = link.push(&stream, partition, jobs).await;
    stages::record(Stage::Push, pushed.elapsed());
    let rejected: HashSet<JobKey> = match outcome {
        PushOutcome::Answered { rejected, room } => {
            report.room = room;
            rejected.into_iter().collect()
        }
        PushOutcome::NotDelivered { reason, unknown_stream } => {
            tracing::debug!(partition, gateway = stream.gateway, "push not delivered: {reason}");
            report.unknown_stream = unknown_stream;
            activations.iter().map(|(key, _, _)| *key).collect()
        }
        PushOutcome::Unknown { reason } => {
            tracing::info!(
                partition,
                gateway = stream.gateway,
                "push outcome unknown, left to the activation timeout: {reason}"
            );
            report.outcome_unknown = true;
            HashSet::new()
        }
    };
    let (gateway, reason) = (stream.gateway, YieldReason::NotReady);
    for (key, attempt, _) in activations {
        if rejected.contains(&key) {
            report.rejected.yields.push(Command::Yield { key, attempt, gateway, reason });
        } else {
            report.handed += 1;
        }
    }
    report.rejected.to = Some((partition, link));
    // If the actor has stopped, or stops before it comes to this report, the
    // report is dropped, and the refused jobs are yielded elsewhere.
    let _ = leader.cast(LeaderMsg::PushDone(report));
}
