//! The engine's read-only views: what the leader, snapshots, metrics and
//! reads look at between batches.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::{PartitionState, StateSnapshot};
use crate::core::{Deduped, Job, JobKey, Millis, PartitionId, Registry, RequestId, Routing, Session, SessionId, Taker};

impl PartitionState {
    /// The sessions and schemas, as snapshotted.
    pub fn registry(&self) -> Registry {
        Registry { sessions: self.session_records(), schemas: self.schema_records(), owners: self.session_owners() }
    }
    /// Each owned session's owner, as stored (rewritten with the sessions).
    pub fn session_owners(&self) -> Vec<(SessionId, String)> {
        self.session_owners.iter().map(|(id, owner)| (*id, owner.clone())).collect()
    }
    /// The sessions as stored (rewritten whenever one changes).
    pub fn session_records(&self) -> Vec<Session> {
        self.sessions.values().cloned().collect()
    }
    /// The schemas as stored: (job type, source).
    pub fn schema_records(&self) -> Vec<(String, Bytes)> {
        self.schemas.iter().map(|(t, s)| (t.clone(), s.source.clone())).collect()
    }
    pub fn session(&self, id: SessionId) -> Option<&Session> {
        self.sessions.get(&id)
    }
    /// How many jobs of this partition a session holds.
    pub fn held_by(&self, id: SessionId) -> usize {
        self.held.range((id, JobKey(0))..=(id, JobKey(u64::MAX))).count()
    }
    /// Whether a stream of `session` (0: none) may be offered jobs.
    pub fn session_takes_jobs(&self, session: SessionId) -> bool {
        session == 0 || self.sessions.get(&session).is_some_and(Session::takes_jobs)
    }
    pub fn meta(&self) -> StateSnapshot {
        StateSnapshot {
            partition: self.partition,
            next_counter: self.next_counter,
            clock: self.clock,
            next_request_seq: self.next_request_seq,
        }
    }
    /// Every remembered create with its storage id, for snapshots.
    pub fn requests(&self) -> impl Iterator<Item = (u64, &RequestId, &Deduped)> {
        self.request_expiry.iter().map(|(id, request)| (*id, request, &self.requests[request]))
    }
    /// What the partition remembers of a create, if it is within its window.
    pub fn request(&self, request: &RequestId) -> Option<&Deduped> {
        self.requests.get(request)
    }
    pub fn partition(&self) -> PartitionId {
        self.partition
    }
    /// The greatest leader time applied so far.
    pub fn clock(&self) -> Millis {
        self.clock
    }
    pub fn job(&self, key: JobKey) -> Option<&Job> {
        self.jobs.get(&key)
    }
    pub fn jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values()
    }
    /// Whether `key` was ever created here (it may be final and out of memory).
    pub fn was_created(&self, key: JobKey) -> bool {
        key.partition() == self.partition && key.counter() >= 1 && key.counter() < self.next_counter
    }
    /// When the next timer (a due job, an activation deadline or a session's
    /// lease) fires.
    pub fn next_timer(&self) -> Option<Millis> {
        let due = self.due.first().map(|(at, _)| *at);
        let deadline = self.deadlines.first().map(|(at, _)| *at);
        let session = self.session_expiry.first().map(|(at, _)| *at);
        [due, deadline, session].into_iter().flatten().min()
    }
    /// Activatable jobs of a type, over the given tenants (all tenants if empty).
    pub fn activatable_count(&self, job_type: &str, tenants: &[String]) -> usize {
        let Some(queues) = self.ready.get(job_type) else { return 0 };
        queues.iter().filter(|(k, _)| tenants.is_empty() || tenants.contains(&k.tenant)).map(|(_, q)| q.len()).sum()
    }
    /// Activatable jobs of a type over the given tenants that `taker` may take
    /// while `rivals` are open too (see [`crate::core::routing`]).
    pub fn activatable_for(&self, job_type: &str, tenants: &[String], taker: &Taker, rivals: &[Taker]) -> usize {
        let Some(queues) = self.ready.get(job_type) else { return 0 };
        queues
            .iter()
            .filter(|(k, _)| tenants.contains(&k.tenant) && k.routing.admits(&k.tenant, taker, rivals))
            .map(|(_, q)| q.len())
            .sum()
    }
    /// Activatable jobs of a type by their labels (jobs without labels left
    /// out), for telling which of them no open worker may take.
    pub fn activatable_by_routing(&self, job_type: &str) -> Vec<(&Routing, usize)> {
        let Some(queues) = self.ready.get(job_type) else { return Vec::new() };
        let mut by_routing: Vec<(&Routing, usize)> = Vec::new();
        for (key, queue) in queues.iter().filter(|(k, _)| !k.routing.is_empty()) {
            match by_routing.iter_mut().find(|(r, _)| **r == key.routing) {
                Some((_, n)) => *n += queue.len(),
                None => by_routing.push((&key.routing, queue.len())),
            }
        }
        by_routing
    }
    /// Activatable jobs per type, for metrics and for pushing to new streams.
    pub fn activatable_by_type(&self) -> Vec<(String, usize)> {
        self.ready.iter().map(|(ty, by_tenant)| (ty.clone(), by_tenant.values().map(BTreeSet::len).sum())).collect()
    }
}
