//! The state machine's own tests: apply, retention, snapshots and specs.

use std::sync::Arc;

use std::io::Read;

use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

use super::*;
use crate::core::{Batch, Command, CommandResult, JobSpec, JobState, NewJob, Retention, DEFAULT_TENANT};

const RETENTION: Retention = Retention { max_age_ms: 10_000, max_jobs: 3 };

/// A one-node cluster's versions: it speaks its own.
pub(super) fn versions() -> Arc<crate::transport::Versions> {
    Arc::new(crate::transport::Versions::new(0, vec![0], 0))
}

/// A cluster whose other member has not been heard from: it runs at the
/// oldest version this build reads.
fn mixed_versions() -> Arc<crate::transport::Versions> {
    Arc::new(crate::transport::Versions::new(0, vec![0, 1], 0))
}

/// A machine of partition 0 in `dir/a` whose other member last spoke
/// `version`, its snapshot identity read as Raft::new reads it.
pub(super) async fn behind(dir: &std::path::Path, version: u16) -> (StateMachine, Arc<SharedState>) {
    let store = Store::open(&dir.join("a")).unwrap();
    let cluster = mixed_versions();
    cluster.heard(1, Some(version));
    let (mut sm, shared) = StateMachine::open(0, store, dir.join("snap-a"), cluster).unwrap();
    sm.get_current_snapshot().await.unwrap();
    (sm, shared)
}

/// The machine's snapshot now: its meta and its bytes.
pub(super) async fn snapshot_of(sm: &mut StateMachine) -> (openraft::SnapshotMeta<NodeId, BasicNode>, Vec<u8>) {
    let snapshot = sm.get_current_snapshot().await.unwrap().unwrap();
    let mut bytes = Vec::new();
    snapshot.snapshot.into_std().await.read_to_end(&mut bytes).unwrap();
    (snapshot.meta, bytes)
}

/// A follower in `dir/follower` that installed the snapshot, and its store
/// (to open it again).
pub(super) async fn installed(
    dir: &std::path::Path,
    meta: &openraft::SnapshotMeta<NodeId, BasicNode>,
    bytes: &[u8],
) -> (Arc<Store>, StateMachine, Arc<SharedState>) {
    let store = Store::open(&dir.join("follower")).unwrap();
    let (mut follower, shared) = StateMachine::open(0, Arc::clone(&store), dir.join("snap-f"), versions()).unwrap();
    let mut file = tempfile::tempfile().unwrap();
    std::io::Write::write_all(&mut file, bytes).unwrap();
    follower.install_snapshot(meta, Box::new(tokio::fs::File::from_std(file))).await.unwrap();
    (store, follower, shared)
}

pub(super) fn entry(index: u64, now: Millis, commands: Vec<Command>) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 0), index),
        payload: EntryPayload::Normal(Batch { now, retention: RETENTION, commands, renew_sessions: false }),
    }
}

/// A job of type "t" in the default tenant.
pub(super) fn create() -> Command {
    Command::Create(NewJob {
        spec: Arc::new(JobSpec {
            job_type: "t".into(),
            tenant: DEFAULT_TENANT.into(),
            variables: "{}".into(),
            custom_headers: Vec::new(),
            ..Default::default()
        }),
        retries: 1,
        run_at: None,
        delay_ms: 0,
        request: None,
        dedupe_window_ms: 0,
    })
}

fn states(shared: &SharedState) -> Vec<(u64, JobState)> {
    let mut jobs: Vec<(u64, JobState)> =
        shared.all_jobs().unwrap().into_iter().map(|j| (j.key.counter(), j.state)).collect();
    jobs.sort_unstable_by_key(|(k, _)| *k);
    jobs
}

/// A snapshot made now at `cluster`'s version: its meta, its file (rewound,
/// for an install) and its bytes.
async fn snapshot_at(
    sm: &mut StateMachine,
    cluster: Arc<crate::transport::Versions>,
) -> (SnapshotMeta<NodeId, BasicNode>, tokio::fs::File, Vec<u8>) {
    sm.versions = cluster;
    let snapshot = sm.get_current_snapshot().await.unwrap().expect("entries were applied");
    let mut file = snapshot.snapshot.into_std().await;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).unwrap();
    file.rewind().unwrap();
    (snapshot.meta, tokio::fs::File::from_std(file), bytes)
}

#[tokio::test]
async fn final_records_are_pruned_alike_after_restart_and_snapshot_install() {
    let dir = tempfile::tempdir().unwrap();
    let (mut sm, shared) =
        StateMachine::open(0, Store::open(&dir.path().join("a")).unwrap(), dir.path().join("snap-a"), versions())
            .unwrap();
    sm.apply([entry(1, 1_000, (0..6).map(|_| create()).collect())]).await.unwrap();
    // Five of six finish: only the newest three final records stay.
    let cancels = (1..=5).map(|c| Command::Cancel { key: JobKey::new(0, c), by: String::new() }).collect();
    sm.apply([entry(2, 2_000, cancels)]).await.unwrap();
    let expected =
        vec![(3, JobState::Cancelled), (4, JobState::Cancelled), (5, JobState::Cancelled), (6, JobState::Activatable)];
    assert_eq!(states(&shared), expected);
    assert!(shared.lookup(JobKey::new(0, 1)).unwrap().is_none(), "the oldest final record is pruned");

    // A follower installing a snapshot gets the same records and pruning order.
    // At start openraft asks only for the identity: nothing is copied.
    let identity = sm.get_current_snapshot().await.unwrap().expect("entries were applied");
    assert_eq!(identity.meta.last_log_id.map(|l| l.index), Some(2));
    assert_eq!(identity.snapshot.metadata().await.unwrap().len(), 0);
    let snapshot = sm.get_current_snapshot().await.unwrap().expect("entries were applied");
    assert!(snapshot.snapshot.metadata().await.unwrap().len() > 0);
    let (mut follower, follower_shared) =
        StateMachine::open(0, Store::open(&dir.path().join("b")).unwrap(), dir.path().join("snap-b"), versions())
            .unwrap();
    follower.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();
    assert_eq!(states(&follower_shared), expected);

    // A restart restores the pruning order from storage.
    drop((sm, shared));
    let (mut sm, shared) =
        StateMachine::open(0, Store::open(&dir.path().join("a")).unwrap(), dir.path().join("snap-a"), versions())
            .unwrap();
    assert_eq!(states(&shared), expected);

    // Past their age, every final record goes, on both, and only those.
    let later = entry(3, 2_000 + RETENTION.max_age_ms + 1, Vec::new());
    sm.apply([later.clone()]).await.unwrap();
    follower.apply([later]).await.unwrap();
    assert_eq!(states(&shared), vec![(6, JobState::Activatable)]);
    assert_eq!(states(&follower_shared), vec![(6, JobState::Activatable)]);

    // And the index picks up where it stopped.
    sm.apply([entry(4, 20_000, vec![Command::Cancel { key: JobKey::new(0, 6), by: String::new() }])]).await.unwrap();
    drop((sm, shared));
    let (_sm, shared) =
        StateMachine::open(0, Store::open(&dir.path().join("a")).unwrap(), dir.path().join("snap-a"), versions())
            .unwrap();
    assert_eq!(states(&shared), vec![(6, JobState::Cancelled)]);
}

#[tokio::test]
async fn a_snapshot_is_written_at_the_cluster_version_and_either_version_installs() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("a")).unwrap();
    let (mut sm, shared) = StateMachine::open(0, store, dir.path().join("snap-a"), mixed_versions()).unwrap();
    sm.apply([entry(1, 1_000, (0..4).map(|_| create()).collect())]).await.unwrap();
    sm.apply([entry(2, 2_000, vec![Command::Cancel { key: JobKey::new(0, 1), by: String::new() }])]).await.unwrap();
    let expected = states(&shared);
    sm.get_current_snapshot().await.unwrap(); // the identity, asked at start
    for (name, cluster, written_at) in [
        ("older member", mixed_versions(), crate::codec::OLDEST_VERSION),
        ("one version", versions(), crate::codec::DATA_VERSION),
    ] {
        let (meta, file, bytes) = snapshot_at(&mut sm, cluster).await;
        let versioned = bytes.starts_with(&crate::codec::header(written_at)[..2]);
        assert_eq!(versioned, written_at >= 7, "{name}: a version-{written_at} snapshot");
        if versioned {
            // The header names the version it was written at, which a member of that version reads.
            assert!(bytes.starts_with(&crate::codec::header(written_at)), "{name}: the header says {written_at}");
        }
        assert_eq!(check_snapshot(&bytes).unwrap(), 4, "{name}: every record reads");
        let follower_store = Store::open(&dir.path().join(format!("follower-{written_at}"))).unwrap();
        let (mut follower, follower_shared) =
            StateMachine::open(0, follower_store, dir.path().join("snap-f"), versions()).unwrap();
        follower.install_snapshot(&meta, Box::new(file)).await.unwrap();
        assert_eq!(states(&follower_shared), expected, "{name}: the follower holds what the leader holds");
    }
}

pub(super) fn stored_ids(store: &Store, table: Table) -> Vec<u64> {
    let mut ids = Vec::new();
    store
        .for_each(table, 0, |id, _| {
            ids.push(id);
            Ok(())
        })
        .unwrap();
    ids
}

fn spec_bytes(store: &Store) -> u64 {
    store.put_bytes().iter().find(|(t, _)| t.cf_name() == "job_specs").map(|(_, b)| *b).unwrap()
}

#[tokio::test]
async fn specs_are_written_when_new_or_replaced_and_leave_with_their_final_record() {
    use crate::core::{Activation, FailReason, Via};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("a")).unwrap();
    let (mut sm, shared) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
    // Job 2 is created and cancelled in one batch: its spec is stored all the same.
    let cancel_2 = Command::Cancel { key: JobKey::new(0, 2), by: String::new() };
    sm.apply([entry(1, 1_000, vec![create(), create(), cancel_2])]).await.unwrap();
    let after_creates = spec_bytes(&store);
    assert!(after_creates > 0);

    // An activation rewrites the job's progress, never its spec.
    let activate = Command::Activate(Activation {
        job_type: "t".into(),
        tenants: vec![DEFAULT_TENANT.into()],
        worker: "w".into(),
        timeout_ms: 5_000,
        max_jobs: 1,
        max_bytes: u64::MAX,
        session: 0,
        via: Via::Unknown,
        taker: Default::default(),
        rivals: Vec::new(),
    });
    sm.apply([entry(2, 1_100, vec![activate])]).await.unwrap();
    assert_eq!(spec_bytes(&store), after_creates, "an activation wrote a spec");

    // A failure that sets variables replaces the spec.
    let fail = Command::Fail {
        key: JobKey::new(0, 1),
        attempt: 1,
        retries: 1,
        error_message: "again".into(),
        back_off_ms: 0,
        variables: r#"{"v":2}"#.into(),
        max_payload_bytes: u64::MAX,
        reason: FailReason::Failed,
    };
    sm.apply([entry(3, 1_200, vec![fail])]).await.unwrap();
    assert!(spec_bytes(&store) > after_creates);

    let check = |shared: &SharedState| {
        let live = shared.lookup(JobKey::new(0, 1)).unwrap().expect("job 1");
        assert_eq!((live.state, &live.spec.variables[..]), (JobState::Activatable, &br#"{"v":2}"#[..]));
        let done = shared.lookup(JobKey::new(0, 2)).unwrap().expect("job 2");
        assert_eq!((done.state, done.spec.job_type.as_str()), (JobState::Cancelled, "t"));
    };
    check(&shared);
    // The same after a restart, and on a follower that installs a snapshot.
    drop((sm, shared));
    let (mut sm, shared) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
    check(&shared);
    let snapshot = sm.get_current_snapshot().await.unwrap().expect("identity");
    assert_eq!(snapshot.snapshot.metadata().await.unwrap().len(), 0);
    let snapshot = sm.get_current_snapshot().await.unwrap().expect("entries were applied");
    let follower_store = Store::open(&dir.path().join("b")).unwrap();
    let (mut follower, follower_shared) =
        StateMachine::open(0, Arc::clone(&follower_store), dir.path().join("snap-b"), versions()).unwrap();
    follower.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();
    check(&follower_shared);

    // Pruned, a final record takes its spec with it, on both.
    let later = entry(4, 1_000 + RETENTION.max_age_ms + 1, Vec::new());
    sm.apply([later.clone()]).await.unwrap();
    follower.apply([later]).await.unwrap();
    for (store, shared) in [(&store, &shared), (&follower_store, &follower_shared)] {
        assert!(shared.lookup(JobKey::new(0, 2)).unwrap().is_none());
        assert_eq!(store.get(Table::Specs, key(0, JobKey::new(0, 2).0)).unwrap(), None);
        assert!(store.get(Table::Specs, key(0, JobKey::new(0, 1).0)).unwrap().is_some());
    }
    // Created, finished and pruned in one entry (no final records kept):
    // no spec is left behind.
    let none_kept = Retention { max_age_ms: 10_000, max_jobs: 0 };
    // The third job created in this partition.
    let third = JobKey::new(0, 3);
    let mut gone = entry(5, 21_000, vec![create(), Command::Cancel { key: third, by: String::new() }]);
    if let EntryPayload::Normal(batch) = &mut gone.payload {
        batch.retention = none_kept;
    }
    let answers = sm.apply([gone]).await.unwrap();
    assert!(answers[0].results.iter().all(|r| !matches!(r, CommandResult::Rejected(_))), "{answers:?}");
    assert_eq!(shared.lookup(third).unwrap(), None, "kept no final record");
    assert_eq!(store.get(Table::Specs, key(0, third.0)).unwrap(), None, "a pruned job's spec stayed");

    // A reader that got a final record just before its prune finds nothing, not damage...
    let progress = records::encode_progress(&shared.lookup(JobKey::new(0, 1)).unwrap().unwrap());
    assert_eq!(shared.final_record(JobKey::new(0, 2).0, &progress).unwrap(), None);
    // ...while a final record without its spec is damage, and says so.
    let mut batch = store.batch();
    batch.put(Table::Done, key(0, JobKey::new(0, 9).0), &progress);
    store.write(batch);
    let damaged = shared.lookup(JobKey::new(0, 9)).unwrap_err().to_string();
    assert!(damaged.contains("no spec record"), "{damaged}");
}

#[tokio::test]
async fn a_partition_with_owned_sessions_is_snapshotted_with_its_owners_at_version_9() {
    use crate::core::principal::Principal;
    use crate::core::{SessionInfo, OWNED_SESSIONS};
    let dir = tempfile::tempdir().unwrap();
    // A node that last heard its peer speak version 8.
    let (mut sm, _shared) = behind(dir.path(), OWNED_SESSIONS - 1).await;
    let snapshot_header = |bytes: &[u8]| bytes[..crate::codec::HEADER_LEN].to_vec();
    sm.apply([entry(1, 1_000, vec![create()])]).await.unwrap();
    let (_, plain) = snapshot_of(&mut sm).await;
    assert_eq!(snapshot_header(&plain), crate::codec::header(OWNED_SESSIONS - 1), "no owners: the cluster version");
    let owner = Arc::new(Principal {
        name: "acme-worker".into(),
        scopes: vec!["jobs:work:t".into()],
        tenants: vec![DEFAULT_TENANT.into()],
        job: None,
    });
    let info = Arc::new(SessionInfo {
        id: 7,
        worker: "w".into(),
        job_types: vec!["t".into()],
        tenants: vec![DEFAULT_TENANT.into()],
        heartbeat_ms: 1_000,
        dead_after_ms: 60_000,
        ..Default::default()
    });
    let register = Command::As { by: owner, commands: vec![Command::RegisterOwned(info)] };
    sm.apply([entry(2, 2_000, vec![register])]).await.unwrap();
    let (meta, bytes) = snapshot_of(&mut sm).await;
    assert_eq!(snapshot_header(&bytes), crate::codec::header(OWNED_SESSIONS), "owners: version 9");
    assert_eq!(check_snapshot(&bytes).unwrap(), 1, "the record after the owners reads");
    let (follower_store, follower, follower_shared) = installed(dir.path(), &meta, &bytes).await;
    let owners = vec![(7, "acme-worker".to_string())];
    assert_eq!(follower_shared.lock().engine.session_owners(), owners, "installed with its owners");
    drop((follower, follower_shared));
    let (_follower, reopened) = StateMachine::open(0, follower_store, dir.path().join("snap-f"), versions()).unwrap();
    assert_eq!(reopened.lock().engine.session_owners(), owners, "and stored with them");
}

#[tokio::test]
async fn a_paused_queue_is_snapshotted_at_version_11_and_stays_paused_where_installed() {
    use crate::core::PAUSED_QUEUES;
    let dir = tempfile::tempdir().unwrap();
    let (mut sm, _shared) = behind(dir.path(), PAUSED_QUEUES - 1).await;
    sm.apply([entry(1, 1_000, vec![create()])]).await.unwrap();
    let pause = Command::SetPaused { tenant: DEFAULT_TENANT.into(), job_type: "t".into(), paused: true };
    sm.apply([entry(2, 2_000, vec![pause])]).await.unwrap();
    let (meta, bytes) = snapshot_of(&mut sm).await;
    assert_eq!(&bytes[..crate::codec::HEADER_LEN], crate::codec::header(PAUSED_QUEUES), "a pause: version 11");
    assert_eq!(check_snapshot(&bytes).unwrap(), 1, "the live job after the pauses reads");
    let (follower_store, follower, shared) = installed(dir.path(), &meta, &bytes).await;
    let paused = vec![(DEFAULT_TENANT.to_string(), "t".to_string(), 2_000)];
    assert_eq!(shared.lock().engine.paused_records(), paused, "installed paused");
    assert_eq!(shared.lock().engine.activatable_count("t", &[]), 0, "its job waits");
    drop((follower, shared));
    let (mut reopened, shared) = StateMachine::open(0, follower_store, dir.path().join("snap-f"), versions()).unwrap();
    assert_eq!(shared.lock().engine.paused_records(), paused, "and stored paused");
    let resume = Command::SetPaused { tenant: DEFAULT_TENANT.into(), job_type: "t".into(), paused: false };
    run(&mut reopened, 3, 3_000, resume).await;
    assert_eq!(shared.lock().engine.activatable_count("t", &[]), 1, "resumed");
}

#[tokio::test]
async fn a_schedule_is_snapshotted_at_version_12_and_ticks_on_once_where_installed() {
    use crate::core::schedule::{Misfire, Overlap};
    use crate::core::{ScheduleSpec, SCHEDULES};
    let dir = tempfile::tempdir().unwrap();
    let (mut sm, shared) = behind(dir.path(), SCHEDULES - 1).await;
    let spec = ScheduleSpec {
        tenant: DEFAULT_TENANT.into(),
        name: "beat".into(),
        expression: "* * * * * *".into(),
        timezone: "UTC".into(),
        template: Arc::new(JobSpec { job_type: "t".into(), tenant: DEFAULT_TENANT.into(), ..Default::default() }),
        retries: 3,
        overlap: Overlap::Allow,
        misfire: Misfire::FireAll,
        paused: false,
        description: String::new(),
    };
    run(&mut sm, 1, 1_000, Command::PutSchedule { spec: Arc::new(spec), by: "ops".into() }).await;
    // A paused queue too: both sections ride after the header, in order.
    let pause = Command::SetPaused { tenant: DEFAULT_TENANT.into(), job_type: "other".into(), paused: true };
    run(&mut sm, 2, 3_000, pause).await; // ticks 2 s and 3 s
    assert_eq!(shared.lock().engine.activatable_count("t", &[]), 2);
    let (meta, bytes) = snapshot_of(&mut sm).await;
    assert_eq!(&bytes[..crate::codec::HEADER_LEN], crate::codec::header(SCHEDULES), "a schedule: version 12");
    let schedules = shared.lock().engine.schedule_records();
    assert_eq!((schedules[0].runs, schedules[0].next_at), (2, 4_000));
    let (follower_store, follower, follower_shared) = installed(dir.path(), &meta, &bytes).await;
    assert_eq!(follower_shared.lock().engine.schedule_records(), schedules, "installed with its schedule");
    assert_eq!(follower_shared.lock().engine.paused_records().len(), 1, "and the paused queue after it");
    drop((follower, follower_shared));
    let (mut reopened, shared) = StateMachine::open(0, follower_store, dir.path().join("snap-f"), versions()).unwrap();
    assert_eq!(shared.lock().engine.schedule_records(), schedules, "and stored with it");
    run(&mut reopened, 3, 3_000, Command::ListSessions).await;
    assert_eq!(shared.lock().engine.activatable_count("t", &[]), 2, "no tick made twice");
    run(&mut reopened, 4, 4_000, Command::ListSessions).await;
    assert_eq!(shared.lock().engine.activatable_count("t", &[]), 3, "the next tick, once");
}

fn keyed(tenant: &str, key: &str, window: Millis) -> Command {
    let Command::Create(mut job) = create() else { unreachable!("create() makes a create") };
    job.request = Some(crate::core::RequestId::Key { tenant: tenant.into(), user: String::new(), key: key.into() });
    job.spec = Arc::new(JobSpec { tenant: tenant.into(), ..JobSpec::clone(&job.spec) });
    job.dedupe_window_ms = window;
    Command::Create(job)
}

/// Applies `command` alone at `now` as entry `index`; its result.
pub(super) async fn run(sm: &mut StateMachine, index: u64, now: Millis, command: Command) -> CommandResult {
    let mut responses = sm.apply([entry(index, now, vec![command])]).await.unwrap();
    responses.pop().unwrap().results.pop().unwrap()
}

fn created(result: &CommandResult) -> (JobKey, bool) {
    match result {
        CommandResult::Created { key, created, .. } => (*key, *created),
        other => panic!("not a create's result: {other:?}"),
    }
}

#[tokio::test]
async fn remembered_creates_are_read_from_disk_and_travel_in_snapshots_of_either_layout() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("a")).unwrap();
    let (mut sm, shared) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
    assert!(format!("{:?}", shared.lock().engine).contains("DiskRequests"), "a replica's table is on disk");
    // In one apply: a key, its repeat in a later entry, and a key that
    // expires before the apply ends and is used again.
    let responses = sm
        .apply([
            entry(1, 1_000, vec![keyed("acme", "a", 60_000), keyed("acme", "short", 1)]),
            entry(2, 1_500, vec![keyed("acme", "a", 60_000), keyed("acme", "short", 60_000)]),
        ])
        .await
        .unwrap();
    let (first, _) = created(&responses[0].results[0]);
    assert_eq!(created(&responses[1].results[0]), (first, false), "a repeat in the same apply");
    let (short, _) = created(&responses[0].results[1]);
    let (short_again, fresh) = created(&responses[1].results[1]);
    assert!(fresh && short_again != short, "a key past its window makes a new job");
    run(&mut sm, 3, 2_000, keyed("globex", "a", 60_000)).await;
    let counted = |shared: &SharedState| {
        let inner = shared.lock();
        (inner.engine.requests_len(), inner.engine.keys_of_tenant("acme"), inner.engine.keys_of_tenant("globex"))
    };
    assert_eq!(counted(&shared), (3, 2, 1));
    assert_eq!(stored_ids(&store, Table::Requests).len(), 3, "the expired entry left storage");

    // After a restart the repeats are found on disk, counted as before.
    drop((sm, shared));
    let (mut sm, shared) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
    assert_eq!(counted(&shared), (3, 2, 1));
    assert_eq!(created(&run(&mut sm, 4, 3_000, keyed("acme", "a", 60_000)).await), (first, false));
    assert_eq!(created(&run(&mut sm, 5, 3_000, keyed("acme", "short", 60_000)).await), (short_again, false));

    // Snapshots at this version stream the entries, at an older one carry
    // them in the header; a follower installing either finds the repeats.
    sm.get_current_snapshot().await.unwrap(); // the identity, asked at start
    for (name, cluster) in [("this version", versions()), ("an older member", mixed_versions())] {
        let (meta, file, bytes) = snapshot_at(&mut sm, cluster).await;
        assert_eq!(check_snapshot(&bytes).unwrap(), 4, "{name}: every record reads");
        let follower_store = Store::open(&dir.path().join(format!("follower-{name}"))).unwrap();
        let (mut follower, follower_shared) =
            StateMachine::open(0, Arc::clone(&follower_store), dir.path().join("snap-f"), versions()).unwrap();
        // The follower had entries of its own: the snapshot replaces them.
        run(&mut follower, 1, 1_000, keyed("initech", "x", 60_000)).await;
        follower.install_snapshot(&meta, Box::new(file)).await.unwrap();
        assert_eq!(counted(&follower_shared), (3, 2, 1), "{name}: counted as the leader counts");
        assert_eq!(follower_shared.lock().engine.keys_of_tenant("initech"), 0, "{name}: its own are gone");
        assert_eq!(created(&run(&mut follower, 6, 3_000, keyed("acme", "a", 60_000)).await), (first, false), "{name}");
        let (_, fresh) = created(&run(&mut follower, 7, 3_000, keyed("initech", "x", 60_000)).await);
        assert!(fresh, "{name}: a key only the follower had is not remembered after the install");
    }

    // Past their window every entry leaves both orders: a key used again
    // makes a new job, and storage keeps only the new entry.
    let (again, fresh) = created(&run(&mut sm, 6, 100_000, keyed("acme", "a", 60_000)).await);
    assert!(fresh && again != first);
    assert_eq!(counted(&shared), (1, 1, 0));
    assert_eq!(stored_ids(&store, Table::Requests).len(), 1);
    drop((sm, shared));
    let (_sm, shared) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
    assert_eq!(counted(&shared), (1, 1, 0), "counted from disk after a restart");
    let found = shared.lock().engine.request(&crate::core::RequestId::Key {
        tenant: "globex".into(),
        user: String::new(),
        key: "a".into(),
    });
    assert_eq!(found, None, "an expired entry is not found by its request id");
}

#[tokio::test]
async fn remembered_creates_of_an_older_build_are_indexed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("a")).unwrap();
    let (mut sm, shared) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
    let (first, _) = created(&run(&mut sm, 1, 1_000, keyed("acme", "a", 60_000)).await);
    drop((sm, shared));
    // What a build before data version 10 left: entries by storage id only.
    let mut batch = store.batch();
    batch.delete_index(Table::Requests, 0);
    batch.delete(Table::Meta, meta_key(0, "request_index"));
    store.write_synced(batch);
    let (mut sm, _shared) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
    assert_eq!(created(&run(&mut sm, 2, 2_000, keyed("acme", "a", 60_000)).await), (first, false));
}

fn create_in(tenant: &str) -> Command {
    let Command::Create(mut job) = create() else { unreachable!("create() makes a create") };
    job.spec = Arc::new(JobSpec { tenant: tenant.into(), ..JobSpec::clone(&job.spec) });
    Command::Create(job)
}

fn listed(shared: &SharedState, tenants: &[&str]) -> Vec<u64> {
    let tenants: Vec<String> = tenants.iter().map(|t| t.to_string()).collect();
    let filter = crate::core::JobFilter { state: Some(JobState::Cancelled), ..Default::default() };
    let jobs = shared.list(&filter, &tenants, JobKey::new(0, 0), 10, usize::MAX).unwrap();
    jobs.iter().map(|job| job.key.counter()).collect()
}

#[tokio::test]
async fn a_tenants_final_records_are_listed_without_reading_any_other_tenants() {
    let retention = Retention { max_age_ms: 1_000_000, max_jobs: 10_000 };
    let at = |index: u64, now: Millis, commands: Vec<Command>| Entry::<TypeConfig> {
        log_id: LogId::new(CommittedLeaderId::new(1, 0), index),
        payload: EntryPayload::Normal(Batch { now, retention, commands, renew_sessions: false }),
    };
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("a")).unwrap();
    let (mut sm, shared) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
    // 2,000 final records of globex, then 2 of acme.
    let creates = (0..2_000).map(|_| create_in("globex")).chain([create_in("acme"), create_in("acme")]).collect();
    sm.apply([at(1, 1_000, creates)]).await.unwrap();
    let cancels = (1..=2_002).map(|c| Command::Cancel { key: JobKey::new(0, c), by: String::new() }).collect();
    sm.apply([at(2, 2_000, cancels)]).await.unwrap();
    let before = store.records_read();
    assert_eq!(listed(&shared, &["acme"]), vec![2_001, 2_002]);
    let read = store.records_read() - before;
    assert!(read < 20, "listing acme's 2 records read {read} records");
    assert_eq!(listed(&shared, &["acme", "globex"]), (1..=10).collect::<Vec<_>>(), "merged in key order");
    assert_eq!(listed(&shared, &["initech"]), Vec::<u64>::new());
    // A filter naming a tenant: that tenant's, and only if the caller may read it.
    let globex = crate::core::JobFilter { tenant: "globex".into(), ..Default::default() };
    let named = |tenants: &[String]| shared.list(&globex, tenants, JobKey::new(0, 0), 3, usize::MAX).unwrap().len();
    assert_eq!((named(&[]), named(&["globex".to_string()]), named(&["acme".to_string()])), (3, 3, 0));

    // The index goes with each pruned record, and comes back after a
    // restart, an install, and an older build's directory.
    let few = Retention { max_age_ms: 1_000_000, max_jobs: 1 };
    sm.apply([Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 0), 3),
        payload: EntryPayload::Normal(Batch {
            now: 3_000,
            retention: few,
            commands: Vec::new(),
            renew_sessions: false,
        }),
    }])
    .await
    .unwrap();
    assert_eq!((listed(&shared, &["acme"]), listed(&shared, &["globex"])), (vec![2_002], vec![]));
    sm.get_current_snapshot().await.unwrap(); // the identity, asked at start
    let snapshot = sm.get_current_snapshot().await.unwrap().unwrap();
    let follower_store = Store::open(&dir.path().join("follower")).unwrap();
    let (mut follower, follower_shared) =
        StateMachine::open(0, Arc::clone(&follower_store), dir.path().join("snap-f"), versions()).unwrap();
    follower.apply([at(1, 1_000, vec![create_in("globex")])]).await.unwrap();
    follower.apply([at(2, 1_000, vec![Command::Cancel { key: JobKey::new(0, 1), by: String::new() }])]).await.unwrap();
    follower.install_snapshot(&snapshot.meta, snapshot.snapshot).await.unwrap();
    assert_eq!((listed(&follower_shared, &["acme"]), listed(&follower_shared, &["globex"])), (vec![2_002], vec![]));

    drop((sm, shared));
    let mut batch = store.batch();
    batch.delete_index(Table::Done, 0);
    batch.delete(Table::Meta, meta_key(0, "final_tenant_index"));
    // An older build's expiry entry: time and key, no tenant.
    let mut old = Vec::new();
    old.extend_from_slice(&2_000i64.to_be_bytes());
    old.extend_from_slice(&JobKey::new(0, 2_002).0.to_be_bytes());
    batch.put(Table::Expiry, key(0, 2_001), old);
    store.write_synced(batch);
    let (_sm, shared) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
    assert_eq!((listed(&shared, &["acme"]), listed(&shared, &["globex"])), (vec![2_002], vec![]));
}

#[tokio::test]
async fn a_create_remembered_for_no_time_is_forgotten_by_the_next_batch_of_its_millisecond() {
    // As the engine in memory (and every build before the table went to
    // disk) decides it: replicas of either build must agree.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("a")).unwrap();
    let (mut sm, shared) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
    let mut memory = crate::core::PartitionState::new(0);
    for (index, now) in [(1, 1_000), (2, 1_000), (3, 1_000), (4, 1_001)] {
        let on_disk = created(&run(&mut sm, index, now, keyed("acme", "a", 0)).await);
        let batch = Batch { now, retention: RETENTION, commands: vec![keyed("acme", "a", 0)], renew_sessions: false };
        let in_memory = created(&memory.apply(&batch).results[0]);
        assert_eq!(on_disk, in_memory, "entry {index} at {now}");
        assert!(on_disk.1, "entry {index}: a 0 ms window remembers nothing past its batch");
    }
    assert_eq!(shared.lock().engine.requests_len(), memory.requests_len());
    assert_eq!(stored_ids(&store, Table::Requests).len(), 1, "only the newest entry is left");
}

#[tokio::test]
async fn events_are_read_after_a_cursor_survive_a_restart_and_leave_with_the_retention() {
    use crate::core::Lifecycle;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("a")).unwrap();
    let (mut sm, shared) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap"), versions()).unwrap();
    let (key, _) = created(&run(&mut sm, 1, 1_000, create()).await);
    let activate = Command::Activate(crate::core::Activation {
        job_type: "t".into(),
        tenants: vec![DEFAULT_TENANT.into()],
        worker: "w".into(),
        timeout_ms: 60_000,
        max_jobs: 1,
        max_bytes: u64::MAX,
        session: 0,
        via: crate::core::Via::Unknown,
        taker: Default::default(),
        rivals: Vec::new(),
    });
    run(&mut sm, 2, 1_500, activate).await;
    run(&mut sm, 3, 2_000, Command::Complete { key, attempt: 1, variables: Default::default() }).await;
    let kinds = |page: &events::EventsPage| page.events.iter().map(|e| e.event.lifecycle).collect::<Vec<_>>();
    let all = shared.events(0, 100).unwrap();
    assert_eq!(kinds(&all), [Lifecycle::Created, Lifecycle::Activated, Lifecycle::Completed]);
    assert_eq!(all.events[2].event.detail, 500, "a completion carries its run time");
    assert_eq!((all.through, all.from), (3, 1));
    let after_first = shared.events(1, 100).unwrap();
    assert_eq!(kinds(&after_first), [Lifecycle::Activated, Lifecycle::Completed], "read on after a cursor");
    assert_eq!(shared.events(0, 1).unwrap().through, 1, "a short read stops at an entry's end");
    drop((sm, shared));
    let (mut sm, shared) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap"), versions()).unwrap();
    assert_eq!(kinds(&shared.events(1, 100).unwrap()), [Lifecycle::Activated, Lifecycle::Completed], "kept");
    // Past the retention (10 s here, counted from the restart for what an
    // earlier run wrote), the old events go; a reader behind them learns of it.
    run(&mut sm, 4, 20_000, create()).await;
    run(&mut sm, 5, 40_000, create()).await;
    let page = shared.events(1, 100).unwrap();
    assert_eq!(kinds(&page), [Lifecycle::Created], "only the newest entry's event is kept");
    assert!(page.gap_after(1), "the reader at 1 missed events: {page:?}");
    assert!(!page.gap_after(4), "a reader at 4 missed nothing");
}
