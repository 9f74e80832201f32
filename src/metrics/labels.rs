//! Bounds on metric labels whose values clients choose.
//!
//! A Prometheus series lives as long as the process, so a label that takes any
//! value a client sends (a job type) would grow memory and every scrape without
//! bound. The first [`MAX_JOB_TYPE_LABELS`] job types this process counts keep
//! a `type` label of their own; later ones are counted together under
//! `type="other"`. The set is per process, like the recorder: one node in
//! production, every in-process node in a test.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

/// Job types that get a `type` label of their own, per process.
pub const MAX_JOB_TYPE_LABELS: usize = 1000;

/// The label value under which job types beyond the limit are counted.
pub const OTHER_JOB_TYPES: &str = "other";

static JOB_TYPES: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();

/// The `type` label value for `job_type`: itself while there is room, else
/// [`OTHER_JOB_TYPES`].
pub fn job_type_label(job_type: String) -> String {
    let mut known = JOB_TYPES.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if known.contains(&job_type) {
        return job_type;
    }
    if known.len() < MAX_JOB_TYPE_LABELS {
        known.insert(job_type.clone());
        return job_type;
    }
    OTHER_JOB_TYPES.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_types_beyond_the_limit_share_one_label() {
        // The set is process-wide: other tests may have used some room already.
        let own: Vec<String> = (0..=MAX_JOB_TYPE_LABELS).map(|i| format!("labels-test-{i}")).collect();
        let labels: Vec<String> = own.iter().map(|t| job_type_label(t.clone())).collect();
        assert!(labels.iter().any(|l| l == OTHER_JOB_TYPES), "{} types and none counted as other", own.len());
        for (job_type, label) in own.iter().zip(&labels) {
            assert!(label == job_type || label == OTHER_JOB_TYPES);
            assert_eq!(&job_type_label(job_type.clone()), label, "a type keeps the label it got first");
        }
    }
}
