//! Checks a history against Drover's promises, in the style of Jepsen's
//! `total-queue` with the stricter rules Drover needs:
//!
//! - **lost**: an acknowledged create whose job never completed and is not
//!   an incident after the final drain (missing, or left unfinished);
//! - **unexpected**: a completion of a job that was never created;
//! - **duplicated**: two accepted completions of one job (one key);
//! - **stale**: a completion accepted for an attempt that had already been
//!   superseded: a newer activation of the job had been returned to a client
//!   before the completion was invoked;
//! - **recovered** (reported, not a violation): a create with an unknown or
//!   failed outcome whose job exists after all;
//! - **created twice** (reported, not a violation): one create made two jobs,
//!   because a gateway retried it after its answer was lost; creates are at
//!   least once until idempotency keys exist (see `docs/workers.md`);
//! - **divergent**: after healing, a node's replica misses an acknowledged job
//!   or holds it in another final state than the other replicas.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::history::{FinalReads, Kind, Op, Phase};

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Report {
    pub attempted: usize,
    pub acknowledged: usize,
    pub completed: usize,
    pub incidents: usize,
    pub lost: Vec<u64>,
    pub unexpected: Vec<u64>,
    pub duplicated: Vec<u64>,
    pub stale: Vec<u64>,
    pub recovered: Vec<u64>,
    pub created_twice: Vec<u64>,
    pub divergent: Vec<u64>,
    pub valid: bool,
}

impl Report {
    pub fn summary(&self) -> String {
        format!(
            "{}: {} attempted, {} acknowledged, {} completed, {} incidents; lost {}, unexpected {}, duplicated {}, \
             stale {}, divergent {}, recovered {}, created twice {}",
            if self.valid { "VALID" } else { "INVALID" },
            self.attempted,
            self.acknowledged,
            self.completed,
            self.incidents,
            self.lost.len(),
            self.unexpected.len(),
            self.duplicated.len(),
            self.stale.len(),
            self.divergent.len(),
            self.recovered.len(),
            self.created_twice.len()
        )
    }
}

/// `replicas(key)` names the nodes that hold the job's partition.
pub fn check(history: &[Op], finals: &FinalReads, replicas: impl Fn(u64) -> Vec<usize>) -> Report {
    let mut report = Report::default();
    let attempted: BTreeSet<u64> =
        history.iter().filter(|o| o.kind == Kind::Create && o.phase == Phase::Invoke).map(|o| o.id).collect();
    let acknowledged: BTreeMap<u64, u64> = history
        .iter()
        .filter(|o| o.kind == Kind::Create && o.phase == Phase::Ok)
        .filter_map(|o| o.key.map(|k| (o.id, k)))
        .collect();
    report.attempted = attempted.len();
    report.acknowledged = acknowledged.len();

    // The final state of each job (by key), and the jobs each id became.
    let mut final_state: BTreeMap<u64, String> = BTreeMap::new();
    let mut keys_of_id: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    for jobs in finals.values() {
        for (key, job) in jobs {
            keys_of_id.entry(job.id).or_default().insert(*key);
            final_state.entry(*key).or_insert_with(|| job.state.clone());
            if job.state == "completed" {
                final_state.insert(*key, job.state.clone());
            }
        }
    }
    let id_of_key: BTreeMap<u64, u64> =
        keys_of_id.iter().flat_map(|(id, keys)| keys.iter().map(move |k| (*k, *id))).collect();

    // Accepted completions, per job key.
    let mut completions: BTreeMap<u64, Vec<&Op>> = BTreeMap::new();
    for op in history.iter().filter(|o| o.kind == Kind::Complete && o.phase == Phase::Ok) {
        if let Some(key) = op.key {
            completions.entry(key).or_default().push(op);
            keys_of_id.entry(op.id).or_default().insert(key);
        }
    }
    for (key, ops) in &completions {
        let id = ops[0].id;
        if !attempted.contains(&id) && !report.unexpected.contains(&id) {
            report.unexpected.push(id);
        }
        if ops.len() > 1 {
            report.duplicated.push(*key);
        }
    }
    for (key, state) in &final_state {
        let id = id_of_key[key];
        if state == "completed" && !attempted.contains(&id) && !report.unexpected.contains(&id) {
            report.unexpected.push(id);
        }
    }
    report.created_twice = keys_of_id.iter().filter(|(_, keys)| keys.len() > 1).map(|(id, _)| *id).collect();

    // Stale: an accepted completion whose attempt was superseded by an
    // activation returned before the completion was invoked.
    let mut invoked_at: BTreeMap<(u64, u64, u32), u64> = BTreeMap::new();
    for op in history.iter().filter(|o| o.kind == Kind::Complete && o.phase == Phase::Invoke) {
        invoked_at.insert((op.process, op.id, op.attempt), op.time_ms);
    }
    for (key, ops) in &completions {
        for done in ops {
            let Some(&started) = invoked_at.get(&(done.process, done.id, done.attempt)) else { continue };
            let superseded = history.iter().any(|o| {
                o.kind == Kind::Activate
                    && o.phase == Phase::Ok
                    && o.key == Some(*key)
                    && o.attempt > done.attempt
                    && o.time_ms < started
            });
            if superseded && !report.stale.contains(key) {
                report.stale.push(*key);
            }
        }
    }

    for (id, key) in &acknowledged {
        let completed = completions.contains_key(key) || final_state.get(key).is_some_and(|s| s == "completed");
        let incident = final_state.get(key).is_some_and(|s| s == "incident");
        if completed {
            report.completed += 1;
        } else if incident {
            report.incidents += 1;
        } else {
            report.lost.push(*id);
        }
        // Divergence: every replica of the partition must hold the job, and in
        // the same final state.
        let states: Vec<Option<&str>> = replicas(*key)
            .into_iter()
            .filter_map(|node| finals.get(&node).map(|jobs| jobs.get(key).map(|j| j.state.as_str())))
            .collect();
        let first = states.first().copied().flatten();
        if states.iter().any(|s| s.is_none() || *s != first) {
            report.divergent.push(*id);
        }
    }
    for id in &attempted {
        if !acknowledged.contains_key(id) && keys_of_id.contains_key(id) {
            report.recovered.push(*id);
        }
    }
    report.valid = report.lost.is_empty()
        && report.unexpected.is_empty()
        && report.duplicated.is_empty()
        && report.stale.is_empty()
        && report.divergent.is_empty();
    report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::FinalJob;

    fn op(time_ms: u64, process: u64, kind: Kind, phase: Phase, id: u64, key: Option<u64>, attempt: u32) -> Op {
        Op { time_ms, process, node: 0, kind, phase, id, key, attempt }
    }

    fn created(id: u64, key: u64, t: u64) -> Vec<Op> {
        vec![
            op(t, 1, Kind::Create, Phase::Invoke, id, None, 0),
            op(t + 1, 1, Kind::Create, Phase::Ok, id, Some(key), 0),
        ]
    }

    fn completed(id: u64, key: u64, attempt: u32, t: u64, process: u64) -> Vec<Op> {
        vec![
            op(t, process, Kind::Complete, Phase::Invoke, id, Some(key), attempt),
            op(t + 1, process, Kind::Complete, Phase::Ok, id, Some(key), attempt),
        ]
    }

    fn finals(nodes: &[usize], jobs: &[(u64, u64, &str)]) -> FinalReads {
        nodes
            .iter()
            .map(|n| (*n, jobs.iter().map(|(id, key, s)| (*key, FinalJob { id: *id, state: s.to_string() })).collect()))
            .collect()
    }

    fn all_nodes(_: u64) -> Vec<usize> {
        vec![0, 1, 2]
    }

    #[test]
    fn a_clean_history_is_valid() {
        let mut h = created(1, 101, 0);
        h.extend(completed(1, 101, 1, 10, 2));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
        assert!(r.valid, "{r:?}");
        assert_eq!(r.completed, 1);
    }

    #[test]
    fn a_lost_job_is_reported() {
        let mut h = created(1, 101, 0);
        h.extend(created(2, 102, 5));
        h.extend(completed(1, 101, 1, 10, 2));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
        assert!(!r.valid);
        assert_eq!(r.lost, vec![2]);
    }

    #[test]
    fn an_unfinished_job_after_the_drain_counts_as_lost() {
        let h = created(1, 101, 0);
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "activatable")]), all_nodes);
        assert_eq!(r.lost, vec![1]);
    }

    #[test]
    fn an_incident_is_not_lost() {
        let h = created(1, 101, 0);
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "incident")]), all_nodes);
        assert!(r.valid, "{r:?}");
        assert_eq!(r.incidents, 1);
    }

    #[test]
    fn an_unexpected_job_is_reported() {
        let mut h = created(1, 101, 0);
        h.extend(completed(1, 101, 1, 10, 2));
        h.extend(completed(9, 109, 1, 12, 2));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed"), (9, 109, "completed")]), all_nodes);
        assert!(!r.valid);
        assert_eq!(r.unexpected, vec![9]);
    }

    #[test]
    fn a_duplicate_completion_is_reported() {
        let mut h = created(1, 101, 0);
        h.extend(completed(1, 101, 1, 10, 2));
        h.extend(completed(1, 101, 2, 20, 3));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
        assert!(!r.valid);
        assert_eq!(r.duplicated, vec![101]);
    }

    #[test]
    fn one_create_that_made_two_jobs_is_reported_but_valid() {
        // The gateway retried a create whose answer was lost: two jobs, one id,
        // each completed once.
        let mut h = created(1, 102, 0);
        h.extend(completed(1, 101, 1, 10, 2));
        h.extend(completed(1, 102, 1, 12, 3));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed"), (1, 102, "completed")]), all_nodes);
        assert!(r.valid, "{r:?}");
        assert!(r.duplicated.is_empty());
        assert_eq!(r.created_twice, vec![1]);
    }

    #[test]
    fn a_stale_completion_is_reported() {
        let mut h = created(1, 101, 0);
        // Attempt 1 goes to process 2, times out; attempt 2 goes to process 3.
        h.push(op(5, 2, Kind::Activate, Phase::Ok, 1, Some(101), 1));
        h.push(op(50, 3, Kind::Activate, Phase::Ok, 1, Some(101), 2));
        // Process 2 completes attempt 1 after attempt 2 was handed out, and it is accepted.
        h.extend(completed(1, 101, 1, 60, 2));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
        assert!(!r.valid);
        assert_eq!(r.stale, vec![101]);
    }

    #[test]
    fn a_completion_invoked_before_the_newer_activation_is_not_stale() {
        let mut h = created(1, 101, 0);
        h.push(op(5, 2, Kind::Activate, Phase::Ok, 1, Some(101), 1));
        h.push(op(40, 2, Kind::Complete, Phase::Invoke, 1, Some(101), 1));
        h.push(op(50, 3, Kind::Activate, Phase::Ok, 1, Some(101), 2));
        h.push(op(60, 2, Kind::Complete, Phase::Ok, 1, Some(101), 1));
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
        assert!(r.stale.is_empty(), "{r:?}");
    }

    #[test]
    fn a_divergent_node_is_reported() {
        let mut h = created(1, 101, 0);
        h.extend(completed(1, 101, 1, 10, 2));
        let mut f = finals(&[0, 1], &[(1, 101, "completed")]);
        f.insert(2, BTreeMap::new()); // node 2 answered but lacks the job
        let r = check(&h, &f, all_nodes);
        assert!(!r.valid);
        assert_eq!(r.divergent, vec![1]);
        let mut f = finals(&[0, 1], &[(1, 101, "completed")]);
        f.insert(2, [(101, FinalJob { id: 1, state: "activatable".into() })].into());
        assert_eq!(check(&h, &f, all_nodes).divergent, vec![1], "another state on one node");
    }

    #[test]
    fn an_unknown_create_that_appears_is_recovered_not_a_violation() {
        let mut h =
            vec![op(0, 1, Kind::Create, Phase::Invoke, 7, None, 0), op(9, 1, Kind::Create, Phase::Info, 7, None, 0)];
        h.extend(completed(7, 107, 1, 20, 2));
        let r = check(&h, &finals(&[0, 1, 2], &[(7, 107, "completed")]), all_nodes);
        assert!(r.valid, "{r:?}");
        assert_eq!(r.recovered, vec![7]);
    }
}
