//! Queue limits in the state machine: snapshotted at data version 14
//! whatever the cluster version, with their buckets, installed and stored
//! one record each; a replica reopened from storage admits what it would
//! have admitted running on; a lifted limit leaves storage.

use super::tests::{behind, create, installed, run, snapshot_of, versions};
use super::*;
use crate::core::limit::{Limit, Rate};
use crate::core::{Activation, Command, CommandResult, QueueLimit, DEFAULT_TENANT, LIMITS};

fn limit(limit: Option<QueueLimit>) -> Command {
    Command::SetLimit { tenant: DEFAULT_TENANT.into(), job_type: "t".into(), limit }
}

async fn taken(sm: &mut StateMachine, index: u64, now: Millis) -> usize {
    let activation = Command::Activate(Activation::plain("t", DEFAULT_TENANT));
    let CommandResult::Activated(jobs) = run(sm, index, now, activation).await else { panic!("activates") };
    jobs.len()
}

#[tokio::test]
async fn a_limit_is_snapshotted_at_version_14_with_its_bucket_and_stored_where_installed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sm, shared) = behind(dir.path(), LIMITS - 1).await;
    let rate = Rate { limit: 2, period_ms: 1_000, burst: 2 };
    let queue = Limit { rate: Some(rate), concurrency: None };
    run(&mut sm, 1, 1_000, limit(Some(QueueLimit { home: 0, queue, per_key: Limit::default() }))).await;
    for index in 2..8 {
        run(&mut sm, index, 1_000, create()).await;
    }
    assert_eq!(taken(&mut sm, 8, 1_000).await, 2, "the burst");
    let (meta, bytes) = snapshot_of(&mut sm).await;
    assert_eq!(&bytes[..crate::codec::HEADER_LEN], crate::codec::header(LIMITS), "a limit: version 14");
    let records = shared.lock().engine.all_limit_records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].buckets.len(), 1, "the emptied bucket goes with it");
    let (store, follower, follower_shared) = installed(dir.path(), &meta, &bytes).await;
    assert_eq!(follower_shared.lock().engine.all_limit_records(), records, "installed with its limit");
    drop((follower, follower_shared));
    let reopen = |store: &Arc<crate::storage::Store>| {
        StateMachine::open(0, Arc::clone(store), dir.path().join("snap-f"), versions()).unwrap()
    };
    let (mut reopened, shared) = reopen(&store);
    assert_eq!(shared.lock().engine.all_limit_records(), records, "and stored with it");
    // The bucket is as the leader left it: empty, refilling from 1,000 ms.
    assert_eq!(taken(&mut reopened, 9, 1_400).await, 0, "no token yet after 400 ms");
    assert_eq!(taken(&mut reopened, 10, 1_500).await, 1, "one at 500 ms");
    run(&mut reopened, 11, 1_600, limit(None)).await;
    drop((reopened, shared));
    let (mut reopened, shared) = reopen(&store);
    assert!(shared.lock().engine.all_limit_records().is_empty(), "lifted, and gone from storage");
    assert_eq!(taken(&mut reopened, 12, 1_600).await, 3, "the rest go at once");
}
