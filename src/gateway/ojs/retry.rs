//! OJS retry policies (`options.retry`): how many attempts a job has, how
//! long it waits after each failure, and which errors end it at once.
//!
//! Only the translation is OJS's: the attempts are the job's retries, and
//! the rest is the engine's policy ([`crate::core::retry`]), kept in the
//! job's `drover.retry` header, by which the partition decides a nack.

use serde_json::{json, Value};

use super::time::parse_duration;
use crate::core::retry::{Backoff, RetryPolicy as EnginePolicy};

/// What OJS gives a job that names no policy.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 3;
/// The most attempts a policy may name (Drover's retries are an i32).
const MAX_ATTEMPTS: i64 = 1_000_000;

#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    pub max_attempts: i32,
    /// `discard` or `dead_letter`: both leave the job discarded (Drover's
    /// incident), which the dead-letter endpoints list.
    pub on_exhaustion: String,
    /// The back-off and the errors never retried, as the engine applies them
    /// (its default is OJS's: exponential from a second, doubling, up to
    /// five minutes, with jitter).
    pub engine: EnginePolicy,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            on_exhaustion: "discard".into(),
            engine: EnginePolicy::default(),
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
        let engine = &mut policy.engine;
        if let Some(ms) = duration("initial_interval")? {
            engine.initial_ms = ms;
        }
        if let Some(ms) = duration("max_interval")? {
            engine.max_ms = ms;
        }
        if engine.max_ms < engine.initial_ms {
            return Err("options.retry.max_interval must not be shorter than initial_interval".into());
        }
        if let Some(v) = fields.get("backoff_coefficient") {
            match v.as_f64() {
                Some(c) if (1.0..=1000.0).contains(&c) => engine.coefficient = c,
                _ => {
                    return Err(format!("options.retry.backoff_coefficient must be a number from 1.0 to 1000, got {v}"))
                }
            }
        }
        if let Some(v) = fields.get("jitter") {
            engine.jitter =
                v.as_bool().ok_or_else(|| format!("options.retry.jitter must be true or false, got {v}"))?;
        }
        if let Some(v) = fields.get("backoff_strategy") {
            engine.backoff = match v.as_str() {
                Some("exponential") => Backoff::Exponential,
                Some("linear") => Backoff::Linear,
                Some("constant") => Backoff::Constant,
                _ => {
                    return Err(format!(
                        "options.retry.backoff_strategy must be exponential, linear or constant, got {v}"
                    ))
                }
            };
        }
        if let Some(v) = fields.get("non_retryable_errors") {
            let list = v.as_array().ok_or("options.retry.non_retryable_errors must be an array of strings")?;
            engine.non_retryable = list
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

    /// [`RetryPolicy::parse`] for a new job, whose policy the partition
    /// keeps and applies: also within the engine's bounds (intervals up to a
    /// week, at most 64 non-retryable error types of 1 to 255 bytes). A job
    /// stored before is read back with `parse` alone, as it was accepted.
    pub fn parse_new(value: Option<&Value>) -> Result<RetryPolicy, String> {
        let policy = Self::parse(value)?;
        policy.engine.validate().map_err(|why| format!("options.retry: {why}"))?;
        Ok(policy)
    }

    /// The wait (ms) after failed attempt `attempt` (1 for the first),
    /// without jitter: what the policy gives, as an envelope shows it.
    pub fn delay_ms(&self, attempt: u32) -> i64 {
        self.engine.delay_ms(attempt, 1 << 15)
    }

    /// The policy as an envelope shows it.
    pub fn to_json(&self) -> Value {
        let engine = &self.engine;
        json!({
            "max_attempts": self.max_attempts,
            "initial_interval": format!("PT{}S", engine.initial_ms as f64 / 1000.0),
            "backoff_coefficient": engine.coefficient,
            "max_interval": format!("PT{}S", engine.max_ms as f64 / 1000.0),
            "jitter": engine.jitter,
            "non_retryable_errors": engine.non_retryable,
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
    fn options_name_the_engine_policy() {
        let p = policy(json!({
            "max_attempts": 5, "initial_interval": "PT2S", "backoff_coefficient": 3.0, "max_interval": "PT1M",
            "jitter": false, "backoff_strategy": "linear", "non_retryable_errors": ["Fatal"],
        }));
        assert_eq!(p.max_attempts, 5);
        let engine = EnginePolicy {
            backoff: Backoff::Linear,
            initial_ms: 2000,
            coefficient: 3.0,
            max_ms: 60_000,
            jitter: false,
            non_retryable: vec!["Fatal".into()],
        };
        assert_eq!(p.engine, engine);
        assert_eq!([1, 2, 3].map(|n| p.delay_ms(n)), [2000, 4000, 6000]);
        assert_eq!(policy(json!({})).engine, EnginePolicy::default(), "OJS's default is the engine's");
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
            (json!({"non_retryable_errors": [""]}), "non_retryable_errors"),
        ] {
            let error = RetryPolicy::parse_new(Some(&value)).expect_err("refused");
            assert!(error.contains(field), "{error}");
        }
    }
}
