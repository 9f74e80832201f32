//! The cluster plan as partition 0 keeps it: changed by operators'
//! [`Command::ChangePlan`] and partitions' leaders' [`Command::ReportVoters`],
//! each decided here at apply (see [`crate::core::plan`]).

use super::{ApplyOutput, PartitionState};
use crate::core::plan::{ClusterPlan, PlanChange};
use crate::core::{CommandError, CommandResult, ErrorKind, NodeId, PartitionId};

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
}
