//! Backups, through the `drover backup` command as an operator runs it: one
//! taken while a workload creates jobs is restored into a new cluster with
//! every job acknowledged before its cut, in the state it had there, and no
//! job created after; a damaged backup is refused by `verify` and `restore`.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{NodeProcess, ProcessCluster};
use drover::client::Client;
use drover::proto::gateway::*;
use tonic::Code;

/// Runs `drover ARGS...` to its end; its exit status, stdout and stderr.
async fn drover(args: &[String]) -> (bool, String, String) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    common::run_drover(&args, &[]).await
}

fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// A create, when it was sent and when it was acknowledged.
struct Created {
    key: u64,
    sent: Instant,
    acked: Instant,
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backup_taken_under_load_restores_every_job_acknowledged_before_its_cut_into_a_new_cluster() {
    let cluster = ProcessCluster::start(3, 2, 3, &[]);
    cluster.wait_ready().await;
    let client = Client::connect(&cluster.gateway(0)).await.unwrap();

    // Jobs settled in each state, a schema and an idempotency key.
    let done = client.create_job("done", r#"{"n":1}"#).await.unwrap();
    let broken = client
        .create(CreateJobRequest { r#type: "broken".into(), retries: Some(1), ..Default::default() })
        .await
        .unwrap();
    let keyed = client
        .create(CreateJobRequest {
            r#type: "keyed".into(),
            variables: r#"{"order":7}"#.into(),
            idempotency_key: "order-7".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    for job_type in ["done", "broken"] {
        let jobs = client.activate(job_type, "w", 1, 600_000, 10_000).await.unwrap();
        assert_eq!(jobs.len(), 1, "one {job_type} job to activate");
        let job = &jobs[0];
        if job_type == "done" {
            client.complete(job.key, job.attempt, r#"{"sent":true}"#).await.unwrap();
        } else {
            client.fail(job.key, job.attempt, 0, "printer on fire", 0).await.unwrap();
        }
    }
    let schema = r#"{"type":"object","required":["x"]}"#;
    client.raw().set_schema(SetSchemaRequest { r#type: "typed".into(), schema: schema.into() }).await.unwrap();
    // A chain half done: its first step completed, its second made.
    let chain = CreateWorkflowRequest {
        id: "half-done".into(),
        kind: "chain".into(),
        steps: ["bk-a", "bk-b"]
            .into_iter()
            .map(|t| CreateJobRequest { r#type: t.into(), ..Default::default() })
            .collect(),
        ..Default::default()
    };
    client.raw().create_workflow(chain).await.unwrap();
    let first = client.activate("bk-a", "w", 1, 600_000, 10_000).await.unwrap();
    client.complete(first[0].key, first[0].attempt, r#"{"fetched":1}"#).await.unwrap();

    // The workload: creates through another gateway, one after another.
    let created = Arc::new(Mutex::new(Vec::<Created>::new()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let load = {
        let client = Client::connect(&cluster.gateway(1)).await.unwrap();
        let created = Arc::clone(&created);
        tokio::spawn(async move {
            let mut n = 0u64;
            while !*stopped.borrow() {
                n += 1;
                let sent = Instant::now();
                let key = client.create_job("load", &format!(r#"{{"n":{n}}}"#)).await.expect("a create under load");
                created.lock().unwrap().push(Created { key, sent, acked: Instant::now() });
            }
        })
    };
    let count = || created.lock().unwrap().len();
    common::eventually(Duration::from_secs(30), "the workload to create 20 jobs", || async { count() >= 20 }).await;

    let store = tempfile::tempdir().unwrap();
    let destination = store.path().to_str().unwrap().to_string();
    let started = Instant::now();
    let (ok, out, err) =
        drover(&args(&["backup", "create", "--to", &destination, "--id", "under-load", "-a", &cluster.gateway(2)]))
            .await;
    let finished = Instant::now();
    assert!(ok, "drover backup create failed:\n{out}\n{err}");
    assert!(out.contains("backup under-load"), "{out}");
    let at_end = count();
    common::eventually(Duration::from_secs(30), "the workload to go on after the backup", || async {
        count() >= at_end + 20
    })
    .await;
    stop.send(true).unwrap();
    load.await.unwrap();

    // The cluster is lost, every disk of it.
    drop(cluster);

    let (ok, out, err) = drover(&args(&["backup", "verify", "--from", &destination, "--id", "under-load"])).await;
    assert!(ok, "verify failed:\n{out}\n{err}");
    let (ok, out, _) = drover(&args(&["backup", "list", "--from", &destination])).await;
    assert!(ok && out.contains("under-load  complete"), "{out}");

    // A new cluster, each node restored from the backup, then started.
    let mut restored = ProcessCluster::unstarted(3, 2, 3, &[]);
    for id in 0..3 {
        let (data, flags) = restored.node_args(id);
        let mut restore = args(&["backup", "restore", "--from", &destination, "--id", "under-load", "--data-dir"]);
        restore.push(data.to_str().unwrap().to_string());
        restore.extend(flags);
        let (ok, out, err) = drover(&restore).await;
        assert!(ok, "restoring node {id} failed:\n{out}\n{err}");
    }
    for id in 0..3 {
        restored.start_node(id);
    }
    restored.wait_ready().await;
    let client = Client::connect(&restored.gateway(1)).await.unwrap();

    let created = std::mem::take(&mut *created.lock().unwrap());
    let before: Vec<u64> = created.iter().filter(|c| c.acked < started).map(|c| c.key).collect();
    let after: Vec<u64> = created.iter().filter(|c| c.sent > finished).map(|c| c.key).collect();
    assert!(before.len() >= 20 && after.len() >= 20, "{} before the cut, {} after", before.len(), after.len());
    for key in &before {
        let job = client.get_job(*key).await.unwrap_or_else(|e| panic!("job {key}, acknowledged before the cut: {e}"));
        assert_eq!(job.state, "activatable", "job {key} as it was at the cut");
    }
    for key in &after {
        let missing = client.get_job(*key).await.expect_err("a job created after the backup is not in it");
        assert_eq!(missing.code(), Code::NotFound, "job {key}: {missing:?}");
    }

    let job = client.get_job(done).await.unwrap();
    assert_eq!((job.state.as_str(), job.result.as_str()), ("completed", r#"{"sent":true}"#));
    let job = client.get_job(broken).await.unwrap();
    assert_eq!((job.state.as_str(), job.error_message.as_str()), ("incident", "printer on fire"));
    let again = client
        .raw()
        .create_job(CreateJobRequest {
            r#type: "keyed".into(),
            variables: r#"{"order":7}"#.into(),
            idempotency_key: "order-7".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((again.key, again.created), (keyed, false), "the idempotency key still names its job");
    let refused = client.create_job("typed", "{}").await.expect_err("the schema came back");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    // The chain is where it was, and goes on from there once.
    let half_done = GetWorkflowRequest { id: "half-done".into(), ..Default::default() };
    let chain = client.raw().get_workflow(half_done.clone()).await.unwrap().into_inner();
    let states: Vec<&str> = chain.steps.iter().map(|s| s.state.as_str()).collect();
    assert_eq!((chain.state.as_str(), states), ("running", vec!["completed", "created"]));
    let second = client.activate("bk-b", "w", 1, 60_000, 10_000).await.unwrap();
    assert_eq!(second.len(), 1, "the second step's one job");
    assert!(second[0].variables.contains(r#""parent_results":[{"fetched":1}]"#), "{}", second[0].variables);
    client.complete(second[0].key, second[0].attempt, "{}").await.unwrap();
    let chain = client.raw().get_workflow(half_done).await.unwrap().into_inner();
    assert_eq!((chain.state.as_str(), chain.steps_completed), ("completed", 2));

    // The restored cluster serves: new jobs take new keys, and complete.
    let fresh = client.create_job("fresh", "{}").await.unwrap();
    assert!(!created.iter().any(|c| c.key == fresh) && ![done, broken, keyed].contains(&fresh), "key {fresh} reused");
    let jobs = client.activate("fresh", "w", 1, 60_000, 10_000).await.unwrap();
    assert_eq!(jobs.iter().map(|j| j.key).collect::<Vec<_>>(), [fresh]);
    client.complete(fresh, jobs[0].attempt, "{}").await.unwrap();
}

/// Copies backup `id` from `from` into a new destination, with `damage`
/// done to its part for partition 0.
fn damaged_copy(from: &Path, id: &str, into: &Path, damage: impl FnOnce(&mut Vec<u8>)) -> String {
    let (source, target) = (from.join(id), into.join(id));
    std::fs::create_dir_all(&target).unwrap();
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), target.join(entry.file_name())).unwrap();
    }
    let part = target.join("p0.snap");
    let mut bytes = std::fs::read(&part).unwrap();
    damage(&mut bytes);
    std::fs::write(&part, bytes).unwrap();
    into.to_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_or_truncated_backup_is_refused_by_verify_and_by_restore() {
    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("node"), &[]);
    node.wait_ready().await;
    let client = node.client().await;
    for n in 0..50 {
        client.create_job("kept", &format!(r#"{{"n":{n},"pad":"{}"}}"#, "x".repeat(200))).await.unwrap();
    }
    let good = dir.path().join("good");
    let destination = good.to_str().unwrap().to_string();
    let (ok, out, err) =
        drover(&args(&["backup", "create", "--to", &destination, "--id", "b1", "-a", &node.grpc])).await;
    assert!(ok, "{out}\n{err}");
    let (ok, out, err) = drover(&args(&["backup", "verify", "--from", &destination, "--id", "b1"])).await;
    assert!(ok && out.contains("50 jobs"), "{out}\n{err}");
    // The same id again is refused: a backup is never overwritten.
    let (ok, _, err) = drover(&args(&["backup", "create", "--to", &destination, "--id", "b1", "-a", &node.grpc])).await;
    assert!(!ok && err.contains("already exists"), "{err}");

    let truncated = damaged_copy(&good, "b1", &dir.path().join("truncated"), |b| b.truncate(b.len() - 100));
    let flipped = damaged_copy(&good, "b1", &dir.path().join("flipped"), |b| {
        let middle = b.len() / 2;
        b[middle] ^= 0x40;
    });
    for (destination, says) in [(&truncated, "truncated or damaged"), (&flipped, "SHA-256")] {
        let (ok, out, err) = drover(&args(&["backup", "verify", "--from", destination, "--id", "b1"])).await;
        assert!(!ok && err.contains(says), "verify of {destination}: {out}\n{err}");
        let data = dir.path().join(format!("restored-{}", destination.len()));
        let mut restore = args(&["backup", "restore", "--from", destination, "--id", "b1", "--data-dir"]);
        restore.push(data.to_str().unwrap().to_string());
        let (ok, out, err) = drover(&restore).await;
        assert!(!ok && err.contains(says), "restore from {destination}: {out}\n{err}");
        assert!(!data.join("cluster.json").exists(), "a refused restore leaves no data directory to start on");
    }

    // A hand-edited manifest that formed with more partitions than it has is
    // named damaged, never a panic of the restore.
    let edited = dir.path().join("edited");
    damaged_copy(&good, "b1", &edited, |_| {});
    let path = edited.join("b1/manifest.json");
    let mut manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    manifest["formed_partitions"] = serde_json::json!(8);
    std::fs::write(&path, manifest.to_string()).unwrap();
    let data = dir.path().join("restored-edited");
    let edited = edited.to_str().unwrap().to_string();
    let mut restore = args(&["backup", "restore", "--from", &edited, "--id", "b1", "--partitions", "8", "--data-dir"]);
    restore.push(data.to_str().unwrap().to_string());
    let (ok, out, err) = drover(&restore).await;
    assert!(!ok && err.contains("damaged") && !err.contains("panicked"), "restore of an edited manifest: {out}\n{err}");

    // An incomplete backup (no manifest) is listed as one and not restored.
    let incomplete = dir.path().join("incomplete");
    damaged_copy(&good, "b1", &incomplete, |_| {});
    std::fs::remove_file(incomplete.join("b1/manifest.json")).unwrap();
    let incomplete = incomplete.to_str().unwrap().to_string();
    let (_, out, _) = drover(&args(&["backup", "list", "--from", &incomplete])).await;
    assert!(out.contains("b1  INCOMPLETE"), "{out}");
    let (ok, _, err) = drover(&args(&["backup", "verify", "--from", &incomplete, "--id", "b1"])).await;
    assert!(!ok && err.contains("incomplete"), "{err}");

    // Deleted, it is gone.
    let (ok, _, err) = drover(&args(&["backup", "delete", "--from", &destination, "--id", "b1"])).await;
    assert!(ok, "{err}");
    let (ok, _, err) = drover(&args(&["backup", "verify", "--from", &destination, "--id", "b1"])).await;
    assert!(!ok && err.contains("there is no backup b1"), "{err}");
}

/// A node that restarted after the mark cleared its staged parts and will
/// never stage this one again: a read through it is answered from another
/// replica within seconds, not at the read's deadline.
#[tokio::test(flavor = "multi_thread")]
async fn a_part_a_restarted_node_no_longer_holds_is_read_from_another_replica() {
    let mut cluster = ProcessCluster::start(3, 1, 3, &[]);
    cluster.wait_ready().await;
    let client = Client::connect(&cluster.gateway(0)).await.unwrap();
    for n in 0..20 {
        client.create_job("kept", &format!(r#"{{"n":{n}}}"#)).await.unwrap();
    }
    client.raw().start_backup(StartBackupRequest { backup_id: "r1".into() }).await.unwrap();
    cluster.kill(0);
    cluster.start_node(0);
    cluster.wait_ready().await;

    let client = Client::connect(&cluster.gateway(0)).await.unwrap();
    let mut read = tonic::Request::new(ReadBackupRequest { backup_id: "r1".into(), partition_id: 0 });
    read.set_timeout(Duration::from_secs(120));
    let copied = async {
        let mut chunks = client.raw().read_backup(read).await.unwrap().into_inner();
        let (mut bytes, mut part) = (0u64, None);
        while let Some(chunk) = chunks.message().await.unwrap() {
            bytes += chunk.data.len() as u64;
            part = chunk.part.or(part);
        }
        (bytes, part)
    };
    let (bytes, part) = tokio::time::timeout(Duration::from_secs(30), copied)
        .await
        .expect("the part is read from another replica within 30 s, not at the read's 120 s deadline");
    let part = part.expect("the last chunk describes the part");
    assert_eq!((bytes, part.records), (part.bytes, 20));
}

/// The cluster port's staged-backup calls name a folder by the backup id a
/// peer sends: an id that climbs out of the staging folder is refused, and
/// deletes and reads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_backup_id_that_names_a_path_is_refused_on_the_cluster_port() {
    use drover::proto::cluster::{ReadStagedBackupRequest, ReleaseStagedBackupRequest};
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("node");
    let node = NodeProcess::start(&data, &[]);
    node.wait_ready().await;
    let probe = data.join("probe");
    std::fs::create_dir_all(&probe).unwrap();
    let mut peer = common::peer(format!("http://{}", node.cluster)).await.unwrap();
    for id in ["../../probe", "../..", "a/b", ""] {
        let release = ReleaseStagedBackupRequest { backup_id: id.into() };
        let error = peer.release_staged_backup(release).await.unwrap_err();
        assert_eq!(error.code(), Code::InvalidArgument, "{id:?}: {error}");
        assert!(error.message().contains("backup id"), "the id is named: {}", error.message());
        let read = ReadStagedBackupRequest { backup_id: id.into(), partition_id: 0, ..Default::default() };
        assert_eq!(peer.read_staged_backup(read).await.err().map(|e| e.code()), Some(Code::InvalidArgument), "{id:?}");
    }
    assert!(probe.exists(), "nothing outside the staging folder was deleted");
    let client = node.client().await;
    client.create_job("after-probe", "{}").await.expect("the node still serves from its data");
    let release = ReleaseStagedBackupRequest { backup_id: "no-such-backup".into() };
    peer.release_staged_backup(release).await.expect("a well-formed id with nothing staged is released");
}
