//! Workflows on real nodes (docs/workflows.md): a chain advances once per
//! step through a SIGKILL of its partition's leader, each step given its
//! predecessors' results; a batch's callbacks fire once; OJS's workflow
//! endpoints show the same workflow; another tenant's workflow is
//! invisible.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{eventually, http_exchange, LocalNode, ProcessCluster};
use drover::core::workflow::{STEP_HEADER, WORKFLOW_HEADER};
use drover::proto::gateway::*;
use serde_json::{json, Value};

fn step(job_type: &str) -> CreateJobRequest {
    CreateJobRequest { r#type: job_type.into(), variables: "{}".into(), retries: Some(0), ..Default::default() }
}

/// Every job `id` made, by the step header: (key, state) of each.
async fn jobs_of(client: &drover::client::Client, id: &str) -> BTreeMap<String, Vec<(u64, String)>> {
    let mut steps: BTreeMap<String, Vec<(u64, String)>> = BTreeMap::new();
    let mut page_token = String::new();
    loop {
        let request = ListJobsRequest { page_size: 500, page_token: page_token.clone(), ..Default::default() };
        let page = client.raw().list_jobs(request).await.expect("lists").into_inner();
        for job in
            page.jobs.into_iter().filter(|j| j.custom_headers.get(WORKFLOW_HEADER).map(String::as_str) == Some(id))
        {
            steps.entry(job.custom_headers[STEP_HEADER].clone()).or_default().push((job.key, job.state));
        }
        if page.next_page_token.is_empty() {
            return steps;
        }
        page_token = page.next_page_token;
    }
}

/// Works one job of `job_type` through any of `clients`, completing it
/// with `{"step": <its step>}`; answers its variables.
async fn work_one(clients: &[drover::client::Client], job_type: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(tokio::time::Instant::now() < deadline, "no {job_type} job to work within 60 s");
        for client in clients {
            let Ok(mut jobs) = client.activate(job_type, "w", 1, 30_000, 1_000).await else { continue };
            let Some(job) = jobs.pop() else { continue };
            let result = json!({ "step": job.custom_headers[STEP_HEADER] }).to_string();
            // A completion whose answer was lost is repeated; the job's
            // attempt fences a second one off.
            for _ in 0..20 {
                match client.complete(job.key, job.attempt, &result).await {
                    Ok(()) => return serde_json::from_str(&job.variables).expect("JSON variables"),
                    Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                        return serde_json::from_str(&job.variables).expect("JSON variables")
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_advances_once_per_step_through_a_leader_kill() {
    let mut cluster = ProcessCluster::start(3, 1, 3, &[]);
    cluster.wait_ready().await;
    let client = cluster.node(0).client().await;
    let steps: Vec<CreateJobRequest> = (0..6).map(|_| step("chain-step")).collect();
    let request = CreateWorkflowRequest { kind: "chain".into(), name: "six".into(), steps, ..Default::default() };
    let made = client.raw().create_workflow(request.clone()).await.expect("creates").into_inner();
    assert_eq!((made.state.as_str(), made.steps.len()), ("running", 6));
    assert_eq!(made.steps[0].state, "created");
    assert!(made.steps[1..].iter().all(|s| s.state == "waiting"), "{made:?}");
    let all: Vec<_> = futures::future::join_all((0..3).map(|n| cluster.node(n).client())).await;
    for i in 0..3 {
        let variables = work_one(&all, "chain-step").await;
        let expected: Vec<Value> = (0..i).map(|n| json!({ "step": n.to_string() })).collect();
        match i {
            0 => assert!(variables.get("parent_results").is_none(), "{variables}"),
            _ => assert_eq!(variables["parent_results"], json!(expected), "step {i}"),
        }
    }
    let leader = cluster.leader_of(0, Duration::from_secs(10)).await;
    cluster.kill(leader);
    let survivors: Vec<_> =
        futures::future::join_all(cluster.live().into_iter().map(|n| cluster.node(n).client())).await;
    for i in 3..6 {
        let variables = work_one(&survivors, "chain-step").await;
        assert_eq!(variables["parent_results"].as_array().map(Vec::len), Some(i), "step {i} sees {i} results");
    }
    let get = GetWorkflowRequest { id: made.id.clone(), ..Default::default() };
    let survivor = survivors[0].clone();
    eventually(Duration::from_secs(20), "the chain to complete", || {
        let (survivor, get) = (survivor.clone(), get.clone());
        async move { survivor.raw().get_workflow(get).await.is_ok_and(|w| w.into_inner().state == "completed") }
    })
    .await;
    let done = survivor.raw().get_workflow(get).await.expect("reads").into_inner();
    assert_eq!((done.steps_completed, done.steps_failed), (6, 0));
    let jobs = jobs_of(&survivor, &made.id).await;
    assert_eq!(jobs.len(), 6, "one entry per step: {jobs:?}");
    for (step, made) in &jobs {
        assert_eq!(made.len(), 1, "step {step} made one job: {made:?}");
        assert_eq!(made[0].1, "completed");
    }
    // Its end is counted, once, by the leader that applied it.
    let mut completed = 0.0;
    for id in cluster.live() {
        let (_, body) = common::http_get(&cluster.node(id).admin.to_string(), "/metrics").await.expect("metrics");
        completed += body
            .lines()
            .filter(|l| l.starts_with("drover_workflows_total{") && l.contains(r#"event="completed""#))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    assert_eq!(completed, 1.0, "drover_workflows_total{{event=\"completed\"}} over the live nodes");
    // The same id and steps again: the same workflow, nothing new made.
    let again = CreateWorkflowRequest { id: made.id.clone(), ..request };
    let repeat = survivor.raw().create_workflow(again).await.expect("a repeat").into_inner();
    assert_eq!(repeat.state, "completed");
    assert_eq!(jobs_of(&survivor, &made.id).await.len(), 6);
}

/// An OJS exchange with the node at `addr`: the status and the JSON body.
async fn ojs(addr: &str, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let body = if body.is_null() { String::new() } else { body.to_string() };
    let headers = "Content-Type: application/openjobspec+json\r\n";
    let (status, _, answer) = http_exchange(method, addr, path, headers, &body).await.expect("an OJS exchange");
    (status, serde_json::from_str(&answer).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_fires_its_callbacks_once_and_ojs_shows_the_workflow() {
    let node = LocalNode::start_with(|config| {
        config.ojs_addr = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let addr = node.node().ojs_addr.expect("serves OJS").to_string();
    let body = json!({
        "type": "batch", "name": "mail",
        "jobs": [
            {"type": "mail.send", "args": ["a"], "options": {"queue": "wf-mail"}},
            {"type": "mail.send", "args": ["b"], "options": {"queue": "wf-mail", "retry": {"max_attempts": 1}}},
        ],
        "callbacks": {
            "on_complete": {"type": "mail.report", "args": [], "options": {"queue": "wf-report"}},
            "on_success": {"type": "mail.cheer", "args": [], "options": {"queue": "wf-cheer"}},
            "on_failure": {"type": "mail.alarm", "args": [], "options": {"queue": "wf-alarm"}},
        },
    });
    let (status, created) = ojs(&addr, "POST", "/ojs/v1/workflows", &body).await;
    assert_eq!(status, 201, "{created}");
    let id = created["workflow"]["id"].as_str().expect("an id").to_string();
    assert_eq!(created["workflow"]["state"], "running");
    assert_eq!(created["workflow"]["jobs_total"], 2);
    let fetch = |queue: &str| json!({"queues": [queue], "worker_id": "w"});
    let (_, first) = ojs(&addr, "POST", "/ojs/v1/workers/fetch", &fetch("wf-mail")).await;
    let job = first["jobs"][0].clone();
    assert_eq!(job["workflow_id"].as_str(), Some(id.as_str()), "{job}");
    let ack = json!({"job_id": job["id"], "worker_id": "w", "result": {"sent": job["args"][0]}});
    assert_eq!(ojs(&addr, "POST", "/ojs/v1/workers/ack", &ack).await.0, 200);
    let (_, second) = ojs(&addr, "POST", "/ojs/v1/workers/fetch", &fetch("wf-mail")).await;
    let nack = json!({"job_id": second["jobs"][0]["id"], "worker_id": "w", "error": {"message": "bounced"}});
    assert_eq!(ojs(&addr, "POST", "/ojs/v1/workers/nack", &nack).await.0, 200);
    // on_complete and on_failure, each once, with every job's result.
    let taken = |queue: &'static str| {
        let (addr, fetch) = (addr.clone(), fetch(queue));
        async move {
            let (_, body) = ojs(&addr, "POST", "/ojs/v1/workers/fetch", &fetch).await;
            body["jobs"].as_array().cloned().unwrap_or_default()
        }
    };
    let report = taken("wf-report").await;
    assert_eq!(report.len(), 1, "{report:?}");
    assert_eq!(report[0]["parent_results"], json!([{"sent": job["args"][0]}, null]));
    assert_eq!(taken("wf-alarm").await.len(), 1);
    assert!(taken("wf-cheer").await.is_empty(), "on_success does not fire when a job failed");
    assert!(taken("wf-report").await.is_empty(), "a callback fires once");
    let path = format!("/ojs/v1/workflows/{id}");
    let (status, read) = ojs(&addr, "GET", &path, &Value::Null).await;
    assert_eq!(status, 200, "{read}");
    assert_eq!(read["workflow"]["jobs_completed"], 1);
    assert_eq!(read["workflow"]["state"], "running", "its callbacks are still out");
    // Cancelling ends it; cancelling again is a conflict.
    let (status, cancelled) = ojs(&addr, "DELETE", &path, &Value::Null).await;
    assert_eq!((status, cancelled["workflow"]["state"].as_str()), (200, Some("cancelled")), "{cancelled}");
    assert_eq!(ojs(&addr, "DELETE", &path, &Value::Null).await.0, 409);
    assert_eq!(ojs(&addr, "GET", "/ojs/v1/workflows/no-such-workflow", &Value::Null).await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_creates_shows_lists_and_cancels_a_workflow() {
    let node = LocalNode::start().await;
    let address = node.node().grpc_addr.to_string();
    let cli = common::Cli::new("workflow", address);
    let drover = |args: &'static [&'static str]| cli.run(args);
    let (ok, out, err) = drover(&["create", "batch", "send", "send", "--on-failure", "alarm", "--id", "cli-1"]).await;
    assert!(ok, "{err}");
    let made: Value = serde_json::from_str(&out).expect("the workflow as JSON");
    assert_eq!((made["kind"].as_str(), made["steps"].as_array().map(Vec::len)), (Some("batch"), Some(2)), "{made}");
    assert_eq!(made["callbacks"][0]["name"], "on_failure");
    let (ok, out, err) = drover(&["list", "--running"]).await;
    assert!(ok && out.lines().any(|l| l.contains("cli-1") && l.contains("running")), "{out}{err}");
    let (ok, out, err) = drover(&["get", "cli-1"]).await;
    assert!(ok && out.contains(r#""state": "running""#), "{out}{err}");
    let (ok, out, err) = drover(&["cancel", "cli-1"]).await;
    assert!(ok && out.contains("cancelled"), "{out}{err}");
    let (ok, _, err) = drover(&["cancel", "cli-1"]).await;
    assert!(!ok && err.contains("already cancelled"), "a second cancel says why: {err}");
    let (ok, _, err) = drover(&["create", "pipeline", "a"]).await;
    assert!(!ok && err.contains("chain, group or batch"), "{err}");
}
