//! Cron schedules and job expiry on real nodes (docs/schedules.md): each
//! tick of a schedule makes exactly one job through a leader's death, the
//! schedule is the same on drover.v1 and OJS's cron endpoints, and a job
//! not activated by its expiry is never handed out.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{eventually, http_exchange, LocalNode, ProcessCluster};
use drover::core::schedule::{SCHEDULE_HEADER, TICK_HEADER};
use drover::proto::gateway::*;
use serde_json::{json, Value};

fn every_second(name: &str, job_type: &str) -> PutScheduleRequest {
    PutScheduleRequest {
        name: name.into(),
        expression: "* * * * * *".into(),
        job: Some(CreateJobRequest { r#type: job_type.into(), variables: r#"{"n":1}"#.into(), ..Default::default() }),
        overlap: "allow".into(),
        misfire: "fire_all".into(),
        ..Default::default()
    }
}

/// Every job of `job_type`, by the tick it was made for (several if a tick
/// made several).
async fn jobs_by_tick(client: &drover::client::Client, job_type: &str) -> BTreeMap<i64, Vec<u64>> {
    let mut ticks: BTreeMap<i64, Vec<u64>> = BTreeMap::new();
    let mut page_token = String::new();
    loop {
        let request = ListJobsRequest {
            filter: Some(JobFilter { r#type: job_type.into(), ..Default::default() }),
            page_size: 500,
            page_token: page_token.clone(),
        };
        let page = client.raw().list_jobs(request).await.expect("lists").into_inner();
        for job in page.jobs {
            assert_eq!(job.custom_headers.get(SCHEDULE_HEADER).map(String::as_str), Some("beat"), "{job:?}");
            let tick = job.custom_headers[TICK_HEADER].parse().expect("a tick in ms");
            ticks.entry(tick).or_default().push(job.key);
        }
        if page.next_page_token.is_empty() {
            return ticks;
        }
        page_token = page.next_page_token;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tick_makes_one_job_through_a_leader_kill() {
    let mut cluster = ProcessCluster::start(3, 1, 3, &[]);
    cluster.wait_ready().await;
    let client = cluster.node(0).client().await;
    let put = client.raw().put_schedule(every_second("beat", "beat")).await.expect("registers").into_inner();
    let schedule = put.schedule.expect("the schedule");
    assert!(put.created && schedule.next_run_at > 0, "{schedule:?}");
    let runs = |client: drover::client::Client| async move {
        let request = GetScheduleRequest { name: "beat".into(), ..Default::default() };
        client.raw().get_schedule(request).await.map(|s| s.into_inner().runs).unwrap_or(0)
    };
    eventually(Duration::from_secs(20), "three ticks", || {
        let client = client.clone();
        async move { runs(client).await >= 3 }
    })
    .await;
    let leader = cluster.leader_of(0, Duration::from_secs(10)).await;
    cluster.kill(leader);
    let survivor = cluster.node(cluster.other_than(leader)).client().await;
    let before = runs(survivor.clone()).await;
    eventually(Duration::from_secs(30), "ticks after the leader died", || {
        let survivor = survivor.clone();
        async move { runs(survivor).await >= before + 4 }
    })
    .await;
    let pause = SetSchedulePausedRequest { name: "beat".into(), paused: true, ..Default::default() };
    let paused = survivor.raw().set_schedule_paused(pause).await.expect("pauses").into_inner();
    assert_eq!((paused.paused, paused.next_run_at), (true, 0));
    let ticks = jobs_by_tick(&survivor, "beat").await;
    let doubled: Vec<_> = ticks.iter().filter(|(_, jobs)| jobs.len() > 1).collect();
    assert!(doubled.is_empty(), "ticks that made more than one job: {doubled:?}");
    let (first, last) = (*ticks.keys().next().unwrap(), *ticks.keys().last().unwrap());
    assert_eq!(first, schedule.next_run_at, "the first job is the first tick's");
    assert_eq!(last, paused.last_run_at, "the last job is the last run's");
    let missed: Vec<i64> =
        (0..=(last - first) / 1000).map(|i| first + i * 1000).filter(|t| !ticks.contains_key(t)).collect();
    assert!(missed.is_empty(), "ticks that made no job: {missed:?} of {}", ticks.len());
    assert_eq!(ticks.len() as u64, paused.runs, "one job per run");
}

async fn ojs_node() -> LocalNode {
    LocalNode::start_with(|config| {
        config.ojs_addr = Some("127.0.0.1:0".parse().unwrap());
        config.partitions = 3;
    })
    .await
}

async fn ojs(node: &LocalNode, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let addr = node.node().ojs_addr.expect("serves OJS").to_string();
    let headers = "Content-Type: application/openjobspec+json\r\n";
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let (status, _, text) = http_exchange(method, &addr, path, headers, &body).await.expect("answers");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ojs_cron_jobs_are_schedules() {
    let node = ojs_node().await;
    let cron = json!({
        "name": "nightly-report",
        "expression": "0 9 * * *",
        "timezone": "Asia/Tokyo",
        "job_template": { "type": "report.nightly", "args": [{"kind": "sales"}], "options": { "queue": "reports" } },
    });
    let (status, made) = ojs(&node, "POST", "/ojs/v1/cron", Some(cron.clone())).await;
    assert_eq!(status, 201, "{made}");
    assert_eq!((made["cron"]["enabled"].clone(), made["cron"]["overlap_policy"].clone()), (json!(true), json!("skip")));
    let next = made["cron"]["next_run_at"].as_str().expect("a next run").to_string();
    assert!(next.ends_with("T00:00:00.000Z"), "09:00 in Tokyo is midnight UTC: {next}");
    let (status, again) = ojs(&node, "POST", "/ojs/v1/cron", Some(cron)).await;
    assert_eq!(status, 200, "a second registration updates: {again}");
    // The same schedule on drover.v1, its template an OJS job of queue "reports".
    let request = GetScheduleRequest { name: "nightly-report".into(), ..Default::default() };
    let schedule = node.client.raw().get_schedule(request).await.expect("found").into_inner();
    assert_eq!((schedule.expression.as_str(), schedule.job.unwrap().r#type.as_str()), ("0 9 * * *", "reports"));
    let (status, paused) = ojs(&node, "PATCH", "/ojs/v1/cron/nightly-report", Some(json!({"enabled": false}))).await;
    assert_eq!((status, paused["cron"]["next_run_at"].clone()), (200, Value::Null), "{paused}");
    let (_, listed) = ojs(&node, "GET", "/ojs/v1/cron?enabled=false", None).await;
    assert_eq!(listed["crons"].as_array().map(Vec::len), Some(1), "{listed}");
    let hourly = json!({"name": "a-hourly", "cron": "@hourly", "type": "x.y", "args": []});
    assert_eq!(ojs(&node, "POST", "/ojs/v1/cron", Some(hourly)).await.0, 201, "the spec's shape");
    let (_, page) = ojs(&node, "GET", "/ojs/v1/cron?limit=1&offset=1", None).await;
    assert_eq!(page["cron_jobs"][0]["name"], json!("nightly-report"), "by name: {page}");
    assert_eq!(page["pagination"], json!({"total": 2, "limit": 1, "offset": 1, "has_more": false}));
    for bad in ["not a valid cron", "0 0 0 0 0 0 0", "99 25 32 13 8"] {
        let body = json!({"name": "bad", "expression": bad, "job_template": {"type": "x", "args": []}});
        let (status, error) = ojs(&node, "POST", "/ojs/v1/cron", Some(body)).await;
        assert_eq!(status, 400, "{bad}: {error}");
        assert!(error["error"]["message"].as_str().is_some_and(|m| m.contains("cron expression")), "{error}");
    }
    // A template's fixed expiry would expire every later tick's job at once.
    let expiring = json!({"name": "x", "cron": "@hourly", "type": "x.y", "args": [],
        "options": {"expires_at": "2099-01-01T00:00:00Z"}});
    let (status, error) = ojs(&node, "POST", "/ojs/v1/cron", Some(expiring)).await;
    assert_eq!(status, 400, "{error}");
    let (status, deleted) = ojs(&node, "DELETE", "/ojs/v1/cron/nightly-report", None).await;
    assert_eq!((status, deleted["deleted"].clone()), (200, json!(true)), "{deleted}");
    let (status, _) = ojs(&node, "GET", "/ojs/v1/cron/nightly-report", None).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticks_job_names_its_schedule_to_ojs_workers() {
    let node = ojs_node().await;
    let cron = json!({
        "name": "heartbeat",
        "expression": "@every 1s",
        "job_template": { "type": "ping.send", "args": [1], "options": { "queue": "pings" } },
    });
    assert_eq!(ojs(&node, "POST", "/ojs/v1/cron", Some(cron)).await.0, 201);
    let fetch = json!({"queues": ["pings"], "worker_id": "w", "wait_ms": 5000});
    let mut job = Value::Null;
    for _ in 0..5 {
        let (_, fetched) = ojs(&node, "POST", "/ojs/v1/workers/fetch", Some(fetch.clone())).await;
        if let Some(first) = fetched["jobs"].get(0) {
            job = first.clone();
            break;
        }
    }
    assert_eq!(job["type"], json!("ping.send"), "a tick's job was fetched: {job}");
    assert_eq!(job["meta"]["cron_name"], json!("heartbeat"), "{job}");
    // @every counts from the registration, to the ms.
    assert!(job["meta"]["cron_triggered_at"].as_str().is_some_and(|t| t.ends_with('Z')), "{job}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_not_activated_by_its_expiry_is_never_handed_out() {
    let node = ojs_node().await;
    let now = drover::auth::now_ms() as i64;
    let create = CreateJobRequest { r#type: "ttl".into(), expires_at: now + 1_000, ..Default::default() };
    let key = node.client.raw().create_job(create).await.expect("creates").into_inner().key;
    let kept = CreateJobRequest { r#type: "ttl".into(), expires_at: now + 600_000, ..Default::default() };
    let kept = node.client.raw().create_job(kept).await.expect("creates").into_inner().key;
    let state = |key: u64| {
        let client = node.client.clone();
        async move {
            let request = GetJobRequest { key, ..Default::default() };
            client.raw().get_job(request).await.expect("reads").into_inner().job.expect("a job").state
        }
    };
    eventually(Duration::from_secs(10), "the job expired", || async { state(key).await == "expired" }).await;
    let jobs = node.client.activate("ttl", "w", 10, 60_000, 200).await.expect("activates");
    assert_eq!(jobs.iter().map(|j| j.key).collect::<Vec<_>>(), vec![kept], "only the unexpired job is handed out");
    let job = node.client.raw().get_job(GetJobRequest { key, ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(job.job.unwrap().expires_at, now + 1_000);
    // OJS: the same through its envelope, relative expiry and all.
    let enqueue = json!({"type": "ttl.test", "args": [], "options": {"queue": "ttl-ojs", "expires_at": "+PT1S"}});
    let (status, made) = ojs(&node, "POST", "/ojs/v1/jobs", Some(enqueue)).await;
    assert_eq!(status, 201, "{made}");
    assert!(made["job"]["expires_at"].as_str().is_some_and(|t| t.ends_with('Z')), "{made}");
    let id = made["job"]["id"].as_str().unwrap().to_string();
    eventually(Duration::from_secs(10), "the OJS job was discarded", || async {
        ojs(&node, "GET", &format!("/ojs/v1/jobs/{id}"), None).await.1["job"]["state"] == json!("discarded")
    })
    .await;
    let (_, fetched) = ojs(&node, "POST", "/ojs/v1/workers/fetch", Some(json!({"queues": ["ttl-ojs"]}))).await;
    assert_eq!(fetched["jobs"], json!([]), "{fetched}");
    let metrics = common::http_get(&node.node().admin_addr.to_string(), "/metrics").await.unwrap().1;
    assert!(metrics.contains(r#"outcome="expired""#), "expiries are counted");
}
