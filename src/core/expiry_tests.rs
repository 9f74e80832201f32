//! Jobs with an expiry: never handed out after it, ended as expired
//! (final, in history, counted), whatever path would have made them ready.

use std::sync::Arc;

use super::*;

const TYPE: &str = "mail";

fn create(expires_at: Millis, delay_ms: i64) -> Command {
    let headers = vec![(EXPIRES_AT_HEADER.to_string(), expires_at.to_string())];
    Command::Create(NewJob {
        spec: Arc::new(JobSpec { job_type: TYPE.into(), custom_headers: headers, ..Default::default() }),
        retries: 3,
        run_at: None,
        delay_ms,
        request: None,
        dedupe_window_ms: 0,
    })
}

fn activate(timeout_ms: i64) -> Command {
    Command::Activate(Activation { timeout_ms, ..Activation::plain(TYPE, "") })
}

fn run(state: &mut PartitionState, now: Millis, command: Command) -> (CommandResult, ApplyOutput) {
    let mut out = state.apply(&Batch::at(now, vec![command]));
    (out.results.pop().expect("one result"), out)
}

fn activated(state: &mut PartitionState, now: Millis) -> Vec<JobKey> {
    let (result, _) = run(state, now, activate(1_500));
    let CommandResult::Activated(jobs) = result else { panic!("an activation: {result:?}") };
    jobs.iter().map(|j| j.key).collect()
}

fn created(result: CommandResult) -> (JobKey, Option<JobState>) {
    let CommandResult::Created { key, state, .. } = result else { panic!("created: {result:?}") };
    (key, state)
}

#[test]
fn a_job_not_activated_by_its_expiry_ends_expired_and_is_never_handed_out() {
    let mut state = PartitionState::new(0);
    let (key, _) = created(run(&mut state, 1_000, create(3_000, 0)).0);
    assert_eq!(state.next_timer(), Some(3_000), "the leader wakes for the expiry");
    let out = state.apply(&Batch::at(3_000, vec![activate(1_000)]));
    assert_eq!(out.results, vec![CommandResult::Activated(Vec::new())], "expired before the activation in its entry");
    let expired = out.finished.iter().find(|job| job.key == key).expect("the job finished");
    assert_eq!(expired.state, JobState::Expired);
    assert!(expired.history.events().any(|e| e.kind == EventKind::Expired { at: 3_000 }));
    assert!(out.outcomes.contains(&(TYPE.to_string(), Outcome::Expired, 1)));
    assert!(out.happened.iter().any(|h| h.key == key && h.lifecycle == Lifecycle::Expired));
    assert_eq!(state.job(key), None);
}

#[test]
fn an_activated_job_runs_on_but_is_not_handed_out_again_after_its_expiry() {
    let mut state = PartitionState::new(0);
    let (key, _) = created(run(&mut state, 1_000, create(3_000, 0)).0);
    assert_eq!(activated(&mut state, 2_000), vec![key]);
    // The expiry passes while it runs: nothing happens to it.
    let out = state.apply(&Batch::at(3_000, Vec::new()));
    assert!(out.finished.is_empty());
    assert_eq!(state.job(key).map(|j| j.state), Some(JobState::Activated));
    // Its activation times out after the expiry: it ends, not handed out.
    let out = state.apply(&Batch::at(3_501, vec![activate(1_000)]));
    assert_eq!(out.results, vec![CommandResult::Activated(Vec::new())]);
    assert_eq!(out.finished.first().map(|j| (j.key, j.state)), Some((key, JobState::Expired)));
    // One activated in time completes as usual.
    let (other, _) = created(run(&mut state, 4_000, create(9_000, 0)).0);
    assert_eq!(activated(&mut state, 5_000), vec![other]);
    let complete = Command::Complete { key: other, attempt: 1, variables: Default::default() };
    assert_eq!(run(&mut state, 6_000, complete).0, CommandResult::Done);
}

#[test]
fn a_delayed_job_expires_before_it_is_due_and_a_past_one_at_once() {
    let mut state = PartitionState::new(0);
    let (late, _) = created(run(&mut state, 1_000, create(3_000, 5_000)).0);
    let out = state.apply(&Batch::at(3_000, Vec::new()));
    assert_eq!(out.finished.first().map(|j| (j.key, j.state)), Some((late, JobState::Expired)));
    assert_eq!(state.next_timer(), None, "its due time left with it");
    let (_, now_state) = created(run(&mut state, 4_000, create(3_500, 0)).0);
    assert_eq!(now_state, Some(JobState::Expired), "made past its expiry: expired at once");
}

#[test]
fn an_expiry_survives_a_restore() {
    let mut state = PartitionState::new(0);
    let (key, _) = created(run(&mut state, 1_000, create(3_000, 0)).0);
    let jobs: Vec<Job> = state.jobs().cloned().collect();
    let mut restored = PartitionState::restore(state.meta(), jobs, Vec::new(), state.registry());
    assert_eq!(restored.next_timer(), Some(3_000));
    let out = restored.apply(&Batch::at(3_000, vec![activate(1_000)]));
    assert_eq!(out.results, vec![CommandResult::Activated(Vec::new())]);
    assert_eq!(out.finished.first().map(|j| (j.key, j.state)), Some((key, JobState::Expired)));
}

#[test]
fn an_incident_past_its_expiry_ends_expired_when_its_retries_are_raised() {
    let mut state = PartitionState::new(0);
    let (key, _) = created(run(&mut state, 1_000, create(3_000, 0)).0);
    assert_eq!(activated(&mut state, 2_000), vec![key]);
    let fail = Command::Fail {
        key,
        attempt: 1,
        retries: 0,
        error_message: "boom".into(),
        back_off_ms: 0,
        variables: Default::default(),
        max_payload_bytes: 1 << 20,
        reason: FailReason::Failed,
    };
    assert_eq!(run(&mut state, 2_500, fail).0, CommandResult::Done);
    state.apply(&Batch::at(3_000, Vec::new()));
    assert_eq!(state.job(key).map(|j| j.state), Some(JobState::Incident), "an incident waits for its operator");
    let raise = Command::UpdateRetries { key, retries: 2, by: "op".into() };
    let (result, out) = run(&mut state, 4_000, raise);
    assert_eq!(result, CommandResult::Done);
    assert_eq!(out.finished.first().map(|j| (j.key, j.state)), Some((key, JobState::Expired)), "not handed out again");
}
