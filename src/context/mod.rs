//! What a node's request handlers and background loops share, apart from the
//! code that starts the node ([`crate::node`]): one [`NodeContext`] made of
//! owned handles, so a function's signature says which part it touches.
//!
//! - [`Topology`]: the members, their locations, where each partition lives;
//!   fixed at start.
//! - [`Routing`]: the replicas this node hosts, who leads each partition,
//!   leader hints, and the turns of round-robins.
//! - [`GatewayState`]: the worker streams connected to this gateway, wake-ups
//!   for parked polls, request ids and calls in flight.
//! - [`BrokerState`]: the streams registered with this node's partition
//!   leaders, and the regions as they see them.
//! - [`Transport`]: the channels and delivery streams to other nodes.
//! - [`Settings`]: limits and windows every request is held to.
//!
//! This module owns no behaviour beyond small accessors; it must not import
//! the gateway, the admin server, the cluster service or the node's start-up.

mod routing;
mod topology;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

pub use routing::Routing;
pub use topology::Topology;

use crate::config::{DedupeWindows, Limits, NodeConfig};
use crate::core::{PartitionId, RequestId};
use crate::partition::{LeaderMsg, Locality};
use crate::raft::{NodeId, PeerChannels, Replica};
use crate::storage::Store;
use crate::streams::{BrokerStreams, GatewayStreams, RemoteStream};
use crate::tasks::Tasks;

pub struct NodeContext {
    pub topology: Arc<Topology>,
    pub routing: Routing,
    pub gateway: GatewayState,
    pub broker: BrokerState,
    pub transport: Transport,
    pub settings: Settings,
    pub store: Arc<Store>,
    /// Who client requests are, and whether they must say.
    pub auth: Arc<crate::auth::Authenticator>,
    /// The node's long-lived loops, by name, for `/actuator/tasks`.
    pub tasks: Arc<Tasks>,
    /// Turns true when the node begins to stop.
    pub stopping: tokio::sync::watch::Receiver<bool>,
}

/// Limits and windows every request is held to, from the node's settings.
pub struct Settings {
    pub limits: Limits,
    pub request_timeout: Duration,
    /// What this node's partition leaders stamp on their entries.
    pub retention: crate::core::Retention,
    pub dedupe: DedupeWindows,
    /// Where this node spools snapshots and stages its parts of backups.
    pub snapshot_dir: std::path::PathBuf,
    /// OJS heartbeats answer the conformance suite's test directives.
    pub ojs_test_directives: bool,
}

/// The client side of this node: worker streams, parked polls, request ids
/// and the calls it is answering.
pub struct GatewayState {
    /// Streams of workers connected to this gateway.
    pub streams: GatewayStreams,
    /// "Jobs of this type became activatable on this partition", for parked polls.
    pub available: broadcast::Sender<(PartitionId, Arc<str>)>,
    node_id: NodeId,
    /// Drawn at start: with the sequence below, makes this gateway's request
    /// ids unique across its restarts.
    request_epoch: u64,
    request_seq: AtomicU64,
    in_flight: Arc<AtomicUsize>,
    /// The worker sessions this gateway has seen named: a session's tenants
    /// and labels never change, so a beat or a stream need not look them up
    /// again.
    pub known_sessions: KnownSessions,
    /// The queue limits this gateway last saw, by (tenant, job type), with
    /// when: what a create's declared limit is compared with before the
    /// gateway reads the limit again (see `JobApi::declare_limit`).
    pub seen_limits: std::sync::Mutex<
        std::collections::HashMap<(String, String), (crate::proto::gateway::QueueLimit, std::time::Instant)>,
    >,
}

/// Worker sessions' tenants and labels as a gateway remembers them, at most
/// [`KnownSessions::CAPACITY`] (then it forgets them all and looks again).
/// Remembering one says nothing of whether it still lives.
#[derive(Default)]
pub struct KnownSessions(
    std::sync::Mutex<std::collections::HashMap<crate::core::SessionId, Arc<crate::core::SessionInfo>>>,
);

impl KnownSessions {
    pub const CAPACITY: usize = 100_000;

    pub fn get(&self, session: crate::core::SessionId) -> Option<Arc<crate::core::SessionInfo>> {
        self.0.lock().expect("known sessions").get(&session).cloned()
    }

    pub fn remember(&self, info: &Arc<crate::core::SessionInfo>) {
        let mut known = self.0.lock().expect("known sessions");
        if known.len() >= Self::CAPACITY {
            known.clear();
        }
        known.insert(info.id, Arc::clone(info));
    }
}

/// What this node's partition leaders share: the streams gateways registered
/// here, and the regions as the leaders see them.
pub struct BrokerState {
    /// Streams registered with this broker by gateways (this node's and others').
    pub streams: Arc<BrokerStreams>,
    pub locality: Arc<Locality>,
}

/// How this node reaches the others.
pub struct Transport {
    pub peers: PeerChannels,
    /// Streams to other nodes carrying this node's partition leaders' pushes
    /// and releases to their gateways, and its gateway's forwards to their leaders.
    pub deliveries: crate::transport::Deliveries,
}

/// Counts a client request while it runs (see [`GatewayState::request_started`]).
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl GatewayState {
    fn new(node_id: NodeId) -> Self {
        GatewayState {
            streams: GatewayStreams::new(node_id),
            available: broadcast::channel(1024).0,
            node_id,
            request_epoch: rand::random::<u64>(),
            request_seq: AtomicU64::new(0),
            in_flight: Arc::new(AtomicUsize::new(0)),
            known_sessions: KnownSessions::default(),
            seen_limits: Default::default(),
        }
    }

    /// Marks a client request as running until the guard drops; shutdown
    /// waits for these.
    pub fn request_started(&self) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(&self.in_flight))
    }

    pub fn requests_in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// A new id for a create that carries no idempotency key.
    pub fn next_request_id(&self) -> RequestId {
        RequestId::Gateway {
            node: self.node_id,
            epoch: self.request_epoch,
            seq: self.request_seq.fetch_add(1, Ordering::Relaxed),
        }
    }
}

impl NodeContext {
    /// A job token for `key` at `attempt`, whose activation's deadline is
    /// `deadline` in its partition's time: it expires a grace after that
    /// deadline as this node's wall clock reads it (see
    /// [`Routing::local_time`]), which is what judges it. Empty when this node
    /// hands out none.
    pub fn job_token(&self, key: u64, attempt: u32, deadline: crate::core::Millis) -> String {
        if !self.auth.mints_job_tokens() {
            return String::new();
        }
        let local = self.routing.local_time(crate::core::JobKey(key).partition(), deadline);
        self.auth.job_token(key, attempt, local)
    }

    /// Puts together what [`crate::node::Node::start`] made.
    pub fn new(
        config: &NodeConfig,
        topology: Arc<Topology>,
        (store, replicas): (Arc<Store>, std::collections::BTreeMap<PartitionId, Arc<Replica>>),
        peers: PeerChannels,
        stopping: tokio::sync::watch::Receiver<bool>,
        auth: Arc<crate::auth::Authenticator>,
        tasks: Arc<Tasks>,
    ) -> Self {
        NodeContext {
            routing: Routing::new(Arc::clone(&topology), replicas, config.local_creates),
            gateway: GatewayState::new(config.node_id),
            broker: BrokerState {
                streams: Arc::new(BrokerStreams::default()),
                locality: Arc::new(Locality {
                    own: config.location.region.clone(),
                    regions: std::sync::RwLock::new(
                        config.locations.iter().map(|(n, l)| (*n, l.region.clone())).collect(),
                    ),
                    node: config.local_pushes.then_some(config.node_id),
                }),
            },
            transport: Transport { peers, deliveries: Default::default() },
            settings: Settings {
                limits: config.limits.clone(),
                request_timeout: config.request_timeout,
                retention: config.retention,
                dedupe: config.dedupe,
                snapshot_dir: config.data_dir.join("snapshots"),
                ojs_test_directives: config.ojs_test_directives,
            },
            topology,
            store,
            auth,
            tasks,
            stopping,
        }
    }

    /// A gateway registered a stream with this broker: the partitions led
    /// here may push to it now.
    pub fn broker_register(&self, stream: RemoteStream) {
        let job_type = stream.job_type.clone();
        if self.broker.streams.register(stream) {
            for leader in self.routing.local_leaders() {
                let _ = leader.cast(LeaderMsg::StreamAdded { job_type: job_type.clone() });
            }
        }
    }
}
