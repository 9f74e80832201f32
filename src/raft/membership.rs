//! A replica's group membership: who its voters and learners are, adding a
//! learner and waiting until it has caught up, and changing the voters
//! (openraft's joint consensus). The cluster plan's moves are made of these
//! (`node::membership`).

use std::time::Duration;

use openraft::{BasicNode, ServerState};

use super::{NodeId, Replica};

/// A group's members as one replica knows them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupMembers {
    pub voters: Vec<NodeId>,
    pub learners: Vec<NodeId>,
    /// A joint configuration: a change of voters under way.
    pub changing: bool,
}

impl Replica {
    /// The group's voters and learners, as this replica knows its
    /// membership (while a change is under way, the voters of both
    /// configurations), and whether a change is under way.
    pub fn membership(&self) -> GroupMembers {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        GroupMembers {
            voters: membership.voter_ids().collect(),
            learners: membership.learner_ids().collect(),
            changing: membership.get_joint_config().len() > 1,
        }
    }

    /// Adds `node` (reached at `addr`) to the group as a learner, and waits
    /// up to `limit` until it holds the log this leader had once it was
    /// added (copied as a snapshot when the log was purged). Only a leader
    /// may. A learner votes in nothing: until it is made a voter, adding it
    /// changes no majority.
    pub async fn add_learner(&self, node: NodeId, addr: &str, limit: Duration) -> Result<(), String> {
        let partition = self.partition;
        let added = self
            .raft
            .add_learner(node, BasicNode { addr: addr.to_string() }, false)
            .await
            .map_err(|e| format!("adding node {node} to partition {partition} as a learner: {e}"))?;
        // openraft's own wait gives up after a moment and says nothing:
        // wait here for the learner to hold every entry up to the one that
        // added it, and what the leader had then.
        let until = {
            let metrics = self.raft.metrics();
            let last = metrics.borrow().last_log_index.unwrap_or(0);
            last.max(added.log_id.index)
        };
        let mut metrics = self.raft.metrics();
        let caught_up = tokio::time::timeout(limit, async {
            loop {
                let matched = {
                    let m = metrics.borrow_and_update();
                    if m.state != ServerState::Leader {
                        return Err(format!("node {} no longer leads partition {partition}", self.node_id));
                    }
                    m.replication.as_ref().and_then(|r| r.get(&node).cloned().flatten()).map(|l| l.index)
                };
                if matched.is_some_and(|index| index >= until) {
                    return Ok(());
                }
                if metrics.changed().await.is_err() {
                    return Err(format!("partition {partition} stopped"));
                }
            }
        })
        .await;
        match caught_up {
            Ok(result) => result,
            Err(_) => Err(format!(
                "node {node} has not caught up with partition {partition} (entry {until}) within {limit:?}: tried again"
            )),
        }
    }

    /// Makes `voters` the group's voters (its learners first: see
    /// [`Replica::add_learner`]) through a joint configuration, and drops
    /// learners not among them; resolves once the new configuration is
    /// committed. A leader not among them leads until then, and steps down.
    pub async fn change_voters(&self, voters: std::collections::BTreeSet<NodeId>) -> Result<(), String> {
        let partition = self.partition;
        self.raft
            .change_membership(voters.clone(), false)
            .await
            .map_err(|e| format!("making {voters:?} the voters of partition {partition}: {e}"))?;
        let extra: std::collections::BTreeSet<NodeId> =
            self.membership().learners.into_iter().filter(|n| !voters.contains(n)).collect();
        if !extra.is_empty() {
            self.raft
                .change_membership(openraft::ChangeMembers::RemoveNodes(extra.clone()), false)
                .await
                .map_err(|e| format!("dropping learners {extra:?} of partition {partition}: {e}"))?;
        }
        Ok(())
    }
}
