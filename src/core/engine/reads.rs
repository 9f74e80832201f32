//! The engine's read-only views: what the leader, snapshots, metrics and
//! reads look at between batches.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::{PartitionState, StateSnapshot};
use crate::core::principal::Principal;
use crate::core::{
    Command, CommandResult, Deduped, Job, JobFilter, JobKey, Millis, PartitionId, Registry, RequestId, Routing,
    Session, SessionId, Taker,
};

impl PartitionState {
    /// The answer to read `command` ([`Command::is_read`]) for `by` (none:
    /// nothing is checked), as of `now`, from this state as it is: what
    /// applying it would answer, authorized as at apply, with nothing
    /// changed and no log entry. `None` for a command that is not a read.
    pub fn answer_read(&self, by: Option<&Principal>, command: &Command, now: Millis) -> Option<CommandResult> {
        if !command.is_read() {
            return None;
        }
        if let Some(refusal) = by.and_then(|by| self.authorize(by, command).err()) {
            return Some(CommandResult::Rejected(refusal));
        }
        let now = now.max(self.clock);
        Some(match command {
            Command::ListSessions => CommandResult::Sessions(
                self.sessions.values().map(|s| (s.clone(), self.held_by(s.info.id) as u32)).collect(),
            ),
            Command::GetSchema { job_type } => {
                CommandResult::Schema(self.schemas.get(job_type).map(|s| s.source.clone()).unwrap_or_default())
            }
            Command::QueueStats { tenants, job_type } => {
                CommandResult::Queues(self.queue_figures(tenants, job_type, now))
            }
            Command::ListSchedules { tenants } => CommandResult::Schedules(self.list_schedules(tenants)),
            Command::GetWorkflow { tenant, id } => {
                self.get_workflow(tenant, id).unwrap_or_else(CommandResult::Rejected)
            }
            Command::ListWorkflows { tenants, running, limit } => {
                CommandResult::Workflows(self.list_workflows(tenants, *running, *limit))
            }
            Command::GetLimits { tenants, job_type } => CommandResult::Limits(self.limit_states(tenants, job_type)),
            _ => return None,
        })
    }

    /// The sessions and schemas, as snapshotted.
    pub fn registry(&self) -> Registry {
        Registry {
            sessions: self.session_records(),
            schemas: self.schema_records(),
            owners: self.session_owners(),
            paused: self.paused_records(),
            schedules: self.schedule_records(),
            workflows: self.workflow_records(),
            limits: self.all_limit_records(),
            plan: self.plan.clone(),
        }
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
    /// Creates remembered for de-duplication (idempotency keys, and creates
    /// a gateway may re-send).
    pub fn requests_len(&self) -> usize {
        self.requests.counts().entries
    }
    /// Idempotency keys of `tenant` remembered here.
    pub fn keys_of_tenant(&self, tenant: &str) -> usize {
        self.requests.counts().keys_of_tenant(tenant)
    }
    /// What the partition remembers of a create, if it is within its window.
    pub fn request(&self, request: &RequestId) -> Option<Deduped> {
        self.requests.find(request)
    }
    /// The request entry at a storage id (what a create taking it would
    /// displace).
    #[cfg(test)]
    pub fn request_at(&self, id: u64) -> Option<RequestId> {
        self.requests.at(id)
    }
    pub fn partition(&self) -> PartitionId {
        self.partition
    }
    /// The greatest leader time applied so far.
    pub fn clock(&self) -> Millis {
        self.clock
    }
    /// The gap a leader taking over at `now` must cover, when it threatens
    /// some session's lease ([`crate::core::SessionInfo::threatened_by`]).
    /// No beat commits between the last entry applied here and the take-over;
    /// a live session's lease covers a gap under its margin. A gap under half
    /// of every session's margin (a hand-over, a leader stepping down) harms
    /// none: `None`, leases stay as they are, and a dead worker's jobs come
    /// back when its lease ends, not a whole lease later. Otherwise the new
    /// leader's entries carry the gap ([`crate::core::Command::RenewLeases`])
    /// and restart the leases it threatens, only those.
    pub fn lease_gap(&self, now: Millis) -> Option<Millis> {
        let gap = now.saturating_sub(self.clock);
        self.sessions.values().any(|s| s.info.threatened_by(gap)).then_some(gap)
    }
    pub fn job(&self, key: JobKey) -> Option<&Job> {
        self.jobs.get(&key)
    }
    pub fn jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values()
    }
    /// Up to `limit` live jobs matching `filter` with keys after `after`, in
    /// key order, of `tenants` (empty: every tenant). Walks the named
    /// tenants' keys in order, merged, and stops at `limit`: the work is the
    /// page and the jobs of those tenants the rest of the filter skips, never
    /// every live job.
    pub fn list_live(&self, filter: &JobFilter, tenants: &[String], after: JobKey, limit: usize) -> Vec<&Job> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        use std::ops::Bound::{Excluded, Unbounded};
        let named: Vec<&BTreeSet<JobKey>> = if !filter.tenant.is_empty() {
            let allowed = tenants.is_empty() || tenants.contains(&filter.tenant);
            self.by_tenant.get(&filter.tenant).filter(|_| allowed).into_iter().collect()
        } else if tenants.is_empty() {
            self.by_tenant.values().collect()
        } else {
            tenants.iter().filter_map(|t| self.by_tenant.get(t)).collect()
        };
        let mut walks: Vec<_> = named.iter().map(|keys| keys.range((Excluded(after), Unbounded))).collect();
        let mut next: BinaryHeap<Reverse<(JobKey, usize)>> =
            walks.iter_mut().enumerate().filter_map(|(i, walk)| Some(Reverse((*walk.next()?, i)))).collect();
        let mut page = Vec::new();
        while let Some(Reverse((key, i))) = next.pop() {
            if page.len() >= limit {
                break;
            }
            if let Some(job) = self.jobs.get(&key).filter(|job| filter.matches(job)) {
                page.push(job);
            }
            if let Some(key) = walks[i].next() {
                next.push(Reverse((*key, i)));
            }
        }
        page
    }
    /// Whether `key` was ever created here (it may be final and out of memory).
    pub fn was_created(&self, key: JobKey) -> bool {
        key.partition() == self.partition && key.counter() >= 1 && key.counter() < self.next_counter
    }
    /// When the next timer (a due job, an activation deadline, a session's
    /// lease or a schedule's tick) fires.
    pub fn next_timer(&self) -> Option<Millis> {
        let due = self.due.first().map(|(at, _)| *at);
        let deadline = self.deadlines.first().map(|(at, _)| *at);
        let session = self.session_expiry.first().map(|(at, _)| *at);
        let expiry = self.expiring.first().map(|(at, _)| *at);
        [due, deadline, session, expiry, self.next_tick(), self.limit_wake].into_iter().flatten().min()
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
            .map(|(k, q)| match self.limits.is_empty() {
                true => q.len(),
                // A limited queue offers only what its limit lets go now.
                false => self.limit_room(&k.tenant, job_type).map_or(q.len(), |room| q.len().min(room as usize)),
            })
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
