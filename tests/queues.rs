//! Queues as objects (docs/queues.md) on a real node with three partitions:
//! a paused queue holds its jobs from polls and streams on every partition
//! until it is resumed, creates still land, the figures count jobs by state
//! and what happened lately, and OJS's queue endpoints are the same queues.

mod common;

use std::time::Duration;

use common::{http_exchange, LocalNode};
use drover::proto::gateway::*;
use serde_json::{json, Value};

async fn node() -> LocalNode {
    LocalNode::start_with(|config| {
        config.ojs_addr = Some("127.0.0.1:0".parse().unwrap());
        config.partitions = 3;
    })
    .await
}

async fn within<F: std::future::Future>(secs: u64, f: F) -> Result<F::Output, tokio::time::error::Elapsed> {
    tokio::time::timeout(Duration::from_secs(secs), f).await
}

async fn set_paused(node: &LocalNode, job_type: &str, paused: bool) -> Queue {
    let request = SetQueuePausedRequest { r#type: job_type.into(), paused, ..Default::default() };
    node.client.raw().set_queue_paused(request).await.expect("pauses").into_inner().queue.expect("its figures")
}

async fn queue(node: &LocalNode, job_type: &str) -> Queue {
    let request = ListQueuesRequest { r#type: job_type.into(), ..Default::default() };
    let mut queues = node.client.raw().list_queues(request).await.expect("lists").into_inner().queues;
    assert_eq!(queues.len(), 1, "one queue of {job_type}: {queues:?}");
    queues.pop().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_holds_its_jobs_from_polls_and_streams_until_resumed() {
    let node = node().await;
    let open = StreamActivatedJobsRequest {
        r#type: "mail".into(),
        worker: "streamer".into(),
        timeout: 600_000,
        ..Default::default()
    };
    let mut stream = node.client.raw().stream_activated_jobs(open).await.unwrap().into_inner();
    let paused = set_paused(&node, "mail", true).await;
    assert!(paused.paused && paused.paused_at > 0, "{paused:?}");
    let mut keys = Vec::new();
    for i in 0..6 {
        keys.push(node.client.create_job("mail", &format!(r#"{{"i":{i}}}"#)).await.expect("creates still land"));
    }
    let partitions: std::collections::BTreeSet<u32> =
        keys.iter().map(|k| drover::core::JobKey(*k).partition()).collect();
    assert!(partitions.len() > 1, "the jobs are spread over partitions: {keys:?}");
    let polled = node.client.activate("mail", "poller", 10, 60_000, 300).await.unwrap();
    assert!(polled.is_empty(), "a long poll of a paused queue gets nothing: {polled:?}");
    // A push would come within milliseconds of each create: none came.
    assert!(within(1, stream.message()).await.is_err(), "a paused queue's job was pushed");
    let q = queue(&node, "mail").await;
    assert_eq!((q.available, q.active, q.paused), (6, 0, true), "{q:?}");
    assert_eq!(q.last_hour.unwrap().created, 6);
    assert!(q.oldest_available_at > 0 && q.oldest_available_at <= q.at, "{q:?}");

    let resumed = set_paused(&node, "mail", false).await;
    assert!(!resumed.paused && resumed.paused_at == 0, "{resumed:?}");
    let mut pushed = Vec::new();
    while pushed.len() < keys.len() {
        let job = within(20, stream.message()).await.expect("every held job is pushed once resumed").unwrap().unwrap();
        pushed.push(job);
    }
    pushed.sort_by_key(|j| j.key);
    assert_eq!(pushed.iter().map(|j| j.key).collect::<Vec<_>>(), {
        keys.sort();
        keys.clone()
    });
    for job in &pushed[..4] {
        node.client.complete(job.key, job.attempt, "{}").await.unwrap();
    }
    let q = queue(&node, "mail").await;
    assert_eq!((q.available, q.active), (0, 2), "{q:?}");
    let hour = q.last_hour.unwrap();
    assert_eq!((hour.created, hour.activated, hour.completed), (6, 6, 4), "{q:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_queue_requests_are_refused_and_change_nothing() {
    let node = node().await;
    let mut raw = node.client.raw();
    let bad_type = SetQueuePausedRequest { r#type: String::new(), paused: true, ..Default::default() };
    let refused = raw.set_queue_paused(bad_type).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    let bad_tenant = ListQueuesRequest { tenant_id: "x".repeat(300), ..Default::default() };
    assert_eq!(raw.list_queues(bad_tenant).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    let listed = raw.list_queues(ListQueuesRequest::default()).await.unwrap().into_inner().queues;
    assert!(listed.is_empty(), "nothing was paused or made: {listed:?}");
    // Pausing twice keeps the first pause's time; resuming twice is fine.
    let first = set_paused(&node, "t", true).await;
    assert_eq!(set_paused(&node, "t", true).await.paused_at, first.paused_at);
    assert!(!set_paused(&node, "t", false).await.paused);
    assert!(!set_paused(&node, "t", false).await.paused);
}

struct Ojs(String);

impl Ojs {
    async fn call(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let headers = "Content-Type: application/openjobspec+json\r\n";
        let body = if body.is_null() { String::new() } else { body.to_string() };
        let (code, _, text) = http_exchange(method, &self.0, path, headers, &body).await.expect("OJS answers");
        (code, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {text:?}: {e}")))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ojs_queues_are_drover_queues() {
    let node = node().await;
    let ojs = Ojs(node.node().ojs_addr.unwrap().to_string());
    let (code, answer) = ojs.call("POST", "/ojs/v1/queues/reports/pause", json!({})).await;
    assert_eq!((code, &answer["queue"]["name"], &answer["queue"]["paused"]), (200, &json!("reports"), &json!(true)));
    assert!(queue(&node, "reports").await.paused, "paused through OJS is paused on drover.v1");
    for i in 0..3 {
        let job = json!({"type": "report.build", "args": [i], "options": {"queue": "reports"}});
        assert_eq!(ojs.call("POST", "/ojs/v1/jobs", job).await.0, 201);
    }
    let (code, fetched) = ojs.call("POST", "/ojs/v1/workers/fetch", json!({"queues": ["reports"]})).await;
    assert_eq!((code, fetched["jobs"].as_array().map(Vec::len)), (200, Some(0)), "{fetched}");
    set_paused(&node, "reports", false).await;
    let (_, fetched) = ojs.call("POST", "/ojs/v1/workers/fetch", json!({"queues": ["reports"]})).await;
    let job = &fetched["jobs"][0];
    let ack = json!({"job_id": job["id"], "attempt": job["attempt"], "result": {"ok": true}});
    assert_eq!(ojs.call("POST", "/ojs/v1/workers/ack", ack).await.0, 200);
    let (code, stats) = ojs.call("GET", "/ojs/v1/queues/reports/stats", Value::Null).await;
    assert_eq!(code, 200, "{stats}");
    let q = &stats["queue"];
    assert_eq!(
        (&q["paused"], &q["available"], &q["active"], &q["completed"]),
        (&json!(false), &json!(2), &json!(0), &json!(1))
    );
    assert_eq!(stats["stats"]["completed_last_hour"], 1, "{stats}");
    let (_, listed) = ojs.call("GET", "/ojs/v1/queues", Value::Null).await;
    assert_eq!(listed["queues"][0]["name"], "reports", "{listed}");
    let (code, refused) = ojs.call("POST", "/ojs/v1/queues/Not_A_Queue/pause", json!({})).await;
    assert_eq!((code, &refused["error"]["code"]), (400, &json!("invalid_request")), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_lists_pauses_and_resumes_queues() {
    let node = node().await;
    node.client.create_job("invoices", "{}").await.unwrap();
    let address = node.node().grpc_addr.to_string();
    let drover = |args: &'static [&'static str]| {
        let address = address.clone();
        async move {
            let mut all = vec!["queue"];
            all.extend_from_slice(args);
            all.extend_from_slice(&["--address", &address]);
            common::run_drover(&all, &[]).await
        }
    };
    let (ok, out, err) = drover(&["pause", "invoices"]).await;
    assert!(ok, "{err}");
    assert!(out.lines().nth(1).is_some_and(|l| l.contains("invoices") && l.contains("paused")), "{out}");
    assert!(queue(&node, "invoices").await.paused);
    let (ok, out, err) = drover(&["list"]).await;
    assert!(ok, "{err}");
    let row = out.lines().find(|l| l.contains("invoices")).unwrap_or_else(|| panic!("listed: {out}"));
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&columns[..4], ["<default>", "invoices", "paused", "1"], "{out}");
    let (ok, _, err) = drover(&["resume", "invoices"]).await;
    assert!(ok, "{err}");
    assert!(!queue(&node, "invoices").await.paused);
    let (ok, _, err) = drover(&["pause", ""]).await;
    assert!(!ok && err.contains("type"), "an empty type is refused, saying so: {err}");
}
