//! A limited queue under faults: the run limits one queue (a rate with a
//! burst, a concurrency, and each key's concurrency) before the faults
//! start; a producer creates its jobs below the rate through random
//! gateways, half of them under one of two keys; workers take them through
//! random gateways, hold each a while and complete it. Once the faults are
//! healed and the jobs have run, the checker reads each acknowledged job's
//! history and holds the activations, in the partition's own time (the
//! time the limit is kept in), to the limit:
//!
//! - `limit exceeded`: more starts in some window of `RATE_PERIOD_MS` than
//!   the burst and the rate allow, more activations held at once than the
//!   concurrency, or more of one key's than its concurrency;
//! - `limited job stuck`: an acknowledged job never completed, though the
//!   limit had room for it long before the end (a slot or a token lost).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover::client::Client;
use drover::core::limit::LIMIT_KEY_HEADER;
use drover::proto::gateway::{
    ActivatedJob, CreateJobRequest, GetJobRequest, LimitLevel, QueueLimit, SetQueueLimitRequest,
};
use serde::Serialize;

use crate::schedules::through_any;
use crate::workload::Shared;

pub const LIMITED_TYPE: &str = "jepsen-limited";
pub const RATE: u32 = 5;
pub const RATE_PERIOD_MS: i64 = 1_000;
pub const BURST: u32 = 2;
pub const CONCURRENCY: u32 = 3;
pub const KEY_CONCURRENCY: u32 = 1;
/// A job every so often: below the rate, so the backlog drains once the
/// faults heal.
const EVERY: Duration = Duration::from_millis(300);
/// How long a worker holds a job.
const HOLD: Duration = Duration::from_millis(150);

/// The keys of the jobs whose create was answered.
#[derive(Default)]
pub struct Acknowledged(Mutex<Vec<u64>>);

impl Acknowledged {
    pub fn keys(&self) -> Vec<u64> {
        self.0.lock().unwrap().clone()
    }
}

/// Limits the queue (before the faults start; a repeat changes nothing).
pub async fn set(gateways: &[String]) -> anyhow::Result<()> {
    let level = |rate, burst, concurrency| LimitLevel { rate, period_ms: RATE_PERIOD_MS, burst, concurrency };
    let limit =
        QueueLimit { queue: Some(level(RATE, BURST, CONCURRENCY)), per_key: Some(level(0, 0, KEY_CONCURRENCY)) };
    let request = SetQueueLimitRequest { r#type: LIMITED_TYPE.into(), limit: Some(limit), ..Default::default() };
    through_any(gateways, Duration::from_secs(60), "limiting the queue", |client| {
        let request = request.clone();
        async move { client.raw().set_queue_limit(request).await }
    })
    .await?;
    Ok(())
}

/// Creates the queue's jobs until the producers stop: one in two under a key.
pub async fn producer(shared: Arc<Shared>, acknowledged: Arc<Acknowledged>) {
    let mut n = 0u64;
    while !shared.stop_creating.load(Ordering::Relaxed) {
        n += 1;
        let mut request = CreateJobRequest {
            r#type: LIMITED_TYPE.into(),
            variables: "{}".into(),
            retries: Some(10),
            ..Default::default()
        };
        if n.is_multiple_of(2) {
            request.custom_headers.insert(LIMIT_KEY_HEADER.into(), format!("key-{}", n % 4 / 2));
        }
        let created =
            through_any(&shared.live_gateways(), Duration::from_secs(10), "creating a limited job", |client| {
                let request = request.clone();
                async move { client.raw().create_job(request).await }
            })
            .await;
        if let Ok(made) = created {
            acknowledged.0.lock().unwrap().push(made.into_inner().key);
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// Takes the queue's jobs through gateway `home` and the next ones in turn.
pub async fn worker(shared: Arc<Shared>, home: usize) {
    shared.poll_in_turn(home, LIMITED_TYPE, "jepsen-limited", 4, work).await
}

async fn work(client: Client, jobs: Vec<ActivatedJob>) {
    for job in jobs {
        tokio::time::sleep(HOLD).await;
        // A lost answer: the job times out and is taken again.
        drop(client.complete(job.key, job.attempt, "{}").await);
    }
}

/// One job as its history tells it: its key (if any), its state, and each
/// activation's start and end in partition time (`None`: held at the end).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct JobRead {
    pub key: u64,
    pub limit_key: Option<String>,
    pub state: String,
    pub held: Vec<(i64, Option<i64>)>,
}

/// Reads every acknowledged job's history, waiting up to `limit` for each
/// to complete.
pub async fn finish(gateways: &[String], keys: &[u64], limit: Duration) -> Vec<JobRead> {
    let until = tokio::time::Instant::now() + limit;
    let mut reads = Vec::new();
    for key in keys {
        loop {
            let request = GetJobRequest { key: *key, include_history: true, ..Default::default() };
            let left = until.saturating_duration_since(tokio::time::Instant::now()).max(Duration::from_secs(5));
            let answer = through_any(gateways, left, "reading a limited job", |client| {
                let request = request.clone();
                async move { client.raw().get_job(request).await }
            })
            .await;
            let read = match answer.ok().and_then(|r| r.into_inner().job) {
                Some(job) => {
                    let mut held = Vec::new();
                    for event in &job.history {
                        match event.kind.as_str() {
                            "activated" => held.push((event.at, None)),
                            "completed" | "timed_out" | "failed" | "yielded" | "cancelled" => {
                                if let Some(last) = held.last_mut().filter(|(_, end)| end.is_none()) {
                                    last.1 = Some(event.at);
                                }
                            }
                            _ => {}
                        }
                    }
                    let limit_key = job.custom_headers.get(LIMIT_KEY_HEADER).cloned();
                    JobRead { key: *key, limit_key, state: job.state, held }
                }
                None => JobRead { key: *key, state: "unread".into(), ..Default::default() },
            };
            if read.state == "completed" || tokio::time::Instant::now() > until {
                reads.push(read);
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    reads
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Anomaly {
    pub at: i64,
    pub why: String,
}

/// What the limited queue came to.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Limits {
    pub jobs: usize,
    pub activations: usize,
    pub unread: usize,
    pub exceeded: Vec<Anomaly>,
    pub stuck: Vec<u64>,
}

impl Limits {
    pub fn anomalies(&self) -> usize {
        self.exceeded.len() + self.stuck.len()
    }

    pub fn summary(&self) -> String {
        format!(
            "limited queue {} jobs ({} activations, {} unread): limit exceeded {}, limited job stuck {}",
            self.jobs,
            self.activations,
            self.unread,
            self.exceeded.len(),
            self.stuck.len()
        )
    }

    pub fn lines(&self) -> Vec<String> {
        let exceeded = self.exceeded.iter().map(|a| format!("limit exceeded: at {}: {}", a.at, a.why));
        exceeded.chain(self.stuck.iter().map(|k| format!("limited job stuck: key {k} never completed"))).collect()
    }
}

/// Holds the jobs' activations to the limit, in partition time.
pub fn check(reads: &[JobRead]) -> Limits {
    let mut found = Limits { jobs: reads.len(), ..Default::default() };
    let judged: Vec<&JobRead> = reads.iter().filter(|r| r.state != "unread").collect();
    found.unread = reads.len() - judged.len();
    let mut starts: Vec<i64> = judged.iter().flat_map(|r| r.held.iter().map(|(from, _)| *from)).collect();
    starts.sort_unstable();
    found.activations = starts.len();
    // The bucket lets `BURST` go at once and one more every period / rate.
    let most = |window: i64| i64::from(BURST) + window * i64::from(RATE) / RATE_PERIOD_MS;
    for (i, from) in starts.iter().enumerate() {
        let within = starts[i..].iter().take_while(|t| **t < from + RATE_PERIOD_MS).count() as i64;
        if within > most(RATE_PERIOD_MS) {
            found.exceeded.push(Anomaly {
                at: *from,
                why: format!("{within} starts within {RATE_PERIOD_MS} ms; the limit allows {}", most(RATE_PERIOD_MS)),
            });
        }
    }
    // Held at once: over the queue, and over each key.
    let mut by_key: BTreeMap<Option<&str>, Vec<(i64, i64)>> = BTreeMap::new();
    for read in &judged {
        for (from, to) in &read.held {
            by_key.entry(read.limit_key.as_deref()).or_default().push((*from, to.unwrap_or(i64::MAX)));
        }
    }
    let all: Vec<(i64, i64)> = by_key.values().flatten().copied().collect();
    let mut held_over = |spans: &[(i64, i64)], most: u32, whose: &str| {
        for (at, _) in spans {
            let held = spans.iter().filter(|(from, to)| from <= at && at < to).count() as u32;
            if held > most {
                found
                    .exceeded
                    .push(Anomaly { at: *at, why: format!("{held} of {whose} held at once; the limit is {most}") });
            }
        }
    };
    held_over(&all, CONCURRENCY, "the queue's jobs");
    for (key, spans) in &by_key {
        if let Some(key) = key {
            held_over(spans, KEY_CONCURRENCY, &format!("key {key}'s jobs"));
        }
    }
    found.stuck = judged.iter().filter(|r| r.state != "completed").map(|r| r.key).collect();
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(key: u64, limit_key: Option<&str>, held: &[(i64, i64)]) -> JobRead {
        JobRead {
            key,
            limit_key: limit_key.map(str::to_string),
            state: "completed".into(),
            held: held.iter().map(|(from, to)| (*from, Some(*to))).collect(),
        }
    }

    #[test]
    fn starts_within_the_rate_and_holds_within_the_concurrency_are_valid() {
        // Two at once (the burst), then one every 200 ms: 5 a second plus the burst.
        let start = |i: i64| 1_000 + (i - 1).max(0) * 200;
        let reads: Vec<JobRead> = (0..12).map(|i| job(i as u64, None, &[(start(i), start(i) + 150)])).collect();
        let found = check(&reads);
        assert_eq!(found.anomalies(), 0, "{:?}", found.lines());
    }

    #[test]
    fn one_start_too_many_in_a_second_is_limit_exceeded() {
        let reads: Vec<JobRead> =
            (0..8).map(|i| job(i, None, &[(1_000 + i as i64 * 100, 1_000 + i as i64 * 100 + 10)])).collect();
        let found = check(&reads);
        assert!(found.exceeded.iter().any(|a| a.why.contains("8 starts")), "{:?}", found.lines());
    }

    #[test]
    fn four_held_at_once_or_two_of_one_key_is_limit_exceeded() {
        let queue: Vec<JobRead> = (0..4).map(|i| job(i, None, &[(i as i64 * 1_000, 10_000)])).collect();
        assert!(check(&queue).exceeded.iter().any(|a| a.why.contains("4 of the queue's jobs")));
        let keyed = vec![job(1, Some("key-0"), &[(0, 5_000)]), job(2, Some("key-0"), &[(2_000, 6_000)])];
        assert!(check(&keyed).exceeded.iter().any(|a| a.why.contains("key key-0")), "{:?}", check(&keyed).lines());
        let other_keys = vec![job(1, Some("key-0"), &[(0, 5_000)]), job(2, Some("key-1"), &[(2_000, 6_000)])];
        assert_eq!(check(&other_keys).anomalies(), 0, "two keys, one each");
    }

    #[test]
    fn a_job_that_never_completed_is_stuck_and_an_unread_one_is_not_judged() {
        let mut stuck = job(7, None, &[]);
        stuck.state = "activatable".into();
        let unread = JobRead { key: 8, state: "unread".into(), ..Default::default() };
        let found = check(&[stuck, unread]);
        assert_eq!((found.stuck.clone(), found.unread), (vec![7], 1));
    }
}
