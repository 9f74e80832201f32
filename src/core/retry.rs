//! Retry policies: how long a job waits after each failed attempt, and which
//! errors end it at once. A job's policy is part of what its producer asked
//! for (its spec, under [`RETRY_POLICY_HEADER`]); the engine applies it when
//! a worker fails an attempt by the policy ([`super::Command::FailByPolicy`]),
//! so every surface (drover.v1, the Open Job Spec, the console) gets the
//! same decision, made once, where the job lives.
//!
//! The policy's arithmetic is deterministic on every replica: the back-off
//! is computed with IEEE multiplications only (no `powf`), and the jitter is
//! a number the gateway drew and the command carries.

use serde::{Deserialize, Serialize};

use super::job::JobSpec;

/// The data version from which a failure may be decided by the job's
/// policy ([`super::Command::FailByPolicy`]): sent only once every member
/// reads it.
pub const RETRY_POLICIES: u16 = 17;

/// The custom header a job's retry policy is kept under, as
/// [`RetryPolicy::encode`] writes it. The gateway writes it from a create's
/// policy (or checks the one a client put there), so every replica reads
/// the same policy.
pub const RETRY_POLICY_HEADER: &str = "drover.retry";

/// How the wait grows from one failed attempt to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Backoff {
    /// `initial * coefficient^(n-1)`.
    Exponential,
    /// `initial * n`.
    Linear,
    /// `initial`.
    Constant,
}

/// What a producer asked to happen when an attempt fails.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    pub backoff: Backoff,
    /// The wait after the first failed attempt (ms).
    pub initial_ms: i64,
    /// The exponential back-off's factor: 1.0 to 1000.
    pub coefficient: f64,
    /// No wait is longer before jitter (ms); jitter spreads it up to one
    /// and a half times that.
    pub max_ms: i64,
    /// Whether the wait is drawn from half to one and a half times the
    /// computed one (spreading retries of jobs that failed together).
    pub jitter: bool,
    /// Error types (exact, or a prefix ending in `*` or `.*`) that end the
    /// job at their first failure, retries left or not.
    pub non_retryable: Vec<String>,
}

/// The most error types a policy lists, and the longest one.
pub const MAX_NON_RETRYABLE: usize = 64;
pub const MAX_ERROR_TYPE_LEN: usize = 255;
/// The longest wait a policy may give: a week.
pub const MAX_BACKOFF_MS: i64 = 604_800_000;

impl Default for RetryPolicy {
    /// The Open Job Spec's default: exponential from a second, doubling, up
    /// to five minutes, with jitter.
    fn default() -> Self {
        RetryPolicy {
            backoff: Backoff::Exponential,
            initial_ms: 1_000,
            coefficient: 2.0,
            max_ms: 300_000,
            jitter: true,
            non_retryable: Vec::new(),
        }
    }
}

impl RetryPolicy {
    /// Why the policy is not one, if it is not: the first field out of range.
    pub fn validate(&self) -> Result<(), String> {
        if !(0..=MAX_BACKOFF_MS).contains(&self.initial_ms) {
            return Err(format!("initial_interval must be 0 to {MAX_BACKOFF_MS} ms, got {}", self.initial_ms));
        }
        if !(0..=MAX_BACKOFF_MS).contains(&self.max_ms) {
            return Err(format!("max_interval must be 0 to {MAX_BACKOFF_MS} ms, got {}", self.max_ms));
        }
        if self.max_ms < self.initial_ms {
            return Err("max_interval must not be shorter than initial_interval".into());
        }
        if !(1.0..=1000.0).contains(&self.coefficient) {
            return Err(format!("backoff_coefficient must be a number from 1.0 to 1000, got {}", self.coefficient));
        }
        if self.non_retryable.len() > MAX_NON_RETRYABLE {
            return Err(format!("non_retryable_errors holds at most {MAX_NON_RETRYABLE} error types"));
        }
        if let Some(bad) = self.non_retryable.iter().find(|e| e.is_empty() || e.len() > MAX_ERROR_TYPE_LEN) {
            return Err(format!(
                "non_retryable_errors: {bad:?} is not an error type of 1 to {MAX_ERROR_TYPE_LEN} bytes"
            ));
        }
        Ok(())
    }

    /// The wait (ms) after failed attempt `attempt` (1 for the first), with
    /// jitter drawn from `jitter` (a fraction `jitter / 65536` in [0, 1)).
    pub fn delay_ms(&self, attempt: u32, jitter: u16) -> i64 {
        let n = attempt.max(1);
        let base = self.initial_ms as f64;
        let cap = self.max_ms as f64;
        let raw = match self.backoff {
            Backoff::Constant => base,
            Backoff::Linear => base * f64::from(n),
            Backoff::Exponential => {
                // base * coefficient^(n-1) by squaring: IEEE multiplications
                // in a fixed order (no `powf`, whose last bit may differ
                // between builds), about log2(n) of them, stopping once past
                // the cap (the wait only grows) or at a wait of 0.
                let (mut wait, mut factor, mut exponent) = (base, self.coefficient, n - 1);
                while exponent > 0 && wait < cap && wait > 0.0 {
                    if exponent & 1 == 1 {
                        wait *= factor;
                    }
                    factor *= factor;
                    exponent >>= 1;
                }
                wait
            }
        };
        let capped = raw.min(cap);
        let spread = if self.jitter { capped * (0.5 + f64::from(jitter) / 65536.0) } else { capped };
        spread.round().clamp(0.0, MAX_BACKOFF_MS as f64 * 1.5) as i64
    }

    /// Whether an error of type `kind` ends the job at once.
    pub fn is_fatal(&self, kind: &str) -> bool {
        self.non_retryable.iter().any(|pattern| match pattern.strip_suffix('*') {
            Some(prefix) => kind.starts_with(prefix.strip_suffix('.').unwrap_or(prefix)),
            None => pattern == kind,
        })
    }

    /// What a failed attempt leads to, given the `retries` left before it,
    /// the error's type and whether the worker said it may be retried at
    /// all: the retries left after it and the wait before the job is due
    /// again. `(0, 0)` is an incident (retries used up, or an error that
    /// must not retry); otherwise one retry is used.
    pub fn decide(&self, retries: i32, attempt: u32, kind: &str, retryable: bool, jitter: u16) -> (i32, i64) {
        if retries <= 1 || !retryable || self.is_fatal(kind) {
            return (0, 0);
        }
        (retries - 1, self.delay_ms(attempt, jitter))
    }

    /// The policy as its header keeps it (compact JSON).
    pub fn encode(&self) -> String {
        serde_json::to_string(self).expect("a policy always serializes")
    }

    /// The policy a header holds; `None` for one that is not (never written
    /// by a gateway, which checks what it stores).
    pub fn decode(text: &str) -> Option<RetryPolicy> {
        serde_json::from_str::<RetryPolicy>(text).ok().filter(|p| p.validate().is_ok())
    }
}

/// The retry policy `spec` names, if it names one.
pub fn retry_policy(spec: &JobSpec) -> Option<RetryPolicy> {
    spec.custom_headers
        .iter()
        .find(|(name, _)| name == RETRY_POLICY_HEADER)
        .and_then(|(_, text)| RetryPolicy::decode(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(backoff: Backoff, coefficient: f64, jitter: bool) -> RetryPolicy {
        RetryPolicy { backoff, coefficient, jitter, ..RetryPolicy::default() }
    }

    #[test]
    fn back_off_grows_as_the_strategy_says_and_stops_at_the_cap() {
        let exponential = policy(Backoff::Exponential, 2.0, false);
        assert_eq!([1, 2, 3].map(|n| exponential.delay_ms(n, 0)), [1000, 2000, 4000]);
        let capped = RetryPolicy { max_ms: 2000, ..policy(Backoff::Exponential, 10.0, false) };
        assert_eq!([1, 2, 3, 1_000_000].map(|n| capped.delay_ms(n, 0)), [1000, 2000, 2000, 2000]);
        let linear = policy(Backoff::Linear, 2.0, false);
        assert_eq!([1, 2, 3].map(|n| linear.delay_ms(n, 0)), [1000, 2000, 3000]);
        let constant = policy(Backoff::Constant, 2.0, false);
        assert_eq!([1, 2, 3].map(|n| constant.delay_ms(n, 0)), [1000, 1000, 1000]);
        let flat = policy(Backoff::Exponential, 1.0, false);
        assert_eq!(flat.delay_ms(u32::MAX, 0), 1000, "a coefficient of 1 is a constant wait, at once");
        let creeping =
            RetryPolicy { initial_ms: 1, max_ms: MAX_BACKOFF_MS, ..policy(Backoff::Exponential, 1.0001, false) };
        assert_eq!(
            creeping.delay_ms(u32::MAX, 0),
            MAX_BACKOFF_MS,
            "a factor just above 1 reaches the cap in few steps"
        );
        let none = RetryPolicy { initial_ms: 0, ..policy(Backoff::Exponential, 3.0, false) };
        assert_eq!(none.delay_ms(u32::MAX, 0), 0);
        let jittered = RetryPolicy { initial_ms: 2000, ..policy(Backoff::Constant, 1.0, true) };
        assert_eq!((jittered.delay_ms(1, 0), jittered.delay_ms(1, u16::MAX)), (1000, 3000));
    }

    #[test]
    fn a_failure_retries_while_retries_are_left_and_the_error_may_retry() {
        let p = RetryPolicy {
            non_retryable: vec!["FatalError".into(), "Auth.*".into()],
            ..policy(Backoff::Constant, 1.0, false)
        };
        assert_eq!(p.decide(3, 1, "NetworkError", true, 0), (2, 1000));
        assert_eq!(p.decide(1, 3, "NetworkError", true, 0), (0, 0), "the last attempt failed");
        assert_eq!(p.decide(3, 1, "FatalError", true, 0), (0, 0));
        assert_eq!(p.decide(3, 1, "Auth.TokenExpired", true, 0), (0, 0));
        assert_eq!(p.decide(3, 1, "NetworkError", false, 0), (0, 0), "the worker said not to retry");
        assert!(!p.is_fatal("Fatal") && !p.is_fatal("") && p.is_fatal("AuthenticationError"));
        let everything = RetryPolicy { non_retryable: vec!["*".into()], ..RetryPolicy::default() };
        assert!(everything.is_fatal("") && everything.is_fatal("Anything"), "* names every error, typed or not");
    }

    #[test]
    fn a_policy_reads_back_as_written_and_a_bad_one_is_refused() {
        let p = RetryPolicy { non_retryable: vec!["X".into()], ..policy(Backoff::Linear, 3.5, true) };
        assert_eq!(RetryPolicy::decode(&p.encode()), Some(p));
        for bad in [
            RetryPolicy { coefficient: 0.5, ..RetryPolicy::default() },
            RetryPolicy { initial_ms: 5_000, max_ms: 1_000, ..RetryPolicy::default() },
            RetryPolicy { initial_ms: -1, ..RetryPolicy::default() },
            RetryPolicy { non_retryable: vec![String::new()], ..RetryPolicy::default() },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
            assert_eq!(RetryPolicy::decode(&bad.encode()), None);
        }
        assert_eq!(RetryPolicy::decode("{not json"), None);
    }
}
