//! Which workers may take a job: the job's required and preferred labels
//! against the labels of the streams and polls that ask for work.
//!
//! A job names labels it **requires** (`region:eu-west-1`): only a taker
//! whose labels include all of them gets it. It may also **prefer** labels:
//! among the takers that satisfy its requirements, it goes to those with the
//! most of its preferred labels, then, among equals, to those on a gateway in
//! the partition leader's region. Tiers are strict: a job goes to a lower
//! tier only while no open stream of a higher tier exists, not merely while
//! those streams are busy, so a far worker never takes work a near one is
//! there for. A job no open taker may take stays activatable.
//!
//! The partition leader knows the open streams; the state machine does not.
//! So an activation carries its taker and the other open takers of the type
//! (`rivals`), and applying it is deterministic on every replica.

use serde::{Deserialize, Serialize};

/// At most this many required plus preferred labels on one job.
pub const MAX_JOB_LABELS: usize = 16;

/// A job's labels, sorted and without repeats.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Routing {
    pub required: Vec<String>,
    pub preferred: Vec<String>,
}

/// Who asks for jobs: a stream's or a poll's labels, whether its gateway is
/// in the partition leader's region, and (for rivals) its tenants.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Taker {
    /// Sorted, without repeats.
    pub labels: Vec<String>,
    pub local: bool,
    /// The tenants it serves: a rival counts only for jobs of these. Empty
    /// for an activation's own taker (its tenants are the activation's).
    pub tenants: Vec<String>,
}

impl Taker {
    pub fn new(mut labels: Vec<String>, local: bool) -> Self {
        labels.sort_unstable();
        labels.dedup();
        Taker { labels, local, tenants: Vec::new() }
    }

    /// The same taker as a rival serving `tenants`.
    pub fn serving(mut self, tenants: &[String]) -> Self {
        self.tenants = tenants.to_vec();
        self
    }

    /// The bytes it takes when encoded.
    pub fn encoded_len(&self) -> usize {
        strings_len(&self.labels) + strings_len(&self.tenants) + 1
    }

    fn has(&self, label: &str) -> bool {
        self.labels.binary_search_by(|l| l.as_str().cmp(label)).is_ok()
    }
}

impl Routing {
    pub fn new(mut required: Vec<String>, mut preferred: Vec<String>) -> Self {
        required.sort_unstable();
        required.dedup();
        preferred.sort_unstable();
        preferred.dedup();
        // A required label is met by every taker: preferring it says nothing.
        preferred.retain(|p| required.binary_search(p).is_err());
        Routing { required, preferred }
    }

    pub fn is_empty(&self) -> bool {
        self.required.is_empty() && self.preferred.is_empty()
    }

    /// The bytes it takes when encoded.
    pub fn encoded_len(&self) -> usize {
        strings_len(&self.required) + strings_len(&self.preferred)
    }

    /// Whether `taker` meets every requirement.
    pub fn allows(&self, taker: &Taker) -> bool {
        self.required.iter().all(|l| taker.has(l))
    }

    /// How well `taker` suits the job: preferred labels it has, then locality.
    fn score(&self, taker: &Taker) -> (usize, bool) {
        (self.preferred.iter().filter(|l| taker.has(l)).count(), taker.local)
    }

    /// Whether `taker` may take the job (of `tenant`) while `rivals` are open
    /// too: it meets the requirements and no rival that serves the tenant and
    /// meets them suits the job better.
    pub fn admits(&self, tenant: &str, taker: &Taker, rivals: &[Taker]) -> bool {
        if !self.allows(taker) {
            return false;
        }
        let mine = self.score(taker);
        !rivals.iter().any(|r| r.tenants.iter().any(|t| t == tenant) && self.allows(r) && self.score(r) > mine)
    }

    /// The labels as metrics and people read them: `+region:a ~pool:gpu`.
    pub fn describe(&self) -> String {
        let required = self.required.iter().map(|l| format!("+{l}"));
        let preferred = self.preferred.iter().map(|l| format!("~{l}"));
        required.chain(preferred).collect::<Vec<_>>().join(" ")
    }
}

/// A list of strings as bincode writes it: a length, then each string with its own.
fn strings_len(list: &[String]) -> usize {
    8 + list.iter().map(|s| 8 + s.len()).sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "t";

    fn taker(labels: &[&str], local: bool) -> Taker {
        Taker::new(labels.iter().map(|l| l.to_string()).collect(), local).serving(&[T.to_string()])
    }

    fn routing(required: &[&str], preferred: &[&str]) -> Routing {
        let owned = |ls: &[&str]| ls.iter().map(|l| l.to_string()).collect();
        Routing::new(owned(required), owned(preferred))
    }

    #[test]
    fn a_required_label_is_never_waived() {
        let job = routing(&["region:b"], &[]);
        let a = taker(&["region:a"], true);
        assert!(!job.admits(T, &a, &[]), "no rival, still not allowed");
        assert!(job.admits(T, &taker(&["region:b", "pool:gpu"], false), std::slice::from_ref(&a)));
    }

    #[test]
    fn a_preferred_taker_wins_while_it_is_open() {
        let job = routing(&[], &["region:b"]);
        let (a, b) = (taker(&["region:a"], true), taker(&["region:b"], false));
        assert!(job.admits(T, &b, std::slice::from_ref(&a)));
        assert!(!job.admits(T, &a, std::slice::from_ref(&b)), "a worse tier while a better one is open");
        assert!(job.admits(T, &a, &[]), "the next tier once the better one is gone");
    }

    #[test]
    fn among_equals_the_leader_s_region_wins() {
        let job = Routing::default();
        let (near, far) = (taker(&["region:a"], true), taker(&["region:b"], false));
        assert!(job.admits(T, &near, std::slice::from_ref(&far)));
        assert!(!job.admits(T, &far, std::slice::from_ref(&near)));
        assert!(job.admits(T, &far, std::slice::from_ref(&far)), "an equal rival does not stop it");
        // Labels count before locality.
        let prefers_b = routing(&[], &["region:b"]);
        assert!(prefers_b.admits(T, &far, std::slice::from_ref(&near)));
    }

    #[test]
    fn a_rival_that_cannot_take_the_job_does_not_count() {
        let job = routing(&["pool:gpu"], &["region:a"]);
        let gpu_far = taker(&["pool:gpu", "region:b"], false);
        let cpu_near = taker(&["region:a"], true);
        assert!(job.admits(T, &gpu_far, std::slice::from_ref(&cpu_near)));
        // Nor one that serves other tenants.
        let near_other_tenant = Taker::new(vec!["pool:gpu".into(), "region:a".into()], true).serving(&["u".into()]);
        assert!(job.admits(T, &gpu_far, &[near_other_tenant]));
    }

    #[test]
    fn labels_are_kept_sorted_and_once() {
        let job = routing(&["b", "a", "a"], &["a", "c", "c"]);
        assert_eq!(job.required, vec!["a", "b"]);
        assert_eq!(job.preferred, vec!["c"], "a required label is not also preferred");
        assert_eq!(job.describe(), "+a +b ~c");
        assert!(Routing::default().is_empty());
    }
}
