//! The Open Job Spec HTTP binding (docs/ojs.md), behaviour by behaviour, on
//! a real node with three partitions: the envelope, the lifecycle, retry
//! policies, the dead-letter queue, ordering, unique jobs, batches, the
//! visibility timeout, tokens, and OJS workers beside drover.v1 and Zeebe
//! workers on one job type.

mod common;

use std::time::Duration;

use common::{eventually, http_exchange, http_get, LocalNode, ProcessCluster};
use drover::proto::gateway as pb;
use drover::proto::zeebe as zb;
use serde_json::{json, Value};

async fn node() -> LocalNode {
    LocalNode::start_with(|config| {
        config.ojs_addr = Some("127.0.0.1:0".parse().unwrap());
        config.partitions = 3;
    })
    .await
}

/// A node serving OJS on `partitions` partitions that knows the tokens of
/// `entries` (a tokens file's text); the directory holding the file is
/// returned to live as long as the node.
async fn node_with_tokens(entries: &str, partitions: u32) -> (LocalNode, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, entries).unwrap();
    let node = LocalNode::start_with(move |config| {
        config.ojs_addr = Some("127.0.0.1:0".parse().unwrap());
        config.partitions = partitions;
        config.auth.tokens_file = Some(tokens);
    })
    .await;
    (node, dir)
}

struct Ojs {
    addr: String,
    token: Option<String>,
    tenant: Option<String>,
}

impl Ojs {
    fn of(node: &LocalNode) -> Ojs {
        Ojs { addr: node.node().ojs_addr.expect("the OJS port is served").to_string(), token: None, tenant: None }
    }

    /// The status, head and JSON body of a request.
    async fn raw(&self, method: &str, path: &str, body: &str) -> (u16, String, Value) {
        let mut headers = "Content-Type: application/openjobspec+json\r\n".to_string();
        if let Some(token) = &self.token {
            headers.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        if let Some(tenant) = &self.tenant {
            headers.push_str(&format!("X-OJS-Tenant: {tenant}\r\n"));
        }
        let (code, head, text) = http_exchange(method, &self.addr, path, &headers, body).await.expect("OJS answers");
        let value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{method} {path}: body {text:?} is not JSON: {e}"));
        (code, head, value)
    }

    async fn send(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let text = body.map(|b| b.to_string()).unwrap_or_default();
        let (code, _, value) = self.raw(method, path, &text).await;
        (code, value)
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.send("POST", path, Some(body)).await
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        self.send("GET", path, None).await
    }

    /// Enqueues `body`, which must be made; the job's envelope.
    async fn enqueue(&self, body: Value) -> Value {
        let (code, answer) = self.post("/ojs/v1/jobs", body).await;
        assert_eq!(code, 201, "enqueue: {answer}");
        answer["job"].clone()
    }

    async fn job(&self, id: &Value) -> Value {
        let (code, answer) = self.get(&format!("/ojs/v1/jobs/{}", id.as_str().unwrap())).await;
        assert_eq!(code, 200, "info: {answer}");
        answer["job"].clone()
    }

    async fn fetch(&self, queues: &[&str]) -> Vec<Value> {
        let (code, answer) = self.post("/ojs/v1/workers/fetch", json!({ "queues": queues, "worker_id": "w" })).await;
        assert_eq!(code, 200, "fetch: {answer}");
        answer["jobs"].as_array().unwrap().clone()
    }

    async fn nack(&self, id: &Value, error: Value) -> (u16, Value) {
        self.post("/ojs/v1/workers/nack", json!({ "job_id": id, "error": error })).await
    }
}

fn assert_error(code: u16, answer: &Value, status: u16, error_code: &str) {
    assert_eq!(code, status, "{answer}");
    assert_eq!(answer["error"]["code"], error_code, "{answer}");
    assert!(answer["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{answer}");
    assert_eq!(answer["error"]["retryable"], false, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueued_job_is_an_ojs_envelope_and_a_drover_job() {
    let node = node().await;
    let ojs = Ojs::of(&node);
    let (code, head, answer) = ojs
        .raw(
            "POST",
            "/ojs/v1/jobs",
            &json!({"type": "email.send", "args": ["a@b.c", 1], "meta": {"trace_id": "t1"}, "x_future": {"v": 2}})
                .to_string(),
        )
        .await;
    assert_eq!(code, 201, "{answer}");
    let head = head.to_ascii_lowercase();
    assert!(head.contains("content-type: application/openjobspec+json"), "{head}");
    assert!(head.contains("ojs-version: 1.0"), "{head}");
    let job = &answer["job"];
    let id = job["id"].as_str().unwrap();
    assert!(id.len() == 36 && &id[14..15] == "7", "a UUIDv7: {id}");
    assert_eq!(
        (job["state"].as_str(), job["queue"].as_str(), job["attempt"].as_i64()),
        (Some("available"), Some("default"), Some(0))
    );
    assert_eq!(job["x_future"]["v"], 2, "unknown attributes are kept");

    let read = ojs.job(&job["id"]).await;
    for field in ["id", "type", "queue", "args", "meta", "created_at", "x_future"] {
        assert_eq!(read[field], job[field], "{field}");
    }
    // The same job on drover.v1: the queue is its type, the args its variable.
    let key: u64 = read["drover"]["key"].as_str().unwrap().parse().unwrap();
    let native = node.client.get_job(key).await.expect("drover.v1 reads the job");
    assert_eq!(native.r#type, "default");
    assert_eq!(serde_json::from_str::<Value>(&native.variables).unwrap(), json!({"args": ["a@b.c", 1]}));
    assert_eq!(native.custom_headers.get("ojs.type").map(String::as_str), Some("email.send"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_the_error_catalog_and_make_nothing() {
    let node = node().await;
    let ojs = Ojs::of(&node);
    for body in [
        json!({"args": []}),
        json!({"type": "Email.Send", "args": []}),
        json!({"type": "email.send", "args": "x"}),
        json!({"type": "email.send"}),
        json!({"type": "email.send", "args": [], "id": "550e8400-e29b-41d4-a716-446655440000"}),
        json!({"type": "email.send", "args": [], "options": {"queue": "Bad Queue"}}),
        json!({"type": "email.send", "args": [], "options": {"priority": 101}}),
    ] {
        let (code, answer) = ojs.post("/ojs/v1/jobs", body.clone()).await;
        assert_error(code, &answer, 400, "invalid_request");
    }
    let (code, answer) = ojs
        .post("/ojs/v1/jobs", json!({"type": "a", "args": [], "options": {"retry": {"backoff_coefficient": 0.5}}}))
        .await;
    assert_error(code, &answer, 422, "invalid_request");
    let (code, _, answer) = ojs.raw("POST", "/ojs/v1/jobs", "{ invalid json }").await;
    assert_error(code, &answer, 400, "invalid_payload");
    let (code, answer) = ojs.get("/ojs/v1/jobs/019539a4-0000-7000-8000-000000000000").await;
    assert_error(code, &answer, 404, "not_found");
    // Too large for a job, and too large for a request: neither is a rate
    // limit to retry.
    let limits = &node.node().ctx.settings.limits;
    for size in [limits.max_payload_bytes + 1, limits.max_request_bytes() + 1] {
        let (code, answer) = ojs.post("/ojs/v1/jobs", json!({"type": "a", "args": ["x".repeat(size)]})).await;
        assert_error(code, &answer, 413, "envelope_too_large");
    }
    assert!(answer["error"]["hint"].is_string() && answer["error"]["docs_url"].is_string());
    assert!(ojs.fetch(&["default"]).await.is_empty(), "no refused enqueue made a job");
    // A batch with one bad job makes none of them.
    let batch = json!({"jobs": [{"type": "a", "args": [], "options": {"queue": "batch"}}, {"args": []}]});
    let (code, answer) = ojs.post("/ojs/v1/jobs/batch", batch).await;
    assert_error(code, &answer, 400, "invalid_request");
    assert!(ojs.fetch(&["batch"]).await.is_empty());
    // A fetch from more queues than a worker may serve is refused before it
    // activates anything, with or without a worker_id.
    let waiting = ojs.enqueue(json!({"type": "a", "args": [], "options": {"queue": "q0"}})).await;
    let queues: Vec<String> = (0..=100).map(|i| format!("q{i}")).collect();
    for fetch in [json!({"queues": queues}), json!({"queues": queues, "worker_id": "many"})] {
        let (code, answer) = ojs.post("/ojs/v1/workers/fetch", fetch).await;
        assert_error(code, &answer, 400, "invalid_request");
        assert!(answer["error"]["message"].as_str().unwrap().contains("at most 100"), "{answer}");
    }
    assert_eq!(ojs.job(&waiting["id"]).await["state"], "available", "the refused fetches took nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_moves_through_fetch_ack_and_cancel_as_the_state_machine_allows() {
    let node = node().await;
    let ojs = Ojs::of(&node);
    let job = ojs.enqueue(json!({"type": "t.ack", "args": [1], "options": {"queue": "life"}})).await;
    let (code, answer) = ojs.post("/ojs/v1/workers/ack", json!({"job_id": job["id"]})).await;
    assert_error(code, &answer, 409, "conflict");

    let fetched = ojs.fetch(&["life"]).await;
    assert_eq!(fetched.len(), 1);
    assert_eq!(
        (fetched[0]["id"].clone(), fetched[0]["state"].as_str(), fetched[0]["attempt"].as_i64()),
        (job["id"].clone(), Some("active"), Some(1))
    );
    assert!(ojs.fetch(&["life"]).await.is_empty(), "an active job is not fetched twice");
    let (code, answer) = ojs.post("/ojs/v1/workers/ack", json!({"job_id": job["id"], "result": {"sent": true}})).await;
    assert_eq!((code, answer["state"].as_str()), (200, Some("completed")), "{answer}");
    let done = ojs.job(&job["id"]).await;
    assert_eq!((done["state"].as_str(), done["result"].clone()), (Some("completed"), json!({"sent": true})));
    assert!(done["completed_at"].is_string() && done["started_at"].is_string());
    for (method, path, body) in [
        ("POST", "/ojs/v1/workers/ack", Some(json!({"job_id": job["id"]}))),
        ("POST", "/ojs/v1/workers/nack", Some(json!({"job_id": job["id"], "error": {"code": "x", "message": "y"}}))),
        ("DELETE", &*format!("/ojs/v1/jobs/{}", job["id"].as_str().unwrap()), None),
    ] {
        let (code, answer) = ojs.send(method, path, body).await;
        assert_error(code, &answer, 409, "conflict");
    }

    let later = ojs
        .enqueue(
            json!({"type": "t.later", "args": [], "options": {"queue": "life", "delay_until": "2099-12-31T23:59:59Z"}}),
        )
        .await;
    assert_eq!(later["state"], "scheduled");
    assert!(ojs.fetch(&["life"]).await.is_empty(), "a scheduled job is not fetched");
    let (code, answer) = ojs.send("DELETE", &format!("/ojs/v1/jobs/{}", later["id"].as_str().unwrap()), None).await;
    assert_eq!((code, answer["job"]["state"].as_str()), (200, Some("cancelled")), "{answer}");
    assert!(answer["job"]["cancelled_at"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacks_follow_the_retry_policy_and_exhausted_jobs_land_in_the_dead_letter_queue() {
    let node = node().await;
    let ojs = Ojs::of(&node);
    let policy = json!({"max_attempts": 2, "initial_interval": "PT0.2S", "backoff_coefficient": 1.0, "jitter": false});
    let job = ojs.enqueue(json!({"type": "t.retry", "args": [], "options": {"queue": "retry", "retry": policy}})).await;
    assert_eq!(job["max_attempts"], 2);
    assert_eq!(ojs.fetch(&["retry"]).await.len(), 1);
    let (code, answer) =
        ojs.nack(&job["id"], json!({"code": "handler_error", "message": "first", "type": "Flaky"})).await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!((answer["state"].as_str(), answer["retry_delay_ms"].as_i64()), (Some("retryable"), Some(200)));
    assert_eq!(ojs.job(&job["id"]).await["state"], "retryable");
    let again = std::sync::Mutex::new(Vec::new());
    eventually(Duration::from_secs(10), "the job to be fetchable after its back-off", || async {
        let fetched = ojs.fetch(&["retry"]).await;
        let found = !fetched.is_empty();
        *again.lock().unwrap() = fetched;
        found
    })
    .await;
    assert_eq!(again.lock().unwrap()[0]["attempt"], 2);
    let (code, answer) = ojs.nack(&job["id"], json!({"code": "handler_error", "message": "second"})).await;
    assert_eq!((code, answer["state"].as_str()), (200, Some("discarded")), "{answer}");
    let discarded = ojs.job(&job["id"]).await;
    let errors = discarded["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2, "{discarded}");
    assert_eq!((errors[0]["attempt"].as_i64(), errors[0]["type"].as_str()), (Some(1), Some("Flaky")));
    assert_eq!(errors[1]["message"], "second");

    let (_, list) = ojs.get("/ojs/v1/dead-letter?queue=retry").await;
    let ids: Vec<&Value> = list["jobs"].as_array().unwrap().iter().map(|j| &j["id"]).collect();
    assert_eq!(ids, [&job["id"]]);
    let (code, answer) =
        ojs.post(&format!("/ojs/v1/dead-letter/{}/retry", job["id"].as_str().unwrap()), json!({})).await;
    assert_eq!((code, answer["job"]["state"].as_str()), (200, Some("available")), "{answer}");
    assert_eq!(ojs.fetch(&["retry"]).await[0]["id"], job["id"]);

    // A non-retryable error discards at once, whatever attempts are left;
    // a deleted dead letter leaves the listing.
    let fatal = ojs
        .enqueue(json!({"type": "t.fatal", "args": [], "options": {"queue": "fatal", "retry": {"max_attempts": 5, "non_retryable_errors": ["Auth.*"]}}}))
        .await;
    ojs.fetch(&["fatal"]).await;
    let (_, answer) =
        ojs.nack(&fatal["id"], json!({"code": "e", "message": "m", "details": {"error_class": "Auth.Expired"}})).await;
    assert_eq!(answer["state"], "discarded", "{answer}");
    let (code, answer) =
        ojs.send("DELETE", &format!("/ojs/v1/dead-letter/{}", fatal["id"].as_str().unwrap()), None).await;
    assert_eq!((code, answer["deleted"].as_bool()), (200, Some(true)), "{answer}");
    let (_, list) = ojs.get("/ojs/v1/dead-letter?queue=fatal").await;
    assert_eq!(list["jobs"], json!([]));
}

/// The conformance suite's worker cases direct a heartbeat through a job's
/// `options.metadata.test_directive`: answered only on a node started for
/// the suite (`--ojs-test-directives`), never by default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_directives_are_answered_only_on_a_node_started_for_the_conformance_suite() {
    let plain = node().await;
    let suite = LocalNode::start_with(|config| {
        config.ojs_addr = Some("127.0.0.1:0".parse().unwrap());
        config.ojs_test_directives = true;
    })
    .await;
    for (node, answers) in [(&plain, ["running", "running"]), (&suite, ["quiet", "terminate"])] {
        let ojs = Ojs::of(node);
        for (directive, answer) in ["quiet", "terminate"].into_iter().zip(answers) {
            let queue = format!("directed-{directive}");
            let job = ojs
                .enqueue(json!({"type": "t.directed", "args": [], "options": {"queue": queue, "metadata": {"test_directive": directive}}}))
                .await;
            let worker = format!("worker-{directive}");
            let (code, fetched) =
                ojs.post("/ojs/v1/workers/fetch", json!({"queues": [queue], "worker_id": worker})).await;
            assert_eq!((code, &fetched["jobs"][0]["id"]), (200, &job["id"]), "{fetched}");
            let beat = json!({"worker_id": worker, "active_jobs": [job["id"]]});
            let (code, beat) = ojs.post("/ojs/v1/workers/heartbeat", beat).await;
            assert_eq!((code, beat["state"].as_str()), (200, Some(answer)), "{directive}: {beat}");
        }
    }
}

/// A job enqueued before the partition kept its retry policy (its OJS
/// options alone name it, as a build of data version 16 wrote them): its
/// nacks still follow that policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_enqueued_before_policies_were_kept_still_follows_its_own() {
    let node = node().await;
    let ojs = Ojs::of(&node);
    let mut native =
        pb::gateway_client::GatewayClient::connect(format!("http://{}", node.node().grpc_addr)).await.unwrap();
    let options = json!({"retry": {"max_attempts": 5, "initial_interval": "PT7S", "jitter": false, "non_retryable_errors": ["Auth.*"]}});
    let mut keys = Vec::new();
    for _ in 0..2 {
        let headers = [("ojs.type", "t.old"), ("ojs.at", "1700000000000")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .chain([("ojs.options".to_string(), options.to_string())])
            .collect();
        let create = pb::CreateJobRequest {
            r#type: "old".into(),
            variables: r#"{"args":[]}"#.into(),
            custom_headers: headers,
            retries: Some(5),
            ..Default::default()
        };
        keys.push(native.create_job(create).await.unwrap().into_inner().key);
    }
    let mut fetched = ojs.fetch(&["old"]).await;
    fetched.extend(ojs.fetch(&["old"]).await);
    assert_eq!(fetched.len(), 2, "{fetched:?}");
    let (code, answer) = ojs.nack(&fetched[0]["id"], json!({"code": "e", "message": "m", "type": "Network"})).await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!((answer["state"].as_str(), answer["retry_delay_ms"].as_i64()), (Some("retryable"), Some(7_000)));
    let (_, answer) = ojs.nack(&fetched[1]["id"], json!({"code": "e", "message": "m", "type": "Auth.Expired"})).await;
    assert_eq!(answer["state"], "discarded", "{answer}");
    for key in keys {
        let job = native.get_job(pb::GetJobRequest { key, ..Default::default() }).await.unwrap().into_inner();
        let job = job.job.unwrap();
        assert!(!job.custom_headers.contains_key("drover.retry"), "an old job keeps its headers");
        assert!(["scheduled", "incident"].contains(&job.state.as_str()), "{job:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_is_fetched_by_priority_then_fifo_across_partitions_and_queues_in_the_order_given() {
    let node = node().await;
    let ojs = Ojs::of(&node);
    let mut made = Vec::new();
    for (n, priority) in [(1, 0), (2, 0), (3, 10), (4, 0), (5, -10), (6, 10)] {
        let job = ojs
            .enqueue(json!({"type": "t.order", "args": [n], "options": {"queue": "ordered", "priority": priority}}))
            .await;
        made.push((n, job["id"].clone()));
    }
    let mut order = Vec::new();
    for _ in 0..made.len() {
        order.push(ojs.fetch(&["ordered"]).await[0]["args"][0].as_i64().unwrap());
    }
    assert_eq!(order, [3, 6, 1, 2, 4, 5]);

    let low = ojs.enqueue(json!({"type": "t.q", "args": ["low"], "options": {"queue": "low"}})).await;
    let high = ojs.enqueue(json!({"type": "t.q", "args": ["high"], "options": {"queue": "high"}})).await;
    assert_eq!(ojs.fetch(&["high", "low"]).await[0]["id"], high["id"]);
    assert_eq!(ojs.fetch(&["high", "low"]).await[0]["id"], low["id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_ids_and_unique_jobs_make_one_job() {
    let node = node().await;
    let ojs = Ojs::of(&node);
    let id = "019539a4-aaaa-7000-8000-111111111111";
    let job = ojs.enqueue(json!({"type": "t.id", "args": [1], "id": id})).await;
    assert_eq!(job["id"], id);
    assert_eq!(ojs.job(&json!(id)).await["args"], json!([1]));
    for args in [json!([1]), json!([2])] {
        let (code, answer) = ojs.post("/ojs/v1/jobs", json!({"type": "t.id", "args": args, "id": id})).await;
        assert_error(code, &answer, 409, "duplicate");
    }

    let unique = |on_conflict: &str, version: i64| json!({"type": "t.unique", "args": [version], "options": {"queue": "uq", "unique": {"keys": ["type"], "on_conflict": on_conflict}}});
    let first = ojs.enqueue(unique("reject", 1)).await;
    let (code, answer) = ojs.post("/ojs/v1/jobs", unique("reject", 2)).await;
    assert_eq!((code, answer["error"]["code"].as_str()), (409, Some("duplicate")), "{answer}");
    let (code, answer) = ojs.post("/ojs/v1/jobs", unique("ignore", 2)).await;
    assert_eq!((code, answer["job"]["id"].clone()), (200, first["id"].clone()), "{answer}");
    let replacement = ojs.enqueue(unique("replace", 3)).await;
    assert_ne!(replacement["id"], first["id"]);
    assert_eq!(ojs.job(&first["id"]).await["state"], "cancelled");
    // Once the job is done it no longer blocks (the default states are the
    // unfinished ones), and the next generation is made.
    assert_eq!(ojs.fetch(&["uq"]).await[0]["id"], replacement["id"]);
    ojs.post("/ojs/v1/workers/ack", json!({"job_id": replacement["id"]})).await;
    let next = ojs.enqueue(unique("reject", 4)).await;
    assert_ne!(next["id"], replacement["id"]);
    // A period: a duplicate is refused within it and made after it.
    let periodic = json!({"type": "t.period", "args": [], "options": {"unique": {"period": "PT1S"}}});
    ojs.enqueue(periodic.clone()).await;
    assert_eq!(ojs.post("/ojs/v1/jobs", periodic.clone()).await.0, 409);
    eventually(Duration::from_secs(10), "the unique period to pass", || async {
        ojs.post("/ojs/v1/jobs", periodic.clone()).await.0 == 201
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_made_in_one_request_and_each_job_is_fetchable() {
    let node = node().await;
    let ojs = Ojs::of(&node);
    let jobs: Vec<Value> =
        (0..20).map(|i| json!({"type": "t.bulk", "args": [i], "options": {"queue": "bulk"}})).collect();
    let (code, answer) = ojs.post("/ojs/v1/jobs/batch", json!({ "jobs": jobs })).await;
    assert_eq!((code, answer["count"].as_i64()), (201, Some(20)), "{answer}");
    let made = answer["jobs"].as_array().unwrap();
    assert!(made.iter().all(|j| j["state"] == "available"));
    let (_, fetched) = ojs.post("/ojs/v1/workers/fetch", json!({"queues": ["bulk"], "count": 50})).await;
    let args: Vec<i64> = fetched["jobs"].as_array().unwrap().iter().map(|j| j["args"][0].as_i64().unwrap()).collect();
    assert_eq!(args, (0..20).collect::<Vec<_>>(), "a batch keeps its order within the queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_job_comes_back_after_its_visibility_timeout_unless_heartbeats_hold_it() {
    let node = node().await;
    let ojs = Ojs::of(&node);
    let held = ojs
        .enqueue(json!({"type": "t.held", "args": [], "options": {"queue": "vis", "visibility_timeout_ms": 1500}}))
        .await;
    let lost = ojs
        .enqueue(json!({"type": "t.lost", "args": [], "options": {"queue": "vis", "visibility_timeout_ms": 1500}}))
        .await;
    let (_, fetched) = ojs.post("/ojs/v1/workers/fetch", json!({"queues": ["vis"], "count": 2})).await;
    assert_eq!(fetched["jobs"].as_array().unwrap().len(), 2);
    let key = |job: &Value| -> u64 { job["drover"]["key"].as_str().unwrap().parse().unwrap() };
    let deadline = node.client.get_job(key(&held)).await.unwrap().deadline;
    // The held job is beaten for until the lost one is back.
    eventually(Duration::from_secs(15), "the unbeaten job to be available again", || async {
        let (code, beat) =
            ojs.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "w", "active_jobs": [held["id"]]})).await;
        assert_eq!((code, beat["state"].as_str()), (200, Some("running")), "{beat}");
        assert_eq!(beat["jobs_extended"], json!([held["id"]]), "{beat}");
        ojs.job(&lost["id"]).await["state"] == "available"
    })
    .await;
    assert_eq!(ojs.job(&held["id"]).await["state"], "active");
    assert!(node.client.get_job(key(&held)).await.unwrap().deadline > deadline, "heartbeats moved the deadline");
    let (code, answer) = ojs.post("/ojs/v1/workers/ack", json!({"job_id": held["id"]})).await;
    assert_eq!(code, 200, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_own_timeout_holds_each_activation_whatever_the_fetch_asks_with_no_write_after() {
    let node = node().await;
    let ojs = Ojs::of(&node);
    let long =
        ojs.enqueue(json!({"type": "t.long", "args": [], "options": {"queue": "own", "timeout_ms": 600_000}})).await;
    let key: u64 = long["drover"]["key"].as_str().unwrap().parse().unwrap();
    let stored = node.client.get_job(key).await.unwrap();
    assert_eq!(stored.custom_headers.get("drover.activation_timeout").map(String::as_str), Some("600000"));
    let (code, fetched) =
        ojs.post("/ojs/v1/workers/fetch", json!({"queues": ["own"], "visibility_timeout_ms": 1_000})).await;
    assert_eq!(code, 200, "{fetched}");
    let request = pb::GetJobRequest { key, include_history: true, ..Default::default() };
    let job = node.client.raw().get_job(request).await.unwrap().into_inner().job.unwrap();
    let activated = job.history.iter().find(|e| e.kind == "activated").expect("an activation in its history");
    assert!(
        job.deadline - activated.at >= 600_000,
        "the job's own 600 s holds its activation, not the fetch's 1 s: activated at {}, deadline {}",
        activated.at,
        job.deadline
    );
    let kinds: Vec<&str> = job.history.iter().map(|e| e.kind.as_str()).collect();
    assert!(!kinds.contains(&"extended"), "the fetch moved no deadline after the activation: {kinds:?}");
    // A drover.v1 producer names it the same way, and a poll with a short timeout gets it.
    let create = pb::CreateJobRequest { r#type: "v1.long".into(), activation_timeout: 600_000, ..Default::default() };
    let key = node.client.create(create).await.unwrap();
    let jobs = node.client.activate("v1.long", "w", 1, 1_000, 5_000).await.unwrap();
    assert_eq!(jobs.iter().map(|j| j.key).collect::<Vec<_>>(), vec![key]);
    let job = node.client.get_job(key).await.unwrap();
    assert!(
        jobs[0].deadline >= job.created_at + 600_000,
        "deadline {} for a job made at {}",
        jobs[0].deadline,
        job.created_at
    );
    let bad = pb::CreateJobRequest { r#type: "v1.long".into(), activation_timeout: -1, ..Default::default() };
    let refused = node.client.create(bad).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ojs_drover_and_zeebe_workers_share_one_job_type() {
    let node = node().await;
    let ojs = Ojs::of(&node);
    let address = format!("http://{}", node.node().grpc_addr);
    // OJS makes, drover.v1 works.
    let job = ojs.enqueue(json!({"type": "pay.card", "args": [{"amount": 3}], "options": {"queue": "payments"}})).await;
    let mut native = pb::gateway_client::GatewayClient::connect(address.clone()).await.unwrap();
    let request = pb::ActivateJobsRequest {
        r#type: "payments".into(),
        worker: "native".into(),
        timeout: 30_000,
        max_jobs_to_activate: 5,
        ..Default::default()
    };
    let mut replies = native.activate_jobs(request).await.unwrap().into_inner();
    let activated = replies.message().await.unwrap().expect("an activation").jobs;
    assert_eq!(activated.len(), 1);
    assert_eq!(serde_json::from_str::<Value>(&activated[0].variables).unwrap(), json!({"args": [{"amount": 3}]}));
    let complete = pb::CompleteJobRequest {
        key: activated[0].key,
        variables: r#"{"paid":true}"#.into(),
        attempt: activated[0].attempt,
        ..Default::default()
    };
    native.complete_job(complete).await.unwrap();
    let done = ojs.job(&job["id"]).await;
    assert_eq!((done["state"].as_str(), done["result"].clone()), (Some("completed"), json!({"paid": true})));

    // drover.v1 makes, OJS works: the variables are the one argument.
    let key = node.client.create_job("payments", r#"{"amount":4}"#).await.unwrap();
    let fetched = ojs.fetch(&["payments"]).await;
    assert_eq!(fetched[0]["args"], json!([{"amount": 4}]));
    assert_eq!(fetched[0]["drover"]["key"], key.to_string());
    ojs.post("/ojs/v1/workers/ack", json!({"job_id": fetched[0]["id"]})).await;

    // OJS makes, a Zeebe worker works.
    let job = ojs.enqueue(json!({"type": "pay.refund", "args": [5], "options": {"queue": "payments"}})).await;
    let mut zeebe = drover::proto::zeebe::gateway_client::GatewayClient::connect(address).await.unwrap();
    let activate = zb::ActivateJobsRequest {
        r#type: "payments".into(),
        worker: "z".into(),
        timeout: 30_000,
        max_jobs_to_activate: 1,
        request_timeout: -1,
        ..Default::default()
    };
    let mut stream = zeebe.activate_jobs(activate).await.unwrap().into_inner();
    let zjob = stream.message().await.unwrap().expect("an activation").jobs.remove(0);
    assert_eq!(
        zjob.custom_headers,
        serde_json::to_string(&serde_json::from_str::<Value>(&zjob.custom_headers).unwrap()).unwrap()
    );
    zeebe.complete_job(zb::CompleteJobRequest { job_key: zjob.key, variables: "{}".into() }).await.unwrap();
    assert_eq!(ojs.job(&job["id"]).await["state"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ojs_port_takes_the_same_tokens_and_scopes_as_the_grpc_port() {
    use drover::auth::keys::{generate_secret, token_entry};
    let (admin, worker) = (generate_secret(), generate_secret());
    let entries = token_entry("admin", &admin, &["*".into()], &["*".into()])
        + &token_entry(
            "mailer",
            &worker,
            &["jobs:create:mail".into(), "jobs:work:mail".into(), "jobs:read:mail".into()],
            &["acme".into()],
        );
    let (node, _dir) = node_with_tokens(&entries, 1).await;
    let mut ojs = Ojs::of(&node);
    let (code, health) = ojs.get("/ojs/v1/health").await;
    assert_eq!((code, health["status"].as_str()), (200, Some("ok")), "probes need no token");
    assert_eq!(ojs.get("/ojs/manifest").await.0, 200);
    let (code, answer) = ojs.post("/ojs/v1/jobs", json!({"type": "a", "args": []})).await;
    assert_eq!((code, answer["error"]["code"].as_str()), (401, Some("unauthenticated")), "{answer}");
    // Requests are counted by route and status, on the admin port's /metrics.
    let (_, metrics) = common::http_request_with(
        "GET",
        &node.node().admin_addr.to_string(),
        "/metrics",
        &format!("Authorization: Bearer {admin}\r\n"),
    )
    .await
    .unwrap();
    assert!(metrics.contains("drover_ojs_requests_total{route=\"POST /ojs/v1/jobs\",status=\"401\"}"), "{metrics}");
    // A job of the default tenant, made by the admin.
    ojs.token = Some(admin.clone());
    let theirs = ojs.enqueue(json!({"type": "send", "args": [], "options": {"queue": "mail"}})).await;
    ojs.token = Some(worker);
    // Another tenant's job is not there for it, by id or by fetch.
    let (code, answer) = ojs.get(&format!("/ojs/v1/jobs/{}", theirs["id"].as_str().unwrap())).await;
    assert_error(code, &answer, 404, "not_found");
    let (code, answer) = ojs.post("/ojs/v1/workers/ack", json!({"job_id": theirs["id"]})).await;
    assert_error(code, &answer, 404, "not_found");
    let (code, answer) = ojs.send("DELETE", &format!("/ojs/v1/jobs/{}", theirs["id"].as_str().unwrap()), None).await;
    assert_error(code, &answer, 404, "not_found");
    // Its tenant is acme: without OJS's tenant header it acts for the
    // default tenant, which it may not.
    let (code, answer) =
        ojs.post("/ojs/v1/jobs", json!({"type": "send", "args": [], "options": {"queue": "mail"}})).await;
    assert_eq!((code, answer["error"]["code"].as_str()), (403, Some("forbidden")), "{answer}");
    ojs.tenant = Some("acme".into());
    let job = ojs.enqueue(json!({"type": "send", "args": [], "options": {"queue": "mail"}})).await;
    let (code, answer) = ojs
        .post(
            "/ojs/v1/jobs",
            json!({"type": "send", "args": [], "meta": {"tenant_id": "globex"}, "options": {"queue": "mail"}}),
        )
        .await;
    assert_error(code, &answer, 400, "invalid_request");
    let (code, answer) =
        ojs.post("/ojs/v1/jobs", json!({"type": "send", "args": [], "options": {"queue": "billing"}})).await;
    assert_eq!((code, answer["error"]["code"].as_str()), (403, Some("forbidden")), "{answer}");
    let (code, answer) = ojs.post("/ojs/v1/workers/fetch", json!({"queues": ["billing"]})).await;
    assert_eq!(code, 403, "{answer}");
    assert_eq!(ojs.fetch(&["mail"]).await.len(), 1);
    // A read by id needs no tenant header: the job is checked against
    // every tenant the principal holds.
    ojs.token = Some(admin);
    ojs.tenant = None;
    let (code, answer) = ojs.get(&format!("/ojs/v1/jobs/{}", job["id"].as_str().unwrap())).await;
    assert_eq!(code, 200, "the admin holds every tenant: {answer}");
    ojs.tenant = Some("acme".into());
    let (code, answer) = ojs.post("/ojs/v1/admin/jobs/bulk/cancel", json!({})).await;
    assert_error(code, &answer, 400, "invalid_request");
    let (code, answer) = ojs.post("/ojs/v1/admin/jobs/bulk/cancel", json!({"confirm": true})).await;
    assert_eq!((code, answer["cancelled"].as_u64()), (200, Some(1)), "acme's one unfinished job: {answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_workers_ack_never_lands_on_the_next_activation() {
    let node = node().await;
    let ojs = Ojs::of(&node);
    let job = ojs.enqueue(json!({"type": "t.fence", "args": [], "options": {"queue": "fence"}})).await;
    let fetch = |worker: &'static str| json!({"queues": ["fence"], "worker_id": worker, "visibility_timeout_ms": 300});
    let (_, first) = ojs.post("/ojs/v1/workers/fetch", fetch("alpha")).await;
    assert_eq!(first["jobs"][0]["attempt"], 1, "{first}");
    let second = std::sync::Mutex::new(Value::Null);
    eventually(Duration::from_secs(10), "the job to be handed to another worker", || async {
        let (_, fetched) = ojs.post("/ojs/v1/workers/fetch", fetch("beta")).await;
        let found = !fetched["jobs"].as_array().unwrap().is_empty();
        *second.lock().unwrap() = fetched;
        found
    })
    .await;
    let second = second.lock().unwrap().clone();
    assert_eq!(second["jobs"][0]["id"], job["id"]);
    let attempt = second["jobs"][0]["attempt"].as_u64().unwrap();
    assert!(attempt >= 2, "{second}");
    // The first worker's beat is told to stop and does not move the
    // holder's deadline; the holder's own beat does.
    let key = job["drover"]["key"].as_str().unwrap().parse::<u64>().unwrap();
    let deadline = node.client.get_job(key).await.unwrap().deadline;
    let (code, beat) =
        ojs.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "alpha", "active_jobs": [job["id"]]})).await;
    assert_eq!(code, 200, "{beat}");
    assert_eq!((&beat["revoked"], &beat["jobs_extended"]), (&json!([job["id"]]), &json!([])), "{beat}");
    assert_eq!(node.client.get_job(key).await.unwrap().deadline, deadline, "a lapsed worker's beat moved the deadline");
    let (_, beat) =
        ojs.post("/ojs/v1/workers/heartbeat", json!({"worker_id": "beta", "active_jobs": [job["id"]]})).await;
    assert_eq!(beat["jobs_extended"], json!([job["id"]]), "{beat}");
    // The first worker's outcome, named by its attempt or by its name, is
    // refused; so is one naming neither, which may be the lapsed worker's.
    let (code, answer) = ojs.post("/ojs/v1/workers/ack", json!({"job_id": job["id"], "attempt": 1})).await;
    assert_error(code, &answer, 409, "conflict");
    let (code, answer) = ojs.post("/ojs/v1/workers/ack", json!({"job_id": job["id"], "result": {"by": "?"}})).await;
    assert_error(code, &answer, 409, "conflict");
    assert!(answer["error"]["message"].as_str().unwrap().contains("timed out"), "{answer}");
    let (code, answer) = ojs.nack(&job["id"], json!({"code": "late"})).await;
    assert_error(code, &answer, 409, "conflict");
    assert_eq!(ojs.job(&job["id"]).await["state"], "active", "no unnamed outcome landed");
    let nack = json!({"job_id": job["id"], "worker_id": "beta", "error": {"code": "failed"}});
    let (code, answer) = ojs.post("/ojs/v1/workers/nack", nack).await;
    assert_eq!(code, 200, "the holder's nack, naming it: {answer}");
    let third = std::sync::Mutex::new(Value::Null);
    eventually(Duration::from_secs(10), "the failed job to be fetchable again", || async {
        let (_, fetched) = ojs.post("/ojs/v1/workers/fetch", fetch("gamma")).await;
        let found = !fetched["jobs"].as_array().unwrap().is_empty();
        *third.lock().unwrap() = fetched;
        found
    })
    .await;
    let (code, answer) = ojs.post("/ojs/v1/workers/ack", json!({"job_id": job["id"], "worker_id": "beta"})).await;
    assert_error(code, &answer, 409, "conflict");
    let attempt = third.lock().unwrap()["jobs"][0]["attempt"].clone();
    let ack = json!({"job_id": job["id"], "attempt": attempt, "worker_id": "gamma"});
    let (code, answer) = ojs.post("/ojs/v1/workers/ack", ack.clone()).await;
    assert_eq!((code, answer["state"].as_str()), (200, Some("completed")), "{answer}");
    // The same ack again (its answer was lost) is answered as done; an ack
    // naming no activation finds the job finished.
    let (code, answer) = ojs.post("/ojs/v1/workers/ack", ack).await;
    assert_eq!(code, 200, "a repeated ack of the same attempt: {answer}");
    let (code, answer) = ojs.post("/ojs/v1/workers/ack", json!({"job_id": job["id"]})).await;
    assert_error(code, &answer, 409, "conflict");
    assert_eq!(ojs.job(&job["id"]).await["state"], "completed");
}

/// An ack of a job the binding named is one write: the partition checks the
/// id and the activation, so the gateway reads nothing, whether the ack
/// names its attempt, its worker, or neither. A client's own id is read
/// first, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_is_one_write_with_no_read_of_the_job() {
    let node = node().await;
    let ojs = Ojs::of(&node);
    let admin = node.node().admin_addr.to_string();
    let reads = || async {
        let (_, body) = http_get(&admin, "/metrics").await.unwrap();
        common::metric_sum(&body, "drover_gateway_job_reads_total")
    };
    let acks = [json!({}), json!({"worker_id": "w1"}), json!({"attempt": 1}), json!({"attempt": 1, "worker_id": "w1"})];
    for extra in acks {
        let job = ojs.enqueue(json!({"type": "t.one", "args": [], "options": {"queue": "one-write"}})).await;
        let (code, fetched) =
            ojs.post("/ojs/v1/workers/fetch", json!({"queues": ["one-write"], "worker_id": "w1"})).await;
        assert_eq!((code, &fetched["jobs"][0]["id"]), (200, &job["id"]), "{fetched}");
        let mut ack = json!({"job_id": job["id"], "result": {"done": true}});
        ack.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let before = reads().await;
        let (code, answer) = ojs.post("/ojs/v1/workers/ack", ack.clone()).await;
        assert_eq!(
            (code, answer["state"].as_str(), answer["attempt"].as_u64()),
            (200, Some("completed"), Some(1)),
            "{ack}: {answer}"
        );
        assert_eq!(reads().await, before, "the ack {ack} read the job");
        let done = ojs.job(&job["id"]).await;
        assert_eq!((done["state"].as_str(), done["result"].clone()), (Some("completed"), json!({"done": true})));
    }
    // A client's id leads to no key: the job is read by it, then completed.
    let id = "019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f";
    let job = ojs.enqueue(json!({"id": id, "type": "t.own", "args": [], "options": {"queue": "own-id"}})).await;
    assert_eq!(job["id"], id);
    let (_, fetched) = ojs.post("/ojs/v1/workers/fetch", json!({"queues": ["own-id"]})).await;
    assert_eq!(fetched["jobs"][0]["id"], id, "{fetched}");
    let before = reads().await;
    let (code, answer) = ojs.post("/ojs/v1/workers/ack", json!({"job_id": id})).await;
    assert_eq!((code, answer["state"].as_str()), (200, Some("completed")), "{answer}");
    assert!(reads().await > before, "a client's id is found by a read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ojs_worker_is_a_drover_session_that_operators_direct() {
    let node = node().await;
    let ojs = Ojs::of(&node);
    let fetch = |worker: &'static str| {
        let ojs = &ojs;
        async move {
            let (code, answer) =
                ojs.post("/ojs/v1/workers/fetch", json!({ "queues": ["sessions"], "worker_id": worker })).await;
            assert_eq!(code, 200, "fetch: {answer}");
            answer["jobs"].as_array().unwrap().clone()
        }
    };
    let beat = |worker: &'static str| {
        let ojs = &ojs;
        async move {
            let (code, answer) =
                ojs.post("/ojs/v1/workers/heartbeat", json!({ "worker_id": worker, "active_jobs": [] })).await;
            assert_eq!(code, 200, "heartbeat: {answer}");
            answer["state"].as_str().unwrap().to_string()
        }
    };
    for i in 0..3 {
        ojs.enqueue(json!({"type": "s.job", "args": [i], "options": {"queue": "sessions"}})).await;
    }
    assert_eq!(fetch("ojs-w1").await.len(), 1, "the first fetch registers the worker's session");
    let workers = node.client.raw().list_workers(pb::ListWorkersRequest::default()).await.unwrap().into_inner();
    let session = workers.workers.iter().find(|w| w.worker_id == "ojs-w1").expect("the OJS worker is a session");
    assert_eq!(session.job_types, ["sessions"]);
    assert_eq!(session.held_jobs, 1, "it holds the job it fetched");
    assert_eq!(beat("ojs-w1").await, "running");

    let direct = |state: &str| pb::SetWorkerStateRequest {
        session_id: session.session_id,
        state: state.into(),
        ..Default::default()
    };
    node.client.raw().set_worker_state(direct("quiet")).await.unwrap();
    assert_eq!(beat("ojs-w1").await, "quiet", "an operator's quiet reaches the OJS worker");
    assert!(fetch("ojs-w1").await.is_empty(), "a quiet worker's fetch gets nothing");
    assert_eq!(fetch("ojs-w2").await.len(), 1, "another worker still gets jobs");
    node.client.raw().set_worker_state(direct("running")).await.unwrap();
    assert_eq!(fetch("ojs-w1").await.len(), 1, "running again, it gets jobs");
    node.client.raw().set_worker_state(direct("terminate")).await.unwrap();
    assert_eq!(beat("ojs-w1").await, "terminate");
    // A heartbeat of a worker that never fetched registers it too.
    assert_eq!(beat("ojs-w3").await, "running");
    let workers = node.client.raw().list_workers(pb::ListWorkersRequest::default()).await.unwrap().into_inner();
    assert!(workers.workers.iter().any(|w| w.worker_id == "ojs-w3"), "{workers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_of_a_client_id_that_looks_server_made_completes_its_own_job_only() {
    let node = node().await;
    let ojs = Ojs::of(&node);
    // Another job, held by a drover.v1 worker at attempt 1.
    let victim =
        node.client.create(pb::CreateJobRequest { r#type: "victim".into(), ..Default::default() }).await.unwrap();
    let held = node.client.activate("victim", "w", 1, 600_000, 10_000).await.unwrap();
    assert_eq!((held.len(), held[0].attempt), (1, 1));
    // A client's own id that passes the check of a server-made id for that
    // job's key (at another time than the job's).
    let id = drover::gateway::ojs::ids::job_id(drover::core::JobKey(victim), 1_700_000_000_000);
    assert_eq!(drover::gateway::ojs::ids::key_of(&id), Some(drover::core::JobKey(victim)));
    let (code, created) =
        ojs.post("/ojs/v1/jobs", json!({"type": "mine", "id": id, "args": [], "options": {"queue": "mine"}})).await;
    assert_eq!(code, 201, "{created}");
    let (_, fetched) = ojs.post("/ojs/v1/workers/fetch", json!({"queues": ["mine"], "worker_id": "m"})).await;
    assert_eq!(
        (fetched["jobs"][0]["id"].as_str(), fetched["jobs"][0]["attempt"].as_u64()),
        (Some(id.as_str()), Some(1))
    );
    let (code, acked) = ojs.post("/ojs/v1/workers/ack", json!({"job_id": id, "attempt": 1})).await;
    assert_eq!(code, 200, "{acked}");
    assert_eq!(ojs.job(&json!(id)).await["state"], "completed", "the acked job is the client's");
    let still = node.client.get_job(victim).await.unwrap();
    assert_eq!((still.state.as_str(), still.attempt), ("activated", 1), "the other job is untouched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_token_acks_and_nacks_its_queue_without_read_and_another_tenants_worker_may_not() {
    use drover::auth::keys::{generate_secret, token_entry};
    let (producer, worker, stranger) = (generate_secret(), generate_secret(), generate_secret());
    let entries = token_entry("producer", &producer, &["jobs:create:mail".into()], &["acme".into()])
        + &token_entry("worker", &worker, &["jobs:work:mail".into()], &["acme".into()])
        + &token_entry("stranger", &stranger, &["jobs:*".into()], &["globex".into()]);
    let (node, _dir) = node_with_tokens(&entries, 1).await;
    let mut ojs = Ojs::of(&node);
    ojs.tenant = Some("acme".into());
    ojs.token = Some(producer);
    for _ in 0..2 {
        ojs.enqueue(json!({"type": "send", "args": [], "options": {"queue": "mail"}})).await;
    }
    ojs.token = Some(worker);
    let fetch = json!({"queues": ["mail"], "count": 2, "worker_id": "w"});
    let (code, fetched) = ojs.post("/ojs/v1/workers/fetch", fetch).await;
    assert_eq!(code, 200, "{fetched}");
    let jobs = fetched["jobs"].as_array().cloned().unwrap_or_default();
    assert_eq!(jobs.len(), 2, "{fetched}");
    // Another tenant's worker, naming the job and its attempt, is refused and changes nothing.
    let stranger_ojs = Ojs { token: Some(stranger), tenant: Some("globex".into()), ..Ojs::of(&node) };
    let ack = json!({"job_id": jobs[0]["id"], "attempt": jobs[0]["attempt"]});
    let (code, answer) = stranger_ojs.post("/ojs/v1/workers/ack", ack.clone()).await;
    assert_error(code, &answer, 404, "not_found");
    let (code, answer) = stranger_ojs.post("/ojs/v1/workers/nack", ack.clone()).await;
    assert_error(code, &answer, 404, "not_found");
    // Its own worker, with jobs:work:mail alone, acks one and nacks the other.
    let (code, answer) = ojs.post("/ojs/v1/workers/ack", ack).await;
    assert_eq!((code, answer["state"].as_str()), (200, Some("completed")), "{answer}");
    let nack = json!({"job_id": jobs[1]["id"], "attempt": jobs[1]["attempt"], "error": {"message": "bounced"}});
    let (code, answer) = ojs.post("/ojs/v1/workers/nack", nack).await;
    assert_eq!(code, 200, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_option_throttles_its_queue_and_only_a_manager_may_change_it() {
    use drover::auth::keys::{generate_secret, token_entry};
    let (admin, producer) = (generate_secret(), generate_secret());
    // A producer that may create and work, not read or manage.
    let scopes = ["jobs:create:throttled".into(), "jobs:work:throttled".into()];
    let entries = token_entry("admin", &admin, &["*".into()], &["*".into()])
        + &token_entry("producer", &producer, &scopes, &["*".into()]);
    let (node, _dir) = node_with_tokens(&entries, 3).await;
    let mut ojs = Ojs::of(&node);
    let job = |n: u32, per_second: u32| json!({"type": "throttled.job", "args": [n], "options": {"queue": "throttled", "rate_limit": {"max_per_second": per_second}}});
    // Declaring a limit the queue does not have is managing it.
    ojs.token = Some(producer.clone());
    let (code, answer) = ojs.post("/ojs/v1/jobs", job(0, 1)).await;
    assert_error(code, &answer, 403, "forbidden");
    // An operator sets it (on gRPC, so the OJS port has not seen it).
    let operator = node.client.clone().with_token(&admin).unwrap();
    let limit = pb::QueueLimit { queue: Some(pb::LimitLevel { rate: 1, ..Default::default() }), per_key: None };
    let request = pb::SetQueueLimitRequest { r#type: "throttled".into(), limit: Some(limit), ..Default::default() };
    operator.raw().set_queue_limit(request).await.expect("the operator limits the queue");
    // The limit it has already: creating is enough; another: refused.
    for n in 0..3 {
        ojs.enqueue(job(n, 1)).await;
    }
    let (code, answer) = ojs.post("/ojs/v1/jobs", job(4, 5)).await;
    assert_error(code, &answer, 403, "forbidden");
    assert_eq!(ojs.fetch(&["throttled"]).await.len(), 1, "the first job");
    assert!(ojs.fetch(&["throttled"]).await.is_empty(), "no second within the second");
    let started = std::time::Instant::now();
    let mut next = Vec::new();
    while next.is_empty() {
        assert!(started.elapsed() < Duration::from_secs(5), "a token came back within 5 s");
        next = ojs.fetch(&["throttled"]).await;
    }
    assert_eq!(next.len(), 1, "one a second");
    ojs.token = Some(admin);
    let (code, stats) = ojs.get("/ojs/v1/queues/throttled/stats").await;
    assert_eq!(code, 200, "{stats}");
    assert_eq!(stats["queue"]["configuration"]["rate_limit"]["limit"], json!(1), "{stats}");
    assert_eq!(stats["queue"]["configuration"]["rate_limit"]["period_ms"], json!(1000), "{stats}");
    // Malformed: 400 naming the field.
    let bad = json!({"type": "a", "args": [], "options": {"queue": "throttled", "rate_limit": {"max_per_second": 0}}});
    let (code, answer) = ojs.post("/ojs/v1/jobs", bad).await;
    assert!(code == 400 || code == 422, "{code} {answer}");
    assert!(answer["error"]["message"].as_str().unwrap_or_default().contains("max_per_second"), "{answer}");
    // Queue figures and limits are read from the leaders' applied state:
    // twenty reads of them add no entry to any partition's log (through
    // the log they cost an entry per partition and read each).
    let logs = || {
        let ctx = &node.node().ctx;
        (0..3).map(|p| ctx.routing.replica(p).expect("a replica").status().last_log_index).collect::<Vec<_>>()
    };
    let before = logs();
    for _ in 0..20 {
        let (code, stats) = ojs.get("/ojs/v1/queues/throttled/stats").await;
        assert_eq!(code, 200, "{stats}");
    }
    let after = logs();
    let grew: u64 = after.iter().zip(&before).map(|(a, b)| a - b).sum();
    assert!(grew < 20, "twenty reads of queue figures wrote {grew} log entries: {before:?} to {after:?}");
}

/// Each gateway an OJS worker reaches registers its session again, which for
/// a live session is a renewal: one that fails on one partition (its leader
/// stalled past the request's deadline) fails that request and nothing else.
/// The session and the jobs it holds stay as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_renewal_that_fails_on_one_partition_ends_nothing() {
    let args = ["--heartbeat-ms", "50", "--election-timeout-ms", "300", "--ojs-addr", "127.0.0.1:0"];
    let cluster =
        ProcessCluster::start_with_failpoints("", 2, &[&args[..], &["--request-timeout-ms", "1000"]].concat());
    cluster.wait_ready().await;
    let lagging = cluster.leader_of(1, Duration::from_secs(20)).await;
    let first = cluster.other_than(lagging);
    let second = (0..3).find(|n| *n != first && *n != lagging).unwrap();
    let ojs_at = |node: usize| Ojs { addr: cluster.node(node).ojs.clone().unwrap(), token: None, tenant: None };
    let (ojs, again) = (ojs_at(first), ojs_at(second));
    for n in 0..8 {
        ojs.enqueue(json!({"type": "t.renew", "args": [n], "options": {"queue": "renew"}})).await;
    }
    let fetch = json!({"queues": ["renew"], "worker_id": "w1", "count": 8, "visibility_timeout_ms": 600_000});
    let mut held = Vec::new();
    let started = std::time::Instant::now();
    while held.len() < 8 {
        assert!(started.elapsed() < Duration::from_secs(20), "the worker holds only {held:?} after 20 s");
        let (code, answer) = ojs.post("/ojs/v1/workers/fetch", fetch.clone()).await;
        assert_eq!(code, 200, "fetch: {answer}");
        held.extend(answer["jobs"].as_array().unwrap().iter().map(|j| j["id"].clone()));
    }

    // Partition 1's leader holds its next apply past the request deadline;
    // the second gateway, which has not seen this worker, registers it again.
    let armed = common::http_request(
        "PUT",
        &cluster.node(lagging).admin,
        "/actuator/failpoints/apply_hold_1?count=1&hold_ms=3000",
    )
    .await
    .unwrap();
    assert_eq!(armed.0, 200, "{armed:?}");
    let (code, answer) = again.post("/ojs/v1/workers/fetch", json!({"queues": ["renew"], "worker_id": "w1"})).await;
    assert!(code >= 500, "the renewal missed partition 1's deadline: {code} {answer}");

    // Listing the workers goes through partition 1 after the held entry (it
    // misses the deadline until the hold ends), so anything sent there
    // before it has applied.
    let client = drover::client::Client::connect(&cluster.node(first).grpc).await.unwrap();
    let started = std::time::Instant::now();
    let workers = loop {
        match client.raw().list_workers(pb::ListWorkersRequest::default()).await {
            Ok(answer) => break answer.into_inner().workers,
            Err(status) => assert!(started.elapsed() < Duration::from_secs(20), "no worker list in 20 s: {status}"),
        }
    };
    let w1 = workers.iter().find(|w| w.worker_id == "w1").unwrap_or_else(|| panic!("w1's session lives: {workers:?}"));
    assert!(w1.missing_on.is_empty(), "on every partition: {w1:?}");
    for id in &held {
        let job = ojs.job(id).await;
        assert_eq!((job["state"].as_str(), job["attempt"].as_i64()), (Some("active"), Some(1)), "{job}");
    }
}

/// An enqueue whose outcome is unknown (every answer from the partition's
/// leader lost) is a 504 that says whether sending it again is safe: not
/// for a job without an id, which a second send may make twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_of_unknown_outcome_is_retryable_only_with_an_id() {
    let args = ["--heartbeat-ms", "50", "--election-timeout-ms", "300", "--ojs-addr", "127.0.0.1:0"];
    let cluster = ProcessCluster::start_with_failpoints(
        "forward_lose_reply=1000",
        1,
        &[&args[..], &["--request-timeout-ms", "2000"]].concat(),
    );
    cluster.wait_ready().await;
    let leader = cluster.leader_of(0, Duration::from_secs(20)).await;
    let through = cluster.other_than(leader);
    let ojs = Ojs { addr: cluster.node(through).ojs.clone().unwrap(), token: None, tenant: None };
    let (code, answer) =
        ojs.post("/ojs/v1/jobs", json!({"type": "t.lost", "args": [], "options": {"queue": "lost"}})).await;
    assert_eq!((code, answer["error"]["code"].as_str()), (504, Some("timeout")), "{answer}");
    assert_eq!(answer["error"]["retryable"], json!(false), "a second send may make a second job: {answer}");
    assert!(answer["error"]["hint"].as_str().unwrap().contains("with an id"), "{answer}");
    let with_id = json!({"type": "t.lost", "id": "0190b6e0-0000-7000-8000-000000000001", "args": [], "options": {"queue": "lost"}});
    let (code, answer) = ojs.post("/ojs/v1/jobs", with_id).await;
    assert_eq!(
        (code, answer["error"]["retryable"].clone()),
        (504, json!(true)),
        "its id makes a second send safe: {answer}"
    );
}
