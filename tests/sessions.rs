//! Worker sessions on three real nodes: a killed worker's jobs come back in
//! seconds, heartbeats keep long jobs, operators quiet and terminate
//! workers, signals shut `drover worker --exec` down gracefully, revoked
//! jobs are stopped, schemas refuse bad payloads, and sessions survive a
//! leader's death.

mod common;

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::{drover_bin, eventually, ProcessCluster};
use drover::client::Client;
use drover::proto::gateway::{
    ActivateJobsRequest, ActivatedJob, CreateJobRequest, GetSchemaRequest, HeartbeatRequest, HeldJob, Job,
    ListWorkersRequest, RegisterWorkerRequest,
};
use tonic::Code;

const CLUSTER_ARGS: &[&str] = &["--heartbeat-ms", "50", "--election-timeout-ms", "300"];

/// A `drover worker` process, killed when dropped.
struct WorkerProcess {
    child: Child,
}

impl WorkerProcess {
    fn start(gateway: &str, args: &[&str]) -> WorkerProcess {
        let child = Command::new(drover_bin())
            .arg("worker")
            .args(["--address", gateway])
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn drover worker");
        WorkerProcess { child }
    }

    fn signal(&self, signal: i32) {
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0, "sending signal {signal}");
    }

    async fn exited(&mut self, limit: Duration) -> ExitStatus {
        common::exited(&mut self.child, limit).await
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn create(client: &Client, job_type: &str, n: usize) -> Vec<u64> {
    let mut keys = Vec::new();
    for i in 0..n {
        let request = CreateJobRequest {
            r#type: job_type.into(),
            variables: format!(r#"{{"n":{i}}}"#),
            retries: Some(3),
            ..Default::default()
        };
        keys.push(client.create(request).await.unwrap());
    }
    keys
}

async fn jobs(client: &Client, keys: &[u64]) -> Vec<Job> {
    let mut jobs = Vec::new();
    for key in keys {
        jobs.push(client.get_job(*key).await.unwrap());
    }
    jobs
}

/// Waits until every job is activated by `worker`.
async fn held_by(client: &Client, keys: &[u64], worker: &str, limit: Duration) {
    eventually(limit, &format!("{} jobs to be activated by {worker}", keys.len()), || async {
        jobs(client, keys).await.iter().all(|j| j.state == "activated" && j.worker == worker)
    })
    .await;
}

/// Activates jobs of a type as `worker` until `n` came, or panics after `limit`.
async fn activate_all(client: &Client, job_type: &str, worker: &str, n: usize, limit: Duration) -> Vec<ActivatedJob> {
    let started = Instant::now();
    let mut got = Vec::new();
    while got.len() < n {
        assert!(started.elapsed() < limit, "only {} of {n} jobs of {job_type} activatable within {limit:?}", got.len());
        got.extend(client.activate(job_type, worker, (n - got.len()) as i32, 600_000, 500).await.unwrap());
    }
    got
}

async fn cli(gateway: &str, args: &[&str]) -> String {
    let output = tokio::process::Command::new(drover_bin())
        .args(args)
        .args(["--address", gateway])
        .output()
        .await
        .expect("run the drover CLI");
    assert!(output.status.success(), "drover {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

async fn session_of(client: &Client, worker: &str) -> u64 {
    let started = Instant::now();
    loop {
        let workers = client.raw().list_workers(ListWorkersRequest::default()).await.unwrap().into_inner().workers;
        if let Some(found) = workers.iter().find(|w| w.worker_id == worker) {
            return found.session_id;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "{worker} did not register within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_s_jobs_are_activated_again_within_dead_after() {
    let cluster = ProcessCluster::start(3, 2, 3, CLUSTER_ARGS);
    cluster.wait_ready().await;
    let client = Client::connect(&cluster.node(0).grpc).await.unwrap();
    let keys = create(&client, "kill", 10).await;
    let dead_after = Duration::from_secs(3);
    let doomed = WorkerProcess::start(
        &cluster.node(1).grpc,
        &[
            "--type",
            "kill",
            "--name",
            "doomed",
            "--exec",
            "exec sleep 600",
            "--concurrency",
            "10",
            "--timeout",
            "600000",
            "--heartbeat-interval",
            "500",
            "--dead-after",
            "3000",
        ],
    );
    held_by(&client, &keys, "doomed", Duration::from_secs(30)).await;

    doomed.signal(libc::SIGKILL);
    let killed = Instant::now();
    let again = activate_all(&client, "kill", "survivor", 10, dead_after + Duration::from_secs(5)).await;
    println!("the 10 jobs were activated again {:?} after the kill", killed.elapsed());
    let mut again_keys: Vec<u64> = again.iter().map(|j| j.key).collect();
    again_keys.sort_unstable();
    let mut expected = keys.clone();
    expected.sort_unstable();
    assert_eq!(again_keys, expected, "every job the dead worker held, and only those");
    for job in &again {
        assert_eq!((job.attempt, job.retries), (2, 2), "the dead worker's attempt counts, once");
    }
    let record = client.get_job(keys[0]).await.unwrap();
    assert!(record.error_message.contains("no heartbeat"), "{}", record.error_message);
    assert_eq!(record.failure_reason, "worker-died");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_extend_held_jobs_and_report_cancelled_ones() {
    let cluster = ProcessCluster::start(3, 1, 3, CLUSTER_ARGS);
    cluster.wait_ready().await;
    let client = Client::connect(&cluster.node(2).grpc).await.unwrap();
    create(&client, "beat", 3).await;
    let register = RegisterWorkerRequest {
        worker_id: "beater".into(),
        job_types: vec!["beat".into()],
        heartbeat_interval: 200,
        dead_after: 10_000,
        ..Default::default()
    };
    let session = client.raw().register_worker(register).await.unwrap().into_inner().session_id;
    let activate = ActivateJobsRequest {
        r#type: "beat".into(),
        worker: "beater".into(),
        timeout: 2_000,
        max_jobs_to_activate: 3,
        session_id: session,
        ..Default::default()
    };
    let held: Vec<ActivatedJob> =
        client.raw().activate_jobs(activate).await.unwrap().into_inner().message().await.unwrap().unwrap().jobs;
    assert_eq!(held.len(), 3);
    let (kept, left_out, cancelled) = (&held[0], &held[1], &held[2]);
    client.raw().cancel_job(drover::proto::gateway::CancelJobRequest { key: cancelled.key }).await.unwrap();

    let beat = |jobs: Vec<&ActivatedJob>| HeartbeatRequest {
        session_id: session,
        state: "running".into(),
        jobs: jobs.iter().map(|j| HeldJob { key: j.key, attempt: j.attempt }).collect(),
    };
    let answer = client.raw().heartbeat(beat(vec![kept, cancelled])).await.unwrap().into_inner();
    assert_eq!(answer.revoked, vec![cancelled.key], "the cancelled job is reported at the next beat");
    assert_eq!(answer.state, "running");
    let left = client.get_job(left_out.key).await.unwrap();
    assert_eq!(left.deadline, left_out.deadline, "a job left out of the beat keeps its deadline");

    // Beat for twice the activation timeout: the kept job stays activated
    // under its first attempt; the one left out times out.
    let until = Instant::now() + Duration::from_millis(4_000);
    while Instant::now() < until {
        let answer = client.raw().heartbeat(beat(vec![kept])).await.unwrap().into_inner();
        assert!(answer.revoked.is_empty(), "the kept job is still held");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let kept_now = client.get_job(kept.key).await.unwrap();
    assert_eq!((kept_now.state.as_str(), kept_now.attempt), ("activated", 1));
    assert!(kept_now.deadline > kept.deadline, "the deadline moved with the beats");
    let left = client.get_job(left_out.key).await.unwrap();
    assert_eq!(left.state, "activatable", "the job left out timed out at its own deadline");
    let answer = client.raw().heartbeat(beat(vec![left_out])).await.unwrap().into_inner();
    assert_eq!(answer.revoked, vec![left_out.key], "a timed-out activation is no longer held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_stops_new_jobs_and_terminate_hands_held_ones_to_another_worker() {
    let cluster = ProcessCluster::start(3, 1, 3, CLUSTER_ARGS);
    cluster.wait_ready().await;
    let gateway = cluster.node(0).grpc.clone();
    let client = Client::connect(&gateway).await.unwrap();
    let release = tempfile::tempdir().unwrap();
    // Each job runs until a file named after its key appears.
    let exec = format!("while [ ! -e {}/$DROVER_JOB_KEY ]; do sleep 0.05; done; echo '{{}}'", release.path().display());
    let keys = create(&client, "drain", 2).await;
    let mut worker = WorkerProcess::start(
        &gateway,
        &[
            "--type",
            "drain",
            "--name",
            "drainer",
            "--exec",
            &exec,
            "--label",
            "pool:critical",
            "--heartbeat-interval",
            "300",
            "--dead-after",
            "5000",
            "--grace-period",
            "1000",
        ],
    );
    held_by(&client, &keys, "drainer", Duration::from_secs(30)).await;
    let session = session_of(&client, "drainer").await;

    let quieted = cli(&gateway, &["worker", "quiet", "--label", "pool:critical"]).await;
    assert!(quieted.contains(&format!("{session:x}")), "the quieted worker is listed: {quieted}");
    // New jobs go to another worker, while the quiet one finishes what it holds.
    let more = create(&client, "drain", 2).await;
    let taken = activate_all(&client, "drain", "other", 2, Duration::from_secs(10)).await;
    let mut taken_keys: Vec<u64> = taken.iter().map(|j| j.key).collect();
    taken_keys.sort_unstable();
    assert_eq!(taken_keys, more, "the quiet worker got none of the new jobs");
    std::fs::write(release.path().join(keys[0].to_string()), "").unwrap();
    eventually(Duration::from_secs(10), "the quiet worker to finish its job", || async {
        client.get_job(keys[0]).await.unwrap().state == "completed"
    })
    .await;
    let listed = cli(&gateway, &["worker", "list"]).await;
    assert!(listed.contains("\"directed\":\"quiet\""), "{listed}");

    // Terminate: its last job outlasts the grace period, is failed as
    // worker-shutdown (no retry used), and another worker completes it.
    cli(&gateway, &["worker", "terminate", &format!("{session:x}")]).await;
    let status = worker.exited(Duration::from_secs(10)).await;
    assert!(status.success(), "a terminated worker exits cleanly: {status:?}");
    let failed = client.get_job(keys[1]).await.unwrap();
    assert_eq!((failed.failure_reason.as_str(), failed.retries), ("worker-shutdown", 3));
    let job = activate_all(&client, "drain", "other", 1, Duration::from_secs(10)).await.remove(0);
    assert_eq!(job.key, keys[1]);
    client.complete(job.key, job.attempt, "{}").await.unwrap();
    let workers = client.raw().list_workers(ListWorkersRequest::default()).await.unwrap().into_inner().workers;
    assert!(workers.iter().all(|w| w.session_id != session), "the terminated worker deregistered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_jobs_in_flight_and_fails_those_past_the_grace_period() {
    let cluster = ProcessCluster::start(3, 1, 3, CLUSTER_ARGS);
    cluster.wait_ready().await;
    let gateway = cluster.node(1).grpc.clone();
    let client = Client::connect(&gateway).await.unwrap();

    let keys = create(&client, "short", 2).await;
    let mut worker = WorkerProcess::start(
        &gateway,
        &["--type", "short", "--name", "short-worker", "--exec", "sleep 2; echo {}", "--grace-period", "10000"],
    );
    held_by(&client, &keys, "short-worker", Duration::from_secs(30)).await;
    worker.signal(libc::SIGTERM);
    let status = worker.exited(Duration::from_secs(10)).await;
    assert!(status.success(), "exit 0 after a graceful shutdown: {status:?}");
    for job in jobs(&client, &keys).await {
        assert_eq!(job.state, "completed", "job {} finished before the worker exited", job.key);
    }

    let keys = create(&client, "long", 1).await;
    let mut worker = WorkerProcess::start(
        &gateway,
        &["--type", "long", "--name", "long-worker", "--exec", "exec sleep 600", "--grace-period", "1000"],
    );
    held_by(&client, &keys, "long-worker", Duration::from_secs(30)).await;
    worker.signal(libc::SIGTERM);
    let status = worker.exited(Duration::from_secs(10)).await;
    assert!(status.success(), "exit 0 after failing what outlasted the grace period: {status:?}");
    let job = client.get_job(keys[0]).await.unwrap();
    assert_eq!((job.state.as_str(), job.failure_reason.as_str(), job.retries), ("activatable", "worker-shutdown", 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stops_a_job_cancelled_while_it_runs() {
    let cluster = ProcessCluster::start(3, 1, 3, CLUSTER_ARGS);
    cluster.wait_ready().await;
    let gateway = cluster.node(2).grpc.clone();
    let client = Client::connect(&gateway).await.unwrap();
    let pids = tempfile::tempdir().unwrap();
    let exec = format!("echo $$ > {}/$DROVER_JOB_KEY; exec sleep 600", pids.path().display());
    let keys = create(&client, "stoppable", 1).await;
    let _worker = WorkerProcess::start(
        &gateway,
        &["--type", "stoppable", "--name", "stopper", "--exec", &exec, "--heartbeat-interval", "300"],
    );
    let pid_file = pids.path().join(keys[0].to_string());
    let mut pid = 0;
    eventually(Duration::from_secs(30), "the job's process to start", || {
        let found = read_pid(&pid_file);
        pid = found.unwrap_or(0);
        async move { found.is_some() }
    })
    .await;
    client.raw().cancel_job(drover::proto::gateway::CancelJobRequest { key: keys[0] }).await.unwrap();
    eventually(Duration::from_secs(10), "the cancelled job's process to be stopped", || async move {
        unsafe { libc::kill(pid, 0) != 0 }
    })
    .await;
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_refuses_bad_payloads_and_sessions_survive_a_leader_kill() {
    let mut cluster = ProcessCluster::start(3, 1, 3, CLUSTER_ARGS);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let gateway = cluster.node((leader + 1) % 3).grpc.clone();
    let client = Client::connect(&gateway).await.unwrap();

    let schema = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        schema.path(),
        r#"{"type":"object","required":["order"],
            "properties":{"order":{"type":"object","properties":{"id":{"type":"integer"}}}}}"#,
    )
    .unwrap();
    cli(&gateway, &["schema", "set", "orders", schema.path().to_str().unwrap()]).await;
    let bad =
        CreateJobRequest { r#type: "orders".into(), variables: r#"{"order":{"id":"x"}}"#.into(), ..Default::default() };
    let error = client.create(bad).await.unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(error.message().contains("/order/id"), "the failing path is named: {}", error.message());
    let good =
        CreateJobRequest { r#type: "orders".into(), variables: r#"{"order":{"id":7}}"#.into(), ..Default::default() };
    client.create(good).await.unwrap();
    let fetched = client.raw().get_schema(GetSchemaRequest { r#type: "orders".into() }).await.unwrap().into_inner();
    assert!(fetched.schema.contains("\"required\":[\"order\"]"), "{}", fetched.schema);

    let register = RegisterWorkerRequest {
        worker_id: "survivor".into(),
        job_types: vec!["orders".into()],
        labels: vec!["region:eu-west-1".into()],
        dead_after: 20_000,
        ..Default::default()
    };
    let session = client.raw().register_worker(register).await.unwrap().into_inner().session_id;
    cluster.kill(leader);
    let beat = HeartbeatRequest { session_id: session, ..Default::default() };
    let started = Instant::now();
    while let Err(status) = client.raw().heartbeat(beat.clone()).await {
        assert_ne!(status.code(), Code::NotFound, "the session survives the leader: {status}");
        assert!(started.elapsed() < Duration::from_secs(15), "no heartbeat answered within 15 s: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let listed = client.raw().list_workers(ListWorkersRequest { label: "region:eu-west-1".into() }).await.unwrap();
    assert_eq!(listed.into_inner().workers.iter().map(|w| w.session_id).collect::<Vec<_>>(), vec![session]);
    let bad = CreateJobRequest { r#type: "orders".into(), variables: "{}".into(), ..Default::default() };
    assert_eq!(client.create(bad).await.unwrap_err().code(), Code::InvalidArgument, "the schema survives too");
}

async fn reported_state(client: &Client, session: u64) -> String {
    let workers = client.raw().list_workers(ListWorkersRequest::default()).await.unwrap().into_inner().workers;
    workers.into_iter().find(|w| w.session_id == session).map(|w| w.reported_state).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigtstp_quiets_a_worker_and_sigcont_resumes_it() {
    let cluster = ProcessCluster::start(3, 1, 3, CLUSTER_ARGS);
    cluster.wait_ready().await;
    let gateway = cluster.node(0).grpc.clone();
    let client = Client::connect(&gateway).await.unwrap();
    let worker = WorkerProcess::start(
        &gateway,
        &["--type", "tstp", "--name", "stoppable", "--exec", "echo {}", "--heartbeat-interval", "200"],
    );
    let session = session_of(&client, "stoppable").await;

    worker.signal(libc::SIGTSTP);
    eventually(Duration::from_secs(10), "the worker to report quiet", || async {
        reported_state(&client, session).await == "quiet"
    })
    .await;
    let quiet_time = create(&client, "tstp", 1).await;
    let taken = activate_all(&client, "tstp", "other", 1, Duration::from_secs(10)).await;
    assert_eq!(taken[0].key, quiet_time[0], "a quiet worker takes no job");
    client.complete(taken[0].key, taken[0].attempt, "{}").await.unwrap();

    worker.signal(libc::SIGCONT);
    eventually(Duration::from_secs(10), "the worker to report running", || async {
        reported_state(&client, session).await == "running"
    })
    .await;
    let keys = create(&client, "tstp", 1).await;
    eventually(Duration::from_secs(10), "the resumed worker to complete a job", || async {
        let job = client.get_job(keys[0]).await.unwrap();
        job.state == "completed" && job.worker == "stoppable"
    })
    .await;
}

/// A partition whose leader stalls past a session's dead-after declares the
/// worker dead there alone, while the other partitions keep taking its
/// beats. That costs the worker the stalled partition's jobs (they went back
/// with its lease there), never its session or its jobs elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lapsed_on_one_partition_costs_that_partition_s_jobs_not_the_session() {
    // None armed at start: the test stalls one partition's leader.
    let cluster = ProcessCluster::start_with_failpoints("", 2, CLUSTER_ARGS);
    cluster.wait_ready().await;
    let lagging = cluster.leader_of(1, Duration::from_secs(20)).await;
    let client = Client::connect(&cluster.node(cluster.other_than(lagging)).grpc).await.unwrap();
    let keys = create(&client, "lapse", 8).await;
    let register = RegisterWorkerRequest {
        worker_id: "steady".into(),
        job_types: vec!["lapse".into()],
        heartbeat_interval: 200,
        dead_after: 1_000,
        ..Default::default()
    };
    let session = client.raw().register_worker(register).await.unwrap().into_inner().session_id;
    let mut held: Vec<ActivatedJob> = Vec::new();
    let started = Instant::now();
    while held.len() < keys.len() {
        assert!(started.elapsed() < Duration::from_secs(20), "only {} of {} jobs activated", held.len(), keys.len());
        let activate = ActivateJobsRequest {
            r#type: "lapse".into(),
            worker: "steady".into(),
            timeout: 600_000,
            max_jobs_to_activate: (keys.len() - held.len()) as i32,
            request_timeout: 500,
            session_id: session,
            ..Default::default()
        };
        let mut stream = client.raw().activate_jobs(activate).await.unwrap().into_inner();
        while let Some(batch) = stream.message().await.unwrap() {
            held.extend(batch.jobs);
        }
    }
    let on = |partition: u64| held.iter().filter(|j| j.key >> 48 == partition).cloned().collect::<Vec<_>>();
    let (kept, lapsed) = (on(0), on(1));
    assert!(!kept.is_empty() && !lapsed.is_empty(), "jobs on both partitions: {held:?}");
    let beat = HeartbeatRequest {
        session_id: session,
        state: "running".into(),
        jobs: held.iter().map(|j| HeldJob { key: j.key, attempt: j.attempt }).collect(),
    };

    // Partition 1's leader holds its next apply for 2.5 s: what is proposed
    // there meanwhile waits unstamped, so its next entry comes 2.5 s on, past
    // the 1 s lease, while partition 0 takes a beat every 200 ms.
    let armed = common::http_request(
        "PUT",
        &cluster.node(lagging).admin,
        "/actuator/failpoints/apply_hold_1?count=1&hold_ms=2500",
    )
    .await
    .unwrap();
    assert_eq!(armed.0, 200, "{armed:?}");
    let mut beats = Vec::new();
    for _ in 0..20 {
        let (mut raw, beat) = (client.raw(), beat.clone());
        beats.push(tokio::spawn(async move { raw.heartbeat(beat).await }));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut revoked = Vec::new();
    for beat in beats {
        match beat.await.unwrap() {
            Ok(answer) => revoked.extend(answer.into_inner().revoked),
            Err(status) => {
                assert_ne!(status.code(), Code::NotFound, "the session lives on partition 0: {status}");
            }
        }
    }
    let lapsed_keys: Vec<u64> = lapsed.iter().map(|j| j.key).collect();
    assert!(
        lapsed_keys.iter().all(|key| revoked.contains(key)),
        "partition 1's jobs are revoked: {revoked:?}, of {lapsed_keys:?}"
    );
    for job in &kept {
        let now = client.get_job(job.key).await.unwrap();
        assert_eq!((now.state.as_str(), now.attempt), ("activated", job.attempt), "partition 0 keeps its job: {now:?}");
        assert!(!revoked.contains(&job.key), "partition 0's job is not revoked");
    }
    for job in &lapsed {
        let now = client.get_job(job.key).await.unwrap();
        assert!(
            now.state != "activated" || now.attempt > job.attempt,
            "partition 1 handed its job back when the lease lapsed there: {now:?}"
        );
    }
    // The session is whole again: a beat of the kept jobs is answered on both.
    let whole =
        HeartbeatRequest { jobs: kept.iter().map(|j| HeldJob { key: j.key, attempt: j.attempt }).collect(), ..beat };
    let answer = client.raw().heartbeat(whole).await.unwrap().into_inner();
    assert!(answer.revoked.is_empty(), "{answer:?}");
}
