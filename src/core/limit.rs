//! Rate and concurrency limits of a queue (a tenant's job type), and of each
//! key within it: what a limit says, the token bucket a rate keeps, and
//! which partition a limited queue's jobs live on.
//!
//! A limited queue's jobs are made on one partition, its **home**, so the
//! limit is that partition's replicated state, decided at apply in
//! partition time: a leader change neither refills a bucket nor frees a
//! slot. Every partition holds the limit too (it is set on each, like a
//! pause), and holds to it the queue's jobs it has itself: the few made
//! before it applied the limit, with an idempotency key, or by a workflow
//! or schedule (see `docs/limits.md`).

use serde::{Deserialize, Serialize};

use super::ids::{Millis, PartitionId};

/// The data version from which queues have limits: [`crate::core::Command::SetLimit`],
/// the limit records and their snapshot section.
pub const LIMITS: u16 = 14;

/// The custom header naming a job's limit key (absent or empty: none).
pub const LIMIT_KEY_HEADER: &str = "drover.limit_key";

/// The most keys one queue keeps buckets or counts for; a job of a new key
/// beyond it waits until older keys' buckets are full again (and so forgotten).
pub const MAX_KEYS: usize = 10_000;
/// Longest period a rate may be given over: a day.
pub const MAX_PERIOD_MS: Millis = 86_400_000;

/// Job starts allowed per period, as a token bucket: `burst` tokens at most,
/// refilled evenly at `limit` per `period_ms`; each activation takes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    pub limit: u32,
    pub period_ms: Millis,
    pub burst: u32,
}

impl Rate {
    /// `limit` starts per `period_ms`, with the default burst: a tenth of
    /// the limit, at least one (so a limit holds over short windows too).
    pub fn new(limit: u32, period_ms: Millis) -> Rate {
        Rate { limit, period_ms, burst: limit.div_ceil(10).max(1) }
    }
}

/// One level of a limit (the queue's, or each key's): either may be absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limit {
    pub rate: Option<Rate>,
    /// Activations held at once, at most.
    pub concurrency: Option<u32>,
}

impl Limit {
    pub fn is_none(&self) -> bool {
        self.rate.is_none() && self.concurrency.is_none()
    }
}

/// A queue's limit: the queue's as a whole, and each key's within it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueLimit {
    /// The partition the queue's jobs are made on (see [`limit_home`]).
    pub home: PartitionId,
    pub queue: Limit,
    pub per_key: Limit,
}

impl QueueLimit {
    /// Checks what a person asked for; the message says what to change.
    pub fn validate(&self) -> Result<(), String> {
        if self.queue.is_none() && self.per_key.is_none() {
            return Err("a limit needs a rate or a concurrency, for the queue or per key".into());
        }
        for (level, limit) in [("queue", &self.queue), ("per-key", &self.per_key)] {
            if let Some(rate) = limit.rate {
                if rate.limit == 0 || rate.burst == 0 {
                    return Err(format!("the {level} rate's limit and burst must be at least 1"));
                }
                if !(1..=MAX_PERIOD_MS).contains(&rate.period_ms) {
                    return Err(format!("the {level} rate's period must be 1 ms to 1 day, not {} ms", rate.period_ms));
                }
            }
            if limit.concurrency == Some(0) {
                return Err(format!("the {level} concurrency must be at least 1 (clear the limit to lift it)"));
            }
        }
        Ok(())
    }
}

/// The partition a tenant's limited queue lives on: where an ordering key
/// equal to the type sends its creates (so an OJS queue, which is sent so,
/// is already there).
pub fn limit_home(tenant: &str, job_type: &str, partitions: u32) -> PartitionId {
    // A create names the default tenant by leaving it empty, and its
    // ordering key hashes that way.
    let tenant = if tenant == super::DEFAULT_TENANT { "" } else { tenant };
    super::idempotency_partition(tenant, "", &format!("ordering:{job_type}"), partitions)
}

/// A job's limit key: its [`LIMIT_KEY_HEADER`] header, if not empty.
pub fn limit_key(headers: &[(String, String)]) -> Option<&str> {
    headers.iter().find(|(name, _)| name == LIMIT_KEY_HEADER).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
}

/// A rate's bucket at `at` (partition time): `milli` thousandths of a
/// token, and `rem` of the next thousandth counted in `1 / period_ms`ths
/// (a millisecond adds `limit * 1000` of those), so refilling is exact and
/// the same however often it is done: a replica that refilled once reaches
/// what one that refilled at every entry did. A bucket not kept is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    pub milli: i64,
    pub rem: i64,
    pub at: Millis,
}

const MILLI: i64 = 1000;

impl Bucket {
    pub fn full(rate: &Rate, now: Millis) -> Bucket {
        Bucket { milli: i64::from(rate.burst) * MILLI, rem: 0, at: now }
    }

    /// Refills to `now`: never past the burst, never backwards in time.
    pub fn refill(&mut self, rate: &Rate, now: Millis) {
        let cap = i64::from(rate.burst) * MILLI;
        if now > self.at {
            let period = i128::from(rate.period_ms.max(1));
            let total = i128::from(self.rem) + i128::from(now - self.at) * i128::from(rate.limit) * i128::from(MILLI);
            let milli = i128::from(self.milli) + total / period;
            (self.milli, self.rem) = match milli >= i128::from(cap) {
                true => (cap, 0),
                false => (milli as i64, (total % period) as i64),
            };
            self.at = now;
        }
        if self.milli >= cap {
            (self.milli, self.rem) = (cap, 0);
        }
    }

    /// Whole tokens in the bucket (after [`Self::refill`]).
    pub fn tokens(&self) -> i64 {
        self.milli / MILLI
    }

    /// Takes one token; the caller checked there is one.
    pub fn take(&mut self) {
        self.milli -= MILLI;
    }

    pub fn is_full(&self, rate: &Rate) -> bool {
        self.milli >= i64::from(rate.burst) * MILLI
    }

    /// When the bucket holds a whole token again (refilled to `at` first).
    pub fn next_token_at(&self, rate: &Rate) -> Millis {
        if self.milli >= MILLI {
            return self.at;
        }
        let period = i128::from(rate.period_ms.max(1));
        let missing = i128::from(MILLI - self.milli) * period - i128::from(self.rem);
        let per_ms = i128::from(rate.limit) * i128::from(MILLI);
        let wait = (missing + per_ms - 1) / per_ms;
        self.at.saturating_add(wait as Millis)
    }
}

/// A queue's limit as stored and snapshotted, with its buckets' state
/// (key `""` is the queue's own bucket); full buckets are not kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitRecord {
    pub tenant: String,
    pub job_type: String,
    pub limit: QueueLimit,
    pub buckets: Vec<(String, Bucket)>,
}

/// A queue's limit as one partition holds it now, for the queue figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LimitState {
    pub tenant: String,
    pub job_type: String,
    pub limit: QueueLimit,
    /// The partition these figures are of.
    pub partition: PartitionId,
    /// Activations of the queue this partition holds now.
    pub active: u32,
    /// Whole tokens in the queue's bucket now (`None`: no queue rate).
    pub tokens: Option<i64>,
    /// Keys with a bucket or an activation here.
    pub keys: u32,
    /// Activatable jobs waiting here, the limit holding them back or not.
    pub waiting: u64,
}
