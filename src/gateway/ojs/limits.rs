//! OJS's `options.rate_limit`: a job declares its queue's limit (the
//! queue's own, or with a key each key's). Only the parsing is OJS's: the
//! enqueue hands the declared level to the job API
//! ([`crate::gateway::api::JobApi::declare_limit`]), which sets it on the
//! queue before the job is made, when it is not the queue's limit already.

use serde_json::Value;

use super::time::parse_duration;
use crate::proto::gateway as pb;

/// `options.rate_limit` as a limit level and its key: `max_per_second`,
/// or a `throttle` (evenly spaced: a burst of one) or `rate` window, each
/// `{limit, period}` (an ISO 8601 duration), and a `concurrency`.
pub(super) fn parse(value: &Value) -> Result<(pb::LimitLevel, Option<String>), String> {
    let fields = value.as_object().ok_or("options.rate_limit must be an object")?;
    let whole = |name: &str| -> Result<Option<u32>, String> {
        match fields.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if (1..=u64::from(u32::MAX)).contains(&n) => Ok(Some(n as u32)),
                _ => Err(format!("options.rate_limit.{name} must be a whole number above 0, got {v}")),
            },
        }
    };
    let window = |name: &str| -> Result<Option<(u32, i64)>, String> {
        let Some(window) = fields.get(name).filter(|v| !v.is_null()) else { return Ok(None) };
        let limit = window.get("limit").and_then(Value::as_u64).filter(|n| (1..=u64::from(u32::MAX)).contains(n));
        let period = window.get("period").and_then(Value::as_str).and_then(parse_duration).filter(|ms| *ms > 0);
        match (limit, period) {
            (Some(limit), Some(period)) => Ok(Some((limit as u32, period))),
            _ => Err(format!(
                "options.rate_limit.{name} needs limit (a whole number above 0) and period (an ISO 8601 duration)"
            )),
        }
    };
    let mut level = pb::LimitLevel { concurrency: whole("concurrency")?.unwrap_or(0), ..Default::default() };
    if let Some(per_second) = whole("max_per_second")? {
        (level.rate, level.period_ms) = (per_second, 1_000);
    } else if let Some((limit, period)) = window("throttle")? {
        (level.rate, level.period_ms, level.burst) = (limit, period, 1);
    } else if let Some((limit, period)) = window("rate")? {
        (level.rate, level.period_ms, level.burst) = (limit, period, limit);
    }
    if level.rate == 0 && level.concurrency == 0 {
        return Err("options.rate_limit needs max_per_second, throttle, rate or concurrency".into());
    }
    let key = match fields.get("key") {
        None | Some(Value::Null) => None,
        Some(Value::String(key)) if !key.is_empty() && key.len() <= 255 => Some(key.clone()),
        Some(other) => return Err(format!("options.rate_limit.key must be a string of 1 to 255 bytes, got {other}")),
    };
    Ok((level, key))
}
