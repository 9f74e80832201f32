//! The `StreamAggregator` actor: one per aggregated stream on a gateway. It
//! owns the stream's clients and hands each pushed job to one of them.
//!
//! It hands out only jobs of its stream's type and tenants (anything else
//! went to the wrong stream and is refused), and nothing from a push that
//! waited in its mailbox past the push's `deliver_by`: the gateway stopped
//! waiting for that answer and reported the outcome as unknown.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use rand::Rng;
use tokio::sync::mpsc::{self, error::TrySendError};
use tonic::Status;

use super::convert;
use super::streams::{Credits, Held, StreamKey};
use crate::core::{ActivatedJobData, JobKey};
use crate::proto::gateway as pb;

pub type ClientSender = mpsc::Sender<Result<pb::ActivatedJob, Status>>;

pub enum AggregatorMsg {
    /// A worker stream joins.
    AddClient { client_id: u64, sender: ClientSender, credits: Arc<Credits>, reply: RpcReplyPort<()> },
    /// A worker stream left; the reply says whether none are left.
    RemoveClient { client_id: u64, reply: RpcReplyPort<bool> },
    /// Jobs pushed by a partition leader; the reply lists the keys no client
    /// took. Handled after `deliver_by`, it hands out none.
    Push { jobs: Vec<ActivatedJobData>, deliver_by: Instant, reply: RpcReplyPort<Vec<JobKey>> },
    /// The ids of the clients, for `/actuator/jobstreams`.
    Clients { reply: RpcReplyPort<Vec<u64>> },
}

pub struct StreamAggregator;

pub struct AggregatorState {
    key: StreamKey,
    held: Arc<Held>,
    /// Test hook: ms the next push waits before it is handled.
    slow_next_push: Arc<AtomicU64>,
    clients: Vec<(u64, ClientSender, Arc<Credits>)>,
}

impl Actor for StreamAggregator {
    type Msg = AggregatorMsg;
    type State = AggregatorState;
    type Arguments = (StreamKey, Arc<Held>, Arc<AtomicU64>);

    async fn pre_start(
        &self,
        _myself: ActorRef<AggregatorMsg>,
        (key, held, slow_next_push): (StreamKey, Arc<Held>, Arc<AtomicU64>),
    ) -> Result<AggregatorState, ActorProcessingErr> {
        Ok(AggregatorState { key, held, slow_next_push, clients: Vec::new() })
    }

    async fn handle(
        &self,
        _myself: ActorRef<AggregatorMsg>,
        message: AggregatorMsg,
        state: &mut AggregatorState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            AggregatorMsg::AddClient { client_id, sender, credits, reply } => {
                state.clients.push((client_id, sender, credits));
                metrics::gauge!("drover_gateway_job_stream_clients").increment(1.0);
                let _ = reply.send(());
            }
            AggregatorMsg::RemoveClient { client_id, reply } => {
                let before = state.clients.len();
                state.clients.retain(|(id, _, _)| *id != client_id);
                if state.clients.len() < before {
                    metrics::gauge!("drover_gateway_job_stream_clients").decrement(1.0);
                }
                let _ = reply.send(state.clients.is_empty());
            }
            AggregatorMsg::Push { jobs, deliver_by, reply } => {
                let delay = state.slow_next_push.swap(0, Ordering::AcqRel);
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                if Instant::now() > deliver_by {
                    metrics::counter!("drover_gateway_job_stream_push_late_total").increment(jobs.len() as u64);
                    let _ = reply.send(jobs.iter().map(|j| j.key).collect());
                } else {
                    let _ = reply.send(state.push(jobs));
                }
            }
            AggregatorMsg::Clients { reply } => {
                let _ = reply.send(state.clients.iter().map(|(id, _, _)| *id).collect());
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<AggregatorMsg>,
        state: &mut AggregatorState,
    ) -> Result<(), ActorProcessingErr> {
        metrics::gauge!("drover_gateway_job_stream_clients").decrement(state.clients.len() as f64);
        Ok(())
    }
}

impl AggregatorState {
    /// Each job goes to a client picked at random; when the pick is not ready
    /// (it holds as many jobs as it allows, or it is gone) the others are tried.
    /// Jobs of another type or tenant are refused.
    fn push(&self, jobs: Vec<ActivatedJobData>) -> Vec<JobKey> {
        let now = Instant::now();
        self.held.expire(now);
        let expires = now + Duration::from_millis(self.key.timeout_ms.max(0) as u64);
        let mut rejected = Vec::new();
        let mut rng = rand::rng();
        let count = self.clients.len();
        for job in jobs {
            if job.spec.job_type != self.key.job_type || !self.key.tenants.contains(&job.spec.tenant) {
                metrics::counter!("drover_gateway_job_stream_push_refused_total").increment(1);
                tracing::warn!(
                    key = %job.key,
                    job_type = %job.spec.job_type,
                    tenant = %job.spec.tenant,
                    "refused a pushed job this stream does not serve"
                );
                rejected.push(job.key);
                continue;
            }
            let mut message = Some(Ok(convert::activated_job(&job, &self.key.fetch_variables)));
            if count > 0 {
                let start = rng.random_range(0..count);
                for offset in 0..count {
                    let (_, client, credits) = &self.clients[(start + offset) % count];
                    if !credits.try_take() {
                        metrics::counter!("drover_gateway_job_stream_push_fail_try_total").increment(1);
                        continue;
                    }
                    match client.try_send(message.take().expect("message present")) {
                        Ok(()) => {
                            self.held.hold(job.key, job.attempt, Arc::clone(credits), expires);
                            break;
                        }
                        Err(TrySendError::Full(m) | TrySendError::Closed(m)) => {
                            credits.give_back();
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
}
