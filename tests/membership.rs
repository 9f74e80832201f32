//! Membership changes on real processes: a cluster grows from three nodes to
//! five and shrinks to four while jobs are created, its replicas spread
//! over zones after each step, and no acknowledged job is lost; a node
//! whose disk is lost is replaced by a node under a new id, and the old id
//! can never come back.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{eventually, free_port, run_drover, ProcessCluster};
use drover::client::Client;
use drover::proto::gateway::change_cluster_plan_request::Change;
use drover::proto::gateway::{ChangeClusterPlanRequest, ClusterPlan, GetClusterPlanRequest, GetJobRequest, PlanNode};
use tokio::sync::watch;

const FAST_RAFT: &[&str] = &["--heartbeat-ms", "50", "--election-timeout-ms", "300"];
/// A move copies a partition of a few hundred jobs: seconds at most.
const SETTLE_WITHIN: Duration = Duration::from_secs(60);

async fn plan_of(client: &Client) -> ClusterPlan {
    client.raw().get_cluster_plan(GetClusterPlanRequest {}).await.expect("the plan reads").into_inner()
}

async fn change(client: &Client, change: Change) -> Result<ClusterPlan, tonic::Status> {
    client.raw().change_cluster_plan(ChangeClusterPlanRequest { change: Some(change) }).await.map(|r| r.into_inner())
}

fn node(cluster: &ProcessCluster, id: usize, zone: &str) -> PlanNode {
    PlanNode { node_id: id as u64, address: cluster.cluster_addr(id), region: "r".into(), zone: zone.into() }
}

/// Waits until every partition's voters are its target, and answers the plan.
async fn settled(client: &Client) -> ClusterPlan {
    let mut last = None;
    let started = std::time::Instant::now();
    loop {
        if let Ok(reply) = client.raw().get_cluster_plan(GetClusterPlanRequest {}).await {
            let plan = reply.into_inner();
            if plan.partitions.iter().all(|p| !p.moving) {
                return plan;
            }
            last = Some(plan);
        }
        assert!(started.elapsed() < SETTLE_WITHIN, "the plan did not settle within {SETTLE_WITHIN:?}: {last:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every partition's voters are `replication` nodes in distinct zones, and
/// each member holds the replicas the plan says.
fn assert_spread(plan: &ClusterPlan, replication: usize) {
    let zone_of = |id: u64| {
        let member = plan.members.iter().find(|m| m.node.as_ref().is_some_and(|n| n.node_id == id));
        member.and_then(|m| m.node.as_ref()).map(|n| n.zone.clone()).expect("a voter is a member")
    };
    for partition in &plan.partitions {
        assert_eq!(partition.current.len(), replication, "partition {}: {:?}", partition.partition_id, partition);
        let zones: BTreeSet<String> = partition.current.iter().map(|n| zone_of(*n)).collect();
        assert_eq!(
            zones.len(),
            replication,
            "partition {}'s replicas share a zone: {partition:?}",
            partition.partition_id
        );
    }
}

/// The partitions node `id` hosts, as its own status says.
async fn hosted(cluster: &ProcessCluster, id: usize) -> BTreeSet<u32> {
    cluster.status(id).await.unwrap_or_default().into_iter().map(|s| s.partition).collect()
}

/// Creates jobs through `client` until told to stop; answers the keys of
/// those acknowledged.
fn create_until(client: Client, stop: watch::Receiver<bool>) -> tokio::task::JoinHandle<Vec<u64>> {
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    tokio::spawn(async move {
        let mut n = 0u64;
        while !*stop.borrow() {
            n += 1;
            let variables = format!(r#"{{"n":{n}}}"#);
            let create = client.create_job("grow", &variables);
            if let Ok(Ok(key)) = tokio::time::timeout(Duration::from_secs(5), create).await {
                acknowledged.lock().unwrap().push(key);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let keys = acknowledged.lock().unwrap().clone();
        keys
    })
}

async fn assert_kept(client: &Client, keys: &[u64]) {
    for key in keys {
        let request = GetJobRequest { key: *key, ..Default::default() };
        let found = client.raw().get_job(request).await;
        assert!(found.is_ok(), "acknowledged job {key} is lost: {found:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_grows_from_three_nodes_to_five_and_shrinks_to_four_keeping_every_job() {
    let locations = ["r/z0", "r/z1", "r/z2"];
    let mut cluster =
        ProcessCluster::start_located(3, 3, 3, FAST_RAFT, &locations, &|_, _, port| format!("127.0.0.1:{port}"));
    cluster.wait_ready().await;
    let admin = cluster.node(1).client().await;
    let before = plan_of(&admin).await;
    assert!(!before.changed && before.members.len() == 3, "the member list's plan: {before:?}");

    let (stop, stopped) = watch::channel(false);
    let load = create_until(cluster.node(1).client().await, stopped);

    // 3 -> 5: two nodes in new zones join, and replicas move to them.
    for zone in ["z3", "z4"] {
        let id = cluster.start_joining(&format!("r/{zone}"));
        cluster.node(id).wait_ready().await;
        change(&admin, Change::AddNode(node(&cluster, id, zone))).await.expect("a node is added");
    }
    let grown = settled(&admin).await;
    assert_eq!(grown.members.len(), 5);
    assert_spread(&grown, 3);
    let held: Vec<u32> = grown.members.iter().map(|m| m.replicas).collect();
    assert!(held.iter().all(|n| (1..=3).contains(n)), "the load is spread over all five: {held:?}");
    for id in [3, 4] {
        let want: BTreeSet<u32> =
            grown.partitions.iter().filter(|p| p.current.contains(&(id as u64))).map(|p| p.partition_id).collect();
        eventually(Duration::from_secs(10), "a new node to host what the plan gives it", || async {
            hosted(&cluster, id).await == want
        })
        .await;
    }

    // 5 -> 4: node 0 leaves; its replicas go elsewhere first.
    change(&admin, Change::RemoveNode(0)).await.expect("a node is removed");
    let shrunk = settled(&admin).await;
    assert_spread(&shrunk, 3);
    eventually(Duration::from_secs(10), "node 0 to leave and its id to be retired", || async {
        let plan = plan_of(&admin).await;
        plan.members.len() == 4 && plan.retired == vec![0]
    })
    .await;
    eventually(Duration::from_secs(10), "node 0 to close every replica", || async {
        hosted(&cluster, 0).await.is_empty()
    })
    .await;

    // Every node shows the plan it follows (within a look or two), and counts it.
    let node_3_view = || async {
        let (code, body) = common::http_get(&cluster.node(3).admin, "/actuator/plan").await.expect("the admin port");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).expect("JSON")
    };
    eventually(Duration::from_secs(10), "node 3 to follow the plan that retired node 0", || async {
        let view = node_3_view().await;
        view["changed"] == true && view["plan"]["retired"] == serde_json::json!([0])
    })
    .await;
    assert!(cluster.metric(3, "drover_plan_epoch").await >= 4.0, "four changes at least");

    stop.send(true).unwrap();
    let keys = load.await.unwrap();
    assert!(keys.len() > 50, "jobs were created throughout: {}", keys.len());
    assert_kept(&cluster.node(3).client().await, &keys).await;

    // A removed id cannot come back, and the cluster cannot shrink below
    // its replication factor... after one more removal.
    let again = change(&admin, Change::AddNode(node(&cluster, 0, "z0"))).await.unwrap_err();
    assert_eq!(again.code(), tonic::Code::FailedPrecondition, "{again:?}");
    change(&admin, Change::RemoveNode(1)).await.expect("four members may lose one");
    let too_few = change(&admin, Change::RemoveNode(2)).await.unwrap_err();
    assert_eq!(too_few.code(), tonic::Code::FailedPrecondition, "{too_few:?}");
    assert!(too_few.message().contains("replication factor"), "{}", too_few.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_is_lost_is_replaced_under_a_new_id() {
    let mut cluster = ProcessCluster::start(3, 2, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let client = cluster.node(0).client().await;
    let mut keys = Vec::new();
    for n in 0..40 {
        keys.push(client.create_job("replace", &format!(r#"{{"n":{n}}}"#)).await.unwrap());
    }
    // Node 2's disk is gone.
    cluster.kill(2);
    std::fs::remove_dir_all(cluster.data_dir(2)).unwrap();
    let new = cluster.start_joining("");
    cluster.node(new).wait_ready().await;
    let replace = Change::ReplaceNode(drover::proto::gateway::ReplaceNode {
        old_node_id: 2,
        new_node: Some(PlanNode { node_id: new as u64, address: cluster.cluster_addr(new), ..Default::default() }),
    });
    change(&client, replace).await.expect("the node is replaced");
    let plan = settled(&client).await;
    for partition in &plan.partitions {
        let voters: BTreeSet<u64> = partition.current.iter().copied().collect();
        assert_eq!(voters, BTreeSet::from([0, 1, new as u64]), "{partition:?}");
    }
    assert_eq!(plan.retired, vec![2], "the lost node's id is retired");

    // The new node is a voter holding the data: with node 0 gone too, nodes
    // 1 and the new one are a majority of every partition and hold every job.
    cluster.kill(0);
    let survivor = cluster.node(1).client().await;
    eventually(Duration::from_secs(15), "a create once nodes 1 and the new one elect leaders", || async {
        survivor.create_job("replace", r#"{"after":true}"#).await.is_ok()
    })
    .await;
    assert_kept(&survivor, &keys).await;
    let back = change(
        &survivor,
        Change::AddNode(PlanNode { node_id: 2, address: "127.0.0.1:1".into(), ..Default::default() }),
    );
    assert_eq!(back.await.unwrap_err().code(), tonic::Code::FailedPrecondition, "the old id never returns");
}

/// Ten loopback ports from `base`, where `base` ends in 0 and each is free now.
fn free_decade() -> u16 {
    loop {
        let base = free_port() / 10 * 10;
        if base > 1_000 && (0..10).all(|i| std::net::TcpListener::bind(("127.0.0.1", base + i)).is_ok()) {
            return base;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scale_command_of_the_chart_adds_unlisted_pods_and_removes_those_beyond_the_size() {
    let mut cluster = ProcessCluster::start(3, 2, 3, FAST_RAFT);
    cluster.wait_ready().await;
    // Pods 3 and 4 know only the member list the cluster formed with, as a
    // StatefulSet's new pods do; their addresses follow one template.
    let base = free_decade();
    let template = format!("127.0.0.1:{}{{id}}", base / 10);
    for id in [3u16, 4] {
        let node = cluster.start_unlisted(base + id);
        cluster.node(node).wait_ready().await;
    }
    let gateway = cluster.gateway(0);
    let scale = |args: Vec<String>| {
        let gateway = gateway.clone();
        async move {
            let mut all = vec!["cluster".to_string(), "scale".into(), "--address".into(), gateway];
            all.extend(args);
            let all: Vec<&str> = all.iter().map(String::as_str).collect();
            run_drover(&all, &[]).await
        }
    };
    let arg = |s: &str| s.to_string();
    let (ok, out, err) =
        scale(vec![arg("--size"), arg("5"), arg("--address-template"), template.clone(), arg("--wait"), arg("60")])
            .await;
    assert!(ok, "scale to 5: {out}{err}");
    let client = cluster.node(0).client().await;
    let plan = plan_of(&client).await;
    let ids: Vec<u64> = plan.members.iter().filter_map(|m| m.node.as_ref().map(|n| n.node_id)).collect();
    assert_eq!(ids, vec![0, 1, 2, 3, 4], "{plan:?}");
    assert!(plan.partitions.iter().all(|p| !p.moving), "it waited for the moves: {plan:?}");
    assert!(plan.members.iter().any(|m| m.node.as_ref().is_some_and(|n| n.node_id >= 3) && m.replicas > 0));

    // The chart's pre-upgrade hook before the StatefulSet shrinks to 4.
    let (ok, out, err) = scale(vec![
        arg("--size"),
        arg("4"),
        arg("--address-template"),
        template.clone(),
        arg("--remove-only"),
        arg("--wait"),
        arg("60"),
    ])
    .await;
    assert!(ok, "scale to 4: {out}{err}");
    assert_eq!(plan_of(&client).await.retired, vec![4], "node 4 left");
    // Ordinal 4 cannot come back under its old id.
    let (ok, _, err) = scale(vec![arg("--size"), arg("5"), arg("--address-template"), template]).await;
    assert!(!ok && err.contains("never used again"), "{err}");
}
