//! Safety under faults on three real nodes: a create whose answer is lost
//! while its leader dies makes one job; repeated completions and failures
//! answer as the first did; a create whose every answer is lost answers
//! "outcome unknown"; and a leader that dies right after acknowledging leaves nothing
//! stuck for the next one.
//!
//! Faults between replication and reply are injected with failpoints
//! (`DROVER_FAILPOINTS`, see `drover::failpoints`), armed in every node of
//! the test's cluster; leaders are killed with SIGKILL.

mod common;

use std::time::{Duration, Instant};

use common::{eventually, faketime, http_get, http_request, ProcessCluster};
use drover::client::Client;
use drover::proto::gateway::{ActivateJobsRequest, CreateJobRequest, GetJobRequest, StreamActivatedJobsRequest};
use tonic::Code;

const FAST_RAFT: &[&str] = &["--heartbeat-ms", "50", "--election-timeout-ms", "300"];

/// Starts a cluster whose nodes have `failpoints` armed.
fn cluster_with_failpoints(failpoints: &str, partitions: u32) -> ProcessCluster {
    ProcessCluster::start_with_failpoints(failpoints, partitions, FAST_RAFT)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_is_lost_while_its_leader_dies_makes_one_job() {
    // The gateway loses the leader's answer, and holds 3 s before it sends again.
    let mut cluster = cluster_with_failpoints("forward_lose_reply=1@3000", 1);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let gateway = cluster.other_than(leader);
    let client = Client::connect(&cluster.node(gateway).grpc).await.unwrap();

    let create = tokio::spawn(async move {
        let mut request = tonic::Request::new(CreateJobRequest {
            r#type: "refund".into(),
            variables: r#"{"marker":"lost-answer"}"#.into(),
            ..Default::default()
        });
        request.set_timeout(Duration::from_secs(30));
        client.raw().create_job(request).await
    });
    // The create is committed and applied on the leader: kill it before the
    // gateway hears anything.
    eventually(Duration::from_secs(10), "the create to apply on the leader", || {
        let cluster = &cluster;
        async move { !cluster.jobs_with(leader, "lost-answer").await.is_empty() }
    })
    .await;
    cluster.kill(leader);

    let answer = create.await.unwrap().expect("the create is acknowledged once a new leader answers").into_inner();
    assert!(!answer.created, "the re-sent create found the first job instead of making one: {answer:?}");
    let new_leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let jobs = cluster.jobs_with(new_leader, "lost-answer").await;
    assert_eq!(jobs.len(), 1, "one create made {} jobs: {jobs:?}", jobs.len());
    assert_eq!(jobs[0]["key"].as_u64(), Some(answer.key));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_completions_and_failures_answer_as_the_first_did() {
    let cluster = cluster_with_failpoints("forward_lose_reply=2", 1);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let direct = Client::connect(&cluster.node(leader).grpc).await.unwrap();
    let through = Client::connect(&cluster.node(cluster.other_than(leader)).grpc).await.unwrap();
    for n in 0..2 {
        direct.create_job("repeat", &format!(r#"{{"n":{n}}}"#)).await.unwrap();
    }
    let jobs = direct.activate("repeat", "w", 2, 600_000, 0).await.unwrap();
    assert_eq!(jobs.len(), 2);
    let (done, failed) = (&jobs[0], &jobs[1]);

    // The first answer of each is lost on the way back; the gateway sends again.
    through.complete(done.key, done.attempt, r#"{"ok":true}"#).await.expect("a completion that took effect is OK");
    through.fail(failed.key, failed.attempt, 2, "flaky", 0).await.expect("a failure that took effect is OK");
    // A worker's own retry is answered the same way.
    direct.complete(done.key, done.attempt, r#"{"ok":true}"#).await.expect("completing twice is OK");
    direct.fail(failed.key, failed.attempt, 2, "flaky", 0).await.expect("failing one attempt twice is OK");

    let job = direct.get_job(failed.key).await.unwrap();
    assert_eq!((job.state.as_str(), job.retries), ("activatable", 2), "the repeat changed nothing");
    // Another attempt's completion is still refused.
    let stale = direct.complete(done.key, done.attempt + 1, "{}").await.unwrap_err();
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_every_answer_is_lost_answers_outcome_unknown() {
    let cluster = cluster_with_failpoints("forward_lose_reply=1000", 1);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let through = Client::connect(&cluster.node(cluster.other_than(leader)).grpc).await.unwrap();
    let mut request = tonic::Request::new(CreateJobRequest {
        r#type: "unknown".into(),
        variables: r#"{"marker":"every-answer-lost"}"#.into(),
        ..Default::default()
    });
    request.set_timeout(Duration::from_secs(2));
    let error = through.raw().create_job(request).await.unwrap_err();
    // Not UNAVAILABLE: that would tell the producer nothing happened.
    assert_eq!(error.code(), Code::DeadlineExceeded, "{error:?}");
    assert!(error.message().contains("outcome is unknown"), "{}", error.message());
    // It did happen, once, however often the gateway sent it.
    let jobs = cluster.jobs_with(leader, "every-answer-lost").await;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activation_whose_answer_is_lost_is_sent_again_and_its_jobs_come_back() {
    let cluster = cluster_with_failpoints("forward_lose_reply=1", 1);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let direct = Client::connect(&cluster.node(leader).grpc).await.unwrap();
    let through = Client::connect(&cluster.node(cluster.other_than(leader)).grpc).await.unwrap();
    let first = direct.create_job("lost-activation", "{}").await.unwrap();
    let second = direct.create_job("lost-activation", "{}").await.unwrap();

    let request = ActivateJobsRequest {
        r#type: "lost-activation".into(),
        worker: "w".into(),
        timeout: 1_000,
        max_jobs_to_activate: 1,
        ..Default::default()
    };
    let mut answers = through.raw().activate_jobs(request).await.expect("the re-sent activation answers").into_inner();
    let jobs = answers.message().await.unwrap().expect("one answer").jobs;
    assert_eq!(jobs.iter().map(|j| j.key).collect::<Vec<_>>(), vec![second], "the re-send took the next job");
    // The first activation's job is back when that activation times out.
    let again = direct.activate("lost-activation", "w", 1, 60_000, 10_000).await.unwrap();
    assert_eq!((again[0].key, again[0].attempt), (first, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_killed_right_after_acknowledging_leaves_nothing_stuck() {
    let mut cluster = cluster_with_failpoints("", 1);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    // The leader holds its pushes long enough to be killed before any.
    let armed = http_request(
        "PUT",
        &cluster.node(leader).admin,
        "/actuator/failpoints/leader_push_hold?count=100&hold_ms=60000",
    )
    .await
    .unwrap();
    assert_eq!(armed.0, 200, "{armed:?}");
    let gateway = cluster.other_than(leader);
    let address = cluster.node(gateway).grpc.clone();
    let client = Client::connect(&address).await.unwrap();
    let mut stream = client
        .raw()
        .stream_activated_jobs(StreamActivatedJobsRequest {
            r#type: "tail".into(),
            worker: "w".into(),
            timeout: 2_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // The stream is registered with the leader before the create.
    eventually(Duration::from_secs(10), "the stream to register with the leader", || {
        let admin = cluster.node(leader).admin.clone();
        async move {
            let Ok((_, body)) = http_get(&admin, "/actuator/jobstreams").await else { return false };
            body.contains("\"tail\"")
        }
    })
    .await;

    // The followers apply what the leader commits next only after 3 s: the
    // one that takes over starts leading before it has applied the tail of
    // the term it follows.
    for follower in cluster.live().into_iter().filter(|n| *n != leader) {
        let path = "/actuator/failpoints/apply_hold?count=1&hold_ms=3000";
        let armed = http_request("PUT", &cluster.node(follower).admin, path).await.unwrap();
        assert_eq!(armed.0, 200, "{armed:?}");
    }
    // The create commits with the activation for the stream in the same
    // entry; the leader acknowledges and dies before it pushes. Nothing else
    // is written to the partition.
    let key = Client::connect(&cluster.node(leader).grpc).await.unwrap().create_job("tail", "{}").await.unwrap();
    cluster.kill(leader);

    // The next leader must time the activation out and push the job.
    let started = Instant::now();
    let job = tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .unwrap_or_else(|_| panic!("job {key} was not delivered within 30 s of the leader's death"))
        .expect("the stream stays open")
        .expect("a job arrives");
    assert_eq!(job.key, key);
    assert!(job.attempt >= 2, "delivered by the next leader after the first activation timed out: {job:?}");
    client.complete(job.key, job.attempt, "{}").await.unwrap();
    eprintln!("delivered {:?} after the kill", started.elapsed());
}

/// A leader stopped with SIGTERM while a push is on its way finishes it
/// first: the push reaches a gateway whose stream has closed, and the job it
/// carried is yielded (by the draining leader, or failing that at the next
/// one), so the next worker has it at once, not at the end of its activation
/// timeout (a minute here). Either path passes; the build without both fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_stopping_with_a_push_in_flight_yields_what_the_gateway_refused() {
    let mut cluster = cluster_with_failpoints("", 1);
    cluster.wait_ready().await;
    // A hand-over needs a leader that has held its term past its followers'
    // lease (the longest election timeout).
    let leader = cluster.held_leader(0, Duration::from_secs(1)).await;
    let gateway = cluster.other_than(leader);
    let grpc = cluster.node(gateway).grpc.clone();
    let worker = |name: &str| StreamActivatedJobsRequest {
        r#type: "drain".into(),
        worker: name.into(),
        timeout: 60_000,
        ..Default::default()
    };
    let client = Client::connect(&grpc).await.unwrap();
    let first = client.raw().stream_activated_jobs(worker("first")).await.unwrap().into_inner();
    let registered = |at: usize, yes: bool| {
        let admin = cluster.node(at).admin.clone();
        async move {
            let Ok((_, body)) = http_get(&admin, "/actuator/jobstreams").await else { return false };
            body.contains("\"drain\"") == yes
        }
    };
    eventually(Duration::from_secs(10), "the first worker's stream to register with the leader", || {
        registered(leader, true)
    })
    .await;

    // The create commits with the activation for the first worker's stream;
    // the leader holds the push 1.5 s, in which the worker goes away and the
    // leader is told to stop.
    let path = "/actuator/failpoints/leader_push_hold?count=1&hold_ms=1500";
    let armed = http_request("PUT", &cluster.node(leader).admin, path).await.unwrap();
    assert_eq!(armed.0, 200, "{armed:?}");
    let key = client.create_job("drain", "{}").await.unwrap();
    let held_since = Instant::now();
    drop(first);
    eventually(Duration::from_secs(1), "the gateway to drop the first worker's stream", || registered(gateway, false))
        .await;
    // Otherwise the push went out to a closed stream before the stop, and
    // this test would show nothing about stopping.
    assert!(held_since.elapsed() < Duration::from_millis(1_500), "the stop came after the held push went out");
    let node = cluster.nodes[leader].as_mut().expect("started");
    node.signal(libc::SIGTERM);
    let status = node.exited(Duration::from_secs(30)).await;
    assert!(status.success(), "a SIGTERMed node exits cleanly: {status}");
    cluster.nodes[leader] = None;

    let mut second = client.raw().stream_activated_jobs(worker("second")).await.unwrap().into_inner();
    let job = tokio::time::timeout(Duration::from_secs(15), second.message())
        .await
        .unwrap_or_else(|_| panic!("job {key} was not delivered within 15 s: left for its activation timeout"))
        .expect("the stream stays open")
        .expect("a job arrives");
    assert_eq!(job.key, key);
    let history = client.raw().get_job_history(GetJobRequest { key, ..Default::default() }).await.unwrap();
    let kinds: Vec<(String, String)> = history.into_inner().events.into_iter().map(|e| (e.kind, e.reason)).collect();
    assert!(
        kinds.iter().any(|(kind, reason)| kind == "yielded" && reason == "no client ready"),
        "the stopping leader yielded the job the gateway refused: {kinds:?}"
    );
    assert!(!kinds.iter().any(|(kind, _)| kind == "timed_out"), "no activation timed out: {kinds:?}");
    client.complete(job.key, job.attempt, "{}").await.unwrap();
}

/// Seconds the node's wall clock is ahead of ours, from its HTTP Date header.
async fn wall_clock_offset(admin: &str) -> Option<i64> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(admin).await.ok()?;
    let request = format!("GET /health HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    // "date: Mon, 23 Nov 2026 15:48:20 GMT": compare the time of day.
    let date = response.lines().find_map(|l| l.strip_prefix("date: ").or_else(|| l.strip_prefix("Date: ")))?;
    let clock: Vec<i64> = date.split_whitespace().nth(4)?.split(':').filter_map(|p| p.parse().ok()).collect();
    let theirs = clock.first()? * 3600 + clock.get(1)? * 60 + clock.get(2)?;
    let ours = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_secs() % 86_400) as i64;
    Some((theirs - ours + 86_400 + 43_200) % 86_400 - 43_200)
}

/// Sets every node's wall clock `seconds` ahead (libfaketime reads the file
/// at every clock read) and checks that the nodes see it.
async fn step_wall_clocks(cluster: &ProcessCluster, file: &std::path::Path, offset: &str, seconds: i64) {
    std::fs::write(file, format!("{offset}\n")).unwrap();
    if seconds <= 0 {
        // HTTP servers cache their Date header until their clock passes the
        // next second, so a step back cannot be seen there; the file is read
        // at every clock read, so it holds from here on.
        return;
    }
    for id in cluster.live() {
        let admin = cluster.node(id).admin.clone();
        eventually(Duration::from_secs(15), &format!("node {id}'s wall clock to read {offset}"), || {
            let admin = admin.clone();
            async move { wall_clock_offset(&admin).await.is_some_and(|o| (o - seconds).abs() < 120) }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wall_clock_steps_move_no_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let clock = dir.path().join("faketime");
    std::fs::write(&clock, "+0\n").unwrap();
    // Every node's wall clock (not its monotonic clock) follows the file.
    for (key, value) in faketime::env(&clock).expect("libfaketime: run scripts/setup.sh") {
        std::env::set_var(key, value);
    }
    std::env::set_var("FAKETIME_NO_CACHE", "1");
    let cluster = ProcessCluster::start(3, 1, 3, FAST_RAFT);
    for key in ["LD_PRELOAD", "FAKETIME_TIMESTAMP_FILE"] {
        std::env::remove_var(key);
    }
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let client = Client::connect(&cluster.node(leader).grpc).await.unwrap();

    // One job held for ten minutes, one completed (its record kept ten minutes).
    let held = client.create_job("clock", "{}").await.unwrap();
    let held_attempt = client.activate("clock", "w", 1, 600_000, 0).await.unwrap()[0].attempt;
    let done = client.create_job("clock", "{}").await.unwrap();
    let job = client.activate("clock", "w", 1, 600_000, 0).await.unwrap().remove(0);
    client.complete(job.key, job.attempt, "{}").await.unwrap();

    // Every wall clock jumps an hour ahead; writes go on.
    step_wall_clocks(&cluster, &clock, "+1h", 3600).await;
    let after = client.create_job("clock-after", "{}").await.unwrap();
    let job = client.get_job(held).await.unwrap();
    assert_eq!((job.state.as_str(), job.attempt), ("activated", held_attempt), "the step timed out a held job");
    let job = client.get_job(done).await.expect("the step pruned a retained final record");
    assert_eq!(job.state, "completed");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let created = client.get_job(after).await.unwrap().created_at;
    assert!((created - now).abs() < 60_000, "job time followed the wall clock: created {created}, now {now}");

    // The clocks are set right again: deadlines still fire on time.
    step_wall_clocks(&cluster, &clock, "+0", 0).await;
    let quick = client.create_job("clock-quick", "{}").await.unwrap();
    assert_eq!(client.activate("clock-quick", "w", 1, 2_000, 0).await.unwrap().len(), 1);
    eventually(Duration::from_secs(20), "a 2 s activation to time out", || {
        let client = &client;
        async move { client.get_job(quick).await.is_ok_and(|j| j.state == "activatable") }
    })
    .await;
}

/// A leader killed and started again at once leads again (in a later term)
/// before it applies any new entry: its followers wait long for a leader that
/// went quiet, and it stands for election far sooner than they do. So its
/// partition's time starts from wall clocks. Its own is an hour ahead: the
/// partition's time must follow the majority's clocks, not its own, or every
/// deadline would pass at once and every held job be handed out again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_leader_whose_wall_clock_is_an_hour_ahead_moves_no_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (right, ahead) = (dir.path().join("right"), dir.path().join("ahead"));
    std::fs::write(&right, "+0\n").unwrap();
    std::fs::write(&ahead, "+1h\n").unwrap();
    for (key, value) in faketime::env(&right).expect("libfaketime: run scripts/setup.sh") {
        std::env::set_var(key, value);
    }
    std::env::set_var("FAKETIME_NO_CACHE", "1");
    // Followers wait 15-20 s for a leader that went quiet (their lease, 10 s,
    // and then their election timeout); the killed leader comes back standing
    // every 1-2 s, and leads again as soon as their lease has run out.
    std::env::set_var("DROVER_ELECTION_TIMEOUT_MS", "5000");
    let mut cluster = ProcessCluster::start(3, 1, 3, &["--heartbeat-ms", "100"]);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(30)).await;
    let client = Client::connect(&cluster.gateway((leader + 1) % 3)).await.unwrap();
    let held = client.create_job("clock", "{}").await.unwrap();
    let held_attempt = client.activate("clock", "w", 1, 600_000, 0).await.unwrap()[0].attempt;

    cluster.kill(leader);
    std::env::set_var("FAKETIME_TIMESTAMP_FILE", &ahead);
    std::env::set_var("DROVER_ELECTION_TIMEOUT_MS", "1000");
    cluster.start_node(leader);
    for key in ["LD_PRELOAD", "FAKETIME_TIMESTAMP_FILE", "DROVER_ELECTION_TIMEOUT_MS"] {
        std::env::remove_var(key);
    }
    assert_eq!(cluster.leader_of(0, Duration::from_secs(30)).await, leader, "the restarted node leads again");

    let after = client.create_job("clock-after", "{}").await.expect("a create under the restarted leader");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let created = client.get_job(after).await.unwrap().created_at;
    assert!(
        (created - now).abs() < 60_000,
        "the partition's time followed the restarted leader's clock: created {created}, now {now}"
    );
    let job = client.get_job(held).await.unwrap();
    assert_eq!((job.state.as_str(), job.attempt), ("activated", held_attempt), "a held job timed out");
}

/// A leader replicates its appends while its own sync runs, and counts itself
/// only once that sync is done: with its disk stalled, its followers alone
/// commit a create, and when it dies with the sync still held, the job is
/// theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_whose_disk_stalls_commits_with_its_followers_and_loses_nothing_when_killed() {
    let mut cluster = cluster_with_failpoints("", 1);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let client = Client::connect(&cluster.node(leader).grpc).await.unwrap();
    client.create_job("stall", r#"{"marker":"before"}"#).await.expect("a create before the stall");

    // The leader's next WAL sync, and every one queued behind it, waits a minute.
    let path = "/actuator/failpoints/wal_sync_hold?count=1&hold_ms=60000";
    let armed = http_request("PUT", &cluster.node(leader).admin, path).await.unwrap();
    assert_eq!(armed.0, 200, "{armed:?}");
    let create = client.create_job("stall", r#"{"marker":"stalled-leader"}"#);
    let key = tokio::time::timeout(Duration::from_secs(20), create)
        .await
        .expect("a create acknowledged within 20 s while the leader's sync is held for 60 s")
        .expect("the create succeeds");
    cluster.kill(leader);
    for node in cluster.live() {
        eventually(Duration::from_secs(20), "the job on every surviving node", || {
            let cluster = &cluster;
            async move { !cluster.jobs_with(node, "stalled-leader").await.is_empty() }
        })
        .await;
    }
    let survivor = Client::connect(&cluster.node(cluster.live()[0]).grpc).await.unwrap();
    let started = Instant::now();
    loop {
        let activated = survivor.activate("stall", "w", 10, 60_000, 1_000).await;
        match activated {
            Ok(jobs) if jobs.iter().any(|j| j.key == key) => break,
            Ok(_) => {}
            // No leader yet.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "job {key}, acknowledged under the stalled leader, was not activated after its death"
        );
    }
}

/// A leader replicates while its own sync runs, so after a power cut its log
/// may lack entries its followers hold, committed. Restarted, it must not lead
/// on in the term it led (it would append other entries under those entries'
/// log ids, and a follower holding them would take them for a match): after
/// every node stops and the old leader comes back first, the partition is led
/// in a later term, and the jobs acknowledged before are all there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_restarted_with_its_cluster_leads_only_in_a_later_term() {
    let mut cluster = cluster_with_failpoints("", 1);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let client = Client::connect(&cluster.node(leader).grpc).await.unwrap();
    for _ in 0..5 {
        client.create_job("restart", r#"{"marker":"before-restart"}"#).await.expect("a create");
    }
    let term_of = |statuses: Vec<common::PartitionStatus>| {
        statuses.into_iter().find(|s| s.partition == 0 && s.role == "leader").map(|s| s.term)
    };
    let term = term_of(cluster.status(leader).await.expect("the leader answers")).expect("it leads partition 0");

    // The followers stop first, so the leader is still leading when it stops.
    for id in (0..3).filter(|id| *id != leader) {
        cluster.kill(id);
    }
    cluster.kill(leader);
    cluster.start_node(leader);
    for id in (0..3).filter(|id| *id != leader) {
        cluster.start_node(id);
    }
    cluster.wait_ready().await;

    let now_leading = cluster.leader_of(0, Duration::from_secs(30)).await;
    let new_term = term_of(cluster.status(now_leading).await.expect("the leader answers")).expect("it leads");
    assert!(
        new_term > term,
        "node {now_leading} leads partition 0 in term {new_term} after the restart; node {leader} led term {term} \
         before it: a restarted leader must not lead on in its old term"
    );
    for node in cluster.live() {
        eventually(Duration::from_secs(20), "the five jobs on every node", || {
            let cluster = &cluster;
            async move { cluster.jobs_with(node, "before-restart").await.len() == 5 }
        })
        .await;
    }
}

/// Job tokens last a grace past their activation's deadline, which is in the
/// partition's time; they are judged by the wall clock of the gateway that
/// sees them. A gateway whose clock is an hour ahead of the partition's must
/// mint tokens that still work on it: their expiry is the deadline's distance
/// from the partition's time, from its own now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_tokens_minted_by_a_gateway_whose_clock_is_an_hour_ahead_work_there() {
    job_tokens_of_a_gateway_an_hour_ahead(3, 2, false).await;
}

/// The same on a gateway that hosts no replica of the job's partition: it
/// knows the partition's time from a node that does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_tokens_minted_by_a_gateway_ahead_without_the_partition_work_there() {
    // One partition on three of four nodes: the fourth hosts none.
    let locations = (0..4).map(|n| (n, drover::placement::Location::default())).collect();
    let placement = drover::placement::place(1, 3, &locations);
    let without = (0..4u64).find(|n| !placement[0].contains(n)).expect("a node without the partition");
    job_tokens_of_a_gateway_an_hour_ahead(4, without as usize, true).await;
}

/// A cluster of `size` nodes (one partition, replication factor 3) whose node
/// `ahead` runs an hour ahead: a job token its gateway mints completes the job
/// through it. `learns`: the gateway hosts no replica and learns the
/// partition's time from a peer within seconds, so a token minted before
/// that may expire early; with a replica the first token must work.
async fn job_tokens_of_a_gateway_an_hour_ahead(size: usize, ahead_node: usize, learns: bool) {
    let dir = tempfile::tempdir().unwrap();
    let secret = drover::auth::keys::generate_secret();
    let tokens = dir.path().join("tokens.toml");
    let entry = drover::auth::keys::token_entry("admin", &secret, &["*".into()], &["*".into()]);
    std::fs::write(&tokens, entry).unwrap();
    let key_file = dir.path().join("job-token.key");
    std::fs::write(&key_file, drover::auth::keys::generate_secret()).unwrap();
    let ahead = dir.path().join("ahead");
    std::fs::write(&ahead, "+1h\n").unwrap();
    let (tokens, key_file) = (tokens.display().to_string(), key_file.display().to_string());
    let mut cluster = ProcessCluster::unstarted(
        size,
        1,
        3,
        &[
            "--tokens-file",
            &tokens,
            "--job-token-key",
            &key_file,
            "--heartbeat-ms",
            "100",
            "--election-timeout-ms",
            "1000",
        ],
    );
    for node in (0..size).filter(|n| *n != ahead_node) {
        cluster.start_node(node);
    }
    for (key, value) in faketime::env(&ahead).expect("libfaketime: run scripts/setup.sh") {
        std::env::set_var(key, value);
    }
    cluster.start_node(ahead_node);
    for key in ["LD_PRELOAD", "FAKETIME_TIMESTAMP_FILE"] {
        std::env::remove_var(key);
    }
    cluster.wait_ready().await;

    let client = Client::connect(&cluster.gateway(ahead_node)).await.unwrap().with_token(&secret).unwrap();
    let started = Instant::now();
    let key = loop {
        match client.create_job("tokens", "{}").await {
            Ok(key) => break key,
            // No leader yet.
            Err(status) => assert!(
                started.elapsed() < Duration::from_secs(30),
                "no create through the gateway ahead within 30 s: {status}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let started = Instant::now();
    loop {
        let job = loop {
            if let Ok(jobs) = client.activate("tokens", "w", 1, 60_000, 1_000).await {
                if let Some(job) = jobs.into_iter().next() {
                    break job;
                }
            }
            assert!(started.elapsed() < Duration::from_secs(40), "job {key} was not activated within 40 s");
        };
        assert!(job.job_token.starts_with("drj_"), "activations carry job tokens: {job:?}");
        let as_job = Client::connect(&cluster.gateway(ahead_node)).await.unwrap().with_token(&job.job_token).unwrap();
        match as_job.complete(key, job.attempt, "{}").await {
            Ok(()) => break,
            Err(status) => {
                assert!(
                    learns && started.elapsed() < Duration::from_secs(30),
                    "the job token the gateway ahead minted works on it for the activation's minute: {status}"
                );
                // Hand it back and take it again, for a token minted later.
                if let Err(error) = client.fail(key, job.attempt, 5, "again", 0).await {
                    // The completion may have taken effect though its answer
                    // was an error (a leader moving early in the cluster's
                    // life): then the token worked.
                    let now = client.get_job(key).await.expect("the job reads");
                    assert_eq!(
                        now.state, "completed",
                        "the job token's completion was refused ({status}) and the worker's own failure too: {error}"
                    );
                    break;
                }
            }
        }
    }
}
