//! Starts a partition's leader actor while this node leads it, and stops it
//! when leadership moves. A leader actor that dies is started again while the
//! node still leads. An actor belongs to one term: when the node lost and
//! regained leadership between two looks, the old actor stops and a new one
//! starts, so it takes over (timers, pushes) as every new leader does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::Actor;
use tokio::sync::watch;

use super::NodeContext;
use crate::cluster::Links;
use crate::partition::{LeaderArgs, PartitionLeader};
use crate::raft::Replica;

/// How often a leader outside the leader regions looks for a replica there.
const REGION_CHECK_EVERY: Duration = Duration::from_secs(1);
/// A replica in a leader region at most this many entries behind is close
/// enough to hand leadership to (under load a replica a round trip away is
/// never exactly caught up).
const REGION_HANDOVER_LAG: u64 = 1_000;
/// How long a hand-over to a leader region may take before it is given up.
const REGION_HANDOVER_LIMIT: Duration = Duration::from_secs(2);
/// After a failed hand-over, the next try waits this long.
const REGION_RETRY_AFTER: Duration = Duration::from_secs(10);

pub(super) async fn lead_while_leader(ctx: Arc<NodeContext>, replica: Arc<Replica>, mut stop: watch::Receiver<bool>) {
    let partition = replica.partition;
    let mut metrics = replica.watch();
    let mut running: Option<(ractor::ActorRef<crate::partition::LeaderMsg>, tokio::task::JoinHandle<()>)> = None;
    let mut running_term = 0;
    let mut next_region_check = Instant::now();
    loop {
        let leadership = replica.leadership();
        // A leader cut off from its majority commits nothing: its actor
        // stops, so requests here fail at once instead of waiting for a
        // commit that cannot come, and starts again once a majority answers.
        let cut_off = leadership.is_leader && replica.cut_off();
        if cut_off && running.is_some() {
            tracing::warn!(
                partition,
                "this node leads the partition but no majority of its replicas has answered for longer than an \
                 election timeout: it stops taking requests until one does (or another replica is elected)"
            );
        }
        let leads = leadership.is_leader && !cut_off;
        if let Some((_, handle)) = &running {
            if handle.is_finished() {
                ctx.set_local_leader(partition, None);
                running = None;
            }
        }
        if running.is_some() && leadership.term != running_term {
            ctx.set_local_leader(partition, None);
            if let Some((actor, handle)) = running.take() {
                actor.stop(Some("a new term began".into()));
                let _ = handle.await;
            }
        }
        match (leads, running.is_some()) {
            (true, false) => {
                let args = LeaderArgs {
                    replica: Arc::clone(&replica),
                    streams: Arc::clone(&ctx.broker_streams),
                    link: Arc::new(Links::new(Arc::downgrade(&ctx))),
                    retention: ctx.retention,
                    locality: Arc::clone(&ctx.locality),
                };
                match Actor::spawn(None, PartitionLeader, args).await {
                    Ok((actor, handle)) => {
                        ctx.set_local_leader(partition, Some(actor.clone()));
                        running = Some((actor, handle));
                        running_term = leadership.term;
                    }
                    Err(e) => tracing::error!(partition, "starting the partition leader failed: {e}"),
                }
            }
            (false, true) => {
                ctx.set_local_leader(partition, None);
                if let Some((actor, handle)) = running.take() {
                    actor.stop(Some("leadership moved".into()));
                    let _ = handle.await;
                }
            }
            (true, true) if Instant::now() >= next_region_check => {
                next_region_check = Instant::now() + REGION_CHECK_EVERY;
                let preferred = crate::cluster::leader_region_nodes(&ctx, partition);
                if !preferred.is_empty() && replica.lag_of(&preferred).is_some_and(|lag| lag <= REGION_HANDOVER_LAG) {
                    // A replica in a leader region close behind: leadership
                    // moves there. The actor stops first, so the log stands
                    // still and the replica catches up with all of it.
                    ctx.set_local_leader(partition, None);
                    if let Some((actor, handle)) = running.take() {
                        actor.stop(Some("handing leadership to a leader region".into()));
                        let _ = handle.await;
                    }
                    match crate::cluster::hand_over_to_region(&ctx, &replica, REGION_HANDOVER_LIMIT).await {
                        Ok(to) => tracing::info!(partition, to, "handed leadership to a leader region"),
                        Err(why) => {
                            tracing::warn!(partition, "could not hand leadership to a leader region: {why}");
                            next_region_check = Instant::now() + REGION_RETRY_AFTER;
                        }
                    }
                    // Still leading (it failed): the next look starts the actor again.
                    continue;
                }
            }
            _ => {}
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { break },
            _ = stop.wait_for(|s| *s) => break,
            // Also notice a leader actor that stopped on its own.
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
    ctx.set_local_leader(partition, None);
    if let Some((actor, handle)) = running.take() {
        actor.stop(Some("node stopping".into()));
        let _ = handle.await;
    }
}
