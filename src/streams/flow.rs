//! The flow-control types of a stream: how a gateway's streams reach
//! partition leaders ([`LeaderLink`]), the credits each client holds against
//! its limit, the jobs held by clients until their workers finish them, and
//! the signal that tells an aggregator a client has room again.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ractor::ActorRef;
use serde::Serialize;

use super::aggregator::AggregatorMsg;
use super::broker::RemoteStream;
use super::spec::WorkerSpec;
use crate::core::{fence_admits, JobKey, PartitionId, SessionId, TAGGED_ATTEMPT};

/// How a gateway reaches partition leaders (its own node's or another's).
pub trait LeaderLink: Send + Sync + 'static {
    /// Offers `partition`'s leader `room` for jobs in `stream`, whose push it
    /// found full.
    fn offer_room(
        &self,
        partition: PartitionId,
        stream: &RemoteStream,
        room: u32,
    ) -> Pin<Box<dyn Future<Output = OfferAnswer> + Send>>;

    /// Yields pushed activations that no client took, from a push whose
    /// leader had stopped waiting for the answer (and so would leave them to
    /// their activation timeout).
    fn hand_back(&self, activations: Vec<(JobKey, u32)>);

    /// Registers a new aggregated stream with every broker, in the
    /// background: leaders may push to it once it arrives.
    fn register(&self, stream: &RemoteStream);

    /// Removes an aggregated stream whose last client left from every
    /// broker, in the background.
    fn remove(&self, stream: &RemoteStream);
}

/// What became of an offer of room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OfferAnswer {
    /// The leader activated jobs and pushes them into the stream.
    Accepted,
    /// The leader has no jobs for the stream now (it knows the room is there).
    Declined,
    /// No leader of the partition answered: it is offered the room again later.
    Unreachable,
}

/// Tells a stream's aggregator that one of its clients may take another job
/// (a slot freed, or a job left its buffer), once per arming: the aggregator
/// arms it while partitions wait for room, so room made while nobody waits
/// costs no message.
#[derive(Default)]
pub struct RoomSignal {
    armed: AtomicBool,
    aggregator: OnceLock<ActorRef<AggregatorMsg>>,
}

impl RoomSignal {
    pub(super) fn attach(&self, aggregator: ActorRef<AggregatorMsg>) {
        let _ = self.aggregator.set(aggregator);
    }

    pub(super) fn arm(&self) {
        self.armed.store(true, Ordering::Release);
    }

    pub(super) fn freed(&self) {
        if self.armed.swap(false, Ordering::AcqRel) {
            if let Some(aggregator) = self.aggregator.get() {
                let _ = aggregator.cast(AggregatorMsg::Freed);
            }
        }
    }
}

/// A client's jobs in hand, against its limit.
pub struct Credits {
    held: AtomicUsize,
    max: usize,
    /// The client's stream's signal, told when a slot frees.
    signal: Arc<RoomSignal>,
}

impl Credits {
    pub fn new(max: usize, signal: Arc<RoomSignal>) -> Arc<Credits> {
        Arc::new(Credits { held: AtomicUsize::new(0), max, signal })
    }

    /// Takes one if the client is under its limit.
    pub fn try_take(&self) -> bool {
        self.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| (h < self.max).then_some(h + 1)).is_ok()
    }

    /// Gives back one taken for a job that did not reach the client.
    pub fn give_back(&self) {
        let _ = self.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| h.checked_sub(1));
    }

    /// Gives back the slot of a job the client held: its stream has room.
    fn release(&self) {
        self.give_back();
        self.signal.freed();
    }

    /// Jobs the client can take before its limit.
    pub fn free(&self) -> usize {
        self.max.saturating_sub(self.held.load(Ordering::Acquire))
    }
}

/// Activations held by clients: (key, attempt) -> (the client's credits, expiry).
/// Ordered, so the activations of one key are found without the attempt.
type HeldJobs = BTreeMap<(JobKey, u32), (Arc<Credits>, Instant)>;

/// Jobs pushed to this gateway's clients, by (key, attempt), until the worker
/// finishes them or their activation timeout passes.
///
/// Expiry runs on this gateway's monotonic clock: a job expires its timeout
/// after it was handed to the client, which is never before the leader's
/// deadline for it. Comparing the leader's deadline with this node's wall
/// clock would free slots early (or late) by the clocks' skew.
pub struct Held {
    jobs: Mutex<HeldJobs>,
    /// The origin of `earliest_expiry`.
    base: Instant,
    /// No held expiry is earlier than this many ms after `base` (it may be
    /// earlier than needed after releases): expiry scans only once it passed.
    earliest_expiry: AtomicU64,
}

impl Default for Held {
    fn default() -> Self {
        Held { jobs: Mutex::default(), base: Instant::now(), earliest_expiry: AtomicU64::new(u64::MAX) }
    }
}

impl Held {
    fn jobs(&self) -> std::sync::MutexGuard<'_, HeldJobs> {
        self.jobs.lock().expect("held jobs lock poisoned")
    }

    fn millis(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.base).as_millis() as u64
    }

    pub fn hold(&self, key: JobKey, attempt: u32, credits: Arc<Credits>, expires: Instant) {
        let mut jobs = self.jobs();
        self.earliest_expiry.fetch_min(self.millis(expires), Ordering::AcqRel);
        let previous = jobs.insert((key, attempt), (credits, expires));
        drop(jobs);
        if let Some((previous, _)) = previous {
            previous.release();
        }
    }

    /// Takes back a hold whose job did not reach the client (its credit is
    /// given back by the caller, which took it): only the hold `credits`
    /// made, never a later push's of the same activation.
    pub fn unhold(&self, key: JobKey, attempt: u32, credits: &Arc<Credits>) {
        let mut jobs = self.jobs();
        if jobs.get(&(key, attempt)).is_some_and(|(held, _)| Arc::ptr_eq(held, credits)) {
            jobs.remove(&(key, attempt));
        }
    }

    /// The worker is done with this activation (or it never reached it).
    /// `fence` names it as job commands do ([`fence_admits`]): exactly, by
    /// its tag, or (0) whichever activation of the job is held.
    pub fn release(&self, key: JobKey, fence: u32) {
        let released = {
            let mut jobs = self.jobs();
            let held = if fence != 0 && fence & TAGGED_ATTEMPT == 0 {
                Some((key, fence))
            } else {
                jobs.range((key, 0)..=(key, u32::MAX))
                    .map(|(k, _)| *k)
                    .find(|(_, attempt)| fence_admits(fence, *attempt))
            };
            held.and_then(|held| jobs.remove(&held))
        };
        if let Some((credits, _)) = released {
            credits.release();
        }
    }

    /// Lets go of activations past their expiry (the job is no longer the
    /// worker's). Scans only when the earliest held expiry has passed.
    pub fn expire(&self, now: Instant) {
        if self.millis(now) < self.earliest_expiry.load(Ordering::Acquire) {
            return;
        }
        let mut jobs = self.jobs();
        let mut earliest = u64::MAX;
        jobs.retain(|_, (credits, expires)| {
            let keep = *expires > now;
            if keep {
                earliest = earliest.min(self.millis(*expires));
            } else {
                credits.release();
            }
            keep
        });
        self.earliest_expiry.store(earliest, Ordering::Release);
    }

    /// When [`Held::expire`] may next let an activation go (possibly earlier
    /// than needed); `None` while nothing is held.
    pub fn next_expiry(&self) -> Option<Instant> {
        let earliest = self.earliest_expiry.load(Ordering::Acquire);
        // A millisecond on: the stored expiry is rounded down.
        (earliest != u64::MAX).then(|| self.base + Duration::from_millis(earliest.saturating_add(1)))
    }
}

/// The equivalence key of worker streams.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct StreamKey {
    pub job_type: String,
    pub worker: String,
    pub timeout_ms: i64,
    pub fetch_variables: Vec<String>,
    pub tenants: Vec<String>,
    /// Streams of different sessions are never one stream: a quiet session's
    /// stream must not be offered jobs while another's is.
    pub session: SessionId,
    /// The workers' labels: jobs are routed by them.
    pub labels: Vec<String>,
}

impl From<&WorkerSpec> for StreamKey {
    fn from(spec: &WorkerSpec) -> Self {
        // WorkerSpec already holds fetch variables and tenants sorted and deduplicated.
        StreamKey {
            job_type: spec.job_type.clone(),
            worker: spec.worker.clone(),
            timeout_ms: spec.timeout_ms,
            fetch_variables: spec.fetch_variables.clone(),
            tenants: spec.tenants.clone(),
            session: spec.session,
            labels: spec.labels.clone(),
        }
    }
}
