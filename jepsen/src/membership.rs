//! The `membership` nemesis: adds, removes and replaces nodes through the
//! cluster plan (`docs/membership.md`) while the workload runs.
//!
//! A run with it provisions spare node slots (namespaces, addresses, proxies)
//! beyond the members the cluster forms with; slot `i` is node id `i`, and an
//! id serves one node at most. Each fault is one change, drawn in shuffled
//! rounds as the other nemeses' kinds are:
//!
//! - `add`: the lowest spare slot starts with `--join-plan` (its member list
//!   names the plan's members and itself) and is added (`AddNode`);
//! - `remove`: a member is removed (`RemoveNode`); it stays up while its
//!   replicas move away, and is stopped once the plan retires it;
//! - `replace`: a member is SIGKILLed and its data deleted (a lost disk), and a
//!   spare slot takes its place under a new id (`ReplaceNode`).
//!
//! [`choose`] keeps the members between [`min_members`] and [`max_members`],
//! and replaces a node only when the plan is settled (no partition moving, no
//! member leaving): wiping a second node while a first one's replicas are still
//! being copied could leave a partition with no majority, for good. A change
//! whose answer is lost (a timeout, UNAVAILABLE) is sent again until the plan
//! shows it; one still unknown is retried at the next round and at the drain.
//! A refused or failed change is a failed fault attempt, never an anomaly.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use drover::client::Client;
use drover::proto::gateway as pb;
use pb::change_cluster_plan_request::Change as PlanChange;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;
use serde::Serialize;
use serde_json::json;

use crate::cluster::Slot;
use crate::nemesis::{Fault, Faults, Schedule, GRACEFUL_STOP};

/// One membership fault's change.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Change {
    Add,
    Remove,
    Replace,
    /// Two more partitions (`AddPartitions`), while creates with
    /// idempotency keys run: each key must still name one job.
    Partitions,
}

impl Change {
    pub const ALL: [Change; 4] = [Change::Add, Change::Remove, Change::Replace, Change::Partitions];
}

/// What the cluster leaves room for when a membership fault is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Room {
    /// Members the plan lists, leaving ones not counted.
    pub members: usize,
    /// Spare slots the nemesis may still start.
    pub spares: usize,
    /// No partition moving and no member leaving.
    pub settled: bool,
    pub min_members: usize,
    pub max_members: usize,
    /// Partitions the plan has, and the most the nemesis adds up to.
    pub partitions: usize,
    pub max_partitions: usize,
}

impl Room {
    pub fn allows(&self, change: Change) -> bool {
        match change {
            Change::Add => self.spares > 0 && self.members < self.max_members,
            Change::Remove => self.members > self.min_members,
            // The count stays; the victim's replicas must be whole elsewhere.
            Change::Replace => self.spares > 0 && self.settled && self.members > 0,
            Change::Partitions => self.settled && self.partitions + 2 <= self.max_partitions,
        }
    }
}

/// The change to make: the one drawn if the cluster allows it, else the
/// first of the others (in [`Change::ALL`]'s order) it allows, else none.
pub fn choose(drawn: Change, room: &Room) -> Option<Change> {
    std::iter::once(drawn).chain(Change::ALL).find(|c| room.allows(*c))
}

/// Members a removal leaves at least: the replication factor (Drover refuses
/// fewer), and 3.
pub fn min_members(replication_factor: usize) -> usize {
    replication_factor.max(3)
}

/// The replication factor of a cluster formed with `original` members.
pub fn replication_factor(original: usize) -> usize {
    original.min(3)
}

/// Members an addition reaches at most: two more than the cluster formed with.
pub fn max_members(original: usize) -> usize {
    original + 2
}

/// The most node slots a run has: node `i` is `10.231.0.(i+1)`, and the
/// clients are `.100`.
pub const MAX_SLOTS: usize = 99;

/// Node slots for a run of `nodes` members: with the membership nemesis
/// (one of `nemeses` distinct ones), spare slots besides, at least twice the
/// members and about one per two membership rounds the run may have (a round
/// takes 7-8 s at least; two of three changes start a spare), so long runs do
/// not run out.
pub fn slots(nodes: usize, time: u64, nemeses: usize, membership: bool) -> usize {
    if !membership {
        return nodes;
    }
    let rounds = time.div_ceil(8 * nemeses.max(1) as u64) as usize;
    (nodes + (2 * nodes).max(rounds)).min(MAX_SLOTS).max(nodes)
}

/// The cluster plan as the nemesis reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PlanView {
    pub epoch: u64,
    /// Member id -> leaving.
    pub members: BTreeMap<usize, bool>,
    pub retired: BTreeSet<usize>,
    /// Each partition's voters, as its leader last reported them.
    pub current: Vec<Vec<usize>>,
    /// The partitions whose voters differ from their target.
    pub moving: Vec<u32>,
    pub paused: bool,
    /// Partition 0 holds it (some change was made), not the member list's.
    pub changed: bool,
}

impl PlanView {
    pub fn from_proto(plan: &pb::ClusterPlan) -> PlanView {
        PlanView {
            epoch: plan.epoch,
            members: plan.members.iter().filter_map(|m| Some((m.node.as_ref()?.node_id as usize, m.leaving))).collect(),
            retired: plan.retired.iter().map(|id| *id as usize).collect(),
            current: plan.partitions.iter().map(|p| p.current.iter().map(|n| *n as usize).collect()).collect(),
            // A partition being added is not settled either.
            moving: plan.partitions.iter().filter(|p| p.moving || p.forming).map(|p| p.partition_id).collect(),
            paused: plan.paused,
            changed: plan.changed,
        }
    }

    /// The members not leaving.
    pub fn staying(&self) -> Vec<usize> {
        self.members.iter().filter(|(_, leaving)| !**leaving).map(|(id, _)| *id).collect()
    }

    pub fn leaving(&self) -> Vec<usize> {
        self.members.iter().filter(|(_, leaving)| **leaving).map(|(id, _)| *id).collect()
    }

    /// No partition moving and no member leaving.
    pub fn settled(&self) -> bool {
        self.moving.is_empty() && self.leaving().is_empty()
    }

    pub fn summary(&self) -> String {
        let mut text = format!("plan epoch {}: members {:?}", self.epoch, self.staying());
        if !self.leaving().is_empty() {
            text += &format!(", leaving {:?}", self.leaving());
        }
        if !self.moving.is_empty() {
            text += &format!(", partitions {:?} moving", self.moving);
        }
        if !self.retired.is_empty() {
            text += &format!(", retired {:?}", self.retired);
        }
        text
    }
}

/// Reads the cluster plan through the first of `gateways` that answers.
pub async fn read_plan(gateways: &[String], limit: Duration) -> anyhow::Result<PlanView> {
    let plan = crate::schedules::through_any(gateways, limit, "reading the cluster plan", |client| async move {
        client.raw().get_cluster_plan(pb::GetClusterPlanRequest {}).await
    })
    .await?;
    Ok(PlanView::from_proto(&plan.into_inner()))
}

/// How a plan change ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// Made: the plan after it.
    Done(PlanView),
    /// Refused, and the plan does not show it: the refusal.
    Refused(String),
    /// No answer, and the plan did not show it, until the limit: the last error.
    Unknown(String),
}

/// A refusal that another gateway, or a later try, may not repeat: a node
/// that follows no plan yet, a cluster whose versions are not all known yet.
fn passing(status: &tonic::Status) -> bool {
    let message = status.message();
    message.contains("follows no plan yet") || message.contains("version")
}

/// Sends `change` through the live gateways in turn (from a random one), as
/// the admin principal, until it is answered, refused, or `limit` passes. A
/// lost answer is followed by a read of the plan: `done` says whether the
/// plan shows the change made. Answers how it ended and every try.
async fn send(
    gateways: &[String],
    token: Option<&str>,
    change: PlanChange,
    done: impl Fn(&PlanView) -> bool,
    (limit, rng): (Duration, &mut StdRng),
) -> (Answer, Vec<String>) {
    let started = Instant::now();
    let mut tries = Vec::new();
    if gateways.is_empty() {
        return (Answer::Unknown("no live gateway".into()), tries);
    }
    let mut at = rng.random_range(0..gateways.len());
    loop {
        let gateway = &gateways[at % gateways.len()];
        at += 1;
        let client = match (Client::connect_lazy(gateway), token) {
            (Ok(client), Some(token)) => client.with_token(token).map_err(|e| e.to_string()),
            (Ok(client), None) => Ok(client),
            (Err(e), _) => Err(e.to_string()),
        };
        let status = match client {
            Ok(client) => {
                let request = pb::ChangeClusterPlanRequest { change: Some(change.clone()) };
                let mut raw = client.raw();
                match tokio::time::timeout(Duration::from_secs(10), raw.change_cluster_plan(request)).await {
                    Ok(Ok(plan)) => return (Answer::Done(PlanView::from_proto(&plan.into_inner())), tries),
                    Ok(Err(status)) => status,
                    Err(_) => tonic::Status::deadline_exceeded("no answer in 10 s"),
                }
            }
            Err(e) => tonic::Status::unavailable(e),
        };
        tries.push(format!("{gateway}: {:?} {}", status.code(), status.message()));
        let certain = matches!(
            status.code(),
            tonic::Code::FailedPrecondition
                | tonic::Code::NotFound
                | tonic::Code::InvalidArgument
                | tonic::Code::PermissionDenied
                | tonic::Code::Unauthenticated
                | tonic::Code::AlreadyExists
        ) && !passing(&status);
        // A try whose answer was lost may have made it (and a refusal then
        // says so: the id is a member already).
        if let Ok(plan) = read_plan(gateways, Duration::from_secs(10)).await {
            if done(&plan) {
                return (Answer::Done(plan), tries);
            }
        }
        if certain {
            return (Answer::Refused(format!("{:?}: {}", status.code(), status.message())), tries);
        }
        if started.elapsed() > limit {
            return (Answer::Unknown(tries.last().cloned().unwrap_or_default()), tries);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A change whose outcome is not known yet: tried again at the next
/// membership round, and at the drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "change")]
pub enum Pending {
    Add { node: usize },
    Remove { node: usize },
    Replace { old: usize, new: usize },
}

/// How long a change is tried before its outcome counts as unknown.
const CHANGE_LIMIT: Duration = Duration::from_secs(30);
/// How long a node being added may take to answer `/ready`.
const JOIN_READY: Duration = Duration::from_secs(20);
/// How long a replacement waits for the moves under way to finish.
const SETTLE_FOR_REPLACE: Duration = Duration::from_secs(15);

impl Faults<'_> {
    fn live_gateways(&self) -> Vec<String> {
        self.nodes.live_gateways(self.gateways)
    }

    pub async fn read_plan(&self, limit: Duration) -> anyhow::Result<PlanView> {
        read_plan(&self.live_gateways(), limit).await
    }

    /// Slot `i` as the plan names it (its address in every member list is
    /// its proxy port, as the original members' are).
    fn plan_node(&self, i: usize) -> pb::PlanNode {
        let (region, zone) = match self.nodes.locations.get(i) {
            Some(at) => at.split_once('/').map(|(r, z)| (r.to_string(), z.to_string())).unwrap_or_default(),
            None => (String::new(), String::new()),
        };
        pb::PlanNode { node_id: i as u64, address: crate::proxy::member_addr(i), region, zone }
    }

    async fn change(
        &self,
        change: PlanChange,
        done: impl Fn(&PlanView) -> bool,
        rng: &mut StdRng,
    ) -> (Answer, Vec<String>) {
        send(&self.live_gateways(), self.admin_token.as_deref(), change, done, (CHANGE_LIMIT, rng)).await
    }

    /// Session workers given a gateway that is no longer a member's get
    /// the members' instead.
    fn follow_gateways(&mut self) -> anyhow::Result<Vec<String>> {
        let live = self.live_gateways();
        self.workers.follow(&live)
    }

    /// Brings the slots in line with `plan`: a node the plan retired is
    /// stopped for good, a removal whose answer was lost shows as leaving, a
    /// node joining that the plan lists is a member. Notes each for the
    /// timeline.
    pub async fn reconcile_with(&mut self, plan: &PlanView) -> anyhow::Result<()> {
        let mut changed = false;
        for i in self.nodes.active() {
            let slot = self.nodes.slots[i];
            if plan.retired.contains(&i) {
                let stopped = self.nodes.retire(i, GRACEFUL_STOP).await?;
                let how = stopped.map(|s| format!("SIGTERM: exited after {} ms ({})", s.after.as_millis(), s.status));
                self.notes.push(json!({
                    "retired": i, "was": slot, "stopped": how, "plan": plan.summary(),
                }));
                changed = true;
                continue;
            }
            match plan.members.get(&i) {
                Some(true) if slot != Slot::Leaving => {
                    self.nodes.set_slot(i, Slot::Leaving);
                    self.notes.push(json!({ "leaving": i, "was": slot, "plan": plan.summary() }));
                    changed = true;
                }
                Some(false) if slot == Slot::Joining => {
                    self.nodes.set_slot(i, Slot::Member);
                    self.notes.push(json!({ "member": i, "was": slot, "plan": plan.summary() }));
                    changed = true;
                }
                _ => {}
            }
        }
        if changed {
            let replaced = self.follow_gateways()?;
            if !replaced.is_empty() {
                self.notes.push(json!({ "session_workers_moved": replaced }));
            }
        }
        Ok(())
    }

    /// [`Faults::reconcile_with`] the plan as read now (nothing if it
    /// cannot be read within `limit`).
    pub async fn reconcile(&mut self, limit: Duration) -> anyhow::Result<Option<PlanView>> {
        let Ok(plan) = self.read_plan(limit).await else { return Ok(None) };
        self.reconcile_with(&plan).await?;
        Ok(Some(plan))
    }

    /// Reads the plan until it is settled or `limit` passes; the last read.
    pub async fn wait_settled(&mut self, limit: Duration) -> anyhow::Result<Option<PlanView>> {
        let started = Instant::now();
        loop {
            let plan = self.reconcile(Duration::from_secs(5)).await?;
            if plan.as_ref().is_some_and(PlanView::settled) || started.elapsed() > limit {
                return Ok(plan);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// One membership fault: a change left unknown by an earlier round if
    /// there is one, else an add, remove or replace, as the plan allows.
    pub async fn membership(&mut self, schedule: &mut Schedule, rng: &mut StdRng) -> anyhow::Result<Fault> {
        if let Some(pending) = schedule.pending.take() {
            return self.finish(pending, schedule, rng).await;
        }
        let Some(mut plan) = self.reconcile(Duration::from_secs(20)).await? else {
            let description =
                "no membership change: no gateway answered a read of the cluster plan in 20 s".to_string();
            return Ok(Fault::new("none", description, json!({ "outcome": "plan unread" })));
        };
        let drawn = schedule.memberships.next(rng);
        let (original, reserve, formed_partitions) = (self.nodes.original, self.reserve, self.nodes.partitions);
        let spares = self.nodes.in_states(&[Slot::Spare]);
        let room = |plan: &PlanView| Room {
            members: plan.staying().len(),
            spares: spares.len().saturating_sub(reserve),
            settled: plan.settled(),
            min_members: min_members(replication_factor(original)),
            max_members: max_members(original),
            partitions: plan.current.len(),
            max_partitions: 2 * formed_partitions as usize,
        };
        let mut waited = None;
        if drawn == Change::Replace && !room(&plan).settled && (Room { settled: true, ..room(&plan) }).allows(drawn) {
            let started = Instant::now();
            if let Some(read) = self.wait_settled(SETTLE_FOR_REPLACE).await? {
                plan = read;
            }
            waited = Some(started.elapsed().as_millis() as u64);
        }
        let room = room(&plan);
        // Members the nemesis may remove or replace: the plan's, not leaving,
        // that it runs as members.
        let victims: Vec<usize> =
            plan.staying().into_iter().filter(|i| self.nodes.slots.get(*i) == Some(&Slot::Member)).collect();
        let chosen =
            choose(drawn, &room).filter(|c| matches!(c, Change::Add | Change::Partitions) || !victims.is_empty());
        let mut fault = match chosen {
            None => {
                let description = format!(
                    "no membership change possible ({drawn:?} drawn): {} members (between {} and {}), {} spare \
                     slots left, {}",
                    room.members,
                    room.min_members,
                    room.max_members,
                    room.spares,
                    if room.settled { "settled" } else { "moves under way" }
                );
                Fault::new("none", description, json!({ "drawn": drawn, "plan": plan }))
            }
            Some(Change::Add) => self.add(spares[0], &plan, schedule, rng).await?,
            Some(Change::Partitions) => self.add_partitions(plan.current.len() + 2, rng).await,
            Some(Change::Remove) => {
                let node = *victims.choose(rng).expect("a victim");
                self.remove(node, schedule, rng).await?
            }
            Some(Change::Replace) => {
                let old = *victims.choose(rng).expect("a victim");
                self.nodes.kill(old);
                let wiped = self.nodes.wipe(old)?;
                let lost = format!("SIGKILL node {old} and delete its data ({wiped} bytes: a lost disk)");
                let (description, mut detail) = self.replace(old, spares[0], &plan, schedule, rng).await?;
                detail["wiped_bytes"] = json!(wiped);
                Fault::new(Change::Replace, format!("{lost}; {description}"), detail).stopping_nodes()
            }
        };
        fault.detail["drawn"] = json!(drawn);
        if let Some(ms) = waited {
            fault.detail["waited_for_settled_ms"] = json!(ms);
        }
        Ok(fault)
    }

    /// Starts spare `node` with `--join-plan` (its members: the plan's, and
    /// itself) and waits until it is ready or `JOIN_READY` passes; how long.
    async fn start_joining(&mut self, node: usize, members: &[usize]) -> anyhow::Result<Option<u64>> {
        self.nodes.join(node, members)?;
        let started = Instant::now();
        while started.elapsed() < JOIN_READY {
            if matches!(self.nodes.admin_get(node, "/ready").await, Ok((200, _))) {
                return Ok(Some(started.elapsed().as_millis() as u64));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(None)
    }

    async fn add(
        &mut self,
        node: usize,
        plan: &PlanView,
        schedule: &mut Schedule,
        rng: &mut StdRng,
    ) -> anyhow::Result<Fault> {
        let members: Vec<usize> = plan.members.keys().copied().collect();
        let ready = self.start_joining(node, &members).await?;
        let (description, detail) = self.send_add(node, schedule, rng).await?;
        let ready_text = ready.map_or("not ready in 20 s".to_string(), |ms| format!("ready after {ms} ms"));
        let description = format!("start node {node} with --join-plan ({ready_text}) and add it: {description}");
        let mut fault = Fault::new(Change::Add, description, detail);
        fault.detail["ready_ms"] = json!(ready);
        Ok(fault)
    }

    /// Sends `AddNode` for joining `node`: the outcome, described, and details.
    async fn send_add(
        &mut self,
        node: usize,
        schedule: &mut Schedule,
        rng: &mut StdRng,
    ) -> anyhow::Result<(String, serde_json::Value)> {
        let change = PlanChange::AddNode(self.plan_node(node));
        let (answer, tries) = self.change(change, |p| p.members.contains_key(&node), rng).await;
        let description = match &answer {
            Answer::Done(plan) => {
                self.nodes.set_slot(node, Slot::Member);
                plan.summary()
            }
            Answer::Refused(why) => {
                // Never a member: it stops, and its id is not used again.
                self.nodes.retire(node, GRACEFUL_STOP).await?;
                format!("refused ({why}); node {node} stopped, its id unused")
            }
            Answer::Unknown(why) => {
                schedule.pending = Some(Pending::Add { node });
                format!("outcome unknown ({why}); tried again next round")
            }
        };
        Ok((description, outcome(node, &answer, &tries)))
    }

    /// Raises the partition count to `to`; a change whose outcome is unknown
    /// is not tried again (a later draw adds more instead).
    async fn add_partitions(&mut self, to: usize, rng: &mut StdRng) -> Fault {
        let change = PlanChange::AddPartitionsTo(to as u32);
        let (answer, tries) = self.change(change, move |p| p.current.len() >= to, rng).await;
        let description = match &answer {
            Answer::Done(plan) => format!("add partitions up to {to}: {}", plan.summary()),
            Answer::Refused(why) => format!("add partitions up to {to}: refused ({why})"),
            Answer::Unknown(why) => format!("add partitions up to {to}: outcome unknown ({why})"),
        };
        let mut detail = outcome(0, &answer, &tries);
        detail["node"] = json!(null);
        detail["partitions"] = json!(to);
        Fault::new(Change::Partitions, description, detail)
    }

    async fn remove(&mut self, node: usize, schedule: &mut Schedule, rng: &mut StdRng) -> anyhow::Result<Fault> {
        let (description, detail) = self.send_remove(node, schedule, rng).await?;
        Ok(Fault::new(Change::Remove, format!("remove node {node}: {description}"), detail))
    }

    async fn send_remove(
        &mut self,
        node: usize,
        schedule: &mut Schedule,
        rng: &mut StdRng,
    ) -> anyhow::Result<(String, serde_json::Value)> {
        let gone = move |p: &PlanView| p.members.get(&node) == Some(&true) || p.retired.contains(&node);
        let (answer, tries) = self.change(PlanChange::RemoveNode(node as u64), gone, rng).await;
        let description = match &answer {
            Answer::Done(plan) => {
                let text =
                    format!("{}; node {node} runs until the plan retires it, then stops for good", plan.summary());
                self.reconcile_with(plan).await?;
                if self.nodes.slots[node] == Slot::Member {
                    self.nodes.set_slot(node, Slot::Leaving);
                    self.follow_gateways()?;
                }
                text
            }
            Answer::Refused(why) => format!("refused ({why})"),
            Answer::Unknown(why) => {
                schedule.pending = Some(Pending::Remove { node });
                format!("outcome unknown ({why}); tried again next round")
            }
        };
        Ok((description, outcome(node, &answer, &tries)))
    }

    /// Replaces stopped member `old` (its disk lost) by spare `new`: starts
    /// `new` with `--join-plan` and sends `ReplaceNode`.
    async fn replace(
        &mut self,
        old: usize,
        new: usize,
        plan: &PlanView,
        schedule: &mut Schedule,
        rng: &mut StdRng,
    ) -> anyhow::Result<(String, serde_json::Value)> {
        // Never started again, whatever the plan says.
        self.nodes.set_slot(old, Slot::Retired);
        self.follow_gateways()?;
        // In the old node's zone, as an operator replaces a machine (with
        // --regions; nodes have no location otherwise).
        if let Some(at) = self.nodes.locations.get(old).cloned() {
            if let Some(location) = self.nodes.locations.get_mut(new) {
                *location = at;
            }
        }
        let members: Vec<usize> = plan.members.keys().copied().filter(|m| *m != old).collect();
        let ready = self.start_joining(new, &members).await?;
        let (description, mut detail) = self.send_replace(old, new, schedule, rng).await?;
        let ready_text = ready.map_or("not ready in 20 s".to_string(), |ms| format!("ready after {ms} ms"));
        detail["ready_ms"] = json!(ready);
        detail["old"] = json!(old);
        Ok((
            format!("start node {new} with --join-plan ({ready_text}) and replace {old} with it: {description}"),
            detail,
        ))
    }

    async fn send_replace(
        &mut self,
        old: usize,
        new: usize,
        schedule: &mut Schedule,
        rng: &mut StdRng,
    ) -> anyhow::Result<(String, serde_json::Value)> {
        let change =
            PlanChange::ReplaceNode(pb::ReplaceNode { old_node_id: old as u64, new_node: Some(self.plan_node(new)) });
        let (answer, tries) = self.change(change, |p| p.members.contains_key(&new), rng).await;
        let description = match &answer {
            Answer::Done(plan) => {
                self.nodes.set_slot(new, Slot::Member);
                plan.summary()
            }
            // Tried again next round: `old` is down for good and must go.
            Answer::Refused(why) | Answer::Unknown(why) => {
                schedule.pending = Some(Pending::Replace { old, new });
                format!("not made ({why}); tried again next round")
            }
        };
        Ok((description, outcome(new, &answer, &tries)))
    }

    /// Tries again a change whose outcome an earlier round did not learn.
    /// A refused replacement gives up its new node and removes the old one
    /// instead (it is down for good).
    async fn finish(&mut self, pending: Pending, schedule: &mut Schedule, rng: &mut StdRng) -> anyhow::Result<Fault> {
        self.reconcile(Duration::from_secs(10)).await?;
        let (kind, (description, mut detail)) = match pending {
            Pending::Add { node } => (Change::Add, self.send_add(node, schedule, rng).await?),
            Pending::Remove { node } => (Change::Remove, self.send_remove(node, schedule, rng).await?),
            Pending::Replace { old, new } => {
                let (description, detail) = self.send_replace(old, new, schedule, rng).await?;
                let refused = detail["outcome"] == "refused";
                if refused {
                    // Once more, and no further: the new node leaves, the old is removed.
                    schedule.pending = None;
                    self.nodes.retire(new, GRACEFUL_STOP).await?;
                    let (removal, _) = self.send_remove(old, schedule, rng).await?;
                    let description = format!("{description}; node {new} stopped, and node {old} removed: {removal}");
                    (Change::Replace, (description, detail))
                } else {
                    (Change::Replace, (description, detail))
                }
            }
        };
        detail["retry"] = json!(pending);
        Ok(Fault::new(kind, format!("again: {pending:?}: {description}"), detail))
    }

    /// At the drain: changes still unknown are tried again, and the plan is
    /// read until no partition moves and no member leaves (nodes it retires
    /// stop), or `limit` passes. Answers the timeline's `settled` event,
    /// and the plan last read.
    pub async fn settle(
        &mut self,
        schedule: &mut Schedule,
        rng: &mut StdRng,
        limit: Duration,
    ) -> anyhow::Result<(serde_json::Value, Option<PlanView>)> {
        let started = Instant::now();
        let mut retried = Vec::new();
        loop {
            if let Some(pending) = schedule.pending.take() {
                let fault = self.finish(pending, schedule, rng).await?;
                retried.push(json!({ "kind": fault.kind, "fault": fault.description, "detail": fault.detail }));
            }
            let plan = self.reconcile(Duration::from_secs(5)).await?;
            let settled = schedule.pending.is_none() && plan.as_ref().is_some_and(PlanView::settled);
            if settled || started.elapsed() > limit {
                let event = json!({
                    "settled": settled, "waited_ms": started.elapsed().as_millis() as u64,
                    "plan": plan, "pending": schedule.pending, "retried": retried,
                    "members": self.nodes.members(), "slots": self.nodes.slots,
                });
                return Ok((event, plan));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// A damaged node that refused to start, with the membership nemesis
    /// on: its disk counts as lost, so a spare replaces it under a new id
    /// (a re-seed under its old id could vote twice in a term). Without a
    /// spare it is removed, or, when too few members would remain, left
    /// down. Answers what was done and its details.
    pub async fn replace_lost(
        &mut self,
        old: usize,
        schedule: &mut Schedule,
        rng: &mut StdRng,
    ) -> anyhow::Result<(String, serde_json::Value)> {
        let plan = self.read_plan(Duration::from_secs(20)).await.unwrap_or_default();
        let spare = self.nodes.in_states(&[Slot::Spare]).first().copied();
        if let Some(new) = spare.filter(|_| !plan.members.is_empty()) {
            let (description, detail) = self.replace(old, new, &plan, schedule, rng).await?;
            return Ok((format!("replaced: {description}"), detail));
        }
        self.nodes.set_slot(old, Slot::Retired);
        self.follow_gateways()?;
        if plan.staying().len() > min_members(replication_factor(self.nodes.original)) {
            let (description, detail) = self.send_remove(old, schedule, rng).await?;
            return Ok((format!("no spare slot left: removed: {description}"), detail));
        }
        Ok((format!("no spare slot left and too few members to remove it: node {old} stays down"), json!({})))
    }
}

/// The details of a change's outcome, for the timeline.
fn outcome(node: usize, answer: &Answer, tries: &[String]) -> serde_json::Value {
    let (outcome, why, plan) = match answer {
        Answer::Done(plan) => ("made", None, Some(plan)),
        Answer::Refused(why) => ("refused", Some(why), None),
        Answer::Unknown(why) => ("unknown", Some(why), None),
    };
    json!({ "node": node, "outcome": outcome, "why": why, "plan": plan, "failed_tries": tries })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room(members: usize, spares: usize, settled: bool) -> Room {
        Room { members, spares, settled, min_members: 3, max_members: 5, partitions: 3, max_partitions: 6 }
    }

    #[test]
    fn the_drawn_change_is_made_when_the_cluster_allows_it() {
        for change in Change::ALL {
            assert_eq!(choose(change, &room(4, 2, true)), Some(change));
        }
    }

    #[test]
    fn adding_needs_a_spare_and_room_below_the_most_members() {
        assert!(!room(4, 0, true).allows(Change::Add));
        assert!(!room(5, 3, true).allows(Change::Add));
        assert!(room(4, 1, false).allows(Change::Add), "moves under way do not stop an addition");
        // A cluster at its largest removes instead.
        assert_eq!(choose(Change::Add, &room(5, 3, true)), Some(Change::Remove));
    }

    #[test]
    fn removing_keeps_the_fewest_members() {
        assert!(!room(3, 2, true).allows(Change::Remove));
        assert!(room(4, 0, false).allows(Change::Remove));
        // At the fewest, a removal drawn becomes an addition.
        assert_eq!(choose(Change::Remove, &room(3, 2, true)), Some(Change::Add));
    }

    #[test]
    fn replacing_needs_a_spare_and_a_settled_plan() {
        assert!(!room(3, 0, true).allows(Change::Replace));
        assert!(!room(3, 2, false).allows(Change::Replace), "never wipe a node while replicas move");
        assert_eq!(choose(Change::Replace, &room(3, 2, false)), Some(Change::Add));
        assert_eq!(choose(Change::Replace, &room(5, 2, false)), Some(Change::Remove));
    }

    #[test]
    fn adding_partitions_needs_a_settled_plan_and_room_below_the_most() {
        assert!(room(3, 0, true).allows(Change::Partitions));
        assert!(!room(3, 0, false).allows(Change::Partitions), "never while partitions move or form");
        assert!(!Room { partitions: 5, ..room(3, 0, true) }.allows(Change::Partitions));
    }

    #[test]
    fn nothing_is_possible_at_the_fewest_members_without_spares() {
        for change in Change::ALL {
            assert_eq!(choose(change, &Room { partitions: 6, ..room(3, 0, true) }), None);
        }
        // Without spares only removals remain.
        assert_eq!(choose(Change::Replace, &room(4, 0, true)), Some(Change::Remove));
    }

    #[test]
    fn members_stay_between_three_and_two_more_than_formed() {
        assert_eq!((min_members(replication_factor(3)), max_members(3)), (3, 5));
        assert_eq!((min_members(replication_factor(5)), max_members(5)), (3, 7));
        assert_eq!(min_members(5), 5, "never fewer than the replication factor");
    }

    #[test]
    fn spare_slots_grow_with_the_run_and_stay_within_the_subnet() {
        assert_eq!(slots(3, 30, 1, false), 3, "no spares without the nemesis");
        assert_eq!(slots(3, 30, 1, true), 9, "twice the members");
        assert_eq!(slots(3, 300, 1, true), 3 + 38, "one per 8 s of a run of membership alone");
        assert_eq!(slots(5, 1800, 11, true), 5 + 21, "combined: one nemesis in eleven");
        assert_eq!(slots(60, 30, 1, true), MAX_SLOTS);
        assert_eq!(slots(99, 30, 1, true), 99);
    }

    fn proto_plan() -> pb::ClusterPlan {
        let member = |id: u64, leaving: bool| pb::PlanMember {
            node: Some(pb::PlanNode {
                node_id: id,
                address: crate::proxy::member_addr(id as usize),
                ..Default::default()
            }),
            leaving,
            ..Default::default()
        };
        pb::ClusterPlan {
            epoch: 4,
            members: vec![member(0, true), member(1, false), member(2, false), member(3, false)],
            partitions: vec![
                pb::PlanPartition {
                    partition_id: 0,
                    current: vec![0, 1, 2],
                    target: vec![3, 1, 2],
                    moving: true,
                    forming: false,
                },
                pb::PlanPartition {
                    partition_id: 1,
                    current: vec![1, 2, 3],
                    target: vec![1, 2, 3],
                    moving: false,
                    forming: false,
                },
            ],
            retired: vec![5],
            changed: true,
            ..Default::default()
        }
    }

    #[test]
    fn a_plan_reads_as_members_leaving_moving_and_retired() {
        let plan = PlanView::from_proto(&proto_plan());
        assert_eq!(plan.staying(), [1, 2, 3]);
        assert_eq!(plan.leaving(), [0]);
        assert_eq!(plan.moving, [0]);
        assert_eq!(plan.current, [vec![0, 1, 2], vec![1, 2, 3]]);
        assert!(plan.retired.contains(&5));
        assert!(!plan.settled());
        assert_eq!(plan.summary(), "plan epoch 4: members [1, 2, 3], leaving [0], partitions [0] moving, retired {5}");
    }

    #[test]
    fn a_plan_with_nothing_moving_or_leaving_is_settled() {
        let mut proto = proto_plan();
        proto.members[0].leaving = false;
        proto.partitions[0].moving = false;
        assert!(PlanView::from_proto(&proto).settled());
    }
}
