//! Workflows in the state machine: snapshotted at data version 13 whatever
//! the cluster version, installed and stored one record each, advanced
//! where installed, and deleted from storage when the partition forgets them.

use std::sync::Arc;

use super::tests::{behind, installed, run, snapshot_of, versions};
use super::*;
use crate::core::workflow::{Kind, State, StepSpec, RETAIN_MS};
use crate::core::{Activation, Command, CommandResult, JobSpec, WorkflowSpec, DEFAULT_TENANT, WORKFLOWS};

fn chain() -> Arc<WorkflowSpec> {
    let step = |t: &str| StepSpec {
        template: Arc::new(JobSpec { job_type: t.into(), tenant: DEFAULT_TENANT.into(), ..Default::default() }),
        retries: 3,
    };
    Arc::new(WorkflowSpec {
        tenant: DEFAULT_TENANT.into(),
        id: "wf".into(),
        name: String::new(),
        kind: Kind::Chain,
        steps: vec![step("a"), step("b")],
        callbacks: Vec::new(),
    })
}

/// Activates and completes the one job of `job_type`, at `index` and `index + 1`.
async fn work(sm: &mut StateMachine, index: u64, now: Millis, job_type: &str) {
    let activation = Command::Activate(Activation::plain(job_type, DEFAULT_TENANT));
    let CommandResult::Activated(jobs) = run(sm, index, now, activation).await else { panic!("activates") };
    assert_eq!(jobs.len(), 1, "one {job_type} job");
    let complete = Command::Complete { key: jobs[0].key, attempt: jobs[0].attempt, variables: "{}".into() };
    assert_eq!(run(sm, index + 1, now, complete).await, CommandResult::Done);
}

#[tokio::test]
async fn a_workflow_is_snapshotted_at_version_13_stored_advanced_where_installed_and_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sm, shared) = behind(dir.path(), WORKFLOWS - 1).await;
    run(&mut sm, 1, 1_000, Command::CreateWorkflow { spec: chain(), by: "ops".into(), max_payload_bytes: 4 << 20 })
        .await;
    let (meta, bytes) = snapshot_of(&mut sm).await;
    assert_eq!(&bytes[..crate::codec::HEADER_LEN], crate::codec::header(WORKFLOWS), "a workflow: version 13");
    let records = shared.lock().engine.workflow_records();
    assert_eq!(records.len(), 1);
    let (store, follower, follower_shared) = installed(dir.path(), &meta, &bytes).await;
    assert_eq!(follower_shared.lock().engine.workflow_records(), records, "installed with its workflow");
    drop((follower, follower_shared));
    let reopen = |store: &Arc<crate::storage::Store>| {
        StateMachine::open(0, Arc::clone(store), dir.path().join("snap-f"), versions()).unwrap()
    };
    let (mut reopened, shared) = reopen(&store);
    assert_eq!(shared.lock().engine.workflow_records(), records, "and stored with it");
    // Where it was installed, its steps advance once.
    work(&mut reopened, 2, 2_000, "a").await;
    assert_eq!(shared.lock().engine.activatable_count("b", &[]), 1, "the next step, made once");
    work(&mut reopened, 4, 3_000, "b").await;
    drop((reopened, shared));
    let (mut reopened, shared) = reopen(&store);
    let stored = shared.lock().engine.workflow_records();
    assert_eq!((stored[0].state, stored[0].ended_at), (State::Completed, 3_000), "its end stored");
    // A day after it ended, the partition forgets it, in storage too.
    run(&mut reopened, 6, 3_000 + RETAIN_MS, Command::ListSessions).await;
    drop((reopened, shared));
    let (_, shared) = reopen(&store);
    assert!(shared.lock().engine.workflow_records().is_empty(), "forgotten, and gone from storage");
}
