//! A node killed with SIGKILL right after acknowledging loses nothing it
//! acknowledged, a node stopped with SIGTERM exits cleanly, and a node frozen
//! with SIGSTOP keeps its peers' connections.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::NodeProcess;

#[tokio::test]
async fn sigkill_after_acknowledgement_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut node = NodeProcess::start(&data, &[]);
    node.wait_ready().await;
    let client = node.client().await;

    let mut expected: HashMap<u64, &str> = HashMap::new();
    for n in 0..150 {
        let key = client.create_job("crash", &format!(r#"{{"n":{n}}}"#)).await.unwrap();
        expected.insert(key, "activatable");
    }
    // Complete 40, raise 10 incidents; the rest stay activatable.
    let jobs = client.activate("crash", "w", 50, 600_000, 0).await.unwrap();
    assert_eq!(jobs.len(), 50);
    for (i, job) in jobs.iter().enumerate() {
        if i < 40 {
            client.complete(job.key, job.attempt, r#"{"done":true}"#).await.unwrap();
            expected.insert(job.key, "completed");
        } else {
            client.fail(job.key, job.attempt, 0, "boom", 0).await.unwrap();
            expected.insert(job.key, "incident");
        }
    }
    // The last acknowledgement has arrived: kill at once, no chance to flush.
    node.kill();

    let node = NodeProcess::start(&data, &[]);
    node.wait_ready().await;
    let client = node.client().await;
    for (key, state) in &expected {
        let job = client.get_job(*key).await.unwrap_or_else(|e| panic!("job {key} lost: {e}"));
        assert_eq!(job.state, *state, "job {key}");
        if *state == "completed" {
            assert_eq!(job.result, r#"{"done":true}"#);
        }
    }
    let again = client.activate("crash", "w", 1000, 600_000, 0).await.unwrap();
    assert_eq!(again.len(), 100, "exactly the activatable jobs come back; completed ones do not");
    assert!(again.iter().all(|j| expected[&j.key] == "activatable"));
}

#[tokio::test]
async fn sigterm_stops_the_node_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut node = NodeProcess::start(&data, &[]);
    node.wait_ready().await;
    let key = node.client().await.create_job("term", "{}").await.unwrap();
    node.signal(libc::SIGTERM);
    let status = node.child.wait().unwrap();
    assert!(status.success(), "exit status {status}");

    let node = NodeProcess::start(&data, &[]);
    node.wait_ready().await;
    assert_eq!(node.client().await.get_job(key).await.unwrap().state, "activatable");
}

#[tokio::test]
async fn a_data_directory_formed_with_other_settings_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let node = NodeProcess::start(&data, &[]);
    node.wait_ready().await;
    drop(node);
    let output = std::process::Command::new(common::drover_bin())
        .arg("serve")
        .arg("--data-dir")
        .arg(&data)
        .args(["--partitions", "3", "--grpc-addr", "127.0.0.1:0", "--cluster-addr", "127.0.0.1:0"])
        .args(["--admin-addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("was formed as node 0") && stderr.contains("1 partitions"), "{stderr}");
}

/// A node frozen (SIGSTOP: a VM pause, a long GC, a stalled disk) while a peer
/// gives up on calls to it comes back with its peer connections intact. Peers
/// cancel each call that times out, and on resume the node reads all of those
/// cancellations at once; HTTP/2's default guard against "rapid reset" floods
/// would close the whole connection after 20, failing every other call on it
/// (Raft appends, pushes whose outcome then stays unknown until the activation
/// timeout).
#[tokio::test]
async fn a_frozen_node_keeps_its_peer_connections_through_cancelled_calls() {
    use drover::proto::cluster::StatusRequest;

    let dir = tempfile::tempdir().unwrap();
    let node = NodeProcess::start(&dir.path().join("data"), &[]);
    node.wait_ready().await;
    // One connection, as a peer has.
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", node.cluster)).unwrap().connect().await.unwrap();
    let peer = common::peer_of(channel);
    peer.clone().status(StatusRequest {}).await.expect("the node answers before the freeze");

    node.signal(libc::SIGSTOP);
    // The signal is delivered asynchronously: wait until the kernel says stopped.
    let stat = format!("/proc/{}/stat", node.child.id());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(&stat).unwrap().rsplit(") ").next().unwrap().starts_with('T') {
        assert!(std::time::Instant::now() < deadline, "node not stopped 5 s after SIGSTOP");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let cancelled: Vec<_> = (0..60)
        .map(|_| {
            let mut peer = peer.clone();
            tokio::spawn(async move {
                // Dropped after 100 ms: the client resets the stream.
                tokio::time::timeout(Duration::from_millis(100), peer.status(StatusRequest {})).await.is_err()
            })
        })
        .collect();
    for call in cancelled {
        assert!(call.await.unwrap(), "a call to a stopped node cannot be answered");
    }
    let waiting = {
        let mut peer = peer.clone();
        tokio::spawn(async move { tokio::time::timeout(Duration::from_secs(20), peer.status(StatusRequest {})).await })
    };
    // Give the waiting call time to be written before the node wakes up.
    tokio::time::sleep(Duration::from_millis(200)).await;
    node.signal(libc::SIGCONT);
    let answer = waiting.await.unwrap().expect("answered within 20 s of the node waking up");
    assert!(answer.is_ok(), "the call that waited through the freeze failed: {answer:?}");
}
