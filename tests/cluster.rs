//! Three real nodes as separate processes: routing across gateways, leader
//! failover under load with SIGKILL, catch-up by snapshot, timers that move
//! with leadership.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{eventually, PartitionStatus, ProcessCluster};
use drover::client::Client;
use tokio::sync::watch;

const FAST_RAFT: &[&str] = &["--heartbeat-ms", "50", "--election-timeout-ms", "300"];

#[tokio::test]
async fn jobs_created_on_one_gateway_complete_through_another() {
    let cluster = ProcessCluster::start(3, 3, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let first = cluster.node(0).client().await;
    let third = cluster.node(2).client().await;
    let led_by_first = led_by(&cluster, 0).await;
    let mut keys = Vec::new();
    for n in 0..9 {
        keys.push(first.create_job("route", &format!(r#"{{"n":{n}}}"#)).await.unwrap());
    }
    let partitions: std::collections::BTreeSet<u32> = keys.iter().map(|k| (k >> 48) as u32).collect();
    if led_by_first.is_empty() {
        assert_eq!(partitions.len(), 3, "a gateway that leads nothing spreads new jobs over every partition");
    } else {
        // Leadership may move while the jobs are created, but not often.
        let local = keys.iter().filter(|k| led_by_first.contains(&((**k >> 48) as u32))).count();
        assert!(
            local >= 6,
            "keyless creates go to partitions their gateway's node leads {led_by_first:?}: {partitions:?}"
        );
        assert!(led_by_first.iter().all(|p| partitions.contains(p)), "in turn over {led_by_first:?}: {partitions:?}");
    }
    let mut jobs = Vec::new();
    while jobs.len() < keys.len() {
        let batch = third.activate("route", "w3", 10, 60_000, 5_000).await.unwrap();
        assert!(!batch.is_empty(), "node 3 activates the jobs created through node 1");
        jobs.extend(batch);
    }
    for job in &jobs {
        third.complete(job.key, job.attempt, "{}").await.unwrap();
    }
    for key in keys {
        assert_eq!(first.get_job(key).await.unwrap().state, "completed");
    }
}

#[tokio::test]
async fn creates_and_completions_sent_to_the_leaders_gateway_are_never_forwarded() {
    let cluster = ProcessCluster::start(3, 3, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let mut leaders = Vec::new();
    for partition in 0..3 {
        leaders.push(cluster.leader_of(partition, Duration::from_secs(30)).await);
    }
    let gateways: Vec<String> = (0..3).map(|id| cluster.gateway(id)).collect();
    let routing = drover::client::leaders::Leaders::new(&gateways);
    routing.learn(&cluster.node(0).client().await.topology().await.unwrap());
    assert_eq!(routing.known(), 3, "every partition's leader gateway is known");
    let forwards = || async {
        let mut total = 0.0;
        for id in 0..3 {
            total += cluster.metric(id, "drover_stage_seconds_count{stage=\"gateway_forward\"}").await;
        }
        total
    };
    let before = forwards().await;
    // Creates through each leader's gateway stay on that node; completions go
    // to the gateway the routing names.
    let mut keys = Vec::new();
    for leader in &leaders {
        let client = cluster.node(*leader).client().await;
        for n in 0..3 {
            keys.push(client.create_job("routed", &format!(r#"{{"n":{n}}}"#)).await.unwrap());
        }
    }
    // Leadership could move meanwhile, but hardly for more than one create.
    let local =
        keys.iter().zip(leaders.iter().flat_map(|l| [*l; 3])).filter(|(k, l)| leaders[(**k >> 48) as usize] == *l);
    assert!(local.count() >= keys.len() - 1, "keyless creates land on partitions their gateway's node leads");
    for key in &keys {
        let gateway = routing.gateway_of_key(*key).expect("known");
        assert_eq!(gateway, cluster.gateway(leaders[(key >> 48) as usize]), "the leader's own gateway");
    }
    let mut done = 0;
    while done < keys.len() {
        let jobs = cluster.node(0).client().await.activate("routed", "w", 10, 60_000, 5_000).await.unwrap();
        assert!(!jobs.is_empty(), "the routed jobs can be activated");
        for job in jobs {
            let client = drover::client::Client::connect_lazy(routing.gateway_of_key(job.key).unwrap()).unwrap();
            client.complete(job.key, job.attempt, "{}").await.unwrap();
            done += 1;
        }
    }
    // The activations went through node 0's gateway and were forwarded where
    // node 0 does not lead; nothing else was.
    let polled_elsewhere = leaders.iter().filter(|l| **l != 0).count() as f64;
    let forwarded = forwards().await - before;
    assert!(
        forwarded <= polled_elsewhere * 3.0,
        "{forwarded} forwards: creates and completions should have added none (activation rounds may add {})",
        polled_elsewhere * 3.0
    );
    if polled_elsewhere > 0.0 {
        // The activation rounds through node 0 did forward: the count is read.
        assert!(forwarded >= 1.0, "no forward counted, though node 0 polled partitions it does not lead");
    }
}

/// The partitions node `id` leads, as its status says.
async fn led_by(cluster: &ProcessCluster, id: usize) -> std::collections::BTreeSet<u32> {
    let status = cluster.status(id).await.unwrap_or_default();
    status.iter().filter(|p| p.role == "leader").map(|p| p.partition).collect()
}

/// What clients saw while a workload ran.
#[derive(Default)]
struct History {
    acked: Vec<u64>,
    completions: HashMap<u64, u32>,
}

/// Producers and workers that use any live gateway and retry on errors.
fn run_workload(
    gateways: Vec<String>,
    history: Arc<Mutex<History>>,
    stop: watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for (i, gateway) in gateways.iter().enumerate() {
        let (producer_gateway, producer_history, mut producer_stop) =
            (gateway.clone(), Arc::clone(&history), stop.clone());
        tasks.push(tokio::spawn(async move {
            let client = Client::connect_lazy(&producer_gateway).unwrap();
            let mut n = 0u64;
            while !*producer_stop.borrow() {
                n += 1;
                let variables = format!(r#"{{"producer":{i},"n":{n}}}"#);
                let create = client.create_job("failover", &variables);
                tokio::select! {
                    result = create => match result {
                        Ok(key) => producer_history.lock().unwrap().acked.push(key),
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    },
                    _ = producer_stop.changed() => {}
                }
            }
        }));
        let (gateway, history, mut stop) = (gateway.clone(), Arc::clone(&history), stop.clone());
        tasks.push(tokio::spawn(async move {
            let client = Client::connect_lazy(&gateway).unwrap();
            while !*stop.borrow() {
                let activate = client.activate("failover", "w", 20, 2_000, 200);
                let jobs = tokio::select! {
                    jobs = activate => jobs,
                    _ = stop.changed() => break,
                };
                let Ok(jobs) = jobs else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                for job in jobs {
                    if client.complete(job.key, job.attempt, "{}").await.is_ok() {
                        *history.lock().unwrap().completions.entry(job.key).or_default() += 1;
                    }
                }
            }
        }));
    }
    tasks
}

/// Kills the leader of partition 0 under load; returns the failover time.
async fn kill_leader_under_load(cluster: &mut ProcessCluster) -> (usize, Duration) {
    let history = Arc::new(Mutex::new(History::default()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let gateways: Vec<String> =
        cluster.live().into_iter().filter(|id| *id != leader).map(|id| cluster.gateway(id)).collect();
    let tasks = run_workload(gateways.clone(), Arc::clone(&history), stop_rx);
    common::eventually(Duration::from_secs(20), "the workload to get going", || {
        let history = Arc::clone(&history);
        async move { history.lock().unwrap().completions.len() >= 50 }
    })
    .await;

    cluster.kill(leader);
    let killed_at = Instant::now();
    let acked_before = history.lock().unwrap().acked.len();
    common::eventually(Duration::from_secs(30), "a create acknowledged after the leader died", || {
        let history = Arc::clone(&history);
        async move { history.lock().unwrap().acked.len() > acked_before + 20 }
    })
    .await;
    let failover = killed_at.elapsed();
    let _ = stop_tx.send(true);
    for task in tasks {
        task.await.unwrap();
    }

    // Every acknowledged create is completed, or still there to be worked on.
    let client = Client::connect(&gateways[0]).await.unwrap();
    let history = std::mem::take(&mut *history.lock().unwrap());
    for key in &history.acked {
        let job = client.get_job(*key).await.unwrap_or_else(|e| panic!("acknowledged job {key} lost: {e}"));
        assert!(["completed", "activatable", "activated"].contains(&job.state.as_str()), "job {key} is {}", job.state);
        if history.completions.contains_key(key) {
            assert_eq!(job.state, "completed", "job {key} was completed for a client");
        }
    }
    for (key, count) in &history.completions {
        assert_eq!(*count, 1, "job {key} was completed {count} times");
    }
    eprintln!("failover after killing node {leader}: {failover:?}; {} creates acknowledged", history.acked.len());
    (leader, failover)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_leader_killed_jobs_survive_then_again_after_restart() {
    let mut cluster = ProcessCluster::start(3, 1, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let (first_victim, _) = kill_leader_under_load(&mut cluster).await;

    cluster.start_node(first_victim);
    cluster.node(first_victim).wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let leader_applied = cluster.status(leader).await.unwrap()[0].applied_index;
    common::eventually(Duration::from_secs(30), "the restarted node to catch up", || {
        let cluster = &cluster;
        async move { cluster.status(first_victim).await.map(|s| s[0].applied_index >= leader_applied).unwrap_or(false) }
    })
    .await;

    let (second_victim, _) = kill_leader_under_load(&mut cluster).await;
    assert_ne!(first_victim, second_victim, "a different node was the leader the second time");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_far_behind_installs_a_snapshot_and_then_leads() {
    let mut args = FAST_RAFT.to_vec();
    args.extend(["--snapshot-every", "50", "--log-keep-after-snapshot", "10"]);
    let mut cluster = ProcessCluster::start(3, 1, 3, &args);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let follower = (leader + 1) % 3;
    cluster.kill(follower);

    let client = cluster.node(leader).client().await;
    let mut states = HashMap::new();
    for n in 0..300 {
        let key = client.create_job("snap", &format!(r#"{{"n":{n}}}"#)).await.unwrap();
        states.insert(key, "activatable");
    }
    let jobs = client.activate("snap", "w", 100, 600_000, 0).await.unwrap();
    for job in jobs {
        client.complete(job.key, job.attempt, r#"{"ok":1}"#).await.unwrap();
        states.insert(job.key, "completed");
    }
    // Purging follows the snapshot asynchronously.
    common::eventually(Duration::from_secs(20), "the leader to purge its log behind a snapshot", || {
        let cluster = &cluster;
        async move { cluster.status(leader).await.is_some_and(|s| s[0].purged_index.unwrap_or(0) > 0) }
    })
    .await;
    let status = cluster.status(leader).await.unwrap();

    cluster.start_node(follower);
    cluster.node(follower).wait_ready().await;
    let target = status[0].applied_index;
    common::eventually(Duration::from_secs(30), "the follower to catch up by snapshot", || {
        let cluster = &cluster;
        async move {
            let caught_up = cluster.status(follower).await.is_some_and(|s| s[0].applied_index >= target);
            caught_up && cluster.metric(follower, "drover_raft_snapshots_installed_total").await >= 1.0
        }
    })
    .await;

    // Move leadership until the restored follower holds it.
    for _ in 0..6 {
        let current = cluster.leader_of(0, Duration::from_secs(20)).await;
        if current == follower {
            break;
        }
        cluster.kill(current);
        cluster.leader_of(0, Duration::from_secs(20)).await;
        cluster.start_node(current);
        cluster.node(current).wait_ready().await;
    }
    assert_eq!(cluster.leader_of(0, Duration::from_secs(20)).await, follower, "the restored follower leads");
    let restored = cluster.node(follower).client().await;
    for (key, state) in &states {
        assert_eq!(restored.get_job(*key).await.unwrap().state, *state, "job {key} on the restored leader");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activation_times_out_on_schedule_under_a_new_leader() {
    let mut cluster = ProcessCluster::start(3, 1, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let survivor = (leader + 1) % 3;
    let client = cluster.node(survivor).client().await;
    let key = client.create_job("timer", "{}").await.unwrap();
    let first = client.activate("timer", "w", 1, 3_000, 0).await.unwrap().remove(0);
    cluster.kill(leader);

    let again = client.activate("timer", "w", 1, 60_000, 20_000).await.unwrap();
    assert_eq!(again.len(), 1, "the job timed out under the new leader");
    assert_eq!(again[0].key, key);
    assert_eq!(again[0].attempt, 2);
    let reactivated_at = again[0].deadline - 60_000;
    assert!(reactivated_at >= first.deadline, "not before its deadline");
    assert!(reactivated_at <= first.deadline + 5_000, "within the election slack of its deadline");
}

/// openraft gives every AppendEntries one heartbeat interval to answer. With
/// a 100 ms heartbeat (the old default), links with a round trip over 100 ms
/// committed nothing at all (found by the fault suite's delay nemesis). With
/// the default timing, writes commit over links 60 ms slow each way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_commit_over_links_slower_than_a_100_ms_round_trip() {
    let slow = |_: usize, port: u16| format!("127.0.0.1:{}", common::delaying_proxy(port, Duration::from_millis(60)));
    let cluster = ProcessCluster::start_with(3, 1, 3, &[], &slow);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(30)).await;
    let client = cluster.node(leader).client().await;
    for n in 0..10 {
        let created = client.create_job("slow-links", &format!(r#"{{"n":{n}}}"#)).await;
        assert!(created.is_ok(), "create {n} over slow links: {created:?}");
    }
}

/// SIGTERM to a node that leads partitions (as Kubernetes stops a pod): it
/// hands each partition's leadership to a caught-up follower before it
/// exits, so the others already follow a new leader, in the next term, when
/// it is gone; without the hand-over they would wait out their election
/// timeout first. The default timing is kept on purpose.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopped_with_sigterm_hands_its_partitions_over_before_it_exits() {
    let mut cluster = ProcessCluster::start(3, 2, 3, &[]);
    cluster.wait_ready().await;
    // A leader elected moments ago cannot hand over: its followers honour its
    // lease (the longest election timeout, 1.2 s here) and refuse any vote
    // (docs/operations.md). Start from one that has held its term past it,
    // as a node that has run for a while has.
    let lease = Duration::from_millis(1_500);
    let settle_by = Instant::now() + Duration::from_secs(30);
    // (leader, (partition, term) of each partition it leads, since when).
    type Leadership = (usize, Vec<(u32, u64)>, Instant);
    let mut seen: Option<Leadership> = None;
    let (leader, led_before) = loop {
        assert!(Instant::now() < settle_by, "partition 0's leadership did not settle within 30 s: {seen:?}");
        let leader = cluster.leader_of(0, Duration::from_secs(30)).await;
        let led: Vec<(u32, u64)> = cluster
            .status(leader)
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|s| s.role == "leader")
            .map(|s| (s.partition, s.term))
            .collect();
        match &seen {
            // A status read that failed lists nothing: not a leadership to settle on.
            _ if led.is_empty() => seen = None,
            Some((l, before, since)) if *l == leader && *before == led && since.elapsed() > lease => {
                break (leader, led);
            }
            Some((l, before, _)) if *l == leader && *before == led => {}
            _ => seen = Some((leader, led, Instant::now())),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!led_before.is_empty());
    let client = Client::connect(&cluster.gateway((leader + 1) % 3)).await.unwrap();
    client.create_job("handover", "{}").await.expect("a create before");

    let node = cluster.nodes[leader].as_mut().expect("started");
    node.signal(libc::SIGTERM);
    let status = node.exited(Duration::from_secs(30)).await;
    assert!(status.success(), "a SIGTERMed node exits cleanly: {status}");
    cluster.nodes[leader] = None;

    // At once, no waiting: a surviving node already leads each partition in a
    // newer term. That is what a hand-over saves (an election timeout).
    let live = cluster.live();
    for (partition, term) in &led_before {
        let mut new_leader = None;
        for &other in &live {
            let statuses = cluster.status(other).await.expect("a surviving node answers");
            let now = statuses.iter().find(|s| s.partition == *partition).expect("its replica");
            if now.role == "leader" && now.term > *term {
                new_leader = Some(other as u64);
            }
        }
        let new_leader = new_leader.unwrap_or_else(|| {
            panic!("no surviving node leads partition {partition} in a term after {term} when node {leader} has exited")
        });
        // The other survivor hears of it with the new leader's first append,
        // a round trip later.
        for &other in &live {
            eventually(Duration::from_secs(5), &format!("node {other} to follow node {new_leader}"), || async {
                let statuses = cluster.status(other).await.unwrap_or_default();
                statuses.iter().any(|s| s.partition == *partition && s.leader == Some(new_leader))
            })
            .await;
        }
    }
    client.create_job("handover", "{}").await.expect("a create after, under the new leader");
}

/// Whether node `partition` leads partition `partition` (its preferred
/// leader in a 3-node cluster of 3 partitions).
async fn led_by_preferred(cluster: &ProcessCluster, partition: u32) -> bool {
    cluster.leader_of(partition, Duration::from_secs(30)).await == partition as usize
}

/// Leader balance: each partition's leadership goes to its preferred replica
/// (node p for partition p here), and comes back to it after a failover
/// once it has caught up, so no node ends up leading every partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_returns_to_each_partitions_preferred_node_after_a_failover() {
    let mut cluster = ProcessCluster::start(3, 3, 3, &["--balance-leaders", "true"]);
    cluster.wait_ready().await;
    let limit = Duration::from_secs(40);
    for partition in 0..3 {
        eventually(limit, &format!("node {partition} to lead partition {partition}"), || {
            led_by_preferred(&cluster, partition)
        })
        .await;
    }
    let client = Client::connect(&cluster.gateway(0)).await.unwrap();
    client.create_job("balance", "{}").await.expect("a create before");

    // Node 1 dies: another node takes partition 1 over.
    cluster.kill(1);
    let interim = cluster.leader_of(1, Duration::from_secs(30)).await;
    assert_ne!(interim, 1);
    for _ in 0..20 {
        client.create_job("balance", "{}").await.expect("a create while node 1 is down");
    }
    // Back, node 1 catches up; the interim leader hands partition 1 back.
    cluster.start_node(1);
    cluster.node(1).wait_ready().await;
    eventually(limit, "node 1 to lead partition 1 again", || led_by_preferred(&cluster, 1)).await;
    let handovers = cluster.metric(interim, "drover_leader_handovers_total").await;
    assert!(handovers >= 1.0, "the interim leader counts its hand-over: {handovers}");
    for partition in [0, 2] {
        assert_eq!(cluster.leader_of(partition, limit).await, partition as usize, "partition {partition} stayed");
    }
    client.create_job("balance", "{}").await.expect("a create after, under the preferred leader");
}

/// A preferred node that stopped on SIGTERM (handing its partition over
/// first, so the new leader last saw its log complete) is not handed
/// leadership back while it is down: the leader's view of its log position
/// outlives it, so only a replica that answers now counts as up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_hands_nothing_to_a_preferred_node_that_stopped() {
    let mut cluster = ProcessCluster::start(3, 3, 3, &["--balance-leaders", "true"]);
    cluster.wait_ready().await;
    let limit = Duration::from_secs(40);
    // Node 1 leads partition 1 in one term for longer than its followers'
    // lease (1.2 s), so that the SIGTERM hand-over can succeed.
    let lease = Duration::from_millis(1_500);
    let deadline = Instant::now() + limit;
    let mut held: Option<(u64, Instant)> = None;
    let term = loop {
        assert!(Instant::now() < deadline, "node 1 did not hold partition 1's leadership for 1.5 s within 40 s");
        let term = replica_status(&cluster, 1, 1).await.filter(|s| s.role == "leader").map(|s| s.term);
        match (term, held) {
            (Some(term), Some((since_term, since))) if term == since_term && since.elapsed() > lease => break term,
            (Some(term), Some((since_term, _))) if term == since_term => {}
            (Some(term), _) => held = Some((term, Instant::now())),
            (None, _) => held = None,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let node = cluster.nodes[1].as_mut().expect("node 1 runs");
    node.signal(libc::SIGTERM);
    let status = node.exited(Duration::from_secs(30)).await;
    assert!(status.success(), "node 1 stops cleanly: {status}");
    cluster.nodes[1] = None;
    // Handed over, not elected after a timeout: a survivor leads in a newer
    // term already (else the leader's view of node 1 would not outlive it,
    // and this test would show nothing).
    let mut interim = None;
    for other in cluster.live() {
        if replica_status(&cluster, other, 1).await.is_some_and(|s| s.role == "leader" && s.term > term) {
            interim = Some(other);
        }
    }
    let interim = interim.expect("node 1's SIGTERM handed partition 1 to a survivor");

    // The interim leader settles (5 s), then looks every second; a look that
    // took node 1 for up would try and fail at once (nothing listens there).
    // An absence, so a fixed window: the first look is due within 6 s.
    tokio::time::sleep(Duration::from_secs(9)).await;
    let changes = cluster.metric(interim, "drover_partition_leader_changes_total").await;
    assert!(changes > 0.0, "node {interim}'s metrics answer and count its leadership");
    let failed = cluster.metric(interim, "drover_leader_handovers_failed_total").await;
    assert_eq!(failed, 0.0, "node {interim} tried to hand partition 1 to the stopped node 1");
    assert_eq!(cluster.leader_of(1, limit).await, interim, "partition 1 stays with node {interim}");
}

/// Node `node`'s view of its replica of `partition`, if it answers.
async fn replica_status(cluster: &ProcessCluster, node: usize, partition: u32) -> Option<PartitionStatus> {
    cluster.status(node).await?.into_iter().find(|s| s.partition == partition)
}

/// A leader tells its followers of a commit soon after it, with the next
/// append or, when none comes, a request of its own a few milliseconds later;
/// never only with the next heartbeat, here seconds away.
#[tokio::test]
async fn followers_apply_a_lone_create_long_before_the_next_heartbeat() {
    let cluster = ProcessCluster::start(3, 1, 3, &["--heartbeat-ms", "3000", "--election-timeout-ms", "7000"]);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(60)).await;
    let client = cluster.node(leader).client().await;
    for n in 0..3 {
        let marker = format!("lone-{n}");
        client.create_job("lone", &format!(r#"{{"marker":"{marker}"}}"#)).await.unwrap();
        let created = Instant::now();
        for follower in cluster.live().into_iter().filter(|id| *id != leader) {
            eventually(
                Duration::from_millis(1_500),
                "a follower to apply the create before the next heartbeat",
                || {
                    let cluster = &cluster;
                    let marker = marker.clone();
                    async move { !cluster.jobs_with(follower, &marker).await.is_empty() }
                },
            )
            .await;
        }
        eprintln!("create {n} applied on both followers {:?} after its acknowledgement", created.elapsed());
    }
}

/// Creates `count` jobs through `gateway` and waits until node `id` has
/// applied the last of them.
async fn create_and_see_applied(cluster: &ProcessCluster, gateway: usize, id: usize, marker: &str, count: usize) {
    let client = cluster.node(gateway).client().await;
    for n in 0..count {
        client.create_job("appends", &format!(r#"{{"marker":"{marker}-{n}"}}"#)).await.unwrap();
    }
    let last = format!("{marker}-{}", count - 1);
    eventually(Duration::from_secs(10), "the follower to apply the last create", || {
        let cluster = &cluster;
        let last = last.clone();
        async move { !cluster.jobs_with(id, &last).await.is_empty() }
    })
    .await;
}

/// A leader sends a follower its appends as messages on one long-lived
/// stream, not a request each; after the follower is killed and restarted,
/// the leader's stream to the old process fails and a new one carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_go_over_one_stream_per_follower_and_resume_after_it_restarts() {
    let mut cluster = ProcessCluster::start(3, 1, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let follower = cluster.other_than(leader);
    create_and_see_applied(&cluster, leader, follower, "streamed", 40).await;
    let streams = cluster.answered(follower, "AppendEntriesStream").await;
    let appends = cluster.answered(follower, "AppendEntries").await;
    assert!(streams >= 1.0, "the follower was sent no append stream");
    assert!(streams <= 3.0, "{streams} append streams opened for one leader's appends");
    assert!(appends >= 40.0, "only {appends} appends reached the follower for 40 creates");

    cluster.kill(follower);
    cluster.start_node(follower);
    cluster.node(follower).wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    create_and_see_applied(&cluster, leader, follower, "after-restart", 10).await;
    assert!(cluster.answered(follower, "AppendEntriesStream").await >= 1.0, "the restarted follower got no stream");
}

/// A node that has no append stream (an older version, here a failpoint on
/// every node) answers its opening UNIMPLEMENTED; its peers then send their
/// appends unary, and the cluster commits as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_go_unary_to_a_peer_without_the_append_stream() {
    let cluster = ProcessCluster::start_with_failpoints("append_stream_unimplemented=1000000", 1, FAST_RAFT);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let follower = cluster.other_than(leader);
    create_and_see_applied(&cluster, leader, follower, "unary", 20).await;
    assert_eq!(cluster.answered(follower, "AppendEntriesStream").await, 0.0, "a refused stream was counted as opened");
    assert!(cluster.answered(follower, "unknown").await >= 1.0, "the follower refused no stream");
    assert!(cluster.answered(follower, "AppendEntries").await >= 20.0, "the appends did not arrive unary");
}

/// Creates `count` jobs of `job_type` through the gateway of a node that does
/// not lead partition 0 (the only one), so each is forwarded to the leader
/// (one that has held its term a second, past any hand-over to the preferred
/// replica); the leader's node, once every job reads back as created.
async fn create_through_another_gateway(cluster: &ProcessCluster, job_type: &str, count: usize) -> usize {
    let leader = cluster.held_leader(0, Duration::from_secs(1)).await;
    let gateway = Client::connect(&cluster.node(cluster.other_than(leader)).grpc).await.unwrap();
    for n in 0..count {
        let key = gateway.create_job(job_type, &format!(r#"{{"n":{n}}}"#)).await.unwrap();
        assert_eq!(gateway.get_job(key).await.unwrap().state, "activatable", "job {n} was created");
    }
    leader
}

/// Commands a gateway forwards to another node's leader go as messages on
/// the node's one delivery stream to it, not a call each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_go_on_one_delivery_stream_to_the_leader() {
    let cluster = ProcessCluster::start(3, 1, 3, FAST_RAFT);
    cluster.wait_ready().await;
    let leader = create_through_another_gateway(&cluster, "forwarded", 20).await;
    // Nothing else opens one to the leader: it leads the only partition, and
    // no worker's stream is there for it to be pushed to.
    let streams = cluster.answered(leader, "Deliver").await;
    assert!((1.0..=2.0).contains(&streams), "{streams} delivery streams opened to the leader");
    assert!(cluster.answered(leader, "Forward").await >= 20.0, "the 20 creates were not forwarded");
}

/// A leader without delivery streams (an older node, here a failpoint on
/// every node) answers UNIMPLEMENTED; gateways then forward with calls, and
/// the commands run as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_go_as_calls_to_a_leader_without_delivery_streams() {
    let cluster = ProcessCluster::start_with_failpoints("deliver_unimplemented=1000000", 1, FAST_RAFT);
    cluster.wait_ready().await;
    let leader = create_through_another_gateway(&cluster, "called", 20).await;
    assert_eq!(cluster.answered(leader, "Deliver").await, 0.0, "a refused stream was counted as opened");
    assert!(cluster.answered(leader, "unknown").await >= 1.0, "the leader refused no stream");
    assert!(cluster.answered(leader, "Forward").await >= 20.0, "the forwards did not arrive as calls");
}

/// A follower whose appends outlast the leader's append timeout (its WAL
/// syncs held) answers them late on the stream. No late reply is taken for a
/// later append's, which would have the leader count the follower as holding
/// entries it had not yet written; and the follower ends with every entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_append_reply_is_never_taken_for_a_later_append() {
    // None armed at start: the test arms one on a follower.
    let cluster = ProcessCluster::start_with_failpoints("", 1, FAST_RAFT);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let follower = cluster.other_than(leader);
    create_and_see_applied(&cluster, leader, follower, "before-hold", 5).await;
    // Appends time out after a heartbeat (50 ms); each held sync lasts 400 ms.
    let path = "/actuator/failpoints/wal_sync_hold?count=4&hold_ms=400";
    let armed = common::http_request("PUT", &cluster.node(follower).admin, path).await.unwrap();
    assert_eq!(armed.0, 200, "{armed:?}");
    create_and_see_applied(&cluster, leader, follower, "during-hold", 30).await;
    let appends = cluster.metric(leader, r#"drover_raft_rpc_seconds_count{rpc="append_entries"}"#).await;
    let quick = cluster.metric(leader, r#"drover_raft_rpc_seconds_bucket{rpc="append_entries",le="0.05"}"#).await;
    assert!(appends > quick, "no append outlasted the 50 ms timeout: the held syncs did not hold them");
    let mismatches = cluster.metric(leader, "drover_raft_append_stream_mismatches_total").await;
    assert_eq!(mismatches, 0.0, "the leader read {mismatches} append replies meant for earlier appends");
}
