//! The web console: in headless Chromium on a 3-node cluster, an operator
//! finds an incident, opens its timeline, presses retry and sees the job
//! completed by a worker, pauses the job's queue (the worker gets nothing more
//! until it is resumed) and a cron schedule; over plain HTTP, the console asks for a token,
//! keeps it in a strict cookie, acts only as its holder may, and refuses
//! forms posted from another site.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{eventually, LocalNode, ProcessCluster};
use drover::auth::keys::{generate_secret, token_entry};
use drover::client::{Client, JobOutcome, Worker, WorkerOptions};
use drover::proto::gateway::*;

const JOB_TYPE: &str = "console-charge";

fn selenium_dir() -> PathBuf {
    std::env::var_os("DROVER_SELENIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/drover-tools/selenium"))
}

async fn job(client: &Client, key: u64) -> Job {
    let request = GetJobRequest { key, ..Default::default() };
    client.raw().get_job(request).await.expect("GetJob").into_inner().job.expect("a job")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retries_an_incident_from_the_console_in_a_browser() {
    let selenium = selenium_dir();
    assert!(
        selenium.join("selenium").is_dir(),
        "Selenium is not installed in {} (scripts/setup.sh installs it)",
        selenium.display()
    );
    let cluster = ProcessCluster::start(3, 3, 3, &[]);
    cluster.wait_ready().await;
    let client = Client::connect(&cluster.gateway(0)).await.unwrap();

    // A worker that fails a charge's first attempt for good (no retries
    // left: an incident) and completes any later one.
    let worker_client = Client::connect(&cluster.gateway(1)).await.unwrap();
    let mut options = WorkerOptions::new(JOB_TYPE);
    options.worker = "charger".into();
    options.labels = vec!["team:payments".into()];
    let worker = Worker::new(worker_client, options);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(worker.run(
        |job: ActivatedJob| async move {
            if job.attempt == 1 {
                JobOutcome::Fail { retries: 0, message: "card declined".into(), back_off_ms: 0 }
            } else {
                JobOutcome::Complete(r#"{"charged":true}"#.into())
            }
        },
        async move {
            let _ = stopped.await;
        },
    ));

    let request = CreateJobRequest {
        r#type: JOB_TYPE.into(),
        variables: r#"{"order":"A-1001","amount":42}"#.into(),
        retries: Some(1),
        ..Default::default()
    };
    let key = client.raw().create_job(request).await.unwrap().into_inner().key;
    eventually(Duration::from_secs(30), "the first attempt to fail into an incident", || {
        let client = client.clone();
        async move { job(&client, key).await.state == "incident" }
    })
    .await;

    // A schedule for the schedules page (hourly: it makes no job during the test).
    let schedule = PutScheduleRequest {
        name: "hourly-digest".into(),
        expression: "@hourly".into(),
        job: Some(CreateJobRequest { r#type: "digest".into(), ..Default::default() }),
        ..Default::default()
    };
    client.raw().put_schedule(schedule).await.unwrap();
    // A chain for the workflows page: nobody works its steps.
    let chain = CreateWorkflowRequest {
        id: "console-chain".into(),
        kind: "chain".into(),
        steps: ["wf-fetch", "wf-store"]
            .into_iter()
            .map(|t| CreateJobRequest { r#type: t.into(), ..Default::default() })
            .collect(),
        ..Default::default()
    };
    client.raw().create_workflow(chain).await.unwrap();
    // A limited queue for the queues page.
    let limit = SetQueueLimitRequest {
        r#type: "limited-mail".into(),
        limit: Some(QueueLimit {
            queue: Some(LimitLevel { rate: 5, concurrency: 2, ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    };
    client.raw().set_queue_limit(limit).await.unwrap();

    // The browser works against another node than the one the job was made
    // through and the one the worker uses.
    let shots = match std::env::var_os("DROVER_CONSOLE_SCREENSHOTS") {
        Some(dir) => PathBuf::from(dir),
        None => tempfile::tempdir().unwrap().keep(),
    };
    let url = format!("http://{}", cluster.node(2).admin);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/console/browse.py");
    let output = tokio::task::spawn_blocking({
        let (url, shots) = (url.clone(), shots.clone());
        move || {
            Command::new("python3")
                .arg(script)
                .arg(&url)
                .arg(key.to_string())
                .arg(&shots)
                .arg(JOB_TYPE)
                .env("PYTHONPATH", &selenium)
                .output()
                .expect("python3 runs")
        }
    })
    .await
    .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the browser session failed ({}):\n{said}", output.status);
    for page in [
        "cluster.png",
        "incidents.png",
        "job-incident.png",
        "job-completed.png",
        "workers.png",
        "jobs.png",
        "queues.png",
        "queues-paused.png",
        "schedules.png",
        "schedules-paused.png",
        "workflows.png",
        "workflows-cancelled.png",
    ] {
        let size = std::fs::metadata(shots.join(page)).map(|m| m.len()).unwrap_or(0);
        assert!(size > 10_000, "the screenshot {page} is missing or blank ({size} bytes)");
    }

    // What the browser saw is what the cluster holds.
    let done = job(&client, key).await;
    assert_eq!(done.state, "completed");
    assert_eq!(done.attempt, 2);
    assert_eq!(done.result, r#"{"charged":true}"#);
    let history = client.raw().get_job_history(GetJobRequest { key, ..Default::default() }).await.unwrap();
    let kinds: Vec<String> = history.into_inner().events.iter().map(|e| e.kind.clone()).collect();
    let retried = kinds.iter().position(|k| k == "retries_updated").expect("a retries_updated event");
    assert!(kinds[..retried].contains(&"incident".to_string()), "the retry came after the incident: {kinds:?}");
    assert_eq!(kinds.last().map(String::as_str), Some("completed"), "{kinds:?}");

    let request = GetScheduleRequest { name: "hourly-digest".into(), ..Default::default() };
    let schedule = client.raw().get_schedule(request).await.unwrap().into_inner();
    assert!(schedule.paused && schedule.next_run_at == 0, "paused from the browser: {schedule:?}");

    // The queue the browser paused holds a new charge from the running worker
    // until it is resumed.
    let listing = ListQueuesRequest { r#type: JOB_TYPE.into(), ..Default::default() };
    let queues = client.raw().list_queues(listing).await.unwrap().into_inner().queues;
    let queue = queues.into_iter().next().expect("the charges' queue");
    assert!(queue.paused, "paused from the browser: {queue:?}");
    let request = CreateJobRequest { r#type: JOB_TYPE.into(), retries: Some(1), ..Default::default() };
    let held = client.raw().create_job(request).await.unwrap().into_inner().key;
    // Nothing to wait for but an absence: the worker would take it in milliseconds.
    let (waited, finished) = client.await_job(held, Duration::from_secs(2)).await.unwrap();
    assert!(!finished && waited.state == "activatable", "a paused queue's job ran: {waited:?}");
    let resume = SetQueuePausedRequest { r#type: JOB_TYPE.into(), paused: false, ..Default::default() };
    client.raw().set_queue_paused(resume).await.unwrap();
    // Resumed, the worker takes it (and fails a first attempt, as it does every charge's).
    eventually(Duration::from_secs(30), "the worker to run the held charge once resumed", || {
        let client = client.clone();
        async move { job(&client, held).await.attempt == 1 }
    })
    .await;

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(30), worker).await.expect("the worker stops").unwrap();
}

/// One HTTP/1.1 exchange; returns the status, the headers (lower-cased
/// names) and the body.
async fn exchange(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Vec<(String, String)>, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("admin port");
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() {
        request.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    request.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let text = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let code = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (code, headers, body.to_string())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> &'a str {
    headers.iter().find(|(n, _)| n == name).map_or("", |(_, v)| v.as_str())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_asks_for_a_token_and_acts_only_as_its_holder_may() {
    let dir = tempfile::tempdir().unwrap();
    let (ops, reader) = (generate_secret(), generate_secret());
    let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut tokens = token_entry("ops", &ops, &strings(&["*"]), &strings(&["*"]));
    tokens.push_str(&token_entry(
        "reader",
        &reader,
        &strings(&["jobs:read:*", "cluster:read"]),
        &strings(&["<default>"]),
    ));
    let file = dir.path().join("tokens.toml");
    std::fs::write(&file, tokens).unwrap();
    let node = LocalNode::start_with(move |config| config.auth.tokens_file = Some(file)).await;
    let admin = node.node().admin_addr.to_string();
    let client = node.client.with_token(&ops).unwrap();
    let request = CreateJobRequest { r#type: "invoice".into(), variables: r#"{"n":1}"#.into(), ..Default::default() };
    let key = client.raw().create_job(request).await.unwrap().into_inner().key;

    // No token: the sign-in page, which returns where it was asked to.
    let (code, headers, _) = exchange(&admin, "GET", "/console/jobs?state=activatable", &[], "").await;
    assert_eq!(code, 303);
    assert_eq!(header(&headers, "location"), "/console/login?next=/console/jobs%3Fstate%3Dactivatable");
    let (code, _, page) = exchange(&admin, "GET", "/console/login", &[], "").await;
    assert_eq!((code, page.contains("name=\"token\"")), (200, true), "{page}");
    let (code, _, css) = exchange(&admin, "GET", "/console/static/style.css", &[], "").await;
    assert_eq!((code, css.contains("body")), (200, true));

    // A wrong token is refused with the reason; a right one becomes a strict cookie.
    let (code, headers, page) =
        exchange(&admin, "POST", "/console/login", &[], "token=drv_nonsense&next=/console").await;
    assert_eq!(code, 401);
    assert!(page.contains("not one this cluster knows"), "{page}");
    assert!(header(&headers, "set-cookie").is_empty());
    let form = format!("token={reader}&next=/console/jobs");
    let (code, headers, _) = exchange(&admin, "POST", "/console/login", &[], &form).await;
    assert_eq!((code, header(&headers, "location")), (303, "/console/jobs"));
    let cookie = header(&headers, "set-cookie");
    assert!(
        cookie.starts_with(&format!("drover_console_token={reader};"))
            && cookie.contains("HttpOnly")
            && cookie.contains("SameSite=Strict")
            && cookie.contains("Path=/console"),
        "{cookie}"
    );
    let as_reader = format!("drover_console_token={reader}");
    let as_ops = format!("drover_console_token={ops}");

    // The reader sees the job, and may not cancel it.
    let (code, _, page) = exchange(&admin, "GET", "/console/jobs", &[("Cookie", &as_reader)], "").await;
    assert_eq!(code, 200, "{page}");
    assert!(page.contains(&key.to_string()) && page.contains("reader"), "{page}");
    let cancel = format!("/console/jobs/{key}/cancel");
    let origin = format!("http://{admin}");
    let (code, _, page) =
        exchange(&admin, "POST", &cancel, &[("Cookie", &as_reader), ("Origin", &origin)], "back=").await;
    assert_eq!(code, 403, "{page}");
    assert!(page.contains("jobs:manage"), "the refusal names the scope it lacks: {page}");

    // A form posted from another site is refused, whoever's cookie it carries.
    let evil = [("Cookie", as_ops.as_str()), ("Origin", "https://evil.example")];
    let (code, _, _) = exchange(&admin, "POST", &cancel, &evil, "back=").await;
    assert_eq!(code, 403);
    assert_eq!(job(&client, key).await.state, "activatable", "refused cancels changed nothing");

    // The operator cancels it, and its history says who.
    let (code, headers, _) =
        exchange(&admin, "POST", &cancel, &[("Cookie", &as_ops), ("Origin", &origin)], "back=").await;
    assert_eq!((code, header(&headers, "location")), (303, format!("/console/jobs/{key}?done=cancelled").as_str()));
    assert_eq!(job(&client, key).await.state, "cancelled");
    let (code, _, page) =
        exchange(&admin, "GET", &format!("/console/jobs/{key}?done=cancelled"), &[("Cookie", &as_ops)], "").await;
    assert_eq!(code, 200);
    assert!(page.contains("cancelled by ops") && page.contains("The job was cancelled."), "{page}");

    // Signing out forgets the cookie.
    let (code, headers, _) = exchange(&admin, "POST", "/console/logout", &[("Cookie", &as_ops)], "").await;
    assert_eq!(code, 303);
    assert!(header(&headers, "set-cookie").contains("Max-Age=0"));
}
