//! An enqueue request's body, checked and translated into Drover's create.

use serde_json::{json, Map, Value};

use super::super::ids;
use super::super::retry::RetryPolicy;
use super::super::time::{parse_duration, parse_time_option, rfc3339};
use super::{id_key, is_queue, is_type, AT, EXTRA, ID, KNOWN, META, NATIVE_OPTIONS, OPTIONS, RESULT, TYPE};
use crate::gateway::api::queues::DeclaredLimit;
use crate::proto::gateway as pb;

/// An enqueue, checked.
#[derive(Debug)]
pub struct Enqueue {
    pub request: pb::CreateJobRequest,
    pub unique: Option<Unique>,
    /// `options.rate_limit`: the limit the job declares for its queue.
    pub limit: Option<DeclaredLimit>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Conflict {
    Reject,
    Ignore,
    Replace,
}

/// `options.unique`: which jobs count as this one's duplicates.
#[derive(Debug, Clone)]
pub struct Unique {
    /// The idempotency key the unique fields hash to.
    pub key: String,
    pub on_conflict: Conflict,
    /// OJS states in which an existing job blocks a new one.
    pub states: Vec<String>,
    /// How long after its creation an existing job blocks (ms).
    pub period_ms: Option<i64>,
}

/// Why an enqueue is refused: malformed (400), or well-formed with values
/// the server cannot honour, such as a retry policy that makes no sense (422).
#[derive(Debug)]
pub struct Invalid {
    pub message: String,
    pub unprocessable: bool,
}

impl From<String> for Invalid {
    fn from(message: String) -> Self {
        Invalid { message, unprocessable: false }
    }
}

impl From<&str> for Invalid {
    fn from(message: &str) -> Self {
        Invalid::from(message.to_string())
    }
}

fn unprocessable(message: String) -> Invalid {
    Invalid { message, unprocessable: true }
}

/// Checks an enqueue request's body and translates it; the error names
/// what is wrong.
pub fn enqueue(body: &Value, now_ms: i64) -> Result<Enqueue, Invalid> {
    let fields = body.as_object().ok_or("a job must be a JSON object")?;
    let kind = match fields.get("type") {
        Some(Value::String(kind)) if is_type(kind) => kind.clone(),
        Some(Value::String(kind)) => {
            return Err(format!(
                "type {kind:?} is not a job type: dot-separated words of lowercase letters, digits, _ and -, each \
                 starting with a letter (email.send)"
            )
            .into())
        }
        Some(_) => return Err("type must be a string".into()),
        None => return Err("type is required".into()),
    };
    let args = match fields.get("args") {
        Some(args @ Value::Array(_)) => args.clone(),
        Some(_) => return Err("args must be a JSON array".into()),
        None => return Err("args is required (an array; [] for none)".into()),
    };
    let id = match fields.get("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) if ids::is_uuidv7(id) => Some(id.clone()),
        Some(other) => return Err(format!("id {other} is not a lowercase UUIDv7").into()),
    };
    let meta = match fields.get("meta") {
        None | Some(Value::Null) => None,
        Some(meta @ Value::Object(_)) => Some(meta.clone()),
        Some(_) => return Err("meta must be a JSON object".into()),
    };
    let empty = Map::new();
    let options = match fields.get("options") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(options)) => options,
        Some(_) => return Err("options must be a JSON object".into()),
    };
    let queue = match options.get("queue") {
        None | Some(Value::Null) => "default".to_string(),
        Some(Value::String(queue)) if is_queue(queue) => queue.clone(),
        Some(other) => {
            return Err(format!(
                "queue {other} is not a queue name: lowercase letters, digits, - and ., starting with a letter or digit"
            )
            .into())
        }
    };
    let priority = match options.get("priority") {
        None | Some(Value::Null) => 0,
        Some(v) => match v.as_i64() {
            Some(p) if (-100..=100).contains(&p) => p as i32,
            _ => return Err(format!("priority must be a whole number from -100 to 100, got {v}").into()),
        },
    };
    let run_at = match time_option(options, "delay_until", now_ms)?.or(time_option(options, "scheduled_at", now_ms)?) {
        Some((ms, _)) if ms > now_ms => ms,
        _ => 0,
    };
    let expires_at = time_option(options, "expires_at", now_ms)?;
    for name in ["timeout_ms", "visibility_timeout_ms"] {
        if let Some(v) = options.get(name) {
            if v.as_i64().is_none_or(|ms| ms <= 0) {
                return Err(unprocessable(format!("options.{name} must be a whole number of ms above 0, got {v}")));
            }
        }
    }
    let policy = RetryPolicy::parse_new(options.get("retry")).map_err(unprocessable)?;
    let unique = options
        .get("unique")
        .map(|u| unique(u, &kind, &queue, &args, meta.as_ref()))
        .transpose()
        .map_err(unprocessable)?;
    let limit = match options.get("rate_limit") {
        None | Some(Value::Null) => None,
        Some(value) => Some(super::super::limits::parse(value).map_err(unprocessable)?),
    };

    let mut headers = std::collections::HashMap::new();
    headers.insert(TYPE.to_string(), kind);
    headers.insert(AT.to_string(), now_ms.to_string());
    if let Some(id) = &id {
        headers.insert(ID.to_string(), id.clone());
    }
    if let Some(meta) = meta {
        headers.insert(META.to_string(), meta.to_string());
    }
    // The policy the partition decides a nack by; a job without one
    // follows the engine's default, which is OJS's.
    if policy.engine != crate::core::retry::RetryPolicy::default() {
        headers.insert(crate::core::retry::RETRY_POLICY_HEADER.to_string(), policy.engine.encode());
    }
    if let Some((_, Some(key))) = &limit {
        headers.insert(crate::core::limit::LIMIT_KEY_HEADER.to_string(), key.clone());
    }
    let mut kept: Map<String, Value> = options
        .iter()
        .filter(|(k, _)| !NATIVE_OPTIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // Shown as given when it is a time, as the time it named when relative.
    if let Some((_, shown)) = &expires_at {
        kept.insert("expires_at".into(), json!(shown));
    }
    if !kept.is_empty() {
        headers.insert(OPTIONS.to_string(), Value::Object(kept).to_string());
    }
    let extra: Map<String, Value> =
        fields.iter().filter(|(k, _)| !KNOWN.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
    if !extra.is_empty() {
        headers.insert(EXTRA.to_string(), Value::Object(extra).to_string());
    }
    let request = pb::CreateJobRequest {
        r#type: queue.clone(),
        variables: json!({ "args": args }).to_string(),
        custom_headers: headers,
        retries: Some(policy.max_attempts),
        priority,
        run_at,
        idempotency_key: id.as_deref().map(id_key).unwrap_or_default(),
        ordering_key: queue,
        expires_at: expires_at.map_or(0, |(ms, _)| ms.max(1)),
        activation_timeout: ["visibility_timeout_ms", "timeout_ms"]
            .iter()
            .find_map(|name| options.get(*name).and_then(Value::as_i64))
            .unwrap_or(0)
            .min(crate::gateway::api::validate::MAX_ACTIVATION_TIMEOUT_MS),
        ..Default::default()
    };
    let limit = limit.map(|(level, key)| DeclaredLimit { per_key: key.is_some(), level });
    Ok(Enqueue { request, unique, limit })
}

/// A time option (see [`parse_time_option`]): its Unix ms, and how an
/// envelope shows it (an absolute time as given, a relative one as the
/// time it named).
fn time_option(options: &Map<String, Value>, name: &str, now_ms: i64) -> Result<Option<(i64, String)>, Invalid> {
    match options.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => match parse_time_option(text, now_ms) {
            Some(ms) if text.starts_with('+') => Ok(Some((ms, rfc3339(ms)))),
            Some(ms) => Ok(Some((ms, text.clone()))),
            None => Err(format!(
                "options.{name} {text:?} is not a time: give RFC 3339 (2026-01-01T00:00:00Z) or + and an ISO 8601 \
                 duration from now (+PT30S)"
            )
            .into()),
        },
        Some(other) => Err(format!("options.{name} must be a time string, got {other}").into()),
    }
}

fn unique(value: &Value, kind: &str, queue: &str, args: &Value, meta: Option<&Value>) -> Result<Unique, String> {
    let fields = value.as_object().ok_or("options.unique must be an object")?;
    let keys: Vec<&str> = match fields.get("keys") {
        None => vec!["type", "args", "queue"],
        Some(Value::Array(keys)) => {
            keys.iter().map(|k| k.as_str().ok_or("options.unique.keys must hold strings")).collect::<Result<_, _>>()?
        }
        Some(_) => return Err("options.unique.keys must be an array".into()),
    };
    let mut hash = crate::core::StableHash::new();
    for key in &keys {
        let part = match *key {
            "type" => kind.to_string(),
            "queue" => queue.to_string(),
            "args" => args.to_string(),
            "meta" => meta.map(Value::to_string).unwrap_or_default(),
            other => return Err(format!("options.unique.keys may name type, queue, args and meta, not {other:?}")),
        };
        hash = hash.part(key.as_bytes()).part(&(part.len() as u64).to_be_bytes()).part(part.as_bytes());
    }
    let on_conflict = match fields.get("on_conflict").and_then(Value::as_str).unwrap_or("reject") {
        "reject" => Conflict::Reject,
        "ignore" => Conflict::Ignore,
        "replace" => Conflict::Replace,
        other => return Err(format!("options.unique.on_conflict must be reject, ignore or replace, not {other:?}")),
    };
    let states = match fields.get("states") {
        None => ["available", "active", "scheduled", "retryable"].map(String::from).to_vec(),
        Some(Value::Array(states)) => states
            .iter()
            .map(|s| s.as_str().map(str::to_string).ok_or("options.unique.states must hold strings"))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err("options.unique.states must be an array".into()),
    };
    let period_ms = match fields.get("period") {
        None | Some(Value::Null) => None,
        Some(Value::String(p)) => {
            Some(parse_duration(p).ok_or_else(|| format!("options.unique.period {p:?} is not an ISO 8601 duration"))?)
        }
        Some(other) => return Err(format!("options.unique.period must be an ISO 8601 duration, got {other}")),
    };
    Ok(Unique { key: format!("ojs-unique:{queue}:{:016x}", hash.finish()), on_conflict, states, period_ms })
}

/// The OJS error a nack records as the failure's message.
pub fn error_message(error: &Map<String, Value>) -> (String, String) {
    let kind = error
        .get("type")
        .and_then(Value::as_str)
        .or_else(|| error.get("details").and_then(|d| d.get("error_class")).and_then(Value::as_str))
        .or_else(|| error.get("code").and_then(Value::as_str))
        .unwrap_or("handler_error")
        .to_string();
    let mut kept = error.clone();
    kept.entry("code").or_insert(json!("handler_error"));
    kept.entry("message").or_insert(json!(""));
    kept.insert("type".into(), json!(kind));
    (Value::Object(kept).to_string(), kind)
}

/// An ack's result as Drover keeps it: a JSON object as is, anything else
/// under [`RESULT`].
pub fn result_variables(result: Option<&Value>) -> String {
    match result {
        None | Some(Value::Null) => String::new(),
        Some(object @ Value::Object(_)) => object.to_string(),
        Some(other) => json!({ RESULT: other }).to_string(),
    }
}

pub(super) fn result_of(stored: &str) -> Value {
    match serde_json::from_str::<Value>(stored) {
        Ok(Value::Object(mut vars)) if vars.len() == 1 && vars.contains_key(RESULT) => {
            vars.remove(RESULT).unwrap_or_default()
        }
        Ok(value) => value,
        Err(_) => json!(stored),
    }
}
