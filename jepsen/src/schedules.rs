//! Cron schedules under faults: the run registers per-second schedules on
//! different partitions before the first fault (misfire `fire_all`, so
//! every tick partition time passes must make a job), pauses them once the
//! faults are healed, and reads every replica's jobs. The checker holds each
//! schedule to one job per tick: `tick doubled` is a tick with two jobs (by
//! key, over every replica), `tick missed` a tick with none between the
//! first and the later of the schedule's last run and the pause less
//! [`STALL_MARGIN_MS`]: a schedule that stopped firing (its last run stays
//! early) or never fired misses every tick it did not make.
//!
//! Nobody works the ticks' jobs: they wait, activatable, and the final reads
//! find them. A tick is consumed by the entry that makes its job, so what is
//! under test is that the log, not a worker, makes each job once.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use drover::client::Client;
use drover::proto::gateway::{CreateJobRequest, GetScheduleRequest, PutScheduleRequest, SetSchedulePausedRequest};
use serde::{Deserialize, Serialize};

/// The job type the schedules make.
pub const CRON_TYPE: &str = "jepsen-cron";
/// How many schedules a run registers (on as many partitions as it has, up to this).
const SCHEDULES: usize = 2;
/// A tick every second.
const EVERY_SECOND: &str = "* * * * * *";
/// How long before its pause a schedule's last tick may lie: the tick
/// before the pause's second, made as late as a timer may fire when faults
/// have healed (the late-timer bound, `timing::LATE_BOUND_MS`).
pub const STALL_MARGIN_MS: i64 = 1_000 + crate::timing::LATE_BOUND_MS as i64;

/// The run's schedule names: `jepsen-beat-<n>`, on distinct partitions.
pub fn names(partitions: u32) -> Vec<String> {
    let mut taken = BTreeSet::new();
    let mut names = Vec::new();
    for n in 0.. {
        let name = format!("jepsen-beat-{n}");
        let partition = drover::core::schedule::schedule_partition(drover::core::DEFAULT_TENANT, &name, partitions);
        if taken.insert(partition) {
            names.push(name);
        }
        if names.len() == SCHEDULES.min(partitions as usize) {
            return names;
        }
    }
    unreachable!("the loop returns")
}

/// What the end of the run read of a schedule.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ScheduleRead {
    pub name: String,
    /// Its registration (partition time); its first tick is the next whole second.
    pub created_at: i64,
    /// The tick of its last job, once paused.
    pub last_run_at: i64,
    pub runs: u64,
    /// When its pause was sent (Unix ms; 0: not known, a run before this
    /// was kept). It ticked every second until then.
    #[serde(default)]
    pub paused_at: i64,
    /// No gateway answered its pause or its read: not judged.
    #[serde(default)]
    pub unread: bool,
}

/// Node -> job key -> (schedule, tick) of every job a schedule made.
pub type TickReads = BTreeMap<usize, BTreeMap<u64, (String, i64)>>;

/// Runs `call` through each gateway in turn until one answers, for at most `limit`.
pub async fn through_any<T, F, Fut>(gateways: &[String], limit: Duration, what: &str, mut call: F) -> anyhow::Result<T>
where
    F: FnMut(Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let started = Instant::now();
    let mut last = String::new();
    for gateway in gateways.iter().cycle() {
        let left = limit.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        let client = Client::connect_lazy(gateway)?;
        match tokio::time::timeout(left.min(Duration::from_secs(5)), call(client)).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(status)) => last = status.to_string(),
            Err(_) => last = "no answer in 5 s".into(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("{what}: no gateway answered within {limit:?} (last: {last})")
}

/// Registers the run's schedules (an upsert: a repeat after an unknown
/// outcome changes nothing).
pub async fn register(gateways: &[String], partitions: u32) -> anyhow::Result<()> {
    for name in names(partitions) {
        let request = PutScheduleRequest {
            name: name.clone(),
            expression: EVERY_SECOND.into(),
            job: Some(CreateJobRequest { r#type: CRON_TYPE.into(), variables: "{}".into(), ..Default::default() }),
            overlap: "allow".into(),
            misfire: "fire_all".into(),
            description: "the fault suite's ticks".into(),
            ..Default::default()
        };
        through_any(gateways, Duration::from_secs(60), "registering a schedule", |client| {
            let request = request.clone();
            async move { client.raw().put_schedule(request).await }
        })
        .await?;
    }
    Ok(())
}

/// Pauses the run's schedules and reads where each stopped, within
/// `limit` in all: one no gateway answered for by then is `unread`.
pub async fn finish(gateways: &[String], partitions: u32, limit: Duration) -> Vec<ScheduleRead> {
    let until = Instant::now() + limit;
    let mut reads = Vec::new();
    for name in names(partitions) {
        let left = || until.saturating_duration_since(Instant::now());
        let paused_at = drover::auth::now_ms() as i64;
        let pause = SetSchedulePausedRequest { name: name.clone(), paused: true, ..Default::default() };
        let paused = through_any(gateways, left(), "pausing a schedule", |client| {
            let pause = pause.clone();
            async move { client.raw().set_schedule_paused(pause).await }
        })
        .await;
        let get = GetScheduleRequest { name: name.clone(), ..Default::default() };
        let read = match paused {
            Ok(_) => {
                through_any(gateways, left(), "reading a schedule", |client| {
                    let get = get.clone();
                    async move { client.raw().get_schedule(get).await }
                })
                .await
            }
            Err(e) => Err(e),
        };
        reads.push(match read {
            Ok(schedule) => {
                let schedule = schedule.into_inner();
                ScheduleRead {
                    name,
                    created_at: schedule.created_at,
                    last_run_at: schedule.last_run_at,
                    runs: schedule.runs,
                    paused_at,
                    unread: false,
                }
            }
            Err(e) => {
                eprintln!("jepsen: {e:#}");
                ScheduleRead { name, paused_at, unread: true, ..ScheduleRead::default() }
            }
        });
    }
    reads
}

/// The schedule and tick of a job a schedule made, from the actuator's view.
pub fn tick_of(job: &serde_json::Value) -> Option<(String, i64)> {
    Some((job["schedule"].as_str()?.to_string(), job["tick"].as_i64()?))
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TickDoubled {
    pub schedule: String,
    pub tick: i64,
    pub keys: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TickMissed {
    pub schedule: String,
    pub tick: i64,
}

/// What the ticks came to.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Ticks {
    pub schedules: usize,
    /// Ticks from the first to each schedule's last run (or its pause less
    /// the margin, if later), over all schedules.
    pub ticks: usize,
    pub doubled: Vec<TickDoubled>,
    pub missed: Vec<TickMissed>,
    /// Schedules whose last run lay more than [`STALL_MARGIN_MS`] before
    /// their pause: (name, last run, pause).
    pub stalled: Vec<(String, i64, i64)>,
    /// Schedules no gateway answered for at the end: not judged.
    pub unread: usize,
}

impl Ticks {
    pub fn anomalies(&self) -> usize {
        self.doubled.len() + self.missed.len()
    }

    pub fn summary(&self) -> String {
        format!(
            "ticks {} of {} schedules ({} unread): tick doubled {}, tick missed {}",
            self.ticks,
            self.schedules,
            self.unread,
            self.doubled.len(),
            self.missed.len()
        )
    }

    pub fn lines(&self) -> Vec<String> {
        let stalled = self.stalled.iter().map(|(name, last, paused)| {
            let ran = if *last == 0 { "never ran".to_string() } else { format!("last ran at {last}") };
            format!("tick missed: {name} {ran}, {} ms before its pause at {paused}", paused - last)
        });
        let doubled =
            self.doubled.iter().map(|d| format!("tick doubled: {} at {}: keys {:?}", d.schedule, d.tick, d.keys));
        let missed = self.missed.iter().map(|m| format!("tick missed: {} at {}", m.schedule, m.tick));
        stalled.chain(doubled).chain(missed).collect()
    }
}

/// Each schedule made exactly one job for each tick from its first to its
/// last run (ticks every second), by key over every replica.
pub fn check(schedules: &[ScheduleRead], reads: &TickReads) -> Ticks {
    let mut jobs: BTreeMap<(&str, i64), BTreeSet<u64>> = BTreeMap::new();
    for (key, (schedule, tick)) in reads.values().flatten() {
        jobs.entry((schedule.as_str(), *tick)).or_default().insert(*key);
    }
    let mut found = Ticks { schedules: schedules.len(), ..Ticks::default() };
    for s in schedules {
        if s.unread {
            found.unread += 1;
            continue;
        }
        for ((_, tick), keys) in jobs.range((s.name.as_str(), i64::MIN)..=(s.name.as_str(), i64::MAX)) {
            if keys.len() > 1 {
                found.doubled.push(TickDoubled {
                    schedule: s.name.clone(),
                    tick: *tick,
                    keys: keys.iter().copied().collect(),
                });
            }
        }
        // It ticked every second until its pause: its last run may lie at
        // most the margin before it, and one that never ran missed them all.
        let held_to = s.paused_at - STALL_MARGIN_MS;
        if s.paused_at > 0 && s.last_run_at < held_to {
            found.stalled.push((s.name.clone(), s.last_run_at, s.paused_at));
        }
        let last = if s.paused_at > 0 { s.last_run_at.max(held_to) } else { s.last_run_at };
        let first = (s.created_at.div_euclid(1_000) + 1) * 1_000;
        let mut tick = first;
        while tick <= last {
            found.ticks += 1;
            if !jobs.contains_key(&(s.name.as_str(), tick)) {
                found.missed.push(TickMissed { schedule: s.name.clone(), tick });
            }
            tick += 1_000;
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(name: &str, created_at: i64, last_run_at: i64) -> ScheduleRead {
        ScheduleRead { name: name.into(), created_at, last_run_at, ..ScheduleRead::default() }
    }

    /// (key, schedule, tick) of the jobs one node holds.
    type Held<'a> = &'a [(u64, &'a str, i64)];

    fn reads(nodes: &[(usize, Held<'_>)]) -> TickReads {
        nodes
            .iter()
            .map(|(node, jobs)| (*node, jobs.iter().map(|(k, s, t)| (*k, (s.to_string(), *t))).collect()))
            .collect()
    }

    #[test]
    fn one_job_per_tick_on_every_replica_is_valid() {
        let jobs: &[(u64, &str, i64)] = &[(1, "a", 2_000), (2, "a", 3_000), (3, "a", 4_000)];
        let ticks = check(&[read("a", 1_500, 4_000)], &reads(&[(0, jobs), (1, jobs)]));
        assert_eq!((ticks.ticks, ticks.anomalies()), (3, 0), "{ticks:?}");
    }

    #[test]
    fn two_jobs_for_one_tick_is_a_tick_doubled() {
        let on_0: &[(u64, &str, i64)] = &[(1, "a", 2_000), (2, "a", 3_000)];
        // Another replica holds a second job for 3 s, under another key.
        let on_1: &[(u64, &str, i64)] = &[(1, "a", 2_000), (7, "a", 3_000)];
        let ticks = check(&[read("a", 1_500, 3_000)], &reads(&[(0, on_0), (1, on_1)]));
        assert_eq!(ticks.doubled, vec![TickDoubled { schedule: "a".into(), tick: 3_000, keys: vec![2, 7] }]);
        assert!(ticks.missed.is_empty());
    }

    #[test]
    fn a_tick_without_a_job_is_a_tick_missed() {
        let jobs: &[(u64, &str, i64)] = &[(1, "a", 2_000), (3, "a", 4_000), (4, "b", 3_000)];
        let ticks = check(&[read("a", 1_999, 4_000)], &reads(&[(0, jobs)]));
        assert_eq!(ticks.missed, vec![TickMissed { schedule: "a".into(), tick: 3_000 }], "b's job is not a's");
        // One whose first job is missing misses its first tick.
        let ticks = check(&[read("a", 999, 4_000)], &reads(&[(0, jobs)]));
        assert_eq!(ticks.missed.first().map(|m| m.tick), Some(1_000));
    }

    #[test]
    fn a_schedule_that_stalled_or_never_ran_misses_every_tick_to_its_pause() {
        // This used to pass: a schedule that never ran "missed nothing", and
        // one that stopped firing was held only to its own last run. Both
        // were paused (ticking every second until then) at 10 s.
        let paused = |last_run_at: i64| ScheduleRead { paused_at: 10_000, ..read("c", 1_500, last_run_at) };
        let jobs: &[(u64, &str, i64)] = &[(1, "c", 2_000), (2, "c", 3_000)];
        let never = check(&[paused(0)], &reads(&[(0, &[])]));
        let until = 10_000 - STALL_MARGIN_MS;
        assert_eq!(never.missed.len() as i64, (until - 2_000) / 1_000 + 1, "{never:?}");
        assert_eq!(never.stalled, vec![("c".to_string(), 0, 10_000)]);
        let stalled = check(&[paused(3_000)], &reads(&[(0, jobs)]));
        assert_eq!(stalled.missed.first().map(|m| m.tick), Some(4_000), "{stalled:?}");
        assert!(stalled.lines()[0].contains("last ran at 3000"), "{:?}", stalled.lines());
        // One that kept ticking to within the margin of its pause is clean.
        let all: Vec<(u64, &str, i64)> = (2..=9).map(|s| (s as u64, "c", s * 1_000)).collect();
        let clean = check(&[paused(9_000)], &reads(&[(0, &all)]));
        assert_eq!((clean.anomalies(), clean.stalled.len()), (0, 0), "{clean:?}");
        // One no gateway answered for is counted, not judged.
        let unread = check(&[ScheduleRead { unread: true, ..paused(0) }], &reads(&[]));
        assert_eq!((unread.anomalies(), unread.unread), (0, 1));
    }

    #[test]
    fn names_land_on_distinct_partitions() {
        let names = names(3);
        assert_eq!(names.len(), 2);
        let partition = |n: &str| drover::core::schedule::schedule_partition(drover::core::DEFAULT_TENANT, n, 3);
        assert_ne!(partition(&names[0]), partition(&names[1]));
        assert_eq!(super::names(1).len(), 1);
    }
}
