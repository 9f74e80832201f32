//! Follows the cluster plan on this node (`docs/membership.md`):
//!
//! - learns the newest plan: from its own replica of partition 0, whose
//!   state the plan is, or from the nodes that host it (their status
//!   carries the plan they follow);
//! - takes its members and placement ([`crate::context::Topology::follow_plan`]),
//!   dials new members, and records the plan in the data directory so that a
//!   restart starts from it;
//! - opens the replicas the plan places here (empty ones join their group
//!   as learners, copied from its leader) and closes, deleting their data,
//!   those it moved away once their partition reported the move;
//! - and, for each partition this node leads that the plan may move now,
//!   drives its voters to the plan's target: the new replicas are added as
//!   learners and caught up, then one joint-consensus change makes the
//!   target the voters, and the partition reports its voters to the plan;
//! - a partition being added forms on the nodes the plan places it on; its
//!   leader copies partition 0's registrations into it and reports its
//!   voters, and once every new partition has, the count routes work to
//!   them. The counts seen are recorded, for idempotency keys
//!   ([`crate::context::Topology::key_counts`]).
//!
//! Every step is idempotent: whichever node leads a partition after a crash
//! takes up from what the plan and the group's own membership say.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::data_dir;
use crate::context::NodeContext;
use crate::core::{ClusterPlan, Command, NodeId, PartitionId};
use crate::raft::{Formation, RaftSettings, Replica};
use crate::storage::Store;
use crate::tasks::LoopStatus;

/// How often the plan is looked at.
const LOOK_EVERY: Duration = Duration::from_millis(500);
/// How long a new replica may take to copy its partition before the move
/// is tried again (a partition of a few GiB copies well within it).
const CATCH_UP_WITHIN: Duration = Duration::from_secs(600);
/// How long a leader the plan moves away waits for its leadership loop to
/// hand leadership to a replica that stays (it settles for 5 s after an
/// election, then checks every second).
const HAND_OVER_WITHIN: Duration = Duration::from_secs(15);
/// How long a node placed on a partition may take to open its replica (it
/// must be running, and have learned the plan) before the move is tried again.
const OPEN_WITHIN: Duration = Duration::from_secs(30);
/// How long after a new partition's report it copies partition 0's
/// registrations again: gateways learn a plan within [`LOOK_EVERY`].
const ADOPT_AGAIN_AFTER: Duration = Duration::from_secs(2);
/// How long a report of a partition's voters may take.
const REPORT_WITHIN: Duration = Duration::from_secs(5);

/// What opening a replica here takes.
pub(super) struct Hosting {
    pub store: Arc<Store>,
    pub settings: RaftSettings,
    pub data_dir: PathBuf,
    /// The data directory's formation: replicas the plan lists among a
    /// partition's voters open with it (their Raft state must be here once
    /// formed); others are newcomers and join.
    pub formation: Formation,
    /// The leadership loops of replicas opened here, by partition.
    pub loops: Arc<Mutex<BTreeMap<PartitionId, JoinHandle<()>>>>,
}

pub(super) async fn follow_plan(
    ctx: Arc<NodeContext>,
    hosting: Hosting,
    mut stop: watch::Receiver<bool>,
    status: LoopStatus,
) {
    let mut driving = Driving::new();
    let mut recorded_counts = data_dir::read_counts(&hosting.data_dir).ok().flatten().unwrap_or_default();
    loop {
        if let Some(plan) = newest_plan(&ctx).await {
            if ctx.topology.follow_plan(&plan) {
                let members = ctx.topology.members();
                ctx.transport.peers.versions().set_members(members.keys().copied().collect());
                ctx.transport.peers.set_addresses(members);
                // Pushes prefer gateways in this node's region: the plan's
                // members' regions, new nodes included.
                *ctx.broker.locality.regions.write().expect("regions lock") =
                    plan.members.iter().map(|(n, m)| (*n, m.region.clone())).collect();
                if let Err(e) = data_dir::record_plan(&hosting.data_dir, &plan) {
                    status.error(format!("recording cluster plan epoch {}: {e:#}", plan.epoch));
                }
                tracing::info!(epoch = plan.epoch, members = ?plan.members.keys().collect::<Vec<_>>(), "following the cluster plan");
            }
            let counts = ctx.topology.counts();
            if counts != recorded_counts {
                tracing::info!(partitions = ctx.topology.partition_count(), "new work is routed over more partitions");
                match data_dir::record_counts(&hosting.data_dir, &counts) {
                    Ok(()) => recorded_counts = counts,
                    Err(e) => status.error(format!("recording the partition counts seen: {e:#}")),
                }
            }
        }
        match ctx.topology.plan() {
            Some(plan) if !*stop.borrow() => {
                let problems = host(&ctx, &hosting, &plan).await;
                drive(&ctx, &plan, &mut driving);
                let moving = (0..plan.partitions()).filter(|p| plan.moving(*p)).count();
                metrics::gauge!("drover_plan_epoch").set(plan.epoch as f64);
                metrics::gauge!("drover_plan_members").set(plan.members.len() as f64);
                metrics::gauge!("drover_plan_partitions_moving").set(moving as f64);
                metrics::gauge!("drover_plan_moves_pending").set(plan.pending().len() as f64);
                metrics::gauge!("drover_plan_paused").set(if plan.paused { 1.0 } else { 0.0 });
                metrics::gauge!("drover_partitions").set(f64::from(plan.partitions_in_force()));
                let forming = (0..plan.partitions()).filter(|p| plan.forming(*p)).count();
                metrics::gauge!("drover_plan_partitions_forming").set(forming as f64);
                let summary = format!(
                    "plan epoch {}: {} members, {moving} partitions moving{}",
                    plan.epoch,
                    plan.members.len(),
                    if plan.paused { " (paused)" } else { "" }
                );
                match problems {
                    Some(problem) => status.error(format!("{summary}; {problem}")),
                    None => status.set(summary),
                }
            }
            Some(_) => {}
            None => status.set("no plan change yet: the member list's placement holds"),
        }
        tokio::select! {
            _ = tokio::time::sleep(LOOK_EVERY) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    for (_, (task, _)) in driving {
        task.abort();
    }
}

/// The newest plan this node can learn of now: its own replica of partition
/// 0's, or one a node hosting partition 0 follows.
async fn newest_plan(ctx: &NodeContext) -> Option<ClusterPlan> {
    let known = ctx.topology.plan().map_or(0, |p| p.epoch);
    let local = ctx.routing.replica(0);
    let mut newest = local.as_ref().and_then(|r| r.state().plan()).filter(|p| p.epoch > known);
    // A voter of partition 0 learns every plan from its own log.
    if newest.is_some() || local.is_some_and(|r| matches!(r.status().role.as_str(), "leader" | "follower")) {
        return newest;
    }
    // A node without partition 0 (or whose replica is still catching up)
    // asks those that host it; a node being added asks every member it knows.
    let mut ask: Vec<NodeId> = ctx.topology.replica_nodes(0);
    if ctx.topology.plan().is_none() {
        ask.extend(ctx.topology.peers());
    }
    let mut asked = BTreeSet::new();
    for node in ask.into_iter().filter(|n| *n != ctx.topology.node_id) {
        if !asked.insert(node) {
            continue;
        }
        let Some(reply) = ctx.transport.peers.status(node, Duration::from_secs(1)).await else { continue };
        let Ok(plan) = serde_json::from_slice::<ClusterPlan>(&reply.plan) else { continue };
        if plan.epoch > newest.as_ref().map_or(known, |p| p.epoch) {
            newest = Some(plan);
        }
    }
    newest
}

/// Opens the replicas `plan` places here and closes those it moved away;
/// answers what went wrong, if anything.
async fn host(ctx: &Arc<NodeContext>, hosting: &Hosting, plan: &ClusterPlan) -> Option<String> {
    let me = ctx.topology.node_id;
    let mut problems = Vec::new();
    for partition in 0..plan.partitions() {
        let wanted = plan.hosts(partition).contains(&me);
        match (wanted, ctx.routing.replica(partition)) {
            (true, None) => {
                if let Err(e) = open(ctx, hosting, plan, partition).await {
                    problems.push(format!("opening partition {partition}: {e:#}"));
                }
            }
            (false, Some(replica)) => close(ctx, hosting, replica).await,
            _ => {}
        }
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

async fn open(
    ctx: &Arc<NodeContext>,
    hosting: &Hosting,
    plan: &ClusterPlan,
    partition: PartitionId,
) -> anyhow::Result<()> {
    let me = ctx.topology.node_id;
    let voter = plan.current.get(partition as usize).is_some_and(|v| v.contains(&me));
    let formation = match (voter, plan.forming(partition)) {
        (true, _) => voter_formation(&hosting.store, partition, ctx.topology.formed_partitions, hosting.formation)?,
        // A partition being added forms from its placement, here as on
        // each of its nodes (the same configuration everywhere).
        (false, true) => Formation::New,
        (false, false) => Formation::Joining,
    };
    let group: BTreeMap<NodeId, String> =
        plan.hosts(partition).into_iter().filter_map(|n| plan.members.get(&n).map(|m| (n, m.addr.clone()))).collect();
    let replica = Replica::start(
        partition,
        me,
        &group,
        Arc::clone(&hosting.store),
        ctx.transport.peers.clone(),
        &hosting.settings,
        formation,
    )
    .await?;
    tracing::info!(partition, ?formation, "the cluster plan placed a replica of partition {partition} here");
    ctx.routing.add_replica(Arc::clone(&replica));
    let (loop_ctx, stopping) = (Arc::clone(ctx), ctx.stopping.clone());
    let name = format!("leadership p{partition}");
    let task = ctx.tasks.spawn(crate::tasks::named(name, move |status| {
        super::supervisor::lead_while_leader(loop_ctx, replica, stopping, status)
    }));
    if let Some(old) = hosting.loops.lock().expect("leadership loops").insert(partition, task) {
        old.abort();
    }
    Ok(())
}

/// How a replica the plan lists among `partition`'s voters opens here: as
/// the data directory formed (`formed`), except a replica of a partition
/// added after the cluster formed that has no Raft state here: this node
/// was down or cut off while it formed, and the others made it a voter
/// anyway (they form it together, [`crate::core::ClusterPlan::reported`]).
/// It forgot no vote (it never had one), and joins: copied from the leader,
/// granting no vote until caught up.
pub(super) fn voter_formation(
    store: &Store,
    partition: PartitionId,
    formed_partitions: u32,
    formed: Formation,
) -> anyhow::Result<Formation> {
    let never_formed_here = partition >= formed_partitions && !crate::raft::has_raft_state(store, partition)?;
    Ok(if never_formed_here { Formation::Joining } else { formed })
}

/// Closes a replica the plan moved away: its leadership loop ends (it
/// notices the replica is gone), its group stops here, and its data goes.
async fn close(ctx: &NodeContext, hosting: &Hosting, replica: Arc<Replica>) {
    let partition = replica.partition;
    ctx.routing.remove_replica(partition);
    let task = hosting.loops.lock().expect("leadership loops").remove(&partition);
    if let Some(task) = task {
        if tokio::time::timeout(Duration::from_secs(5), task).await.is_err() {
            tracing::warn!(partition, "the leadership loop of a closed replica did not end within 5 s");
        }
    } else {
        // A replica opened at start: its loop ends on its own.
        let until = Instant::now() + Duration::from_secs(5);
        while ctx.routing.local_leader(partition).is_some() && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    replica.shutdown().await;
    // Its gauges would otherwise keep their last values: a leader here, a
    // leader known (which would hide a partition without one elsewhere).
    let p = partition.to_string();
    metrics::gauge!("drover_partition_role_leader", "partition" => p.clone()).set(0.0);
    metrics::gauge!("drover_partition_has_leader", "partition" => p).set(0.0);
    let mut batch = ctx.store.batch();
    batch.delete_partition(partition);
    ctx.store.write_synced(batch);
    tracing::info!(
        partition,
        "the cluster plan moved partition {partition} off this node: its replica is closed and deleted"
    );
}

/// The partitions this node is moving, each with the target it moves toward.
type Driving = BTreeMap<PartitionId, (JoinHandle<()>, Vec<NodeId>)>;

/// Starts driving each partition this node leads that the plan may move now
/// (or whose voters the plan does not know yet), one task per partition.
fn drive(ctx: &Arc<NodeContext>, plan: &ClusterPlan, driving: &mut Driving) {
    // A move whose target changed since it started (cancelled, say) stops
    // where it is: one toward the new target starts in its place.
    driving.retain(|partition, (task, target)| {
        let current = plan.target.get(*partition as usize);
        if current != Some(target) {
            task.abort();
        }
        !task.is_finished() && current == Some(target)
    });
    for replica in ctx.routing.replicas() {
        let partition = replica.partition;
        if driving.contains_key(&partition) || !replica.leadership().is_leader {
            continue;
        }
        // Partitions being added form together: the first one's leader
        // brings them all in.
        if plan.forming(partition) && partition != plan.partitions_in_force() {
            continue;
        }
        let members = replica.membership();
        let voters: BTreeSet<NodeId> = members.voters.iter().copied().collect();
        let known: BTreeSet<NodeId> = plan.current.get(partition as usize).into_iter().flatten().copied().collect();
        let target: BTreeSet<NodeId> = plan.target.get(partition as usize).into_iter().flatten().copied().collect();
        // A learner the target does not name (a move cancelled after it was
        // added) is dropped too.
        let stray = members.learners.iter().any(|n| !target.contains(n));
        let settled = voters == target && !members.changing && !stray;
        let report = !members.changing && voters != known;
        let cleanup = stray && voters == target && !members.changing;
        if !report && !cleanup && (settled || !plan.may_move(partition)) {
            continue;
        }
        let (ctx, plan) = (Arc::clone(ctx), plan.clone());
        let target = plan.target[partition as usize].clone();
        driving.insert(
            partition,
            (
                tokio::spawn(async move {
                    if let Err(e) = drive_partition(&ctx, &replica, &plan).await {
                        metrics::counter!("drover_plan_step_failures_total").increment(1);
                        tracing::warn!(partition, "moving partition {partition} to the plan's replicas: {e}");
                    }
                }),
                target,
            ),
        );
    }
}

/// Waits until node `node` hosts a replica of `partition` (it opens one
/// once it follows the plan that places it there), up to [`OPEN_WITHIN`].
async fn opened_on(ctx: &NodeContext, node: NodeId, partition: PartitionId) -> Result<(), String> {
    let until = Instant::now() + OPEN_WITHIN;
    loop {
        if let Some(reply) = ctx.transport.peers.status(node, Duration::from_secs(1)).await {
            let statuses: Vec<crate::raft::ReplicaStatus> = bincode::deserialize(&reply.partitions).unwrap_or_default();
            if statuses.iter().any(|s| s.partition == partition) {
                return Ok(());
            }
        }
        if Instant::now() > until {
            return Err(format!(
                "node {node} has not opened a replica of partition {partition} within {OPEN_WITHIN:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn drive_partition(ctx: &NodeContext, replica: &Replica, plan: &ClusterPlan) -> Result<(), String> {
    let partition = replica.partition;
    let target: BTreeSet<NodeId> = plan.target[partition as usize].iter().copied().collect();
    let members = replica.membership();
    let voters: BTreeSet<NodeId> = members.voters.iter().copied().collect();
    let stray = members.learners.iter().any(|n| !target.contains(n));
    let moving = (voters != target || members.changing) && plan.may_move(partition);
    if moving || (stray && voters == target) {
        let started = Instant::now();
        for node in target.difference(&voters) {
            let member = plan.members.get(node).ok_or_else(|| format!("node {node} is in no member list"))?;
            // Appends to a node that has not opened its replica yet would
            // be refused, over and over, until it has.
            opened_on(ctx, *node, partition).await?;
            tracing::info!(partition, node, "adding node {node} to partition {partition} as a learner");
            replica.add_learner(*node, &member.addr, CATCH_UP_WITHIN).await?;
        }
        let me = ctx.topology.node_id;
        let staying = plan.staying(partition);
        if !target.contains(&me) && !staying.is_empty() {
            // The leadership loop hands leadership to a replica that stays
            // (`Topology::preferred_leaders_of`), which then goes on; past
            // the wait, this leader changes the voters itself and steps down
            // once they are committed.
            tracing::info!(
                partition,
                ?staying,
                "partition {partition} leaves this node: handing leadership over first"
            );
            if replica.leadership_moved(HAND_OVER_WITHIN).await {
                return Ok(());
            }
            tracing::warn!(
                partition,
                "leadership did not move within {HAND_OVER_WITHIN:?}: changing the voters from here"
            );
        }
        tracing::info!(partition, ?target, "changing the voters of partition {partition}");
        replica.change_voters(target.clone()).await?;
        metrics::counter!("drover_plan_moves_total").increment(1);
        metrics::histogram!("drover_plan_move_seconds").record(started.elapsed().as_secs_f64());
        tracing::info!(
            partition,
            ?target,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "partition {partition} has its new voters"
        );
    }
    let forming: Vec<PartitionId> = (0..plan.partitions()).filter(|p| plan.forming(*p)).collect();
    for new in &forming {
        // Each one commits (it has formed and has a leader) and copies
        // partition 0's registrations before any takes work.
        adopt(ctx, *new).await?;
    }
    let voters = replica.membership().voters;
    let deadline = Instant::now() + REPORT_WITHIN;
    let report = Command::ReportVoters { partition, voters };
    crate::leaders::submit(ctx, 0, vec![report], deadline)
        .await
        .map_err(|e| format!("reporting the voters of partition {partition} to the plan: {e}"))?;
    if !forming.is_empty() {
        tracing::info!(partitions = ?forming, "the partitions added have formed and take work");
        // Once more after every gateway has learned the new count: what a
        // gateway sent only to the partitions it knew meanwhile.
        tokio::time::sleep(ADOPT_AGAIN_AFTER).await;
        for new in &forming {
            adopt(ctx, *new).await?;
        }
    }
    Ok(())
}

/// Copies partition 0's registrations into `partition`, being added, before
/// it takes work: what gateways sent to every partition before it existed.
async fn adopt(ctx: &NodeContext, partition: PartitionId) -> Result<(), String> {
    let deadline = Instant::now() + OPEN_WITHIN;
    let read = crate::leaders::submit(ctx, 0, vec![Command::GetAdoptable], deadline).await;
    let adoptable = match read.map_err(|e| e.to_string())?.pop() {
        Some(crate::core::CommandResult::Adoptable(adoptable)) => adoptable,
        other => return Err(format!("reading partition 0's registrations: unexpected answer {other:?}")),
    };
    let (sessions, schemas) = (adoptable.sessions.len(), adoptable.schemas.len());
    crate::leaders::submit(ctx, partition, vec![Command::Adopt(adoptable)], deadline)
        .await
        .map_err(|e| format!("copying partition 0's registrations into partition {partition}: {e}"))?;
    tracing::info!(partition, sessions, schemas, "partition {partition} took partition 0's registrations");
    Ok(())
}
