//! A tiny run of `drover bench` against nodes it starts itself: every job
//! created is completed exactly once. Timings belong to the bench output only.

mod common;

use std::process::Command;

#[test]
fn a_tiny_bench_completes_every_job_once() {
    tiny_bench(&[]);
}

#[test]
fn a_tiny_bench_through_the_zeebe_protocol_completes_every_job_once() {
    tiny_bench(&["--zeebe"]);
}

#[test]
fn a_tiny_bench_over_tls_completes_every_job_once() {
    tiny_bench(&["--tls"]);
}

fn tiny_bench(extra: &[&str]) {
    let output = Command::new(common::drover_bin())
        .args(["bench", "--local-nodes", "1", "--jobs", "300", "--producers", "2", "--workers", "2"])
        .args(["--workload", "throughput,latency", "--rate", "200", "--duration", "2", "--json"])
        .args(extra)
        .output()
        .expect("run drover bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "bench failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let objects: Vec<serde_json::Value> =
        stdout.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
    let conditions = &objects[0]["conditions"];
    assert_eq!(conditions["fdatasync_samples"], 200, "the conditions come first:\n{stdout}");
    assert!(conditions["fdatasync_p50_ms"].as_f64().unwrap() <= conditions["fdatasync_p99_ms"].as_f64().unwrap());
    let reports = &objects[1..];
    assert_eq!(reports.len(), 2, "one JSON object per workload:\n{stdout}");
    for report in reports {
        let figures = &report["figures"];
        let expected = if report["workload"] == "throughput" { 300 } else { 400 };
        assert_eq!(figures["jobs_created"], expected, "{report}");
        assert_eq!(figures["jobs_completed_unique"], expected, "{report}");
        assert_eq!(figures["lost"], 0);
        assert_eq!(figures["completed_twice"], 0);
        assert!(figures["latency_ms"]["count"].as_u64().unwrap() >= expected);
        // Every create and completion was a Raft write on the one node.
        let stages = figures["stages"].as_array().expect("stages");
        let raft_write = stages.iter().find(|s| s["stage"] == "raft_write").expect("raft_write timed");
        assert!(raft_write["count"].as_u64().unwrap() > 0, "{report}");
    }
}

/// The latency workload splits its rate over one producer per gateway that
/// leads a partition, so its creates land on every partition (with the
/// default `--create-placement local`, one producer would put them all on
/// its own gateway's partition).
#[test]
fn the_latency_workload_spreads_its_rate_over_the_leading_gateways() {
    let output = Command::new(common::drover_bin())
        .args(["bench", "--local-nodes", "3", "--replication-factor", "3", "--partitions", "3"])
        .args(["--workload", "latency", "--rate", "300", "--duration", "2", "--json"])
        .output()
        .expect("run drover bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "bench failed:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value =
        serde_json::from_str(stdout.lines().filter(|l| l.starts_with('{')).nth(1).expect("the latency report"))
            .unwrap();
    let figures = &report["figures"];
    assert_eq!(figures["jobs_completed_unique"], 600, "{report}");
    let led_at_start: Vec<u64> = figures["leaders_per_node"][0]
        .as_array()
        .expect("leaders at start")
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    let leading = led_at_start.iter().filter(|n| **n > 0).count();
    assert!(leading >= 2, "leadership was not spread at the start, so nothing to spread over: {led_at_start:?}");
    assert_eq!(figures["producers"], leading as u64, "one producer per leading gateway: {report}");
    // Each through its own gateway, and so onto that gateway's partition.
    let created: Vec<u64> = figures["created_per_producer"]
        .as_array()
        .expect("creates per producer")
        .iter()
        .map(|n| n.as_u64().unwrap())
        .collect();
    assert_eq!(created.iter().sum::<u64>(), 600, "{report}");
    assert!(created.iter().all(|n| *n >= 600 / leading as u64), "the rate is split evenly: {created:?}");
}

#[test]
fn a_local_node_that_does_not_start_is_reported_with_the_end_of_its_log() {
    let dir = tempfile::tempdir().expect("temp dir");
    // A file where node 1's data directory should be: that node cannot start.
    std::fs::write(dir.path().join("node-1"), b"not a directory").expect("write");
    let output = Command::new(common::drover_bin())
        .args(["dev-cluster", "--nodes", "2", "--partitions", "1", "--replication-factor", "1", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("run drover dev-cluster");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "dev-cluster started a node with no data directory:\n{stderr}");
    assert!(stderr.contains("node 1 did not start (it exited)"), "no reason given:\n{stderr}");
    assert!(stderr.contains("node-1.log"), "the log is not named:\n{stderr}");
    let log = std::fs::read_to_string(dir.path().join("node-1.log")).expect("node 1's log");
    let last = log.lines().rev().find(|l| !l.trim().is_empty()).expect("node 1 logged why it stopped");
    assert!(stderr.contains(last.trim()), "the end of the log is not shown:\n{stderr}\nlog:\n{log}");
}
