//! The OJS job envelope: an enqueue request checked and translated into
//! Drover's create, and a Drover job shown as an envelope.
//!
//! The mapping (docs/ojs.md): OJS's queue is the job type workers take
//! jobs by; `args` are the variable `args`; OJS's own `type`, `meta`, the
//! `options` Drover has no field for, and unknown top-level attributes
//! travel as `ojs.*` custom headers, so a job made here is an ordinary job
//! on drover.v1, the CLI and the console, and a job made there is shown here
//! (its queue and type both its job type, its variables the one argument).

use serde_json::{json, Map, Value};

use super::ids;
use super::retry::RetryPolicy;
use super::time::{parse_duration, parse_time_option, rfc3339};
use crate::proto::gateway as pb;

/// OJS's `type` of the job.
pub const TYPE: &str = "ojs.type";
/// The create's gateway time (ms), the time part of a server-made id.
pub const AT: &str = "ojs.at";
/// A client's own id.
pub const ID: &str = "ojs.id";
pub const META: &str = "ojs.meta";
/// `options` as given, less those Drover keeps natively (queue, priority,
/// delay_until).
pub const OPTIONS: &str = "ojs.options";
/// Top-level attributes OJS does not define, kept and shown again.
pub const EXTRA: &str = "ojs.extra";
/// A result that is not a JSON object is kept under this variable.
const RESULT: &str = "ojs.result";

/// The fields of the envelope the server owns or reads itself.
const KNOWN: [&str; 5] = ["type", "args", "id", "meta", "options"];
const NATIVE_OPTIONS: [&str; 4] = ["queue", "priority", "delay_until", "scheduled_at"];

/// The idempotency key a client's id is kept under.
pub fn id_key(id: &str) -> String {
    format!("ojs-id:{id}")
}

/// An enqueue, checked.
#[derive(Debug)]
pub struct Enqueue {
    pub request: pb::CreateJobRequest,
    pub unique: Option<Unique>,
    /// `options.rate_limit`: the limit the job declares for its queue.
    pub limit: Option<DeclaredLimit>,
}

/// `options.rate_limit`: a level of the queue's limit, the queue's own or,
/// with a key, each key's (the job carries its key as `drover.limit_key`).
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredLimit {
    pub per_key: bool,
    pub level: pb::LimitLevel,
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

/// Whether `name` is an OJS job type: dot-separated lowercase words, each
/// starting with a letter. Words may hold `-` (the conformance suite's own
/// types do, though the envelope's pattern leaves it out).
fn is_type(name: &str) -> bool {
    name.len() <= 255
        && name.split('.').all(|word| {
            let mut chars = word.chars();
            chars.next().is_some_and(|c| c.is_ascii_lowercase())
                && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
        })
}

/// Whether `name` is an OJS queue name.
pub fn is_queue(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.len() <= 255
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
    let policy = RetryPolicy::parse(options.get("retry")).map_err(unprocessable)?;
    let unique = options
        .get("unique")
        .map(|u| unique(u, &kind, &queue, &args, meta.as_ref()))
        .transpose()
        .map_err(unprocessable)?;
    let limit = match options.get("rate_limit") {
        None | Some(Value::Null) => None,
        Some(value) => Some(super::limits::parse(value).map_err(unprocessable)?),
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

/// A job's OJS fields, read from what Drover keeps of it.
pub struct Stored<'a> {
    headers: &'a std::collections::HashMap<String, String>,
    job_type: &'a str,
}

impl<'a> Stored<'a> {
    pub fn of(job_type: &'a str, headers: &'a std::collections::HashMap<String, String>) -> Self {
        Stored { headers, job_type }
    }

    fn json(&self, name: &str) -> Option<Value> {
        self.headers.get(name).and_then(|text| serde_json::from_str(text).ok())
    }

    pub fn is_ojs(&self) -> bool {
        self.headers.contains_key(TYPE)
    }

    /// OJS's type of the job: the one it was enqueued with, its job type
    /// for a job made elsewhere.
    pub fn kind(&self) -> &str {
        self.headers.get(TYPE).map_or(self.job_type, String::as_str)
    }

    /// The job's `args`: the variable `args` of a job made here, its
    /// variables as the one argument of a job made elsewhere.
    pub fn args(&self, variables: &str) -> Value {
        match serde_json::from_str::<Value>(variables) {
            Ok(Value::Object(mut vars)) if self.is_ojs() => vars.remove("args").unwrap_or(json!([])),
            Ok(vars) => json!([vars]),
            Err(_) => json!([]),
        }
    }

    pub fn meta(&self) -> Option<Value> {
        self.json(META)
    }

    pub fn options(&self) -> Map<String, Value> {
        match self.json(OPTIONS) {
            Some(Value::Object(options)) => options,
            _ => Map::new(),
        }
    }

    /// The job's retry policy (the default for jobs made elsewhere).
    pub fn policy(&self) -> RetryPolicy {
        RetryPolicy::parse(self.options().get("retry")).unwrap_or_default()
    }

    /// How long an activation lasts: the job's visibility or execution
    /// timeout, if it names one.
    pub fn timeout_ms(&self) -> Option<i64> {
        let options = self.options();
        ["visibility_timeout_ms", "timeout_ms"].iter().find_map(|name| options.get(*name).and_then(Value::as_i64))
    }

    pub fn id(&self, key: u64, created_at: i64) -> String {
        if let Some(id) = self.headers.get(ID) {
            return id.clone();
        }
        let at = self.headers.get(AT).and_then(|at| at.parse().ok()).unwrap_or(created_at);
        ids::job_id(crate::core::JobKey(key), at)
    }

    /// When the job was made: for a job made here, the time its gateway
    /// took the enqueue (the time in its id), so every answer agrees with
    /// the one the enqueue gave.
    fn created_at(&self, stored: i64) -> i64 {
        self.headers.get(AT).and_then(|at| at.parse().ok()).unwrap_or(stored)
    }

    /// The fields every envelope has, whatever the job's state.
    fn base(&self, key: u64, created_at: i64, variables: &str, priority: i32) -> Map<String, Value> {
        let created_at = self.created_at(created_at);
        let mut out = Map::new();
        if let Some(Value::Object(extra)) = self.json(EXTRA) {
            out.extend(extra);
        }
        let args = self.args(variables);
        let options = self.options();
        out.insert("specversion".into(), json!("1.0"));
        out.insert("id".into(), json!(self.id(key, created_at)));
        out.insert("type".into(), json!(self.kind()));
        out.insert("queue".into(), json!(self.job_type));
        out.insert("args".into(), args);
        let mut meta = self.meta();
        // A job a cron schedule made names it and its tick (OJS's cron
        // correlation keys).
        if let Some(schedule) = self.headers.get(crate::core::schedule::SCHEDULE_HEADER) {
            let tick = self.headers.get(crate::core::schedule::TICK_HEADER).and_then(|t| t.parse::<i64>().ok());
            let meta = meta.get_or_insert_with(|| json!({}));
            if let Some(meta) = meta.as_object_mut() {
                meta.insert("cron_name".into(), json!(schedule));
                if let Some(tick) = tick {
                    meta.insert("cron_triggered_at".into(), json!(rfc3339(tick)));
                }
            }
        }
        if let Some(meta) = meta {
            out.insert("meta".into(), meta);
        }
        super::workflows::workflow_fields(self.headers, variables, &mut out);
        out.insert("priority".into(), json!(priority));
        for name in ["timeout_ms", "visibility_timeout_ms", "tags", "unique", "expires_at"] {
            if let Some(value) = options.get(name) {
                out.insert(name.into(), value.clone());
            }
        }
        out.insert("retry".into(), self.policy().to_json());
        out.insert("created_at".into(), json!(rfc3339(created_at)));
        out.insert("enqueued_at".into(), json!(rfc3339(created_at)));
        out.insert("drover".into(), json!({ "key": key.to_string() }));
        out
    }
}

/// OJS's state of a Drover job in `state` after `attempt` activations.
pub fn state(state: &str, attempt: u32) -> &'static str {
    match state {
        "scheduled" if attempt > 0 => "retryable",
        "scheduled" => "scheduled",
        "activatable" => "available",
        "activated" => "active",
        "completed" => "completed",
        "incident" | "expired" => "discarded",
        "cancelled" => "cancelled",
        _ => "unknown",
    }
}

/// An error as OJS shows it, from what a failure recorded: the OJS error
/// object a worker sent through this binding, or a Drover failure message.
fn error_of(message: &str, attempt: u32, at: Option<i64>) -> Value {
    let mut error = match serde_json::from_str::<Value>(message) {
        Ok(Value::Object(error)) if error.contains_key("code") => error,
        _ => {
            let mut error = Map::new();
            error.insert("code".into(), json!("handler_error"));
            error.insert("type".into(), json!("handler_error"));
            error.insert("message".into(), json!(message));
            error
        }
    };
    error.insert("attempt".into(), json!(attempt));
    if let Some(at) = at {
        error.insert("occurred_at".into(), json!(rfc3339(at)));
    }
    Value::Object(error)
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

/// A job read with GetJob (its history, when read with it, gives the
/// times and the errors).
pub fn job(job: &pb::Job) -> Value {
    let stored = Stored::of(&job.r#type, &job.custom_headers);
    let mut out = stored.base(job.key, job.created_at, &job.variables, job.priority);
    let state = state(&job.state, job.attempt);
    out.insert("state".into(), json!(state));
    out.insert("attempt".into(), json!(job.attempt));
    let max_attempts = if stored.is_ojs() { stored.policy().max_attempts } else { job.attempt as i32 + job.retries };
    out.insert("max_attempts".into(), json!(max_attempts));
    if job.state == "scheduled" {
        out.insert("scheduled_at".into(), json!(rfc3339(job.due_at)));
    }
    let mut errors = Vec::new();
    for event in &job.history {
        let at = rfc3339(event.at);
        match event.kind.as_str() {
            "activated" => {
                out.insert("started_at".into(), json!(at));
            }
            "completed" => {
                out.insert("completed_at".into(), json!(at));
            }
            "incident" => {
                out.insert("completed_at".into(), json!(at));
                out.insert("discarded_at".into(), json!(at));
            }
            "cancelled" => {
                out.insert("cancelled_at".into(), json!(at));
            }
            "expired" => {
                out.insert("discarded_at".into(), json!(at));
                out.insert("expired_at".into(), json!(at));
            }
            "failed" => errors.push(error_of(&event.message, event.attempt, Some(event.at))),
            "timed_out" => errors.push(json!({
                "code": "timeout", "type": "timeout", "attempt": event.attempt, "occurred_at": at,
                "message": format!("attempt {} was neither acknowledged nor failed before its timeout", event.attempt),
            })),
            _ => {}
        }
    }
    if !matches!(state, "completed" | "cancelled") {
        if let Some(last) = errors.last() {
            out.insert("error".into(), last.clone());
        } else if !job.error_message.is_empty() {
            out.insert("error".into(), error_of(&job.error_message, job.attempt, None));
        }
    }
    if !job.history.is_empty() || !errors.is_empty() {
        out.insert("errors".into(), Value::Array(errors));
    }
    if job.state == "completed" && !job.result.is_empty() {
        out.insert("result".into(), result_of(&job.result));
    }
    Value::Object(out)
}

/// A job a fetch activated.
pub fn activated(job: &pb::ActivatedJob, now_ms: i64) -> Value {
    let stored = Stored::of(&job.r#type, &job.custom_headers);
    let mut out = stored.base(job.key, job.created_at, &job.variables, job.priority);
    out.insert("state".into(), json!("active"));
    out.insert("attempt".into(), json!(job.attempt));
    let max_attempts = if stored.is_ojs() { stored.policy().max_attempts } else { job.attempt as i32 + job.retries };
    out.insert("max_attempts".into(), json!(max_attempts));
    out.insert("started_at".into(), json!(rfc3339(now_ms)));
    out.insert("deadline".into(), json!(rfc3339(job.deadline)));
    if stored.is_ojs() && job.attempt > 1 {
        // The wait the policy gave before this attempt, without jitter.
        out.insert("retry_delay_ms".into(), json!(stored.policy().delay_ms(job.attempt - 1, 0.5)));
    }
    Value::Object(out)
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

fn result_of(stored: &str) -> Value {
    match serde_json::from_str::<Value>(stored) {
        Ok(Value::Object(mut vars)) if vars.len() == 1 && vars.contains_key(RESULT) => {
            vars.remove(RESULT).unwrap_or_default()
        }
        Ok(value) => value,
        Err(_) => json!(stored),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_spec_patterns() {
        assert!(is_type("email.send") && is_type("a1_b.c") && is_type("x"));
        assert!(is_type("dlq.test.list-first"));
        for bad in ["Email.Send", "email send", "1email.send", "", "email@send!", "a..b", "a.", "-a"] {
            assert!(!is_type(bad), "{bad}");
        }
        assert!(is_queue("default") && is_queue("0-a.b") && is_queue("conformance-events-test"));
        for bad in ["Default", "my_queue!", "-invalid", "my queue", ""] {
            assert!(!is_queue(bad), "{bad}");
        }
    }

    #[test]
    fn an_enqueue_becomes_a_create_on_the_queue_and_reads_back_the_same() {
        let body = json!({
            "type": "report.generate", "args": [42, {"k": true}], "meta": {"trace_id": "t"},
            "options": {"queue": "reports", "priority": 10, "timeout_ms": 300000, "retry": {"max_attempts": 5}},
            "x_custom": "kept",
        });
        let enqueue = enqueue(&body, 1_000).expect("valid");
        let request = &enqueue.request;
        assert_eq!((request.r#type.as_str(), request.ordering_key.as_str()), ("reports", "reports"));
        assert_eq!((request.retries, request.priority), (Some(5), 10));
        let job = pb::Job {
            key: 77,
            r#type: request.r#type.clone(),
            variables: request.variables.clone(),
            custom_headers: request.custom_headers.clone(),
            priority: request.priority,
            state: "activatable".into(),
            created_at: 1_005,
            retries: 5,
            ..Default::default()
        };
        let shown = super::job(&job);
        assert_eq!(shown["type"], "report.generate");
        assert_eq!(shown["queue"], "reports");
        assert_eq!(shown["args"], json!([42, {"k": true}]));
        assert_eq!(shown["meta"]["trace_id"], "t");
        assert_eq!(shown["x_custom"], "kept");
        assert_eq!((shown["state"].as_str(), shown["max_attempts"].as_i64()), (Some("available"), Some(5)));
        assert_eq!(shown["id"], ids::job_id(crate::core::JobKey(77), 1_000));
    }

    #[test]
    fn a_job_made_elsewhere_shows_its_variables_as_its_one_argument() {
        let job = pb::Job {
            key: 5,
            r#type: "payment".into(),
            variables: r#"{"amount":3}"#.into(),
            state: "incident".into(),
            attempt: 2,
            error_message: "card declined".into(),
            ..Default::default()
        };
        let shown = super::job(&job);
        assert_eq!((shown["type"].as_str(), shown["queue"].as_str()), (Some("payment"), Some("payment")));
        assert_eq!(shown["args"], json!([{"amount": 3}]));
        assert_eq!(shown["state"], "discarded");
        assert_eq!(shown["error"]["message"], "card declined");
    }

    #[test]
    fn bad_envelopes_are_refused_with_a_reason() {
        for (body, words) in [
            (json!({"args": []}), "type is required"),
            (json!({"type": "a", "args": {}}), "args must be"),
            (json!({"type": "a"}), "args is required"),
            (json!({"type": "a", "args": [], "options": {"priority": 101}}), "priority"),
            (json!({"type": "a", "args": [], "options": {"queue": "Q"}}), "queue"),
            (json!({"type": "a", "args": [], "id": "nope"}), "UUIDv7"),
            (json!({"type": "a", "args": [], "options": {"retry": {"backoff_coefficient": 0.5}}}), "coefficient"),
            (json!([1]), "JSON object"),
        ] {
            let error = enqueue(&body, 0).expect_err("refused").message;
            assert!(error.contains(words), "{error}");
        }
    }

    #[test]
    fn a_result_that_is_not_an_object_reads_back_as_given() {
        for value in [json!({"a": 1}), json!([1, 2]), json!("done"), json!(3)] {
            assert_eq!(result_of(&result_variables(Some(&value))), value);
        }
    }
}
