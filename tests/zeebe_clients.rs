//! A published Zeebe client, `@camunda8/sdk` from npm (installed, pinned, by
//! `scripts/setup.sh`), run as its own process against real nodes: it polls
//! and streams jobs made with `drover job create`, completes, fails and
//! throws, and reads the topology, on one node and on a three-node cluster
//! whose partition leader is SIGKILLed.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{drover_bin, eventually, http_get, ProcessCluster};
use drover::client::Client;
use serde_json::Value;

/// Where `scripts/setup.sh` installed the Zeebe client.
fn client_modules() -> PathBuf {
    let root = std::env::var_os("DROVER_ZEEBE_CLIENT").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/drover-tools/zeebe-client")
    });
    let modules = root.join("node_modules");
    assert!(
        modules.join("@camunda8/sdk/package.json").exists(),
        "the Zeebe client is not installed in {}: run scripts/setup.sh (make test does)",
        root.display()
    );
    modules
}

/// `tests/zeebe/worker.js` running under node, and the events it printed.
struct ZeebeWorker {
    child: Child,
    events: Arc<Mutex<Vec<Value>>>,
}

impl ZeebeWorker {
    fn spawn(mode: &str, job_type: &str, gateway: &str) -> ZeebeWorker {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/zeebe/worker.js");
        let mut child = Command::new("node")
            .arg(script)
            .args([mode, job_type])
            .env("NODE_PATH", client_modules())
            .env("ZEEBE_ADDRESS", gateway)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node runs (it is on every CI machine)");
        let events = Arc::new(Mutex::new(Vec::new()));
        let stdout = child.stdout.take().expect("piped");
        let sink = Arc::clone(&events);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(event) = line.strip_prefix("DROVER-TEST ") {
                    sink.lock().unwrap().push(serde_json::from_str(event).expect("an event is JSON"));
                }
            }
        });
        ZeebeWorker { child, events }
    }

    fn events(&self, kind: &str) -> Vec<Value> {
        self.events.lock().unwrap().iter().filter(|e| e["event"] == kind).cloned().collect()
    }

    async fn wait_for(&self, kind: &str, limit: Duration) -> Value {
        let started = Instant::now();
        loop {
            if let Some(event) = self.events(kind).pop() {
                return event;
            }
            if let Some(fatal) = self.events("fatal").pop() {
                panic!("the Zeebe client failed: {fatal}");
            }
            assert!(started.elapsed() < limit, "no {kind:?} event from the Zeebe client within {limit:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ZeebeWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `drover job create` against `gateway`: the new job's key.
fn create(gateway: &str, job_type: &str, variables: &str, extra: &[&str]) -> Result<u64, String> {
    let output = Command::new(drover_bin())
        .args(["job", "create", "--address", gateway, "--type", job_type, "--variables", variables])
        .args(extra)
        .output()
        .expect("run drover job create");
    let stdout = String::from_utf8_lossy(&output.stdout);
    match output.status.success() {
        true => stdout.trim().parse().map_err(|_| format!("not a key: {stdout}")),
        false => Err(String::from_utf8_lossy(&output.stderr).into_owned()),
    }
}

/// Completed events by the job's `n`.
fn completions(workers: &[&ZeebeWorker]) -> BTreeMap<u64, usize> {
    let mut by_n = BTreeMap::new();
    for worker in workers {
        for event in worker.events("completed") {
            *by_n.entry(event["n"].as_u64().expect("n")).or_default() += 1;
        }
    }
    by_n
}

/// Waits until `gateway` has a client stream of `job_type`.
async fn stream_open(admin: &str, job_type: &str) {
    eventually(Duration::from_secs(20), "the Zeebe client's job stream to open", || async move {
        let Ok((200, body)) = http_get(admin, "/actuator/jobstreams").await else { return false };
        let view: Value = serde_json::from_str(&body).unwrap();
        view["client"].as_array().is_some_and(|s| s.iter().any(|s| s["key"]["job_type"] == job_type))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_zeebe_client_polls_streams_completes_fails_throws_and_reads_the_topology() {
    let cluster = ProcessCluster::start(1, 1, 1, &[]);
    cluster.wait_ready().await;
    let gateway = cluster.node(0).grpc.clone();
    let client = Client::connect(&gateway).await.unwrap();

    let mut completing = Vec::new();
    for n in 0..3 {
        let variables = format!(r#"{{"action":"complete","n":{n}}}"#);
        completing.push(create(&gateway, "zb-poll", &variables, &["--header", "region=eu"]).unwrap());
    }
    let failing = create(&gateway, "zb-poll", r#"{"action":"fail","n":10}"#, &["--retries", "2"]).unwrap();
    let throwing = create(&gateway, "zb-poll", r#"{"action":"throw","n":11}"#, &[]).unwrap();

    let poller = ZeebeWorker::spawn("poll", "zb-poll", &gateway);
    eventually(Duration::from_secs(30), "the polled jobs to end", || {
        let client = client.clone();
        let keys: Vec<u64> = completing.iter().copied().chain([failing, throwing]).collect();
        async move {
            for key in keys {
                match client.get_job(key).await {
                    Ok(job) if job.state == "completed" || job.state == "incident" => {}
                    _ => return false,
                }
            }
            true
        }
    })
    .await;
    for (n, key) in completing.iter().enumerate() {
        let printed = Command::new(drover_bin())
            .args(["job", "get", "--address", &gateway, &key.to_string()])
            .output()
            .expect("run drover job get");
        assert!(printed.status.success(), "drover job get {key}: {}", String::from_utf8_lossy(&printed.stderr));
        let job: Value = serde_json::from_slice(&printed.stdout).expect("drover job get prints the job as JSON");
        assert_eq!(job["state"], "completed", "{job}");
        assert_eq!(job["result"], serde_json::json!({"handledBy": "poll", "n": n}), "the worker's variables: {job}");
    }
    let job = client.get_job(failing).await.unwrap();
    assert_eq!((job.state.as_str(), job.retries, job.attempt), ("incident", 0, 2), "failed through its retries");
    assert!(job.error_message.contains("failed"), "{}", job.error_message);
    let job = client.get_job(throwing).await.unwrap();
    assert_eq!((job.state.as_str(), job.failure_reason.as_str()), ("incident", "business-error"));
    assert!(job.error_message.contains("NO_FUNDS"), "the incident carries the error code: {}", job.error_message);

    let seen = poller.events("job");
    let first = seen.iter().find(|e| e["n"] == 0).expect("job 0 reached the client");
    assert_eq!(first["customHeaders"], serde_json::json!({"region": "eu"}));
    assert_eq!(first["variables"], serde_json::json!({"action": "complete", "n": 0}));
    assert_eq!((first["processInstanceKey"].as_str(), first["bpmnProcessId"].as_str()), (Some("0"), Some("")));
    assert_eq!(first["tenantId"], "<default>");
    assert_eq!(completions(&[&poller]), (0..3).map(|n| (n, 1)).collect(), "each job completed once");

    let streamer = ZeebeWorker::spawn("stream", "zb-stream", &gateway);
    streamer.wait_for("ready", Duration::from_secs(30)).await;
    stream_open(&cluster.node(0).admin, "zb-stream").await;
    let mut streamed = Vec::new();
    for n in 20..25 {
        streamed.push(create(&gateway, "zb-stream", &format!(r#"{{"action":"complete","n":{n}}}"#), &[]).unwrap());
    }
    eventually(Duration::from_secs(30), "the streamed jobs to complete", || {
        let (client, keys) = (client.clone(), streamed.clone());
        async move {
            for key in keys {
                if !client.get_job(key).await.is_ok_and(|j| j.state == "completed") {
                    return false;
                }
            }
            true
        }
    })
    .await;
    for (n, key) in (20..).zip(&streamed) {
        let result: Value = serde_json::from_str(&client.get_job(*key).await.unwrap().result).unwrap();
        assert_eq!(result, serde_json::json!({"handledBy": "stream", "n": n}));
    }
    assert!(streamer.events("job").iter().all(|e| e["mode"] == "stream"));

    let topology = ZeebeWorker::spawn("topology", "", &gateway);
    let topology = topology.wait_for("topology", Duration::from_secs(30)).await["topology"].clone();
    assert_eq!(topology["clusterSize"], 1);
    assert_eq!(topology["partitionsCount"], 1);
    assert_eq!(topology["brokers"][0]["partitions"][0]["role"], "LEADER");
    assert_eq!(topology["brokers"][0]["partitions"][0]["partitionId"], 1);
    assert!(topology["gatewayVersion"].as_str().is_some_and(|v| v.split('.').count() == 3), "{topology}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_zeebe_workers_complete_every_job_once_while_a_partition_leader_is_killed() {
    let mut cluster = ProcessCluster::start(3, 2, 3, &[]);
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(30)).await;
    let entry = (0..3).find(|id| *id != leader).expect("another node");
    let gateway = cluster.node(entry).grpc.clone();
    let client = Client::connect(&gateway).await.unwrap();

    let poller = ZeebeWorker::spawn("poll", "zb-ha", &gateway);
    let streamer = ZeebeWorker::spawn("stream", "zb-ha", &gateway);
    poller.wait_for("ready", Duration::from_secs(30)).await;
    streamer.wait_for("ready", Duration::from_secs(30)).await;
    stream_open(&cluster.node(entry).admin, "zb-ha").await;

    const JOBS: u64 = 40;
    let mut keys = BTreeMap::new();
    for n in 0..JOBS {
        if n == JOBS / 2 {
            cluster.kill(leader);
        }
        // Through the election a create may be refused: repeat it under the
        // same idempotency key, which names one job however often it is sent.
        let variables = format!(r#"{{"action":"complete","n":{n}}}"#);
        let idempotency = format!("zb-ha-{n}");
        let started = Instant::now();
        let key = loop {
            match create(&gateway, "zb-ha", &variables, &["--idempotency-key", &idempotency]) {
                Ok(key) => break key,
                Err(error) => {
                    assert!(started.elapsed() < Duration::from_secs(30), "create {n} kept failing: {error}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        keys.insert(n, key);
    }

    eventually(Duration::from_secs(60), "every job to complete", || {
        let (client, keys) = (client.clone(), keys.clone());
        async move {
            for key in keys.values() {
                if !client.get_job(*key).await.is_ok_and(|j| j.state == "completed") {
                    return false;
                }
            }
            true
        }
    })
    .await;
    for (n, key) in &keys {
        let result: Value = serde_json::from_str(&client.get_job(*key).await.unwrap().result).unwrap();
        assert_eq!(result["n"], *n, "job {key} holds its own result");
    }
    // A completion whose answer was lost to the kill may be seen as failed
    // by its client (the job is completed all the same); none may succeed twice.
    let completed = completions(&[&poller, &streamer]);
    let twice: Vec<_> = completed.iter().filter(|(_, count)| **count > 1).collect();
    assert!(twice.is_empty(), "jobs whose completion succeeded more than once: {twice:?}");
}
