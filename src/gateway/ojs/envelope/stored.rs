//! A job's OJS fields, read from what Drover keeps of it.

use serde_json::{json, Map, Value};

use super::super::ids;
use super::super::retry::RetryPolicy;
use super::super::time::rfc3339;
use super::{AT, EXTRA, ID, META, OPTIONS, TYPE};

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
    /// timeout, if it names one (in its OJS options, or as its own
    /// activation timeout, as a job made on `drover.v1` does).
    pub fn timeout_ms(&self) -> Option<i64> {
        let options = self.options();
        ["visibility_timeout_ms", "timeout_ms"]
            .iter()
            .find_map(|name| options.get(*name).and_then(Value::as_i64))
            .or_else(|| self.headers.get(crate::core::ACTIVATION_TIMEOUT_HEADER).and_then(|ms| ms.parse().ok()))
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
    pub(super) fn base(&self, key: u64, created_at: i64, variables: &str, priority: i32) -> Map<String, Value> {
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
        workflow_fields(self.headers, variables, &mut out);
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

/// Shows, on a job a workflow made, the workflow and its predecessors'
/// results, as OJS's job context names them.
fn workflow_fields(headers: &std::collections::HashMap<String, String>, variables: &str, out: &mut Map<String, Value>) {
    let Some(workflow) = headers.get(crate::core::workflow::WORKFLOW_HEADER) else { return };
    out.insert("workflow_id".into(), json!(workflow));
    if let Ok(Value::Object(mut vars)) = serde_json::from_str::<Value>(variables) {
        if let Some(results) = vars.remove(crate::core::workflow::PARENT_RESULTS) {
            out.insert("parent_results".into(), results);
        }
    }
}
