//! Starts a partition's leader actor while this node leads it, and stops it
//! when leadership moves. A leader actor that dies is started again while the
//! node still leads. An actor belongs to one term: when the node lost and
//! regained leadership between two looks, the old actor stops and a new one
//! starts, so it takes over (timers, pushes) as every new leader does.
//!
//! A leader that is not where the partition prefers its leader (leader
//! balance, leader regions: [`crate::context::Topology::preferred_leaders_of`]) hands
//! leadership there once it has led for [`SETTLE`] and the preferred replica
//! is close behind.
//!
//! Before leadership moves on purpose (that hand-over, or the node
//! stopping), the actor drains first ([`LeaderMsg::Drain`]): its writes in
//! flight commit and their pushes are answered, so no job it activated is left
//! for its activation timeout because the push came back refused after the
//! actor had gone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::rpc::CallResult;
use ractor::{Actor, ActorRef};
use tokio::sync::watch;

use crate::cluster::Links;
use crate::context::NodeContext;
use crate::partition::{LeaderArgs, LeaderMsg, PartitionLeader};
use crate::raft::Replica;
use crate::tasks::LoopStatus;

/// How often a leader that is not the preferred one looks at the preferred
/// replica.
const PREFERRED_CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long a node leads before it hands leadership to the preferred
/// replica: a replica that has just come back (or a leader just elected,
/// whose followers still honour its lease and would refuse the hand-over)
/// settles first, and a flapping replica cannot pull leadership back and
/// forth faster than this.
pub(super) const SETTLE: Duration = Duration::from_secs(5);
/// How long a preferred replica must have answered without a gap before
/// leadership moves to it.
const STEADY: Duration = Duration::from_secs(10);
/// A preferred replica at most this many entries behind is close enough to
/// hand leadership to (under load a replica a round trip away is never
/// exactly caught up; the hand-over waits for it to hold the whole log).
const HANDOVER_LAG: u64 = 1_000;
/// How long a hand-over to the preferred replica may take before it is
/// given up.
const HANDOVER_LIMIT: Duration = Duration::from_secs(2);
/// After a failed hand-over, the next try waits this long.
const RETRY_AFTER: Duration = Duration::from_secs(10);
/// How long a leader actor may take to drain (its writes in flight and
/// their pushes) before a planned stop stops it anyway. A drain usually takes
/// a commit and a push, a few milliseconds; a push to a gateway that does not
/// answer can take longer (up to 4 s), and the hand-over that follows has
/// 3 s in all before a SIGTERMed node gives up on it, so the drain gets 2.
const DRAIN_WITHIN: Duration = Duration::from_secs(2);

/// How often a leader looks again at whether it is cut off from its majority
/// (or has heard from it again), besides every change of leadership: a tenth
/// of a second on top of the election timeouts the check waits for.
const LEADER_LOOK_EVERY: Duration = Duration::from_millis(100);
/// How often a replica that does not lead looks again without a change of
/// leadership (an actor that stopped, a replica the plan moved away).
const FOLLOWER_LOOK_EVERY: Duration = Duration::from_millis(500);

type Running = (ActorRef<LeaderMsg>, tokio::task::JoinHandle<()>);

/// Stops a leader actor. When leadership is about to move on purpose
/// (`drain`), the actor first finishes what it started, for at most
/// [`DRAIN_WITHIN`], while requests on this node still reach it (it refuses
/// them, and they are tried again); otherwise it stops at once.
async fn stop_leader(ctx: &NodeContext, partition: u32, (actor, handle): Running, why: &str, drain: bool) {
    if drain {
        let started = Instant::now();
        match actor.call(|reply| LeaderMsg::Drain { reply }, Some(DRAIN_WITHIN)).await {
            Ok(CallResult::Success(())) => {
                metrics::histogram!("drover_partition_leader_drain_seconds").record(started.elapsed().as_secs_f64())
            }
            Ok(CallResult::Timeout) => tracing::warn!(
                partition,
                "the leader did not finish its writes and pushes in flight within {DRAIN_WITHIN:?}; it stops anyway \
                 (jobs a gateway refuses after this are yielded at the partition's next leader, from this node \
                 while it runs)"
            ),
            // The actor stopped on its own (it lost leadership).
            _ => {}
        }
    }
    ctx.routing.set_local_leader(partition, None);
    actor.stop(Some(why.into()));
    let _ = handle.await;
}

pub(crate) async fn lead_while_leader(
    ctx: Arc<NodeContext>,
    replica: Arc<Replica>,
    mut stop: watch::Receiver<bool>,
    status: LoopStatus,
) {
    let partition = replica.partition;
    let mut metrics = replica.watch();
    let mut running: Option<Running> = None;
    let mut running_term = 0;
    let mut next_preferred_check = Instant::now();
    loop {
        // A stopping node starts no leader actor (a failed hand-over below
        // comes back here): its shutdown hands leadership away.
        if *stop.borrow() {
            break;
        }
        // The cluster plan moved the replica away: its loop ends.
        if !ctx.routing.replica(partition).is_some_and(|r| Arc::ptr_eq(&r, &replica)) {
            if let Some(running) = running.take() {
                stop_leader(&ctx, partition, running, "the replica moved to other nodes", false).await;
            }
            break;
        }
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
                ctx.routing.set_local_leader(partition, None);
                running = None;
            }
        }
        if running.is_some() && leadership.term != running_term {
            if let Some(running) = running.take() {
                stop_leader(&ctx, partition, running, "a new term began", false).await;
            }
        }
        match (leads, running.is_some()) {
            (true, false) => {
                let args = LeaderArgs {
                    replica: Arc::clone(&replica),
                    streams: Arc::clone(&ctx.broker.streams),
                    link: Arc::new(Links::new(Arc::downgrade(&ctx))),
                    retention: ctx.settings.retention,
                    locality: Arc::clone(&ctx.broker.locality),
                };
                match Actor::spawn(None, PartitionLeader, args).await {
                    Ok((actor, handle)) => {
                        ctx.routing.set_local_leader(partition, Some(actor.clone()));
                        running = Some((actor, handle));
                        if running_term != leadership.term {
                            // A new term: it settles before handing over.
                            next_preferred_check = next_preferred_check.max(Instant::now() + SETTLE);
                        }
                        running_term = leadership.term;
                    }
                    Err(e) => {
                        tracing::error!(partition, "starting the partition leader failed: {e}");
                        status.error(format!("starting the partition leader failed: {e}"));
                    }
                }
            }
            (false, true) => {
                if let Some(running) = running.take() {
                    stop_leader(&ctx, partition, running, "leadership moved", false).await;
                }
            }
            (true, true) if Instant::now() >= next_preferred_check => {
                next_preferred_check = Instant::now() + PREFERRED_CHECK_EVERY;
                // Only replicas that have answered steadily: a stopped
                // node's last position stays in the leader's view of it, and
                // one that comes and goes (a flapping link) would pull
                // leadership into every next fault.
                let preferred: Vec<_> = ctx
                    .topology
                    .preferred_leaders_of(partition)
                    .into_iter()
                    .filter(|n| ctx.transport.peers.answering_for(*n) >= STEADY)
                    .collect();
                if !preferred.is_empty() && replica.lag_of(&preferred).is_some_and(|lag| lag <= HANDOVER_LAG) {
                    // A preferred replica close behind: leadership moves
                    // there. The actor drains and stops first, so the log
                    // stands still and the replica catches up with all of it.
                    if let Some(running) = running.take() {
                        stop_leader(&ctx, partition, running, "handing leadership to the preferred replica", true)
                            .await;
                    }
                    match crate::cluster::hand_over_to_preferred(&ctx, &replica, &preferred, HANDOVER_LIMIT).await {
                        Ok(to) => {
                            metrics::counter!("drover_leader_handovers_total", "reason" => "preferred").increment(1);
                            tracing::info!(partition, to, "handed leadership to the partition's preferred replica");
                        }
                        Err(why) => {
                            metrics::counter!("drover_leader_handovers_failed_total", "reason" => "preferred")
                                .increment(1);
                            tracing::warn!(partition, "could not hand leadership to the preferred replica: {why}");
                            status.error(format!("could not hand leadership to the preferred replica: {why}"));
                            next_preferred_check = Instant::now() + RETRY_AFTER;
                        }
                    }
                    // Still leading (it failed): the next look starts the actor again.
                    continue;
                }
            }
            _ => {}
        }
        status.set(match (&running, leadership.leader) {
            (Some(_), _) => format!("leading in term {running_term}"),
            (None, _) if cut_off => "leader cut off from its majority: taking no requests".to_string(),
            (None, Some(leader)) => format!("following node {leader} in term {}", leadership.term),
            (None, None) => format!("no leader known in term {}", leadership.term),
        });
        // `metrics` changes with leadership, not with the log: whether a
        // leader is cut off from its majority (and when it hears from it
        // again) is looked at on this timer, as is a leader actor that
        // stopped on its own.
        let look_again = if leadership.is_leader { LEADER_LOOK_EVERY } else { FOLLOWER_LOOK_EVERY };
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { break },
            _ = stop.wait_for(|s| *s) => break,
            _ = tokio::time::sleep(look_again) => {}
        }
    }
    match running.take() {
        // Its shutdown hands leadership away once the actor has stopped.
        Some(running) => stop_leader(&ctx, partition, running, "node stopping", true).await,
        None => ctx.routing.set_local_leader(partition, None),
    }
}
