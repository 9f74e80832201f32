//! Lifecycle events (docs/events.md) on a real node with three partitions:
//! a subscriber sees each job's transitions in order, one that reconnects
//! with its cursor misses nothing that happened meanwhile, filters and
//! tenants hold, and OJS's event endpoints (a page, and server-sent events
//! resumed with Last-Event-ID) are the same events.

mod common;

use std::time::Duration;

use common::{http_exchange, LocalNode};
use drover::proto::gateway::*;
use serde_json::Value;

async fn node() -> LocalNode {
    LocalNode::start_with(|config| {
        config.ojs_addr = Some("127.0.0.1:0".parse().unwrap());
        config.partitions = 3;
    })
    .await
}

async fn watch(node: &LocalNode, request: WatchEventsRequest) -> tonic::Streaming<LifecycleEvent> {
    node.client.raw().watch_events(request).await.expect("a watch opens").into_inner()
}

/// The next `n` events of `stream`, each within 20 s.
async fn next(stream: &mut tonic::Streaming<LifecycleEvent>, n: usize) -> Vec<LifecycleEvent> {
    let mut events = Vec::new();
    while events.len() < n {
        let event = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .unwrap_or_else(|_| panic!("event {} of {n} within 20 s; got {events:?}", events.len() + 1))
            .expect("the watch stays open")
            .expect("the watch stays open");
        events.push(event);
    }
    events
}

async fn run_one(node: &LocalNode, job_type: &str) -> u64 {
    let key = node.client.create_job(job_type, "{}").await.unwrap();
    let jobs = node.client.activate(job_type, "w", 1, 60_000, 5_000).await.unwrap();
    assert_eq!(jobs.len(), 1);
    node.client.complete(jobs[0].key, jobs[0].attempt, "{}").await.unwrap();
    key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_reconnects_with_its_cursor_misses_nothing() {
    let node = node().await;
    let mut stream = watch(&node, WatchEventsRequest { types: vec!["ev".into()], ..Default::default() }).await;
    let first = run_one(&node, "ev").await;
    let events = next(&mut stream, 3).await;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["created", "activated", "completed"], "{events:?}");
    assert!(events.iter().all(|e| e.key == first && e.r#type == "ev" && !e.gap));
    assert_eq!(events[1].text, "w", "an activation names its worker");
    let cursor = events[2].cursor.clone();
    drop(stream);

    // While nobody listens, three more jobs run their course and one of
    // another type does too.
    let mut later = Vec::new();
    for _ in 0..3 {
        later.push(run_one(&node, "ev").await);
    }
    run_one(&node, "other").await;
    let mut stream =
        watch(&node, WatchEventsRequest { cursor: cursor.clone(), types: vec!["ev".into()], ..Default::default() })
            .await;
    let events = next(&mut stream, 9).await;
    let mut seen: Vec<(u64, &str)> = events.iter().map(|e| (e.key, e.kind.as_str())).collect();
    assert!(seen.iter().all(|(key, _)| later.contains(key)), "only what happened after the cursor: {seen:?}");
    for key in &later {
        let mine: Vec<&str> = seen.iter().filter(|(k, _)| k == key).map(|(_, kind)| *kind).collect();
        assert_eq!(mine, ["created", "activated", "completed"], "job {key}'s events, in its order");
    }
    seen.dedup();
    assert_eq!(seen.len(), 9);
    // Kinds filter, and a watch from now sees only what comes after.
    let request = WatchEventsRequest { from_now: true, kinds: vec!["completed".into()], ..Default::default() };
    let mut completions = watch(&node, request).await;
    let key = run_one(&node, "ev").await;
    let events = next(&mut completions, 1).await;
    assert_eq!((events[0].key, events[0].kind.as_str()), (key, "completed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_watches_are_refused() {
    let node = node().await;
    let mut raw = node.client.raw();
    for request in [
        WatchEventsRequest { cursor: "1.2".into(), ..Default::default() },
        WatchEventsRequest { cursor: "a.b.c".into(), ..Default::default() },
        WatchEventsRequest { kinds: vec!["exploded".into()], ..Default::default() },
    ] {
        let refused = raw.watch_events(request.clone()).await.err().unwrap_or_else(|| panic!("{request:?} refused"));
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{request:?}: {refused:?}");
        assert!(!refused.message().is_empty());
    }
}

async fn ojs_get(addr: &str, path: &str, headers: &str) -> (u16, String) {
    let (code, _, body) = http_exchange("GET", addr, path, headers, "").await.expect("OJS answers");
    (code, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ojs_events_are_the_same_events_paged_and_streamed() {
    let node = node().await;
    let addr = node.node().ojs_addr.unwrap().to_string();
    let key = run_one(&node, "mail").await;
    let (code, body) = ojs_get(&addr, "/ojs/v1/events?types=job.*&queues=mail&limit=2", "").await;
    assert_eq!(code, 200, "{body}");
    let page: Value = serde_json::from_str(&body).unwrap();
    let types: Vec<&str> = page["events"].as_array().unwrap().iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["job.enqueued", "job.started"], "{page}");
    assert_eq!(page["events"][0]["data"]["queue"], "mail");
    assert_eq!(page["events"][0]["specversion"], "1.0");
    let cursor = page["cursor"].as_str().unwrap();
    let (_, body) = ojs_get(&addr, &format!("/ojs/v1/events?queues=mail&cursor={cursor}"), "").await;
    let rest: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(rest["events"][0]["type"], "job.completed", "the page after the cursor: {rest}");
    assert!(rest["events"][0]["data"]["duration_ms"].is_number());
    // A stream resumed from the first page's cursor (as Last-Event-ID) starts
    // with the completion.
    let stream =
        format!("GET /ojs/v1/events/stream?queues=mail HTTP/1.1\r\nHost: {addr}\r\nLast-Event-ID: {cursor}\r\n\r\n");
    let text = sse_until(&addr, &stream, "event: job.completed").await;
    assert!(text.contains("event: job.completed"), "{text}");
    assert!(!text.contains("event: job.enqueued"), "nothing from before the cursor: {text}");
    let _ = key;
}

/// What an SSE request sends until `needle` (within 20 s).
async fn sse_until(addr: &str, request: &str, needle: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&got).contains(needle) {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_behind_what_a_partition_keeps_hears_of_the_gap_once() {
    // A partition keeps at most 4 events (one final record's worth).
    let node = LocalNode::start_with(|config| {
        config.partitions = 3;
        config.retention = drover::core::Retention { max_age_ms: 600_000, max_jobs: 1 };
    })
    .await;
    let create =
        || CreateJobRequest { r#type: "gap".into(), ordering_key: "one-partition".into(), ..Default::default() };
    let mut keys = Vec::new();
    for _ in 0..6 {
        keys.push(node.client.create(create()).await.unwrap());
    }
    let partition = drover::core::JobKey(keys[0]).partition();
    let cursor = "1.1.1".to_string();
    let mut stream = watch(&node, WatchEventsRequest { cursor, ..Default::default() }).await;
    let first = next(&mut stream, 1).await.remove(0);
    assert!(first.gap && first.text.contains(&format!("partition {partition}")), "{first:?}");
    let kept = next(&mut stream, 4).await;
    assert!(kept.iter().all(|e| !e.gap && e.kind == "created"), "{kept:?}");
    assert_eq!(kept.iter().map(|e| e.key).collect::<Vec<_>>(), keys[2..], "the four newest are kept");
    // The watch has moved past the gap: the next thing it hears is news.
    let newest = node.client.create(create()).await.unwrap();
    let news = next(&mut stream, 1).await.remove(0);
    assert_eq!((news.gap, news.key), (false, newest), "{news:?}");
}
