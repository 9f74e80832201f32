//! OJS retry policies (`options.retry`): how many attempts a job has, how
//! long it waits after each failure, and which errors end it at once.
//!
//! The gateway reads a job's policy when a worker fails it (nack) and sends
//! Drover's `Fail` with the retries left and the back-off the policy gives,
//! so the partition applies a decision already made, as for any worker.

use serde_json::{json, Value};

use super::time::parse_duration;

/// What OJS gives a job that names no policy.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 3;
const DEFAULT_INITIAL_MS: i64 = 1000;
const DEFAULT_COEFFICIENT: f64 = 2.0;
const DEFAULT_MAX_MS: i64 = 300_000;
/// The most attempts a policy may name (Drover's retries are an i32).
const MAX_ATTEMPTS: i64 = 1_000_000;

#[derive(Clone, Debug, PartialEq)]
pub enum Strategy {
    Exponential,
    Linear,
    Constant,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    pub max_attempts: i32,
    pub initial_ms: i64,
    pub coefficient: f64,
    pub max_ms: i64,
    pub jitter: bool,
    pub strategy: Strategy,
    /// Error types (exact, or a prefix ending in `.*` or `*`) that discard
    /// the job at their first failure.
    pub non_retryable: Vec<String>,
    /// `discard` or `dead_letter`: both leave the job discarded (Drover's
    /// incident), which the dead-letter endpoints list.
    pub on_exhaustion: String,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            initial_ms: DEFAULT_INITIAL_MS,
            coefficient: DEFAULT_COEFFICIENT,
            max_ms: DEFAULT_MAX_MS,
            jitter: true,
            strategy: Strategy::Exponential,
            non_retryable: Vec::new(),
            on_exhaustion: "discard".into(),
        }
    }
}

impl RetryPolicy {
    /// The policy `value` (an `options.retry` object) names, or why it is not one.
    pub fn parse(value: Option<&Value>) -> Result<RetryPolicy, String> {
        let mut policy = RetryPolicy::default();
        let Some(value) = value else { return Ok(policy) };
        let Some(fields) = value.as_object() else {
            return Err("options.retry must be an object".into());
        };
        if let Some(v) = fields.get("max_attempts") {
            match v.as_i64() {
                Some(n) if (1..=MAX_ATTEMPTS).contains(&n) => policy.max_attempts = n as i32,
                _ => {
                    return Err(format!(
                        "options.retry.max_attempts must be a whole number from 1 to {MAX_ATTEMPTS}, got {v}"
                    ))
                }
            }
        }
        let duration = |name: &str| -> Result<Option<i64>, String> {
            match fields.get(name) {
                None => Ok(None),
                Some(Value::String(text)) => parse_duration(text).map(Some).ok_or_else(|| {
                    format!("options.retry.{name} must be an ISO 8601 duration such as PT1S, got {text:?}")
                }),
                Some(other) => Err(format!("options.retry.{name} must be an ISO 8601 duration string, got {other}")),
            }
        };
        if let Some(ms) = duration("initial_interval")? {
            policy.initial_ms = ms;
        }
        if let Some(ms) = duration("max_interval")? {
            policy.max_ms = ms;
        }
        if policy.max_ms < policy.initial_ms {
            return Err("options.retry.max_interval must not be shorter than initial_interval".into());
        }
        if let Some(v) = fields.get("backoff_coefficient") {
            match v.as_f64() {
                Some(c) if (1.0..=1000.0).contains(&c) => policy.coefficient = c,
                _ => {
                    return Err(format!("options.retry.backoff_coefficient must be a number from 1.0 to 1000, got {v}"))
                }
            }
        }
        if let Some(v) = fields.get("jitter") {
            policy.jitter =
                v.as_bool().ok_or_else(|| format!("options.retry.jitter must be true or false, got {v}"))?;
        }
        if let Some(v) = fields.get("backoff_strategy") {
            policy.strategy = match v.as_str() {
                Some("exponential") => Strategy::Exponential,
                Some("linear") => Strategy::Linear,
                Some("constant") => Strategy::Constant,
                _ => {
                    return Err(format!(
                        "options.retry.backoff_strategy must be exponential, linear or constant, got {v}"
                    ))
                }
            };
        }
        if let Some(v) = fields.get("non_retryable_errors") {
            let list = v.as_array().ok_or("options.retry.non_retryable_errors must be an array of strings")?;
            policy.non_retryable = list
                .iter()
                .map(|e| e.as_str().map(str::to_string).ok_or("options.retry.non_retryable_errors must hold strings"))
                .collect::<Result<_, _>>()?;
        }
        if let Some(v) = fields.get("on_exhaustion") {
            match v.as_str() {
                Some(action @ ("discard" | "dead_letter")) => policy.on_exhaustion = action.into(),
                _ => return Err(format!("options.retry.on_exhaustion must be discard or dead_letter, got {v}")),
            }
        }
        Ok(policy)
    }

    /// The wait (ms) after failed attempt `attempt` (1 for the first), with
    /// jitter drawn from `unit` (a number in [0, 1)).
    pub fn delay_ms(&self, attempt: u32, unit: f64) -> i64 {
        let n = f64::from(attempt.max(1));
        let base = self.initial_ms as f64;
        let raw = match self.strategy {
            Strategy::Exponential => base * self.coefficient.powf(n - 1.0),
            Strategy::Linear => base * n,
            Strategy::Constant => base,
        };
        let capped = raw.min(self.max_ms as f64);
        let jittered = if self.jitter { capped * (0.5 + unit) } else { capped };
        jittered.round().clamp(0.0, i64::MAX as f64 / 2.0) as i64
    }

    /// Whether an error of `kind` ends the job at once.
    pub fn is_fatal(&self, kind: &str) -> bool {
        self.non_retryable.iter().any(|pattern| match pattern.strip_suffix('*') {
            Some(prefix) => kind.starts_with(prefix.strip_suffix('.').unwrap_or(prefix)),
            None => pattern == kind,
        })
    }

    /// The policy as an envelope shows it.
    pub fn to_json(&self) -> Value {
        json!({
            "max_attempts": self.max_attempts,
            "initial_interval": format!("PT{}S", self.initial_ms as f64 / 1000.0),
            "backoff_coefficient": self.coefficient,
            "max_interval": format!("PT{}S", self.max_ms as f64 / 1000.0),
            "jitter": self.jitter,
            "non_retryable_errors": self.non_retryable,
            "on_exhaustion": self.on_exhaustion,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(value: Value) -> RetryPolicy {
        RetryPolicy::parse(Some(&value)).expect("a valid policy")
    }

    #[test]
    fn back_off_grows_as_the_strategy_says_and_stops_at_the_cap() {
        let exponential = policy(json!({"initial_interval": "PT1S", "backoff_coefficient": 2.0, "jitter": false}));
        assert_eq!([1, 2, 3].map(|n| exponential.delay_ms(n, 0.0)), [1000, 2000, 4000]);
        let capped = policy(json!({"backoff_coefficient": 10.0, "max_interval": "PT2S", "jitter": false}));
        assert_eq!([1, 2, 3].map(|n| capped.delay_ms(n, 0.0)), [1000, 2000, 2000]);
        let linear = policy(json!({"backoff_strategy": "linear", "jitter": false}));
        assert_eq!([1, 2, 3].map(|n| linear.delay_ms(n, 0.0)), [1000, 2000, 3000]);
        let constant = policy(json!({"backoff_coefficient": 1.0, "jitter": false}));
        assert_eq!([1, 2, 3].map(|n| constant.delay_ms(n, 0.0)), [1000, 1000, 1000]);
        let jittered = policy(json!({"initial_interval": "PT2S", "backoff_coefficient": 1.0}));
        assert_eq!((jittered.delay_ms(1, 0.0), jittered.delay_ms(1, 0.999_9)), (1000, 3000));
    }

    #[test]
    fn bad_policies_are_refused_with_the_field_named() {
        for (value, field) in [
            (json!({"max_attempts": -1}), "max_attempts"),
            (json!({"max_attempts": 0}), "max_attempts"),
            (json!({"backoff_coefficient": 0.5}), "backoff_coefficient"),
            (json!({"initial_interval": "soon"}), "initial_interval"),
            (json!({"on_exhaustion": "explode"}), "on_exhaustion"),
            (json!("three"), "retry"),
        ] {
            let error = RetryPolicy::parse(Some(&value)).expect_err("refused");
            assert!(error.contains(field), "{error}");
        }
    }

    #[test]
    fn fatal_errors_match_exactly_or_by_prefix() {
        let p = policy(json!({"non_retryable_errors": ["FatalError", "Auth.*"]}));
        assert!(p.is_fatal("FatalError") && p.is_fatal("Auth.TokenExpired") && p.is_fatal("AuthenticationError"));
        assert!(!p.is_fatal("Fatal") && !p.is_fatal("NetworkError"));
    }
}
