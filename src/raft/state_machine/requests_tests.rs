//! Remembered creates (request ids and idempotency keys) leave storage when
//! their window ends, one point deletion each, whatever order their windows
//! were made in; a replica reopened from storage expires what is left.

use super::tests::{create, entry, stored_ids, versions};
use super::*;
use crate::core::{Command, JobKey, RequestId};

/// A create of request `seq` (from one gateway) remembered for `window` ms.
fn create_as(seq: u64, window: Millis) -> Command {
    let Command::Create(mut job) = create() else { unreachable!("create() makes a create") };
    job.request = Some(RequestId::Gateway { node: 1, epoch: 7, seq });
    job.dedupe_window_ms = window;
    Command::Create(job)
}

#[tokio::test]
async fn expired_request_entries_and_pruned_expiry_entries_leave_storage_one_by_one() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("a")).unwrap();
    let (mut sm, _shared) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
    // Request 1 is remembered for 5 s, request 2 for a minute.
    sm.apply([entry(1, 1_000, vec![create_as(1, 5_000), create_as(2, 60_000)])]).await.unwrap();
    let requests = stored_ids(&store, Table::Requests);
    assert_eq!(requests.len(), 2);
    // At 10 s the first has expired: its entry, and only it, leaves storage.
    sm.apply([entry(2, 10_000, Vec::new())]).await.unwrap();
    assert_eq!(stored_ids(&store, Table::Requests), vec![requests[1]]);

    // Six final records with three kept: the expiry index keeps the newest three.
    sm.apply([entry(3, 11_000, (0..4).map(|_| create()).collect())]).await.unwrap();
    let cancels = (1..=6).map(|c| Command::Cancel { key: JobKey::new(0, c), by: String::new() }).collect();
    sm.apply([entry(4, 12_000, cancels)]).await.unwrap();
    assert_eq!(stored_ids(&store, Table::Expiry), vec![3, 4, 5]);
    assert_eq!(stored_ids(&store, Table::Done).len(), 3);
    // Each went as a point deletion: range deletions, one or more per
    // apply, made RocksDB fragment thousands of them at each flush.
    store.flush_memtables();
    assert_eq!(store.range_deletions_in_files(Table::Requests), 0);
    assert_eq!(store.range_deletions_in_files(Table::Expiry), 0);

    // A restart finds the same, and expires what is left as before.
    drop(sm);
    let (mut sm, _shared) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
    sm.apply([entry(5, 70_000, Vec::new())]).await.unwrap();
    assert_eq!(stored_ids(&store, Table::Requests), Vec::<u64>::new());
    assert_eq!(stored_ids(&store, Table::Expiry), Vec::<u64>::new(), "past their age every final record goes");
}

#[tokio::test]
async fn an_entry_of_a_shorter_window_made_after_a_longer_one_still_expires_on_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("a")).unwrap();
    let (mut sm, _shared) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
    // A minute's entry, then applies that look for expired entries and
    // find the minute's first in storage (so later ones need not look).
    sm.apply([entry(1, 1_000, vec![create_as(1, 60_000)])]).await.unwrap();
    sm.apply([entry(2, 2_000, Vec::new())]).await.unwrap();
    sm.apply([entry(3, 3_000, Vec::new())]).await.unwrap();
    let minute = stored_ids(&store, Table::Requests);
    assert_eq!(minute.len(), 1);
    // A 5 s entry made now is stored before the minute's one.
    sm.apply([entry(4, 4_000, vec![create_as(2, 5_000)])]).await.unwrap();
    sm.apply([entry(5, 5_000, Vec::new())]).await.unwrap();
    assert_eq!(stored_ids(&store, Table::Requests).len(), 2);
    // At 10 s it has expired, the minute's has not.
    sm.apply([entry(6, 10_000, Vec::new())]).await.unwrap();
    assert_eq!(stored_ids(&store, Table::Requests), minute, "the 5 s entry expired at 9 s");
    sm.apply([entry(7, 62_000, Vec::new())]).await.unwrap();
    assert_eq!(stored_ids(&store, Table::Requests), Vec::<u64>::new());
}

/// A create finds the entry stored at its storage id (the rare one it
/// displaces) whether the table learnt of it from an insert or from the
/// stored entries when it opened, and reads nothing for an id above them all.
#[test]
fn the_entry_at_a_storage_id_is_found_after_a_reopen_and_above_every_stored_id_none_is_read() {
    use crate::core::{Deduped, RequestTable};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let request = |seq| RequestId::Gateway { node: 1, epoch: 7, seq };
    let entry = |job| Deduped { job: JobKey::new(0, job), expires_at: 9_000, fingerprint: 0 };
    let mut table = requests::DiskRequests::open(&store, 0).unwrap();
    let (low, high) = (1_000, 5_000);
    for (id, seq) in [(low, 1), (high, 2)] {
        table.insert(id, &request(seq), entry(seq));
        let mut batch = store.batch();
        requests::put(&mut batch, 0, id, &request(seq), &entry(seq));
        store.write(batch);
    }
    table.written();
    // From storage, through the insert's bound.
    assert_eq!(table.at(high), Some(request(2)));
    assert_eq!(table.at(low), Some(request(1)));
    // Reopened: the bound comes from the last stored entry.
    let table = requests::DiskRequests::open(&store, 0).unwrap();
    assert_eq!(table.at(high), Some(request(2)));
    assert_eq!(table.at(low), Some(request(1)));
    assert_eq!(table.at(high - 1), None);
    let read = store.records_read();
    assert_eq!(table.at(high + 1), None);
    assert_eq!(table.at(u64::MAX), None);
    assert_eq!(store.records_read(), read, "ids above every stored one read the table");
}

/// A gateway's creates after the first learn that they are new without a
/// read, and the bound that lets them is never below a stored or unwritten
/// sequence number: not after a reopen, when a create arrives after a later
/// one, nor when the bounds were forgotten while an entry waited unwritten.
#[test]
fn a_gateways_new_creates_read_nothing_and_its_stored_ones_are_always_found() {
    use crate::core::{Deduped, RequestTable};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let request = |epoch, seq| RequestId::Gateway { node: 1, epoch, seq };
    let entry = |job| Deduped { job: JobKey::new(0, job), expires_at: 9_000, fingerprint: 0 };
    let insert = |table: &mut requests::DiskRequests, id: u64, epoch: u64, seq: u64| {
        table.insert(id, &request(epoch, seq), entry(seq));
        let mut batch = store.batch();
        requests::put(&mut batch, 0, id, &request(epoch, seq), &entry(seq));
        store.write(batch);
    };
    let mut table = requests::DiskRequests::open(&store, 0).unwrap();
    for seq in [1, 2, 50] {
        insert(&mut table, 1_000 + seq, 7, seq);
    }
    // Another gateway's request of the same epoch, above them.
    let other = RequestId::Gateway { node: 2, epoch: 7, seq: 60 };
    let mut batch = store.batch();
    requests::put(&mut batch, 0, 1_060, &other, &entry(60));
    store.write(batch);
    table.insert(1_060, &other, entry(60));
    table.written();
    let read = store.records_read();
    assert_eq!(table.find(&request(7, 51)), None);
    assert_eq!(store.records_read(), read, "a create above the gateway's highest read the table");
    assert_eq!(table.find(&request(7, 50)).map(|seen| seen.job), Some(JobKey::new(0, 50)));

    // Reopened, the first create of the gateway reads; one that arrives
    // after a later one does not hide the later one.
    let mut table = requests::DiskRequests::open(&store, 0).unwrap();
    assert_eq!(table.find(&request(7, 10)), None);
    insert(&mut table, 1_010, 7, 10);
    table.written();
    assert_eq!(table.find(&request(7, 50)).map(|seen| seen.job), Some(JobKey::new(0, 50)));
    assert_eq!(table.find(&request(7, 2)).map(|seen| seen.job), Some(JobKey::new(0, 2)));
    let read = store.records_read();
    assert_eq!(table.find(&request(7, 51)), None);
    assert_eq!(store.records_read(), read);

    // An entry unwritten when the bounds are forgotten (a table keeps a
    // bounded number of them) still bounds its gateway's next creates.
    table.insert(2_000, &request(8, 90), entry(90));
    for epoch in 100..100 + 256 {
        table.insert(3_000 + epoch, &request(epoch, 1), entry(1));
    }
    insert(&mut table, 2_001, 8, 20);
    let mut batch = store.batch();
    requests::put(&mut batch, 0, 2_000, &request(8, 90), &entry(90));
    store.write(batch);
    table.written();
    assert_eq!(table.find(&request(8, 90)).map(|seen| seen.job), Some(JobKey::new(0, 90)));

    // Another gateway's bound is its own: (1, 7)'s, 50, hides nothing of
    // (2, 7)'s, which has none since the reopen.
    assert_eq!(table.find(&other).map(|seen| seen.job), Some(JobKey::new(0, 60)));
}

/// A follower that installs a snapshot finds the snapshot's entries at their
/// storage ids at once, though its store held none before: the table's
/// bound of stored ids comes from what the snapshot wrote, not from the
/// store before the install's batch.
#[tokio::test]
async fn a_follower_finds_the_entries_of_the_snapshot_it_installed_at_their_storage_ids() {
    use super::tests::{installed, snapshot_of};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("a")).unwrap();
    let (mut sm, _shared) = StateMachine::open(0, Arc::clone(&store), dir.path().join("snap-a"), versions()).unwrap();
    // The first snapshot asked for is the identity Raft::new reads.
    sm.get_current_snapshot().await.unwrap();
    sm.apply([entry(1, 1_000, vec![create_as(1, 60_000), create_as(2, 60_000)])]).await.unwrap();
    let ids = stored_ids(&store, Table::Requests);
    assert_eq!(ids.len(), 2);
    let (meta, bytes) = snapshot_of(&mut sm).await;
    let (_follower_store, _follower, follower_shared) = installed(dir.path(), &meta, &bytes).await;
    let follower = follower_shared.lock();
    for (id, seq) in ids.iter().zip([1, 2]) {
        assert_eq!(
            follower.engine.request_at(*id),
            Some(RequestId::Gateway { node: 1, epoch: 7, seq }),
            "the entry at storage id {id}, installed"
        );
    }
}
