//! The gateway's side of job streaming: worker streams aggregated by
//! equivalence, and the hand-off of pushed jobs to a ready client.
//!
//! Two worker streams are equivalent when they ask for the same job type,
//! worker name, activation timeout, set of fetch variables and set of tenants
//! (order and repeats do not matter). Equivalent streams share one aggregated
//! stream id, registered once with every broker. Each client has a bounded
//! buffer; a client is ready while its buffer has room, and the buffer stops
//! draining when the client stops reading (HTTP/2 flow control), so a slow worker
//! becomes "not ready" and its jobs go elsewhere.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::task::{Context, Poll};

use rand::Rng;
use serde::Serialize;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio_stream::Stream;
use tonic::Status;

use super::convert::{self, WorkerSpec};
use crate::core::{ActivatedJobData, JobKey};
use crate::partition::streams::RemoteStream;
use crate::proto::gateway as pb;
use crate::raft::NodeId;

/// Jobs buffered per client beyond what HTTP/2 already holds.
pub const CLIENT_BUFFER: usize = 16;

type ClientSender = mpsc::Sender<Result<pb::ActivatedJob, Status>>;

/// The equivalence key of worker streams.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct StreamKey {
    pub job_type: String,
    pub worker: String,
    pub timeout_ms: i64,
    pub fetch_variables: Vec<String>,
    pub tenants: Vec<String>,
}

impl From<&WorkerSpec> for StreamKey {
    fn from(spec: &WorkerSpec) -> Self {
        // WorkerSpec already holds fetch variables and tenants sorted and deduplicated.
        StreamKey {
            job_type: spec.job_type.clone(),
            worker: spec.worker.clone(),
            timeout_ms: spec.timeout_ms,
            fetch_variables: spec.fetch_variables.clone(),
            tenants: spec.tenants.clone(),
        }
    }
}

struct Client {
    id: u64,
    tx: ClientSender,
}

struct Aggregate {
    key: StreamKey,
    clients: Vec<Client>,
}

#[derive(Default)]
struct Inner {
    by_key: HashMap<StreamKey, u64>,
    streams: HashMap<u64, Aggregate>,
}

/// All aggregated streams of this gateway.
pub struct GatewayStreams {
    node_id: NodeId,
    next_id: AtomicU64,
    inner: Mutex<Inner>,
}

/// A client's place in an aggregated stream.
pub struct Opened {
    pub stream_id: u64,
    pub client_id: u64,
    pub receiver: mpsc::Receiver<Result<pb::ActivatedJob, Status>>,
    /// Set when this client created the aggregated stream: register it.
    pub new_stream: Option<RemoteStream>,
}

/// The `client` view of `/actuator/jobstreams`.
#[derive(Serialize)]
pub struct ClientStreamView {
    pub id: u64,
    pub key: StreamKey,
    pub clients: Vec<u64>,
}

impl GatewayStreams {
    pub fn new(node_id: NodeId) -> Self {
        GatewayStreams { node_id, next_id: AtomicU64::new(1), inner: Mutex::new(Inner::default()) }
    }

    fn remote(&self, stream_id: u64, key: &StreamKey) -> RemoteStream {
        RemoteStream {
            gateway: self.node_id,
            stream_id,
            job_type: key.job_type.clone(),
            worker: key.worker.clone(),
            timeout_ms: key.timeout_ms,
            tenants: key.tenants.clone(),
            fetch_variables: key.fetch_variables.clone(),
        }
    }

    pub fn open(&self, spec: &WorkerSpec) -> Opened {
        let key = StreamKey::from(spec);
        let (tx, receiver) = mpsc::channel(CLIENT_BUFFER);
        let client_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut inner = self.inner.lock().expect("gateway streams lock");
        let (stream_id, new_stream) = match inner.by_key.get(&key) {
            Some(id) => (*id, None),
            None => {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                inner.by_key.insert(key.clone(), id);
                inner.streams.insert(id, Aggregate { key: key.clone(), clients: Vec::new() });
                metrics::gauge!("drover_gateway_job_stream_streams").increment(1.0);
                (id, Some(self.remote(id, &key)))
            }
        };
        inner.streams.get_mut(&stream_id).expect("just ensured").clients.push(Client { id: client_id, tx });
        metrics::gauge!("drover_gateway_job_stream_clients").increment(1.0);
        Opened { stream_id, client_id, receiver, new_stream }
    }

    /// Removes a client; returns the stream when it was the last one, to be
    /// removed from the brokers.
    pub fn close(&self, stream_id: u64, client_id: u64) -> Option<RemoteStream> {
        let mut inner = self.inner.lock().expect("gateway streams lock");
        let aggregate = inner.streams.get_mut(&stream_id)?;
        let before = aggregate.clients.len();
        aggregate.clients.retain(|c| c.id != client_id);
        if aggregate.clients.len() < before {
            metrics::gauge!("drover_gateway_job_stream_clients").decrement(1.0);
        }
        if !aggregate.clients.is_empty() {
            return None;
        }
        let aggregate = inner.streams.remove(&stream_id).expect("present");
        inner.by_key.remove(&aggregate.key);
        metrics::gauge!("drover_gateway_job_stream_streams").decrement(1.0);
        Some(self.remote(stream_id, &aggregate.key))
    }

    /// Hands pushed jobs to ready clients, each to one picked at random (trying
    /// the others when the pick is not ready). Returns the keys nobody took.
    pub fn push(&self, stream_id: u64, jobs: Vec<ActivatedJobData>) -> Vec<JobKey> {
        let inner = self.inner.lock().expect("gateway streams lock");
        let Some(aggregate) = inner.streams.get(&stream_id) else {
            return jobs.iter().map(|j| j.key).collect();
        };
        let mut rejected = Vec::new();
        let mut rng = rand::rng();
        for job in jobs {
            let count = aggregate.clients.len();
            let mut message = Some(Ok(convert::activated_job(&job, &aggregate.key.fetch_variables)));
            if count > 0 {
                let start = rng.random_range(0..count);
                for offset in 0..count {
                    let client = &aggregate.clients[(start + offset) % count];
                    match client.tx.try_send(message.take().expect("message present")) {
                        Ok(()) => break,
                        Err(TrySendError::Full(m) | TrySendError::Closed(m)) => {
                            metrics::counter!("drover_gateway_job_stream_push_fail_try_total").increment(1);
                            message = Some(m);
                        }
                    }
                }
            }
            if message.is_some() {
                rejected.push(job.key);
            } else {
                metrics::counter!("drover_gateway_job_stream_push_total").increment(1);
            }
        }
        rejected
    }

    /// Ends every client stream (node shutdown): workers see their stream
    /// close and reconnect elsewhere.
    pub fn close_all(&self) {
        let mut inner = self.inner.lock().expect("gateway streams lock");
        inner.by_key.clear();
        inner.streams.clear();
    }

    /// Every aggregated stream, for (re-)registration with brokers.
    pub fn registrations(&self) -> Vec<RemoteStream> {
        let inner = self.inner.lock().expect("gateway streams lock");
        inner.streams.iter().map(|(id, a)| self.remote(*id, &a.key)).collect()
    }

    pub fn view(&self) -> Vec<ClientStreamView> {
        let inner = self.inner.lock().expect("gateway streams lock");
        let mut views: Vec<ClientStreamView> = inner
            .streams
            .iter()
            .map(|(id, a)| ClientStreamView {
                id: *id,
                key: a.key.clone(),
                clients: a.clients.iter().map(|c| c.id).collect(),
            })
            .collect();
        views.sort_by_key(|v| v.id);
        views
    }
}

/// A worker's end of an aggregated stream. Dropping it (the worker went away)
/// leaves the aggregate and hands back every job still buffered for it, so
/// those jobs do not wait for their activation timeout.
pub struct ClientStream {
    receiver: mpsc::Receiver<Result<pb::ActivatedJob, Status>>,
    on_close: Option<OnClose>,
    /// Set after handing out a job: the next poll says Pending once, so the
    /// encoder sends each job in its own chunk instead of draining the buffer
    /// into a write it cannot take back. Jobs left in the buffer can then be
    /// handed back when the client goes away.
    just_yielded: bool,
}

impl ClientStream {
    pub fn new(receiver: mpsc::Receiver<Result<pb::ActivatedJob, Status>>, on_close: OnClose) -> Self {
        ClientStream { receiver, on_close: Some(on_close), just_yielded: false }
    }
}

/// Runs when a client stream ends, with the (key, attempt) of every job still
/// buffered for it.
pub type OnClose = Box<dyn FnOnce(Vec<(JobKey, u32)>) + Send>;

impl Stream for ClientStream {
    type Item = Result<pb::ActivatedJob, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.just_yielded {
            self.just_yielded = false;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let next = self.receiver.poll_recv(cx);
        self.just_yielded = matches!(next, Poll::Ready(Some(_)));
        next
    }
}

impl Drop for ClientStream {
    fn drop(&mut self) {
        self.receiver.close();
        let mut buffered = Vec::new();
        while let Ok(item) = self.receiver.try_recv() {
            if let Ok(job) = item {
                buffered.push((JobKey(job.key), job.attempt));
            }
        }
        if let Some(on_close) = self.on_close.take() {
            on_close(buffered);
        }
    }
}

/// Keeps the client-side of the actuator and push path testable alone.
#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn spec(timeout_ms: i64, fetch: &[&str]) -> WorkerSpec {
        convert::worker_spec("t".into(), "w".into(), timeout_ms, fetch.iter().map(|s| s.to_string()).collect(), vec![])
            .unwrap()
    }

    #[test]
    fn equivalent_streams_aggregate_regardless_of_order() {
        let streams = GatewayStreams::new(0);
        let a = streams.open(&spec(1000, &["x", "y"]));
        let b = streams.open(&spec(1000, &["y", "x", "x"]));
        let c = streams.open(&spec(2000, &["x", "y"]));
        assert!(a.new_stream.is_some());
        assert!(b.new_stream.is_none());
        assert_eq!(a.stream_id, b.stream_id);
        assert_ne!(a.stream_id, c.stream_id);
        assert_eq!(streams.close(a.stream_id, a.client_id), None);
        assert!(streams.close(b.stream_id, b.client_id).is_some(), "last client removes the stream");
    }

    #[test]
    fn full_clients_reject_pushes() {
        let streams = GatewayStreams::new(0);
        let opened = streams.open(&spec(1000, &[]));
        let job = |n: u64| ActivatedJobData {
            key: JobKey(n),
            spec: Arc::new(crate::core::JobSpec {
                job_type: "t".into(),
                tenant: crate::core::DEFAULT_TENANT.into(),
                variables: "{}".into(),
                custom_headers: vec![],
                priority: 0,
                idempotency_key: String::new(),
                traceparent: String::new(),
            }),
            worker: "w".into(),
            retries: 3,
            deadline: 0,
            attempt: 1,
            created_at: 0,
        };
        let jobs: Vec<_> = (1..=(CLIENT_BUFFER as u64 + 3)).map(job).collect();
        let rejected = streams.push(opened.stream_id, jobs);
        assert_eq!(rejected.len(), 3, "the buffer holds {CLIENT_BUFFER}; the rest are not taken");
    }
}
