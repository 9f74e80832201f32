//! What a node learns of the times of partitions it hosts no replica of:
//! every [`ASK_EVERY`], each such partition's time as a node hosting it
//! estimates it (its `Status`). The gateway uses it to mint job tokens that
//! expire by the partition's time, not by its own wall clock
//! ([`crate::context::Routing::local_time`]). Only while job tokens are on.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::context::NodeContext;
use crate::tasks::LoopStatus;

/// How often the estimates are asked for again: well within the time an
/// estimate is used for.
const ASK_EVERY: Duration = Duration::from_secs(10);
/// How soon they are asked for again when some did not come.
const RETRY_AFTER: Duration = Duration::from_secs(1);

pub async fn learn_partition_clocks(ctx: Arc<NodeContext>, mut stop: watch::Receiver<bool>, status: LoopStatus) {
    if !ctx.auth.mints_job_tokens() {
        status.set("not needed: this node hands out no job tokens".to_string());
        return;
    }
    loop {
        // Looked at each round: the cluster plan moves replicas.
        let remote = ctx.routing.remote_partitions();
        let mut heard = BTreeSet::new();
        for partition in &remote {
            if heard.contains(partition) {
                continue;
            }
            // Any node that hosts the partition, asked once for every
            // partition it hosts.
            for node in ctx.topology.replica_nodes(*partition) {
                let Some(reply) = ctx.transport.peers.status(node, Duration::from_secs(1)).await else { continue };
                for clock in reply.partition_clocks {
                    if remote.contains(&clock.partition_id) && heard.insert(clock.partition_id) {
                        ctx.routing.heard_partition_time(clock.partition_id, clock.estimate_ms);
                    }
                }
                if heard.contains(partition) {
                    break;
                }
            }
        }
        let missing = remote.len() - heard.len();
        if missing > 0 {
            status.error(format!("no node hosting them gave the time of {missing} of {} partitions", remote.len()));
        } else {
            status.set(format!("the times of {} partitions hosted elsewhere heard", remote.len()));
        }
        // Soon again while some are missing (peers still starting).
        let wait = if missing > 0 { RETRY_AFTER } else { ASK_EVERY };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
