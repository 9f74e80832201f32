//! Storage that is damaged or fails is never worked around: a corrupt WAL
//! record refuses the open, a failed WAL sync stops the node, and a node forms
//! its groups once; one that lost its data rejoins from its peers instead.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{drover_bin, eventually, NodeProcess, ProcessCluster};
use drover::client::Client;
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

/// Writes one more log record after [`append_synced`]'s, which no sync
/// covers (so nothing acknowledged it).
fn write_unsynced(store: &Store) {
    let mut batch = store.batch();
    batch.put(Table::Log, storage::key(0, ENTRIES as u64), vec![0xee; 1000]);
    store.write(batch);
}

fn log_entries(store: &Store) -> usize {
    store.scan(Table::Log, 0, 0..u64::MAX).unwrap().len()
}

/// The files of a closed database with this extension, oldest first.
fn files_ending(db: &Path, extension: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(db)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == extension))
        .collect();
    files.sort();
    files
}

/// The newest WAL file of a closed database.
fn newest_wal(db: &Path) -> PathBuf {
    files_ending(db, "log").pop().expect("the database has a WAL")
}

/// Opens `db`, which must be refused as damaged; `what` names the damage
/// for the failure message. Returns the error's text.
fn refused_as_damaged(db: &Path, what: &str) -> String {
    let error = match Store::open(db) {
        Ok(store) => panic!("{what} opened, with {} of {ENTRIES} entries", log_entries(&store)),
        Err(error) => error,
    };
    assert!(matches!(error, StorageError::Corrupt { .. }), "{what}: {error}");
    let message = error.to_string();
    assert!(message.contains("is damaged") && message.contains("Re-seed this node"), "{message}");
    message
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
    refused_as_damaged(&db, "a WAL with a corrupt record");
}

#[test]
fn a_flipped_bit_in_a_table_file_or_a_missing_one_refuses_the_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let store = Store::open(&db).unwrap();
    append_synced(&store);
    // What a graceful stop does: the log moves from the WAL to a table file.
    store.flush_memtables();
    drop(store);
    let table = files_ending(&db, "sst").pop().expect("the flush wrote a table file");
    let intact = dir.path().join("intact");
    copy_dir(&db, &intact);

    // A byte in the first data block (records start at the file's start),
    // which an open alone never reads: only the check at open finds it.
    let mut bytes = std::fs::read(&table).unwrap();
    bytes[100] ^= 0x5a;
    std::fs::write(&table, &bytes).unwrap();
    refused_as_damaged(&db, "a table file with a flipped bit");

    let store = Store::open(&intact).expect("the undamaged copy opens");
    assert_eq!(log_entries(&store), ENTRIES, "the undamaged copy has every entry");
    drop(store);
    std::fs::remove_file(files_ending(&intact, "sst").pop().unwrap()).unwrap();
    refused_as_damaged(&intact, "a database without one of its table files");
}

#[test]
fn a_flipped_bit_under_purged_log_entries_refuses_the_open_too() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let store = Store::open(&db).unwrap();
    append_synced(&store);
    store.flush_memtables();
    // A log purge: one range deletion over every entry, in a table file of
    // its own. A scan of the records skips the blocks it covers; compaction
    // would still read them.
    let mut batch = store.batch();
    batch.delete_ids(Table::Log, 0, 0..ENTRIES as u64);
    store.write_synced(batch);
    store.flush_memtables();
    drop(store);
    let table = files_ending(&db, "sst").into_iter().next().expect("the entries' table file");
    let mut bytes = std::fs::read(&table).unwrap();
    bytes[100] ^= 0x5a;
    std::fs::write(&table, &bytes).unwrap();

    refused_as_damaged(&db, "a table file with a flipped bit under a range deletion");
}

#[test]
fn a_manifest_cut_before_a_column_family_was_created_refuses_the_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    append_synced(&Store::open(&db).unwrap());
    // The MANIFEST is a log of records (a 7-byte header: checksum, length,
    // type). Cut it at the start of the record that created `jobs_done`: a
    // whole record gone, which RocksDB opens without complaint.
    let manifest = std::fs::read_dir(&db)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.file_name().unwrap().to_string_lossy().starts_with("MANIFEST-"))
        .expect("a MANIFEST");
    let bytes = std::fs::read(&manifest).unwrap();
    let mut at = 0;
    let cut = loop {
        assert!(at + 7 <= bytes.len(), "no record in the MANIFEST creates jobs_done");
        let length = u16::from_le_bytes([bytes[at + 4], bytes[at + 5]]) as usize;
        let record = &bytes[at + 7..at + 7 + length];
        if record.windows(9).any(|w| w == b"jobs_done") {
            break at;
        }
        at += 7 + length;
    };
    std::fs::OpenOptions::new().write(true).open(&manifest).unwrap().set_len(cut as u64).unwrap();

    let message = refused_as_damaged(&db, "a MANIFEST cut short");
    assert!(message.contains("does not list the column families"), "{message}");
}

#[test]
fn a_torn_last_record_is_dropped_and_everything_before_it_opens() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let store = Store::open(&db).unwrap();
    append_synced(&store);
    // A crash in the middle of writing an unsynced record tears it, and
    // recovery may drop it.
    write_unsynced(&store);
    drop(store);
    let wal = newest_wal(&db);
    let length = std::fs::metadata(&wal).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&wal).unwrap().set_len(length - 500).unwrap();

    let store = Store::open(&db).expect("a torn last record does not refuse the open");
    assert_eq!(log_entries(&store), ENTRIES, "every synced entry is there, the torn one is not");
}

#[test]
fn writes_not_yet_synced_are_on_disk_after_a_clean_close() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let store = Store::open(&db).unwrap();
    append_synced(&store);
    // Unsynced writes (an apply, a commit index) wait in RocksDB's WAL
    // buffer for the next group commit; none comes before the close.
    write_unsynced(&store);
    let wal = newest_wal(&db);
    let before_close = std::fs::metadata(&wal).unwrap().len();
    drop(store);
    assert!(std::fs::metadata(&wal).unwrap().len() > before_close, "the close wrote the buffered record");

    let store = Store::open(&db).unwrap();
    assert_eq!(log_entries(&store), ENTRIES + 1, "the write after the last sync is there too");
}

#[test]
fn a_wal_cut_short_below_what_was_synced_refuses_the_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    append_synced(&Store::open(&db).unwrap());
    // Half the WAL gone: RocksDB alone would open it as a torn tail, with
    // half the synced entries missing. The synced mark says more was synced.
    let wal = newest_wal(&db);
    let length = std::fs::metadata(&wal).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&wal).unwrap().set_len(length / 2).unwrap();

    let message = refused_as_damaged(&db, "a WAL cut in half");
    assert!(message.contains("lost writes that were synced"), "{message}");
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

#[tokio::test]
async fn a_node_whose_database_lost_its_raft_state_refuses_to_start_instead_of_forming_again() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut node = NodeProcess::start(&data, &[]);
    node.wait_ready().await;
    node.client().await.create_job("formed", "{}").await.unwrap();
    node.signal(libc::SIGTERM);
    assert!(node.child.wait().unwrap().success());
    drop(node);

    // The database goes; the data directory's record that the node formed stays.
    std::fs::remove_dir_all(data.join("db")).unwrap();
    let mut node = Command::new(drover_bin())
        .arg("serve")
        .arg("--data-dir")
        .arg(&data)
        .args(["--grpc-addr", "127.0.0.1:0", "--cluster-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = node.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(30) {
            node.kill().unwrap();
            panic!("the node formed its partition again and is serving");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut stderr = String::new();
    node.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("partition 0 before") && stderr.contains("Re-seed this node"), "{stderr}");
}

/// The formation a node's data directory records (`cluster.json`).
fn formation(data_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(data_dir.join("cluster.json")).ok()?;
    let record: serde_json::Value = serde_json::from_str(&text).ok()?;
    record["formation"].as_str().map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_rejoins_with_join_existing_and_catches_up_from_its_peers() {
    let fast = ["--heartbeat-ms", "50", "--election-timeout-ms", "300"];
    // Snapshots every 50 entries and the log purged behind them: the wiped
    // node can only be sent a snapshot.
    let snapshots = ["--snapshot-every", "50", "--log-keep-after-snapshot", "5"];
    let mut cluster = ProcessCluster::start(3, 2, 3, &[&fast[..], &snapshots[..]].concat());
    cluster.wait_ready().await;
    assert_eq!(formation(&cluster.data_dir(2)).as_deref(), Some("formed"));
    let client = Client::connect(&cluster.gateway(0)).await.unwrap();
    let mut keys = Vec::new();
    for n in 0..150 {
        keys.push(client.create_job("rejoin", &format!(r#"{{"n":{n}}}"#)).await.unwrap());
    }

    cluster.kill(2);
    std::fs::remove_dir_all(cluster.data_dir(2)).unwrap();
    cluster.start_node_with(2, &["--join-existing"]);
    let data_dir = cluster.data_dir(2);
    eventually(Duration::from_secs(30), "node 2 to catch up with both leaders and record that it joined", || {
        let formed = formation(&data_dir).as_deref() == Some("formed");
        async move { formed }
    })
    .await;

    // Node 2 is a full replica again: with node 0 gone, nodes 1 and 2 elect
    // leaders (node 2 votes now) and serve every job.
    cluster.kill(0);
    let client = Client::connect(&cluster.gateway(1)).await.unwrap();
    for key in &keys {
        let job = client.get_job(*key).await.unwrap_or_else(|e| panic!("job {key} after the rejoin: {e}"));
        assert_eq!(job.state, "activatable");
    }
    client.create_job("rejoin", "{}").await.expect("nodes 1 and 2 commit a new create");
    let cluster = &cluster;
    eventually(Duration::from_secs(10), "node 2 to have applied as far as node 1 on both partitions", || async move {
        let (Some(one), Some(two)) = (cluster.status(1).await, cluster.status(2).await) else { return false };
        one.iter().all(|p| two.iter().any(|q| q.partition == p.partition && q.applied_index == p.applied_index))
    })
    .await;
}
