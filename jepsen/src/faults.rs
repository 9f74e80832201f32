//! What a run's faults came to, from its timeline (`nemesis.jsonl`): how
//! many of each kind were injected, which were not (a corruption skipped
//! because the plan did not settle, a membership change refused or given
//! way to none), and whether the plan settled at the
//! drain. A run whose own nemesis never fired, whose plan never settled, or
//! one of whose planned faults did not happen proves less than it says: its
//! verdict is UNKNOWN, not VALID (see `checker::Verdict`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The faults of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Tally {
    /// Injected faults by nemesis, then kind.
    pub injected: BTreeMap<String, BTreeMap<String, usize>>,
    /// Faults drawn that did not happen: `nemesis/kind: why`.
    pub not_injected: Vec<String>,
    /// The drain's `settled` event said the plan settled (`None`: no such
    /// event, a run without the membership nemesis).
    pub settled: Option<bool>,
}

impl Tally {
    /// Reads a timeline, one JSON event a line.
    pub fn of(timeline: &str) -> Tally {
        let mut tally = Tally::default();
        for event in timeline.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()) {
            match event["event"].as_str() {
                // A change whose outcome was not learned is tried again: the
                // try that learns it counts.
                Some("start") if event["detail"]["outcome"] == "unknown" => {}
                Some("start") => {
                    let nemesis = event["nemesis"].as_str().unwrap_or("?").to_string();
                    let kind = event["kind"].as_str().unwrap_or("?").to_string();
                    match why_not(&event) {
                        None => *tally.injected.entry(nemesis).or_default().entry(kind).or_default() += 1,
                        Some(why) => tally.not_injected.push(format!("{nemesis}/{kind}: {why}")),
                    }
                }
                Some("settled") => tally.settled = event["settled"].as_bool(),
                _ => {}
            }
        }
        tally
    }

    pub fn total(&self) -> usize {
        self.injected.values().flat_map(|kinds| kinds.values()).sum()
    }

    /// `partition: halves 1, ring 2; kill: one 1 (4 injected, 1 not)`.
    pub fn summary(&self) -> String {
        if self.injected.is_empty() && self.not_injected.is_empty() {
            return "none injected".into();
        }
        let by_nemesis: Vec<String> = self
            .injected
            .iter()
            .map(|(nemesis, kinds)| {
                let kinds: Vec<String> = kinds.iter().map(|(kind, n)| format!("{kind} {n}")).collect();
                format!("{nemesis}: {}", kinds.join(", "))
            })
            .collect();
        format!("{} ({} injected, {} not)", by_nemesis.join("; "), self.total(), self.not_injected.len())
    }

    /// Why the run's faults leave it UNKNOWN: each of `nemeses` (lower-case
    /// names, as the timeline has them) that never fired, every planned
    /// fault that did not happen, a plan that never settled.
    pub fn unobserved(&self, nemeses: &[String]) -> Vec<String> {
        let mut why = Vec::new();
        for nemesis in nemeses {
            if !self.injected.contains_key(nemesis) {
                why.push(format!("nemesis {nemesis} never fired"));
            }
        }
        if !self.not_injected.is_empty() {
            why.push(format!("planned faults not injected: {}", self.not_injected.join("; ")));
        }
        if self.settled == Some(false) {
            why.push("the cluster plan never settled".into());
        }
        why
    }
}

/// Why a fault drawn did not happen, if it did not.
fn why_not(event: &serde_json::Value) -> Option<String> {
    let detail = &event["detail"];
    if event["kind"] == "none" {
        return Some(event["fault"].as_str().unwrap_or("nothing done").to_string());
    }
    if detail["skipped"] == true {
        return Some("skipped".into());
    }
    match detail["outcome"].as_str() {
        Some("refused") => Some(format!("refused ({})", detail["why"].as_str().unwrap_or_default())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeline_counts_what_was_injected_and_what_was_not() {
        let timeline = [
            r#"{"event":"start","nemesis":"kill","kind":"one","fault":"SIGKILL nodes [1]","detail":{}}"#,
            r#"{"event":"heal"}"#,
            r#"{"event":"start","nemesis":"kill","kind":"one","fault":"SIGKILL nodes [2]","detail":{}}"#,
            r#"{"event":"start","nemesis":"corrupt","kind":"delete","fault":"no corruption","detail":{"skipped":true}}"#,
            r#"{"event":"start","nemesis":"membership","kind":"add","fault":"add","detail":{"outcome":"refused","why":"no"}}"#,
            r#"{"event":"start","nemesis":"membership","kind":"none","fault":"no change possible","detail":{}}"#,
            r#"{"event":"start","nemesis":"membership","kind":"add","fault":"lost","detail":{"outcome":"unknown"}}"#,
            r#"{"event":"settled","settled":false}"#,
        ]
        .join("\n");
        let tally = Tally::of(&timeline);
        assert_eq!(tally.total(), 2);
        assert_eq!(tally.summary(), "kill: one 2 (2 injected, 3 not)");
        let why = tally.unobserved(&["kill".into(), "corrupt".into(), "membership".into()]);
        assert_eq!(why.len(), 4, "{why:?}");
        assert!(why[0] == "nemesis corrupt never fired" && why[1] == "nemesis membership never fired", "{why:?}");
        assert!(why[2].contains("membership/add: refused (no)"), "{why:?}");
        assert_eq!(why[3], "the cluster plan never settled");
    }

    #[test]
    fn a_run_whose_faults_all_happened_is_fully_observed() {
        let timeline = r#"{"event":"start","nemesis":"pause","kind":"leader","fault":"SIGSTOP node 0","detail":{}}"#;
        assert!(Tally::of(timeline).unobserved(&["pause".into()]).is_empty());
        assert_eq!(Tally::of("").summary(), "none injected");
        assert_eq!(Tally::of("").unobserved(&["pause".into()]), vec!["nemesis pause never fired".to_string()]);
    }
}
