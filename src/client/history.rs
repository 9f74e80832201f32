//! A job's history in words: what the CLI's timeline and the console's job
//! page say for each event.

use crate::proto::gateway::JobEvent;

/// What happened, as a sentence fragment. `start` is the first event's time,
/// so deadlines read relative to it.
pub fn describe_event(e: &JobEvent, start: i64) -> String {
    match e.kind.as_str() {
        "created" => {
            let by = if e.user.is_empty() { String::new() } else { format!(" by {}", e.user) };
            let through =
                if e.gateway_node_id == 0 { String::new() } else { format!(" through node {}", e.gateway_node_id) };
            let key = if e.idempotency_key.is_empty() {
                String::new()
            } else {
                format!(" (idempotency key {:?})", e.idempotency_key)
            };
            format!("created{by}{through}{key}")
        }
        "activated" => {
            let session = if e.session_id == 0 { String::new() } else { format!(" session {:x}", e.session_id) };
            let via = match e.via.as_str() {
                "push" => format!(", pushed to stream {:x} on node {}", e.stream_id, e.gateway_node_id),
                "poll" => format!(", polled through node {}", e.gateway_node_id),
                _ => String::new(),
            };
            format!("activated (attempt {}) by {}{session}{via}", e.attempt, e.worker)
        }
        "extended" => format!(
            "deadline extended {}x (attempt {}), to {:+.3}s",
            e.count,
            e.attempt,
            (e.deadline - start) as f64 / 1000.0
        ),
        "failed" => format!(
            "failed (attempt {}, {}): {}; {} retries left, back-off {} ms",
            e.attempt, e.reason, e.message, e.retries, e.back_off
        ),
        "retries_updated" => {
            let by = if e.user.is_empty() { String::new() } else { format!(" by {}", e.user) };
            format!("retries set to {}{by}", e.retries)
        }
        "cancelled" if !e.user.is_empty() => format!("cancelled by {}", e.user),
        "checkpointed" => format!("stage {} committed (attempt {})", e.stage, e.attempt),
        "expired" => format!("expired unrun: not activated by {:+.3}s", (e.deadline - start) as f64 / 1000.0),
        "yielded" => {
            let by = if e.gateway_node_id == 0 { String::new() } else { format!(" by node {}", e.gateway_node_id) };
            let why = if e.reason.is_empty() { String::new() } else { format!(": {}", e.reason) };
            format!("yielded (attempt {}){by}{why}", e.attempt)
        }
        "timed_out" | "completed" => format!("{} (attempt {})", e.kind.replace('_', " "), e.attempt),
        other => other.replace('_', " "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_read_as_sentences() {
        let failed = JobEvent {
            at: 2_000,
            kind: "failed".into(),
            attempt: 1,
            reason: "failed".into(),
            message: "card declined".into(),
            retries: 0,
            back_off: 0,
            ..Default::default()
        };
        assert_eq!(
            describe_event(&failed, 1_000),
            "failed (attempt 1, failed): card declined; 0 retries left, back-off 0 ms"
        );
        let extended =
            JobEvent { kind: "extended".into(), attempt: 2, count: 3, deadline: 31_500, ..Default::default() };
        assert_eq!(describe_event(&extended, 1_500), "deadline extended 3x (attempt 2), to +30.000s");
        let timed_out = JobEvent { kind: "timed_out".into(), attempt: 2, ..Default::default() };
        assert_eq!(describe_event(&timed_out, 0), "timed out (attempt 2)");
    }
}
