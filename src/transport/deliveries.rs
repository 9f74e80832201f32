//! Messages between this node and another on one long-lived `Deliver`
//! stream per peer, instead of a call each: pushes and releases from this
//! node's partition leaders to the peer's gateway, and command batches this
//! node's gateway forwards to a partition leader there. A message each way,
//! without a new HTTP/2 stream, its headers and the tasks around it.
//!
//! Pushes and forwards run concurrently on a stream, each reply naming its
//! request. A stream that ends or fails answers every request still waiting
//! with the reason: one that never connected counts as not sent (the caller
//! knows nothing reached the peer), any other as an unknown outcome, as for
//! a call. The next request opens a new stream. A peer that answers
//! UNIMPLEMENTED (an older node) gets calls for a minute; one that answers a
//! request as of a kind it does not know gets that request as a call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use super::PeerChannels;
use crate::core::NodeId;
use crate::proto::cluster::{
    DeliverReply, DeliverRequest, ForwardReply, ForwardRequest, PushReply, PushRequest, ReleaseJobsRequest,
};

/// The data version from which every build takes forwards on its `Deliver`
/// stream, or answers them as unsupported. Some builds before data versions
/// (which speak 6) read a forward there as nothing and never answered it: a
/// peer not heard speaking this version gets forwards as calls.
pub const FORWARDS_ON_STREAMS: u16 = 7;

/// How long a peer that has no `Deliver` stream gets calls before it is asked again.
const CALLS_AFTER_UNIMPLEMENTED: Duration = Duration::from_secs(60);

/// This node's delivery streams, one per peer, opened on first use.
#[derive(Default)]
pub struct Deliveries {
    peers: Mutex<HashMap<NodeId, Arc<PeerStream>>>,
    /// Peers that said they have no `Deliver` stream, and until when they get calls.
    calls_until: Arc<Mutex<HashMap<NodeId, Instant>>>,
}

/// What a push or a forward on a stream came to.
pub enum Delivered<R> {
    Reply(R),
    /// It never left this node: nothing of it reached the peer.
    NotSent(String),
    /// It may have reached the peer (the stream ended or the reply did not
    /// come in time).
    Failed(Status),
    /// The peer has no stream (or was not asked lately), or does not know
    /// this kind of request: make it as a call.
    UseCall,
}

/// One open `Deliver` call and the requests waiting for their replies.
struct PeerStream {
    requests: mpsc::UnboundedSender<DeliverRequest>,
    next_id: AtomicU64,
    waiting: Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    replies: HashMap<u64, oneshot::Sender<Result<DeliverReply, Status>>>,
    /// The stream ended: nothing more is sent on it.
    closed: bool,
}

impl Deliveries {
    /// Pushes `request` to `node`'s gateway and waits up to `within` for its reply.
    pub async fn push(
        &self,
        peers: &PeerChannels,
        node: NodeId,
        request: PushRequest,
        within: Duration,
    ) -> Delivered<PushReply> {
        let message = |id| DeliverRequest { id, push: Some(request), ..Default::default() };
        self.exchange(peers, node, message, within, |reply| reply.push.unwrap_or_default()).await
    }

    /// Forwards a command batch to `node`, which leads its partition, and
    /// waits up to `within` (the batch's own deadline) for the outcome.
    pub async fn forward(
        &self,
        peers: &PeerChannels,
        node: NodeId,
        request: ForwardRequest,
        within: Duration,
    ) -> Delivered<ForwardReply> {
        let message = |id| DeliverRequest { id, forward: Some(request), ..Default::default() };
        self.exchange(peers, node, message, within, |reply| reply.forward.unwrap_or_default()).await
    }

    /// Sends the message `message(id)` makes to `node` and waits up to
    /// `within` for the reply that names it, read with `take`.
    async fn exchange<R>(
        &self,
        peers: &PeerChannels,
        node: NodeId,
        message: impl FnOnce(u64) -> DeliverRequest,
        within: Duration,
        take: impl FnOnce(DeliverReply) -> R,
    ) -> Delivered<R> {
        let mut open = None;
        // A stream may end between its lookup and this request's turn on
        // it: then once more, on a new one.
        for _ in 0..2 {
            let Some(stream) = self.stream(peers, node) else { return Delivered::UseCall };
            let id = stream.next_id.fetch_add(1, Ordering::Relaxed) + 1;
            let (reply, replied) = oneshot::channel();
            let mut waiting = stream.waiting.lock().expect("delivery lock poisoned");
            if !waiting.closed {
                waiting.replies.insert(id, reply);
                drop(waiting);
                open = Some((stream, id, replied));
                break;
            }
        }
        let Some((stream, id, replied)) = open else {
            return Delivered::NotSent("the delivery stream to the peer ended as it opened".into());
        };
        if stream.requests.send(message(id)).is_err() {
            // The stream's task has ended (and answers, or has answered, the
            // waiting requests): this one never left.
            stream.waiting.lock().expect("delivery lock poisoned").replies.remove(&id);
            return Delivered::NotSent("the delivery stream to the peer ended".into());
        }
        match tokio::time::timeout(within, replied).await {
            Ok(Ok(Ok(reply))) if reply.unsupported => Delivered::UseCall,
            Ok(Ok(Ok(reply))) => Delivered::Reply(take(reply)),
            Ok(Ok(Err(status))) if status.code() == tonic::Code::Unimplemented => Delivered::UseCall,
            Ok(Ok(Err(status))) => Delivered::Failed(status),
            Ok(Err(_)) => Delivered::Failed(Status::unknown("the delivery stream to the peer was dropped")),
            Err(_) => {
                stream.waiting.lock().expect("delivery lock poisoned").replies.remove(&id);
                Delivered::Failed(Status::deadline_exceeded(format!("no reply within {within:?}")))
            }
        }
    }

    /// Sends a release to `node` on its stream; handed back when it must go
    /// as a call (the peer has no stream, or the stream has ended). Like the
    /// call, best effort: a release lost with its stream frees the slots at
    /// the activation timeout.
    pub fn release(
        &self,
        peers: &PeerChannels,
        node: NodeId,
        request: ReleaseJobsRequest,
    ) -> Result<(), ReleaseJobsRequest> {
        let Some(stream) = self.stream(peers, node) else { return Err(request) };
        if stream.waiting.lock().expect("delivery lock poisoned").closed {
            return Err(request);
        }
        let message = DeliverRequest { release: Some(request), ..Default::default() };
        stream.requests.send(message).map_err(|unsent| unsent.0.release.unwrap_or_default())
    }

    /// The open stream to `node`, opened now if there is none; `None` when
    /// the peer gets calls.
    fn stream(&self, peers: &PeerChannels, node: NodeId) -> Option<Arc<PeerStream>> {
        if self.calls_until.lock().expect("delivery lock poisoned").get(&node).is_some_and(|t| *t > Instant::now()) {
            return None;
        }
        let mut streams = self.peers.lock().expect("delivery lock poisoned");
        if let Some(stream) = streams.get(&node) {
            if !stream.waiting.lock().expect("delivery lock poisoned").closed {
                return Some(Arc::clone(stream));
            }
        }
        let client = peers.client(node)?;
        let (requests, outgoing) = mpsc::unbounded_channel();
        let stream = Arc::new(PeerStream { requests, next_id: AtomicU64::new(0), waiting: Default::default() });
        streams.insert(node, Arc::clone(&stream));
        tokio::spawn(run(Arc::clone(&stream), client, outgoing, node, Arc::clone(&self.calls_until)));
        Some(stream)
    }
}

/// Runs one `Deliver` call: hands each reply to its request, and when the
/// call ends answers every request still waiting with why.
async fn run(
    stream: Arc<PeerStream>,
    mut client: super::PeerClient,
    outgoing: mpsc::UnboundedReceiver<DeliverRequest>,
    node: NodeId,
    calls_until: Arc<Mutex<HashMap<NodeId, Instant>>>,
) {
    let ended = match client.deliver(tokio_stream::wrappers::UnboundedReceiverStream::new(outgoing)).await {
        Ok(response) => {
            let mut replies = response.into_inner();
            loop {
                match replies.message().await {
                    Ok(Some(reply)) => {
                        let waiting = stream.waiting.lock().expect("delivery lock poisoned").replies.remove(&reply.id);
                        if let Some(waiting) = waiting {
                            let _ = waiting.send(Ok(reply));
                        }
                    }
                    Ok(None) => break Status::unavailable("the peer ended the delivery stream"),
                    Err(status) => break status,
                }
            }
        }
        Err(status) => {
            if status.code() == tonic::Code::Unimplemented {
                tracing::info!(
                    peer = node,
                    "peer has no delivery stream; pushes and forwards to it go as calls for a while"
                );
                calls_until
                    .lock()
                    .expect("delivery lock poisoned")
                    .insert(node, Instant::now() + CALLS_AFTER_UNIMPLEMENTED);
            }
            status
        }
    };
    let waiting = {
        let mut waiting = stream.waiting.lock().expect("delivery lock poisoned");
        waiting.closed = true;
        std::mem::take(&mut waiting.replies)
    };
    for (_, reply) in waiting {
        let _ = reply.send(Err(ended.clone()));
    }
}
