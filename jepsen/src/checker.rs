//! Checks a history against Drover's promises, in the style of Jepsen's
//! `total-queue` with the stricter rules Drover needs:
//!
//! - **lost**: an acknowledged create whose job never completed and is not
//!   an incident after the final drain (missing, or left unfinished); each
//!   lost job is reported with its state on every replica, so "never pushed"
//!   (activatable) reads differently from "gone" (missing);
//! - **unexpected**: a completion of a job that was never created;
//! - **duplicated**: two accepted completions of one job (one key);
//! - **stale**: a completion accepted for an attempt that had already been
//!   superseded: a newer activation of the job had been returned to a client
//!   before the completion was invoked;
//! - **duplicate create**: one create (one marker in the variables) produced
//!   more than one job, acknowledged or not. A create is a request for one
//!   job; a gateway that re-submits it after losing the answer makes two;
//! - **misdelivered**: a job handed to a worker that did not ask for it: a job
//!   of another type, or an activation made out to another worker name (a
//!   stream registration that outlived the stream it named);
//! - **stage twice**: one stage of a job committed by two different
//!   attempts (acknowledged checkpoints, or the checkpoints a replica holds),
//!   or a replica holding a job's stages out of their declared order;
//! - **lost checkpoint**: an acknowledged checkpoint missing from the
//!   record of a replica that holds the job;
//! - **recovered** (reported, not a violation): a create with an unknown or
//!   failed outcome whose job exists after all;
//! - **divergent**: after healing, a node's replica misses an acknowledged job
//!   or holds it in another final state than the other replicas;
//! - **slow recovery**: a killed session worker's job not activated again
//!   within the session's bound (see `sessions`);
//! - **early reactivation**, **early timer**, **late timer**: timers held to
//!   real time (see `timing`);
//! - **cross-tenant effect**, **cross-tenant read**: what a second tenant's
//!   attacks achieved on the first's jobs and sessions (see `attacker`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use serde::Serialize;

use crate::history::{FinalReads, Kind, Op, Phase};
use crate::workload::STAGES;

/// An acknowledged job that did not finish, with what each replica holds.
#[derive(Debug, Serialize, PartialEq)]
pub struct LostJob {
    pub id: u64,
    pub key: u64,
    pub job_type: Option<String>,
    /// Replica node -> the job's state there, `missing` when the node answered
    /// without it, `unread` when the node did not answer the final read.
    pub replicas: BTreeMap<usize, String>,
}

/// One create that produced several jobs.
#[derive(Debug, Serialize, PartialEq)]
pub struct DuplicateCreate {
    pub id: u64,
    pub keys: Vec<u64>,
    /// The key the create was acknowledged with, if it was.
    pub acknowledged: Option<u64>,
}

/// An activation handed to a worker that did not ask for it.
#[derive(Debug, Serialize, PartialEq)]
pub struct Misdelivery {
    pub id: u64,
    pub key: Option<u64>,
    pub attempt: u32,
    pub process: u64,
    pub node: usize,
    /// The type the job was created with.
    pub job_type: Option<String>,
    /// The type the worker asked for.
    pub wanted_type: Option<String>,
    /// The worker name the worker asked for, and the one on the activation.
    pub worker: Option<String>,
    pub assigned_worker: Option<String>,
}

/// A stage committed by more than one attempt, or out of order.
#[derive(Debug, Serialize, PartialEq)]
pub struct StageTwice {
    pub id: u64,
    pub key: u64,
    pub stage: String,
    /// The attempts that committed it (acknowledged, or held by a replica).
    pub attempts: Vec<u32>,
}

/// An acknowledged checkpoint a replica's record of the job lacks.
#[derive(Debug, Serialize, PartialEq)]
pub struct LostCheckpoint {
    pub id: u64,
    pub key: u64,
    pub stage: String,
    pub attempt: u32,
    pub node: usize,
}

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Report {
    pub attempted: usize,
    pub acknowledged: usize,
    pub completed: usize,
    pub incidents: usize,
    /// Acknowledged jobs that asked for an expiry and ended expired, unrun.
    pub expired: usize,
    pub lost: Vec<LostJob>,
    pub unexpected: Vec<u64>,
    pub duplicated: Vec<u64>,
    pub stale: Vec<u64>,
    pub duplicate_creates: Vec<DuplicateCreate>,
    pub misdelivered: Vec<Misdelivery>,
    pub stage_twice: Vec<StageTwice>,
    pub lost_checkpoints: Vec<LostCheckpoint>,
    /// Acknowledged checkpoints.
    pub checkpoints: usize,
    pub divergent: Vec<u64>,
    pub recovered: Vec<u64>,
    /// Jobs of killed session workers that were not activated again in time
    /// (see `sessions`).
    pub slow_recoveries: Vec<crate::sessions::SlowRecovery>,
    /// Session worker processes killed.
    pub worker_kills: usize,
    /// Jobs handed to a second worker within the first one's lease, and
    /// timers (delays, back-offs) that fired early or late (see `timing`).
    pub timing: crate::timing::Timing,
    /// What clients waited (figures, not checks; see `availability`).
    pub availability: crate::availability::Availability,
    /// What the second tenant's attacks achieved (see `attacker`).
    pub cross_tenant: crate::attacker::CrossTenant,
    /// Jobs handed to a worker after their expiry (see `expiry`).
    pub expired_handed_out: Vec<crate::expiry::ExpiredHandedOut>,
    /// Each schedule's ticks: doubled and missed (see `schedules`).
    pub ticks: crate::schedules::Ticks,
    /// Each workflow's steps and callbacks: lost and twice (see `workflows`).
    pub workflows: crate::workflows::Workflows,
    /// The limited queue's activations held to its limit (see `limits`).
    pub limits: crate::limits::Limits,
    pub valid: bool,
}

/// At most this many lines per anomaly in the text report (all are in the JSON).
const DETAIL_LINES: usize = 20;

impl Report {
    /// Jobs of killed session workers that came back late: each one makes
    /// the run invalid.
    pub fn add_slow_recoveries(&mut self, slow: Vec<crate::sessions::SlowRecovery>) {
        self.valid &= slow.is_empty();
        self.slow_recoveries.extend(slow);
    }

    /// Cross-tenant effects and reads: each one makes the run invalid.
    pub fn add_cross_tenant(&mut self, found: crate::attacker::CrossTenant) {
        self.valid &= found.effects.is_empty() && found.reads.is_empty();
        self.cross_tenant = found;
    }

    /// Doubled and missed ticks: each one makes the run invalid.
    pub fn add_ticks(&mut self, ticks: crate::schedules::Ticks) {
        self.valid &= ticks.anomalies() == 0;
        self.ticks = ticks;
    }

    /// Steps and callbacks lost or made twice: each one makes the run invalid.
    pub fn add_workflows(&mut self, workflows: crate::workflows::Workflows) {
        self.valid &= workflows.anomalies() == 0;
        self.workflows = workflows;
    }

    /// A limit exceeded or a limited job stuck: each one makes the run invalid.
    pub fn add_limits(&mut self, limits: crate::limits::Limits) {
        self.valid &= limits.anomalies() == 0;
        self.limits = limits;
    }

    /// Timing anomalies: each one makes the run invalid.
    pub fn add_timing(&mut self, timing: crate::timing::Timing) {
        self.valid &= timing.anomalies() == 0;
        self.timing = timing;
    }

    pub fn summary(&self) -> String {
        format!(
            "{}: {} attempted, {} acknowledged, {} completed, {} incidents, {} expired; lost {}, unexpected {}, \
             duplicated {}, stale {}, duplicate creates {}, misdelivered {}, stage twice {}, lost checkpoints {} (of \
             {}), divergent {}, recovered {}, worker kills {}, slow recoveries {}, early reactivations {}, early \
             timers {}, late timers {}, expired job handed out {}; {}; {}; {}; {}",
            if self.valid { "VALID" } else { "INVALID" },
            self.attempted,
            self.acknowledged,
            self.completed,
            self.incidents,
            self.expired,
            self.lost.len(),
            self.unexpected.len(),
            self.duplicated.len(),
            self.stale.len(),
            self.duplicate_creates.len(),
            self.misdelivered.len(),
            self.stage_twice.len(),
            self.lost_checkpoints.len(),
            self.checkpoints,
            self.divergent.len(),
            self.recovered.len(),
            self.worker_kills,
            self.slow_recoveries.len(),
            self.timing.early_reactivations.len(),
            self.timing.early_timers.len(),
            self.timing.late_timers.len(),
            self.expired_handed_out.len(),
            self.ticks.summary(),
            self.workflows.summary(),
            self.limits.summary(),
            self.cross_tenant.summary(),
        )
    }

    /// One line per anomaly (the first few of each), after the summary.
    pub fn details(&self) -> String {
        let mut lines: Vec<String> = Vec::new();
        let mut section = |items: Vec<String>| {
            let total = items.len();
            lines.extend(items.into_iter().take(DETAIL_LINES));
            if total > DETAIL_LINES {
                lines.push(format!("  ... and {} more (report.json has them all)", total - DETAIL_LINES));
            }
        };
        section(
            self.lost
                .iter()
                .map(|l| {
                    let on: Vec<String> = l.replicas.iter().map(|(n, s)| format!("node {n} {s}")).collect();
                    let job_type = l.job_type.as_deref().unwrap_or("?");
                    format!("lost: job {} ({job_type}, key {}): {}", l.id, l.key, on.join(", "))
                })
                .collect(),
        );
        section(
            self.slow_recoveries
                .iter()
                .map(|r| {
                    let again =
                        r.again_at_ms.map_or("never".to_string(), |at| format!("{} ms later", at - r.killed_at_ms));
                    format!(
                        "slow recovery: key {} held by {} killed at {} ms, activated again {again}",
                        r.key, r.worker, r.killed_at_ms
                    )
                })
                .collect(),
        );
        section(
            self.timing
                .early_reactivations
                .iter()
                .map(|e| {
                    format!(
                        "early reactivation: job {} (key {}) attempt {} polled at {} ms, attempt {} returned at {} ms",
                        e.id, e.key, e.first_attempt, e.first_requested_ms, e.second_attempt, e.second_ms
                    )
                })
                .collect(),
        );
        let timer = |what: &str, m: &crate::timing::TimerMiss| {
            format!(
                "{what} timer: job {} (key {}) {} of {} ms, bound {} ms, fired at {} ms",
                m.id, m.key, m.timer, m.wait_ms, m.bound_ms, m.fired_ms
            )
        };
        section(self.timing.early_timers.iter().map(|m| timer("early", m)).collect());
        section(self.timing.late_timers.iter().map(|m| timer("late", m)).collect());
        section(
            self.duplicate_creates
                .iter()
                .map(|d| {
                    let ack = match d.acknowledged {
                        Some(k) => format!("acknowledged as key {k}"),
                        None => "not acknowledged".to_string(),
                    };
                    format!(
                        "duplicate create: create {} produced {} jobs (keys {:?}; {ack})",
                        d.id,
                        d.keys.len(),
                        d.keys
                    )
                })
                .collect(),
        );
        section(
            self.misdelivered
                .iter()
                .map(|m| {
                    let mut line = format!(
                        "misdelivered: job {} (key {}, attempt {}) handed to process {} on node {}",
                        m.id,
                        m.key.map(|k| k.to_string()).unwrap_or_else(|| "?".into()),
                        m.attempt,
                        m.process,
                        m.node
                    );
                    if m.job_type != m.wanted_type {
                        let _ = write!(
                            line,
                            ": a {} job to a worker of type {}",
                            m.job_type.as_deref().unwrap_or("?"),
                            m.wanted_type.as_deref().unwrap_or("?")
                        );
                    }
                    if m.worker != m.assigned_worker {
                        let _ = write!(
                            line,
                            ": made out to worker {} for worker {}",
                            m.assigned_worker.as_deref().unwrap_or("?"),
                            m.worker.as_deref().unwrap_or("?")
                        );
                    }
                    line
                })
                .collect(),
        );
        section(
            self.stage_twice
                .iter()
                .map(|s| {
                    format!(
                        "stage twice: job {} (key {}) stage {:?} committed by attempts {:?}",
                        s.id, s.key, s.stage, s.attempts
                    )
                })
                .collect(),
        );
        section(
            self.lost_checkpoints
                .iter()
                .map(|l| {
                    format!(
                        "lost checkpoint: job {} (key {}) stage {:?} of attempt {} acknowledged, not on node {}",
                        l.id, l.key, l.stage, l.attempt, l.node
                    )
                })
                .collect(),
        );
        section(self.duplicated.iter().map(|k| format!("duplicated: job key {k} completed twice")).collect());
        section(self.stale.iter().map(|k| format!("stale: job key {k} completed by a superseded attempt")).collect());
        section(self.unexpected.iter().map(|id| format!("unexpected: job {id} completed but never created")).collect());
        section(self.divergent.iter().map(|id| format!("divergent: job {id} differs between replicas")).collect());
        section(
            self.expired_handed_out
                .iter()
                .map(|e| match (e.activated_at, e.node) {
                    (Some(at), Some(node)) => format!(
                        "expired job handed out: key {} activated at {at} on node {node}'s record, expiry {}",
                        e.key, e.expires_at
                    ),
                    _ => format!(
                        "expired job handed out: key {} handed to a worker, held as expired unrun (expiry {})",
                        e.key, e.expires_at
                    ),
                })
                .collect(),
        );
        section(
            self.ticks
                .doubled
                .iter()
                .map(|d| format!("tick doubled: {} at {}: keys {:?}", d.schedule, d.tick, d.keys))
                .collect(),
        );
        section(self.ticks.missed.iter().map(|m| format!("tick missed: {} at {}", m.schedule, m.tick)).collect());
        section(self.workflows.lines());
        section(self.limits.lines());
        section(self.cross_tenant.effects.iter().map(|e| format!("cross-tenant effect: {e}")).collect());
        section(self.cross_tenant.reads.iter().map(|r| format!("cross-tenant read: {r}")).collect());
        lines.join("\n")
    }
}

/// `replicas(key)` names the nodes that hold the job's partition.
pub fn check(history: &[Op], finals: &FinalReads, replicas: impl Fn(u64) -> Vec<usize>) -> Report {
    let mut report = Report::default();
    let attempted: BTreeSet<u64> =
        history.iter().filter(|o| o.kind == Kind::Create && o.phase == Phase::Invoke).map(|o| o.id).collect();
    let created_type: BTreeMap<u64, &str> = history
        .iter()
        .filter(|o| o.kind == Kind::Create && o.phase == Phase::Invoke)
        .filter_map(|o| o.job_type.as_deref().map(|t| (o.id, t)))
        .collect();
    let acknowledged: BTreeMap<u64, u64> = history
        .iter()
        .filter(|o| o.kind == Kind::Create && o.phase == Phase::Ok)
        .filter_map(|o| o.key.map(|k| (o.id, k)))
        .collect();
    report.attempted = attempted.len();
    report.acknowledged = acknowledged.len();

    // The final state of each job (by key), and the jobs each id (the marker
    // in the variables) became: every key a node holds for it, and every key
    // a client was told about or handed for it.
    let mut final_state: BTreeMap<u64, String> = BTreeMap::new();
    let mut keys_of_id: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for jobs in finals.values() {
        for (key, job) in jobs {
            keys_of_id.entry(job.id).or_default().insert(*key);
            let state = final_state.entry(*key).or_insert_with(|| job.state.clone());
            // A final state some replica reached wins over a lagging one's.
            if job.state == "completed" || (job.state == "expired" && state != "completed") {
                *state = job.state.clone();
            }
        }
    }
    for op in history {
        if let Some(key) = op.key {
            keys_of_id.entry(op.id).or_default().insert(key);
        }
    }
    let id_of_key: BTreeMap<u64, u64> =
        keys_of_id.iter().flat_map(|(id, keys)| keys.iter().map(move |k| (*k, *id))).collect();

    // Accepted completions, per job key.
    let mut completions: BTreeMap<u64, Vec<&Op>> = BTreeMap::new();
    for op in history.iter().filter(|o| o.kind == Kind::Complete && o.phase == Phase::Ok) {
        if let Some(key) = op.key {
            completions.entry(key).or_default().push(op);
        }
    }
    for (key, ops) in &completions {
        let id = ops[0].id;
        if !attempted.contains(&id) && !report.unexpected.contains(&id) {
            report.unexpected.push(id);
        }
        if ops.len() > 1 {
            report.duplicated.push(*key);
        }
    }
    for (key, state) in &final_state {
        let id = id_of_key[key];
        if state == "completed" && !attempted.contains(&id) && !report.unexpected.contains(&id) {
            report.unexpected.push(id);
        }
    }
    report.duplicate_creates = keys_of_id
        .iter()
        .filter(|(_, keys)| keys.len() > 1)
        .map(|(id, keys)| DuplicateCreate {
            id: *id,
            keys: keys.iter().copied().collect(),
            acknowledged: acknowledged.get(id).copied(),
        })
        .collect();

    // Misdelivered: an activation of another type than the worker asked
    // for, or made out to another worker.
    for op in history.iter().filter(|o| o.kind == Kind::Activate && o.phase == Phase::Ok) {
        let job_type = created_type.get(&op.id).copied();
        let wrong_type = matches!((job_type, op.job_type.as_deref()), (Some(a), Some(b)) if a != b);
        let wrong_worker = matches!((&op.worker, &op.assigned_worker), (Some(a), Some(b)) if a != b);
        if wrong_type || wrong_worker {
            report.misdelivered.push(Misdelivery {
                id: op.id,
                key: op.key,
                attempt: op.attempt,
                process: op.process,
                node: op.node,
                job_type: job_type.map(str::to_string),
                wanted_type: op.job_type.clone(),
                worker: op.worker.clone(),
                assigned_worker: op.assigned_worker.clone(),
            });
        }
    }

    // Stale: an accepted completion whose attempt was superseded by an
    // activation returned before the completion was invoked.
    let mut invoked_at: BTreeMap<(u64, u64, u32), u64> = BTreeMap::new();
    for op in history.iter().filter(|o| o.kind == Kind::Complete && o.phase == Phase::Invoke) {
        invoked_at.insert((op.process, op.id, op.attempt), op.time_ms);
    }
    // Each key's activations (attempt, time), looked up per completion: a
    // scan of the whole history per completion took minutes on long runs.
    let mut activations: BTreeMap<u64, Vec<(u32, u64)>> = BTreeMap::new();
    for op in history.iter().filter(|o| o.kind == Kind::Activate && o.phase == Phase::Ok) {
        if let Some(key) = op.key {
            activations.entry(key).or_default().push((op.attempt, op.time_ms));
        }
    }
    for (key, ops) in &completions {
        for done in ops {
            let Some(&started) = invoked_at.get(&(done.process, done.id, done.attempt)) else { continue };
            let superseded = activations
                .get(key)
                .is_some_and(|acts| acts.iter().any(|(attempt, at)| *attempt > done.attempt && *at < started));
            if superseded && !report.stale.contains(key) {
                report.stale.push(*key);
            }
        }
    }

    // Creates that asked for an expiry: such a job may end expired, unrun.
    let expiring: BTreeSet<u64> = history
        .iter()
        .filter(|o| o.kind == Kind::Create && o.phase == Phase::Invoke && o.expires_at.is_some())
        .map(|o| o.id)
        .collect();
    for (id, key) in &acknowledged {
        let completed = completions.contains_key(key) || final_state.get(key).is_some_and(|s| s == "completed");
        let incident = final_state.get(key).is_some_and(|s| s == "incident");
        let expired = expiring.contains(id) && final_state.get(key).is_some_and(|s| s == "expired");
        let on_replicas: BTreeMap<usize, Option<&str>> = replicas(*key)
            .into_iter()
            .map(|node| (node, finals.get(&node).map(|jobs| jobs.get(key).map_or("missing", |j| j.state.as_str()))))
            .collect();
        if completed {
            report.completed += 1;
        } else if incident {
            report.incidents += 1;
        } else if expired {
            report.expired += 1;
        } else {
            report.lost.push(LostJob {
                id: *id,
                key: *key,
                job_type: created_type.get(id).map(|t| t.to_string()),
                replicas: on_replicas.iter().map(|(n, s)| (*n, s.unwrap_or("unread").to_string())).collect(),
            });
        }
        // Divergence: every replica of the partition that answered must hold
        // the job, and in the same final state.
        let states: Vec<&str> = on_replicas.values().flatten().copied().collect();
        if states.iter().any(|s| *s == "missing" || *s != states[0]) {
            report.divergent.push(*id);
        }
    }
    for id in &attempted {
        if !acknowledged.contains_key(id) && keys_of_id.contains_key(id) {
            report.recovered.push(*id);
        }
    }
    check_stages(history, finals, &id_of_key, &mut report);
    report.expired_handed_out = crate::expiry::check(history, finals);
    report.valid = report.lost.is_empty()
        && report.expired_handed_out.is_empty()
        && report.stage_twice.is_empty()
        && report.lost_checkpoints.is_empty()
        && report.unexpected.is_empty()
        && report.duplicated.is_empty()
        && report.stale.is_empty()
        && report.duplicate_creates.is_empty()
        && report.misdelivered.is_empty()
        && report.divergent.is_empty();
    report
}

/// Acknowledged jobs whose completion no client has heard of yet: cheap, for
/// a drain to tell whether reading every replica is worth it. (A job whose
/// completion was lost, or that became an incident, only the replicas show.)
/// Session jobs are left out: the session worker processes complete them,
/// and only the replicas show that, so counting them kept every drain
/// waiting for its periodic full read.
pub fn unfinished(history: &[Op]) -> usize {
    // Jobs that may expire unrun are left out too: no client hears of that.
    let session_jobs: std::collections::HashSet<u64> = history
        .iter()
        .filter(|o| o.kind == Kind::Create)
        .filter(|o| o.job_type.as_deref() == Some(crate::sessions::SESSION_TYPE) || o.expires_at.is_some())
        .map(|o| o.id)
        .collect();
    let (mut created, mut completed) = (std::collections::HashSet::new(), std::collections::HashSet::new());
    for op in history.iter().filter(|o| o.phase == Phase::Ok) {
        match (op.kind, op.key) {
            (Kind::Create, Some(key)) if !session_jobs.contains(&op.id) => {
                created.insert(key);
            }
            // A worker may complete a job before its producer hears of the create.
            (Kind::Complete, Some(key)) => {
                completed.insert(key);
            }
            _ => {}
        }
    }
    created.difference(&completed).count()
}

/// Each stage of a job is committed once, by one attempt, in the declared
/// order, and every acknowledged checkpoint is in every replica's record.
fn check_stages(history: &[Op], finals: &FinalReads, id_of_key: &BTreeMap<u64, u64>, report: &mut Report) {
    // (key, stage) -> attempts that committed it, acknowledged or held.
    let mut committed: BTreeMap<(u64, String), BTreeSet<u32>> = BTreeMap::new();
    let acknowledged: Vec<&Op> =
        history.iter().filter(|o| o.kind == Kind::Checkpoint && o.phase == Phase::Ok).collect();
    report.checkpoints = acknowledged.len();
    for op in &acknowledged {
        if let (Some(key), Some(stage)) = (op.key, &op.stage) {
            committed.entry((key, stage.clone())).or_default().insert(op.attempt);
        }
    }
    let mut out_of_order: BTreeSet<u64> = BTreeSet::new();
    for jobs in finals.values() {
        for (key, job) in jobs {
            for (stage, attempt) in &job.checkpoints {
                committed.entry((*key, stage.clone())).or_default().insert(*attempt);
            }
            let positions: Vec<Option<usize>> =
                job.checkpoints.iter().map(|(s, _)| STAGES.iter().position(|d| d == s)).collect();
            if positions.windows(2).any(|w| w[0] >= w[1]) {
                out_of_order.insert(*key);
            }
        }
    }
    for ((key, stage), attempts) in &committed {
        if attempts.len() > 1 {
            let id = id_of_key.get(key).copied().unwrap_or_default();
            report.stage_twice.push(StageTwice {
                id,
                key: *key,
                stage: stage.clone(),
                attempts: attempts.iter().copied().collect(),
            });
        }
    }
    for key in out_of_order {
        let id = id_of_key.get(&key).copied().unwrap_or_default();
        report.stage_twice.push(StageTwice { id, key, stage: "(out of order)".into(), attempts: Vec::new() });
    }
    for op in &acknowledged {
        let (Some(key), Some(stage)) = (op.key, &op.stage) else { continue };
        for (node, jobs) in finals {
            let Some(job) = jobs.get(&key) else { continue };
            if !job.checkpoints.iter().any(|(s, a)| s == stage && *a == op.attempt) {
                report.lost_checkpoints.push(LostCheckpoint {
                    id: op.id,
                    key,
                    stage: stage.clone(),
                    attempt: op.attempt,
                    node: *node,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::FinalJob;

    fn op(time_ms: u64, process: u64, kind: Kind, phase: Phase, id: u64, key: Option<u64>, attempt: u32) -> Op {
        Op { time_ms, process, node: 0, kind, phase, id, key, attempt, ..Op::default() }
    }

    /// What a worker that asked for `wanted_type` as `worker` records when
    /// handed an activation made out to `assigned`.
    fn activated(id: u64, key: u64, attempt: u32, t: u64, wanted_type: &str, worker: &str, assigned: &str) -> Op {
        Op {
            job_type: Some(wanted_type.into()),
            worker: Some(worker.into()),
            assigned_worker: Some(assigned.into()),
            ..op(t, 2, Kind::Activate, Phase::Ok, id, Some(key), attempt)
        }
    }

    fn typed_create(id: u64, job_type: &str, t: u64) -> Op {
        Op { job_type: Some(job_type.into()), ..op(t, 1, Kind::Create, Phase::Invoke, id, None, 0) }
    }

    fn lost_ids(r: &Report) -> Vec<u64> {
        r.lost.iter().map(|l| l.id).collect()
    }

    fn created(id: u64, key: u64, t: u64) -> Vec<Op> {
        vec![
            op(t, 1, Kind::Create, Phase::Invoke, id, None, 0),
            op(t + 1, 1, Kind::Create, Phase::Ok, id, Some(key), 0),
        ]
    }

    fn completed(id: u64, key: u64, attempt: u32, t: u64, process: u64) -> Vec<Op> {
        vec![
            op(t, process, Kind::Complete, Phase::Invoke, id, Some(key), attempt),
            op(t + 1, process, Kind::Complete, Phase::Ok, id, Some(key), attempt),
        ]
    }

    fn finals(nodes: &[usize], jobs: &[(u64, u64, &str)]) -> FinalReads {
        nodes
            .iter()
            .map(|n| {
                (
                    *n,
                    jobs.iter()
                        .map(|(id, key, s)| {
                            (
                                *key,
                                FinalJob {
                                    id: *id,
                                    state: s.to_string(),
                                    job_type: "jepsen".into(),
                                    checkpoints: Vec::new(),
                                    attempt: 0,
                                    ..FinalJob::default()
                                },
                            )
                        })
                        .collect(),
                )
            })
            .collect()
    }

    fn all_nodes(_: u64) -> Vec<usize> {
        vec![0, 1, 2]
    }

    #[test]
    fn a_clean_history_is_valid() {
        let mut h = created(1, 101, 0);
        h.extend(completed(1, 101, 1, 10, 2));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
        assert!(r.valid, "{r:?}");
        assert_eq!(r.completed, 1);
    }

    #[test]
    fn a_lost_job_is_reported() {
        let mut h = created(1, 101, 0);
        h.extend(created(2, 102, 5));
        h.extend(completed(1, 101, 1, 10, 2));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
        assert!(!r.valid);
        assert_eq!(lost_ids(&r), vec![2]);
        assert_eq!(r.lost[0].replicas, [(0, "missing".into()), (1, "missing".into()), (2, "missing".into())].into());
    }

    #[test]
    fn an_unfinished_job_after_the_drain_counts_as_lost() {
        let h = created(1, 101, 0);
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "activatable")]), all_nodes);
        assert!(!r.valid);
        assert_eq!(lost_ids(&r), vec![1]);
        assert!(
            r.details().contains("lost: job 1 (?, key 101): node 0 activatable, node 1 activatable"),
            "{}",
            r.details()
        );
    }

    #[test]
    fn a_pushed_only_job_that_was_never_pushed_is_lost_with_its_state() {
        // Created for stream-only workers, acknowledged, and never handed to
        // anyone: after the drain it is still activatable where it was read.
        let mut h = vec![typed_create(1, "jepsen-pushed", 0)];
        h.push(op(1, 1, Kind::Create, Phase::Ok, 1, Some(101), 0));
        let mut f = finals(&[0, 2], &[(1, 101, "activatable")]);
        f.insert(2, BTreeMap::new());
        let r = check(&h, &f, all_nodes);
        assert!(!r.valid);
        assert_eq!(r.lost[0].job_type.as_deref(), Some("jepsen-pushed"));
        assert_eq!(
            r.lost[0].replicas,
            [(0, "activatable".into()), (1, "unread".into()), (2, "missing".into())].into(),
            "node 1 did not answer; node 2 answered without it"
        );
    }

    #[test]
    fn a_slow_recovery_makes_the_run_invalid_and_is_listed() {
        let h = created(1, 101, 0);
        let mut r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
        assert!(r.valid, "{r:?}");
        r.add_slow_recoveries(Vec::new());
        assert!(r.valid, "no slow recovery, still valid");
        let slow = crate::sessions::SlowRecovery {
            key: 101,
            worker: "session-0".into(),
            killed_at_ms: 1_000,
            again_at_ms: None,
        };
        r.add_slow_recoveries(vec![slow]);
        assert!(!r.valid);
        assert!(r.summary().contains("slow recoveries 1"), "{}", r.summary());
        assert!(r.details().contains("slow recovery: key 101 held by session-0"), "{}", r.details());
    }

    #[test]
    fn an_incident_is_not_lost() {
        let h = created(1, 101, 0);
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "incident")]), all_nodes);
        assert!(r.valid, "{r:?}");
        assert_eq!(r.incidents, 1);
    }

    #[test]
    fn an_unexpected_job_is_reported() {
        let mut h = created(1, 101, 0);
        h.extend(completed(1, 101, 1, 10, 2));
        h.extend(completed(9, 109, 1, 12, 2));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed"), (9, 109, "completed")]), all_nodes);
        assert!(!r.valid);
        assert_eq!(r.unexpected, vec![9]);
    }

    #[test]
    fn a_duplicate_completion_is_reported() {
        let mut h = created(1, 101, 0);
        h.extend(completed(1, 101, 1, 10, 2));
        h.extend(completed(1, 101, 2, 20, 3));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
        assert!(!r.valid);
        assert_eq!(r.duplicated, vec![101]);
    }

    #[test]
    fn an_acknowledged_create_that_made_two_jobs_is_a_duplicate() {
        // A gateway re-submitted a create whose answer it lost: two jobs for
        // one marker, each completed once. The client asked for one job.
        let mut h = created(1, 102, 0);
        h.extend(completed(1, 101, 1, 10, 2));
        h.extend(completed(1, 102, 1, 12, 3));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed"), (1, 102, "completed")]), all_nodes);
        assert!(!r.valid, "{r:?}");
        assert!(r.duplicated.is_empty(), "each job completed once");
        assert_eq!(r.duplicate_creates, vec![DuplicateCreate { id: 1, keys: vec![101, 102], acknowledged: Some(102) }]);
        assert!(
            r.details().contains("create 1 produced 2 jobs (keys [101, 102]; acknowledged as key 102)"),
            "{}",
            r.details()
        );
    }

    #[test]
    fn an_unacknowledged_create_that_made_two_jobs_is_a_duplicate() {
        let mut h =
            vec![op(0, 1, Kind::Create, Phase::Invoke, 7, None, 0), op(9, 1, Kind::Create, Phase::Info, 7, None, 0)];
        h.extend(completed(7, 107, 1, 20, 2));
        // The second job is only in the final reads, never handed to anyone.
        let r = check(&h, &finals(&[0, 1, 2], &[(7, 107, "completed"), (7, 108, "activatable")]), all_nodes);
        assert!(!r.valid, "{r:?}");
        assert!(r.lost.is_empty(), "nothing acknowledged, nothing lost");
        assert_eq!(r.duplicate_creates, vec![DuplicateCreate { id: 7, keys: vec![107, 108], acknowledged: None }]);
        assert!(
            r.details().contains("create 7 produced 2 jobs (keys [107, 108]; not acknowledged)"),
            "{}",
            r.details()
        );
    }

    #[test]
    fn a_second_job_seen_only_by_a_worker_is_a_duplicate() {
        // The final reads hold one job, but a worker was handed another key
        // carrying the same marker.
        let mut h = created(1, 101, 0);
        h.push(op(5, 2, Kind::Activate, Phase::Ok, 1, Some(109), 1));
        h.extend(completed(1, 101, 1, 10, 2));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
        assert!(!r.valid);
        assert_eq!(r.duplicate_creates[0].keys, vec![101, 109]);
    }

    #[test]
    fn a_job_of_another_type_pushed_to_a_stream_is_misdelivered() {
        let mut h = vec![typed_create(1, "jepsen", 0)];
        h.push(op(1, 1, Kind::Create, Phase::Ok, 1, Some(101), 0));
        h.push(activated(1, 101, 1, 5, "jepsen-pushed", "pushed", "pushed"));
        h.extend(completed(1, 101, 1, 10, 2));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
        assert!(!r.valid);
        assert_eq!(r.misdelivered.len(), 1);
        assert!(r.details().contains("a jepsen job to a worker of type jepsen-pushed"), "{}", r.details());
    }

    #[test]
    fn an_activation_made_out_to_another_worker_is_misdelivered() {
        let mut h = vec![typed_create(1, "jepsen", 0)];
        h.push(op(1, 1, Kind::Create, Phase::Ok, 1, Some(101), 0));
        h.push(activated(1, 101, 1, 5, "jepsen", "streamer-b", "streamer-a"));
        h.extend(completed(1, 101, 1, 10, 2));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
        assert!(!r.valid);
        assert!(r.details().contains("made out to worker streamer-a for worker streamer-b"), "{}", r.details());
    }

    #[test]
    fn an_activation_for_the_worker_that_asked_is_not_misdelivered() {
        let mut h = vec![typed_create(1, "jepsen", 0)];
        h.push(op(1, 1, Kind::Create, Phase::Ok, 1, Some(101), 0));
        h.push(activated(1, 101, 1, 5, "jepsen", "streamer-a", "streamer-a"));
        h.extend(completed(1, 101, 1, 10, 2));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
        assert!(r.valid, "{r:?}");
    }

    #[test]
    fn a_stale_completion_is_reported() {
        let mut h = created(1, 101, 0);
        // Attempt 1 goes to process 2, times out; attempt 2 goes to process 3.
        h.push(op(5, 2, Kind::Activate, Phase::Ok, 1, Some(101), 1));
        h.push(op(50, 3, Kind::Activate, Phase::Ok, 1, Some(101), 2));
        // Process 2 completes attempt 1 after attempt 2 was handed out, and it is accepted.
        h.extend(completed(1, 101, 1, 60, 2));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
        assert!(!r.valid);
        assert_eq!(r.stale, vec![101]);
    }

    #[test]
    fn a_completion_invoked_before_the_newer_activation_is_not_stale() {
        let mut h = created(1, 101, 0);
        h.push(op(5, 2, Kind::Activate, Phase::Ok, 1, Some(101), 1));
        h.push(op(40, 2, Kind::Complete, Phase::Invoke, 1, Some(101), 1));
        h.push(op(50, 3, Kind::Activate, Phase::Ok, 1, Some(101), 2));
        h.push(op(60, 2, Kind::Complete, Phase::Ok, 1, Some(101), 1));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
        assert!(r.stale.is_empty(), "{r:?}");
    }

    #[test]
    fn a_drain_counts_jobs_no_client_heard_completed() {
        let mut h = vec![
            op(0, 1, Kind::Create, Phase::Ok, 1, Some(10), 0),
            op(1, 2, Kind::Complete, Phase::Ok, 2, Some(11), 1),
            op(2, 1, Kind::Create, Phase::Ok, 2, Some(11), 0),
        ];
        assert_eq!(unfinished(&h), 1, "job 10 is open; 11 was completed before its create was heard of");
        h.push(op(3, 2, Kind::Complete, Phase::Ok, 1, Some(10), 1));
        assert_eq!(unfinished(&h), 0);
        // A session job's completion is never in the history: not counted.
        let session = crate::sessions::SESSION_TYPE.to_string();
        h.push(Op { job_type: Some(session), ..op(4, 1, Kind::Create, Phase::Invoke, 3, None, 0) });
        h.push(op(5, 1, Kind::Create, Phase::Ok, 3, Some(12), 0));
        assert_eq!(unfinished(&h), 0);
    }

    #[test]
    fn a_divergent_node_is_reported() {
        let mut h = created(1, 101, 0);
        h.extend(completed(1, 101, 1, 10, 2));
        let mut f = finals(&[0, 1], &[(1, 101, "completed")]);
        f.insert(2, BTreeMap::new()); // node 2 answered but lacks the job
        let r = check(&h, &f, all_nodes);
        assert!(!r.valid);
        assert_eq!(r.divergent, vec![1]);
        let mut f = finals(&[0, 1], &[(1, 101, "completed")]);
        f.insert(
            2,
            [(
                101,
                FinalJob {
                    id: 1,
                    state: "activatable".into(),
                    job_type: "jepsen".into(),
                    checkpoints: Vec::new(),
                    attempt: 0,
                    ..FinalJob::default()
                },
            )]
            .into(),
        );
        assert_eq!(check(&h, &f, all_nodes).divergent, vec![1], "another state on one node");
    }

    #[test]
    fn an_unknown_create_that_appears_is_recovered_not_a_violation() {
        let mut h =
            vec![op(0, 1, Kind::Create, Phase::Invoke, 7, None, 0), op(9, 1, Kind::Create, Phase::Info, 7, None, 0)];
        h.extend(completed(7, 107, 1, 20, 2));
        let r = check(&h, &finals(&[0, 1, 2], &[(7, 107, "completed")]), all_nodes);
        assert!(r.valid, "{r:?}");
        assert_eq!(r.recovered, vec![7]);
    }

    fn checkpointed(id: u64, key: u64, attempt: u32, stage: &str, t: u64) -> Op {
        Op { stage: Some(stage.into()), ..op(t, 3, Kind::Checkpoint, Phase::Ok, id, Some(key), attempt) }
    }

    fn staged_finals(checkpoints: &[(&str, u32)]) -> FinalReads {
        let mut f = finals(&[0, 1, 2], &[(9, 109, "completed")]);
        for jobs in f.values_mut() {
            jobs.get_mut(&109).unwrap().checkpoints = checkpoints.iter().map(|(s, a)| (s.to_string(), *a)).collect();
        }
        f
    }

    #[test]
    fn a_stage_committed_by_two_attempts_is_an_anomaly() {
        let mut h = created(9, 109, 0);
        h.push(checkpointed(9, 109, 1, "reserved", 5));
        h.push(checkpointed(9, 109, 2, "charged", 8));
        h.extend(completed(9, 109, 2, 10, 3));
        let r = check(&h, &staged_finals(&[("reserved", 1), ("charged", 2)]), all_nodes);
        assert!(r.valid, "resuming at the next stage is right: {r:?}");
        assert_eq!(r.checkpoints, 2);

        h.push(checkpointed(9, 109, 2, "reserved", 9));
        let r = check(&h, &staged_finals(&[("reserved", 1), ("charged", 2)]), all_nodes);
        assert!(!r.valid);
        assert_eq!(r.stage_twice.len(), 1);
        assert_eq!((r.stage_twice[0].stage.as_str(), &r.stage_twice[0].attempts[..]), ("reserved", &[1, 2][..]));
    }

    #[test]
    fn an_acknowledged_checkpoint_missing_from_a_replica_is_lost() {
        let mut h = created(9, 109, 0);
        h.push(checkpointed(9, 109, 1, "reserved", 5));
        h.push(checkpointed(9, 109, 1, "charged", 6));
        h.extend(completed(9, 109, 1, 10, 3));
        let r = check(&h, &staged_finals(&[("reserved", 1)]), all_nodes);
        assert!(!r.valid);
        assert_eq!(r.lost_checkpoints.len(), 3, "one per replica: {:?}", r.lost_checkpoints);
        let r = check(&h, &staged_finals(&[("charged", 1), ("reserved", 1)]), all_nodes);
        assert!(r.stage_twice.iter().any(|s| s.stage == "(out of order)"), "{r:?}");
    }

    #[test]
    fn a_keyed_create_sent_twice_is_valid_with_one_job_and_a_duplicate_with_two() {
        let mut h = vec![
            op(0, 1, Kind::Create, Phase::Invoke, 4, None, 0),
            op(5, 1, Kind::Create, Phase::Info, 4, None, 0),
            op(6, 1, Kind::Create, Phase::Invoke, 4, None, 0),
            op(7, 1, Kind::Create, Phase::Ok, 4, Some(104), 0),
        ];
        h.extend(completed(4, 104, 1, 10, 2));
        assert!(check(&h, &finals(&[0, 1, 2], &[(4, 104, "completed")]), all_nodes).valid);
        let two = finals(&[0, 1, 2], &[(4, 104, "completed"), (4, 105, "activatable")]);
        let r = check(&h, &two, all_nodes);
        assert!(!r.valid);
        assert_eq!(r.duplicate_creates[0].keys, vec![104, 105]);
    }
}
