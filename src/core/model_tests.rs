//! Random command sequences against the engine, with the lifecycle's
//! invariants checked after every step.
//!
//! Each run draws a seeded sequence of single-command batches (creates with
//! and without idempotency keys, activations with and without sessions,
//! completions, failures, timeouts, retries, cancels, yields, checkpoints,
//! session registrations, beats and ends) at leader times that mostly move
//! forward and sometimes step back, as a new leader's clock may. After every
//! step:
//! - attempts only grow, and each activation hands a job out at a new attempt
//!   (one holder at a time);
//! - a job that finished never comes back: not in memory, never activated;
//! - an outcome (complete, fail, timeout, checkpoint) is accepted only for the
//!   job's current attempt while it is activated (or the override attempt 0);
//! - retries change only as the rules say: set by a failure or an update of
//!   that job, otherwise only down by one (a dead worker's attempt);
//! - a second replica fed the same batches answers and holds exactly the same.
//!
//! A failure prints the seed and step; rerun one with `DROVER_MODEL_SEED`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

const TYPES: [&str; 2] = ["a", "b"];
const TENANTS: [&str; 2] = [DEFAULT_TENANT, "acme"];
const STAGES: [&str; 2] = ["one", "two"];
const RUNS: u64 = 200;
const STEPS: usize = 300;

struct World {
    rng: StdRng,
    now: Millis,
    keys: Vec<JobKey>,
    sessions: Vec<SessionId>,
    next_session: SessionId,
}

impl World {
    fn key(&mut self) -> JobKey {
        if self.keys.is_empty() || self.rng.random_ratio(1, 20) {
            return JobKey::new(0, self.rng.random_range(1..500));
        }
        self.keys[self.rng.random_range(0..self.keys.len())]
    }

    /// The attempt a command names: mostly the job's, sometimes an old one,
    /// a future one, or the override 0.
    fn attempt(&mut self, state: &PartitionState, key: JobKey) -> u32 {
        let current = state.job(key).map_or(1, |j| j.attempt);
        match self.rng.random_range(0..10) {
            0 => 0,
            1 => current.saturating_sub(1),
            2 => current + 1,
            _ => current,
        }
    }

    fn session(&mut self) -> SessionId {
        match self.sessions.len() {
            0 => 0,
            n if self.rng.random_ratio(1, 3) => self.sessions[self.rng.random_range(0..n)],
            _ => 0,
        }
    }

    fn command(&mut self, state: &PartitionState) -> Command {
        let rng = &mut self.rng;
        match rng.random_range(0..100) {
            0..25 => {
                let spec = JobSpec {
                    job_type: TYPES[rng.random_range(0..2)].into(),
                    tenant: TENANTS[rng.random_range(0..2)].into(),
                    variables: r#"{"n":1}"#.into(),
                    stages: if rng.random_ratio(1, 3) { STAGES.map(String::from).to_vec() } else { Vec::new() },
                    retry_back_off_ms: if rng.random_ratio(1, 4) { 200 } else { 0 },
                    ..Default::default()
                };
                let request = rng.random_ratio(1, 3).then(|| RequestId::Key {
                    tenant: spec.tenant.clone(),
                    user: String::new(),
                    key: format!("k{}", rng.random_range(0..20)),
                });
                Command::Create(NewJob {
                    spec: Arc::new(spec),
                    retries: rng.random_range(0..4),
                    run_at: None,
                    delay_ms: if rng.random_ratio(1, 5) { rng.random_range(1..500) } else { 0 },
                    request,
                    dedupe_window_ms: 60_000,
                })
            }
            25..45 => {
                let tenants = vec![TENANTS[rng.random_range(0..2)].to_string()];
                let (job_type, max_jobs, timeout_ms) =
                    (TYPES[rng.random_range(0..2)].into(), rng.random_range(1..4), rng.random_range(50..800));
                Command::Activate(Activation {
                    job_type,
                    tenants,
                    worker: "w".into(),
                    timeout_ms,
                    max_jobs,
                    max_bytes: u64::MAX,
                    session: self.session(),
                    via: Via::Unknown,
                    taker: Default::default(),
                    rivals: Vec::new(),
                })
            }
            45..60 => {
                let key = self.key();
                Command::Complete { key, attempt: self.attempt(state, key), variables: Bytes::new() }
            }
            60..68 => {
                let key = self.key();
                let attempt = self.attempt(state, key);
                let rng = &mut self.rng;
                let reason = [FailReason::Failed, FailReason::BusinessError, FailReason::MalformedPayload]
                    [rng.random_range(0..3)];
                Command::Fail {
                    key,
                    attempt,
                    retries: rng.random_range(0..4),
                    error_message: "no".into(),
                    back_off_ms: if rng.random_ratio(1, 3) { 100 } else { 0 },
                    variables: Bytes::new(),
                    max_payload_bytes: 1 << 20,
                    reason,
                }
            }
            68..73 => {
                let key = self.key();
                let attempt = self.attempt(state, key);
                Command::UpdateTimeout { key, attempt, timeout_ms: self.rng.random_range(1..1000) }
            }
            73..77 => {
                let key = self.key();
                Command::UpdateRetries { key, retries: self.rng.random_range(0..4), by: String::new() }
            }
            77..80 => Command::Cancel { key: self.key(), by: String::new() },
            80..84 => {
                let key = self.key();
                Command::Yield { key, attempt: self.attempt(state, key), gateway: 1, reason: YieldReason::NotReady }
            }
            84..89 => {
                let key = self.key();
                let attempt = self.attempt(state, key);
                let stage = STAGES[self.rng.random_range(0..2)].into();
                Command::Checkpoint { key, attempt, stage, variables: Bytes::new(), max_payload_bytes: 1 << 20 }
            }
            89..92 => {
                self.next_session += 1;
                self.sessions.push(self.next_session);
                Command::Register(Arc::new(SessionInfo {
                    id: self.next_session,
                    worker: format!("s{}", self.next_session),
                    job_types: TYPES.map(String::from).to_vec(),
                    tenants: TENANTS.map(String::from).to_vec(),
                    heartbeat_ms: 100,
                    dead_after_ms: 400,
                    ..Default::default()
                }))
            }
            92..98 => {
                let session = self.session().max(1);
                let held: Vec<(JobKey, u32)> = state
                    .jobs()
                    .filter(|j| j.session == session && j.state == JobState::Activated)
                    .map(|j| (j.key, j.attempt))
                    .collect();
                Command::Beat { session, state: WorkerState::Running, held }
            }
            _ => Command::EndSession { session: self.session().max(1) },
        }
    }

    /// Mostly forward by up to 300 ms; now and then back by up to a second.
    fn tick(&mut self) -> Millis {
        if self.rng.random_ratio(1, 15) {
            self.now = (self.now - self.rng.random_range(0..1000)).max(0);
        } else {
            self.now += self.rng.random_range(0..300);
        }
        self.now
    }
}

/// Every job in memory, in key order, as text: what two replicas compare.
fn picture(state: &PartitionState) -> String {
    let mut jobs: Vec<&Job> = state.jobs().collect();
    jobs.sort_by_key(|j| j.key);
    format!("{jobs:?}")
}

fn targets(command: &Command) -> Option<JobKey> {
    match command {
        Command::Complete { key, .. }
        | Command::Fail { key, .. }
        | Command::UpdateTimeout { key, .. }
        | Command::UpdateRetries { key, .. }
        | Command::Cancel { key, .. }
        | Command::Yield { key, .. }
        | Command::Checkpoint { key, .. } => Some(*key),
        _ => None,
    }
}

fn run(seed: u64) {
    let mut world =
        World { rng: StdRng::seed_from_u64(seed), now: 0, keys: Vec::new(), sessions: Vec::new(), next_session: 0 };
    let (mut state, mut replica) = (PartitionState::new(0), PartitionState::new(0));
    let mut max_attempt: HashMap<JobKey, u32> = HashMap::new();
    let mut finished: HashSet<JobKey> = HashSet::new();
    for step in 0..STEPS {
        let at = |what: String| format!("seed {seed} step {step}: {what}");
        let command = world.command(&state);
        let before: HashMap<JobKey, Job> = state.jobs().map(|j| (j.key, j.clone())).collect();
        let batch = Batch::at(world.tick(), vec![command.clone()]);
        let out = state.apply(&batch);
        let copy = replica.apply(&batch);
        assert_eq!(
            format!("{:?}", out.results),
            format!("{:?}", copy.results),
            "{}",
            at("replicas answered apart".into())
        );
        assert_eq!(picture(&state), picture(&replica), "{}", at("replicas hold different jobs".into()));
        let result = &out.results[0];

        if let CommandResult::Created { key, .. } = result {
            if !world.keys.contains(key) {
                world.keys.push(*key);
            }
        }
        // Attempts only grow; an activation hands a job out at a new one.
        if let CommandResult::Activated(jobs) = result {
            let mut seen = HashSet::new();
            for job in jobs {
                assert!(seen.insert(job.key), "{}", at(format!("job {} handed out twice in one activation", job.key)));
                assert!(!finished.contains(&job.key), "{}", at(format!("finished job {} activated", job.key)));
                let prior = max_attempt.get(&job.key).copied().unwrap_or(0);
                assert!(
                    job.attempt > prior,
                    "{}",
                    at(format!("job {} activated at {} after {prior}", job.key, job.attempt))
                );
                max_attempt.insert(job.key, job.attempt);
            }
        }
        for job in state.jobs() {
            let prior = max_attempt.get(&job.key).copied().unwrap_or(0);
            assert!(job.attempt >= prior, "{}", at(format!("job {} went back to attempt {}", job.key, job.attempt)));
            max_attempt.insert(job.key, job.attempt);
            assert!(job.retries >= 0, "{}", at(format!("job {} has {} retries", job.key, job.retries)));
        }
        // Finished jobs leave memory and never come back.
        for job in &out.finished {
            assert!(job.state.is_final(), "{}", at(format!("job {} left memory {:?}", job.key, job.state)));
            finished.insert(job.key);
        }
        for key in &finished {
            assert!(state.job(*key).is_none(), "{}", at(format!("finished job {key} is back")));
        }
        // An outcome is accepted only for the current attempt of an activated job.
        let outcome = match &command {
            Command::Complete { key, attempt, .. }
            | Command::Fail { key, attempt, .. }
            | Command::UpdateTimeout { key, attempt, .. }
            | Command::Checkpoint { key, attempt, .. } => Some((*key, *attempt)),
            _ => None,
        };
        if let (Some((key, attempt)), false) = (outcome, matches!(result, CommandResult::Rejected(_))) {
            let job = before.get(&key);
            let was = job.map(|j| (j.state, j.attempt, j.failed_attempt));
            let current = job.is_some_and(|j| j.state == JobState::Activated && fence_admits(attempt, j.attempt));
            // A failure repeated after it took effect is answered OK and changes nothing.
            let repeat = matches!(command, Command::Fail { .. })
                && attempt != 0
                && job.is_some_and(|j| {
                    j.failed_attempt == j.attempt && fence_admits(attempt, j.attempt) && !j.fail_reason.by_broker()
                })
                && job.map(|j| (j.state, j.retries, j.attempt))
                    == state.job(key).map(|j| (j.state, j.retries, j.attempt));
            assert!(
                current || repeat,
                "{}",
                at(format!("{command:?} accepted on job {key} at attempt {attempt}, which was {was:?}"))
            );
        }
        // Retries change only as the rules say.
        for (key, old) in &before {
            let Some(new) = state.job(*key) else { continue };
            let targeted = targets(&command) == Some(*key)
                && matches!(command, Command::Fail { .. } | Command::UpdateRetries { .. });
            assert!(
                new.retries == old.retries || targeted || new.retries == old.retries - 1,
                "{}",
                at(format!("job {key}'s retries went from {} to {} on {command:?}", old.retries, new.retries))
            );
        }
    }
}

#[test]
fn random_command_sequences_keep_the_lifecycle_invariants() {
    if let Some(seed) = std::env::var("DROVER_MODEL_SEED").ok().and_then(|s| s.parse().ok()) {
        run(seed);
        return;
    }
    for seed in 0..RUNS {
        run(seed);
    }
}
