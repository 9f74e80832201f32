//! Queue limits in the engine: a rate hands out its burst and then one job
//! per refill, by partition time; a concurrency holds at most its count and
//! frees a slot whichever way an activation ends; a key's limit holds back
//! its own jobs only; a limited queue's creates go to its home; and a
//! restored replica admits what the others admit.

use std::sync::Arc;

use super::limit::{limit_home, Bucket, Limit, QueueLimit, Rate, LIMIT_KEY_HEADER};
use super::*;

const TYPE: &str = "charge";
const TENANT: &str = DEFAULT_TENANT;

fn create_with(headers: Vec<(String, String)>, request: Option<RequestId>) -> Command {
    Command::Create(NewJob {
        spec: Arc::new(JobSpec {
            job_type: TYPE.into(),
            tenant: TENANT.into(),
            custom_headers: headers,
            ..Default::default()
        }),
        retries: 3,
        run_at: None,
        delay_ms: 0,
        request,
        dedupe_window_ms: 60_000,
    })
}

fn keyed(key: &str) -> Vec<(String, String)> {
    vec![(LIMIT_KEY_HEADER.to_string(), key.to_string())]
}

fn set(limit: Option<QueueLimit>) -> Command {
    Command::SetLimit { tenant: TENANT.into(), job_type: TYPE.into(), limit }
}

fn rate(limit: u32, period_ms: Millis, burst: u32) -> Limit {
    Limit { rate: Some(Rate { limit, period_ms, burst }), concurrency: None }
}

fn concurrency(most: u32) -> Limit {
    Limit { rate: None, concurrency: Some(most) }
}

fn on_home(queue: Limit, per_key: Limit) -> Option<QueueLimit> {
    Some(QueueLimit { home: 0, queue, per_key })
}

struct Partition {
    state: PartitionState,
    now: Millis,
}

impl Partition {
    fn new() -> Self {
        Partition { state: PartitionState::new(0), now: 1_000 }
    }
    fn at(&mut self, now: Millis, command: Command) -> (CommandResult, ApplyOutput) {
        self.now = now;
        let mut out = self.state.apply(&Batch::at(now, vec![command]));
        (out.results.pop().expect("one result per command"), out)
    }
    fn run(&mut self, command: Command) -> CommandResult {
        self.at(self.now, command).0
    }
    fn create(&mut self, headers: Vec<(String, String)>) -> JobKey {
        match self.run(create_with(headers, None)) {
            CommandResult::Created { key, .. } => key,
            other => panic!("not created: {other:?}"),
        }
    }
    fn take(&mut self, max_jobs: u32) -> Vec<ActivatedJobData> {
        let activation = Activation { max_jobs, ..Activation::plain(TYPE, TENANT) };
        match self.run(Command::Activate(activation)) {
            CommandResult::Activated(jobs) => jobs,
            other => panic!("not an activation: {other:?}"),
        }
    }
    fn complete(&mut self, job: &ActivatedJobData) {
        let command = Command::Complete { key: job.key, attempt: job.attempt, variables: Default::default() };
        assert_eq!(self.run(command), CommandResult::Done);
    }
}

#[test]
fn a_rate_hands_out_its_burst_then_one_job_per_refill_by_partition_time() {
    let mut p = Partition::new();
    assert_eq!(p.run(set(on_home(rate(10, 1_000, 3), Limit::default()))), CommandResult::Done);
    for _ in 0..20 {
        p.create(Vec::new());
    }
    assert_eq!(p.take(10).len(), 3, "the burst");
    assert_eq!(p.take(10).len(), 0, "then nothing until a token comes back");
    assert_eq!(p.state.next_timer(), Some(1_100), "the engine wakes when one does");
    let (_, out) = p.at(1_100, Command::ListSessions);
    assert_eq!(out.available, vec![TYPE.to_string()], "and offers the type then");
    assert_eq!(p.take(10).len(), 1, "one token, one job");
    // Over a second of partition time at most the rate goes, whoever asks.
    let mut taken = 0;
    for now in (1_110..=2_100).step_by(10) {
        p.now = now;
        taken += p.take(10).len();
    }
    assert_eq!(taken, 10, "10 jobs a second");
}

#[test]
fn a_concurrency_holds_its_count_and_frees_a_slot_however_an_activation_ends() {
    let mut p = Partition::new();
    p.run(set(on_home(concurrency(2), Limit::default())));
    for _ in 0..6 {
        p.create(Vec::new());
    }
    let held = p.take(10);
    assert_eq!(held.len(), 2, "two at once");
    assert!(p.take(10).is_empty(), "no third while two are held");
    // A completion frees one, and says so.
    p.now += 1;
    let command = Command::Complete { key: held[0].key, attempt: held[0].attempt, variables: Default::default() };
    let (result, out) = p.at(p.now, command);
    assert_eq!(result, CommandResult::Done);
    assert_eq!(out.available, vec![TYPE.to_string()], "a freed slot offers the type again");
    let third = p.take(10);
    assert_eq!(third.len(), 1, "the freed slot only");
    // A failure with retries frees one too (the job is ready again).
    let fail = Command::Fail {
        key: held[1].key,
        attempt: held[1].attempt,
        retries: 2,
        error_message: "no".into(),
        back_off_ms: 0,
        variables: Default::default(),
        max_payload_bytes: u64::MAX,
        reason: FailReason::Failed,
    };
    assert_eq!(p.run(fail), CommandResult::Done);
    assert_eq!(p.take(10).len(), 1, "the failed attempt's slot");
    // A timeout frees one, and the job taken again in the same batch holds
    // one slot, not two.
    let timeout = p.now + 60_001;
    let (result, _) = p.at(timeout, Command::Activate(Activation { max_jobs: 10, ..Activation::plain(TYPE, TENANT) }));
    let CommandResult::Activated(again) = &result else { panic!("activation") };
    assert_eq!(again.len(), 2, "both timed-out jobs' slots came back and were taken again");
    assert!(p.take(10).is_empty(), "and still no more than two");
    for job in again.clone() {
        p.complete(&job);
    }
    assert_eq!(p.take(10).len(), 2, "two slots free again");
}

#[test]
fn a_keys_limit_holds_back_its_own_jobs_only_and_keeps_the_order() {
    let mut p = Partition::new();
    p.run(set(on_home(Limit::default(), concurrency(1))));
    let a1 = p.create(keyed("a"));
    let a2 = p.create(keyed("a"));
    let b1 = p.create(keyed("b"));
    let none = p.create(Vec::new());
    let first = p.take(10);
    let keys: Vec<JobKey> = first.iter().map(|j| j.key).collect();
    assert_eq!(keys, vec![a1, b1, none], "one of each key, and the job without one");
    assert!(p.take(10).is_empty(), "a's second waits for a's first");
    p.complete(&first[0]);
    assert_eq!(p.take(10).iter().map(|j| j.key).collect::<Vec<_>>(), vec![a2], "then a's second");
}

#[test]
fn a_limited_queues_creates_go_home_but_an_idempotent_one_stays_where_its_key_leads() {
    let mut p = Partition { state: PartitionState::new(1), now: 1_000 };
    let away = Some(QueueLimit { home: 2, queue: concurrency(5), per_key: Limit::default() });
    p.run(set(away));
    assert_eq!(p.run(create_with(Vec::new(), None)), CommandResult::Elsewhere(2), "made at home, not here");
    let request = RequestId::Key { tenant: TENANT.into(), user: String::new(), key: "k1".into() };
    assert!(
        matches!(p.run(create_with(Vec::new(), Some(request))), CommandResult::Created { created: true, .. }),
        "an idempotency key's job is made where its repeats will look"
    );
    assert_eq!(p.take(10).len(), 1, "and held to the limit here");
    p.run(set(None));
    assert!(matches!(p.run(create_with(Vec::new(), None)), CommandResult::Created { .. }), "lifted: made anywhere");
    // Where a create with the type as its ordering key goes (the default
    // tenant named by leaving it empty), as an OJS queue's do.
    assert_eq!(limit_home(TENANT, TYPE, 8), idempotency_partition("", "", &format!("ordering:{TYPE}"), 8));
    assert_eq!(limit_home("acme", TYPE, 8), idempotency_partition("acme", "", &format!("ordering:{TYPE}"), 8));
}

#[test]
fn a_restored_replica_admits_what_the_others_admit() {
    let mut p = Partition::new();
    p.run(set(on_home(rate(5, 1_000, 2), concurrency(1))));
    for key in ["a", "a", "b", "c", "c"] {
        p.create(keyed(key));
    }
    assert_eq!(p.take(10).len(), 2, "the burst: a and b");
    p.now = 1_250;
    let records: Vec<Job> = p.state.jobs().cloned().collect();
    let registry = p.state.registry();
    assert_eq!(registry.limits.len(), 1, "the limit is stored with its buckets");
    let mut restored =
        Partition { state: PartitionState::restore(p.state.meta(), records, Vec::new(), registry), now: p.now };
    for now in [1_250, 1_450, 1_700, 2_500] {
        p.now = now;
        restored.now = now;
        let original: Vec<JobKey> = p.take(10).iter().map(|j| j.key).collect();
        let again: Vec<JobKey> = restored.take(10).iter().map(|j| j.key).collect();
        assert_eq!(original, again, "at {now} ms both replicas take the same jobs");
    }
}

#[test]
fn a_limit_that_asks_for_nothing_or_zero_is_refused_saying_why() {
    let mut p = Partition::new();
    let CommandResult::Rejected(error) = p.run(set(on_home(Limit::default(), Limit::default()))) else {
        panic!("refused")
    };
    assert!(error.message.contains("needs a rate or a concurrency"), "{}", error.message);
    let CommandResult::Rejected(error) = p.run(set(on_home(concurrency(0), Limit::default()))) else {
        panic!("refused")
    };
    assert!(error.message.contains("at least 1"), "{}", error.message);
    let CommandResult::Rejected(error) = p.run(set(on_home(rate(1, 0, 1), Limit::default()))) else {
        panic!("refused")
    };
    assert!(error.message.contains("period"), "{}", error.message);
}

#[test]
fn a_bucket_refills_evenly_never_past_its_burst() {
    let rate = Rate { limit: 3, period_ms: 1_000, burst: 2 };
    let mut bucket = Bucket::full(&rate, 0);
    bucket.take();
    bucket.take();
    assert_eq!(bucket.tokens(), 0);
    assert_eq!(bucket.next_token_at(&rate), 334, "a third of a second, rounded up");
    bucket.refill(&rate, 333);
    assert_eq!(bucket.tokens(), 0, "not yet");
    bucket.refill(&rate, 334);
    assert_eq!(bucket.tokens(), 1);
    bucket.refill(&rate, 100_000);
    assert_eq!(bucket.tokens(), 2, "never past the burst");
    // A slow rate refilled every millisecond still refills: the time a
    // thousandth takes carries over.
    // Refilled at every millisecond or once, a bucket holds the same: a
    // token exactly when the rate has made one, for odd rates too.
    for (limit, period_ms, token_at) in [(1_000, 3_600_000, 3_600), (7, 3_000, 429), (100, 300, 3), (100, 60_000, 600)]
    {
        let rate = Rate { limit, period_ms, burst: 1 };
        let (mut often, mut once) = (Bucket::full(&rate, 0), Bucket::full(&rate, 0));
        often.take();
        once.take();
        assert_eq!(often.next_token_at(&rate), token_at, "{limit} per {period_ms} ms");
        for now in 1..token_at {
            often.refill(&rate, now);
            assert_eq!(often.tokens(), 0, "{limit} per {period_ms} ms: no token yet at {now} ms");
        }
        often.refill(&rate, token_at);
        once.refill(&rate, token_at);
        assert_eq!(
            (often.tokens(), often),
            (1, once),
            "{limit} per {period_ms} ms: a token at {token_at} ms, either way"
        );
    }
    assert_eq!(Rate::new(1, 1_000).burst, 1);
    assert_eq!(Rate::new(100, 1_000).burst, 10, "a tenth of the limit by default");
}

#[test]
fn a_partitions_limits_read_back_for_the_tenants_asked_and_for_every_tenant() {
    let mut p = Partition::new();
    p.run(set(on_home(rate(10, 1_000, 3), concurrency(2))));
    p.create(Vec::new());
    p.take(1);
    let read = |p: &mut Partition, tenants: Vec<String>| match p
        .run(Command::GetLimits { tenants, job_type: String::new() })
    {
        CommandResult::Limits(states) => states,
        other => panic!("not limits: {other:?}"),
    };
    let states = read(&mut p, vec!["*".into()]);
    assert_eq!(states.len(), 1, "every tenant's");
    assert_eq!((states[0].active, states[0].tokens, states[0].waiting), (1, Some(2), 0));
    assert_eq!(read(&mut p, vec![TENANT.into()]).len(), 1);
    assert!(read(&mut p, vec!["acme".into()]).is_empty(), "another tenant's are not");
}

#[test]
fn a_schedules_ticks_and_a_workflows_steps_of_a_limited_queue_are_made_where_they_live_and_held_there() {
    use super::schedule::{Misfire, Overlap};
    use super::workflow::{Kind, StepSpec};
    // This partition is not the queue's home.
    let mut p = Partition { state: PartitionState::new(1), now: 0 };
    p.run(set(Some(QueueLimit { home: 2, queue: concurrency(1), per_key: Limit::default() })));
    let template = Arc::new(JobSpec { job_type: TYPE.into(), tenant: TENANT.into(), ..Default::default() });
    let schedule = super::ScheduleSpec {
        tenant: TENANT.into(),
        name: "every-second".into(),
        expression: "* * * * * *".into(),
        timezone: "UTC".into(),
        template: Arc::clone(&template),
        retries: 3,
        overlap: Overlap::Allow,
        misfire: Misfire::FireAll,
        paused: false,
        description: String::new(),
    };
    assert!(matches!(
        p.run(Command::PutSchedule { spec: Arc::new(schedule), by: "ops".into() }),
        CommandResult::ScheduleSet { .. }
    ));
    p.now = 2_000;
    let CommandResult::Schedules(schedules) = p.run(Command::ListSchedules { tenants: vec![TENANT.into()] }) else {
        panic!("schedules")
    };
    assert_eq!(schedules[0].runs, 2, "both ticks made their job here: {:?}", schedules[0]);
    let step = StepSpec { template, retries: 3 };
    let workflow = super::WorkflowSpec {
        tenant: TENANT.into(),
        id: "wf".into(),
        name: String::new(),
        kind: Kind::Group,
        steps: vec![step.clone(), step],
        callbacks: Vec::new(),
    };
    let made =
        p.run(Command::CreateWorkflow { spec: Arc::new(workflow), by: "ops".into(), max_payload_bytes: 1 << 20 });
    let CommandResult::Workflows(made) = made else { panic!("a workflow: {made:?}") };
    assert!(made[0].steps.iter().all(|s| s.job.0 != 0), "each step's job made here: {:?}", made[0].steps);
    assert_eq!(p.take(10).len(), 1, "and held to the limit here: four jobs, one at a time");
}

#[test]
fn a_planted_overrun_lets_every_activation_through_alike_on_every_replica() {
    // The fault suite's `limit-overrun` control: the bug it plants must
    // break the limit, the same way wherever the entries are applied.
    let mut taken = Vec::new();
    for _ in 0..2 {
        let mut p = Partition::new();
        p.state.plant(Plants { limit_overrun: true, ..Plants::default() });
        p.run(set(on_home(concurrency(2), Limit::default())));
        for _ in 0..6 {
            p.create(Vec::new());
        }
        taken.push(p.take(10).iter().map(|job| job.key).collect::<Vec<_>>());
    }
    assert_eq!(taken[0].len(), 6, "all six at once, past a concurrency of two");
    assert_eq!(taken[0], taken[1], "alike on two replicas");
}

#[test]
fn a_read_answered_off_the_log_is_what_its_apply_answers_and_is_authorized_alike() {
    let mut p = Partition::new();
    p.run(set(on_home(concurrency(2), Limit::default())));
    for _ in 0..3 {
        p.create(Vec::new());
    }
    assert_eq!(p.take(1).len(), 1);
    let tenants = vec![TENANT.to_string()];
    let reads = [
        Command::QueueStats { tenants: tenants.clone(), job_type: String::new() },
        Command::GetLimits { tenants: tenants.clone(), job_type: TYPE.into() },
        Command::ListSchedules { tenants: tenants.clone() },
        Command::ListWorkflows { tenants: tenants.clone(), running: false, limit: 10 },
        Command::GetWorkflow { tenant: TENANT.into(), id: "none".into() },
        Command::GetSchema { job_type: TYPE.into() },
        Command::ListSessions,
    ];
    for read in reads {
        let now = p.now;
        let off_the_log = p.state.answer_read(None, &read, now).unwrap_or_else(|| panic!("{read:?} is a read"));
        let applied = p.run(read.clone());
        assert_eq!(format!("{off_the_log:?}"), format!("{applied:?}"), "{read:?}");
    }
    let CommandResult::Queues(queues) = p.state.answer_read(None, &reads_queue(&tenants), p.now).unwrap() else {
        panic!("queue figures")
    };
    assert_eq!((queues[0].available, queues[0].active), (2, 1), "{queues:?}");
    assert!(p.state.answer_read(None, &set(None), p.now).is_none(), "a write is never answered off the log");
    let stranger = super::authorize_tests::principal("stranger", &["jobs:read:*"], &["globex"]);
    let refused = p.state.answer_read(Some(&stranger), &reads_queue(&tenants), p.now);
    assert!(matches!(refused, Some(CommandResult::Rejected(_))), "another tenant's figures: {refused:?}");
}

fn reads_queue(tenants: &[String]) -> Command {
    Command::QueueStats { tenants: tenants.to_vec(), job_type: String::new() }
}
