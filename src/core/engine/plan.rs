//! The cluster plan as partition 0 keeps it: changed by operators'
//! [`Command::ChangePlan`] and partitions' leaders' [`Command::ReportVoters`],
//! each decided here at apply (see [`crate::core::plan`]); and what a
//! partition does when partitions are added: a new one adopts partition 0's
//! registrations, an old one answers for the idempotency keys it made jobs
//! for under an older partition count.

use super::{ApplyOutput, PartitionState};
use crate::core::plan::{ClusterPlan, PlanChange};
use crate::core::{
    Adoptable, CommandError, CommandResult, Deduped, ErrorKind, JobKey, Millis, NodeId, PartitionId, RequestId, Schema,
};

impl PartitionState {
    fn plan_here(&self) -> Result<(), CommandError> {
        if self.partition != 0 {
            return Err(CommandError {
                kind: ErrorKind::InvalidArgument,
                message: format!("the cluster plan is partition 0's, not partition {}'s", self.partition),
            });
        }
        Ok(())
    }

    pub(super) fn change_plan(
        &mut self,
        initial: &ClusterPlan,
        epoch: Option<u64>,
        change: &PlanChange,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        self.plan_here()?;
        let plan = self.plan.as_deref().unwrap_or(initial);
        if let Some(epoch) = epoch.filter(|e| *e != plan.epoch) {
            return Err(CommandError {
                kind: ErrorKind::FailedPrecondition,
                message: format!("the plan changed meanwhile: epoch {} now, not {epoch}; read it again", plan.epoch),
            });
        }
        let next = Box::new(plan.changed(change)?);
        self.plan = Some(next.clone());
        out.plan_changed = true;
        Ok(CommandResult::Plan(Some(next)))
    }

    pub(super) fn report_voters(
        &mut self,
        partition: PartitionId,
        voters: &[NodeId],
        out: &mut ApplyOutput,
    ) -> CommandResult {
        // Before any change a plan has no record: the member list's
        // placement is the voters, and there is nothing to report to.
        let Some(plan) = self.plan.as_deref().filter(|_| self.partition == 0) else { return CommandResult::Done };
        if let Some(next) = plan.reported(partition, voters) {
            self.plan = Some(Box::new(next));
            out.plan_changed = true;
        }
        CommandResult::Done
    }

    /// The cluster plan, once changed (partition 0 only).
    pub fn plan(&self) -> Option<&ClusterPlan> {
        self.plan.as_deref()
    }

    /// A probe for an idempotency key that now hashes to partition `to`
    /// ([`crate::core::Command::ProbeKey`]).
    pub(super) fn probe_key(
        &mut self,
        request: &RequestId,
        to: PartitionId,
        window: Millis,
        fingerprint: u64,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        if let Some(seen) = self.requests.find(request) {
            if seen.job.counter() == 0 {
                return Ok(CommandResult::Elsewhere(seen.job.partition()));
            }
            if seen.fingerprint != fingerprint {
                return Err(CommandError::precondition(format!(
                    "{request} was used for job {} with another type, variables or custom headers; an \
                     idempotency key names one job's content for its whole window",
                    seen.job
                )));
            }
            let state = self.jobs.get(&seen.job).map(|job| job.state);
            return Ok(CommandResult::Created { key: seen.job, created: false, state });
        }
        // Counter 0 names no job: the entry only says where the key went.
        let forwarded =
            Deduped { job: JobKey::new(to, 0), expires_at: self.clock.saturating_add(window.max(0)), fingerprint };
        self.remember_entry(request, forwarded, out);
        Ok(CommandResult::Elsewhere(to))
    }

    /// What a partition being added copies from this one.
    pub(super) fn adoptable(&self) -> Adoptable {
        let registry = self.registry();
        Adoptable {
            sessions: registry.sessions,
            owners: registry.owners,
            schemas: registry.schemas,
            paused: registry.paused,
            limits: registry.limits,
        }
    }

    /// A partition being added takes what every partition holds alike:
    /// sessions it does not know yet, the schemas, paused queues and limits.
    pub(super) fn adopt(&mut self, adopted: &Adoptable, out: &mut ApplyOutput) -> CommandResult {
        for session in &adopted.sessions {
            if !self.sessions.contains_key(&session.info.id) {
                self.session_expiry.insert((session.expires_at(), session.info.id));
                self.sessions.insert(session.info.id, session.clone());
                out.sessions_changed = true;
            }
        }
        for (id, owner) in &adopted.owners {
            self.session_owners.entry(*id).or_insert_with(|| owner.clone());
        }
        for (job_type, source) in &adopted.schemas {
            if let Ok(schema) = Schema::compile(source.clone()) {
                self.schemas.insert(job_type.clone(), schema);
                out.schemas_changed = true;
            }
        }
        // As a pause or limit sent here would be: jobs already here are
        // parked or counted.
        for (tenant, job_type, _) in &adopted.paused {
            self.set_paused(tenant, job_type, true, out);
        }
        for record in &adopted.limits {
            if !self.is_limited(&record.tenant, &record.job_type) {
                let limit = Some(record.limit.clone());
                if let Err(e) = self.set_limit(&record.tenant, &record.job_type, &limit, out) {
                    tracing::warn!(
                        tenant = record.tenant,
                        job_type = record.job_type,
                        "adopting a limit: {}",
                        e.message
                    );
                }
            }
        }
        CommandResult::Done
    }
}
