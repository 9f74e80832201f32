//! The cluster's shape as this node knows it: the member list's at start,
//! then the cluster plan's.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use crate::config::NodeConfig;
use crate::core::{ClusterPlan, Member, PartitionId};
use crate::placement::Location;
use crate::raft::NodeId;

/// Who the members are, where they are, and which of them hold each
/// partition. The partition count, replication factor and this node's own
/// place never change while the node runs; the members and placement change
/// with the cluster plan ([`Topology::follow_plan`]).
pub struct Topology {
    pub node_id: NodeId,
    pub partitions: u32,
    pub replication_factor: u32,
    shape: RwLock<Shape>,
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
            partitions: config.partitions,
            replication_factor: config.replication_factor,
            shape: RwLock::new(Shape::default()),
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
        *self.shape.write().expect("topology lock") = Shape { members, locations, placement, preferred_leaders, plan };
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

    pub fn partition_count(&self) -> u32 {
        self.partitions
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
