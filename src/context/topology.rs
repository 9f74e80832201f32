//! The cluster's shape as this node knows it: fixed at start.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use crate::config::NodeConfig;
use crate::core::PartitionId;
use crate::placement::Location;
use crate::raft::NodeId;

/// Who the members are, where they are, and which of them hold each
/// partition. Nothing here changes while the node runs.
pub struct Topology {
    pub node_id: NodeId,
    pub partitions: u32,
    pub replication_factor: u32,
    /// Node id -> node-to-node address.
    pub members: BTreeMap<NodeId, String>,
    /// Node id -> region and zone (empty when the member list names none).
    pub locations: BTreeMap<NodeId, Location>,
    /// Partition -> the nodes holding its replicas ([`crate::placement`]).
    pub placement: Vec<Vec<NodeId>>,
    /// This node's region and zone.
    pub location: Location,
    /// Regions partitions prefer their leaders in (empty: any).
    pub leader_regions: Vec<String>,
    /// Partition -> the node its leadership moves to when `balance_leaders`
    /// ([`crate::placement::preferred_leaders`]).
    preferred_leaders: Vec<NodeId>,
    balance_leaders: bool,
    /// This node's client gRPC address.
    pub grpc_addr: SocketAddr,
    /// This node's admin HTTP address.
    pub admin_addr: SocketAddr,
}

impl Topology {
    pub fn new(
        config: &NodeConfig,
        members: BTreeMap<NodeId, String>,
        placement: Vec<Vec<NodeId>>,
        (grpc_addr, admin_addr): (SocketAddr, SocketAddr),
    ) -> Self {
        Topology {
            node_id: config.node_id,
            partitions: config.partitions,
            replication_factor: config.replication_factor,
            locations: members.keys().map(|n| (*n, config.locations.get(n).cloned().unwrap_or_default())).collect(),
            members,
            preferred_leaders: crate::placement::preferred_leaders(&placement, |n| {
                let region = config.locations.get(&n).map_or("", |l| l.region.as_str());
                config.leader_regions.is_empty() || config.leader_regions.iter().any(|r| r == region)
            }),
            balance_leaders: config.balance_leaders,
            placement,
            location: config.location.clone(),
            leader_regions: config.leader_regions.clone(),
            grpc_addr,
            admin_addr,
        }
    }

    pub fn partition_count(&self) -> u32 {
        self.partitions
    }

    pub fn cluster_size(&self) -> u32 {
        self.members.len() as u32
    }

    pub fn replica_nodes(&self, partition: PartitionId) -> Vec<NodeId> {
        self.placement.get(partition as usize).cloned().unwrap_or_default()
    }

    /// The replicas leadership of `partition` should move to from this node,
    /// if this node leads it, best first: with `--balance-leaders`, the
    /// partition's preferred leader unless that is this node; then (and
    /// without balance, only) its replicas in a leader region when this node
    /// is in none, so that a leader outside them still moves in when the
    /// preferred one is down. Empty: it stays here.
    pub fn preferred_leaders_of(&self, partition: PartitionId) -> Vec<NodeId> {
        let mut preferred = Vec::new();
        if self.balance_leaders {
            match self.preferred_leaders.get(partition as usize) {
                Some(&node) if node != self.node_id => preferred.push(node),
                _ => return preferred,
            }
        }
        let in_leader_region = |node: NodeId| self.leader_regions.iter().any(|r| r == self.region_of(node));
        if !self.leader_regions.is_empty() && !in_leader_region(self.node_id) {
            let in_region = self.replica_nodes(partition).into_iter().filter(|n| in_leader_region(*n));
            preferred.extend(in_region.filter(|n| !preferred.contains(n)).collect::<Vec<_>>());
        }
        preferred
    }

    /// The region of node `node` (empty when unknown).
    pub fn region_of(&self, node: NodeId) -> &str {
        self.locations.get(&node).map_or("", |l| l.region.as_str())
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
