//! Raft RPCs over the cluster gRPC service: one lazily connected channel per
//! peer, shared by every partition's group; each request names its partition.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use super::{NodeId, TypeConfig};
use crate::core::PartitionId;
use crate::proto::cluster::cluster_client::ClusterClient;
use crate::proto::cluster::RaftRequest;

/// One gRPC channel per peer node, created on first use and reused by every
/// partition and every caller (Raft, forwarding, stream registration, pushes).
#[derive(Clone)]
pub struct PeerChannels {
    addresses: Arc<BTreeMap<NodeId, String>>,
    channels: Arc<Mutex<HashMap<NodeId, Channel>>>,
}

impl PeerChannels {
    pub fn new(addresses: BTreeMap<NodeId, String>) -> Self {
        PeerChannels { addresses: Arc::new(addresses), channels: Default::default() }
    }

    /// The cluster-service client for `node`, if it is a member.
    pub fn client(&self, node: NodeId) -> Option<ClusterClient<Channel>> {
        let mut channels = self.channels.lock().expect("peer channel lock poisoned");
        if let Some(channel) = channels.get(&node) {
            return Some(ClusterClient::new(channel.clone()));
        }
        let address = self.addresses.get(&node)?;
        let endpoint = Endpoint::from_shared(format!("http://{address}"))
            .ok()?
            .connect_timeout(Duration::from_millis(500))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(5))
            .keep_alive_timeout(Duration::from_secs(5))
            .initial_connection_window_size(Some(4 << 20))
            .initial_stream_window_size(Some(1 << 20));
        let channel = endpoint.connect_lazy();
        channels.insert(node, channel.clone());
        Some(ClusterClient::new(channel).max_decoding_message_size(64 << 20).max_encoding_message_size(64 << 20))
    }
}

/// The openraft network factory of one partition.
pub struct ClusterNetwork {
    partition: PartitionId,
    peers: PeerChannels,
}

impl ClusterNetwork {
    pub fn new(partition: PartitionId, peers: PeerChannels) -> Self {
        ClusterNetwork { partition, peers }
    }
}

impl RaftNetworkFactory<TypeConfig> for ClusterNetwork {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> PeerConnection {
        PeerConnection { partition: self.partition, target, client: self.peers.client(target) }
    }
}

pub struct PeerConnection {
    partition: PartitionId,
    target: NodeId,
    client: Option<ClusterClient<Channel>>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

impl PeerConnection {
    async fn call<Req, Resp, E>(
        &mut self,
        kind: super::RpcKind,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let Some(client) = self.client.as_mut() else {
            let e = TransportError(format!("node {} is not a cluster member", self.target));
            return Err(RPCError::Unreachable(Unreachable::new(&e)));
        };
        let payload = bincode::serialize(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut grpc = tonic::Request::new(RaftRequest { partition_id: self.partition, payload: payload.into() });
        grpc.set_timeout(option.hard_ttl());
        let started = std::time::Instant::now();
        let reply = match kind {
            super::RpcKind::AppendEntries => client.append_entries(grpc).await,
            super::RpcKind::Vote => client.vote(grpc).await,
            super::RpcKind::InstallSnapshot => client.install_snapshot(grpc).await,
        };
        metrics::histogram!("drover_raft_rpc_seconds", "rpc" => kind.as_str()).record(started.elapsed().as_secs_f64());
        let reply = match reply {
            Ok(reply) => reply.into_inner(),
            Err(status) => {
                let e = TransportError(format!("{}: {}", status.code(), status.message()));
                return Err(RPCError::Unreachable(Unreachable::new(&e)));
            }
        };
        if !reply.error.is_empty() {
            return Err(RPCError::Network(NetworkError::new(&TransportError(reply.error))));
        }
        let result: Result<Resp, E> =
            bincode::deserialize(&reply.payload).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(super::RpcKind::AppendEntries, &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>>
    {
        self.call(super::RpcKind::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(super::RpcKind::Vote, &rpc, &option).await
    }
}
