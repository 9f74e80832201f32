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
//!   limit had room for it long before the end (a slot or a token lost);
//! - `limited job lost`: an acknowledged job its partition answers it does
//!   not know (NOT_FOUND) until the end.
//!
//! A job no gateway answered for by the end is `unread`: not judged, and
//! the run's verdict is then UNKNOWN, not VALID.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use drover::client::Client;
use drover::core::limit::LIMIT_KEY_HEADER;
use drover::proto::gateway::{
    ActivatedJob, CreateJobRequest, GetJobRequest, LimitLevel, QueueLimit, SetQueueLimitRequest,
};
use serde::{Deserialize, Serialize};

use crate::schedules::through_any;
use crate::workload::Shared;

pub const LIMITED_TYPE: &str = "jepsen-limited";
pub const RATE: u32 = 5;
pub const RATE_PERIOD_MS: i64 = 1_000;
pub const BURST: u32 = 2;
pub const CONCURRENCY: u32 = 3;
pub const KEY_CONCURRENCY: u32 = 1;
/// A burst of jobs every so often: below the rate on average, so the
/// backlog drains once the faults heal, but each burst more than the bucket
/// holds and the concurrency allows, so every run holds the limit to what
/// it is for, faults or none.
const EVERY: Duration = Duration::from_millis(1_800);
const BURST_SIZE: u64 = 6;
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
        for _ in 0..BURST_SIZE {
            n += 1;
            create(&shared, &acknowledged, n).await;
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// The `n`th job: one in two under one of two keys.
async fn create(shared: &Shared, acknowledged: &Acknowledged, n: u64) {
    let mut request = CreateJobRequest {
        r#type: LIMITED_TYPE.into(),
        variables: "{}".into(),
        retries: Some(10),
        ..Default::default()
    };
    if n.is_multiple_of(2) {
        request.custom_headers.insert(LIMIT_KEY_HEADER.into(), format!("key-{}", n % 4 / 2));
    }
    let created = through_any(&shared.live_gateways(), Duration::from_secs(10), "creating a limited job", |client| {
        let request = request.clone();
        async move { client.raw().create_job(request).await }
    })
    .await;
    if let Ok(made) = created {
        acknowledged.0.lock().unwrap().push(made.into_inner().key);
    }
}

/// Takes the queue's jobs through gateway `home` and the next ones in turn.
pub async fn worker(shared: Arc<Shared>, process: u64, home: usize) {
    shared.poll_in_turn((process, home), LIMITED_TYPE, "jepsen-limited", 4, work).await
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
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobRead {
    pub key: u64,
    pub limit_key: Option<String>,
    pub state: String,
    pub held: Vec<(i64, Option<i64>)>,
}

/// Reads every acknowledged job's history until each completed or `limit`
/// passed, whatever the cluster does (a read that cannot be made by then
/// leaves the job `unread`). A job its partition answers it does not know
/// is `missing`; it is read again until the end, since a read may have
/// gone to a replica behind.
pub async fn finish(gateways: &[String], keys: &[u64], limit: Duration) -> Vec<JobRead> {
    let until = tokio::time::Instant::now() + limit;
    let mut reads: BTreeMap<u64, JobRead> =
        keys.iter().map(|key| (*key, JobRead { key: *key, state: "unread".into(), ..Default::default() })).collect();
    let mut open: Vec<u64> = keys.to_vec();
    while !open.is_empty() {
        let mut still = Vec::new();
        for key in open {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                still.push(key);
                continue;
            }
            let read = read_one(gateways, key, left).await;
            if read.state != "completed" {
                still.push(key);
            }
            if read.state != "unread" {
                reads.insert(key, read);
            }
        }
        open = still;
        if tokio::time::Instant::now() >= until {
            break;
        }
        if !open.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    reads.into_values().collect()
}

/// One read of job `key` through any gateway within `left`.
async fn read_one(gateways: &[String], key: u64, left: Duration) -> JobRead {
    let request = GetJobRequest { key, include_history: true, ..Default::default() };
    let answer = through_any(gateways, left, "reading a limited job", |client| {
        let request = request.clone();
        async move {
            match client.raw().get_job(request).await {
                Err(status) if status.code() == tonic::Code::NotFound => Ok(None),
                other => other.map(|r| r.into_inner().job),
            }
        }
    })
    .await;
    match answer {
        Ok(Some(job)) => {
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
            JobRead { key, limit_key, state: job.state, held }
        }
        Ok(None) => JobRead { key, state: "missing".into(), ..Default::default() },
        Err(_) => JobRead { key, state: "unread".into(), ..Default::default() },
    }
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
    /// Jobs no gateway answered for at the end: not judged (the verdict
    /// is UNKNOWN).
    pub unread: usize,
    pub exceeded: Vec<Anomaly>,
    /// Jobs held in another state than completed at the end, with it.
    pub stuck: Vec<(u64, String)>,
    /// Jobs their partition did not know at the end.
    pub lost: Vec<u64>,
}

impl Limits {
    pub fn anomalies(&self) -> usize {
        self.exceeded.len() + self.stuck.len() + self.lost.len()
    }

    pub fn summary(&self) -> String {
        format!(
            "limited queue {} jobs ({} activations, {} unread): limit exceeded {}, limited job stuck {}, limited job \
             lost {}",
            self.jobs,
            self.activations,
            self.unread,
            self.exceeded.len(),
            self.stuck.len(),
            self.lost.len()
        )
    }

    pub fn lines(&self) -> Vec<String> {
        let exceeded = self.exceeded.iter().map(|a| format!("limit exceeded: at {}: {}", a.at, a.why));
        let stuck = self.stuck.iter().map(|(k, state)| format!("limited job stuck: key {k} never completed ({state})"));
        let lost = self.lost.iter().map(|k| format!("limited job lost: key {k}: its partition does not know it"));
        exceeded.chain(stuck).chain(lost).collect()
    }
}

/// Holds the jobs' activations to the limit, in partition time.
pub fn check(reads: &[JobRead]) -> Limits {
    let mut found = Limits { jobs: reads.len(), ..Default::default() };
    let judged: Vec<&JobRead> = reads.iter().filter(|r| r.state != "unread" && r.state != "missing").collect();
    found.unread = reads.iter().filter(|r| r.state == "unread").count();
    found.lost = reads.iter().filter(|r| r.state == "missing").map(|r| r.key).collect();
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
    found.stuck = judged.iter().filter(|r| r.state != "completed").map(|r| (r.key, r.state.clone())).collect();
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
    fn a_job_that_never_completed_is_stuck_and_an_unread_one_is_counted_apart() {
        let mut stuck = job(7, None, &[]);
        stuck.state = "activatable".into();
        // No gateway answered: it cannot be judged, but it is counted, and
        // the run's verdict is UNKNOWN for it (see `Verdict`), not VALID.
        let unread = JobRead { key: 8, state: "unread".into(), ..Default::default() };
        let found = check(&[stuck, unread]);
        assert_eq!((found.stuck.clone(), found.unread, found.anomalies()), (vec![(7, "activatable".into())], 1, 1));
    }

    #[test]
    fn a_job_its_partition_does_not_know_is_lost_not_unread() {
        // It used to be read as "no answer" and excused as unread; a
        // partition that answers NOT_FOUND for an acknowledged job lost it.
        let missing = JobRead { key: 9, state: "missing".into(), ..Default::default() };
        let found = check(&[job(1, None, &[(0, 10)]), missing]);
        assert_eq!((found.lost.clone(), found.unread, found.anomalies()), (vec![9], 0, 1));
        assert!(found.lines().iter().any(|l| l.contains("limited job lost: key 9")), "{:?}", found.lines());
        assert_eq!(check(&[job(1, None, &[(0, 10)])]).anomalies(), 0, "a clean read is valid");
    }
}
