//! How a partition's group comes to exist on this node, and never twice.
//!
//! openraft forms a group when `initialize` writes the first membership entry.
//! A node may do that only on the cluster's first start. Whether this is the
//! first start is kept in the data directory's record (`cluster.json`,
//! [`crate::node`]), outside the database, because it must survive exactly
//! what it exists to detect: a database that lost its Raft state. A group
//! formed a second time from nothing would look healthy and would have
//! forgotten this node's vote and log.
//!
//! A node whose data directory was wiped cannot tell a new cluster from a lost
//! one, so the operator says which: `drover serve --join-existing` on an empty
//! data directory joins the groups without forming them. Their leaders copy
//! the log or a snapshot to it. Until a joining replica has applied what the
//! first leader it heard from had committed, it refuses every vote request.
//! Otherwise its vote, given with an empty log, could elect a candidate that
//! lacks entries this node helped commit before it lost them. The guard
//! cannot bring back the vote the node forgot: if a leader it voted for is cut
//! off while another leader of an older term still reaches it, the two can
//! both commit. docs/operations.md ("Re-seeding a node") says when re-seeding
//! is safe.

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// What this start may do to bring a partition's group into being here.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Formation {
    /// A data directory that has not yet formed its groups: a group with no
    /// Raft state here is formed from the member list (the cluster's first
    /// start).
    #[default]
    New,
    /// A data directory started with `--join-existing` that has not caught
    /// up yet: groups are never formed here; each is copied from its leader,
    /// and a replica grants no votes until it has caught up.
    Joining,
    /// This data directory formed or joined every group it hosts: their Raft
    /// state must be here, and a group without it is an error, never formed
    /// again.
    Formed,
}

/// How far a joining replica must apply before it may vote: the commit index
/// of the first leader that reached it. Indexes are counts here (index + 1),
/// so 0 is "nothing committed".
pub(super) struct CatchUp {
    target: watch::Sender<Option<u64>>,
}

impl CatchUp {
    pub(super) fn new() -> CatchUp {
        CatchUp { target: watch::channel(None).0 }
    }

    /// Notes the commit index a leader sent; only the first one counts.
    pub(super) fn heard_from_leader(&self, leader_committed: u64) {
        self.target.send_if_modified(|target| {
            let first = target.is_none();
            if first {
                *target = Some(leader_committed);
            }
            first
        });
    }

    /// Whether a replica that applied `applied` entries has caught up. Once
    /// true it stays true: the target never moves and `applied` only grows.
    pub(super) fn caught_up(&self, applied: u64) -> bool {
        self.target.borrow().is_some_and(|target| applied >= target)
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<Option<u64>> {
        self.target.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_joining_replica_votes_only_after_applying_what_the_first_leader_had_committed() {
        let catch_up = CatchUp::new();
        assert!(!catch_up.caught_up(0), "no leader heard yet: no vote, even with nothing to catch up");
        assert!(!catch_up.caught_up(100));
        catch_up.heard_from_leader(40);
        catch_up.heard_from_leader(90); // later leaders do not move the target
        assert!(!catch_up.caught_up(39));
        assert!(catch_up.caught_up(40));
    }

    #[test]
    fn the_formation_is_stored_by_name() {
        assert_eq!(serde_json::to_string(&Formation::Joining).unwrap(), r#""joining""#);
        assert_eq!(serde_json::from_str::<Formation>(r#""formed""#).unwrap(), Formation::Formed);
    }
}
