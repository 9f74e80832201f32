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
//! - **recovered** (reported, not a violation): a create whose outcome was
//!   unknown (a send answered `info`) whose job exists after all;
//! - **failed yet made**: a create every send of which certainly failed
//!   (`fail`: refused before anything was done) whose job exists;
//! - **divergent**: after healing, a node's replica misses an acknowledged job
//!   or holds it in another final state than the other replicas;
//! - **completion rolled back**: a completion a client heard acknowledged of
//!   a job that no replica holds completed after the drain;
//! - **activated after completion**: a job handed to a worker at a later
//!   attempt after a client heard its completion acknowledged;
//! - **attempt handed twice**: one activation (key and attempt) handed to
//!   two workers, or twice to one;
//! - **unexplained incident**: a job that ended an incident though no
//!   failure the history records asked to leave it without retries (the
//!   workload fails a job for good now and then, on purpose; its jobs carry
//!   far more retries than a run's dead sessions can use), and no write of
//!   the attacker's touched it (that is a cross-tenant effect);
//! - **slow recovery**: a killed session worker's job not activated again
//!   within the session's bound (see `sessions`);
//! - **early reactivation**, **early timer**, **late timer**: timers held to
//!   real time (see `timing`);
//! - **cross-tenant effect**, **cross-tenant read**: what a second tenant's
//!   attacks achieved on the first's jobs and sessions (see `attacker`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use serde::Serialize;

use crate::history::{FinalJob, FinalReads, Kind, Op, Phase};
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
    /// The worker name the worker asked for, and the one on the activation
    /// (or, when the activation does not say, the one a replica records).
    pub worker: Option<String>,
    pub assigned_worker: Option<String>,
    /// Another tenant's job: its tenant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
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

/// A completion a client heard acknowledged, of a job no replica holds
/// completed.
#[derive(Debug, Serialize, PartialEq)]
pub struct RolledBack {
    pub id: u64,
    pub key: u64,
    /// The attempt whose completion was acknowledged.
    pub attempt: u32,
    /// Replica node -> the job's state there (as for lost jobs).
    pub replicas: BTreeMap<usize, String>,
}

/// A job handed out again at a later attempt after a client heard its
/// completion acknowledged.
#[derive(Debug, Serialize, PartialEq)]
pub struct AfterCompletion {
    pub id: u64,
    pub key: u64,
    pub completed_attempt: u32,
    pub acknowledged_ms: u64,
    pub attempt: u32,
    pub activated_ms: u64,
    pub process: u64,
}

/// One activation (key and attempt) handed out more than once.
#[derive(Debug, Serialize, PartialEq)]
pub struct HandedTwice {
    pub id: u64,
    pub key: u64,
    pub attempt: u32,
    /// The processes it was handed to, once per handing.
    pub processes: Vec<u64>,
}

/// An incident no recorded failure explains.
#[derive(Debug, Serialize, PartialEq)]
pub struct UnexplainedIncident {
    pub id: u64,
    pub key: u64,
    pub why: String,
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
    pub failed_yet_made: Vec<u64>,
    pub rolled_back: Vec<RolledBack>,
    pub activated_after_completion: Vec<AfterCompletion>,
    pub handed_twice: Vec<HandedTwice>,
    pub unexplained_incidents: Vec<UnexplainedIncident>,
    /// Replicas of acknowledged jobs' partitions whose node did not answer
    /// the final read: what they hold was never compared.
    pub unread_replicas: Vec<usize>,
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
    /// The faults the run injected, by nemesis and kind (see `faults`).
    pub faults: crate::faults::Tally,
    /// No anomaly was found.
    pub valid: bool,
    /// Why a run with no anomaly cannot be called valid: a part of it went
    /// unobserved (see [`Report::verdict`]).
    pub unknown: Vec<String>,
}

/// What a run comes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    /// Every check ran on everything it should, and none found an anomaly.
    Valid,
    /// No anomaly found, but part of the run went unobserved (its nemesis
    /// never fired, a replica or a job was never read, a planned fault was
    /// skipped, the plan never settled): it proves less than a valid run.
    Unknown,
    /// An anomaly was found.
    Invalid,
}

impl Verdict {
    /// The process exit code that says it: 0, 2 and 1.
    pub fn code(self) -> i32 {
        match self {
            Verdict::Valid => 0,
            Verdict::Invalid => 1,
            Verdict::Unknown => 2,
        }
    }

    pub fn from_code(code: i32) -> Option<Verdict> {
        [Verdict::Valid, Verdict::Invalid, Verdict::Unknown].into_iter().find(|v| v.code() == code)
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Valid => "VALID",
            Verdict::Unknown => "UNKNOWN",
            Verdict::Invalid => "INVALID",
        })
    }
}

/// At most this many lines per anomaly in the text report (all are in the JSON).
const DETAIL_LINES: usize = 20;

impl Report {
    pub fn verdict(&self) -> Verdict {
        match (self.valid, self.unknown.is_empty()) {
            (false, _) => Verdict::Invalid,
            (true, false) => Verdict::Unknown,
            (true, true) => Verdict::Valid,
        }
    }

    /// Notes a part of the run that went unobserved.
    pub fn unobserved(&mut self, why: String) {
        if !self.unknown.contains(&why) {
            self.unknown.push(why);
        }
    }

    /// Every anomaly class that invalidates, with how often it was found:
    /// what a negative control is held to.
    pub fn classes(&self) -> Vec<(&'static str, usize)> {
        vec![
            ("lost", self.lost.len()),
            ("unexpected", self.unexpected.len()),
            ("duplicated", self.duplicated.len()),
            ("stale", self.stale.len()),
            ("duplicate create", self.duplicate_creates.len()),
            ("failed yet made", self.failed_yet_made.len()),
            ("misdelivered", self.misdelivered.len()),
            ("attempt handed twice", self.handed_twice.len()),
            ("stage twice", self.stage_twice.len()),
            ("lost checkpoint", self.lost_checkpoints.len()),
            ("divergent", self.divergent.len()),
            ("completion rolled back", self.rolled_back.len()),
            ("activated after completion", self.activated_after_completion.len()),
            ("unexplained incident", self.unexplained_incidents.len()),
            ("slow recovery", self.slow_recoveries.len()),
            ("early reactivation", self.timing.early_reactivations.len()),
            ("early timer", self.timing.early_timers.len()),
            ("late timer", self.timing.late_timers.len()),
            ("expired job handed out", self.expired_handed_out.len()),
            ("tick doubled", self.ticks.doubled.len()),
            ("tick missed", self.ticks.missed.len()),
            ("step lost", self.workflows.step_lost.len()),
            ("step twice", self.workflows.step_twice.len()),
            ("callback lost", self.workflows.callback_lost.len()),
            ("callback twice", self.workflows.callback_twice.len()),
            ("wrong end", self.workflows.wrong_end.len()),
            ("limit exceeded", self.limits.exceeded.len()),
            ("limited job stuck", self.limits.stuck.len()),
            ("limited job lost", self.limits.lost.len()),
            ("cross-tenant effect", self.cross_tenant.effects.len()),
            ("cross-tenant read", self.cross_tenant.reads.len()),
        ]
    }

    /// How often `class` (a name [`Report::classes`] gives) was found.
    #[cfg(test)]
    pub fn found(&self, class: &str) -> usize {
        self.classes().into_iter().find(|(name, _)| *name == class).map_or(0, |(_, n)| n)
    }

    /// The parts of the run no check saw, from what the checks counted:
    /// replicas, limited jobs, workflows and schedules no node or gateway
    /// answered for at the end.
    pub fn note_unread(&mut self) {
        if !self.unread_replicas.is_empty() {
            self.unobserved(format!("nodes {:?} did not answer the final read", self.unread_replicas));
        }
        if self.limits.unread > 0 {
            self.unobserved(format!("{} limited jobs unread", self.limits.unread));
        }
        if self.workflows.unread > 0 {
            self.unobserved(format!("{} workflows unread", self.workflows.unread));
        }
        if self.ticks.unread > 0 {
            self.unobserved(format!("{} schedules unread", self.ticks.unread));
        }
    }

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

    /// The verdict (with why, when UNKNOWN), the counts, every class
    /// with how often it was found, the faults injected, and the other
    /// checks' own summaries: the first line of the report.
    pub fn summary(&self) -> String {
        let verdict = match self.verdict() {
            Verdict::Unknown => format!("UNKNOWN ({})", self.unknown.join("; ")),
            verdict => verdict.to_string(),
        };
        let classes: Vec<String> = self
            .classes()
            .into_iter()
            .filter(|(name, _)| !name.starts_with("tick") && !self.in_own_summary(name))
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        format!(
            "{verdict}: {} attempted, {} acknowledged, {} completed, {} incidents, {} expired; {}; recovered {}, \
             checkpoints {}, worker kills {}, unread replicas {}; faults: {}; {}; {}; {}; {}",
            self.attempted,
            self.acknowledged,
            self.completed,
            self.incidents,
            self.expired,
            classes.join(", "),
            self.recovered.len(),
            self.checkpoints,
            self.worker_kills,
            self.unread_replicas.len(),
            self.faults.summary(),
            self.ticks.summary(),
            self.workflows.summary(),
            self.limits.summary(),
            self.cross_tenant.summary(),
        )
    }

    /// Classes another check's summary names with its own figures.
    fn in_own_summary(&self, class: &str) -> bool {
        let workflows = ["step lost", "step twice", "callback lost", "callback twice", "wrong end"];
        let limits = ["limit exceeded", "limited job stuck", "limited job lost"];
        workflows.contains(&class) || limits.contains(&class) || class.starts_with("cross-tenant")
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
            self.rolled_back
                .iter()
                .map(|r| {
                    let on: Vec<String> = r.replicas.iter().map(|(n, s)| format!("node {n} {s}")).collect();
                    format!(
                        "completion rolled back: job {} (key {}) completion of attempt {} acknowledged: {}",
                        r.id,
                        r.key,
                        r.attempt,
                        on.join(", ")
                    )
                })
                .collect(),
        );
        section(
            self.activated_after_completion
                .iter()
                .map(|a| {
                    format!(
                        "activated after completion: job {} (key {}) completion of attempt {} acknowledged at {} ms, \
                         attempt {} handed to process {} at {} ms",
                        a.id, a.key, a.completed_attempt, a.acknowledged_ms, a.attempt, a.process, a.activated_ms
                    )
                })
                .collect(),
        );
        section(
            self.handed_twice
                .iter()
                .map(|h| {
                    format!(
                        "attempt handed twice: job {} (key {}) attempt {} handed to processes {:?}",
                        h.id, h.key, h.attempt, h.processes
                    )
                })
                .collect(),
        );
        section(
            self.unexplained_incidents
                .iter()
                .map(|i| format!("unexplained incident: job {} (key {}): {}", i.id, i.key, i.why))
                .collect(),
        );
        section(
            self.failed_yet_made
                .iter()
                .map(|id| format!("failed yet made: create {id} was refused at every send, and its job exists"))
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
                    if let Some(tenant) = &m.tenant {
                        let _ = write!(line, ": a job of tenant {tenant:?}");
                    }
                    if m.id == 0 {
                        let _ = write!(line, ": a job without a workload id");
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
        section(self.ticks.lines());
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
    // Id 0 is no create's: the activations of jobs without a workload id
    // (a workflow's, the limited queue's, or one handed to the wrong worker).
    for op in history.iter().filter(|o| o.id != 0) {
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
    // for (by the create, or by the job as handed out), of another tenant's
    // job, of a job without a workload id handed to a workload worker, or
    // made out to another worker (as the activation says, or as a replica
    // records the attempt).
    let recorded_worker = |key: u64, attempt: u32| -> Option<&str> {
        finals
            .values()
            .filter_map(|jobs| jobs.get(&key))
            .find_map(|job| job.activations.iter().find(|(a, _)| *a == attempt).map(|(_, worker)| worker.as_str()))
    };
    for op in history.iter().filter(|o| o.kind == Kind::Activate && o.phase == Phase::Ok) {
        let job_type = created_type.get(&op.id).copied().or(op.handed_type.as_deref());
        let wanted = op.job_type.as_deref();
        let wrong_type = matches!((job_type, wanted), (Some(a), Some(b)) if a != b)
            || matches!((op.handed_type.as_deref(), wanted), (Some(a), Some(b)) if a != b);
        let foreign = op.tenant.as_deref().is_some_and(|t| !t.is_empty() && t != drover::core::DEFAULT_TENANT);
        let no_id = op.id == 0 && wanted.is_some_and(|t| crate::workload::WORKLOAD_TYPES.contains(&t));
        let assigned = op.assigned_worker.as_deref().or_else(|| op.key.and_then(|k| recorded_worker(k, op.attempt)));
        let wrong_worker = matches!((op.worker.as_deref(), assigned), (Some(a), Some(b)) if a != b)
            || matches!(
                (op.worker.as_deref(), op.key.and_then(|k| recorded_worker(k, op.attempt))),
                (Some(a), Some(b)) if a != b
            );
        if wrong_type || wrong_worker || foreign || no_id {
            report.misdelivered.push(Misdelivery {
                id: op.id,
                key: op.key,
                attempt: op.attempt,
                process: op.process,
                node: op.node,
                job_type: job_type.map(str::to_string),
                wanted_type: op.job_type.clone(),
                worker: op.worker.clone(),
                assigned_worker: assigned.map(str::to_string),
                tenant: op.tenant.clone().filter(|_| foreign),
            });
        }
    }

    // Each key's activations, in history order: looked up per job below (a
    // scan of the whole history per completed job took minutes on long runs).
    let mut activated: BTreeMap<u64, Vec<&Op>> = BTreeMap::new();
    for op in history.iter().filter(|o| o.kind == Kind::Activate && o.phase == Phase::Ok) {
        if let Some(key) = op.key {
            activated.entry(key).or_default().push(op);
        }
    }

    // One activation handed out more than once: an attempt is one worker's.
    let mut handed: BTreeMap<(u64, u32), Vec<&Op>> = BTreeMap::new();
    for (key, ops) in &activated {
        for op in ops {
            handed.entry((*key, op.attempt)).or_default().push(op);
        }
    }
    for ((key, attempt), ops) in &handed {
        if ops.len() > 1 {
            report.handed_twice.push(HandedTwice {
                id: ops[0].id,
                key: *key,
                attempt: *attempt,
                processes: ops.iter().map(|o| o.process).collect(),
            });
        }
    }

    // Activated after completion: a later attempt handed out after a
    // client heard the completion of an earlier one acknowledged.
    for (key, done) in &completions {
        let first = done.iter().min_by_key(|o| o.time_ms).expect("a completion");
        let later =
            activated.get(key).into_iter().flatten().filter(|o| o.attempt > first.attempt && o.time_ms > first.time_ms);
        for op in later {
            report.activated_after_completion.push(AfterCompletion {
                id: first.id,
                key: *key,
                completed_attempt: first.attempt,
                acknowledged_ms: first.time_ms,
                attempt: op.attempt,
                activated_ms: op.time_ms,
                process: op.process,
            });
        }
    }

    // Stale: an accepted completion whose attempt was superseded by an
    // activation returned before the completion was invoked.
    let mut invoked_at: BTreeMap<(u64, u64, u32), u64> = BTreeMap::new();
    for op in history.iter().filter(|o| o.kind == Kind::Complete && o.phase == Phase::Invoke) {
        invoked_at.insert((op.process, op.id, op.attempt), op.time_ms);
    }
    for (key, ops) in &completions {
        for done in ops {
            let Some(&started) = invoked_at.get(&(done.process, done.id, done.attempt)) else { continue };
            let superseded = activated
                .get(key)
                .is_some_and(|acts| acts.iter().any(|o| o.attempt > done.attempt && o.time_ms < started));
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
    // What each replica of a job's partition holds: its state, `missing`
    // when the node answered without it, `None` when it did not answer.
    let on_replicas = |key: u64| -> BTreeMap<usize, Option<&str>> {
        replicas(key)
            .into_iter()
            .map(|node| (node, finals.get(&node).map(|jobs| jobs.get(&key).map_or("missing", |j| j.state.as_str()))))
            .collect()
    };
    let shown = |held: &BTreeMap<usize, Option<&str>>| -> BTreeMap<usize, String> {
        held.iter().map(|(n, s)| (*n, s.unwrap_or("unread").to_string())).collect()
    };
    let mut unread: BTreeSet<usize> = BTreeSet::new();
    for (id, key) in &acknowledged {
        let state = final_state.get(key).map(String::as_str);
        let held = on_replicas(*key);
        unread.extend(held.iter().filter(|(_, s)| s.is_none()).map(|(n, _)| *n));
        match state {
            Some("completed") => report.completed += 1,
            // Completed for a client, not on the replicas: rolled back (below).
            _ if completions.contains_key(key) => {}
            Some("incident") => {
                report.incidents += 1;
                if let Some(why) = unexplained(*key, history, finals) {
                    report.unexplained_incidents.push(UnexplainedIncident { id: *id, key: *key, why });
                }
            }
            Some("expired") if expiring.contains(id) => report.expired += 1,
            _ => report.lost.push(LostJob {
                id: *id,
                key: *key,
                job_type: created_type.get(id).map(|t| t.to_string()),
                replicas: shown(&held),
            }),
        }
        // Divergence: every replica of the partition that answered must hold
        // the job, and in the same final state.
        let states: Vec<&str> = held.values().flatten().copied().collect();
        if states.iter().any(|s| *s == "missing" || *s != states[0]) {
            report.divergent.push(*id);
        }
    }
    report.unread_replicas = unread.into_iter().collect();
    // A completion acknowledged is final: some replica that answered must
    // hold the job completed.
    for (key, done) in &completions {
        let held = on_replicas(*key);
        let answered = held.values().any(Option::is_some);
        if answered && final_state.get(key).map(String::as_str) != Some("completed") {
            let first = done.iter().min_by_key(|o| o.time_ms).expect("a completion");
            report.rolled_back.push(RolledBack {
                id: first.id,
                key: *key,
                attempt: first.attempt,
                replicas: shown(&held),
            });
        }
    }
    // A create that was not acknowledged and whose job exists: recovered
    // when some send's outcome was unknown, an anomaly when every send was
    // refused (a `fail` certainly did not happen).
    let mut sends: BTreeMap<u64, Vec<Phase>> = BTreeMap::new();
    for op in history.iter().filter(|o| o.kind == Kind::Create && o.phase != Phase::Invoke) {
        sends.entry(op.id).or_default().push(op.phase);
    }
    for id in &attempted {
        if !acknowledged.contains_key(id) && keys_of_id.contains_key(id) {
            let refused = sends.get(id).is_some_and(|phases| phases.iter().all(|p| *p == Phase::Fail));
            match refused {
                true => report.failed_yet_made.push(*id),
                false => report.recovered.push(*id),
            }
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
        && report.failed_yet_made.is_empty()
        && report.misdelivered.is_empty()
        && report.handed_twice.is_empty()
        && report.rolled_back.is_empty()
        && report.activated_after_completion.is_empty()
        && report.unexplained_incidents.is_empty()
        && report.divergent.is_empty();
    report
}

/// Why job `key`'s incident is unexplained, if it is. An incident is a
/// failure that left the job no retries; the workload's jobs carry far more
/// than its dead sessions use (`workload::RETRIES`), so one is explained
/// only by a worker's failure asking for none (the workload's, on purpose:
/// recorded with the retries it asked for), at the attempt whose failure the
/// replicas record as leaving none, or by the attacker (a cross-tenant
/// effect, counted there).
fn unexplained(key: u64, history: &[Op], finals: &FinalReads) -> Option<String> {
    let held: Vec<&FinalJob> = finals.values().filter_map(|jobs| jobs.get(&key)).collect();
    if held.iter().any(|job| job.actors.iter().any(|a| crate::attacker::is_attacker(a))) {
        return None;
    }
    let asked_none: BTreeSet<u32> = history
        .iter()
        .filter(|o| o.kind == Kind::Fail && o.phase == Phase::Invoke && o.key == Some(key) && o.retries == Some(0))
        .map(|o| o.attempt)
        .collect();
    // The replica's record of the failure that left none, if it kept one.
    let last = held
        .iter()
        .max_by_key(|job| job.failures.len())
        .and_then(|job| job.failures.iter().rev().find(|f| f.retries == 0));
    match last {
        Some(failure) if asked_none.contains(&failure.attempt) => None,
        Some(failure) => Some(format!(
            "attempt {} failed ({}, {:?}) leaving no retries, and no worker asked for that",
            failure.attempt, failure.reason, failure.message
        )),
        None if !asked_none.is_empty() => None,
        None => Some("no recorded failure asked to leave it without retries".into()),
    }
}

/// Acknowledged jobs whose completion (or failure for good) no client has
/// heard of yet: cheap, for a drain to tell whether reading every replica is
/// worth it. (A job whose completion was lost only the replicas show.)
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
            // Failed for good on purpose: an incident, finished too.
            (Kind::Fail, Some(key)) if op.retries == Some(0) => {
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
#[path = "checker_tests.rs"]
mod tests;
