//! A replica's view of its group's leadership: whether it is cut off from a
//! quorum, how far behind the others are, whom to hand leadership to, and
//! moving leadership (a campaign for a chosen node, waiting for a new
//! leader).

use std::time::Duration;

use openraft::{BasicNode, RaftMetrics, ServerState};

use super::{NodeId, Replica};

impl Replica {
    /// Whether this replica leads but no majority has acknowledged it for
    /// longer than the followers wait before electing another leader: it is
    /// cut off (a minority side of a partition), and can commit nothing.
    /// openraft keeps such a leader leading until it hears of a newer term.
    pub fn cut_off(&self) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        Self::is_cut_off(&m, self.quorum_lost_after)
    }

    pub(super) fn is_cut_off(m: &openraft::RaftMetrics<NodeId, BasicNode>, quorum_lost_after: Duration) -> bool {
        m.state == ServerState::Leader
            && m.membership_config.membership().voter_ids().count() > 1
            && m.millis_since_quorum_ack.is_some_and(|ms| Duration::from_millis(ms) > quorum_lost_after)
    }

    /// How many entries the closest of `among` trails this leader's log by;
    /// `None` when this node does not lead or none of them has answered.
    pub fn lag_of(&self, among: &[NodeId]) -> Option<u64> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        if m.state != ServerState::Leader {
            return None;
        }
        let last = m.last_log_index?;
        m.replication
            .as_ref()?
            .iter()
            .filter(|(node, _)| among.contains(node))
            .filter_map(|(_, matched)| matched.as_ref().map(|l| last.saturating_sub(l.index)))
            .min()
    }

    /// A follower of this leader whose log holds everything this leader's
    /// does and that `up` takes for up, to hand leadership to: the first
    /// such of `among` in its order, or any when `among` is empty. `None`
    /// when this node does not lead or no such follower has caught up.
    pub fn handover_target(&self, among: &[NodeId], up: impl Fn(NodeId) -> bool) -> Option<NodeId> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        if m.state != ServerState::Leader {
            return None;
        }
        let last = m.last_log_index?;
        let replication = m.replication.as_ref()?;
        let caught_up = |node: NodeId| {
            node != self.node_id
                && up(node)
                && replication.get(&node).is_some_and(|m| m.is_some_and(|l| l.index >= last))
        };
        if among.is_empty() {
            replication.keys().copied().find(|n| caught_up(*n))
        } else {
            among.iter().copied().find(|n| caught_up(*n))
        }
    }

    /// Starts an election here at once, when asked by the leader this
    /// replica follows, in its term (see `Node::shutdown`). A caught-up
    /// candidate wins it with the old leader's vote, which it grants because
    /// its log holds nothing the candidate's does not.
    pub async fn campaign_for(&self, leader: NodeId, term: u64) -> Result<(), String> {
        let following = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            m.current_leader == Some(leader) && m.current_term == term && m.state == ServerState::Follower
        };
        if !following {
            return Err(format!(
                "node {} does not follow node {leader} in term {term} for partition {}",
                self.node_id, self.partition
            ));
        }
        if !self.may_vote() {
            return Err(format!("node {} is still catching up with partition {}", self.node_id, self.partition));
        }
        self.raft.trigger().elect().await.map_err(|e| e.to_string())
    }

    /// Waits up to `limit` for this replica to learn of a leader other than
    /// `known` (a new election's winner); answers whether it did.
    pub async fn new_leader(&self, known: Option<NodeId>, limit: Duration) -> bool {
        let mut metrics = self.raft.metrics();
        tokio::time::timeout(limit, async {
            loop {
                let leader = metrics.borrow_and_update().current_leader;
                if leader.is_some() && leader != known {
                    return true;
                }
                if metrics.changed().await.is_err() {
                    return false;
                }
            }
        })
        .await
        .unwrap_or(false)
    }

    /// Waits until another node leads (or this one no longer does), up to
    /// `limit`; answers whether leadership moved.
    pub async fn leadership_moved(&self, limit: Duration) -> bool {
        let mut metrics = self.raft.metrics();
        let moved = |m: &RaftMetrics<NodeId, BasicNode>| m.current_leader.is_some_and(|l| l != self.node_id);
        tokio::time::timeout(limit, async {
            loop {
                if moved(&metrics.borrow_and_update()) {
                    return true;
                }
                if metrics.changed().await.is_err() {
                    return false;
                }
            }
        })
        .await
        .unwrap_or(false)
    }
}
