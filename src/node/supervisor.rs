//! Starts a partition's leader actor while this node leads it, and stops it
//! when leadership moves. A leader actor that dies is started again while the
//! node still leads. An actor belongs to one term: when the node lost and
//! regained leadership between two looks, the old actor stops and a new one
//! starts, so it takes over (timers, pushes) as every new leader does.

use std::sync::Arc;
use std::time::Duration;

use ractor::Actor;
use tokio::sync::watch;

use super::NodeContext;
use crate::cluster::Links;
use crate::partition::{LeaderArgs, PartitionLeader};
use crate::raft::Replica;

pub(super) async fn lead_while_leader(ctx: Arc<NodeContext>, replica: Arc<Replica>, mut stop: watch::Receiver<bool>) {
    let partition = replica.partition;
    let mut metrics = replica.watch();
    let mut running: Option<(ractor::ActorRef<crate::partition::LeaderMsg>, tokio::task::JoinHandle<()>)> = None;
    let mut running_term = 0;
    loop {
        let leadership = replica.leadership();
        let leads = leadership.is_leader;
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
