//! The broker's registry of aggregated job streams, as registered by gateways.
//!
//! Node-level, not per leader: a partition leader elected later finds every
//! stream already here. Gateways re-register their streams periodically; a
//! registration not refreshed within [`STREAM_TTL`] is dropped, so a gateway that
//! died without saying goodbye stops receiving pushes. A gateway that answers a
//! push with "no such stream" (it restarted) loses the registration at once.
//!
//! A registration is keyed by (gateway, stream id). Gateways never reuse an id
//! across restarts, and a registration of a known key replaces the spec held
//! here: a broker never pushes jobs for a type, tenant or timeout the stream no
//! longer has.
//!
//! A partition leader also keeps what it knows of each stream's room
//! ([`StreamRooms`]): the gateway owns the truth (its clients' job limits), and
//! says it in every push's answer and in an offer of room after it answered
//! "full"; the leader pushes no more than that, so a full stream costs no
//! activation that would only be yielded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::core::{JobKey, Millis, NodeId, SessionId};

/// How long a registration lives without a refresh.
pub const STREAM_TTL: Duration = Duration::from_secs(15);

/// An aggregated stream on some gateway, as a broker knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RemoteStream {
    pub gateway: NodeId,
    pub stream_id: u64,
    pub job_type: String,
    pub worker: String,
    pub timeout_ms: i64,
    /// Never empty: the default tenant when the worker named none.
    pub tenants: Vec<String>,
    pub fetch_variables: Vec<String>,
    /// The worker session the stream belongs to (0: none).
    pub session: SessionId,
    /// The workers' `name:value` labels, sorted.
    pub labels: Vec<String>,
}

struct Entry {
    stream: Arc<RemoteStream>,
    refreshed: Instant,
}

#[derive(Default)]
pub struct BrokerStreams {
    by_type: Mutex<HashMap<String, Vec<Entry>>>,
}

impl BrokerStreams {
    /// Adds a stream, or refreshes a known one and replaces its spec; true
    /// when it is new or its spec changed (jobs may now be pushed to it).
    pub fn register(&self, stream: RemoteStream) -> bool {
        let mut by_type = self.by_type.lock().expect("stream registry lock");
        let now = Instant::now();
        let same_key = |e: &Entry| e.stream.gateway == stream.gateway && e.stream.stream_id == stream.stream_id;
        if let Some(existing) = by_type.get_mut(&stream.job_type).and_then(|es| es.iter_mut().find(|e| same_key(e))) {
            existing.refreshed = now;
            if *existing.stream == stream {
                return false;
            }
            existing.stream = Arc::new(stream);
            return true;
        }
        // The key may be registered under another type: that spec is gone.
        let mut replaced = false;
        for entries in by_type.values_mut() {
            let before = entries.len();
            entries.retain(|e| !same_key(e));
            replaced |= entries.len() < before;
        }
        by_type.retain(|_, entries| !entries.is_empty());
        by_type.entry(stream.job_type.clone()).or_default().push(Entry { stream: Arc::new(stream), refreshed: now });
        if !replaced {
            metrics::gauge!("drover_broker_open_job_stream_count").increment(1.0);
        }
        true
    }

    pub fn remove(&self, gateway: NodeId, stream_id: u64) {
        let mut by_type = self.by_type.lock().expect("stream registry lock");
        for entries in by_type.values_mut() {
            let before = entries.len();
            entries.retain(|e| !(e.stream.gateway == gateway && e.stream.stream_id == stream_id));
            let removed = before - entries.len();
            if removed > 0 {
                metrics::gauge!("drover_broker_open_job_stream_count").decrement(removed as f64);
            }
        }
        by_type.retain(|_, entries| !entries.is_empty());
    }

    /// The live streams of a type (registrations past their TTL are dropped).
    pub fn live(&self, job_type: &str) -> Vec<Arc<RemoteStream>> {
        let mut by_type = self.by_type.lock().expect("stream registry lock");
        let Some(entries) = by_type.get_mut(job_type) else { return Vec::new() };
        let now = Instant::now();
        let before = entries.len();
        entries.retain(|e| now.duration_since(e.refreshed) < STREAM_TTL);
        let expired = before - entries.len();
        if expired > 0 {
            metrics::gauge!("drover_broker_open_job_stream_count").decrement(expired as f64);
        }
        entries.iter().map(|e| Arc::clone(&e.stream)).collect()
    }

    pub fn all(&self) -> Vec<Arc<RemoteStream>> {
        let by_type = self.by_type.lock().expect("stream registry lock");
        by_type.values().flatten().map(|e| Arc::clone(&e.stream)).collect()
    }
}

/// What became of a push, as far as the partition leader can tell.
#[derive(Debug)]
pub enum PushOutcome {
    /// The gateway answered: it handed every job to a client except
    /// `rejected`, and its clients can take `room` more jobs (`None`: it did
    /// not say).
    Answered { rejected: Vec<JobKey>, room: Option<u32> },
    /// No job reached a client: the request never left this node, or the
    /// gateway holds no such stream (`unknown_stream`: it restarted or the
    /// stream closed).
    NotDelivered { reason: String, unknown_stream: bool },
    /// Some jobs may have reached a client (a timeout, a broken connection, a
    /// gateway that could not tell). Yielding them could give one activation to
    /// two workers; their activation timeout returns the ones that did not.
    Unknown { reason: String },
}

/// Activations a partition leader pushed, until their worker finishes them:
/// which gateway holds each, so that gateway can free its worker's slot when
/// the job is completed or failed through any gateway.
#[derive(Default)]
pub struct PushedActivations {
    by_key: HashMap<JobKey, (u32, NodeId, Millis)>,
    prune_at: usize,
}

/// Entries kept before the first sweep of activations past their deadline.
const PUSHED_SWEEP_MIN: usize = 4096;

impl PushedActivations {
    /// `gateway` holds these (key, attempt, deadline) activations. Entries past
    /// their deadline (by the leader's clock, `now`) are swept now and then:
    /// their gateway lets them go by itself.
    pub fn handed(&mut self, gateway: NodeId, activations: &[(JobKey, u32, Millis)], now: Millis) {
        for (key, attempt, deadline) in activations {
            self.by_key.insert(*key, (*attempt, gateway, *deadline));
        }
        if self.by_key.len() > self.prune_at.max(PUSHED_SWEEP_MIN) {
            self.by_key.retain(|_, (_, _, deadline)| *deadline > now);
            self.prune_at = self.by_key.len() * 2;
        }
    }

    /// A worker is done with the activation `fence` names (see
    /// [`crate::core::fence_admits`]): the gateway that holds it and its
    /// attempt, if this leader pushed that activation.
    pub fn finished(&mut self, key: JobKey, fence: u32) -> Option<(NodeId, u32)> {
        match self.by_key.get(&key) {
            Some((pushed, gateway, _)) if crate::core::fence_admits(fence, *pushed) => {
                let found = (*gateway, *pushed);
                self.by_key.remove(&key);
                Some(found)
            }
            _ => None,
        }
    }
}

/// How many more jobs each stream can take, as far as a partition leader
/// knows: what the stream's gateway last said (in a push's answer, or in an
/// offer of room), less the jobs pushed there since. A stream the leader has
/// not heard of takes one job at a time until its gateway answers.
///
/// Pushes to one stream may be in flight together and their answers may come
/// back in any order, so each push is numbered: an answer counts only if no
/// later push's answer (or offer) has been heard, and the jobs reserved by
/// pushes still in flight after it are taken off what it says.
#[derive(Default)]
pub struct StreamRooms {
    by_stream: HashMap<(NodeId, u64), Room>,
}

struct Room {
    job_type: String,
    /// `None`: the gateway has not said.
    free: Option<u32>,
    /// Pushes in flight: their number and the jobs reserved for them.
    pushing: Vec<(u64, u32)>,
    next_push: u64,
    /// The newest push whose answer (or an offer made after it) `free` reflects.
    heard: u64,
}

/// A push's claim on a stream's room, from [`StreamRooms::reserve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub push: u64,
    pub jobs: u32,
}

impl StreamRooms {
    fn key(stream: &RemoteStream) -> (NodeId, u64) {
        (stream.gateway, stream.stream_id)
    }

    fn entry(&mut self, stream: &RemoteStream) -> &mut Room {
        self.by_stream.entry(Self::key(stream)).or_insert_with(|| Room {
            job_type: stream.job_type.clone(),
            free: None,
            pushing: Vec::new(),
            next_push: 1,
            heard: 0,
        })
    }

    /// Jobs a push to `stream` may carry now; 0 when it is full as far as
    /// this leader knows, or a push to a stream not heard of is in flight.
    pub fn room(&self, stream: &RemoteStream) -> u32 {
        match self.by_stream.get(&Self::key(stream)) {
            None => 1,
            Some(Room { free: None, pushing, .. }) => u32::from(pushing.is_empty()),
            Some(Room { free: Some(free), .. }) => *free,
        }
    }

    /// Claims `jobs` of `stream`'s room for a push.
    pub fn reserve(&mut self, stream: &RemoteStream, jobs: u32) -> Reservation {
        let room = self.entry(stream);
        let push = room.next_push;
        room.next_push += 1;
        room.pushing.push((push, jobs));
        room.free = room.free.map(|free| free.saturating_sub(jobs));
        Reservation { push, jobs }
    }

    /// A push that activated `activated` jobs finished; its gateway said
    /// `answered` (`None`: no answer, or one that did not say the room).
    pub fn finished(
        &mut self,
        stream: &RemoteStream,
        reservation: Reservation,
        activated: usize,
        answered: Option<u32>,
    ) {
        let Some(room) = self.by_stream.get_mut(&Self::key(stream)) else { return };
        room.pushing.retain(|(push, _)| *push != reservation.push);
        if activated == 0 {
            // Nothing left this node: the claim goes back.
            room.free = room.free.map(|free| free.saturating_add(reservation.jobs));
            return;
        }
        if reservation.push <= room.heard {
            return;
        }
        room.heard = reservation.push;
        room.free = answered.map(|said| {
            let later: u32 =
                room.pushing.iter().filter(|(push, _)| *push > reservation.push).map(|(_, jobs)| jobs).sum();
            said.saturating_sub(later)
        });
    }

    /// The gateway of `stream` offers `room`: it has that much now, after
    /// every push it has handled. Answers to earlier pushes no longer count.
    pub fn offered(&mut self, stream: &RemoteStream, room: u32) {
        let entry = self.entry(stream);
        entry.free = Some(room);
        entry.heard = entry.next_push - 1;
    }

    /// Forgets the rooms of `job_type`'s streams that are not in `live`.
    pub fn retain_live(&mut self, job_type: &str, live: &[Arc<RemoteStream>]) {
        self.by_stream.retain(|(gateway, stream_id), room| {
            room.job_type != job_type || live.iter().any(|s| s.gateway == *gateway && s.stream_id == *stream_id)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(stream_id: u64, job_type: &str, tenants: &[&str]) -> RemoteStream {
        RemoteStream {
            gateway: 1,
            stream_id,
            job_type: job_type.into(),
            worker: "w".into(),
            timeout_ms: 1000,
            tenants: tenants.iter().map(|t| t.to_string()).collect(),
            fetch_variables: vec![],
            session: 0,
            labels: vec![],
        }
    }

    #[test]
    fn a_registration_of_a_known_stream_replaces_its_spec() {
        let streams = BrokerStreams::default();
        assert!(streams.register(stream(7, "a", &["t1"])));
        assert!(!streams.register(stream(7, "a", &["t1"])), "a refresh changes nothing");
        assert!(streams.register(stream(7, "a", &["t2"])), "new tenants are news");
        assert_eq!(streams.live("a").iter().map(|s| s.tenants.clone()).collect::<Vec<_>>(), vec![vec!["t2"]]);
        assert!(streams.register(stream(7, "b", &["t2"])));
        assert!(streams.live("a").is_empty(), "the stream no longer serves type a");
        assert_eq!(streams.live("b").len(), 1);
        assert_eq!(streams.all().len(), 1);
    }

    #[test]
    fn pushed_activations_name_their_gateway_once_per_attempt() {
        let mut pushed = PushedActivations::default();
        pushed.handed(2, &[(JobKey(1), 1, 100), (JobKey(2), 3, 100)], 0);
        assert_eq!(pushed.finished(JobKey(1), 2), None, "another attempt");
        assert_eq!(pushed.finished(JobKey(1), 1), Some((2, 1)));
        assert_eq!(pushed.finished(JobKey(1), 1), None, "told once");
        pushed.handed(0, &[(JobKey(2), 4, 100)], 0);
        assert_eq!(pushed.finished(JobKey(2), 3), None, "superseded by the next push");
        assert_eq!(pushed.finished(JobKey(2), 4), Some((0, 4)));
        // A Zeebe key's tag names the attempt; a key alone any attempt.
        let tagged = |attempt| crate::core::TAGGED_ATTEMPT | crate::core::attempt_tag(attempt);
        pushed.handed(1, &[(JobKey(3), 9, 100), (JobKey(4), 2, 100)], 0);
        assert_eq!(pushed.finished(JobKey(3), tagged(8)), None);
        assert_eq!(pushed.finished(JobKey(3), tagged(9)), Some((1, 9)));
        assert_eq!(pushed.finished(JobKey(4), 0), Some((1, 2)));
    }

    #[test]
    fn a_stream_takes_what_its_gateway_last_said_less_what_was_pushed_since() {
        let mut rooms = StreamRooms::default();
        let s = stream(1, "a", &["t"]);
        assert_eq!(rooms.room(&s), 1, "not heard of: one job at a time");
        let probe = rooms.reserve(&s, 1);
        assert_eq!(rooms.room(&s), 0, "until the probe is answered");
        rooms.finished(&s, probe, 1, Some(5));
        assert_eq!(rooms.room(&s), 5);
        let (first, second) = (rooms.reserve(&s, 3), rooms.reserve(&s, 2));
        assert_eq!(rooms.room(&s), 0);
        // The second answer comes back first, then the first's, which is older news.
        rooms.finished(&s, second, 2, Some(0));
        rooms.finished(&s, first, 3, Some(2));
        assert_eq!(rooms.room(&s), 0, "full, as the newest answer said");
        rooms.offered(&s, 2);
        assert_eq!(rooms.room(&s), 2);
        let third = rooms.reserve(&s, 2);
        rooms.finished(&s, third, 0, None);
        assert_eq!(rooms.room(&s), 2, "a push that activated nothing gives its claim back");
        // An answer counts only the pushes sent after it.
        let (fourth, fifth) = (rooms.reserve(&s, 1), rooms.reserve(&s, 1));
        rooms.finished(&s, fourth, 1, Some(3));
        assert_eq!(rooms.room(&s), 2, "the fifth push is still in flight");
        rooms.finished(&s, fifth, 1, None);
        assert_eq!(rooms.room(&s), 1, "the gateway did not say: one job at a time again");
        rooms.retain_live("a", &[]);
        assert_eq!(rooms.room(&s), 1, "forgotten");
    }
}
