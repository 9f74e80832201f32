//! Guarded completions: the partition checks the outside id, the worker and
//! earlier lapses at apply, and answers the attempt it completed.

use super::*;

const TYPE: &str = "render";
const CHOSEN: &str = "x.id";
const STAMP: &str = "x.at";

fn create(headers: Vec<(String, String)>) -> Command {
    Command::Create(NewJob::plain(JobSpec { job_type: TYPE.into(), custom_headers: headers, ..Default::default() }))
}

fn activate(state: &mut PartitionState, now: Millis, worker: &str) -> Vec<ActivatedJobData> {
    let command =
        Command::Activate(Activation { worker: worker.into(), timeout_ms: 1_000, ..Activation::plain(TYPE, "") });
    match state.apply(&Batch::at(now, vec![command])).results.pop() {
        Some(CommandResult::Activated(jobs)) => jobs,
        other => panic!("an activation: {other:?}"),
    }
}

fn stamped(at: Millis) -> Option<Identity> {
    Some(Identity::Stamped { chosen: CHOSEN.into(), stamp: STAMP.into(), at })
}

fn complete(state: &mut PartitionState, now: Millis, key: JobKey, attempt: u32, guard: Guard) -> CommandResult {
    let command = Command::CompleteGuarded { key, attempt, variables: r#"{"ok":true}"#.into(), guard };
    state.apply(&Batch::at(now, vec![command])).results.pop().expect("one result")
}

fn refused(result: CommandResult) -> (ErrorKind, String) {
    match result {
        CommandResult::Rejected(error) => (error.kind, error.message),
        other => panic!("a refusal expected, got {other:?}"),
    }
}

/// One job made at 1,000 with `headers`, activated by `worker` at 2,000.
fn held(headers: Vec<(String, String)>, worker: &str) -> (PartitionState, JobKey) {
    let mut state = PartitionState::new(0);
    state.apply(&Batch::at(1_000, vec![create(headers)]));
    let key = activate(&mut state, 2_000, worker)[0].key;
    (state, key)
}

#[test]
fn a_guarded_completion_naming_no_attempt_completes_the_held_activation_and_says_which() {
    let (mut state, key) = held(Vec::new(), "w1");
    let guard = Guard { identity: stamped(1_000), worker: String::new(), no_lapse: true };
    assert_eq!(complete(&mut state, 2_500, key, 0, guard.clone()), CommandResult::Completed { attempt: 1 });
    assert!(state.job(key).is_none(), "a completed job leaves memory");
    // Its repeat finds nothing held; the gateway reads to tell a repeat.
    let (kind, message) = refused(complete(&mut state, 2_600, key, 0, guard));
    assert_eq!(kind, ErrorKind::FailedPrecondition, "{message}");
}

#[test]
fn an_id_that_is_not_the_jobs_is_not_found_and_changes_nothing() {
    let chosen = vec![(CHOSEN.to_string(), "client-id".to_string())];
    let stamp = vec![(STAMP.to_string(), "900".to_string())];
    for (headers, identity, names) in [
        (Vec::new(), stamped(1_001), false),     // another time than its creation
        (Vec::new(), stamped(1_000), true),      // its creation time
        (stamp.clone(), stamped(1_000), false),  // its stamp wins over its creation
        (stamp, stamped(900), true),             // its stamp
        (chosen.clone(), stamped(1_000), false), // made with a client's id
        (chosen.clone(), Some(Identity::Header { name: CHOSEN.into(), value: "other".into() }), false),
        (chosen, Some(Identity::Header { name: CHOSEN.into(), value: "client-id".into() }), true),
    ] {
        let (mut state, key) = held(headers.clone(), "w1");
        let guard = Guard { identity: identity.clone(), worker: String::new(), no_lapse: false };
        let result = complete(&mut state, 2_500, key, 1, guard);
        if names {
            assert_eq!(result, CommandResult::Completed { attempt: 1 }, "{headers:?} {identity:?}");
        } else {
            assert_eq!(refused(result).0, ErrorKind::NotFound, "{headers:?} {identity:?}");
            assert_eq!(state.job(key).map(|j| j.state), Some(JobState::Activated), "{headers:?} {identity:?}");
        }
    }
}

#[test]
fn another_workers_activation_refuses_the_outcome_and_its_own_takes_it() {
    let (mut state, key) = held(Vec::new(), "w1");
    let other = Guard { identity: None, worker: "w2".into(), no_lapse: false };
    let (kind, message) = refused(complete(&mut state, 2_500, key, 0, other));
    assert_eq!(kind, ErrorKind::FailedPrecondition);
    assert!(message.contains("held by worker \"w1\" now, not \"w2\""), "{message}");
    let own = Guard { identity: None, worker: "w1".into(), no_lapse: false };
    assert_eq!(complete(&mut state, 2_600, key, 0, own), CommandResult::Completed { attempt: 1 });
}

#[test]
fn after_a_lapse_only_an_outcome_that_names_its_activation_lands() {
    let (mut state, key) = held(Vec::new(), "w1");
    state.apply(&Batch::at(3_001, Vec::new())); // attempt 1 times out
    assert_eq!(activate(&mut state, 3_100, "w2")[0].attempt, 2);
    assert_eq!(lapse(state.job(key).unwrap()).as_deref(), Some("attempt 1 timed out"));
    let unnamed = Guard { identity: None, worker: String::new(), no_lapse: true };
    let (kind, message) = refused(complete(&mut state, 3_200, key, 0, unnamed.clone()));
    assert_eq!(kind, ErrorKind::FailedPrecondition);
    assert!(message.contains("attempt 1 timed out"), "{message}");
    // The first worker's outcome, naming its attempt, is refused by the fence.
    let (kind, _) = refused(complete(&mut state, 3_200, key, 1, Guard { no_lapse: false, ..unnamed.clone() }));
    assert_eq!(kind, ErrorKind::FailedPrecondition);
    assert_eq!(
        complete(&mut state, 3_300, key, 2, Guard { no_lapse: false, ..unnamed }),
        CommandResult::Completed { attempt: 2 }
    );
}

#[test]
fn a_job_not_held_is_refused_whatever_the_guard() {
    let mut state = PartitionState::new(0);
    state.apply(&Batch::at(1_000, vec![create(Vec::new())]));
    let key = JobKey::new(0, 1);
    let guard = Guard { identity: stamped(1_000), worker: String::new(), no_lapse: true };
    let (kind, message) = refused(complete(&mut state, 1_500, key, 0, guard));
    assert_eq!(kind, ErrorKind::FailedPrecondition);
    assert!(message.contains("activatable, not activated"), "{message}");
}

#[test]
fn a_guarded_completion_needs_data_version_20_and_is_a_workers_command() {
    let command = Command::CompleteGuarded {
        key: JobKey::new(0, 1),
        attempt: 0,
        variables: Default::default(),
        guard: Guard { identity: None, worker: String::new(), no_lapse: true },
    };
    assert_eq!(command.since_version().map(|(v, _)| v), Some(GUARDED_OUTCOMES));
    assert!(!command.overrides_fence(), "attempt 0 here names the held activation, not an override");
    assert_eq!(command.acts_on(), Some((JobKey::new(0, 1), None, principal::Verb::Work)));
}
