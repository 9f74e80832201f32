//! More partitions in a running cluster, on real processes: three nodes
//! grow from three partitions to six while keyless and keyed creates run.
//! The new partitions form, take keyless creates through every gateway and
//! hold the schema set before they existed; jobs made before stay where
//! they are; and no idempotency key, repeated before, during and after the
//! change, ever makes a second job.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{eventually, run_drover, ProcessCluster};
use drover::client::leaders::partition_of;
use drover::client::Client;
use drover::proto::gateway::{CreateJobRequest, GetClusterPlanRequest, SetSchemaRequest, WatchEventsRequest};
use tokio::sync::watch;

const FAST_RAFT: &[&str] = &["--heartbeat-ms", "50", "--election-timeout-ms", "300"];

fn keyed(key: &str) -> CreateJobRequest {
    CreateJobRequest {
        r#type: "grow".into(),
        variables: format!(r#"{{"key":"{key}"}}"#),
        idempotency_key: key.into(),
        ..Default::default()
    }
}

/// Creates `key` through `client`, retrying what is safe to retry, and
/// answers the job it names.
async fn create_keyed(client: &Client, key: &str) -> u64 {
    let mut last = None;
    for _ in 0..50 {
        match tokio::time::timeout(Duration::from_secs(5), client.create(keyed(key))).await {
            Ok(Ok(job)) => return job,
            Ok(Err(status)) if status.code() == tonic::Code::InvalidArgument => panic!("{key}: {status:?}"),
            Ok(Err(status)) => last = Some(format!("{status:?}")),
            Err(_) => last = Some("timed out".into()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("idempotency key {key} could not be created: {last:?}");
}

/// Keyed creates until told to stop, each key twice (the second a repeat
/// through another gateway); answers every (key, job) seen.
fn keyed_until(clients: Vec<Client>, stop: watch::Receiver<bool>) -> tokio::task::JoinHandle<Vec<(String, u64)>> {
    tokio::spawn(async move {
        let mut seen = Vec::new();
        let mut n = 0usize;
        while !*stop.borrow() {
            n += 1;
            let key = format!("during-{n}");
            seen.push((key.clone(), create_keyed(&clients[n % clients.len()], &key).await));
            seen.push((key.clone(), create_keyed(&clients[(n + 1) % clients.len()], &key).await));
        }
        seen
    })
}

/// Keyless creates through every gateway until told to stop; answers the
/// keys acknowledged.
fn keyless_until(clients: Vec<Client>, stop: watch::Receiver<bool>) -> tokio::task::JoinHandle<Vec<u64>> {
    tokio::spawn(async move {
        let mut acknowledged = Vec::new();
        let mut n = 0usize;
        while !*stop.borrow() {
            n += 1;
            let create = clients[n % clients.len()].create_job("grow", r#"{"keyless":true}"#);
            if let Ok(Ok(key)) = tokio::time::timeout(Duration::from_secs(5), create).await {
                acknowledged.push(key);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        acknowledged
    })
}

/// Each key names one job, whichever gateway and whenever it was sent.
fn assert_one_job_per_key(seen: &[(String, u64)]) {
    let mut jobs: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
    for (key, job) in seen {
        jobs.entry(key).or_default().insert(*job);
    }
    let twice: Vec<_> = jobs.iter().filter(|(_, jobs)| jobs.len() > 1).collect();
    assert!(twice.is_empty(), "idempotency keys that made two jobs: {twice:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_partitions_become_six_while_keyless_and_keyed_creates_run() {
    let locations = ["r/z0", "r/z1", "r/z2"];
    let mut args = FAST_RAFT.to_vec();
    args.extend(["--idempotency-window-secs", "600"]);
    let cluster = ProcessCluster::start_located(3, 3, 3, &args, &locations, &|_, _, port| format!("127.0.0.1:{port}"));
    cluster.wait_ready().await;
    let mut clients = Vec::new();
    for id in 0..3 {
        clients.push(cluster.node(id).client().await);
    }
    let admin = &clients[0];
    let schema = r#"{"type":"object","required":["ok"]}"#;
    admin
        .raw()
        .set_schema(SetSchemaRequest { r#type: "strict".into(), schema: schema.into() })
        .await
        .expect("a schema is set");

    // Keys made before the change, and where they are.
    let mut seen = Vec::new();
    for n in 0..60 {
        let key = format!("before-{n}");
        seen.push((key.clone(), create_keyed(&clients[n % 3], &key).await));
    }
    let before: Vec<u64> = seen.iter().map(|(_, job)| *job).collect();
    assert!(before.iter().all(|job| partition_of(*job) < 3));

    // A watch opened before the change follows the new partitions' events too.
    let request = WatchEventsRequest { from_now: true, types: vec!["watched".into()], ..Default::default() };
    let mut events = admin.raw().watch_events(request).await.expect("a watch opens").into_inner();

    let (stop, stopped) = watch::channel(false);
    let keyless = keyless_until(clients.clone(), stopped.clone());
    let keyed = keyed_until(clients.clone(), stopped);

    let (ok, out, err) = run_drover(
        &["cluster", "add-partitions", "--to", "6", "--wait", "60", "--address", &cluster.node(1).grpc],
        &[],
    )
    .await;
    assert!(ok, "add-partitions: {out}\n{err}");
    assert!(out.contains("partitions 3 to 5: planned"), "{out}");
    let plan = admin.raw().get_cluster_plan(GetClusterPlanRequest {}).await.expect("the plan reads").into_inner();
    assert_eq!((plan.partitions.len(), plan.partitions_in_force, plan.formed_partitions), (6, 6, 3), "{plan:?}");
    for partition in &plan.partitions[3..] {
        assert_eq!(partition.current.len(), 3, "a new partition's voters: {partition:?}");
        assert!(!partition.forming && !partition.moving, "{partition:?}");
    }
    for id in 0..3 {
        eventually(Duration::from_secs(10), "every gateway to route over six partitions", || async {
            let topology = cluster.node(id).client().await.topology().await;
            topology.is_ok_and(|t| t.partitions_count == 6)
        })
        .await;
    }

    // The keys made before are still answered by their first jobs, through
    // every gateway; so are those made while the count changed.
    for (n, (key, job)) in seen.clone().iter().enumerate() {
        assert_eq!(create_keyed(&clients[(n + 1) % 3], key).await, *job, "{key} made a second job");
    }
    // Keyless creates reach the new partitions, through every gateway.
    eventually(Duration::from_secs(30), "keyless creates to land on partitions 3 to 5", || async {
        let mut reached = BTreeSet::new();
        for client in &clients {
            for _ in 0..6 {
                if let Ok(job) = client.create_job("watched", "{}").await {
                    reached.insert(partition_of(job));
                }
            }
        }
        (3..6).all(|p| reached.contains(&p))
    })
    .await;
    let on_new = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(event) = events.message().await.expect("the watch goes on") {
            if partition_of(event.key) >= 3 {
                return event;
            }
        }
        panic!("the watch ended");
    })
    .await
    .expect("the watch opened before the change sees an added partition's event within 30 s");
    assert_eq!(on_new.kind, "created");
    // The schema set before the new partitions existed holds on them.
    for client in &clients {
        for _ in 0..6 {
            let refused = client.create_job("strict", "{}").await.expect_err("the schema refuses it");
            assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        }
    }
    // New keys spread over the new partitions too.
    let mut after = Vec::new();
    for n in 0..60 {
        let key = format!("after-{n}");
        after.push((key.clone(), create_keyed(&clients[n % 3], &key).await));
    }
    assert!(after.iter().any(|(_, job)| partition_of(*job) >= 3), "no new key hashed to a new partition");

    stop.send(true).unwrap();
    let made = keyless.await.unwrap();
    seen.extend(keyed.await.unwrap());
    seen.extend(after);
    assert!(seen.iter().any(|(key, _)| key.starts_with("during-")), "keyed creates ran during the change");
    assert_one_job_per_key(&seen);
    for job in made.iter().chain(seen.iter().map(|(_, job)| job)) {
        let found = admin.get_job(*job).await;
        assert!(found.is_ok(), "acknowledged job {job} is lost: {found:?}");
    }
    let moved: Vec<_> = before.iter().filter(|job| partition_of(**job) >= 3).collect();
    assert!(moved.is_empty(), "existing jobs stay where they are: {moved:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_of_a_grown_cluster_restores_every_partition_into_a_cluster_of_the_count_it_formed_with() {
    let cluster = ProcessCluster::start(3, 2, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let client = cluster.node(0).client().await;
    let made_before = create_keyed(&client, "made-before").await;
    let (ok, out, err) =
        run_drover(&["cluster", "add-partitions", "--to", "4", "--wait", "60", "--address", &cluster.gateway(0)], &[])
            .await;
    assert!(ok, "add-partitions: {out}\n{err}");
    let mut jobs = vec![made_before];
    let mut clients = Vec::new();
    for id in 0..3 {
        clients.push(cluster.node(id).client().await);
    }
    // Every gateway routes over four partitions within a look or two.
    for _ in 0..100 {
        for client in &clients {
            jobs.push(client.create_job("grow", "{}").await.expect("created"));
        }
        if jobs.iter().any(|job| partition_of(*job) == 2) && jobs.iter().any(|job| partition_of(*job) == 3) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!((2..4).all(|p| jobs.iter().any(|job| partition_of(*job) == p)), "no job on the added partitions");
    let made_after = create_keyed(&client, "made-after").await;

    let store = tempfile::tempdir().unwrap();
    let to = store.path().to_str().unwrap();
    let (ok, out, err) =
        run_drover(&["backup", "create", "--to", to, "--id", "grown", "-a", &cluster.gateway(1)], &[]).await;
    assert!(ok, "backup create: {out}\n{err}");
    drop(cluster);

    let mut restored = ProcessCluster::unstarted(3, 2, 3, FAST_RAFT);
    for id in 0..3 {
        let (data, flags) = restored.node_args(id);
        let mut restore: Vec<String> =
            ["backup", "restore", "--from", to, "--id", "grown", "--data-dir"].iter().map(|s| s.to_string()).collect();
        restore.push(data.to_str().unwrap().to_string());
        restore.extend(flags);
        let restore: Vec<&str> = restore.iter().map(String::as_str).collect();
        let (ok, out, err) = run_drover(&restore, &[]).await;
        assert!(ok, "restoring node {id}: {out}\n{err}");
    }
    for id in 0..3 {
        restored.start_node(id);
    }
    restored.wait_ready().await;
    let client = Client::connect(&restored.gateway(2)).await.unwrap();
    let plan = client.raw().get_cluster_plan(GetClusterPlanRequest {}).await.expect("the plan reads").into_inner();
    assert_eq!((plan.partitions.len(), plan.partitions_in_force, plan.formed_partitions), (4, 4, 2), "{plan:?}");
    for job in &jobs {
        client.get_job(*job).await.unwrap_or_else(|e| panic!("job {job}, made before the backup: {e}"));
    }
    assert_eq!(create_keyed(&client, "made-before").await, made_before, "a key made under the formed count");
    assert_eq!(create_keyed(&client, "made-after").await, made_after, "a key made under the added count");
    eventually(Duration::from_secs(30), "the restored cluster to create on every partition", || async {
        let mut reached = BTreeSet::new();
        for id in 0..3 {
            let client = Client::connect(&restored.gateway(id)).await.unwrap();
            for _ in 0..4 {
                reached.insert(partition_of(client.create_job("grow", "{}").await.expect("created")));
            }
        }
        reached.len() == 4
    })
    .await;
}

/// A node down while partitions are added is made a voter of them by the
/// others (they form with a majority); back up, it has no Raft state for
/// them and copies them from their leaders instead of refusing to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_down_while_partitions_are_added_copies_them_when_it_comes_back() {
    let mut cluster = ProcessCluster::start(3, 2, 3, FAST_RAFT);
    cluster.wait_ready().await;
    cluster.kill(2);
    let (ok, out, err) =
        run_drover(&["cluster", "add-partitions", "--to", "3", "--wait", "60", "--address", &cluster.gateway(0)], &[])
            .await;
    assert!(ok, "add-partitions with a node down: {out}\n{err}");
    let client = cluster.node(0).client().await;
    // Keyless creates go to partitions their gateway leads: through both.
    let gateways = [cluster.node(0).client().await, cluster.node(1).client().await];
    let mut made = Vec::new();
    for n in 0..400 {
        let job = gateways[n % 2].create_job("grow", "{}").await.expect("created with two of three nodes");
        made.push(job);
        if made.iter().filter(|job| partition_of(**job) == 2).count() >= 5 {
            break;
        }
    }
    assert!(made.iter().any(|job| partition_of(*job) == 2), "no job on the added partition");

    cluster.start_node(2);
    cluster.node(2).wait_ready().await;
    eventually(Duration::from_secs(30), "node 2 to hold the added partition, caught up", || async {
        let leader_applied = cluster.status(0).await.unwrap_or_default().into_iter().find(|s| s.partition == 2);
        let here = cluster.status(2).await.unwrap_or_default().into_iter().find(|s| s.partition == 2);
        match (leader_applied, here) {
            (Some(there), Some(here)) => here.leader.is_some() && here.applied_index >= there.applied_index,
            _ => false,
        }
    })
    .await;
    // Node 2 carries the added partition: with node 1 gone it still commits.
    cluster.kill(1);
    for _ in 0..20 {
        let job = tokio::time::timeout(Duration::from_secs(30), client.create_job("grow", "{}"))
            .await
            .expect("a create within 30 s")
            .expect("created by nodes 0 and 2");
        made.push(job);
    }
    for job in &made {
        client.get_job(*job).await.unwrap_or_else(|e| panic!("job {job}: {e}"));
    }
}
