//! The OJS job envelope: an enqueue request checked and translated into
//! Drover's create ([`parse`]), the OJS fields Drover keeps of a job
//! ([`stored`]), and a Drover job shown as an envelope ([`render`]).
//!
//! The mapping (docs/ojs.md): OJS's queue is the job type workers take
//! jobs by; `args` are the variable `args`; OJS's own `type`, `meta`, the
//! `options` Drover has no field for, and unknown top-level attributes
//! travel as `ojs.*` custom headers, so a job made here is an ordinary job
//! on drover.v1, the CLI and the console, and a job made there is shown here
//! (its queue and type both its job type, its variables the one argument).

mod parse;
mod render;
mod stored;

pub use parse::{enqueue, error_message, result_variables, Conflict, Enqueue, Invalid, Unique};
pub use render::{activated, job};
pub use stored::Stored;

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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::parse::result_of;
    use super::*;
    use crate::gateway::ojs::ids;
    use crate::proto::gateway as pb;

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
        assert_eq!(request.activation_timeout, 300_000, "the job's timeout_ms holds each of its activations");
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
