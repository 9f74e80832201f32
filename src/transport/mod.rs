//! This node's connections to the other members: one gRPC channel per peer
//! ([`PeerChannels`]), shared by every partition's Raft traffic and every
//! other caller, and the long-lived delivery streams on them
//! ([`Deliveries`]).
//!
//! Every call names its sender and data version, and every answer the
//! answering node's ([`stamp`]); [`Versions`] keeps what each member speaks
//! and the cluster version that follows from it.
//!
//! Below raft, the gateway and the cluster service, which all send through
//! it; it knows the cluster service's client and messages, nothing of what
//! they mean.

mod deliveries;
pub mod stamp;
pub mod versions;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

pub use deliveries::{Delivered, Deliveries, FORWARDS_ON_STREAMS};
pub use stamp::{Admit, Stamped};
pub use versions::Versions;

use crate::core::NodeId;
use crate::proto::cluster::cluster_client::ClusterClient;

/// One gRPC channel per peer node, created on first use and reused by every
/// partition and every caller (Raft, forwarding, stream registration, pushes).
#[derive(Clone)]
pub struct PeerChannels {
    addresses: Arc<std::sync::RwLock<BTreeMap<NodeId, String>>>,
    channels: Arc<Mutex<HashMap<NodeId, Channel>>>,
    max_message_bytes: usize,
    /// Mutual TLS to peers, when the cluster port has it.
    tls: Option<Arc<crate::tls::ReloadingClient>>,
    /// When each peer last answered a Raft RPC of any partition.
    answered: Answers,
    /// What each peer speaks, and the cluster version.
    versions: Arc<Versions>,
}

/// A client of a peer's cluster service: its calls carry this node's id and
/// data version ([`Stamped`]).
pub type PeerClient = ClusterClient<Stamped>;

/// Since when each peer has answered Raft RPCs without a gap longer than
/// [`ANSWERED_LATELY`], and when it last did; shared by every partition's
/// connections to it.
#[derive(Clone, Default)]
pub struct Answers(Arc<Mutex<HashMap<NodeId, (Instant, Instant)>>>);

impl Answers {
    /// `node` answered a Raft RPC just now.
    pub fn record(&self, node: NodeId) {
        let now = Instant::now();
        let mut answered = self.0.lock().expect("peer answers lock poisoned");
        let (since, last) = answered.entry(node).or_insert((now, now));
        if now.duration_since(*last) > ANSWERED_LATELY {
            *since = now;
        }
        *last = now;
    }
}

/// A peer that has answered no Raft RPC for this long is not taken for up:
/// every leader sends each follower a heartbeat at least every heartbeat
/// interval (250 ms by default, 500 ms between regions).
const ANSWERED_LATELY: Duration = Duration::from_secs(2);

impl PeerChannels {
    /// Channels to `addresses`, whose clients encode and decode messages of
    /// up to `max_message_bytes` (the cluster server's limit too).
    pub fn new(
        addresses: BTreeMap<NodeId, String>,
        max_message_bytes: usize,
        tls: Option<Arc<crate::tls::ReloadingClient>>,
        versions: Arc<Versions>,
    ) -> Self {
        PeerChannels {
            addresses: Arc::new(std::sync::RwLock::new(addresses)),
            channels: Default::default(),
            max_message_bytes,
            tls,
            answered: Default::default(),
            versions,
        }
    }

    /// The members are now `addresses` (the cluster plan changed them): a
    /// new member is dialled at its address from now on, and a member whose
    /// address changed is dialled again.
    pub fn set_addresses(&self, addresses: BTreeMap<NodeId, String>) {
        let mut known = self.addresses.write().expect("peer addresses lock");
        let mut channels = self.channels.lock().expect("peer channel lock poisoned");
        channels.retain(|node, _| known.get(node) == addresses.get(node));
        *known = addresses;
    }

    /// What each peer speaks, and the cluster version.
    pub fn versions(&self) -> &Arc<Versions> {
        &self.versions
    }

    /// Whether `node` answered a Raft RPC (of any partition this node
    /// leads) within the last two seconds: a leader's own view of a
    /// follower's log position is not reset when the follower stops.
    pub fn answered_lately(&self, node: NodeId) -> bool {
        !self.answering_for(node).is_zero()
    }

    /// How long `node` has answered Raft RPCs without a gap of more than two
    /// seconds, up to now; zero when it has not answered lately.
    pub fn answering_for(&self, node: NodeId) -> Duration {
        let answered = self.answered.0.lock().expect("peer answers lock poisoned");
        match answered.get(&node) {
            Some((since, last)) if last.elapsed() <= ANSWERED_LATELY => since.elapsed().max(Duration::from_nanos(1)),
            _ => Duration::ZERO,
        }
    }

    /// Where the Raft connections to peers record their answers.
    pub fn answers(&self) -> Answers {
        self.answered.clone()
    }

    /// The limit on node-to-node messages, both ways.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// `node`'s status (its replicas, clocks, addresses and the plan it
    /// follows), if it answers within `limit`.
    pub async fn status(&self, node: NodeId, limit: Duration) -> Option<crate::proto::cluster::StatusReply> {
        let mut client = self.client(node)?;
        let mut request = tonic::Request::new(crate::proto::cluster::StatusRequest {});
        request.set_timeout(limit);
        let answer = tokio::time::timeout(limit, client.status(request)).await;
        Some(answer.ok()?.ok()?.into_inner())
    }

    /// The cluster-service client for `node`, if it is a member.
    pub fn client(&self, node: NodeId) -> Option<PeerClient> {
        let channel = Stamped::new(self.channel(node)?, node, Arc::clone(&self.versions));
        Some(
            ClusterClient::new(channel)
                .max_decoding_message_size(self.max_message_bytes)
                .max_encoding_message_size(self.max_message_bytes),
        )
    }

    fn channel(&self, node: NodeId) -> Option<Channel> {
        let mut channels = self.channels.lock().expect("peer channel lock poisoned");
        if let Some(channel) = channels.get(&node) {
            return Some(channel.clone());
        }
        let address = self.addresses.read().expect("peer addresses lock").get(&node)?.clone();
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .ok()?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .initial_connection_window_size(Some(4 << 20))
            .initial_stream_window_size(Some(1 << 20));
        let channel = match &self.tls {
            Some(tls) => endpoint.connect_with_connector_lazy(crate::tls::cluster_connector(Arc::clone(tls))),
            None => endpoint.connect_lazy(),
        };
        channels.insert(node, channel.clone());
        Some(channel)
    }
}
