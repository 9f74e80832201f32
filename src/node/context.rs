//! What every request handler on a node shares.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use ractor::ActorRef;
use tokio::sync::broadcast;

use crate::config::{DedupeWindows, NodeConfig};
use crate::core::{PartitionId, RequestId};
use crate::gateway::streams::GatewayStreams;
use crate::gateway::Limits;
use crate::partition::streams::{BrokerStreams, RemoteStream};
use crate::partition::LeaderMsg;
use crate::placement::Location;
use crate::raft::{NodeId, PeerChannels, Replica};
use crate::storage::Store;

pub struct NodeContext {
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
    /// The same regions as this node's partition leaders see them.
    pub locality: Arc<crate::partition::Locality>,
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub store: Arc<Store>,
    /// The replicas this node hosts.
    pub replicas: BTreeMap<PartitionId, Arc<Replica>>,
    pub peers: PeerChannels,
    /// Streams to other nodes carrying this node's partition leaders' pushes
    /// and releases to their gateways, and its gateway's forwards to their leaders.
    pub deliveries: crate::cluster::Deliveries,
    pub limits: Limits,
    pub request_timeout: Duration,
    /// What this node's partition leaders stamp on their entries.
    pub retention: crate::core::Retention,
    pub dedupe: DedupeWindows,
    /// Drawn at start: with the sequence below, makes this gateway's request
    /// ids unique across its restarts.
    request_epoch: u64,
    request_seq: AtomicU64,
    /// Streams registered with this broker by gateways (this node's and others').
    pub broker_streams: Arc<BrokerStreams>,
    /// Streams of workers connected to this gateway.
    pub gateway_streams: GatewayStreams,
    /// "Jobs of this type became activatable on this partition", for parked polls.
    pub available: broadcast::Sender<(PartitionId, Arc<str>)>,
    leaders: RwLock<HashMap<PartitionId, ActorRef<LeaderMsg>>>,
    hints: Mutex<HashMap<PartitionId, NodeId>>,
    next_partition: AtomicU32,
    /// The turn of creates without a key, apart from `next_partition` so that
    /// polls between creates do not skew where creates go.
    next_create: AtomicU32,
    /// See [`NodeContext::next_create_partition`].
    local_creates: bool,
    in_flight: Arc<AtomicUsize>,
    /// Turns true when the node begins to stop.
    pub stopping: tokio::sync::watch::Receiver<bool>,
    /// Who client requests are, and whether they must say.
    pub auth: Arc<crate::auth::Authenticator>,
}

/// Counts a client request while it runs (see [`NodeContext::request_started`]).
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl NodeContext {
    #[allow(clippy::too_many_arguments)] // one per part the node made at start
    pub(super) fn new(
        config: &NodeConfig,
        (members, placement): (BTreeMap<NodeId, String>, Vec<Vec<NodeId>>),
        store: Arc<Store>,
        replicas: BTreeMap<PartitionId, Arc<Replica>>,
        peers: PeerChannels,
        (grpc_addr, admin_addr): (SocketAddr, SocketAddr),
        stopping: tokio::sync::watch::Receiver<bool>,
        auth: Arc<crate::auth::Authenticator>,
    ) -> Self {
        NodeContext {
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
            locality: Arc::new(crate::partition::Locality {
                own: config.location.region.clone(),
                regions: config.locations.iter().map(|(n, l)| (*n, l.region.clone())).collect(),
                node: config.local_pushes.then_some(config.node_id),
            }),
            grpc_addr,
            admin_addr,
            store,
            replicas,
            peers,
            deliveries: Default::default(),
            limits: config.limits.clone(),
            request_timeout: config.request_timeout,
            retention: config.retention,
            dedupe: config.dedupe,
            request_epoch: rand::random::<u64>(),
            request_seq: AtomicU64::new(0),
            broker_streams: Arc::new(BrokerStreams::default()),
            gateway_streams: GatewayStreams::new(config.node_id),
            available: broadcast::channel(1024).0,
            leaders: RwLock::new(HashMap::new()),
            hints: Mutex::new(HashMap::new()),
            next_partition: AtomicU32::new(rand::random::<u32>()),
            next_create: AtomicU32::new(rand::random::<u32>()),
            local_creates: config.local_creates,
            in_flight: Arc::new(AtomicUsize::new(0)),
            stopping,
            auth,
        }
    }

    /// Marks a client request as running until the guard drops; shutdown
    /// waits for these.
    pub fn request_started(&self, _method: &'static str) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(&self.in_flight))
    }

    /// A new id for a create that carries no idempotency key.
    pub fn next_request_id(&self) -> RequestId {
        RequestId::Gateway {
            node: self.node_id,
            epoch: self.request_epoch,
            seq: self.request_seq.fetch_add(1, Ordering::Relaxed),
        }
    }

    pub fn requests_in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
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

    /// The next partition of a round-robin over all of them.
    pub fn next_partition(&self) -> PartitionId {
        self.next_partition.fetch_add(1, Ordering::Relaxed) % self.partitions
    }

    /// The partition for a new job that may go anywhere (no idempotency key).
    /// With `--create-placement local` (the default): round-robin over the
    /// partitions this node leads, so that the create needs no forward to
    /// another node, or over all of them when it leads none; clients spread
    /// over the gateways thereby spread over the leaders. Otherwise
    /// round-robin over all partitions.
    pub fn next_create_partition(&self) -> PartitionId {
        let turn = self.next_create.fetch_add(1, Ordering::Relaxed);
        if !self.local_creates {
            return turn % self.partitions;
        }
        // The map's order holds while leadership does not change.
        let leaders = self.leaders.read().expect("leaders lock");
        match leaders.len() {
            0 => turn % self.partitions,
            led => *leaders.keys().nth(turn as usize % led).expect("within the map"),
        }
    }

    pub fn replica(&self, partition: PartitionId) -> Option<&Arc<Replica>> {
        self.replicas.get(&partition)
    }

    pub fn local_leader(&self, partition: PartitionId) -> Option<ActorRef<LeaderMsg>> {
        self.leaders.read().expect("leaders lock").get(&partition).cloned()
    }

    pub fn local_leaders(&self) -> Vec<ActorRef<LeaderMsg>> {
        self.leaders.read().expect("leaders lock").values().cloned().collect()
    }

    pub(super) fn set_local_leader(&self, partition: PartitionId, leader: Option<ActorRef<LeaderMsg>>) {
        let mut leaders = self.leaders.write().expect("leaders lock");
        match leader {
            Some(actor) => leaders.insert(partition, actor),
            None => leaders.remove(&partition),
        };
    }

    pub(super) async fn stop_leaders(&self) {
        let leaders: Vec<_> = self.leaders.write().expect("leaders lock").drain().map(|(_, a)| a).collect();
        for leader in leaders {
            let _ = leader.stop_and_wait(None, Some(Duration::from_secs(5))).await;
        }
    }

    /// The leader this node knows of: its replica's view, else the last hint.
    pub fn known_leader(&self, partition: PartitionId) -> Option<NodeId> {
        if let Some(replica) = self.replicas.get(&partition) {
            if let Some(leader) = replica.leadership().leader {
                return Some(leader);
            }
        }
        self.hints.lock().expect("hints lock").get(&partition).copied()
    }

    /// Waits `back_off`, or less when this node hosts a replica of the
    /// partition and it learns of a new leader first: a gateway retrying a
    /// leaderless partition follows the election's winner at once.
    pub async fn back_off_for_leader(&self, partition: PartitionId, back_off: Duration) {
        match self.replicas.get(&partition) {
            Some(replica) => {
                let known = replica.leadership().leader;
                replica.new_leader(known, back_off).await;
            }
            None => tokio::time::sleep(back_off).await,
        }
    }

    /// Where to send a partition's commands on attempt `rotation`: the known
    /// leader, else each replica in turn.
    pub fn leader_hint(&self, partition: PartitionId, rotation: usize) -> Option<NodeId> {
        if rotation == 0 || rotation % 2 == 0 {
            if let Some(leader) = self.known_leader(partition) {
                return Some(leader);
            }
        }
        let nodes = self.replica_nodes(partition);
        let others: Vec<NodeId> = nodes.into_iter().filter(|n| *n != self.node_id).collect();
        if others.is_empty() {
            return None;
        }
        // Odd attempts (the even ones went to a known leader) go round every
        // other replica in turn, not only those at odd positions.
        Some(others[(rotation / 2) % others.len()])
    }

    pub fn set_leader_hint(&self, partition: PartitionId, hint: Option<NodeId>) {
        let mut hints = self.hints.lock().expect("hints lock");
        match hint {
            Some(node) => hints.insert(partition, node),
            None => hints.remove(&partition),
        };
    }

    /// A gateway registered a stream with this broker.
    pub fn broker_register(&self, stream: RemoteStream) {
        let job_type = stream.job_type.clone();
        if self.broker_streams.register(stream) {
            for leader in self.local_leaders() {
                let _ = leader.cast(LeaderMsg::StreamAdded { job_type: job_type.clone() });
            }
        }
    }

    /// True when every partition this node hosts has a known leader.
    pub fn ready(&self) -> bool {
        self.replicas.values().all(|r| r.leadership().leader.is_some())
    }
}
