//! Adding partitions, in the engine: a partition that made a key's job
//! under an older count answers a probe with it; one that did not remembers
//! where the key went and sends a later create of it there, for the window
//! only; and a partition being added adopts partition 0's sessions,
//! schemas, paused queues and limits.

use std::sync::Arc;

use bytes::Bytes;

use super::limit::{Limit, QueueLimit};
use super::*;

const TYPE: &str = "grow";

fn create(key: &str, variables: &str) -> Command {
    Command::Create(NewJob {
        spec: Arc::new(JobSpec {
            job_type: TYPE.into(),
            tenant: DEFAULT_TENANT.into(),
            variables: variables.as_bytes().to_vec().into(),
            ..Default::default()
        }),
        retries: 3,
        run_at: None,
        delay_ms: 0,
        request: Some(request(key)),
        dedupe_window_ms: 60_000,
    })
}

fn request(key: &str) -> RequestId {
    RequestId::Key { tenant: DEFAULT_TENANT.into(), user: String::new(), key: key.into() }
}

fn probe(key: &str, variables: &str, to: PartitionId) -> Command {
    let Command::Create(job) = create(key, variables) else { unreachable!() };
    Command::ProbeKey { request: request(key), to, window_ms: 60_000, fingerprint: payload_fingerprint(&job.spec) }
}

fn run(state: &mut PartitionState, now: Millis, command: Command) -> CommandResult {
    state.apply(&Batch::at(now, vec![command])).results.pop().expect("one result per command")
}

#[test]
fn a_probe_finds_the_job_an_older_count_made_and_refuses_other_content() {
    let mut old = PartitionState::new(1);
    let CommandResult::Created { key, created: true, .. } = run(&mut old, 1_000, create("k", "{}")) else {
        panic!("not created")
    };
    match run(&mut old, 2_000, probe("k", "{}", 4)) {
        CommandResult::Created { key: found, created: false, .. } => assert_eq!(found, key),
        other => panic!("the probe did not find the job: {other:?}"),
    }
    let CommandResult::Rejected(error) = run(&mut old, 2_000, probe("k", r#"{"other":1}"#, 4)) else {
        panic!("other content under the key is not a repeat")
    };
    assert_eq!(error.kind, ErrorKind::FailedPrecondition, "{error:?}");
}

#[test]
fn a_probe_that_finds_nothing_sends_later_creates_of_the_key_on_for_the_window() {
    let mut old = PartitionState::new(1);
    assert_eq!(run(&mut old, 1_000, probe("k", "{}", 4)), CommandResult::Elsewhere(4));
    // A gateway still routing by the older count sends the create here.
    assert_eq!(run(&mut old, 2_000, create("k", "{}")), CommandResult::Elsewhere(4));
    assert_eq!(run(&mut old, 3_000, probe("k", "{}", 4)), CommandResult::Elsewhere(4), "a repeat probe");
    // Nothing was made here, and the entry says nothing of a job.
    assert_eq!(old.jobs().count(), 0);
    // Past the window the key is forgotten here, as it would be anywhere.
    assert!(matches!(run(&mut old, 62_000, create("k", "{}")), CommandResult::Created { created: true, .. }));
}

#[test]
fn a_partition_being_added_adopts_what_every_partition_holds() {
    let mut first = PartitionState::new(0);
    let schema = Bytes::from_static(br#"{"type":"object","required":["ok"]}"#);
    run(&mut first, 1_000, Command::SetSchema { job_type: TYPE.into(), schema });
    run(&mut first, 1_000, Command::SetPaused { tenant: DEFAULT_TENANT.into(), job_type: "held".into(), paused: true });
    let limit = QueueLimit { home: 0, queue: Limit { rate: None, concurrency: Some(2) }, per_key: Limit::default() };
    let set = Command::SetLimit { tenant: DEFAULT_TENANT.into(), job_type: "few".into(), limit: Some(limit) };
    run(&mut first, 1_000, set);
    let info = SessionInfo {
        id: 7,
        worker: "w".into(),
        job_types: vec![TYPE.into()],
        tenants: vec![DEFAULT_TENANT.into()],
        heartbeat_ms: 1_000,
        dead_after_ms: 30_000,
        ..Default::default()
    };
    run(&mut first, 1_000, Command::Register(Arc::new(info)));
    let CommandResult::Adoptable(adoptable) = run(&mut first, 2_000, Command::GetAdoptable) else {
        panic!("not what a new partition adopts")
    };

    let mut new = PartitionState::new(4);
    let out = new.apply(&Batch::at(2_000, vec![Command::Adopt(adoptable.clone())]));
    assert!(out.sessions_changed && out.schemas_changed && out.paused_changed && !out.limits_changed.is_empty());
    let Command::Create(mut job) = create("x", "{}") else { unreachable!() };
    job.request = None;
    let CommandResult::Rejected(error) = run(&mut new, 3_000, Command::Create(job)) else {
        panic!("the adopted schema refuses the job")
    };
    assert_eq!(error.kind, ErrorKind::InvalidArgument, "{error:?}");
    let registry = new.registry();
    assert_eq!(registry.sessions.iter().map(|s| s.info.id).collect::<Vec<_>>(), vec![7]);
    assert_eq!(registry.paused.len(), 1);
    assert_eq!(registry.limits.len(), 1);
    // Adopting again (after the count went up) changes nothing held.
    run(&mut new, 4_000, Command::Adopt(adoptable));
    assert_eq!(new.registry().sessions.len(), 1);
}
