//! The cluster plan: which nodes are members, which of them each partition's
//! replicas should be on (the target) and are on (as each partition's leader
//! last reported), and the changes an operator asked for. It is state of
//! partition 0, changed only by applying [`PlanChange`]s and reports, so every
//! replica of partition 0 holds the same plan and a plan survives the node
//! that started it (`docs/membership.md`).
//!
//! Pure: the target placement comes from [`crate::placement::rebalance`], the
//! same rules that place a new cluster's replicas.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{CommandError, ErrorKind, NodeId, PartitionId};
use crate::placement::{rebalance, Location};

/// The data version from which partition 0 keeps a cluster plan.
pub const PLANS: u16 = 15;

/// The data version from which a cluster adds partitions
/// ([`PlanChange::AddPartitions`], [`crate::core::Command::ProbeKey`],
/// [`crate::core::Command::Adopt`]).
pub const MORE_PARTITIONS: u16 = 16;

/// Replica moves in flight at once by default (partitions whose voters are
/// being changed).
pub const DEFAULT_MAX_MOVES: u32 = 2;

/// A member: where its peers reach it and where it is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub addr: String,
    pub region: String,
    pub zone: String,
}

impl Member {
    pub fn location(&self) -> Location {
        Location { region: self.region.clone(), zone: self.zone.clone() }
    }
}

/// The cluster's members and where each partition's replicas go.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterPlan {
    /// Raised by every change, reports included.
    pub epoch: u64,
    pub members: BTreeMap<NodeId, Member>,
    pub replication_factor: u32,
    /// Partition -> its voters, as its leader last reported them; empty for
    /// a partition being added whose group has not reported yet (forming).
    pub current: Vec<Vec<NodeId>>,
    /// Partition -> the voters it is being moved to.
    pub target: Vec<Vec<NodeId>>,
    /// Members being removed: they leave `members` once no partition holds
    /// or is to hold a replica on them.
    pub leaving: BTreeSet<NodeId>,
    /// Ids that were members: never members again, so that a node that
    /// forgot its votes never votes again under the id it voted with.
    pub retired: BTreeSet<NodeId>,
    /// No move starts while paused.
    pub paused: bool,
    /// At most this many partitions change voters at once.
    pub max_moves: u32,
}

/// What an operator asks of the plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PlanChange {
    AddNode {
        id: NodeId,
        member: Member,
    },
    RemoveNode {
        id: NodeId,
    },
    /// `new` takes `old`'s replicas (its zone, where it can), then `old` leaves.
    ReplaceNode {
        old: NodeId,
        new: NodeId,
        member: Member,
    },
    Pause,
    Resume,
    /// Moves not yet made are dropped: the target becomes the current
    /// voters, and members leaving stay.
    Cancel,
    SetMaxMoves(u32),
    /// Raises the partition count to `to`: the new partitions' groups form
    /// on the nodes the placement rules pick, and the count routes new work
    /// once every one of them has reported its voters. Data version 16
    /// ([`MORE_PARTITIONS`]).
    AddPartitions {
        to: u32,
    },
}

fn refused(kind: ErrorKind, message: String) -> CommandError {
    CommandError { kind, message }
}

impl ClusterPlan {
    /// The plan a cluster starts with: its member list and placement.
    pub fn initial(members: BTreeMap<NodeId, Member>, placement: Vec<Vec<NodeId>>, replication_factor: u32) -> Self {
        ClusterPlan {
            epoch: 0,
            members,
            replication_factor,
            current: placement.clone(),
            target: placement,
            leaving: BTreeSet::new(),
            retired: BTreeSet::new(),
            paused: false,
            max_moves: DEFAULT_MAX_MOVES,
        }
    }

    /// Every partition the plan names, those still forming included.
    pub fn partitions(&self) -> u32 {
        self.target.len() as u32
    }

    /// Whether `partition` is being added and its group has not reported
    /// its voters yet.
    pub fn forming(&self, partition: PartitionId) -> bool {
        self.current.get(partition as usize).is_some_and(Vec::is_empty)
    }

    /// The partitions new work is routed over: all of them once the
    /// partitions being added have formed; until then the count before.
    /// Partitions are added only while none is forming, so the forming ones
    /// are the last, and they form together ([`ClusterPlan::reported`]).
    pub fn partitions_in_force(&self) -> u32 {
        self.current.iter().position(Vec::is_empty).unwrap_or(self.current.len()) as u32
    }

    /// The nodes that hold or are to hold a replica of `partition`.
    pub fn hosts(&self, partition: PartitionId) -> Vec<NodeId> {
        let mut hosts = self.target.get(partition as usize).cloned().unwrap_or_default();
        for node in self.current.get(partition as usize).into_iter().flatten() {
            if !hosts.contains(node) {
                hosts.push(*node);
            }
        }
        hosts
    }

    /// `partition`'s voters that its target keeps, in the target's order.
    pub fn staying(&self, partition: PartitionId) -> Vec<NodeId> {
        let current = self.current.get(partition as usize).cloned().unwrap_or_default();
        let target = self.target.get(partition as usize).into_iter().flatten();
        target.copied().filter(|n| current.contains(n)).collect()
    }

    /// Every partition's hosts ([`ClusterPlan::hosts`]).
    pub fn placement(&self) -> Vec<Vec<NodeId>> {
        (0..self.partitions()).map(|p| self.hosts(p)).collect()
    }

    /// Whether `partition`'s voters are not yet its target.
    pub fn moving(&self, partition: PartitionId) -> bool {
        let p = partition as usize;
        let sorted = |v: Option<&Vec<NodeId>>| v.map(|v| v.iter().copied().collect::<BTreeSet<_>>());
        sorted(self.current.get(p)) != sorted(self.target.get(p))
    }

    /// Whether `partition`'s leader may change its voters now: the plan is
    /// not paused and the partition is among the first `max_moves` that move.
    pub fn may_move(&self, partition: PartitionId) -> bool {
        !self.paused
            && (0..self.partitions())
                .filter(|p| self.moving(*p) && !self.forming(*p))
                .take(self.max_moves.max(1) as usize)
                .any(|p| p == partition)
    }

    /// Replica moves still to make.
    pub fn pending(&self) -> Vec<rebalance::Move> {
        rebalance::moves(&self.current, &self.target)
    }

    fn locations(&self, without: &BTreeSet<NodeId>) -> BTreeMap<NodeId, Location> {
        self.members.iter().filter(|(n, _)| !without.contains(n)).map(|(n, m)| (*n, m.location())).collect()
    }

    fn retarget(&mut self, from: Vec<Vec<NodeId>>) {
        let staying = self.locations(&self.leaving);
        self.target = rebalance::target(&from, &staying, self.replication_factor);
    }

    fn check_new(&self, id: NodeId, member: &Member) -> Result<(), CommandError> {
        if self.members.contains_key(&id) {
            return Err(refused(ErrorKind::FailedPrecondition, format!("node {id} is a member already")));
        }
        if self.retired.contains(&id) {
            return Err(refused(
                ErrorKind::FailedPrecondition,
                format!("node id {id} belonged to a node that left the cluster; ids are never reused: give the new node an id never used"),
            ));
        }
        if member.addr.is_empty() {
            return Err(refused(ErrorKind::InvalidArgument, format!("node {id} needs an address (ID=HOST:PORT)")));
        }
        if let Some((other, _)) = self.members.iter().find(|(_, m)| m.addr == member.addr) {
            return Err(refused(
                ErrorKind::FailedPrecondition,
                format!("address {} is node {other}'s already", member.addr),
            ));
        }
        Ok(())
    }

    fn check_staying(&self, id: NodeId) -> Result<(), CommandError> {
        if !self.members.contains_key(&id) {
            return Err(refused(ErrorKind::NotFound, format!("node {id} is not a member")));
        }
        if self.leaving.contains(&id) {
            return Err(refused(ErrorKind::FailedPrecondition, format!("node {id} is leaving already")));
        }
        Ok(())
    }

    /// The plan after `change`, or why it is refused; raises the epoch.
    pub fn changed(&self, change: &PlanChange) -> Result<ClusterPlan, CommandError> {
        let mut next = self.clone();
        match change {
            PlanChange::AddNode { id, member } => {
                self.check_new(*id, member)?;
                next.members.insert(*id, member.clone());
                next.retarget(self.target.clone());
            }
            PlanChange::RemoveNode { id } => {
                self.check_staying(*id)?;
                let staying = self.members.len() - self.leaving.len() - 1;
                if staying < self.replication_factor as usize {
                    return Err(refused(
                        ErrorKind::FailedPrecondition,
                        format!(
                            "removing node {id} would leave {staying} members for a replication factor of {}: add a \
                             node first, or replace this one (drover cluster replace-node)",
                            self.replication_factor
                        ),
                    ));
                }
                next.leaving.insert(*id);
                next.retarget(self.target.clone());
            }
            PlanChange::ReplaceNode { old, new, member } => {
                self.check_staying(*old)?;
                self.check_new(*new, member)?;
                next.members.insert(*new, member.clone());
                next.leaving.insert(*old);
                // The new node takes the old one's place in each partition
                // first; the rules then even out what that leaves uneven.
                let swapped = self
                    .target
                    .iter()
                    .map(|nodes| nodes.iter().map(|n| if n == old { *new } else { *n }).collect())
                    .collect();
                next.retarget(swapped);
            }
            PlanChange::Pause => next.paused = true,
            PlanChange::Resume => next.paused = false,
            PlanChange::Cancel => {
                next.target = self.current.clone();
                next.leaving.clear();
            }
            PlanChange::SetMaxMoves(moves) => {
                if *moves == 0 {
                    return Err(refused(ErrorKind::InvalidArgument, "at least one move at a time".into()));
                }
                next.max_moves = *moves;
            }
            PlanChange::AddPartitions { to } => self.add_partitions(*to, &mut next)?,
        }
        next.retire_departed();
        next.epoch += 1;
        Ok(next)
    }

    fn add_partitions(&self, to: u32, next: &mut ClusterPlan) -> Result<(), CommandError> {
        let now = self.partitions();
        if let Some(forming) = (0..now).find(|p| self.forming(*p)) {
            return Err(refused(
                ErrorKind::FailedPrecondition,
                format!("partition {forming} is still being added: wait until it has formed (drover cluster plan)"),
            ));
        }
        if to <= now {
            return Err(refused(
                ErrorKind::FailedPrecondition,
                format!("the cluster has {now} partitions already; partitions are only ever added, never removed"),
            ));
        }
        if to > crate::core::MAX_PARTITIONS {
            return Err(refused(
                ErrorKind::InvalidArgument,
                format!("at most {} partitions", crate::core::MAX_PARTITIONS),
            ));
        }
        // The rules place the new partitions as they would a new cluster's,
        // counting the replicas already held; the partitions there stay put.
        let mut from = self.target.clone();
        from.resize(to as usize, Vec::new());
        let placed = rebalance::target(&from, &self.locations(&self.leaving), self.replication_factor);
        next.target.extend(placed.into_iter().skip(now as usize));
        next.current.resize(to as usize, Vec::new());
        Ok(())
    }

    /// Records `partition`'s voters as its leader reports them; `None` when
    /// the plan knew them already. A report for a partition being added
    /// says they all formed (its leader saw each of them commit): each of
    /// them has its target as its voters, so that the count routing new
    /// work goes up once, not a partition at a time.
    pub fn reported(&self, partition: PartitionId, voters: &[NodeId]) -> Option<ClusterPlan> {
        let p = partition as usize;
        let mut voters = voters.to_vec();
        voters.sort_unstable();
        let known = self.current.get(p).map(|v| {
            let mut v = v.clone();
            v.sort_unstable();
            v
        });
        if p >= self.current.len() || known.as_ref() == Some(&voters) || voters.is_empty() {
            return None;
        }
        let mut next = self.clone();
        // Kept in the target's order where the target has them (the first
        // is the preferred leader).
        let target = &self.target[p];
        let mut ordered: Vec<NodeId> = target.iter().copied().filter(|n| voters.contains(n)).collect();
        ordered.extend(voters.iter().copied().filter(|n| !target.contains(n)));
        if self.forming(partition) {
            for q in (0..self.partitions()).filter(|q| self.forming(*q)) {
                next.current[q as usize] = self.target[q as usize].clone();
            }
        }
        next.current[p] = ordered;
        next.retire_departed();
        next.epoch += 1;
        Some(next)
    }

    /// Members leaving that hold and are to hold no replica leave.
    fn retire_departed(&mut self) {
        let held: BTreeSet<NodeId> = self.current.iter().chain(&self.target).flatten().copied().collect();
        let gone: Vec<NodeId> = self.leaving.iter().copied().filter(|n| !held.contains(n)).collect();
        for node in gone {
            self.leaving.remove(&node);
            self.members.remove(&node);
            self.retired.insert(node);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(port: u16, zone: &str) -> Member {
        Member { addr: format!("127.0.0.1:{port}"), region: "r".into(), zone: zone.into() }
    }

    fn three() -> ClusterPlan {
        let members = (0..3).map(|n| (n, member(9000 + n as u16, &format!("z{n}")))).collect();
        ClusterPlan::initial(members, vec![vec![0, 1, 2]; 3], 3)
    }

    fn settle(plan: &mut ClusterPlan) {
        for p in 0..plan.partitions() {
            let target = plan.target[p as usize].clone();
            if let Some(next) = plan.reported(p, &target) {
                *plan = next;
            }
        }
    }

    #[test]
    fn an_added_node_takes_a_share_and_zones_stay_distinct() {
        let plan = three().changed(&PlanChange::AddNode { id: 3, member: member(9003, "z3") }).unwrap();
        assert_eq!(plan.epoch, 1);
        let load = rebalance::load(&plan.target, &plan.locations(&BTreeSet::new()));
        assert!(load[&3] >= 2, "the new node takes replicas: {load:?}");
        for nodes in &plan.target {
            let zones: BTreeSet<_> = nodes.iter().map(|n| &plan.members[n].zone).collect();
            assert_eq!(zones.len(), 3, "distinct zones: {nodes:?}");
        }
        assert!(plan.pending().iter().all(|m| m.to == 3));
        assert_eq!((0..3).filter(|p| plan.may_move(*p)).count(), DEFAULT_MAX_MOVES as usize);
    }

    #[test]
    fn a_removed_node_leaves_once_it_holds_nothing_and_its_id_is_never_reused() {
        let mut plan = three().changed(&PlanChange::AddNode { id: 3, member: member(9003, "z3") }).unwrap();
        settle(&mut plan);
        let mut plan = plan.changed(&PlanChange::RemoveNode { id: 0 }).unwrap();
        assert!(plan.members.contains_key(&0), "still a member while it holds replicas");
        assert!(plan.target.iter().all(|nodes| !nodes.contains(&0)));
        settle(&mut plan);
        assert!(!plan.members.contains_key(&0) && plan.retired.contains(&0));
        let again = plan.changed(&PlanChange::AddNode { id: 0, member: member(9100, "z0") });
        assert_eq!(again.unwrap_err().kind, ErrorKind::FailedPrecondition);
        let too_few = plan.changed(&PlanChange::RemoveNode { id: 1 });
        assert!(too_few.unwrap_err().message.contains("replication factor of 3"));
    }

    #[test]
    fn a_replaced_node_is_swapped_in_place_and_a_cancel_keeps_the_current_voters() {
        let plan = three().changed(&PlanChange::ReplaceNode { old: 2, new: 7, member: member(9007, "z2") }).unwrap();
        assert!(plan.target.iter().all(|nodes| nodes.contains(&7) && !nodes.contains(&2)));
        assert_eq!(plan.pending().len(), 3);
        assert!(plan.hosts(0).contains(&2) && plan.hosts(0).contains(&7), "hosts: the target and the current");
        let paused = plan.changed(&PlanChange::Pause).unwrap();
        assert!(!paused.may_move(0));
        let cancelled = paused.changed(&PlanChange::Cancel).unwrap();
        assert!(cancelled.pending().is_empty() && cancelled.leaving.is_empty());
        assert!(cancelled.members.contains_key(&7), "an added member stays, holding nothing");
    }

    #[test]
    fn added_partitions_form_where_the_rules_place_them_and_count_once_all_have_reported() {
        let mut plan = three().changed(&PlanChange::AddNode { id: 3, member: member(9003, "z3") }).unwrap();
        settle(&mut plan);
        let grown = plan.changed(&PlanChange::AddPartitions { to: 6 }).unwrap();
        assert_eq!(grown.target[..3], plan.target[..], "the partitions there stay put");
        assert_eq!((grown.partitions(), grown.partitions_in_force()), (6, 3));
        assert!((3..6).all(|p| grown.forming(p) && grown.target[p as usize].len() == 3));
        let load = rebalance::load(&grown.target, &grown.locations(&BTreeSet::new()));
        assert!(load.values().all(|n| (4..=5).contains(n)), "even: {load:?}");
        assert!(!grown.may_move(3), "a forming partition is not a move");
        let again = grown.changed(&PlanChange::AddPartitions { to: 8 }).unwrap_err();
        assert!(again.message.contains("still being added"), "{}", again.message);
        let formed = grown.reported(3, &grown.target[3].clone()).unwrap();
        assert_eq!(formed.partitions_in_force(), 6, "one report: they all formed");
        assert_eq!(formed.current[3..], grown.target[3..]);
        assert!(formed.pending().is_empty());
        let same = formed.changed(&PlanChange::AddPartitions { to: 6 }).unwrap_err();
        assert!(same.message.contains("never removed"), "{}", same.message);
    }

    #[test]
    fn a_report_of_the_voters_known_changes_nothing() {
        let plan = three();
        assert_eq!(plan.reported(0, &[2, 1, 0]), None);
        assert_eq!(plan.reported(9, &[0]), None, "no such partition");
        let moved = plan.reported(0, &[0, 1]).unwrap();
        assert_eq!((moved.epoch, moved.current[0].clone()), (1, vec![0, 1]));
    }
}
