//! Queues as objects: a job type of one tenant, which an operator may pause
//! (its jobs wait, none is activated, creates still land) and whose figures
//! a partition reports: jobs by state, the oldest waiting job, and what
//! happened in the last minute and hour.
//!
//! Pauses are replicated state (data version [`PAUSED_QUEUES`] on). The
//! windows are counted by every replica from the entries it applies, by the
//! entries' time, and kept in memory only: a replica that restarted or
//! installed a snapshot counts from then.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::ids::Millis;

/// The data version from which queues can be paused: [`crate::core::Command::SetPaused`]
/// and [`crate::core::Command::QueueStats`] travel, and snapshots holding pauses are
/// written at this version or later.
pub const PAUSED_QUEUES: u16 = 11;

/// What happened to a queue's jobs over some span.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueCounts {
    pub created: u64,
    pub activated: u64,
    pub completed: u64,
    /// Failed attempts (each one, retried or not).
    pub failed: u64,
    /// Jobs that ran out of retries (incidents).
    pub exhausted: u64,
    /// Summed ms from creation to activation of the activations counted.
    pub wait_ms: u64,
    /// Summed ms from activation to completion of the completions counted.
    pub run_ms: u64,
}

impl QueueCounts {
    pub fn add(&mut self, other: &QueueCounts) {
        self.created += other.created;
        self.activated += other.activated;
        self.completed += other.completed;
        self.failed += other.failed;
        self.exhausted += other.exhausted;
        self.wait_ms += other.wait_ms;
        self.run_ms += other.run_ms;
    }
}

/// One event a window counts.
#[derive(Clone, Copy, Debug)]
pub enum Tally {
    Created,
    Activated { waited_ms: Millis },
    Completed { ran_ms: Millis },
    Failed,
    Exhausted,
}

const MINUTE_MS: Millis = 60_000;
/// Minutes a window keeps.
const WINDOW_MINUTES: usize = 60;

/// A queue's counts by minute over the last hour, by partition time.
#[derive(Clone, Debug, Default)]
pub struct Window {
    /// (minute since the epoch, its counts), oldest first.
    minutes: VecDeque<(Millis, QueueCounts)>,
}

impl Window {
    pub fn record(&mut self, now: Millis, tally: Tally) {
        let minute = now.div_euclid(MINUTE_MS);
        if self.minutes.back().is_none_or(|(m, _)| *m < minute) {
            self.minutes.push_back((minute, QueueCounts::default()));
            while self.minutes.len() > WINDOW_MINUTES {
                self.minutes.pop_front();
            }
        }
        let counts = &mut self.minutes.back_mut().expect("just pushed").1;
        match tally {
            Tally::Created => counts.created += 1,
            Tally::Activated { waited_ms } => {
                counts.activated += 1;
                counts.wait_ms = counts.wait_ms.saturating_add(waited_ms.max(0) as u64);
            }
            Tally::Completed { ran_ms } => {
                counts.completed += 1;
                counts.run_ms = counts.run_ms.saturating_add(ran_ms.max(0) as u64);
            }
            Tally::Failed => counts.failed += 1,
            Tally::Exhausted => counts.exhausted += 1,
        }
    }

    /// The counts of the minutes that overlap the `span_ms` before `now`:
    /// whole minutes, so up to a minute more than the span.
    pub fn since(&self, now: Millis, span_ms: Millis) -> QueueCounts {
        let first = (now - span_ms).div_euclid(MINUTE_MS);
        let mut total = QueueCounts::default();
        for (_, counts) in self.minutes.iter().filter(|(m, _)| *m >= first) {
            total.add(counts);
        }
        total
    }

    /// Whether nothing within the last hour of `now` is counted.
    pub fn is_stale(&self, now: Millis) -> bool {
        self.minutes.back().is_none_or(|(m, _)| *m + WINDOW_MINUTES as Millis <= now.div_euclid(MINUTE_MS))
    }
}

/// One queue's figures on one partition, or merged over the partitions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueStats {
    pub tenant: String,
    pub job_type: String,
    /// When the queue was paused (partition time); `None` while it runs.
    pub paused_at: Option<Millis>,
    /// Activatable jobs (waiting for a worker, held back while paused).
    pub available: u64,
    /// Activated jobs (a worker holds them).
    pub active: u64,
    /// Jobs waiting for a due time before their first attempt.
    pub scheduled: u64,
    /// Jobs waiting out a back-off before another attempt.
    pub retrying: u64,
    /// Jobs out of retries, waiting for an operator (incidents).
    pub incidents: u64,
    /// Creation time of the oldest activatable job.
    pub oldest_available_at: Option<Millis>,
    pub last_minute: QueueCounts,
    pub last_hour: QueueCounts,
    /// The partition time the figures are of (the latest, once merged).
    pub at: Millis,
}

impl QueueStats {
    /// Folds another partition's figures of the same queue into these.
    pub fn merge(&mut self, other: &QueueStats) {
        self.paused_at = match (self.paused_at, other.paused_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.available += other.available;
        self.active += other.active;
        self.scheduled += other.scheduled;
        self.retrying += other.retrying;
        self.incidents += other.incidents;
        self.oldest_available_at = match (self.oldest_available_at, other.oldest_available_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_minute.add(&other.last_minute);
        self.last_hour.add(&other.last_hour);
        self.at = self.at.max(other.at);
    }

    /// Merges every partition's figures into one per (tenant, job type), in that order.
    pub fn merge_all(parts: impl IntoIterator<Item = QueueStats>) -> Vec<QueueStats> {
        let mut merged: std::collections::BTreeMap<(String, String), QueueStats> = Default::default();
        for stats in parts {
            match merged.get_mut(&(stats.tenant.clone(), stats.job_type.clone())) {
                Some(into) => into.merge(&stats),
                None => {
                    merged.insert((stats.tenant.clone(), stats.job_type.clone()), stats);
                }
            }
        }
        merged.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_counts_the_last_minute_and_hour_by_entry_time() {
        let mut w = Window::default();
        let t0 = 10 * MINUTE_MS;
        w.record(t0, Tally::Created);
        w.record(t0 + 1, Tally::Activated { waited_ms: 40 });
        w.record(t0 + 30 * MINUTE_MS, Tally::Completed { ran_ms: 7 });
        let now = t0 + 30 * MINUTE_MS + 5;
        assert_eq!(w.since(now, MINUTE_MS).completed, 1);
        assert_eq!(w.since(now, MINUTE_MS).created, 0, "half an hour ago is not the last minute");
        assert_eq!(w.since(t0 + MINUTE_MS + 5, MINUTE_MS).created, 1, "the minute before overlaps the last 60 s");
        let hour = w.since(now, 60 * MINUTE_MS);
        assert_eq!((hour.created, hour.activated, hour.completed, hour.wait_ms, hour.run_ms), (1, 1, 1, 40, 7));
        // An hour on, the first minute has left the window.
        let later = t0 + 61 * MINUTE_MS;
        assert_eq!(w.since(later, 60 * MINUTE_MS).created, 0);
        assert_eq!(w.since(later, 60 * MINUTE_MS).completed, 1);
        assert!(!w.is_stale(later));
        assert!(w.is_stale(t0 + 91 * MINUTE_MS));
    }

    #[test]
    fn figures_merge_over_partitions() {
        let part = |available, paused_at, oldest| QueueStats {
            tenant: "acme".into(),
            job_type: "t".into(),
            available,
            paused_at,
            oldest_available_at: oldest,
            ..Default::default()
        };
        let merged = QueueStats::merge_all([part(2, None, Some(50)), part(3, Some(9), Some(40)), part(0, None, None)]);
        assert_eq!(merged.len(), 1);
        assert_eq!((merged[0].available, merged[0].paused_at, merged[0].oldest_available_at), (5, Some(9), Some(40)));
    }
}
