//! Handing leadership away: before a node stops (SIGTERM, as Kubernetes
//! stops a pod), without which every partition the node led is leaderless
//! until its followers' election timeout runs out, seconds in which no
//! create or completion on those partitions is acknowledged; and to a
//! partition's preferred replica (leader balance, leader regions).

use std::time::{Duration, Instant};

use futures::future::join_all;

use crate::context::NodeContext;
use crate::proto::cluster::CampaignRequest;
use crate::raft::Replica;

/// For every partition this node leads: waits for its leader actor to stop
/// (the node is stopping, so no new entry is proposed), then for a follower
/// to hold the whole log, asks that follower to stand for election, and
/// waits for leadership to move, all within `limit`. A partition whose
/// hand-over fails within it is left to its election timeout, as before.
pub async fn hand_over_leadership(ctx: &NodeContext, limit: Duration) {
    let led: Vec<std::sync::Arc<Replica>> =
        ctx.routing.replicas().into_iter().filter(|r| r.leadership().is_leader).collect();
    if led.is_empty() {
        return;
    }
    let started = Instant::now();
    let deadline = started + limit;
    let outcomes = join_all(led.iter().map(|replica| hand_over(ctx, replica, &[], deadline))).await;
    for (replica, outcome) in led.iter().zip(outcomes) {
        match outcome {
            Ok(to) => {
                metrics::counter!("drover_leader_handovers_total", "reason" => "shutdown").increment(1);
                tracing::info!(
                    partition = replica.partition,
                    to,
                    ms = started.elapsed().as_millis() as u64,
                    "handed leadership over before stopping"
                )
            }
            Err(why) => tracing::warn!(
                partition = replica.partition,
                "could not hand leadership over before stopping ({why}); its followers elect a leader after their \
                 election timeout"
            ),
        }
    }
}

/// Hands leadership of `replica`'s partition to one of `among` (its
/// preferred replicas, [`NodeContext::preferred_leaders_of`]) once it has
/// caught up, within `limit`. The caller has stopped the partition's leader
/// actor, so the log stands still; when the hand-over fails, the caller
/// starts it again.
pub async fn hand_over_to_preferred(
    ctx: &NodeContext,
    replica: &Replica,
    among: &[u64],
    limit: Duration,
) -> Result<u64, String> {
    if among.is_empty() {
        return Err("the partition has no preferred replica to move to".into());
    }
    hand_over(ctx, replica, among, Instant::now() + limit).await
}

async fn hand_over(ctx: &NodeContext, replica: &Replica, among: &[u64], deadline: Instant) -> Result<u64, String> {
    let partition = replica.partition;
    let term = replica.leadership().term;
    // No new entries once the leader actor has stopped.
    while ctx.routing.local_leader(partition).is_some() {
        if Instant::now() > deadline {
            return Err("the leader actor did not stop in time".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let target = loop {
        if !replica.leadership().is_leader {
            return Err("leadership moved on its own".into());
        }
        // Only a follower that answers now: a stopped one's last position
        // stays in this leader's view of it.
        if let Some(target) = replica.handover_target(among, |n| ctx.transport.peers.answered_lately(n)) {
            break target;
        }
        if Instant::now() > deadline {
            return Err("no follower caught up with the log in time".into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let Some(mut client) = ctx.transport.peers.client(target) else {
        return Err(format!("no connection to node {target}"));
    };
    let mut request =
        tonic::Request::new(CampaignRequest { partition_id: partition, leader: ctx.topology.node_id, term });
    request.set_timeout(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1)));
    let reply = client.campaign(request).await.map_err(|s| format!("node {target}: {}", s.message()))?.into_inner();
    if !reply.error.is_empty() {
        return Err(reply.error);
    }
    if replica.leadership_moved(deadline.saturating_duration_since(Instant::now())).await {
        Ok(target)
    } else {
        Err(format!("node {target} stood for election but leadership did not move in time"))
    }
}
