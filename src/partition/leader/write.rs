//! One Raft write of a leader's batch, and the hand-back of its results to
//! whoever submitted each command (with the per-outcome metrics).

use std::sync::Arc;
use std::time::Instant;

use ractor::ActorRef;

use super::*;

/// One Raft write and the hand-back of its results.
pub(super) async fn write(
    replica: Arc<Replica>,
    link: Arc<dyn GatewayLink>,
    batch: Batch,
    replies: Vec<(usize, ReplyTo)>,
    leader: ActorRef<LeaderMsg>,
) {
    let partition = replica.partition;
    let started = Instant::now();
    match replica.write(batch).await {
        Ok(response) => {
            metrics::histogram!("drover_raft_append_to_commit_seconds").record(started.elapsed().as_secs_f64());
            stages::record(Stage::RaftWrite, started.elapsed());
            let mut results = response.results.into_iter();
            for (count, reply) in replies {
                let chunk: Vec<CommandResult> = results.by_ref().take(count).collect();
                match reply {
                    ReplyTo::Client(port) => {
                        let _ = port.send(Ok(chunk));
                    }
                    ReplyTo::Push(ticket) => {
                        tokio::spawn(push(Arc::clone(&link), partition, ticket, chunk, leader.clone()));
                    }
                    ReplyTo::TakeOver => {
                        let _ = leader.cast(LeaderMsg::TookOver);
                    }
                    ReplyTo::Yields(refused) => refused.written(),
                    ReplyTo::Ignore => {}
                }
            }
            let p = partition.to_string();
            for (job_type, outcome, count) in response.outcomes {
                let job_type = crate::metrics::job_type_label(job_type);
                metrics::counter!("drover_jobs_total", "partition" => p.clone(), "type" => job_type, "outcome" => outcome.as_str())
                    .increment(count);
            }
            for (kind, what) in response.workflows {
                metrics::counter!("drover_workflows_total", "kind" => kind, "event" => what).increment(1);
            }
            for (job_type, reason, worker) in response.failures {
                let job_type = crate::metrics::job_type_label(job_type);
                metrics::counter!("drover_job_failures_total", "type" => job_type, "reason" => reason.as_str())
                    .increment(1);
                if reason == crate::core::FailReason::InternalError {
                    // Which machine keeps failing: bounded like job types.
                    let worker = crate::metrics::job_type_label(worker);
                    metrics::counter!("drover_worker_internal_errors_total", "worker" => worker).increment(1);
                }
            }
            for (job_type, stage) in response.checkpoints {
                let job_type = crate::metrics::job_type_label(job_type);
                let stage = crate::metrics::job_type_label(stage);
                metrics::counter!("drover_job_checkpoints_total", "type" => job_type, "stage" => stage).increment(1);
            }
            for ms in &response.created_to_activated {
                metrics::histogram!("drover_job_create_to_activate_seconds").record(*ms as f64 / 1000.0);
            }
            for ms in &response.activated_to_completed {
                metrics::histogram!("drover_job_activate_to_complete_seconds").record(*ms as f64 / 1000.0);
            }
            let _ = leader.cast(LeaderMsg::Written {
                available: response.available,
                next_timer: response.next_timer,
                error: None,
            });
        }
        Err(error) => {
            let error = SubmitError::from(&error);
            for (_, reply) in replies {
                match reply {
                    ReplyTo::Client(port) => {
                        let _ = port.send(Err(error.clone()));
                    }
                    ReplyTo::Push(PushTicket { stream, reservation, offer }) => {
                        if let Some(offer) = offer {
                            // Nothing will be pushed: the gateway offers the room elsewhere.
                            let _ = offer.send(false);
                        }
                        let _ = leader.cast(LeaderMsg::PushDone(PushReport::empty(stream, reservation)));
                    }
                    // Not written here: dropped, the partition's leader yields them.
                    ReplyTo::Yields(_) | ReplyTo::TakeOver | ReplyTo::Ignore => {}
                }
            }
            let _ = leader.cast(LeaderMsg::Written { available: Vec::new(), next_timer: None, error: Some(error) });
        }
    }
}
