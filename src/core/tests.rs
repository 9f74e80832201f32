//! Every transition of the job lifecycle, without a server.

use std::sync::Arc;

use bytes::Bytes;

use super::*;

const TYPE: &str = "email";

fn spec(priority: i32) -> Arc<JobSpec> {
    Arc::new(JobSpec {
        job_type: TYPE.into(),
        tenant: DEFAULT_TENANT.into(),
        variables: r#"{"to":"a@b.c"}"#.into(),
        custom_headers: vec![("channel".into(), "ops".into())],
        priority,
        ..Default::default()
    })
}

fn new_job(priority: i32) -> Command {
    Command::Create(NewJob {
        spec: spec(priority),
        retries: 3,
        run_at: None,
        delay_ms: 0,
        request: None,
        dedupe_window_ms: 0,
    })
}

fn activation(max_jobs: u32, timeout_ms: i64) -> Command {
    Command::Activate(Activation {
        job_type: TYPE.into(),
        tenants: vec![DEFAULT_TENANT.into()],
        worker: "w1".into(),
        timeout_ms,
        max_jobs,
        max_bytes: u64::MAX,
        session: 0,
        via: Via::Unknown,
        taker: Default::default(),
        rivals: Vec::new(),
    })
}

struct Harness {
    state: PartitionState,
}

impl Harness {
    fn new() -> Self {
        Harness { state: PartitionState::new(2) }
    }
    fn run(&mut self, now: Millis, command: Command) -> CommandResult {
        let mut out = self.state.apply(&Batch::at(now, vec![command]));
        out.results.pop().expect("one result per command")
    }
    fn create(&mut self, now: Millis, priority: i32) -> JobKey {
        match self.run(now, new_job(priority)) {
            CommandResult::Created { key, .. } => key,
            other => panic!("create failed: {other:?}"),
        }
    }
    fn activate(&mut self, now: Millis, max: u32, timeout_ms: i64) -> Vec<ActivatedJobData> {
        match self.run(now, activation(max, timeout_ms)) {
            CommandResult::Activated(jobs) => jobs,
            other => panic!("activate failed: {other:?}"),
        }
    }
    fn state_of(&self, key: JobKey) -> Option<JobState> {
        self.state.job(key).map(|j| j.state)
    }
    fn rejected(result: CommandResult) -> CommandError {
        match result {
            CommandResult::Rejected(error) => error,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }
}

#[test]
fn keys_carry_their_partition() {
    let key = JobKey::new(7, 42);
    assert_eq!(key.partition(), 7);
    assert_eq!(key.counter(), 42);
}

#[test]
fn create_makes_an_activatable_job_with_a_partition_key() {
    let mut h = Harness::new();
    let key = h.create(1_000, 0);
    assert_eq!(key.partition(), 2);
    assert_eq!(h.state_of(key), Some(JobState::Activatable));
    assert_eq!(h.state.activatable_count(TYPE, &[]), 1);
}

#[test]
fn activate_sets_worker_deadline_and_attempt() {
    let mut h = Harness::new();
    let key = h.create(1_000, 0);
    let jobs = h.activate(2_000, 10, 5_000);
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].key, key);
    assert_eq!(jobs[0].attempt, 1);
    assert_eq!(jobs[0].deadline, 7_000);
    assert_eq!(jobs[0].worker, "w1");
    assert_eq!(h.state_of(key), Some(JobState::Activated));
    assert_eq!(h.state.next_timer(), Some(7_000));
}

#[test]
fn activate_respects_max_jobs() {
    let mut h = Harness::new();
    for _ in 0..5 {
        h.create(1_000, 0);
    }
    assert_eq!(h.activate(1_000, 3, 1_000).len(), 3);
    assert_eq!(h.activate(1_000, 3, 1_000).len(), 2);
    assert!(h.activate(1_000, 3, 1_000).is_empty());
}

#[test]
fn higher_priority_first_then_fifo() {
    let mut h = Harness::new();
    let low_old = h.create(1_000, 0);
    let high = h.create(1_001, 5);
    let low_new = h.create(1_002, 0);
    let order: Vec<JobKey> = h.activate(2_000, 10, 1_000).into_iter().map(|j| j.key).collect();
    assert_eq!(order, vec![high, low_old, low_new]);
}

#[test]
fn complete_finishes_the_job_and_leaves_memory() {
    let mut h = Harness::new();
    let key = h.create(1_000, 0);
    let job = h.activate(1_000, 1, 1_000).remove(0);
    let mut out = h.state.apply(&Batch::at(
        1_500,
        vec![Command::Complete { key, attempt: job.attempt, variables: r#"{"ok":true}"#.into() }],
    ));
    assert_eq!(out.results.pop(), Some(CommandResult::Done));
    assert_eq!(out.finished.len(), 1);
    assert_eq!(out.finished[0].state, JobState::Completed);
    assert_eq!(&out.finished[0].result[..], br#"{"ok":true}"#);
    assert_eq!(h.state_of(key), None);
    assert_eq!(h.state.next_timer(), None, "the deadline left with the job");
    let again = Harness::rejected(h.run(1_600, Command::Complete { key, attempt: 1, variables: Default::default() }));
    assert_eq!(again.kind, ErrorKind::FailedPrecondition);
}

#[test]
fn unknown_keys_are_not_found() {
    let mut h = Harness::new();
    let error = Harness::rejected(
        h.run(1_000, Command::Complete { key: JobKey::new(2, 99), attempt: 0, variables: Default::default() }),
    );
    assert_eq!(error.kind, ErrorKind::NotFound);
}

/// A worker's failure of `attempt`, leaving two retries, after `back_off_ms`.
fn smtp_down(key: JobKey, attempt: u32, back_off_ms: i64) -> Command {
    Command::Fail {
        key,
        attempt,
        retries: 2,
        error_message: "smtp down".into(),
        back_off_ms,
        variables: Bytes::new(),
        max_payload_bytes: u64::MAX,
        reason: FailReason::Failed,
    }
}

#[test]
fn fail_with_retries_and_back_off_schedules_the_retry() {
    let mut h = Harness::new();
    let key = h.create(1_000, 0);
    h.activate(1_000, 1, 10_000);
    let result = h.run(2_000, smtp_down(key, 1, 3_000));
    assert_eq!(result, CommandResult::Done);
    let job = h.state.job(key).unwrap();
    assert_eq!(job.state, JobState::Scheduled);
    assert_eq!(job.retries, 2);
    assert_eq!(job.due_at, 5_000);
    assert_eq!(job.error_message, "smtp down");
    assert!(h.activate(4_999, 1, 1_000).is_empty(), "back-off has not elapsed");
    let retried = h.activate(5_000, 1, 1_000);
    assert_eq!(retried.len(), 1);
    assert_eq!(retried[0].attempt, 2);
    assert_eq!(retried[0].retries, 2);
}

#[test]
fn fail_without_back_off_is_activatable_at_once() {
    let mut h = Harness::new();
    let key = h.create(1_000, 0);
    h.activate(1_000, 1, 10_000);
    h.run(
        1_100,
        Command::Fail {
            key,
            attempt: 1,
            retries: 1,
            error_message: "x".into(),
            back_off_ms: 0,
            variables: Bytes::new(),
            max_payload_bytes: u64::MAX,
            reason: FailReason::Failed,
        },
    );
    assert_eq!(h.state_of(key), Some(JobState::Activatable));
}

#[test]
fn fail_with_no_retries_raises_an_incident_that_update_retries_resolves() {
    let mut h = Harness::new();
    let key = h.create(1_000, 0);
    h.activate(1_000, 1, 10_000);
    h.run(
        1_100,
        Command::Fail {
            key,
            attempt: 1,
            retries: 0,
            error_message: "bad".into(),
            back_off_ms: 0,
            variables: Bytes::new(),
            max_payload_bytes: u64::MAX,
            reason: FailReason::Failed,
        },
    );
    assert_eq!(h.state_of(key), Some(JobState::Incident));
    assert!(h.activate(1_200, 1, 1_000).is_empty(), "incidents are not activatable");
    assert_eq!(h.run(1_300, Command::UpdateRetries { key, retries: 2, by: "ops".into() }), CommandResult::Done);
    assert_eq!(h.state_of(key), Some(JobState::Activatable));
    assert_eq!(h.activate(1_400, 1, 1_000)[0].retries, 2);
}

#[test]
fn timeout_reactivates_without_consuming_a_retry() {
    let mut h = Harness::new();
    let key = h.create(1_000, 0);
    h.activate(1_000, 1, 500);
    assert!(h.activate(1_499, 1, 500).is_empty());
    let again = h.activate(1_500, 1, 500);
    assert_eq!(again.len(), 1, "the deadline passed; the job is activatable again");
    assert_eq!(again[0].key, key);
    assert_eq!(again[0].retries, 3);
    assert_eq!(again[0].attempt, 2);
}

#[test]
fn stale_activation_cannot_complete_or_fail() {
    let mut h = Harness::new();
    let key = h.create(1_000, 0);
    h.activate(1_000, 1, 500);
    h.activate(2_000, 1, 500); // attempt 1 timed out at 1_500, this is attempt 2
    let stale = Harness::rejected(h.run(2_100, Command::Complete { key, attempt: 1, variables: Default::default() }));
    assert_eq!(stale.kind, ErrorKind::FailedPrecondition);
    assert!(stale.message.contains("superseded"), "{}", stale.message);
    let stale_fail = Harness::rejected(h.run(
        2_100,
        Command::Fail {
            key,
            attempt: 1,
            retries: 0,
            error_message: String::new(),
            back_off_ms: 0,
            variables: Bytes::new(),
            max_payload_bytes: u64::MAX,
            reason: FailReason::Failed,
        },
    ));
    assert_eq!(stale_fail.kind, ErrorKind::FailedPrecondition);
    assert_eq!(h.run(2_200, Command::Complete { key, attempt: 2, variables: Default::default() }), CommandResult::Done);
}

#[test]
fn a_tagged_fence_acts_on_the_attempt_with_its_tag_only() {
    let tagged = |attempt| TAGGED_ATTEMPT | attempt_tag(attempt);
    let fail = |key, attempt| Command::Fail {
        key,
        attempt,
        retries: 2,
        error_message: "tagged".into(),
        back_off_ms: 0,
        variables: Bytes::new(),
        max_payload_bytes: u64::MAX,
        reason: FailReason::Failed,
    };
    let mut h = Harness::new();
    let key = h.create(1_000, 0);
    h.activate(1_000, 1, 500);
    h.activate(2_000, 1, 500); // attempt 1 timed out at 1_500, this is attempt 2
    let stale = Harness::rejected(h.run(2_100, Command::Complete { key, attempt: tagged(1), variables: Bytes::new() }));
    assert_eq!(stale.kind, ErrorKind::FailedPrecondition);
    assert!(stale.message.contains("tagged 1") && stale.message.contains("superseded"), "{}", stale.message);
    assert_eq!(h.run(2_100, fail(key, tagged(2))), CommandResult::Done);
    assert_eq!(h.run(2_100, fail(key, tagged(2))), CommandResult::Done, "a repeated failure is done");
    let over = Harness::rejected(h.run(2_200, Command::Complete { key, attempt: tagged(2), variables: Bytes::new() }));
    assert!(over.message.contains("is over"), "{}", over.message);

    h.activate(2_300, 1, 500); // attempt 3
    let checkpointless = Command::UpdateTimeout { key, attempt: tagged(3), timeout_ms: 1_000 };
    assert_eq!(h.run(2_400, checkpointless), CommandResult::Deadline(3_400));
    assert_eq!(
        h.run(2_500, Command::Complete { key, attempt: tagged(3), variables: Bytes::new() }),
        CommandResult::Done
    );
    assert_eq!(attempt_tag(8), attempt_tag(1), "tags repeat every seven attempts");
    assert!(fence_admits(0, 5) && fence_admits(5, 5) && !fence_admits(4, 5));
}

#[test]
fn stale_activation_of_a_timed_out_job_is_rejected_before_reactivation() {
    let mut h = Harness::new();
    let key = h.create(1_000, 0);
    h.activate(1_000, 1, 500);
    let error = Harness::rejected(h.run(1_600, Command::Complete { key, attempt: 1, variables: Default::default() }));
    assert_eq!(error.kind, ErrorKind::FailedPrecondition);
    assert_eq!(h.state_of(key), Some(JobState::Activatable));
}

#[test]
fn update_timeout_sets_deadline_from_now() {
    let mut h = Harness::new();
    let key = h.create(1_000, 0);
    h.activate(1_000, 1, 500);
    assert_eq!(
        h.run(1_200, Command::UpdateTimeout { key, attempt: 1, timeout_ms: 10_000 }),
        CommandResult::Deadline(11_200)
    );
    assert!(h.activate(5_000, 1, 500).is_empty(), "extended");
    assert_eq!(
        h.run(5_000, Command::UpdateTimeout { key, attempt: 1, timeout_ms: 100 }),
        CommandResult::Deadline(5_100)
    );
    assert_eq!(h.activate(5_100, 1, 500).len(), 1, "shortened");
}

#[test]
fn update_timeout_on_a_job_that_is_not_activated_fails() {
    let mut h = Harness::new();
    let key = h.create(1_000, 0);
    let error = Harness::rejected(h.run(1_000, Command::UpdateTimeout { key, attempt: 0, timeout_ms: 100 }));
    assert_eq!(error.kind, ErrorKind::FailedPrecondition);
}

#[test]
fn delayed_and_run_at_jobs_wait_until_due() {
    let mut h = Harness::new();
    let delayed = match h.run(
        1_000,
        Command::Create(NewJob {
            spec: spec(0),
            retries: 3,
            run_at: None,
            delay_ms: 2_000,
            request: None,
            dedupe_window_ms: 0,
        }),
    ) {
        CommandResult::Created { key, .. } => key,
        other => panic!("{other:?}"),
    };
    let at = match h.run(
        1_000,
        Command::Create(NewJob {
            spec: spec(0),
            retries: 3,
            run_at: Some(5_000),
            delay_ms: 0,
            request: None,
            dedupe_window_ms: 0,
        }),
    ) {
        CommandResult::Created { key, .. } => key,
        other => panic!("{other:?}"),
    };
    assert_eq!(h.state_of(delayed), Some(JobState::Scheduled));
    assert_eq!(h.state.next_timer(), Some(3_000));
    assert!(h.activate(2_999, 5, 100_000).is_empty());
    assert_eq!(h.activate(3_000, 5, 100_000)[0].key, delayed);
    assert!(h.activate(4_999, 5, 100_000).is_empty());
    assert_eq!(h.activate(5_000, 5, 100_000)[0].key, at);
}

#[test]
fn yield_returns_the_job_without_using_a_retry() {
    let mut h = Harness::new();
    let key = h.create(1_000, 0);
    h.activate(1_000, 1, 60_000);
    let command = Command::Yield { key, attempt: 1, gateway: 2, reason: YieldReason::NotReady };
    assert_eq!(h.run(1_001, command), CommandResult::Done);
    let last = h.state.job(key).unwrap().history.events().last().unwrap().kind.clone();
    assert_eq!(last, EventKind::Yielded { attempt: 1, gateway: 2, reason: YieldReason::NotReady });
    let again = h.activate(1_002, 1, 60_000);
    assert_eq!(again[0].retries, 3);
    assert_eq!(again[0].attempt, 2);
}

#[test]
fn cancel_removes_any_live_job() {
    let mut h = Harness::new();
    let key = h.create(1_000, 0);
    assert_eq!(h.run(1_000, Command::Cancel { key, by: "ops".into() }), CommandResult::Done);
    assert_eq!(h.state_of(key), None);
    assert!(h.activate(1_000, 1, 100).is_empty());
    assert_eq!(
        Harness::rejected(h.run(1_000, Command::Cancel { key, by: "ops".into() })).kind,
        ErrorKind::FailedPrecondition
    );
}

#[test]
fn activation_stays_within_its_byte_budget_but_always_takes_one_job() {
    let mut h = Harness::new();
    let large =
        Arc::new(JobSpec { variables: format!(r#"{{"blob":"{}"}}"#, "x".repeat(3000)).into(), ..(*spec(0)).clone() });
    for _ in 0..3 {
        h.run(
            1_000,
            Command::Create(NewJob {
                spec: Arc::clone(&large),
                retries: 1,
                run_at: None,
                delay_ms: 0,
                request: None,
                dedupe_window_ms: 0,
            }),
        );
    }
    let one = ActivatedJobData::encoded_len(&large, "w1") as u64;
    let activate = |max_bytes| {
        Command::Activate(Activation {
            job_type: TYPE.into(),
            tenants: vec![DEFAULT_TENANT.into()],
            worker: "w1".into(),
            timeout_ms: 100,
            max_jobs: 10,
            max_bytes,
            session: 0,
            via: Via::Unknown,
            taker: Default::default(),
            rivals: Vec::new(),
        })
    };
    let taken = |result| match result {
        CommandResult::Activated(jobs) => jobs.len(),
        other => panic!("activate failed: {other:?}"),
    };
    assert_eq!(taken(h.run(1_000, activate(2 * one + one / 2))), 2, "two fit, the third does not");
    assert_eq!(taken(h.run(1_000, activate(10))), 1, "a job larger than the budget still goes alone");
    assert_eq!(h.state.activatable_count(TYPE, &[]), 0);
}

#[test]
fn encoded_len_covers_the_encoding() {
    let job = new_job(0);
    let batch = Batch::at(1, vec![job.clone(), activation(3, 100)]);
    let estimate: usize = batch.commands.iter().map(Command::encoded_len).sum();
    let actual = bincode::serialize(&batch.commands).unwrap().len();
    assert!(estimate + 8 >= actual, "estimate {estimate} below the encoded {actual} bytes");
    assert!(estimate <= actual + 128, "estimate {estimate} far above the encoded {actual} bytes");
}

#[test]
fn tenants_filter_activation() {
    let mut h = Harness::new();
    let other = Arc::new(JobSpec { tenant: "acme".into(), ..(*spec(0)).clone() });
    let command = Command::Create(NewJob {
        spec: other,
        retries: 1,
        run_at: None,
        delay_ms: 0,
        request: None,
        dedupe_window_ms: 0,
    });
    h.run(1_000, command);
    assert!(h.activate(1_000, 5, 100).is_empty(), "default tenant sees nothing");
    let acme = Command::Activate(Activation {
        job_type: TYPE.into(),
        tenants: vec!["acme".into()],
        worker: "w".into(),
        timeout_ms: 100,
        max_jobs: 5,
        max_bytes: u64::MAX,
        session: 0,
        via: Via::Unknown,
        taker: Default::default(),
        rivals: Vec::new(),
    });
    assert!(matches!(h.run(1_000, acme), CommandResult::Activated(jobs) if jobs.len() == 1));
}

#[test]
fn time_never_runs_backwards() {
    let mut h = Harness::new();
    h.create(10_000, 0);
    h.activate(10_000, 1, 1_000);
    // A new leader with a clock behind the old one must not extend the deadline.
    h.state.apply(&Batch::at(5_000, vec![]));
    assert_eq!(h.state.clock(), 10_000);
}

#[test]
fn restore_rebuilds_indexes_from_records() {
    let mut h = Harness::new();
    let held = h.create(1_000, 0);
    h.create(1_000, 0);
    assert_eq!(h.activate(1_000, 1, 500)[0].key, held);
    let records: Vec<Job> = h.state.jobs().cloned().collect();
    let mut restored = PartitionState::restore(h.state.meta(), records, Vec::new(), Registry::default());
    assert_eq!(restored.next_timer(), Some(1_500));
    assert_eq!(restored.activatable_count(TYPE, &[]), 1);
    let out = restored.apply(&Batch::at(1_000, vec![new_job(0)]));
    assert!(matches!(out.results[0], CommandResult::Created { key, .. } if key.counter() == 3));
}

#[test]
fn apply_reports_available_types_once() {
    let mut h = Harness::new();
    let out = h.state.apply(&Batch::at(1, vec![new_job(0), new_job(0)]));
    assert_eq!(out.available, vec![TYPE.to_string()]);
}

fn create_as(request: RequestId, window: Millis, spec: Arc<JobSpec>) -> Command {
    Command::Create(NewJob {
        spec,
        retries: 3,
        run_at: None,
        delay_ms: 0,
        request: Some(request),
        dedupe_window_ms: window,
    })
}

fn gateway_request(seq: u64) -> RequestId {
    RequestId::Gateway { node: 1, epoch: 7, seq }
}

#[test]
fn the_dedupe_table_holds_one_window_of_creates() {
    // 1,000 creates a window, one a millisecond, for ten windows: every
    // entry expires as a new one comes, so the table holds one window's.
    let mut h = Harness::new();
    let window = 1_000;
    let mut added = std::collections::BTreeSet::new();
    for seq in 0..10_000u64 {
        let now = seq as Millis + 1;
        let out = h.state.apply(&Batch::at(now, vec![create_as(gateway_request(seq), window, spec(0))]));
        added.extend(out.requests_added.iter().map(|(id, _, _)| *id));
        for (id, _) in &out.requests_expired {
            assert!(added.remove(id), "entry {id} expired twice or was never added");
        }
        assert_eq!(h.state.requests_len(), added.len(), "counted as added and expired");
        if seq >= window as u64 {
            assert_eq!(h.state.requests_len(), window as usize, "one window's creates at {now}");
        }
    }
}

#[test]
fn a_repeated_create_answers_with_the_first_job_until_its_window_ends() {
    let mut h = Harness::new();
    let first = h.run(1_000, create_as(gateway_request(1), 30_000, spec(0)));
    let CommandResult::Created { key, created: true, state: Some(JobState::Activatable) } = first else {
        panic!("{first:?}")
    };
    // The re-send after a lost answer, in a later entry.
    assert_eq!(
        h.run(2_000, create_as(gateway_request(1), 30_000, spec(0))),
        CommandResult::Created { key, created: false, state: Some(JobState::Activatable) }
    );
    // Another request is another job.
    let other = h.run(2_000, create_as(gateway_request(2), 30_000, spec(0)));
    assert!(matches!(other, CommandResult::Created { key: k, created: true, .. } if k != key), "{other:?}");
    // Past the window the partition forgets the request.
    let late = h.run(31_001, create_as(gateway_request(1), 30_000, spec(0)));
    assert!(matches!(late, CommandResult::Created { key: k, created: true, .. } if k != key), "{late:?}");
}

#[test]
fn a_repeat_within_one_batch_is_one_job() {
    let mut state = PartitionState::new(0);
    let command = create_as(gateway_request(9), 30_000, spec(0));
    let out = state.apply(&Batch::at(1_000, vec![command.clone(), command]));
    let [CommandResult::Created { key: a, created: true, .. }, CommandResult::Created { key: b, created: false, .. }] =
        out.results[..]
    else {
        panic!("{:?}", out.results)
    };
    assert_eq!(a, b);
    assert_eq!(out.requests_added.len(), 1);
}

#[test]
fn an_idempotency_key_names_one_content_per_tenant() {
    let mut h = Harness::new();
    let key_of = |tenant: &str| RequestId::Key { tenant: tenant.into(), user: String::new(), key: "refund-42".into() };
    let CommandResult::Created { key, .. } = h.run(1_000, create_as(key_of("t1"), 60_000, spec(0))) else { panic!() };
    // Same content: the same job (priority is not content).
    assert_eq!(
        h.run(1_500, create_as(key_of("t1"), 60_000, spec(5))),
        CommandResult::Created { key, created: false, state: Some(JobState::Activatable) }
    );
    // Other variables under the same key: a client bug, refused, naming the key.
    let mut other = (*spec(0)).clone();
    other.variables = r#"{"to":"x@y.z"}"#.into();
    match h.run(1_600, create_as(key_of("t1"), 60_000, Arc::new(other))) {
        CommandResult::Rejected(e) => {
            assert_eq!(e.kind, ErrorKind::FailedPrecondition);
            assert!(e.message.contains("refund-42") && e.message.contains(&key.to_string()), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    // Another tenant's identical key is its own job.
    assert!(matches!(
        h.run(1_700, create_as(key_of("t2"), 60_000, spec(0))),
        CommandResult::Created { created: true, .. }
    ));
}

#[test]
fn request_entries_survive_restore_and_expire_by_storage_id() {
    let mut state = PartitionState::new(0);
    let out = state.apply(&Batch::at(
        1_000,
        vec![create_as(gateway_request(1), 10_000, spec(0)), create_as(gateway_request(2), 50_000, spec(0))],
    ));
    let added = out.requests_added.clone();
    assert_eq!(added.len(), 2);
    // Restored from what storage holds, the state answers repeats alike.
    let jobs: Vec<Job> = state.jobs().cloned().collect();
    let mut restored = PartitionState::restore(state.meta(), jobs, added.clone(), Registry::default());
    let out = restored.apply(&Batch::at(20_000, vec![create_as(gateway_request(2), 50_000, spec(0))]));
    assert!(matches!(out.results[0], CommandResult::Created { created: false, .. }));
    // Request 1 expired at 11_000: its storage id is below the batch's bound, 2's is not.
    assert_eq!(out.requests_expired, vec![(added[0].0, gateway_request(1))]);
    assert!(added[0].0 < request_expiry_bound(20_000) && added[1].0 >= request_expiry_bound(20_000));
    assert!(restored.request(&gateway_request(1)).is_none());
}

#[test]
fn a_repeated_failure_of_one_attempt_is_done_not_refused() {
    let mut h = Harness::new();
    let key = h.create(1_000, 0);
    let attempt = h.activate(1_000, 1, 30_000)[0].attempt;
    let fail = Command::Fail {
        key,
        attempt,
        retries: 2,
        error_message: "boom".into(),
        back_off_ms: 0,
        variables: Bytes::new(),
        max_payload_bytes: u64::MAX,
        reason: FailReason::Failed,
    };
    assert_eq!(h.run(2_000, fail.clone()), CommandResult::Done);
    assert_eq!(h.run(2_100, fail.clone()), CommandResult::Done);
    assert_eq!(h.state.job(key).unwrap().retries, 2, "the repeat changed nothing");
    // Once the job is activated again, the old attempt's failure is refused.
    h.activate(3_000, 1, 30_000);
    assert!(matches!(h.run(3_100, fail), CommandResult::Rejected(_)));
}

fn fail_with(key: JobKey, variables: &str, max_payload_bytes: u64) -> Command {
    Command::Fail {
        key,
        attempt: 1,
        retries: 2,
        error_message: "flaky".into(),
        back_off_ms: 0,
        variables: Bytes::copy_from_slice(variables.as_bytes()),
        max_payload_bytes,
        reason: FailReason::Failed,
    }
}

#[test]
fn fail_merges_its_variables_into_the_job_for_the_next_attempt() {
    let mut h = Harness::new();
    let created = spec(0);
    let new_job = NewJob {
        spec: Arc::clone(&created),
        retries: 3,
        run_at: None,
        delay_ms: 0,
        request: None,
        dedupe_window_ms: 0,
    };
    let CommandResult::Created { key, .. } = h.run(1_000, Command::Create(new_job)) else { panic!("create failed") };
    h.activate(1_000, 1, 10_000);
    let result = h.run(1_100, fail_with(key, r#"{"to":"b@c.d","tries":{"smtp":1}}"#, u64::MAX));
    assert_eq!(result, CommandResult::Done);

    let merged = r#"{"to":"b@c.d","tries":{"smtp":1}}"#;
    assert_eq!(&h.state.job(key).unwrap().spec.variables[..], merged.as_bytes());
    assert_eq!(&created.variables[..], br#"{"to":"a@b.c"}"#, "the spec shared with the create is not changed");
    let again = h.activate(1_200, 1, 10_000);
    assert_eq!(&again[0].spec.variables[..], merged.as_bytes(), "the next attempt sees them");
    assert_eq!(again[0].spec.custom_headers, spec(0).custom_headers);
}

#[test]
fn fail_variables_that_are_not_an_object_or_too_large_change_nothing() {
    let mut h = Harness::new();
    let key = h.create(1_000, 0);
    h.activate(1_000, 1, 10_000);
    let before = h.state.job(key).unwrap().clone();

    let error = Harness::rejected(h.run(1_100, fail_with(key, "[1]", u64::MAX)));
    assert_eq!(error.kind, ErrorKind::InvalidArgument);
    let error = Harness::rejected(h.run(1_100, fail_with(key, r#"{"blob":"0123456789"}"#, 40)));
    assert_eq!(error.kind, ErrorKind::ResourceExhausted);
    assert!(error.message.contains("max_payload_bytes"), "{}", error.message);
    assert_eq!(h.state.job(key), Some(&before), "a refused failure leaves the job activated as it was");

    // Replacing a value with one no larger is within the limit.
    assert_eq!(h.run(1_100, fail_with(key, r#"{"to":"x"}"#, 30)), CommandResult::Done);
    assert_eq!(&h.state.job(key).unwrap().spec.variables[..], br#"{"to":"x"}"#);
}

fn staged(stages: &[&str]) -> Command {
    let spec = JobSpec { stages: stages.iter().map(|s| s.to_string()).collect(), ..(*spec(0)).clone() };
    Command::Create(NewJob {
        spec: Arc::new(spec),
        retries: 3,
        run_at: None,
        delay_ms: 0,
        request: None,
        dedupe_window_ms: 0,
    })
}

fn checkpoint(key: JobKey, attempt: u32, stage: &str, variables: &str) -> Command {
    Command::Checkpoint {
        key,
        attempt,
        stage: stage.into(),
        variables: Bytes::copy_from_slice(variables.as_bytes()),
        max_payload_bytes: 1 << 20,
    }
}

#[test]
fn checkpoints_move_forward_along_the_declared_stages_and_extend_the_lease() {
    let mut h = Harness::new();
    let CommandResult::Created { key, .. } = h.run(1_000, staged(&["charged", "notified", "receipt"])) else {
        panic!("create failed")
    };
    let first = h.activate(1_000, 1, 5_000).remove(0);
    assert_eq!(first.stage, "");
    // Committed with its variables; the lease runs a full timeout from now.
    assert_eq!(h.run(3_000, checkpoint(key, 1, "charged", r#"{"charge":"ch_1"}"#)), CommandResult::Deadline(8_000));
    assert_eq!(h.state.next_timer(), Some(8_000));
    // A repeat of the same commit (a retried request) extends again, commits nothing new.
    assert_eq!(h.run(4_000, checkpoint(key, 1, "charged", r#"{"charge":"ch_1"}"#)), CommandResult::Deadline(9_000));
    assert_eq!(h.state.job(key).unwrap().checkpoints.len(), 1);
    // Backwards, unknown, and skipping forward.
    // Whatever variables a repeat carries, the first commit stands.
    assert_eq!(h.run(4_000, checkpoint(key, 1, "charged", "{}")), CommandResult::Deadline(9_000));
    let unknown = Harness::rejected(h.run(4_000, checkpoint(key, 1, "shipped", "{}")));
    assert_eq!(unknown.kind, ErrorKind::InvalidArgument);
    assert_eq!(h.run(4_500, checkpoint(key, 1, "receipt", "{}")), CommandResult::Deadline(9_500));
    let behind = Harness::rejected(h.run(4_600, checkpoint(key, 1, "notified", "{}")));
    assert_eq!(behind.kind, ErrorKind::FailedPrecondition);
    assert!(behind.message.contains("already committed"), "{}", behind.message);

    // The lease lapses; the next attempt resumes at the last stage with its variables.
    let second = h.activate(10_000, 1, 5_000).remove(0);
    assert_eq!((second.attempt, second.stage.as_str()), (2, "receipt"));
    assert!(std::str::from_utf8(&second.spec.variables).unwrap().contains("ch_1"));
    // The first attempt is a zombie now.
    let zombie = Harness::rejected(h.run(10_100, checkpoint(key, 1, "receipt", "{}")));
    assert_eq!(zombie.kind, ErrorKind::FailedPrecondition);
    let stages: Vec<(&str, u32)> =
        h.state.job(key).unwrap().checkpoints.iter().map(|c| (c.stage.as_str(), c.attempt)).collect();
    assert_eq!(stages, [("charged", 1), ("receipt", 1)]);
}

#[test]
fn a_checkpoint_needs_declared_stages_an_attempt_and_room_for_its_variables() {
    let mut h = Harness::new();
    let plain = h.create(1_000, 0);
    h.activate(1_000, 1, 5_000);
    let none = Harness::rejected(h.run(1_100, checkpoint(plain, 1, "a", "{}")));
    assert!(none.message.contains("declares no stages"), "{}", none.message);
    let CommandResult::Created { key, .. } = h.run(1_200, staged(&["a"])) else { panic!() };
    h.activate(1_200, 1, 5_000);
    assert_eq!(Harness::rejected(h.run(1_300, checkpoint(key, 0, "a", "{}"))).kind, ErrorKind::InvalidArgument);
    let mut huge = checkpoint(key, 1, "a", "");
    if let Command::Checkpoint { variables, max_payload_bytes, .. } = &mut huge {
        *variables = Bytes::from(format!(r#"{{"blob":"{}"}}"#, "x".repeat(2_000)));
        *max_payload_bytes = 1_000;
    }
    assert_eq!(Harness::rejected(h.run(1_400, huge)).kind, ErrorKind::ResourceExhausted);
    assert!(h.state.job(key).unwrap().checkpoints.is_empty(), "a refused checkpoint commits nothing");
}

#[test]
fn an_idempotency_key_is_scoped_by_its_user() {
    let mut h = Harness::new();
    let as_user = |user: &str| RequestId::Key { tenant: DEFAULT_TENANT.into(), user: user.into(), key: "k".into() };
    let CommandResult::Created { key: alice, .. } = h.run(1_000, create_as(as_user("alice"), 60_000, spec(0))) else {
        panic!()
    };
    let bob = h.run(1_000, create_as(as_user("bob"), 60_000, spec(0)));
    assert!(matches!(bob, CommandResult::Created { key, created: true, .. } if key != alice), "{bob:?}");
}

fn fail_because(key: JobKey, attempt: u32, reason: FailReason) -> Command {
    Command::Fail {
        key,
        attempt,
        retries: 1,
        error_message: format!("{} happened", reason.as_str()),
        back_off_ms: 5_000,
        variables: Bytes::new(),
        max_payload_bytes: u64::MAX,
        reason,
    }
}

#[test]
fn a_failure_reason_decides_the_retry() {
    // Each reason on a fresh job with 3 retries, failed by its first attempt
    // that asks for 1 retry left and a 5 s back-off.
    let cases = [
        (FailReason::Failed, JobState::Scheduled, 1),
        (FailReason::Intermittent, JobState::Scheduled, 1),
        (FailReason::ResourceUnavailable, JobState::Scheduled, 1),
        (FailReason::InternalError, JobState::Scheduled, 1),
        (FailReason::MalformedPayload, JobState::Incident, 0),
        (FailReason::WorkerShutdown, JobState::Activatable, 3),
    ];
    for (reason, state, retries) in cases {
        let mut h = Harness::new();
        let key = h.create(1_000, 0);
        h.activate(1_000, 1, 10_000);
        let mut out = h.state.apply(&Batch::at(1_100, vec![fail_because(key, 1, reason)]));
        assert_eq!(out.results.pop(), Some(CommandResult::Done), "{reason:?}");
        let job = h.state.job(key).unwrap();
        assert_eq!((job.state, job.retries, job.fail_reason), (state, retries, reason), "{reason:?}");
        assert_eq!(out.failures, [(TYPE.to_string(), reason, "w1".to_string())]);
    }
    assert_eq!(FailReason::parse(""), Some(FailReason::Failed));
    assert_eq!(FailReason::parse("worker-shutdown"), Some(FailReason::WorkerShutdown));
    assert_eq!(FailReason::parse("gave-up"), None);
}

fn session_info(id: SessionId, labels: &[&str]) -> Arc<SessionInfo> {
    Arc::new(SessionInfo {
        id,
        worker: format!("w{id}"),
        hostname: "host".into(),
        job_types: vec![TYPE.into()],
        labels: labels.iter().map(|l| l.to_string()).collect(),
        heartbeat_ms: 1_000,
        dead_after_ms: 5_000,
        ..Default::default()
    })
}

fn session_activation(session: SessionId, timeout_ms: i64) -> Command {
    match activation(10, timeout_ms) {
        Command::Activate(a) => Command::Activate(Activation { session, ..a }),
        _ => unreachable!(),
    }
}

fn beat(h: &mut Harness, now: Millis, session: SessionId, held: Vec<(JobKey, u32)>) -> (WorkerState, Vec<JobKey>) {
    let (directed, revoked, _) = beat_renewing(h, now, session, held);
    (directed, revoked)
}

fn beat_renewing(
    h: &mut Harness,
    now: Millis,
    session: SessionId,
    held: Vec<(JobKey, u32)>,
) -> (WorkerState, Vec<JobKey>, Vec<JobKey>) {
    match h.run(now, Command::Beat { session, state: WorkerState::Running, held }) {
        CommandResult::Beat { directed, revoked, renewed } => (directed, revoked, renewed),
        other => panic!("beat failed: {other:?}"),
    }
}

#[test]
fn a_dead_session_hands_its_jobs_back_at_once_as_failed_attempts() {
    let mut h = Harness::new();
    let a = h.create(0, 0);
    let b = h.create(0, 0);
    h.run(0, Command::Register(session_info(7, &[])));
    let jobs = match h.run(1_000, session_activation(7, 600_000)) {
        CommandResult::Activated(jobs) => jobs,
        other => panic!("{other:?}"),
    };
    assert_eq!(jobs.len(), 2);
    assert_eq!(h.state.held_by(7), 2);
    // The lease (5 s from registration) fires long before the 10-minute timeout.
    assert_eq!(h.state.next_timer(), Some(5_000));
    h.state.apply(&Batch::at(5_000, vec![]));
    for key in [a, b] {
        let job = h.state.job(key).unwrap();
        assert_eq!(job.state, JobState::Activatable);
        assert_eq!(job.retries, 2, "a dead worker's attempt counts as failed");
        assert_eq!(job.fail_reason, FailReason::WorkerDied);
        assert!(job.error_message.contains("no heartbeat for 5000 ms"), "{}", job.error_message);
    }
    assert!(h.state.session(7).is_none());
    assert_eq!(h.state.held_by(7), 0);
    // Its heartbeat and activations are refused from then on.
    let error =
        Harness::rejected(h.run(6_000, Command::Beat { session: 7, state: WorkerState::Running, held: vec![] }));
    assert_eq!(error.kind, ErrorKind::NotFound);
    assert_eq!(Harness::rejected(h.run(6_000, session_activation(7, 1_000))).kind, ErrorKind::NotFound);
}

#[test]
fn a_dead_session_at_its_last_retry_makes_an_incident_and_honours_back_off() {
    let mut h = Harness::new();
    let spec = Arc::new(JobSpec { retry_back_off_ms: 2_000, ..JobSpec::clone(&spec(0)) });
    let create = |retries| {
        Command::Create(NewJob {
            spec: Arc::clone(&spec),
            retries,
            run_at: None,
            delay_ms: 0,
            request: None,
            dedupe_window_ms: 0,
        })
    };
    let CommandResult::Created { key: last, .. } = h.run(0, create(1)) else { panic!() };
    let CommandResult::Created { key: more, .. } = h.run(0, create(3)) else { panic!() };
    h.run(0, Command::Register(session_info(7, &[])));
    h.run(0, session_activation(7, 600_000));
    h.state.apply(&Batch::at(5_000, vec![]));
    assert_eq!(h.state_of(last), Some(JobState::Incident));
    assert_eq!(h.state_of(more), Some(JobState::Scheduled));
    assert_eq!(h.state.job(more).unwrap().due_at, 7_000);
}

#[test]
fn a_failure_sent_after_the_session_died_is_refused_not_answered_ok() {
    let mut h = Harness::new();
    let key = h.create(0, 3);
    h.run(0, Command::Register(session_info(7, &[])));
    h.run(0, session_activation(7, 600_000));
    // The session misses its heartbeats: the broker fails the attempt.
    h.state.apply(&Batch::at(5_000, vec![]));
    assert_eq!(h.state_of(key), Some(JobState::Activatable));
    // The worker, still at work, fails it with a back-off. That failure did
    // not take effect (the broker's did), so it must not be answered OK as
    // if it were a repeat of one that had.
    let result = h.run(5_100, smtp_down(key, 1, 3_000));
    let CommandResult::Rejected(error) = result else { panic!("answered {result:?}") };
    assert!(error.message.contains("no longer yours"), "{error:?}");
    assert_eq!(h.state_of(key), Some(JobState::Activatable), "the job stays where the broker put it");
}

#[test]
fn heartbeats_extend_listed_jobs_and_report_those_no_longer_held() {
    let mut h = Harness::new();
    let kept = h.create(0, 0);
    let left_out = h.create(0, 0);
    let cancelled = h.create(0, 0);
    h.run(0, Command::Register(session_info(7, &[])));
    h.run(0, session_activation(7, 3_000));
    h.run(1_000, Command::Cancel { key: cancelled, by: String::new() });
    let (directed, revoked, renewed) = beat_renewing(&mut h, 2_000, 7, vec![(kept, 1), (cancelled, 1)]);
    assert_eq!(directed, WorkerState::Running);
    assert_eq!(revoked, vec![cancelled]);
    assert_eq!(renewed, vec![kept]);
    assert_eq!(h.state.job(kept).unwrap().deadline, 5_000, "a full timeout from the beat");
    assert_eq!(h.state.job(left_out).unwrap().deadline, 3_000, "a job left out keeps its deadline");
    // Beats keep the job past its own timeout; the one left out times out.
    beat(&mut h, 4_000, 7, vec![(kept, 1)]);
    h.state.apply(&Batch::at(6_000, vec![]));
    assert_eq!(h.state_of(kept), Some(JobState::Activated));
    assert_eq!(h.state_of(left_out), Some(JobState::Activatable));
    // A stale attempt is reported too.
    let (_, revoked) = beat(&mut h, 6_500, 7, vec![(left_out, 1)]);
    assert_eq!(revoked, vec![left_out]);
}

#[test]
fn quiet_and_terminated_sessions_get_no_jobs_until_resumed() {
    let mut h = Harness::new();
    h.create(0, 0);
    h.run(0, Command::Register(session_info(7, &["pool:critical"])));
    h.run(0, Command::Register(session_info(8, &[])));
    let covered = match h
        .run(0, Command::Direct { target: SessionTarget::Label("pool:critical".into()), state: WorkerState::Quiet })
    {
        CommandResult::Sessions(sessions) => sessions,
        other => panic!("{other:?}"),
    };
    assert_eq!(covered.len(), 1);
    assert_eq!(covered[0].0.info.id, 7);
    assert!(!h.state.session_takes_jobs(7));
    assert!(h.state.session_takes_jobs(8));
    assert_eq!(h.run(0, session_activation(7, 1_000)), CommandResult::Activated(vec![]));
    let (directed, _) = beat(&mut h, 500, 7, vec![]);
    assert_eq!(directed, WorkerState::Quiet);
    // A worker that reports quiet itself (SIGTSTP) gets nothing either.
    h.run(600, Command::Beat { session: 8, state: WorkerState::Quiet, held: vec![] });
    assert_eq!(h.run(600, session_activation(8, 1_000)), CommandResult::Activated(vec![]));
    let mut out = h
        .state
        .apply(&Batch::at(700, vec![Command::Direct { target: SessionTarget::One(7), state: WorkerState::Running }]));
    assert!(out.available.contains(&TYPE.to_string()), "a resumed session is offered waiting jobs");
    assert!(matches!(out.results.pop(), Some(CommandResult::Sessions(s)) if s.len() == 1));
    match h.run(800, session_activation(7, 1_000)) {
        CommandResult::Activated(jobs) => assert_eq!(jobs.len(), 1),
        other => panic!("{other:?}"),
    }
}

#[test]
fn ending_a_session_hands_back_its_jobs_without_using_a_retry() {
    let mut h = Harness::new();
    let key = h.create(0, 0);
    h.run(0, Command::Register(session_info(7, &[])));
    h.run(0, session_activation(7, 600_000));
    h.run(1_000, Command::EndSession { session: 7 });
    let job = h.state.job(key).unwrap();
    assert_eq!(job.state, JobState::Activatable);
    assert_eq!(job.retries, 3);
    assert_eq!(job.fail_reason, FailReason::SessionEnded);
    assert_eq!(h.state.next_timer(), None, "no lease left to fire");
    // The worker's own failure of that attempt, arriving after, did not
    // take effect (its back-off least of all): it is told so.
    let late = Command::Fail {
        key,
        attempt: 1,
        retries: 2,
        error_message: "too late".into(),
        back_off_ms: 1_000,
        variables: Bytes::new(),
        max_payload_bytes: u64::MAX,
        reason: FailReason::Failed,
    };
    let error = Harness::rejected(h.run(1_001, late));
    assert_eq!(error.kind, ErrorKind::FailedPrecondition, "{error:?}");
    assert_eq!(h.state.job(key).unwrap().state, JobState::Activatable, "no back-off was set");
}

#[test]
fn sessions_and_schemas_survive_a_restore() {
    let mut h = Harness::new();
    h.run(0, Command::Register(session_info(7, &[])));
    let schema = r#"{"type":"object","required":["to"],"properties":{"to":{"type":"string"}}}"#;
    h.run(0, Command::SetSchema { job_type: TYPE.into(), schema: Bytes::from_static(schema.as_bytes()) });
    h.run(0, session_activation(7, 600_000));
    let key = h.create(0, 0);
    h.run(0, session_activation(7, 600_000));
    let records: Vec<Job> = h.state.jobs().cloned().collect();
    let mut restored = PartitionState::restore(h.state.meta(), records, Vec::new(), h.state.registry());
    assert_eq!(restored.held_by(7), 1);
    assert_eq!(restored.next_timer(), Some(5_000));
    let bad = Command::Create(NewJob {
        spec: Arc::new(JobSpec { variables: r#"{"to":42}"#.into(), ..JobSpec::clone(&spec(0)) }),
        retries: 1,
        run_at: None,
        delay_ms: 0,
        request: None,
        dedupe_window_ms: 0,
    });
    let mut out = restored.apply(&Batch::at(1_000, vec![bad]));
    let Some(CommandResult::Rejected(error)) = out.results.pop() else { panic!("the schema still applies") };
    assert_eq!(error.kind, ErrorKind::InvalidArgument);
    assert!(error.message.contains("at /to"), "{}", error.message);
    restored.apply(&Batch::at(5_000, vec![]));
    assert_eq!(restored.job(key).unwrap().fail_reason, FailReason::WorkerDied);
}

#[test]
fn a_new_leader_s_first_entry_gives_every_session_a_full_lease() {
    let mut h = Harness::new();
    let key = h.create(0, 0);
    h.run(0, Command::Register(session_info(7, &[])));
    h.run(0, session_activation(7, 600_000));
    // No leader for 10 s: no beat could commit. The new leader's first entry
    // renews the lease before its timers fire.
    let mut take_over = Batch::at(10_000, vec![]);
    take_over.renew_sessions = true;
    h.state.apply(&take_over);
    assert_eq!(h.state_of(key), Some(JobState::Activated), "the worker is not declared dead for the outage");
    assert_eq!(h.state.next_timer(), Some(15_000));
    // Without beats after that, it is declared dead a dead-after later.
    h.state.apply(&Batch::at(15_000, vec![]));
    assert_eq!(h.state.job(key).unwrap().fail_reason, FailReason::WorkerDied);
}

#[test]
fn a_take_over_restarts_only_the_leases_its_gap_threatens() {
    let mut h = Harness::new();
    let key = h.create(0, 0);
    // Session 7 beats every 1 s and is dead after 5 s: 3 s of margin. Session
    // 8 is dead after exactly two beats: no margin, any gap threatens it.
    h.run(0, Command::Register(session_info(7, &[])));
    let tight = SessionInfo { heartbeat_ms: 2_500, dead_after_ms: 5_000, ..SessionInfo::clone(&session_info(8, &[])) };
    h.run(0, Command::Register(Arc::new(tight)));
    h.run(0, session_activation(7, 600_000));
    // Worker 7 dies; its last beat is the registration at 0. The partition's
    // last entry is at 4 s, and a hand-over's first entry comes 40 ms later.
    h.state.apply(&Batch::at(4_000, vec![]));
    assert_eq!(h.state.lease_gap(4_040), Some(40), "the session without margin is threatened by any gap");
    let out = h.state.apply(&Batch::at(4_040, vec![Command::RenewLeases { gap_ms: 40 }]));
    assert_eq!(out.results, vec![CommandResult::Done]);
    assert_eq!(h.state.session(7).map(|s| s.last_beat), Some(0), "a lease with margin for the gap is not restarted");
    assert_eq!(h.state.session(8).map(|s| s.last_beat), Some(4_040), "the threatened lease restarts");
    // So worker 7 is declared dead when its own lease ends, not 5 s after the hand-over.
    h.state.apply(&Batch::at(5_000, vec![]));
    assert_eq!(h.state.job(key).unwrap().fail_reason, FailReason::WorkerDied);
    assert!(h.state.session(8).is_some(), "session 8's lease runs to 9,040");
    // Anywhere but first in its entry it does nothing.
    h.state.apply(&Batch::at(5_100, vec![Command::ListSessions, Command::RenewLeases { gap_ms: 1_000_000 }]));
    assert_eq!(h.state.session(8).map(|s| s.last_beat), Some(4_040));
}

#[test]
fn a_take_over_below_data_version_18_restarts_every_lease() {
    let mut h = Harness::new();
    h.run(0, Command::Register(session_info(7, &[])));
    let mut take_over = Batch::at(40, vec![]);
    take_over.renew_sessions = true;
    h.state.apply(&take_over);
    assert_eq!(h.state.session(7).map(|s| s.last_beat), Some(40), "an older leader's entry keeps its meaning");
}

#[test]
fn a_lease_is_restarted_only_after_a_gap_a_live_worker_could_not_beat_through() {
    let mut h = Harness::new();
    // Beats every 1 s, dead after 5 s: a live worker has 3 s of margin.
    h.run(0, Command::Register(session_info(7, &[])));
    // The last entry, before the session's lease ends at 5 s.
    h.state.apply(&Batch::at(4_000, vec![]));
    // A hand-over: the new leader's first entry 40 ms after the last one.
    assert_eq!(h.state.lease_gap(4_040), None, "a hand-over restarts no lease");
    // Half that margin is the line.
    assert_eq!(h.state.lease_gap(5_499), None);
    assert_eq!(h.state.lease_gap(5_500), Some(1_500), "a gap a live worker may not beat through renews its lease");
    assert_eq!(h.state.lease_gap(9_000), Some(5_000));
}

#[test]
fn without_sessions_no_lease_needs_renewal() {
    let h = Harness::new();
    assert_eq!(h.state.lease_gap(1_000_000), None);
}

mod routing_by_labels {
    use super::*;

    fn labelled(required: &[&str], preferred: &[&str]) -> Command {
        let owned = |ls: &[&str]| ls.iter().map(|l| l.to_string()).collect();
        Command::Create(NewJob {
            spec: Arc::new(JobSpec { routing: Routing::new(owned(required), owned(preferred)), ..(*spec(0)).clone() }),
            retries: 3,
            run_at: None,
            delay_ms: 0,
            request: None,
            dedupe_window_ms: 0,
        })
    }

    fn taker(labels: &[&str], local: bool) -> Taker {
        Taker::new(labels.iter().map(|l| l.to_string()).collect(), local)
    }

    fn activate_as(h: &mut Harness, me: Taker, rivals: Vec<Taker>) -> Vec<JobKey> {
        let Command::Activate(mut a) = activation(10, 1_000) else { unreachable!() };
        a.taker = me;
        a.rivals = rivals.into_iter().map(|r| r.serving(&[DEFAULT_TENANT.to_string()])).collect();
        match h.run(1, Command::Activate(a)) {
            CommandResult::Activated(jobs) => jobs.into_iter().map(|j| j.key).collect(),
            other => panic!("activate failed: {other:?}"),
        }
    }

    fn created(result: CommandResult) -> JobKey {
        match result {
            CommandResult::Created { key, .. } => key,
            other => panic!("create failed: {other:?}"),
        }
    }

    #[test]
    fn a_job_goes_only_to_a_taker_with_the_labels_it_requires() {
        let mut h = Harness::new();
        let in_b = created(h.run(0, labelled(&["region:b"], &[])));
        let anywhere = h.create(0, 0);
        let a = taker(&["region:a"], true);
        assert_eq!(activate_as(&mut h, a.clone(), vec![]), vec![anywhere], "region:b is required");
        assert_eq!(h.state.activatable_count(TYPE, &[DEFAULT_TENANT.into()]), 1, "it waits, activatable");
        assert_eq!(h.state.activatable_by_routing(TYPE).len(), 1);
        assert_eq!(activate_as(&mut h, taker(&["region:b"], false), vec![a]), vec![in_b]);
    }

    #[test]
    fn a_preferred_tier_takes_its_jobs_while_it_is_open() {
        let mut h = Harness::new();
        let prefers_b = created(h.run(0, labelled(&[], &["region:b"])));
        let plain = h.create(0, 0);
        let (a, b) = (taker(&["region:a"], true), taker(&["region:b"], false));
        // B's worker is open: A's may take only the job that does not prefer B.
        assert_eq!(activate_as(&mut h, a.clone(), vec![a.clone(), b.clone()]), vec![plain]);
        assert_eq!(activate_as(&mut h, b.clone(), vec![a.clone(), b]), vec![prefers_b]);
        // Gone B: the next tier takes what only preferred it.
        let again = created(h.run(2, labelled(&[], &["region:b"])));
        assert_eq!(activate_as(&mut h, a.clone(), vec![a]), vec![again]);
    }

    #[test]
    fn a_far_taker_gets_unlabelled_jobs_only_while_no_near_one_is_open() {
        let mut h = Harness::new();
        let job = h.create(0, 0);
        let (near, far) = (taker(&["region:a"], true), taker(&["region:b"], false));
        assert!(activate_as(&mut h, far.clone(), vec![near, far.clone()]).is_empty());
        assert_eq!(activate_as(&mut h, far.clone(), vec![far]), vec![job]);
    }
}

/// A create of `job_type` for `tenant`, remembered for a second under
/// `request` when there is one.
fn create_in(tenant: &str, job_type: &str, request: Option<RequestId>) -> Command {
    Command::Create(NewJob {
        spec: Arc::new(JobSpec { job_type: job_type.into(), tenant: tenant.into(), ..Default::default() }),
        retries: 3,
        run_at: None,
        delay_ms: 0,
        dedupe_window_ms: if request.is_some() { 1_000 } else { 0 },
        request,
    })
}

#[test]
fn a_listing_walks_the_named_tenants_keys_in_order_and_stops_at_its_page() {
    let mut h = Harness::new();
    let create_for = |tenant: &str, job_type: &str| create_in(tenant, job_type, None);
    // Interleaved: acme, globex, acme (other type), globex, ...
    let mut keys: Vec<(JobKey, &str, &str)> = Vec::new();
    for i in 0..12 {
        let (tenant, job_type) = match i % 3 {
            0 => ("acme", TYPE),
            1 => ("globex", TYPE),
            _ => ("acme", "other"),
        };
        let CommandResult::Created { key, .. } = h.run(i, create_for(tenant, job_type)) else { panic!("created") };
        keys.push((key, tenant, job_type));
    }
    let listed = |h: &Harness, filter: &JobFilter, tenants: &[&str], after: JobKey, limit: usize| {
        let tenants: Vec<String> = tenants.iter().map(|t| t.to_string()).collect();
        h.state.list_live(filter, &tenants, after, limit).iter().map(|j| j.key).collect::<Vec<_>>()
    };
    let of = |pick: &dyn Fn(&str, &str) -> bool| -> Vec<JobKey> {
        keys.iter().filter(|(_, t, ty)| pick(t, ty)).map(|(k, _, _)| *k).collect()
    };
    let start = JobKey::new(2, 0);
    let everything = JobFilter::default();
    assert_eq!(listed(&h, &everything, &[], start, 100), of(&|_, _| true), "every tenant, merged in key order");
    assert_eq!(listed(&h, &everything, &["acme"], start, 100), of(&|t, _| t == "acme"));
    let acme = of(&|t, _| t == "acme");
    assert_eq!(listed(&h, &everything, &["acme"], start, 3), acme[..3], "a page");
    assert_eq!(listed(&h, &everything, &["acme"], acme[2], 3), acme[3..6], "the next page starts after the last");
    let typed = JobFilter { job_type: TYPE.into(), ..Default::default() };
    assert_eq!(listed(&h, &typed, &["acme", "globex"], start, 100), of(&|_, ty| ty == TYPE));
    let globex_only = JobFilter { tenant: "globex".into(), ..Default::default() };
    assert_eq!(listed(&h, &globex_only, &["acme"], start, 100), Vec::<JobKey>::new(), "a tenant it may not read");
    assert_eq!(listed(&h, &globex_only, &[], start, 100), of(&|t, _| t == "globex"));
    // A job that finishes leaves the index with the job.
    let gone = of(&|t, _| t == "globex")[0];
    h.run(100, Command::Cancel { key: gone, by: String::new() });
    assert!(!listed(&h, &everything, &[], start, 100).contains(&gone));
    let restored =
        PartitionState::restore(h.state.meta(), h.state.jobs().cloned().collect::<Vec<_>>(), [], Registry::default());
    assert_eq!(restored.list_live(&everything, &[], start, 100).len(), 11, "a restore rebuilds the index");
}

#[test]
fn each_tenants_idempotency_keys_are_counted_in_and_out() {
    let mut h = Harness::new();
    let keyed = |tenant: &str, key: &str| {
        create_in(tenant, TYPE, Some(RequestId::Key { tenant: tenant.into(), user: String::new(), key: key.into() }))
    };
    let mut entries = Vec::new();
    for (now, tenant, key) in [(0, "acme", "a"), (1, "acme", "b"), (2, "acme", "a"), (3, "globex", "a")] {
        entries.extend(h.state.apply(&Batch::at(now, vec![keyed(tenant, key)])).requests_added);
    }
    assert_eq!((h.state.keys_of_tenant("acme"), h.state.keys_of_tenant("globex")), (2, 1), "a repeat adds none");
    let restored = PartitionState::restore(h.state.meta(), Vec::new(), entries, Registry::default());
    assert_eq!(restored.keys_of_tenant("acme"), 2, "a restore counts them again");
    // A window later every key has expired.
    h.run(5_000, Command::ListSessions);
    assert_eq!((h.state.keys_of_tenant("acme"), h.state.keys_of_tenant("globex")), (0, 0));
}
