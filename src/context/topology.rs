//! The cluster's shape as this node knows it: the member list's at start,
//! then the cluster plan's.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};

use crate::config::NodeConfig;
use crate::core::{ClusterPlan, Member, PartitionId};
use crate::placement::Location;
use crate::raft::NodeId;

/// Who the members are, where they are, which of them hold each partition,
/// and how many partitions there are. The replication factor and this
/// node's own place never change while the node runs; the members,
/// placement and partition count change with the cluster plan
/// ([`Topology::follow_plan`]).
pub struct Topology {
    pub node_id: NodeId,
    /// The partition count the cluster formed with: ordering keys, limited
    /// queues, schedules and workflows hash over it for good, so they keep
    /// their partition when partitions are added.
    pub formed_partitions: u32,
    pub replication_factor: u32,
    shape: RwLock<Shape>,
    /// Each partition count this node has seen routing new work, with when
    /// (ms since the epoch, this node's clock) it first did; the first is
    /// the count formed with, seen at 0.
    counts: RwLock<Vec<(u32, i64)>>,
    /// [`Topology::partition_count`], kept apart from the shape's lock for
    /// the create path.
    in_force: AtomicU32,
    /// This node's region and zone.
    pub location: Location,
    /// Regions partitions prefer their leaders in (empty: any).
    pub leader_regions: Vec<String>,
    balance_leaders: bool,
    /// The plan the cluster formed with (its member list and placement): the
    /// plan's first change starts from it. `None` on a node being added,
    /// whose member list is only where it looks for the cluster.
    pub formed_with: Option<ClusterPlan>,
    /// This node's client gRPC address.
    pub grpc_addr: SocketAddr,
    /// This node's admin HTTP address.
    pub admin_addr: SocketAddr,
}

/// The part of the topology the cluster plan changes.
#[derive(Clone, Default)]
struct Shape {
    /// Node id -> node-to-node address.
    members: BTreeMap<NodeId, String>,
    /// Node id -> region and zone (empty when the member list names none).
    locations: BTreeMap<NodeId, Location>,
    /// Partition -> the nodes holding its replicas or about to
    /// ([`crate::placement`], then the plan's).
    placement: Vec<Vec<NodeId>>,
    /// Partition -> the node its leadership moves to when `balance_leaders`
    /// ([`crate::placement::preferred_leaders`]).
    preferred_leaders: Vec<NodeId>,
    /// The plan this shape follows (`None`: the member list's).
    plan: Option<Arc<ClusterPlan>>,
}

impl Topology {
    pub fn new(
        config: &NodeConfig,
        members: BTreeMap<NodeId, String>,
        placement: Vec<Vec<NodeId>>,
        (grpc_addr, admin_addr): (SocketAddr, SocketAddr),
    ) -> Self {
        let locations: BTreeMap<NodeId, Location> =
            members.keys().map(|n| (*n, config.locations.get(n).cloned().unwrap_or_default())).collect();
        let formed_with = (!config.join_plan).then(|| {
            let members = members
                .iter()
                .map(|(n, addr)| {
                    let at = &locations[n];
                    (*n, Member { addr: addr.clone(), region: at.region.clone(), zone: at.zone.clone() })
                })
                .collect();
            ClusterPlan::initial(members, placement.clone(), config.replication_factor)
        });
        let topology = Topology {
            formed_with,
            node_id: config.node_id,
            formed_partitions: config.partitions,
            replication_factor: config.replication_factor,
            shape: RwLock::new(Shape::default()),
            counts: RwLock::new(vec![(config.partitions, 0)]),
            in_force: AtomicU32::new(config.partitions),
            balance_leaders: config.balance_leaders,
            location: config.location.clone(),
            leader_regions: config.leader_regions.clone(),
            grpc_addr,
            admin_addr,
        };
        topology.set_shape(members, locations, placement, None);
        topology
    }

    fn set_shape(
        &self,
        members: BTreeMap<NodeId, String>,
        locations: BTreeMap<NodeId, Location>,
        placement: Vec<Vec<NodeId>>,
        plan: Option<Arc<ClusterPlan>>,
    ) {
        let preferred_leaders = crate::placement::preferred_leaders(&placement, |n| {
            let region = locations.get(&n).map_or("", |l| l.region.as_str());
            self.leader_regions.is_empty() || self.leader_regions.iter().any(|r| r == region)
        });
        let in_force = plan.as_ref().map_or(self.formed_partitions, |plan| plan.partitions_in_force());
        *self.shape.write().expect("topology lock") = Shape { members, locations, placement, preferred_leaders, plan };
        // Noted before it routes: a key is never routed by a count without
        // being looked for under the counts before it.
        self.note_counts(Vec::new(), in_force, crate::auth::now_ms() as i64);
        self.in_force.store(in_force, Ordering::Release);
    }

    fn shape(&self) -> std::sync::RwLockReadGuard<'_, Shape> {
        self.shape.read().expect("topology lock")
    }

    /// Takes the members and placement of `plan`, when it is newer than what
    /// this topology follows; answers whether it was.
    pub fn follow_plan(&self, plan: &ClusterPlan) -> bool {
        if self.plan().is_some_and(|known| plan.epoch <= known.epoch) {
            return false;
        }
        let members = plan.members.iter().map(|(n, m)| (*n, m.addr.clone())).collect();
        let locations = plan.members.iter().map(|(n, m)| (*n, m.location())).collect();
        self.set_shape(members, locations, plan.placement(), Some(Arc::new(plan.clone())));
        true
    }

    /// The plan to show: the one followed (`true`), or before the plan's
    /// first change the one the cluster formed with (`false`); `None` on a
    /// node being added that follows none yet.
    pub fn shown_plan(&self) -> Option<(ClusterPlan, bool)> {
        match self.plan() {
            Some(plan) => Some(((*plan).clone(), true)),
            None => self.formed_with.clone().map(|plan| (plan, false)),
        }
    }

    /// The cluster plan this topology follows (`None`: the member list's,
    /// never changed).
    pub fn plan(&self) -> Option<Arc<ClusterPlan>> {
        self.shape().plan.clone()
    }

    /// Node id -> node-to-node address of every member.
    pub fn members(&self) -> BTreeMap<NodeId, String> {
        self.shape().members.clone()
    }

    /// Node id -> region and zone of every member.
    pub fn locations(&self) -> BTreeMap<NodeId, Location> {
        self.shape().locations.clone()
    }

    /// The members other than this node.
    pub fn peers(&self) -> Vec<NodeId> {
        self.shape().members.keys().copied().filter(|n| *n != self.node_id).collect()
    }

    /// Partition -> the nodes holding its replicas (or about to).
    pub fn placement(&self) -> Vec<Vec<NodeId>> {
        self.shape().placement.clone()
    }

    /// The partitions new work is routed over (`0..count`): the count the
    /// cluster formed with until partitions are added, then the plan's count
    /// in force ([`ClusterPlan::partitions_in_force`]).
    pub fn partition_count(&self) -> u32 {
        self.in_force.load(Ordering::Acquire)
    }

    /// Takes the partition counts seen before a restart (as recorded).
    pub fn recall_counts(&self, recorded: Vec<(u32, i64)>) {
        self.note_counts(recorded, self.partition_count(), crate::auth::now_ms() as i64);
    }

    fn note_counts(&self, recorded: Vec<(u32, i64)>, in_force: u32, now_ms: i64) {
        let mut counts = self.counts.write().expect("counts lock");
        for (count, since) in recorded.into_iter().chain([(in_force, now_ms)]) {
            match counts.iter_mut().find(|(c, _)| *c == count) {
                // The earliest sighting wins: a count seen late is looked
                // under longer, never shorter.
                Some((_, seen)) => *seen = (*seen).min(since),
                None => counts.push((count, since)),
            }
        }
        counts.sort_unstable();
    }

    /// The partition counts this node has seen route new work, each with
    /// when it first did (what the data directory records).
    pub fn counts(&self) -> Vec<(u32, i64)> {
        self.counts.read().expect("counts lock").clone()
    }

    /// The partition counts an idempotency key is looked for under at
    /// `now_ms`, newest first: the count in force, then each older count
    /// that routed new work within `window` (a key made under it may still
    /// be remembered where it hashed then).
    pub fn key_counts(&self, now_ms: i64, window: i64) -> Vec<u32> {
        let in_force = self.partition_count();
        let counts = self.counts.read().expect("counts lock");
        let mut keys = vec![in_force];
        // A count routed until its successor was first seen here.
        for pair in counts.windows(2).rev() {
            let ((older, _), (_, succeeded_at)) = (pair[0], pair[1]);
            if older < in_force && now_ms.saturating_sub(succeeded_at) <= window {
                keys.push(older);
            }
        }
        keys
    }

    pub fn cluster_size(&self) -> u32 {
        self.shape().members.len() as u32
    }

    pub fn replica_nodes(&self, partition: PartitionId) -> Vec<NodeId> {
        self.shape().placement.get(partition as usize).cloned().unwrap_or_default()
    }

    /// The replicas leadership of `partition` should move to from this node,
    /// if this node leads it, best first: with `--balance-leaders`, the
    /// partition's preferred leader unless that is this node; then (and
    /// without balance, only) its replicas in a leader region when this node
    /// is in none, so that a leader outside them still moves in when the
    /// preferred one is down. Empty: it stays here. Before all that, a
    /// replica the cluster plan moves away hands leadership to the replicas
    /// that stay, so the partition is never without a leader for the move.
    pub fn preferred_leaders_of(&self, partition: PartitionId) -> Vec<NodeId> {
        if let Some(plan) = self.plan() {
            let staying = plan.staying(partition);
            if !staying.contains(&self.node_id) && plan.hosts(partition).contains(&self.node_id) {
                return staying;
            }
        }
        let mut preferred = Vec::new();
        if self.balance_leaders {
            match self.shape().preferred_leaders.get(partition as usize) {
                Some(&node) if node != self.node_id => preferred.push(node),
                _ => return preferred,
            }
        }
        let in_leader_region = |node: NodeId| self.leader_regions.iter().any(|r| *r == self.region_of(node));
        if !self.leader_regions.is_empty() && !in_leader_region(self.node_id) {
            let in_region = self.replica_nodes(partition).into_iter().filter(|n| in_leader_region(*n));
            preferred.extend(in_region.filter(|n| !preferred.contains(n)).collect::<Vec<_>>());
        }
        preferred
    }

    /// The region of node `node` (empty when unknown).
    pub fn region_of(&self, node: NodeId) -> String {
        self.shape().locations.get(&node).map_or(String::new(), |l| l.region.clone())
    }

    /// The labels a worker without labels of its own gets here: Zeebe's
    /// protocol has none, so its workers are `region:<this node's region>`.
    pub fn default_worker_labels(&self) -> Vec<String> {
        if self.location.region.is_empty() {
            Vec::new()
        } else {
            vec![format!("region:{}", self.location.region)]
        }
    }
}
