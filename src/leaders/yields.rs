//! Pushed activations that never reached a worker, handed back to their
//! partitions at once (yielded) instead of at their activation timeout: from
//! a client stream that closed with jobs in its buffer, or a push whose
//! answer came after its leader stopped waiting.

use std::time::Instant;

use super::fanout::run_chunk;
use crate::context::NodeContext;
use crate::core::{Command, JobKey, YieldReason};

/// Yields pushed activations that never reached a worker, for `reason`, so
/// their jobs go to another worker now rather than at their activation
/// timeout. An activation that ended meanwhile is left as it is (the yield
/// names its attempt).
pub async fn hand_back(ctx: &NodeContext, activations: Vec<(JobKey, u32)>, reason: YieldReason) {
    if activations.is_empty() {
        return;
    }
    let gateway = ctx.topology.node_id;
    let yields =
        activations.into_iter().map(|(key, attempt)| Command::Yield { key, attempt, gateway, reason }).collect();
    let yielded = run_yields(ctx, yields).await;
    let reason = match reason {
        YieldReason::Late => "late",
        YieldReason::StreamClosed => "stream_closed",
        YieldReason::NotReady => "not_ready",
        YieldReason::Unknown => "unknown",
    };
    metrics::counter!("drover_gateway_job_stream_handed_back_total", "reason" => reason).increment(yielded as u64);
}

/// Runs `yields` ([`Command::Yield`]; other commands are skipped) at their
/// partitions' leaders, wherever those are, within the request timeout: how
/// many made their job activatable again. A yield of an activation that has
/// moved on (completed, timed out, activated again) is refused, and not counted.
pub async fn run_yields(ctx: &NodeContext, yields: Vec<Command>) -> usize {
    let commands = yields
        .into_iter()
        .filter_map(|command| {
            let partition = match &command {
                Command::Yield { key, .. } => key.partition(),
                _ => return None,
            };
            Some(Ok((partition, command)))
        })
        .collect();
    let deadline = Instant::now() + ctx.settings.request_timeout;
    run_chunk(ctx, None, commands, deadline).await.iter().filter(|result| result.is_ok()).count()
}
