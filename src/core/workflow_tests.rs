//! Workflows in the engine: a chain passes results and stops at a failure,
//! a group ends when every step ended, a batch fires its callbacks by
//! OJS's matrix once, a cancel stops what waits, and a restore or a repeat
//! changes nothing.

use std::sync::Arc;

use bytes::Bytes;

use super::principal::Principal;
use super::workflow::{Kind, State, StepSpec, StepState, When, PARENT_RESULTS, STEP_HEADER, WORKFLOW_HEADER};
use super::*;

/// The largest variables a step's job may have, in these tests.
const LIMIT: u64 = 1_000;

fn step(job_type: &str, retries: i32) -> StepSpec {
    let template =
        JobSpec { job_type: job_type.into(), tenant: "acme".into(), variables: "{}".into(), ..Default::default() };
    StepSpec { template: Arc::new(template), retries }
}

fn workflow(kind: Kind, steps: &[&str], callbacks: &[(When, &str)]) -> Arc<WorkflowSpec> {
    Arc::new(WorkflowSpec {
        tenant: "acme".into(),
        id: "wf-1".into(),
        name: "test".into(),
        kind,
        steps: steps.iter().map(|t| step(t, 0)).collect(),
        callbacks: callbacks.iter().map(|(w, t)| (*w, step(t, 0))).collect(),
    })
}

struct Partition {
    state: PartitionState,
    now: Millis,
}

impl Partition {
    fn new() -> Self {
        Partition { state: PartitionState::new(0), now: 1_000 }
    }
    fn run(&mut self, command: Command) -> CommandResult {
        self.now += 10;
        let mut out = self.state.apply(&Batch::at(self.now, vec![command]));
        out.results.pop().expect("one result")
    }
    fn create(&mut self, spec: &Arc<WorkflowSpec>) -> Workflow {
        match self.run(Command::CreateWorkflow { spec: Arc::clone(spec), by: "ops".into(), max_payload_bytes: LIMIT }) {
            CommandResult::Workflows(mut one) => one.remove(0),
            other => panic!("create: {other:?}"),
        }
    }
    fn get(&mut self) -> Workflow {
        match self.run(Command::GetWorkflow { tenant: "acme".into(), id: "wf-1".into() }) {
            CommandResult::Workflows(mut one) => one.remove(0),
            other => panic!("get: {other:?}"),
        }
    }
    /// Activates one job of `job_type`, answering it.
    fn take(&mut self, job_type: &str) -> Option<ActivatedJobData> {
        let activation = Activation { max_jobs: 1, ..Activation::plain(job_type, "acme") };
        match self.run(Command::Activate(activation)) {
            CommandResult::Activated(mut jobs) => jobs.pop(),
            other => panic!("activate: {other:?}"),
        }
    }
    fn complete(&mut self, job_type: &str, result: &str) -> ActivatedJobData {
        let job = self.take(job_type).unwrap_or_else(|| panic!("a {job_type} job to take"));
        let done = Command::Complete { key: job.key, attempt: job.attempt, variables: Bytes::from(result.to_string()) };
        assert_eq!(self.run(done), CommandResult::Done);
        job
    }
    fn fail(&mut self, job_type: &str) {
        let job = self.take(job_type).unwrap_or_else(|| panic!("a {job_type} job to take"));
        let fail = Command::Fail {
            key: job.key,
            attempt: job.attempt,
            retries: 0,
            error_message: "boom".into(),
            back_off_ms: 0,
            variables: Bytes::new(),
            max_payload_bytes: u64::MAX,
            reason: FailReason::default(),
        };
        assert_eq!(self.run(fail), CommandResult::Done);
    }
    fn waiting(&self) -> Vec<String> {
        let mut types: Vec<String> = self.state.jobs().map(|j| j.spec.job_type.clone()).collect();
        types.sort();
        types
    }
}

fn header<'a>(job: &'a ActivatedJobData, name: &str) -> Option<&'a str> {
    job.spec.custom_headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
}

fn parent_results(job: &ActivatedJobData) -> serde_json::Value {
    let vars: serde_json::Value = serde_json::from_slice(&job.spec.variables).expect("JSON variables");
    vars[PARENT_RESULTS].clone()
}

#[test]
fn a_chain_runs_its_steps_in_order_each_given_the_results_before_it() {
    let mut p = Partition::new();
    let made = p.create(&workflow(Kind::Chain, &["a", "b", "c"], &[]));
    assert_eq!(made.state, State::Running);
    assert_eq!(p.waiting(), vec!["a"], "only the first step is made");
    let a = p.complete("a", r#"{"n":1}"#);
    assert_eq!((header(&a, WORKFLOW_HEADER), header(&a, STEP_HEADER)), (Some("wf-1"), Some("0")));
    assert_eq!(p.waiting(), vec!["b"], "the next step is made by the apply that completed the first");
    let b = p.complete("b", r#"{"n":2}"#);
    assert_eq!(parent_results(&b), serde_json::json!([{"n": 1}]));
    let c = p.complete("c", "{}");
    assert_eq!(parent_results(&c), serde_json::json!([{"n": 1}, {"n": 2}]));
    let done = p.get();
    assert_eq!((done.state, done.counts().0), (State::Completed, 3));
    assert!(done.ended_at > 0);
}

#[test]
fn a_failed_chain_step_fails_the_chain_and_later_steps_are_never_made() {
    let mut p = Partition::new();
    p.create(&workflow(Kind::Chain, &["a", "b", "c"], &[]));
    p.complete("a", "{}");
    p.fail("b");
    assert!(p.waiting().contains(&"b".to_string()), "the incident stays, as any job's");
    assert!(!p.waiting().contains(&"c".to_string()));
    let failed = p.get();
    assert_eq!(failed.state, State::Failed);
    let states: Vec<StepState> = failed.steps.iter().map(|s| s.state).collect();
    assert_eq!(states, vec![StepState::Completed, StepState::Failed, StepState::Cancelled]);
    assert_eq!(failed.steps[1].error, "boom");
}

#[test]
fn a_group_ends_when_every_step_ended_and_fails_if_one_failed() {
    let mut p = Partition::new();
    p.create(&workflow(Kind::Group, &["a", "b", "c"], &[]));
    assert_eq!(p.waiting(), vec!["a", "b", "c"], "every step at once");
    p.fail("b");
    assert_eq!(p.get().state, State::Running, "a sibling's failure stops nothing");
    p.complete("a", "{}");
    p.complete("c", "{}");
    let ended = p.get();
    assert_eq!((ended.state, ended.counts()), (State::Failed, (2, 1, 3)));
}

#[test]
fn a_batch_fires_the_callbacks_its_outcome_calls_for_once() {
    let callbacks = [(When::Complete, "done"), (When::Success, "yay"), (When::Failure, "alas")];
    let mut p = Partition::new();
    p.create(&workflow(Kind::Batch, &["a", "b"], &callbacks));
    p.complete("a", r#"{"x":1}"#);
    assert!(p.take("done").is_none(), "no callback before every step ended");
    p.fail("b");
    let mut made = p.waiting();
    made.retain(|t| t != "b");
    assert_eq!(made, vec!["alas", "done"], "on_complete and on_failure, not on_success");
    let done = p.complete("done", "{}");
    assert_eq!(parent_results(&done), serde_json::json!([{"x": 1}, null]));
    assert_eq!(header(&done, STEP_HEADER), Some("on_complete"));
    assert_eq!(p.get().state, State::Running, "until its callbacks ended");
    p.complete("alas", "{}");
    let ended = p.get();
    assert_eq!(ended.state, State::Completed, "its callbacks ran");
    assert_eq!(ended.callbacks[1].state, StepState::Skipped);
    // Every step of a second batch completes: on_success and on_complete.
    let mut q = Partition::new();
    q.create(&workflow(Kind::Batch, &["a"], &callbacks));
    q.complete("a", "{}");
    assert_eq!(q.waiting(), vec!["done", "yay"]);
}

#[test]
fn cancelling_cancels_what_waits_and_lets_a_held_job_finish() {
    let mut p = Partition::new();
    p.create(&workflow(Kind::Group, &["a", "b"], &[]));
    let held = p.take("a").expect("a to take");
    let cancel = Command::CancelWorkflow { tenant: "acme".into(), id: "wf-1".into(), by: "ops".into(), request: 7 };
    let CommandResult::Workflows(one) = p.run(cancel.clone()) else { panic!("cancelled") };
    assert_eq!(one[0].state, State::Cancelled);
    assert_eq!(p.waiting(), vec!["a"], "b cancelled; a held by its worker");
    let complete = Command::Complete { key: held.key, attempt: held.attempt, variables: Bytes::from("{}") };
    assert_eq!(p.run(complete), CommandResult::Done);
    let after = p.get();
    assert_eq!(
        (after.state, after.steps[0].state, after.steps[1].state),
        (State::Cancelled, StepState::Completed, StepState::Cancelled)
    );
    // The same cancel again (its answer lost) is done; another is refused.
    let CommandResult::Workflows(resent) = p.run(cancel.clone()) else { panic!("a resend is answered") };
    assert_eq!(resent[0].state, State::Cancelled);
    let Command::CancelWorkflow { tenant, id, by, .. } = cancel else { unreachable!() };
    let again = Partition::rejected(p.run(Command::CancelWorkflow { tenant, id, by, request: 9 }));
    assert_eq!(again.kind, ErrorKind::FailedPrecondition);
    assert!(again.message.contains("already cancelled"), "{}", again.message);
}

#[test]
fn a_held_job_of_a_cancelled_workflow_that_comes_back_is_cancelled_not_run_again() {
    let mut p = Partition::new();
    p.create(&workflow(Kind::Group, &["a"], &[]));
    let held = p.take("a").expect("a to take");
    let cancel = Command::CancelWorkflow { tenant: "acme".into(), id: "wf-1".into(), by: "ops".into(), request: 1 };
    p.run(cancel);
    // Its worker fails it with retries left: it would be activatable again.
    let fail = Command::Fail {
        key: held.key,
        attempt: held.attempt,
        retries: 2,
        error_message: "flaky".into(),
        back_off_ms: 0,
        variables: Bytes::new(),
        max_payload_bytes: u64::MAX,
        reason: FailReason::default(),
    };
    assert_eq!(p.run(fail), CommandResult::Done);
    assert!(p.take("a").is_none(), "not handed out again");
    assert!(p.waiting().is_empty(), "cancelled");
    assert_eq!(p.get().steps[0].state, StepState::Cancelled);
}

#[test]
fn a_forgotten_workflow_leaves_nothing_a_later_one_of_its_id_could_trip_on() {
    let mut p = Partition::new();
    p.create(&workflow(Kind::Chain, &["a", "b", "c"], &[]));
    // Held for two days: it neither ends nor times out before it is forgotten.
    let activation = Activation { max_jobs: 1, timeout_ms: 2 * workflow::RETAIN_MS, ..Activation::plain("a", "acme") };
    let CommandResult::Activated(mut jobs) = p.run(Command::Activate(activation)) else { panic!("activates") };
    let held = jobs.pop().expect("a to take");
    let cancel = Command::CancelWorkflow { tenant: "acme".into(), id: "wf-1".into(), by: "ops".into(), request: 1 };
    let CommandResult::Workflows(one) = p.run(cancel) else { panic!("cancelled") };
    // A day later it is forgotten, and the same id names a new, shorter workflow.
    p.now = one[0].ended_at + workflow::RETAIN_MS;
    let other = workflow(Kind::Group, &["x"], &[]);
    p.create(&other);
    // The old job, still held, completes: it is nobody's step now.
    let done = Command::Complete { key: held.key, attempt: held.attempt, variables: Bytes::from("{}") };
    assert_eq!(p.run(done), CommandResult::Done);
    let new = p.get();
    assert_eq!((new.state, new.steps.len(), new.steps[0].state), (State::Running, 1, StepState::Created));
}

#[test]
fn a_workflow_keeps_results_up_to_what_a_job_may_carry_and_a_step_after_one_not_kept_fails() {
    let mut p = Partition::new();
    p.create(&workflow(Kind::Batch, &["a", "b"], &[(When::Complete, "done")]));
    let half = format!(r#"{{"blob":"{}"}}"#, "x".repeat(LIMIT as usize / 2 + 10));
    p.complete("a", &half);
    p.complete("b", &half);
    let ended = p.get();
    assert_eq!(ended.steps[0].result.len(), half.len(), "the first kept");
    assert!(ended.steps[1].result.is_empty() && ended.steps[1].error.contains("not kept"), "{:?}", ended.steps[1]);
    assert_eq!(ended.steps[1].state, StepState::Completed, "it completed all the same");
    assert_eq!((ended.callbacks[0].state, ended.state), (StepState::Failed, State::Failed));
    assert!(ended.callbacks[0].error.contains("parent_results"), "{}", ended.callbacks[0].error);
}

#[test]
fn a_step_whose_predecessors_results_are_too_large_fails_saying_why() {
    let mut p = Partition::new();
    p.create(&workflow(Kind::Chain, &["a", "b"], &[]));
    let big = format!(r#"{{"blob":"{}"}}"#, "x".repeat(LIMIT as usize));
    p.complete("a", &big);
    let failed = p.get();
    assert_eq!((failed.state, failed.steps[1].state), (State::Failed, StepState::Failed));
    assert!(failed.steps[1].error.contains("parent_results"), "{}", failed.steps[1].error);
    assert!(p.waiting().is_empty(), "no job made");
}

#[test]
fn a_repeat_answers_the_workflow_and_another_spec_under_its_id_is_refused() {
    let mut p = Partition::new();
    let spec = workflow(Kind::Chain, &["a", "b"], &[]);
    p.create(&spec);
    let again = p.create(&spec);
    assert_eq!(p.waiting(), vec!["a"], "no second job");
    assert_eq!(again.steps[0].state, StepState::Created);
    let other = workflow(Kind::Chain, &["x"], &[]);
    let refused =
        Partition::rejected(p.run(Command::CreateWorkflow { spec: other, by: "ops".into(), max_payload_bytes: LIMIT }));
    assert_eq!(refused.kind, ErrorKind::FailedPrecondition);
}

#[test]
fn a_restored_partition_advances_its_workflows_as_the_first_would() {
    let mut p = Partition::new();
    p.create(&workflow(Kind::Chain, &["a", "b"], &[]));
    let registry = p.state.registry();
    let jobs: Vec<Job> = p.state.jobs().cloned().collect();
    let mut restored =
        Partition { state: PartitionState::restore(p.state.meta(), jobs, Vec::new(), registry), now: p.now };
    restored.complete("a", "{}");
    assert_eq!(restored.waiting(), vec!["b"], "the step index was rebuilt");
    restored.complete("b", "{}");
    assert_eq!(restored.get().state, State::Completed);
}

#[test]
fn a_step_cancelled_or_expired_by_itself_is_failed_and_a_finished_workflow_is_forgotten_after_a_day() {
    let mut p = Partition::new();
    p.create(&workflow(Kind::Chain, &["a", "b"], &[]));
    let key = p.state.jobs().next().expect("a").key;
    assert_eq!(p.run(Command::Cancel { key, by: "ops".into() }), CommandResult::Done);
    let failed = p.get();
    assert_eq!(failed.state, State::Failed);
    assert!(failed.steps[0].error.contains("cancelled by ops"), "{}", failed.steps[0].error);
    p.now = failed.ended_at + workflow::RETAIN_MS;
    let gone = Partition::rejected(p.run(Command::GetWorkflow { tenant: "acme".into(), id: "wf-1".into() }));
    assert_eq!(gone.kind, ErrorKind::NotFound);
}

#[test]
fn bad_workflows_are_refused_by_the_partition_too() {
    let mut p = Partition::new();
    let mut spec = WorkflowSpec::clone(&workflow(Kind::Group, &["a"], &[(When::Success, "cb")]));
    let refused = Partition::rejected(p.run(Command::CreateWorkflow {
        spec: Arc::new(spec.clone()),
        by: "o".into(),
        max_payload_bytes: LIMIT,
    }));
    assert!(refused.message.contains("only a batch"), "{}", refused.message);
    spec.callbacks.clear();
    spec.steps.clear();
    let refused = Partition::rejected(p.run(Command::CreateWorkflow {
        spec: Arc::new(spec),
        by: "o".into(),
        max_payload_bytes: LIMIT,
    }));
    assert!(refused.message.contains("at least one step"), "{}", refused.message);
}

#[test]
fn creating_needs_create_on_every_type_and_cancelling_manage() {
    let mut p = Partition::new();
    let spec = workflow(Kind::Chain, &["a", "b"], &[]);
    let only_a = principal("alice", &["jobs:create:a"]);
    let create = Command::CreateWorkflow { spec: Arc::clone(&spec), by: "alice".into(), max_payload_bytes: LIMIT };
    let as_alice = Command::As { by: only_a, commands: vec![create] };
    let refused = Partition::rejected(p.run(as_alice));
    assert_eq!(refused.kind, ErrorKind::PermissionDenied);
    assert!(p.waiting().is_empty(), "nothing made");
    p.create(&spec);
    let reader = principal("bob", &["jobs:read", "jobs:create"]);
    let cancel = Command::CancelWorkflow { tenant: "acme".into(), id: "wf-1".into(), by: "bob".into(), request: 8 };
    let as_bob = Command::As { by: reader, commands: vec![cancel] };
    assert_eq!(Partition::rejected(p.run(as_bob)).kind, ErrorKind::PermissionDenied);
    assert_eq!(p.get().state, State::Running);
}

fn principal(name: &str, scopes: &[&str]) -> Arc<Principal> {
    super::authorize_tests::principal(name, scopes, &["acme"])
}

impl Partition {
    fn rejected(result: CommandResult) -> CommandError {
        match result {
            CommandResult::Rejected(error) => error,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }
}
