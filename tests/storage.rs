//! Storage that is damaged or fails is never worked around: a corrupt WAL
//! record refuses the open, and a failed WAL sync stops the node.

mod common;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use common::NodeProcess;
use drover::storage::{self, StorageError, Store, Table};

/// Log records appended, 1000 bytes each: a WAL of several 32 KiB blocks.
const ENTRIES: usize = 200;

/// Appends [`ENTRIES`] log records the way the Raft log does, each one synced
/// by the group-commit writer before the next is written.
fn append_synced(store: &Store) {
    for id in 0..ENTRIES as u64 {
        let mut batch = store.batch();
        batch.put(Table::Log, storage::key(0, id), vec![id as u8; 1000]);
        let (synced, wait) = mpsc::channel();
        store.write_durable(batch, Box::new(move |result| synced.send(result).unwrap()));
        wait.recv().unwrap().expect("the append is synced");
    }
}

fn log_entries(store: &Store) -> usize {
    store.scan(Table::Log, 0, 0..u64::MAX).unwrap().len()
}

/// The newest WAL file of a closed database.
fn newest_wal(db: &Path) -> PathBuf {
    let mut wals: Vec<PathBuf> = std::fs::read_dir(db)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "log"))
        .collect();
    wals.sort();
    wals.pop().expect("the database has a WAL")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
    }
}

#[test]
fn a_corrupt_record_in_the_middle_of_the_wal_refuses_the_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    append_synced(&Store::open(&db).unwrap());
    let intact = dir.path().join("intact");
    copy_dir(&db, &intact);

    let wal = newest_wal(&db);
    let mut bytes = std::fs::read(&wal).unwrap();
    // A byte inside a record: not in the few zero bytes that can pad the end
    // of a 32 KiB block, which no checksum covers.
    let mut at = bytes.len() / 2;
    while at % 32768 >= 32768 - 7 {
        at -= 1;
    }
    bytes[at] ^= 0x5a;
    std::fs::write(&wal, &bytes).unwrap();

    let store = Store::open(&intact).expect("the undamaged copy opens");
    assert_eq!(log_entries(&store), ENTRIES, "the undamaged copy has every entry");
    drop(store);
    let error = match Store::open(&db) {
        Ok(store) => panic!("a WAL with a corrupt record opened, with {} of {ENTRIES} entries", log_entries(&store)),
        Err(error) => error,
    };
    assert!(matches!(error, StorageError::Corrupt { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains("is damaged") && message.contains("Re-seed this node"), "{message}");
}

#[test]
fn a_torn_last_record_is_dropped_and_everything_before_it_opens() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    append_synced(&Store::open(&db).unwrap());
    // A crash in the middle of writing the last record: it was never synced,
    // so never acknowledged, and recovery may drop it.
    let wal = newest_wal(&db);
    let length = std::fs::metadata(&wal).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&wal).unwrap().set_len(length - 500).unwrap();

    let store = Store::open(&db).expect("a torn last record does not refuse the open");
    assert_eq!(log_entries(&store), ENTRIES - 1);
}

#[tokio::test]
async fn a_failed_wal_sync_stops_the_node_and_nothing_after_it_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let failpoint = [("DROVER_FAILPOINT_WAL_SYNC_FAIL_AFTER", "12")];
    let (mut node, stderr) = NodeProcess::start_capturing_stderr(&data, &[], &failpoint);
    node.wait_ready().await;
    let client = node.client().await;

    let mut acknowledged = Vec::new();
    let mut failed = 0;
    for n in 0..200 {
        match client.create_job("sync", &format!(r#"{{"n":{n}}}"#)).await {
            Ok(key) => {
                assert_eq!(failed, 0, "create {n} was acknowledged after an earlier create failed");
                acknowledged.push(key);
            }
            Err(_) => failed += 1,
        }
        if failed == 5 {
            break;
        }
    }
    assert_eq!(failed, 5, "creates kept succeeding: the failpoint never fired");
    assert!(!acknowledged.is_empty(), "the creates synced before the failure are acknowledged");

    let status = node.exited(Duration::from_secs(10)).await;
    assert_eq!(status.code(), Some(74), "exit status {status}");
    let stderr = stderr.join().unwrap();
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("storage WAL sync failed")).collect();
    assert_eq!(lines.len(), 1, "one line says why the node stopped:\n{stderr}");
    assert!(lines[0].contains("ERROR") && lines[0].contains("stopping the node"), "{}", lines[0]);

    // Everything acknowledged before the failure is there after a restart.
    drop(node);
    let node = NodeProcess::start(&data, &[]);
    node.wait_ready().await;
    let client = node.client().await;
    for key in &acknowledged {
        client.get_job(*key).await.unwrap_or_else(|e| panic!("acknowledged job {key} lost: {e}"));
    }
}
