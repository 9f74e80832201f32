//! Who leads each partition, as this node knows it, and where new work goes.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use ractor::ActorRef;

use super::Topology;
use crate::core::{Millis, PartitionId};
use crate::partition::LeaderMsg;
use crate::raft::{NodeId, Replica};

/// The replicas this node hosts, the leader actors it runs for the partitions
/// it leads, hints of the leaders elsewhere, and the turns of round-robins.
pub struct Routing {
    topology: Arc<Topology>,
    /// The replicas this node hosts (the cluster plan adds and removes them).
    replicas: RwLock<BTreeMap<PartitionId, Arc<Replica>>>,
    leaders: RwLock<HashMap<PartitionId, ActorRef<LeaderMsg>>>,
    hints: Mutex<HashMap<PartitionId, NodeId>>,
    next_partition: AtomicU32,
    /// The turn of creates without a key, apart from `next_partition` so that
    /// polls between creates do not skew where creates go.
    next_create: AtomicU32,
    /// See [`Routing::next_create_partition`].
    local_creates: bool,
    /// Peers' estimates of the times of partitions this node hosts no
    /// replica of, with when each was heard.
    heard_clocks: Mutex<HashMap<PartitionId, (Millis, Instant)>>,
    /// Each partition's lead over this node's wall clock, with when it was
    /// worked out ([`Routing::local_time`]).
    leads: Mutex<HashMap<PartitionId, (Millis, Instant)>>,
}

/// How long a partition's lead over the wall clock is reused before it is
/// worked out again (a wall clock that steps is followed within it).
const OFFSET_LASTS: Duration = Duration::from_secs(1);

/// How long a peer's estimate of a partition's time is used, counted on from
/// when it was heard by this node's steady clock.
const HEARD_CLOCK_LASTS: Duration = Duration::from_secs(60);

impl Routing {
    pub fn new(topology: Arc<Topology>, replicas: BTreeMap<PartitionId, Arc<Replica>>, local_creates: bool) -> Self {
        Routing {
            topology,
            replicas: RwLock::new(replicas),
            leaders: RwLock::new(HashMap::new()),
            hints: Mutex::new(HashMap::new()),
            next_partition: AtomicU32::new(rand::random::<u32>()),
            next_create: AtomicU32::new(rand::random::<u32>()),
            local_creates,
            heard_clocks: Mutex::new(HashMap::new()),
            leads: Mutex::new(HashMap::new()),
        }
    }

    /// The next partition of a round-robin over all of them.
    pub fn next_partition(&self) -> PartitionId {
        self.next_partition.fetch_add(1, Ordering::Relaxed) % self.topology.partition_count()
    }

    /// The partition for a new job that may go anywhere (no idempotency key).
    /// With `--create-placement local` (the default): round-robin over the
    /// partitions this node leads, so that the create needs no forward to
    /// another node, or over all of them when it leads none; clients spread
    /// over the gateways thereby spread over the leaders. Otherwise
    /// round-robin over all partitions.
    pub fn next_create_partition(&self) -> PartitionId {
        let turn = self.next_create.fetch_add(1, Ordering::Relaxed);
        let partitions = self.topology.partition_count();
        if !self.local_creates {
            return turn % partitions;
        }
        // The map's order holds while leadership does not change; a
        // partition still being added takes no work yet.
        let leaders = self.leaders.read().expect("leaders lock");
        let led = || leaders.keys().filter(|p| **p < partitions);
        match led().count() {
            0 => turn % partitions,
            count => *led().nth(turn as usize % count).expect("within the map"),
        }
    }

    /// `at`, a time of `partition`'s, as this node's wall clock will read
    /// it: its distance from the partition's time now, from now. A
    /// partition's time follows its leaders' steady clocks, not this node's
    /// wall clock, and may trail or lead it (after a leader resumed from its
    /// last entry, or on a node whose clock is off). Known here from this
    /// node's replica of the partition once it has applied an entry since it
    /// started, or else from a peer's estimate heard lately
    /// ([`Routing::heard_partition_time`]); otherwise the two are taken to
    /// agree.
    pub fn local_time(&self, partition: PartitionId, at: Millis) -> Millis {
        match self.partition_lead(partition) {
            Some(lead) => at.saturating_sub(lead),
            None => at,
        }
    }

    /// How far `partition`'s time runs ahead of this node's wall clock
    /// (negative: behind). Both advance at the same rate, so it is reused for
    /// [`OFFSET_LASTS`]: a job token minted for each job of a stream does not
    /// take the partition's apply lock each time.
    fn partition_lead(&self, partition: PartitionId) -> Option<Millis> {
        if let Some((lead, at)) = self.leads.lock().expect("partition leads").get(&partition) {
            if at.elapsed() < OFFSET_LASTS {
                return Some(*lead);
            }
        }
        let lead = self.partition_now(partition)?.saturating_sub(crate::auth::now_ms() as Millis);
        self.leads.lock().expect("partition leads").insert(partition, (lead, Instant::now()));
        Some(lead)
    }

    /// `partition`'s time now, as far as this node can tell.
    fn partition_now(&self, partition: PartitionId) -> Option<Millis> {
        if let Some(estimate) = self.replica(partition).and_then(|replica| replica.state().clock_estimate()) {
            return Some(estimate);
        }
        let (estimate, heard) = *self.heard_clocks.lock().expect("heard clocks").get(&partition)?;
        (heard.elapsed() < HEARD_CLOCK_LASTS).then(|| estimate.saturating_add(heard.elapsed().as_millis() as Millis))
    }

    /// A peer estimated `partition`'s time at `estimate` as it answered just
    /// now (for a partition this node hosts no replica of).
    pub fn heard_partition_time(&self, partition: PartitionId, estimate: Millis) {
        self.heard_clocks.lock().expect("heard clocks").insert(partition, (estimate, Instant::now()));
    }

    /// The partitions this node hosts no replica of.
    pub fn remote_partitions(&self) -> Vec<PartitionId> {
        let replicas = self.replicas.read().expect("replicas lock");
        (0..self.topology.partition_count()).filter(|p| !replicas.contains_key(p)).collect()
    }

    pub fn replica(&self, partition: PartitionId) -> Option<Arc<Replica>> {
        self.replicas.read().expect("replicas lock").get(&partition).cloned()
    }

    /// The replicas this node hosts, by partition.
    pub fn replicas(&self) -> Vec<Arc<Replica>> {
        self.replicas.read().expect("replicas lock").values().cloned().collect()
    }

    /// Adds a replica the cluster plan placed here.
    pub fn add_replica(&self, replica: Arc<Replica>) {
        self.replicas.write().expect("replicas lock").insert(replica.partition, replica);
    }

    /// Removes the replica of `partition` (the plan moved it away).
    pub fn remove_replica(&self, partition: PartitionId) -> Option<Arc<Replica>> {
        self.replicas.write().expect("replicas lock").remove(&partition)
    }

    pub fn local_leader(&self, partition: PartitionId) -> Option<ActorRef<LeaderMsg>> {
        self.leaders.read().expect("leaders lock").get(&partition).cloned()
    }

    pub fn local_leaders(&self) -> Vec<ActorRef<LeaderMsg>> {
        self.leaders.read().expect("leaders lock").values().cloned().collect()
    }

    pub fn set_local_leader(&self, partition: PartitionId, leader: Option<ActorRef<LeaderMsg>>) {
        let mut leaders = self.leaders.write().expect("leaders lock");
        match leader {
            Some(actor) => leaders.insert(partition, actor),
            None => leaders.remove(&partition),
        };
    }

    pub async fn stop_leaders(&self) {
        let leaders: Vec<_> = self.leaders.write().expect("leaders lock").drain().map(|(_, a)| a).collect();
        for leader in leaders {
            let _ = leader.stop_and_wait(None, Some(Duration::from_secs(5))).await;
        }
    }

    /// The leader this node knows of: its replica's view, else the last hint.
    pub fn known_leader(&self, partition: PartitionId) -> Option<NodeId> {
        if let Some(replica) = self.replica(partition) {
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
        match self.replica(partition) {
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
        let nodes = self.topology.replica_nodes(partition);
        let others: Vec<NodeId> = nodes.into_iter().filter(|n| *n != self.topology.node_id).collect();
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

    /// True when every partition this node hosts has a known leader.
    pub fn ready(&self) -> bool {
        self.replicas().iter().all(|r| r.leadership().leader.is_some())
    }
}
