//! Jobs with an expiry under faults: one in sixteen of the polled type's
//! gRPC creates asks to expire 1 to 4 s after it is sent. Such a job may end
//! completed (a worker took it in time) or expired, never anything else,
//! and no activation may begin at or after its expiry, in the partition's
//! time: `expired job handed out` is a replica's record of an activation
//! at or after the expiry, or a worker handed a job that every replica
//! holds as expired and never activated.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::history::{FinalReads, Kind, Op, Phase};

/// A job handed to a worker after its expiry.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExpiredHandedOut {
    pub key: u64,
    pub expires_at: i64,
    /// The activation's start in the partition's time, when a replica
    /// records it; `None` for an activation no replica records.
    pub activated_at: Option<i64>,
    pub node: Option<usize>,
}

/// Every expired job handed out, by the replicas' records and the workers'.
pub fn check(history: &[Op], finals: &FinalReads) -> Vec<ExpiredHandedOut> {
    let mut found = Vec::new();
    let mut seen = BTreeSet::new();
    for (node, jobs) in finals {
        for (key, job) in jobs.iter().filter(|(_, j)| j.expires_at > 0) {
            for at in job.activated_at.iter().filter(|at| **at >= job.expires_at) {
                if seen.insert((*key, *at)) {
                    let (expires_at, activated_at) = (job.expires_at, Some(*at));
                    found.push(ExpiredHandedOut { key: *key, expires_at, activated_at, node: Some(*node) });
                }
            }
        }
    }
    // Jobs every replica that answered holds as expired, never activated.
    let mut never_activated: BTreeMap<u64, (bool, i64)> = BTreeMap::new();
    for jobs in finals.values() {
        for (key, job) in jobs.iter().filter(|(_, j)| j.expires_at > 0) {
            let quiet = job.state == "expired" && job.activated_at.is_empty();
            let entry = never_activated.entry(*key).or_insert((true, job.expires_at));
            entry.0 &= quiet;
        }
    }
    let handed: BTreeSet<u64> =
        history.iter().filter(|o| o.kind == Kind::Activate && o.phase == Phase::Ok).filter_map(|o| o.key).collect();
    for (key, (quiet, expires_at)) in never_activated {
        if quiet && handed.contains(&key) {
            found.push(ExpiredHandedOut { key, expires_at, activated_at: None, node: None });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::FinalJob;

    fn job(state: &str, expires_at: i64, activated_at: &[i64]) -> FinalJob {
        FinalJob { id: 1, state: state.into(), expires_at, activated_at: activated_at.to_vec(), ..FinalJob::default() }
    }

    fn activation(key: u64) -> Op {
        Op { kind: Kind::Activate, phase: Phase::Ok, id: 1, key: Some(key), ..Op::default() }
    }

    #[test]
    fn an_activation_before_the_expiry_is_fine_and_one_at_or_after_it_is_not() {
        let finals: FinalReads = [(0, [(7, job("completed", 5_000, &[4_999]))].into())].into();
        assert!(check(&[activation(7)], &finals).is_empty());
        let finals: FinalReads = [(0, [(7, job("expired", 5_000, &[3_000, 5_000]))].into())].into();
        let found = check(&[], &finals);
        assert_eq!(
            found,
            vec![ExpiredHandedOut { key: 7, expires_at: 5_000, activated_at: Some(5_000), node: Some(0) }]
        );
    }

    #[test]
    fn a_worker_handed_a_job_every_replica_holds_as_never_activated_is_handed_out() {
        let expired = job("expired", 5_000, &[]);
        let finals: FinalReads = [(0, [(7, expired.clone())].into()), (1, [(7, expired)].into())].into();
        assert!(check(&[], &finals).is_empty(), "expired unrun, and no worker had it");
        let found = check(&[activation(7)], &finals);
        assert_eq!(found, vec![ExpiredHandedOut { key: 7, expires_at: 5_000, activated_at: None, node: None }]);
        // One replica records the activation (before the expiry): the job ran
        // and expired after its attempt, which is allowed.
        let finals: FinalReads =
            [(0, [(7, job("expired", 5_000, &[]))].into()), (1, [(7, job("expired", 5_000, &[4_000]))].into())].into();
        assert!(check(&[activation(7)], &finals).is_empty());
    }

    #[test]
    fn jobs_without_an_expiry_are_not_judged() {
        let finals: FinalReads = [(0, [(7, job("completed", 0, &[9_000]))].into())].into();
        assert!(check(&[activation(7)], &finals).is_empty());
    }
}
