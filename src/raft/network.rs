//! Raft RPCs over the cluster gRPC service, on this node's channels to its
//! peers ([`crate::transport`]); each request names its partition.
//!
//! A leader's appends to a follower go as messages on one long-lived
//! `AppendEntriesStream` call per partition and follower ([`AppendStream`]),
//! instead of a unary call each: an append then costs one message each way,
//! without a new HTTP/2 stream, its headers and the tasks around it. Votes
//! and snapshots stay unary, and so do appends to a peer that has no such
//! stream (UNIMPLEMENTED, an older node).
//!
//! Every cluster client encodes and decodes messages up to one limit, the same
//! the cluster server applies ([`PeerChannels::max_message_bytes`]). An append
//! that would not fit, or that a peer refuses as too large, is answered with
//! openraft's `PayloadTooLarge` and a smaller entry count, so openraft sends
//! fewer entries at once instead of backing off and resending the same range
//! for ever.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{
    InstallSnapshotError, NetworkError, PayloadTooLarge, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::log_store::AppendTimes;
use super::{NodeId, TypeConfig};
use crate::core::PartitionId;
use crate::metrics::stages::{self, Stage};

use crate::proto::cluster::{RaftReply, RaftRequest};
use crate::transport::{Answers, PeerChannels, PeerClient};

/// The openraft network factory of one partition.
pub struct ClusterNetwork {
    partition: PartitionId,
    peers: PeerChannels,
    appended: Arc<AppendTimes>,
}

impl ClusterNetwork {
    /// `appended` is the partition's log store's: when its entries were
    /// appended, to time their wait for an AppendEntries.
    pub fn new(partition: PartitionId, peers: PeerChannels, appended: Arc<AppendTimes>) -> Self {
        ClusterNetwork { partition, peers, appended }
    }
}

impl RaftNetworkFactory<TypeConfig> for ClusterNetwork {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> PeerConnection {
        PeerConnection {
            partition: self.partition,
            target,
            client: self.peers.client(target),
            max_message_bytes: self.peers.max_message_bytes(),
            answered: self.peers.answers(),
            appends: None,
            unary_until: None,
            appended: Arc::clone(&self.appended),
            last_exchange_end: None,
        }
    }
}

pub struct PeerConnection {
    partition: PartitionId,
    target: NodeId,
    client: Option<PeerClient>,
    max_message_bytes: usize,
    answered: Answers,
    /// The append stream to the target, once opened; out of here while an
    /// exchange runs on it, and back only after a whole one (see
    /// [`AppendStream`]), so a late reply is never taken for the next one's.
    appends: Option<AppendStream>,
    /// Until when appends go unary: the target answered UNIMPLEMENTED for the
    /// stream (a node of an older version, until it is upgraded).
    unary_until: Option<Instant>,
    /// When this partition's entries were appended on this node.
    appended: Arc<AppendTimes>,
    /// When the last AppendEntries to the target ended (answered or not).
    last_exchange_end: Option<Instant>,
}

/// How long appends go unary after a peer said it has no append stream.
const UNARY_AFTER_UNIMPLEMENTED: Duration = Duration::from_secs(60);

/// One long-lived `AppendEntriesStream` call: a request goes out, and its
/// reply is the next message back (the peer answers in order, one each).
/// openraft sends a follower one append at a time, so one exchange runs at a
/// time.
///
/// An exchange that does not finish (it failed, timed out, or openraft
/// dropped it at its own deadline) leaves its reply on the way: the stream
/// is then never used again, or that reply would be read as the next
/// append's, and a leader would count a follower as holding entries it has
/// not yet written. [`PeerConnection`] takes the stream out for each exchange
/// and puts it back only after a whole one; each reply also carries its
/// request's number, and a stream whose reply does not match is dropped.
struct AppendStream {
    requests: tokio::sync::mpsc::Sender<RaftRequest>,
    replies: tonic::Streaming<RaftReply>,
    /// The number of the last request sent.
    seq: u64,
}

impl AppendStream {
    /// Opens the stream with `first` as its first request; the stream and
    /// that request's reply.
    async fn open(client: &mut PeerClient, mut first: RaftRequest) -> Result<(Self, RaftReply), tonic::Status> {
        let (requests, outgoing) = tokio::sync::mpsc::channel(1);
        first.seq = 1;
        requests.try_send(first).expect("a new channel has room for one request");
        let response = client.append_entries_stream(tokio_stream::wrappers::ReceiverStream::new(outgoing)).await?;
        let mut stream = AppendStream { requests, replies: response.into_inner(), seq: 1 };
        let reply = stream.next_reply().await?;
        Ok((stream, reply))
    }

    async fn exchange(&mut self, mut request: RaftRequest) -> Result<RaftReply, tonic::Status> {
        self.seq += 1;
        request.seq = self.seq;
        self.requests.send(request).await.map_err(|_| tonic::Status::unavailable("append stream closed"))?;
        self.next_reply().await
    }

    async fn next_reply(&mut self) -> Result<RaftReply, tonic::Status> {
        let reply = self
            .replies
            .message()
            .await?
            .ok_or_else(|| tonic::Status::unavailable("the peer ended the append stream"))?;
        if reply.seq != self.seq {
            metrics::counter!("drover_raft_append_stream_mismatches_total").increment(1);
            return Err(tonic::Status::internal(format!(
                "append stream reply {} answers no request in flight (expected {})",
                reply.seq, self.seq
            )));
        }
        Ok(reply)
    }
}

/// Room in a message for the request's framing besides the openraft payload.
const FRAMING: usize = 1024;

/// The most an append of several entries carries. openraft gives an append
/// one heartbeat interval (250 ms by default) before it times out, and sends
/// the same entries again after a timeout: a follower far behind (re-seeded,
/// or back from a long outage) was sent up to 16 entries of up to 4 MiB each,
/// which did not arrive, get written and synced in time on a loaded machine,
/// again and again, so it never caught up. 1 MiB is a few milliseconds on a
/// LAN; appends of a caught-up follower are far smaller, and a single larger
/// entry is still sent alone.
const APPEND_TARGET_BYTES: usize = 1 << 20;

/// Whether a status says a message was over a gRPC size limit (tonic answers
/// OUT_OF_RANGE, "... message length too large ...", on either side).
fn too_large(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::OutOfRange && status.message().contains("message length too large")
}

/// The entry count to send instead, when an append of `entries` entries
/// serialized to `bytes` is over [`APPEND_TARGET_BYTES`] or would not fit a
/// message of `max_message_bytes`; `None` when it goes as it is.
fn split_append(entries: usize, bytes: usize, max_message_bytes: usize) -> Option<u64> {
    let limit = max_message_bytes.saturating_sub(FRAMING).min(APPEND_TARGET_BYTES);
    (entries > 1 && bytes > limit).then(|| entries_hint(entries, bytes, limit))
}

/// The entry count to try after `entries` entries took `bytes` and did not
/// fit `limit`: proportionally fewer, always fewer than before, at least one.
fn entries_hint(entries: usize, bytes: usize, limit: usize) -> u64 {
    let scaled = (entries as u128 * limit as u128 / bytes.max(1) as u128) as usize;
    scaled.min(entries.saturating_sub(1)).max(1) as u64
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

impl PeerConnection {
    /// Sends one RPC. `entries` is the entry count of an append (None for
    /// other RPCs): an append too large for one message comes back as
    /// `PayloadTooLarge` with a smaller count to try.
    async fn call<Req, Resp, E>(
        &mut self,
        kind: super::RpcKind,
        request: &Req,
        entries: Option<usize>,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        if self.client.is_none() {
            let e = TransportError(format!("node {} is not a cluster member", self.target));
            return Err(RPCError::Unreachable(Unreachable::new(&e)));
        }
        let payload = bincode::serialize(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        if let Some(hint) = entries.and_then(|n| split_append(n, payload.len(), self.max_message_bytes)) {
            metrics::counter!("drover_raft_appends_too_large_total").increment(1);
            return Err(PayloadTooLarge::new_entries_hint(hint).into());
        }
        let request = RaftRequest { partition_id: self.partition, payload: payload.into(), seq: 0 };
        let started = std::time::Instant::now();
        let streamed = kind == super::RpcKind::AppendEntries && self.unary_until.is_none_or(|until| until <= started);
        let reply = if streamed {
            self.append_on_stream(request, option.hard_ttl()).await
        } else {
            let client = self.client.as_mut().expect("checked above");
            let mut grpc = tonic::Request::new(request);
            grpc.set_timeout(option.hard_ttl());
            match kind {
                super::RpcKind::AppendEntries => client.append_entries(grpc).await,
                super::RpcKind::Vote => client.vote(grpc).await,
                super::RpcKind::InstallSnapshot => client.install_snapshot(grpc).await,
            }
            .map(tonic::Response::into_inner)
        };
        metrics::histogram!("drover_raft_rpc_seconds", "rpc" => kind.as_str()).record(started.elapsed().as_secs_f64());
        if kind == super::RpcKind::AppendEntries {
            crate::metrics::stages::record(crate::metrics::stages::Stage::Replicate, started.elapsed());
        }
        let reply = match reply {
            Ok(reply) => {
                self.answered.record(self.target);
                reply
            }
            Err(status) => {
                // A peer with a smaller limit refused it: halve and try again.
                if let Some(entries) = entries.filter(|n| *n > 1 && too_large(&status)) {
                    metrics::counter!("drover_raft_appends_too_large_total").increment(1);
                    return Err(PayloadTooLarge::new_entries_hint(entries_hint(entries, 2, 1)).into());
                }
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

impl PeerConnection {
    /// Sends an append on the append stream, opening it if need be, within
    /// `ttl`. A stream used before may have died with its connection (the
    /// peer restarted) without a word: failing, it is replaced once by a new
    /// one (appends are idempotent). A peer without the stream (UNIMPLEMENTED)
    /// gets this append and the next minute's unary.
    async fn append_on_stream(&mut self, request: RaftRequest, ttl: Duration) -> Result<RaftReply, tonic::Status> {
        let deadline = tokio::time::Instant::now() + ttl;
        let timed_out = || tonic::Status::deadline_exceeded(format!("no append reply within {ttl:?}"));
        // Out for the exchange: if this future is dropped before it ends, the
        // stream goes with it (see `AppendStream`).
        if let Some(mut stream) = self.appends.take() {
            match tokio::time::timeout_at(deadline, stream.exchange(request.clone())).await {
                Ok(Ok(reply)) => {
                    self.appends = Some(stream);
                    return Ok(reply);
                }
                Ok(Err(status)) if too_large(&status) => return Err(status),
                Ok(Err(_)) => {}
                Err(_) => return Err(timed_out()),
            }
        }
        let client = self.client.as_mut().expect("checked by the caller");
        match tokio::time::timeout_at(deadline, AppendStream::open(client, request.clone())).await {
            Ok(Ok((stream, reply))) => {
                self.appends = Some(stream);
                Ok(reply)
            }
            Ok(Err(status)) if status.code() == tonic::Code::Unimplemented => {
                tracing::info!(peer = self.target, "peer has no append stream; appends to it go unary for a while");
                self.unary_until = Some(Instant::now() + UNARY_AFTER_UNIMPLEMENTED);
                let mut grpc = tonic::Request::new(request);
                grpc.set_timeout(deadline.saturating_duration_since(tokio::time::Instant::now()));
                client.append_entries(grpc).await.map(tonic::Response::into_inner)
            }
            Ok(Err(status)) => Err(status),
            Err(_) => Err(timed_out()),
        }
    }
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let entries = rpc.entries.len();
        let waited = rpc.entries.first().and_then(|e| self.appended.appended_at(e.log_id.index)).map(|appended| {
            let behind = self.last_exchange_end.and_then(|end| end.checked_duration_since(appended));
            (appended.elapsed(), behind)
        });
        let result = self.call(super::RpcKind::AppendEntries, &rpc, Some(entries), &option).await;
        self.last_exchange_end = Some(Instant::now());
        // An append too large for one message goes again with fewer entries:
        // its wait is counted then, once.
        let too_large = matches!(result, Err(RPCError::PayloadTooLarge(_)));
        if let Some((wait, behind)) = waited.filter(|_| !too_large) {
            stages::record(Stage::AppendWait, wait);
            if let Some(behind) = behind {
                stages::record(Stage::AppendBehind, behind);
            }
        }
        result
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>>
    {
        self.call(super::RpcKind::InstallSnapshot, &rpc, None, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(super::RpcKind::Vote, &rpc, None, &option).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_too_large_append_is_retried_with_fewer_entries() {
        // 16 entries of 5 MB against 64 MB: 12 fit.
        assert_eq!(entries_hint(16, 80 << 20, 64 << 20), 12);
        // Always fewer than before, never none.
        assert_eq!(entries_hint(16, (64 << 20) + 1, 64 << 20), 15);
        assert_eq!(entries_hint(2, 1 << 30, 64 << 20), 1);
        // A peer's refusal: half.
        assert_eq!(entries_hint(16, 2, 1), 8);
    }

    #[test]
    fn an_append_over_a_mebibyte_goes_in_fewer_entries_unless_it_is_one() {
        // 16 entries of 4 MiB: one at a time.
        assert_eq!(split_append(16, 64 << 20, 64 << 20), Some(1));
        // 16 entries of 256 KiB: 4 at a time.
        assert_eq!(split_append(16, 4 << 20, 64 << 20), Some(4));
        assert_eq!(split_append(16, 1 << 20, 64 << 20), None, "at the target");
        assert_eq!(split_append(1, 4 << 20, 64 << 20), None, "one entry goes alone, however large");
        // A smaller message limit still rules.
        assert_eq!(split_append(4, 600 << 10, 300 << 10), Some(1));
    }

    #[test]
    fn tonic_size_errors_are_recognised() {
        assert!(too_large(&tonic::Status::out_of_range(
            "Error, decoded message length too large: found 70000000 bytes, the limit is: 67108864 bytes"
        )));
        assert!(!too_large(&tonic::Status::out_of_range("deadline")));
        assert!(!too_large(&tonic::Status::unavailable("message length too large")));
    }
}
