//! Failures decided by the job's retry policy, at apply: the same decision
//! on every replica, the back-off it gives, errors that never retry, and a
//! resend answered with what the first send decided.

use std::sync::Arc;

use bytes::Bytes;

use super::retry::{Backoff, RetryPolicy, RETRY_POLICIES, RETRY_POLICY_HEADER};
use super::*;

const TYPE: &str = "charge";

fn create(policy: Option<&RetryPolicy>, retries: i32) -> Command {
    let headers = policy.map(|p| vec![(RETRY_POLICY_HEADER.to_string(), p.encode())]).unwrap_or_default();
    Command::Create(NewJob {
        spec: Arc::new(JobSpec { job_type: TYPE.into(), custom_headers: headers, ..Default::default() }),
        retries,
        run_at: None,
        delay_ms: 0,
        request: None,
        dedupe_window_ms: 0,
    })
}

fn fail(key: JobKey, attempt: u32, error_type: &str, retryable: bool, jitter: u16) -> Command {
    Command::FailByPolicy {
        key,
        attempt,
        error_message: "card declined".into(),
        error_type: error_type.into(),
        retryable,
        jitter,
        variables: Bytes::new(),
        max_payload_bytes: u64::MAX,
    }
}

fn run(state: &mut PartitionState, now: Millis, command: Command) -> CommandResult {
    let mut out = state.apply(&Batch::at(now, vec![command]));
    out.results.pop().expect("one result")
}

fn created(state: &mut PartitionState, policy: Option<&RetryPolicy>, retries: i32) -> JobKey {
    match run(state, 0, create(policy, retries)) {
        CommandResult::Created { key, .. } => key,
        other => panic!("a create: {other:?}"),
    }
}

/// Activates the one job of the type at `now`; its attempt.
fn activate(state: &mut PartitionState, now: Millis) -> u32 {
    match run(state, now, Command::Activate(Activation::plain(TYPE, ""))) {
        CommandResult::Activated(jobs) if jobs.len() == 1 => jobs[0].attempt,
        other => panic!("one job activated at {now}: {other:?}"),
    }
}

fn linear() -> RetryPolicy {
    RetryPolicy {
        backoff: Backoff::Linear,
        initial_ms: 1_000,
        max_ms: 2_500,
        jitter: false,
        non_retryable: vec!["Fraud.*".into()],
        ..RetryPolicy::default()
    }
}

#[test]
fn each_failure_waits_as_the_jobs_policy_says_until_retries_run_out() {
    let mut state = PartitionState::new(0);
    let key = created(&mut state, Some(&linear()), 3);
    let mut now = 0;
    for (expected_wait, retries_left) in [(1_000, 2), (2_000, 1)] {
        let attempt = activate(&mut state, now);
        let decided = run(&mut state, now, fail(key, attempt, "Declined", true, 0));
        assert_eq!(decided, CommandResult::Failed { retries: retries_left, back_off_ms: expected_wait });
        let job = state.job(key).unwrap();
        assert_eq!((job.state, job.due_at, job.retries), (JobState::Scheduled, now + expected_wait, retries_left));
        now += expected_wait;
    }
    let attempt = activate(&mut state, now);
    assert_eq!(attempt, 3);
    let decided = run(&mut state, now, fail(key, attempt, "Declined", true, 0));
    assert_eq!(decided, CommandResult::Failed { retries: 0, back_off_ms: 0 }, "the last attempt failed");
    assert_eq!(state.job(key).unwrap().state, JobState::Incident);
}

#[test]
fn an_error_that_must_not_retry_is_an_incident_at_once() {
    for (error_type, retryable) in [("Fraud.Suspected", true), ("Declined", false)] {
        let mut state = PartitionState::new(0);
        let key = created(&mut state, Some(&linear()), 5);
        let attempt = activate(&mut state, 0);
        let decided = run(&mut state, 10, fail(key, attempt, error_type, retryable, 0));
        assert_eq!(decided, CommandResult::Failed { retries: 0, back_off_ms: 0 }, "{error_type} {retryable}");
        let job = state.job(key).unwrap();
        assert_eq!(job.state, JobState::Incident);
        assert_eq!(job.error_message, "card declined");
    }
}

#[test]
fn a_job_without_a_policy_follows_the_default_with_the_jitter_the_command_carries() {
    let mut state = PartitionState::new(0);
    let key = created(&mut state, None, 3);
    let attempt = activate(&mut state, 0);
    // The default: a second, spread by jitter from half to one and a half.
    let decided = run(&mut state, 0, fail(key, attempt, "", true, u16::MAX / 2 + 1));
    assert_eq!(decided, CommandResult::Failed { retries: 2, back_off_ms: 1_000 });
    let mut other = PartitionState::new(0);
    let key = created(&mut other, None, 3);
    let attempt = activate(&mut other, 0);
    assert_eq!(
        run(&mut other, 0, fail(key, attempt, "", true, 0)),
        CommandResult::Failed { retries: 2, back_off_ms: 500 }
    );
}

#[test]
fn a_resend_is_answered_with_what_the_first_send_decided_and_a_stale_attempt_is_refused() {
    let mut state = PartitionState::new(0);
    let key = created(&mut state, Some(&linear()), 3);
    let attempt = activate(&mut state, 0);
    let first = run(&mut state, 100, fail(key, attempt, "Declined", true, 0));
    assert_eq!(first, CommandResult::Failed { retries: 2, back_off_ms: 1_000 });
    let again = run(&mut state, 400, fail(key, attempt, "Declined", true, 0));
    assert_eq!(again, CommandResult::Failed { retries: 2, back_off_ms: 700 }, "the wait that is left");
    assert_eq!(state.job(key).unwrap().retries, 2, "the resend used no retry");
    let next = activate(&mut state, 1_100);
    let CommandResult::Rejected(stale) = run(&mut state, 1_200, fail(key, attempt, "Declined", true, 0)) else {
        panic!("a failure of an attempt that is over is refused");
    };
    assert_eq!(stale.kind, ErrorKind::FailedPrecondition, "{}", stale.message);
    assert_eq!(state.job(key).unwrap().attempt, next);
}

#[test]
fn a_failure_by_policy_travels_only_at_its_data_version() {
    let command = fail(JobKey::new(0, 1), 1, "", true, 0);
    assert_eq!(command.since_version().map(|(v, _)| v), Some(RETRY_POLICIES));
}
