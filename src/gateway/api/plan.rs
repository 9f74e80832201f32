//! The job API's cluster plan (`docs/membership.md`): reading it, and the
//! changes an operator asks for (add, remove or replace a node; pause,
//! resume or cancel the moves). A change is decided on partition 0 at apply,
//! where the plan is state; each partition's leader then carries it out
//! (`crate::node`'s plan follower).

use super::ApiError;
use super::Call;
use super::JobApi;
use crate::auth::{CLUSTER_ADMIN, CLUSTER_READ};
use crate::core::{ClusterPlan, Command, CommandResult, Member, PlanChange, PLANS};
use crate::leaders::submit_as;
use crate::placement::Location;
use crate::proto::gateway as pb;
use pb::change_cluster_plan_request::Change;

impl JobApi {
    pub async fn get_cluster_plan(&self, call: &Call) -> Result<pb::ClusterPlan, ApiError> {
        call.principal.require(CLUSTER_READ)?;
        // Before data version 15 no plan can have changed.
        if self.ctx.transport.peers.versions().cluster_version() >= PLANS {
            let results = submit_as(&self.ctx, Some(&call.principal), 0, vec![Command::GetPlan], call.deadline).await?;
            match results.into_iter().next() {
                Some(CommandResult::Plan(Some(plan))) => return Ok(self.to_proto(&plan, true)),
                Some(CommandResult::Plan(None)) => {}
                Some(CommandResult::Rejected(error)) => return Err(error.into()),
                other => return Err(ApiError::Internal(format!("unexpected answer to a plan read: {other:?}"))),
            }
        }
        let formed = self.starting_plan()?;
        Ok(self.to_proto(&formed, formed.epoch > 0))
    }

    pub async fn change_cluster_plan(
        &self,
        call: &Call,
        request: pb::ChangeClusterPlanRequest,
    ) -> Result<pb::ClusterPlan, ApiError> {
        call.principal.require(CLUSTER_ADMIN)?;
        call.principal.require_tenant("*")?;
        let change = change_from(request)?;
        let initial = Box::new(self.starting_plan()?);
        crate::auth::audit(
            &call.principal,
            "change_cluster_plan",
            serde_json::json!({ "change": format!("{change:?}") }),
        );
        let command = Command::ChangePlan { initial, epoch: None, change };
        let results = submit_as(&self.ctx, Some(&call.principal), 0, vec![command], call.deadline).await?;
        match results.into_iter().next() {
            Some(CommandResult::Plan(Some(plan))) => {
                tracing::info!(epoch = plan.epoch, moves = plan.pending().len(), "cluster plan changed");
                Ok(self.to_proto(&plan, true))
            }
            Some(CommandResult::Rejected(error)) => Err(error.into()),
            other => Err(ApiError::Internal(format!("unexpected answer to a plan change: {other:?}"))),
        }
    }

    /// The plan as the API shows it; `changed`: partition 0 holds it.
    pub fn to_proto(&self, plan: &ClusterPlan, changed: bool) -> pb::ClusterPlan {
        to_proto(plan, changed, self.ctx.topology.formed_partitions)
    }

    /// The plan a first change starts from: the one this node follows, or
    /// the member list's the cluster formed with (partition 0 holds none
    /// until the first change, and then ignores this).
    fn starting_plan(&self) -> Result<ClusterPlan, ApiError> {
        self.ctx.topology.shown_plan().map(|(plan, _)| plan).ok_or_else(|| {
            ApiError::FailedPrecondition(
                "this node was started with --join-plan and follows no plan yet: ask a member of the cluster".into(),
            )
        })
    }
}

fn member_from(node: Option<pb::PlanNode>) -> Result<(u64, Member), ApiError> {
    let node = node.ok_or_else(|| ApiError::InvalidArgument("the new node is missing".into()))?;
    let address = node.address.trim();
    let valid = address.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !valid {
        return Err(ApiError::InvalidArgument(format!(
            "node {}'s address {address:?} is not HOST:PORT (its cluster address, --cluster-addr)",
            node.node_id
        )));
    }
    if !node.region.is_empty() || !node.zone.is_empty() {
        let text = if node.zone.is_empty() { node.region.clone() } else { format!("{}/{}", node.region, node.zone) };
        Location::parse(&text).map_err(|e| ApiError::InvalidArgument(format!("{e:#}")))?;
    }
    Ok((node.node_id, Member { addr: address.to_string(), region: node.region, zone: node.zone }))
}

fn change_from(request: pb::ChangeClusterPlanRequest) -> Result<PlanChange, ApiError> {
    Ok(match request.change {
        None => {
            return Err(ApiError::InvalidArgument(
                "name a change: add_node, remove_node, replace_node, pause, cancel, max_moves or add_partitions_to"
                    .into(),
            ))
        }
        Some(Change::AddNode(node)) => {
            let (id, member) = member_from(Some(node))?;
            PlanChange::AddNode { id, member }
        }
        Some(Change::RemoveNode(id)) => PlanChange::RemoveNode { id },
        Some(Change::ReplaceNode(replace)) => {
            let (new, member) = member_from(replace.new_node)?;
            PlanChange::ReplaceNode { old: replace.old_node_id, new, member }
        }
        Some(Change::Pause(true)) => PlanChange::Pause,
        Some(Change::Pause(false)) => PlanChange::Resume,
        Some(Change::Cancel(_)) => PlanChange::Cancel,
        Some(Change::MaxMoves(moves)) => PlanChange::SetMaxMoves(moves),
        Some(Change::AddPartitionsTo(to)) => PlanChange::AddPartitions { to },
    })
}

/// The plan as the API shows it; `changed`: partition 0 holds it (not the
/// member list's); `formed_partitions`: the count the cluster formed with.
pub fn to_proto(plan: &ClusterPlan, changed: bool, formed_partitions: u32) -> pb::ClusterPlan {
    let count = |placement: &[Vec<u64>], node: u64| placement.iter().filter(|nodes| nodes.contains(&node)).count();
    pb::ClusterPlan {
        epoch: plan.epoch,
        members: plan
            .members
            .iter()
            .map(|(id, m)| pb::PlanMember {
                node: Some(pb::PlanNode {
                    node_id: *id,
                    address: m.addr.clone(),
                    region: m.region.clone(),
                    zone: m.zone.clone(),
                }),
                leaving: plan.leaving.contains(id),
                replicas: count(&plan.current, *id) as u32,
                target_replicas: count(&plan.target, *id) as u32,
            })
            .collect(),
        partitions: (0..plan.partitions())
            .map(|p| pb::PlanPartition {
                partition_id: p,
                current: plan.current[p as usize].clone(),
                target: plan.target[p as usize].clone(),
                moving: plan.moving(p) && !plan.forming(p),
                forming: plan.forming(p),
            })
            .collect(),
        paused: plan.paused,
        max_moves: plan.max_moves,
        retired: plan.retired.iter().copied().collect(),
        replication_factor: plan.replication_factor,
        changed,
        partitions_in_force: plan.partitions_in_force(),
        formed_partitions,
    }
}
