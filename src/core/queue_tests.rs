//! Paused queues and queue figures in the engine: a paused queue's jobs wait
//! whatever path would hand them out, creates still land, a pause survives a
//! restore, and the figures count by state and by the entries' time.

use std::sync::Arc;

use super::principal::Principal;
use super::*;

const TYPE: &str = "mail";

fn create(tenant: &str, delay_ms: i64) -> Command {
    Command::Create(NewJob {
        spec: Arc::new(JobSpec { job_type: TYPE.into(), tenant: tenant.into(), ..Default::default() }),
        retries: 3,
        run_at: None,
        delay_ms,
        request: None,
        dedupe_window_ms: 0,
    })
}

fn activate(tenant: &str) -> Command {
    Command::Activate(Activation::plain(TYPE, tenant))
}

fn pause(tenant: &str, paused: bool) -> Command {
    Command::SetPaused { tenant: tenant.into(), job_type: TYPE.into(), paused }
}

struct Partition {
    state: PartitionState,
    now: Millis,
}

impl Partition {
    fn run_at(&mut self, now: Millis, command: Command) -> (CommandResult, ApplyOutput) {
        self.now = now;
        let mut out = self.state.apply(&Batch::at(now, vec![command]));
        (out.results.pop().expect("one result per command"), out)
    }
    fn run(&mut self, command: Command) -> CommandResult {
        self.run_at(self.now + 1, command).0
    }
    fn create(&mut self, tenant: &str) -> JobKey {
        let CommandResult::Created { key, .. } = self.run(create(tenant, 0)) else { panic!("created") };
        key
    }
    fn activated(&mut self, tenant: &str) -> Vec<JobKey> {
        let CommandResult::Activated(jobs) = self.run(activate(tenant)) else { panic!("an activation") };
        jobs.iter().map(|j| j.key).collect()
    }
    fn stats(&mut self, tenant: &str) -> Vec<QueueStats> {
        let command = Command::QueueStats { tenants: vec![tenant.into()], job_type: String::new() };
        let CommandResult::Queues(queues) = self.run(command) else { panic!("figures") };
        queues
    }
}

fn partition() -> Partition {
    Partition { state: PartitionState::new(0), now: 1_000 }
}

#[test]
fn a_paused_queue_hands_out_nothing_and_resumes_in_order() {
    let mut p = partition();
    let first = p.create("acme");
    let globex = p.create("globex");
    assert!(matches!(p.run(pause("acme", true)), CommandResult::Done));
    let second = p.create("acme");
    assert_eq!(p.activated("acme"), Vec::<JobKey>::new(), "a paused queue's jobs wait");
    assert_eq!(p.state.activatable_count(TYPE, &[]), 1, "only globex's job is activatable");
    assert_eq!(p.activated("globex"), vec![globex], "another tenant's queue of the type runs");
    // A job that comes back (timed out) while paused waits too.
    assert!(matches!(p.run(pause("acme", false)), CommandResult::Done));
    assert_eq!(p.activated("acme"), vec![first, second], "resumed, in the order they came");
    p.run(pause("acme", true));
    p.run_at(p.now + 60_001, Command::ListSessions);
    assert_eq!(p.activated("acme"), Vec::<JobKey>::new(), "timed-out jobs wait while paused");
    let (_, out) = p.run_at(p.now + 1, pause("acme", false));
    assert_eq!(out.available, vec![TYPE.to_string()], "a resume wakes the type's takers");
    assert_eq!(p.activated("acme").len(), 2);
}

#[test]
fn a_paused_queue_keeps_its_jobs_through_cancel_and_restore() {
    let mut p = partition();
    let kept = p.create("acme");
    let cancelled = p.create("acme");
    let (_, out) = p.run_at(5_000, pause("acme", true));
    assert!(out.paused_changed);
    assert!(matches!(p.run(Command::Cancel { key: cancelled, by: "op".into() }), CommandResult::Done));
    let registry = p.state.registry();
    assert_eq!(registry.paused, vec![("acme".to_string(), TYPE.to_string(), 5_000)]);
    let jobs: Vec<Job> = p.state.jobs().cloned().collect();
    let mut restored =
        Partition { state: PartitionState::restore(p.state.meta(), jobs, Vec::new(), registry), now: p.now };
    assert_eq!(restored.activated("acme"), Vec::<JobKey>::new(), "still paused after a restore");
    assert_eq!(restored.stats("acme")[0].paused_at, Some(5_000));
    restored.run(pause("acme", false));
    assert_eq!(restored.activated("acme"), vec![kept], "the cancelled job left the parked queue");
    assert!(restored.state.paused_records().is_empty());
}

#[test]
fn only_a_manager_of_the_tenant_and_type_pauses() {
    let mut p = partition();
    let worker = Arc::new(Principal {
        name: "acme-worker".into(),
        scopes: vec!["jobs:work:mail".into(), "jobs:read:mail".into()],
        tenants: vec!["acme".into()],
        job: None,
    });
    let as_worker = |c: Command| Command::As { by: Arc::clone(&worker), commands: vec![c] };
    let CommandResult::Rejected(e) = p.run(as_worker(pause("acme", true))) else { panic!("refused") };
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    let stats = Command::QueueStats { tenants: vec!["globex".into()], job_type: TYPE.into() };
    let CommandResult::Rejected(e) = p.run(as_worker(stats)) else { panic!("refused") };
    assert_eq!(e.kind, ErrorKind::PermissionDenied, "another tenant's figures");
    let stats = Command::QueueStats { tenants: vec!["acme".into()], job_type: TYPE.into() };
    assert!(matches!(p.run(as_worker(stats)), CommandResult::Queues(_)), "its own tenant's figures it may read");
    assert!(p.state.paused_records().is_empty());
}

#[test]
fn figures_count_jobs_by_state_and_the_last_minute_and_hour() {
    let mut p = partition();
    p.run_at(60_000, create("acme", 0));
    let oldest_at = p.now;
    p.run_at(61_000, create("acme", 0));
    p.run_at(62_000, create("acme", 30_000));
    p.create("globex");
    let CommandResult::Activated(jobs) = p.run_at(65_000, activate("acme")).0 else { panic!() };
    let taken = jobs[0].key;
    assert_eq!(jobs.len(), 2, "two were due");
    let fail = Command::Fail {
        key: jobs[1].key,
        attempt: 1,
        retries: 1,
        error_message: "boom".into(),
        back_off_ms: 10_000,
        variables: Default::default(),
        max_payload_bytes: 1 << 20,
        reason: FailReason::Failed,
    };
    p.run_at(66_000, fail);
    p.run_at(70_000, Command::Complete { key: taken, attempt: 1, variables: Default::default() });
    let stats = p.stats("acme");
    assert_eq!(stats.len(), 1, "globex's queue is not acme's to see");
    let s = &stats[0];
    assert_eq!((s.tenant.as_str(), s.job_type.as_str()), ("acme", TYPE));
    assert_eq!((s.available, s.active, s.scheduled, s.retrying, s.incidents), (0, 0, 1, 1, 0));
    assert_eq!(s.oldest_available_at, None);
    assert_eq!((s.last_hour.created, s.last_hour.activated, s.last_hour.completed, s.last_hour.failed), (3, 2, 1, 1));
    assert_eq!(s.last_hour.wait_ms, 5_000 + 4_000, "each activation's wait since its creation");
    assert_eq!(s.last_hour.run_ms, 5_000);
    assert_eq!(s.last_minute.completed, 1);
    // The retried job is due again: available, and the oldest waiting.
    p.run_at(190_000, Command::ListSessions);
    let s = &p.stats("acme")[0];
    assert_eq!((s.available, s.retrying, s.scheduled), (2, 0, 0), "the retried job and the delayed one are due");
    assert_eq!(s.oldest_available_at, Some(oldest_at + 1_000));
    assert_eq!(s.last_minute, QueueCounts::default(), "nothing happened in the last minute");
    assert_eq!(s.last_hour.completed, 1);
    // Hours on, the activations have timed out and nothing is counted.
    let CommandResult::Activated(jobs) = p.run_at(200_000, activate("acme")).0 else { panic!() };
    assert_eq!(jobs.len(), 2);
    p.run_at(10_000_000, Command::ListSessions);
    let s = &p.stats("acme")[0];
    assert_eq!(s.last_hour, QueueCounts::default(), "the hour has passed");
    assert_eq!((s.available, s.active), (2, 0), "their activations timed out");
}
