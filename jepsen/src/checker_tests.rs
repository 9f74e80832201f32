//! The checker's classes, each on a planted history and a clean one.

use super::*;
use crate::history::FinalJob;

fn op(time_ms: u64, process: u64, kind: Kind, phase: Phase, id: u64, key: Option<u64>, attempt: u32) -> Op {
    Op { time_ms, process, node: 0, kind, phase, id, key, attempt, ..Op::default() }
}

/// What a worker that asked for `wanted_type` as `worker` records when
/// handed an activation made out to `assigned`.
fn activated(id: u64, key: u64, attempt: u32, t: u64, wanted_type: &str, worker: &str, assigned: &str) -> Op {
    Op {
        job_type: Some(wanted_type.into()),
        worker: Some(worker.into()),
        assigned_worker: Some(assigned.into()),
        ..op(t, 2, Kind::Activate, Phase::Ok, id, Some(key), attempt)
    }
}

fn typed_create(id: u64, job_type: &str, t: u64) -> Op {
    Op { job_type: Some(job_type.into()), ..op(t, 1, Kind::Create, Phase::Invoke, id, None, 0) }
}

fn lost_ids(r: &Report) -> Vec<u64> {
    r.lost.iter().map(|l| l.id).collect()
}

fn created(id: u64, key: u64, t: u64) -> Vec<Op> {
    vec![op(t, 1, Kind::Create, Phase::Invoke, id, None, 0), op(t + 1, 1, Kind::Create, Phase::Ok, id, Some(key), 0)]
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
        .map(|n| {
            (
                *n,
                jobs.iter()
                    .map(|(id, key, s)| {
                        (
                            *key,
                            FinalJob {
                                id: *id,
                                state: s.to_string(),
                                job_type: "jepsen".into(),
                                checkpoints: Vec::new(),
                                attempt: 0,
                                ..FinalJob::default()
                            },
                        )
                    })
                    .collect(),
            )
        })
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
    assert_eq!(lost_ids(&r), vec![2]);
    assert_eq!(r.lost[0].replicas, [(0, "missing".into()), (1, "missing".into()), (2, "missing".into())].into());
}

#[test]
fn an_unfinished_job_after_the_drain_counts_as_lost() {
    let h = created(1, 101, 0);
    let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "activatable")]), all_nodes);
    assert!(!r.valid);
    assert_eq!(lost_ids(&r), vec![1]);
    assert!(
        r.details().contains("lost: job 1 (?, key 101): node 0 activatable, node 1 activatable"),
        "{}",
        r.details()
    );
}

#[test]
fn a_pushed_only_job_that_was_never_pushed_is_lost_with_its_state() {
    // Created for stream-only workers, acknowledged, and never handed to
    // anyone: after the drain it is still activatable where it was read.
    let mut h = vec![typed_create(1, "jepsen-pushed", 0)];
    h.push(op(1, 1, Kind::Create, Phase::Ok, 1, Some(101), 0));
    let mut f = finals(&[0, 2], &[(1, 101, "activatable")]);
    f.insert(2, BTreeMap::new());
    let r = check(&h, &f, all_nodes);
    assert!(!r.valid);
    assert_eq!(r.lost[0].job_type.as_deref(), Some("jepsen-pushed"));
    assert_eq!(
        r.lost[0].replicas,
        [(0, "activatable".into()), (1, "unread".into()), (2, "missing".into())].into(),
        "node 1 did not answer; node 2 answered without it"
    );
}

#[test]
fn a_slow_recovery_makes_the_run_invalid_and_is_listed() {
    let h = created(1, 101, 0);
    let mut r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
    assert!(r.valid, "{r:?}");
    r.add_slow_recoveries(Vec::new());
    assert!(r.valid, "no slow recovery, still valid");
    let slow =
        crate::sessions::SlowRecovery { key: 101, worker: "session-0".into(), killed_at_ms: 1_000, again_at_ms: None };
    r.add_slow_recoveries(vec![slow]);
    assert!(!r.valid);
    assert!(r.summary().contains("slow recovery 1"), "{}", r.summary());
    assert!(r.details().contains("slow recovery: key 101 held by session-0"), "{}", r.details());
}

fn failed(id: u64, key: u64, attempt: u32, retries: i32, t: u64) -> Vec<Op> {
    let fail = Op { retries: Some(retries), ..op(t, 2, Kind::Fail, Phase::Invoke, id, Some(key), attempt) };
    vec![fail.clone(), Op { phase: Phase::Ok, time_ms: t + 1, ..fail }]
}

fn with_failures(mut f: FinalReads, key: u64, failures: &[(u32, &str, i32)]) -> FinalReads {
    for jobs in f.values_mut() {
        if let Some(job) = jobs.get_mut(&key) {
            job.failures = failures
                .iter()
                .map(|(attempt, reason, retries)| crate::history::FailureEvent {
                    attempt: *attempt,
                    reason: reason.to_string(),
                    retries: *retries,
                    message: "jepsen says no".into(),
                })
                .collect();
        }
    }
    f
}

#[test]
fn an_incident_is_an_anomaly_unless_a_failure_asked_for_it() {
    // It used to be excused whatever its cause ("an incident is not
    // lost"). The workload's jobs carry 1,000 retries; only a worker's
    // failure asking for none (the workload's, now and then, on
    // purpose) may leave a job an incident.
    let mut h = created(1, 101, 0);
    h.push(op(5, 2, Kind::Activate, Phase::Ok, 1, Some(101), 1));
    h.extend(failed(1, 101, 1, 0, 10));
    let f = with_failures(finals(&[0, 1, 2], &[(1, 101, "incident")]), 101, &[(1, "failed", 0)]);
    let r = check(&h, &f, all_nodes);
    assert!(r.valid, "failed for good on purpose: {r:?}");
    assert_eq!((r.incidents, r.unexplained_incidents.len()), (1, 0));

    // The worker asked for 999 retries; the replicas hold a failure that
    // left none (a leader that proposed another failure than the worker's).
    let mut asked = created(1, 101, 0);
    asked.extend(failed(1, 101, 1, 999, 10));
    let f = with_failures(finals(&[0, 1, 2], &[(1, 101, "incident")]), 101, &[(1, "failed", 0)]);
    let r = check(&asked, &f, all_nodes);
    assert!(!r.valid);
    assert!(r.details().contains("unexplained incident: job 1 (key 101): attempt 1 failed"), "{}", r.details());
    // No failure recorded at all: an incident from nowhere.
    let r = check(&created(1, 101, 0), &finals(&[0, 1, 2], &[(1, 101, "incident")]), all_nodes);
    assert_eq!(r.found("unexplained incident"), 1, "{r:?}");
    // A worker asked for none at attempt 1, but attempt 2 is the one
    // that left none (a dead session's, on a job of 1,000 retries).
    let f = with_failures(finals(&[0, 1, 2], &[(1, 101, "incident")]), 101, &[(1, "failed", 1), (2, "worker-died", 0)]);
    assert_eq!(check(&h, &f, all_nodes).unexplained_incidents.len(), 1);
    // The attacker's doing: a cross-tenant effect, counted there.
    let mut f = finals(&[0, 1, 2], &[(1, 101, "incident")]);
    for jobs in f.values_mut() {
        jobs.get_mut(&101).unwrap().actors = vec!["mallory forged this failure".into()];
    }
    assert_eq!(check(&created(1, 101, 0), &f, all_nodes).unexplained_incidents.len(), 0);
}

#[test]
fn a_completion_acknowledged_and_held_otherwise_by_the_replicas_is_rolled_back() {
    // Counted completed before: an acknowledged completion overrode what
    // the replicas hold.
    let mut h = created(1, 101, 0);
    h.push(op(5, 2, Kind::Activate, Phase::Ok, 1, Some(101), 1));
    h.extend(completed(1, 101, 1, 10, 2));
    for state in ["activatable", "cancelled", "incident"] {
        let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, state)]), all_nodes);
        assert!(!r.valid, "{state}");
        assert_eq!((r.rolled_back.len(), r.lost.len(), r.completed), (1, 0, 0), "{state}: {r:?}");
    }
    let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "activatable")]), all_nodes);
    assert!(
        r.details().contains("completion rolled back: job 1 (key 101) completion of attempt 1 acknowledged: node 0"),
        "{}",
        r.details()
    );
    // Every replica missing it: rolled back too; none answering: unread.
    let r = check(&h, &finals(&[0, 1, 2], &[]), all_nodes);
    assert_eq!(r.rolled_back.len(), 1);
    let r = check(&h, &FinalReads::new(), all_nodes);
    assert_eq!((r.rolled_back.len(), r.unread_replicas.clone()), (0, vec![0, 1, 2]));
    let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
    assert!(r.valid, "{r:?}");
}

#[test]
fn a_job_handed_out_again_after_its_completion_was_acknowledged_is_an_anomaly() {
    let mut h = created(1, 101, 0);
    h.push(op(5, 2, Kind::Activate, Phase::Ok, 1, Some(101), 1));
    h.extend(completed(1, 101, 1, 10, 2));
    let f = finals(&[0, 1, 2], &[(1, 101, "completed")]);
    assert!(check(&h, &f, all_nodes).valid);
    h.push(op(30, 3, Kind::Activate, Phase::Ok, 1, Some(101), 2));
    let r = check(&h, &f, all_nodes);
    assert!(!r.valid);
    assert_eq!(r.activated_after_completion.len(), 1, "{r:?}");
    assert!(r.details().contains("attempt 2 handed to process 3 at 30 ms"), "{}", r.details());
}

#[test]
fn one_attempt_handed_to_two_workers_is_an_anomaly() {
    let mut h = created(1, 101, 0);
    h.push(op(5, 2, Kind::Activate, Phase::Ok, 1, Some(101), 1));
    h.push(op(6, 3, Kind::Activate, Phase::Ok, 1, Some(101), 2));
    h.extend(completed(1, 101, 2, 10, 3));
    let f = finals(&[0, 1, 2], &[(1, 101, "completed")]);
    assert!(check(&h, &f, all_nodes).valid, "two attempts, one each");
    h.push(op(7, 4, Kind::Activate, Phase::Ok, 1, Some(101), 2));
    let r = check(&h, &f, all_nodes);
    assert!(!r.valid);
    assert_eq!(r.handed_twice, vec![HandedTwice { id: 1, key: 101, attempt: 2, processes: vec![3, 4] }]);
}

#[test]
fn jobs_without_an_id_or_of_another_tenant_handed_to_the_workload_are_misdelivered() {
    let mut h = created(1, 101, 0);
    h.extend(completed(1, 101, 1, 10, 2));
    let f = finals(&[0, 1, 2], &[(1, 101, "completed")]);
    // A schedule's job (no workload id) to a poller of the workload's type.
    let cron = Op {
        job_type: Some("jepsen".into()),
        handed_type: Some("jepsen-cron".into()),
        ..op(5, 2, Kind::Activate, Phase::Ok, 0, Some(7 << 48 | 3), 1)
    };
    // A workflow worker handed its own type: fine.
    let step = Op {
        job_type: Some("jepsen-wf".into()),
        handed_type: Some("jepsen-wf".into()),
        ..op(6, 90, Kind::Activate, Phase::Ok, 0, Some(9), 1)
    };
    let mut with = h.clone();
    with.push(step.clone());
    assert!(check(&with, &f, all_nodes).valid, "{:?}", check(&with, &f, all_nodes));
    with.push(cron);
    let r = check(&with, &f, all_nodes);
    assert_eq!(r.misdelivered.len(), 1, "{r:?}");
    assert!(r.details().contains("a jepsen-cron job to a worker of type jepsen"), "{}", r.details());
    assert!(r.duplicate_creates.is_empty(), "id 0 is no create's: {r:?}");
    // Another tenant's job of the right type.
    let foreign = Op {
        job_type: Some("jepsen".into()),
        handed_type: Some("jepsen".into()),
        tenant: Some("mallory".into()),
        ..op(6, 2, Kind::Activate, Phase::Ok, 0, Some(55), 1)
    };
    let mut with = h.clone();
    with.push(foreign);
    let r = check(&with, &f, all_nodes);
    assert!(r.details().contains("a job of tenant \"mallory\""), "{}", r.details());
}

#[test]
fn an_activation_the_replicas_record_for_another_worker_is_misdelivered() {
    // The OJS binding's fetch does not say whose activation it is: the
    // replicas' record of the attempt does.
    let mut h = created(1, 101, 0);
    let fetched = Op { worker: Some("ojs-9".into()), ..op(5, 9, Kind::Activate, Phase::Ok, 1, Some(101), 1) };
    h.push(fetched);
    h.extend(completed(1, 101, 1, 10, 9));
    let mut f = finals(&[0, 1, 2], &[(1, 101, "completed")]);
    let record = |f: &mut FinalReads, worker: &str| {
        for jobs in f.values_mut() {
            jobs.get_mut(&101).unwrap().activations = vec![(1, worker.to_string())];
        }
    };
    record(&mut f, "ojs-9");
    assert!(check(&h, &f, all_nodes).valid);
    record(&mut f, "streamer-a");
    let r = check(&h, &f, all_nodes);
    assert!(r.details().contains("made out to worker streamer-a for worker ojs-9"), "{}", r.details());
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
fn an_acknowledged_create_that_made_two_jobs_is_a_duplicate() {
    // A gateway re-submitted a create whose answer it lost: two jobs for
    // one marker, each completed once. The client asked for one job.
    let mut h = created(1, 102, 0);
    h.extend(completed(1, 101, 1, 10, 2));
    h.extend(completed(1, 102, 1, 12, 3));
    let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed"), (1, 102, "completed")]), all_nodes);
    assert!(!r.valid, "{r:?}");
    assert!(r.duplicated.is_empty(), "each job completed once");
    assert_eq!(r.duplicate_creates, vec![DuplicateCreate { id: 1, keys: vec![101, 102], acknowledged: Some(102) }]);
    assert!(
        r.details().contains("create 1 produced 2 jobs (keys [101, 102]; acknowledged as key 102)"),
        "{}",
        r.details()
    );
}

#[test]
fn an_unacknowledged_create_that_made_two_jobs_is_a_duplicate() {
    let mut h =
        vec![op(0, 1, Kind::Create, Phase::Invoke, 7, None, 0), op(9, 1, Kind::Create, Phase::Info, 7, None, 0)];
    h.extend(completed(7, 107, 1, 20, 2));
    // The second job is only in the final reads, never handed to anyone.
    let r = check(&h, &finals(&[0, 1, 2], &[(7, 107, "completed"), (7, 108, "activatable")]), all_nodes);
    assert!(!r.valid, "{r:?}");
    assert!(r.lost.is_empty(), "nothing acknowledged, nothing lost");
    assert_eq!(r.duplicate_creates, vec![DuplicateCreate { id: 7, keys: vec![107, 108], acknowledged: None }]);
    assert!(r.details().contains("create 7 produced 2 jobs (keys [107, 108]; not acknowledged)"), "{}", r.details());
}

#[test]
fn a_second_job_seen_only_by_a_worker_is_a_duplicate() {
    // The final reads hold one job, but a worker was handed another key
    // carrying the same marker.
    let mut h = created(1, 101, 0);
    h.push(op(5, 2, Kind::Activate, Phase::Ok, 1, Some(109), 1));
    h.extend(completed(1, 101, 1, 10, 2));
    let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
    assert!(!r.valid);
    assert_eq!(r.duplicate_creates[0].keys, vec![101, 109]);
}

#[test]
fn a_job_of_another_type_pushed_to_a_stream_is_misdelivered() {
    let mut h = vec![typed_create(1, "jepsen", 0)];
    h.push(op(1, 1, Kind::Create, Phase::Ok, 1, Some(101), 0));
    h.push(activated(1, 101, 1, 5, "jepsen-pushed", "pushed", "pushed"));
    h.extend(completed(1, 101, 1, 10, 2));
    let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
    assert!(!r.valid);
    assert_eq!(r.misdelivered.len(), 1);
    assert!(r.details().contains("a jepsen job to a worker of type jepsen-pushed"), "{}", r.details());
}

#[test]
fn an_activation_made_out_to_another_worker_is_misdelivered() {
    let mut h = vec![typed_create(1, "jepsen", 0)];
    h.push(op(1, 1, Kind::Create, Phase::Ok, 1, Some(101), 0));
    h.push(activated(1, 101, 1, 5, "jepsen", "streamer-b", "streamer-a"));
    h.extend(completed(1, 101, 1, 10, 2));
    let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
    assert!(!r.valid);
    assert!(r.details().contains("made out to worker streamer-a for worker streamer-b"), "{}", r.details());
}

#[test]
fn an_activation_for_the_worker_that_asked_is_not_misdelivered() {
    let mut h = vec![typed_create(1, "jepsen", 0)];
    h.push(op(1, 1, Kind::Create, Phase::Ok, 1, Some(101), 0));
    h.push(activated(1, 101, 1, 5, "jepsen", "streamer-a", "streamer-a"));
    h.extend(completed(1, 101, 1, 10, 2));
    let r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
    assert!(r.valid, "{r:?}");
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
fn a_drain_counts_jobs_no_client_heard_completed() {
    let mut h = vec![
        op(0, 1, Kind::Create, Phase::Ok, 1, Some(10), 0),
        op(1, 2, Kind::Complete, Phase::Ok, 2, Some(11), 1),
        op(2, 1, Kind::Create, Phase::Ok, 2, Some(11), 0),
    ];
    assert_eq!(unfinished(&h), 1, "job 10 is open; 11 was completed before its create was heard of");
    h.push(op(3, 2, Kind::Complete, Phase::Ok, 1, Some(10), 1));
    assert_eq!(unfinished(&h), 0);
    // A session job's completion is never in the history: not counted.
    let session = crate::sessions::SESSION_TYPE.to_string();
    h.push(Op { job_type: Some(session), ..op(4, 1, Kind::Create, Phase::Invoke, 3, None, 0) });
    h.push(op(5, 1, Kind::Create, Phase::Ok, 3, Some(12), 0));
    assert_eq!(unfinished(&h), 0);
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
    f.insert(
        2,
        [(
            101,
            FinalJob {
                id: 1,
                state: "activatable".into(),
                job_type: "jepsen".into(),
                checkpoints: Vec::new(),
                attempt: 0,
                ..FinalJob::default()
            },
        )]
        .into(),
    );
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

#[test]
fn a_create_refused_at_every_send_whose_job_exists_failed_yet_was_made() {
    // It used to count as recovered: `fail` is "certainly did not
    // happen", so a job it made is an anomaly, counted apart.
    let refused =
        vec![op(0, 1, Kind::Create, Phase::Invoke, 7, None, 0), op(9, 1, Kind::Create, Phase::Fail, 7, None, 0)];
    let r = check(&refused, &finals(&[0, 1, 2], &[(7, 107, "activatable")]), all_nodes);
    assert!(!r.valid);
    assert_eq!((r.failed_yet_made.clone(), r.recovered.len()), (vec![7], 0));
    // One send's outcome unknown, the next refused: it may have been the first.
    let mut unknown = refused.clone();
    unknown.insert(1, op(5, 1, Kind::Create, Phase::Info, 7, None, 0));
    let r = check(&unknown, &finals(&[0, 1, 2], &[(7, 107, "activatable")]), all_nodes);
    assert_eq!((r.failed_yet_made.len(), r.recovered.clone()), (0, vec![7]));
    // Refused and never made: clean.
    assert!(check(&refused, &finals(&[0, 1, 2], &[]), all_nodes).valid);
}

#[test]
fn a_replica_that_never_answered_makes_the_run_unknown_not_valid() {
    let mut h = created(1, 101, 0);
    h.extend(completed(1, 101, 1, 10, 2));
    let mut r = check(&h, &finals(&[0, 1], &[(1, 101, "completed")]), all_nodes);
    r.note_unread();
    assert_eq!((r.verdict(), r.unread_replicas.clone()), (Verdict::Unknown, vec![2]));
    assert!(r.summary().starts_with("UNKNOWN (nodes [2] did not answer the final read)"), "{}", r.summary());
    let mut r = check(&h, &finals(&[0, 1, 2], &[(1, 101, "completed")]), all_nodes);
    r.note_unread();
    assert_eq!(r.verdict(), Verdict::Valid);
}

fn checkpointed(id: u64, key: u64, attempt: u32, stage: &str, t: u64) -> Op {
    Op { stage: Some(stage.into()), ..op(t, 3, Kind::Checkpoint, Phase::Ok, id, Some(key), attempt) }
}

fn staged_finals(checkpoints: &[(&str, u32)]) -> FinalReads {
    let mut f = finals(&[0, 1, 2], &[(9, 109, "completed")]);
    for jobs in f.values_mut() {
        jobs.get_mut(&109).unwrap().checkpoints = checkpoints.iter().map(|(s, a)| (s.to_string(), *a)).collect();
    }
    f
}

#[test]
fn a_stage_committed_by_two_attempts_is_an_anomaly() {
    let mut h = created(9, 109, 0);
    h.push(checkpointed(9, 109, 1, "reserved", 5));
    h.push(checkpointed(9, 109, 2, "charged", 8));
    h.extend(completed(9, 109, 2, 10, 3));
    let r = check(&h, &staged_finals(&[("reserved", 1), ("charged", 2)]), all_nodes);
    assert!(r.valid, "resuming at the next stage is right: {r:?}");
    assert_eq!(r.checkpoints, 2);

    h.push(checkpointed(9, 109, 2, "reserved", 9));
    let r = check(&h, &staged_finals(&[("reserved", 1), ("charged", 2)]), all_nodes);
    assert!(!r.valid);
    assert_eq!(r.stage_twice.len(), 1);
    assert_eq!((r.stage_twice[0].stage.as_str(), &r.stage_twice[0].attempts[..]), ("reserved", &[1, 2][..]));
}

#[test]
fn an_acknowledged_checkpoint_missing_from_a_replica_is_lost() {
    let mut h = created(9, 109, 0);
    h.push(checkpointed(9, 109, 1, "reserved", 5));
    h.push(checkpointed(9, 109, 1, "charged", 6));
    h.extend(completed(9, 109, 1, 10, 3));
    let r = check(&h, &staged_finals(&[("reserved", 1)]), all_nodes);
    assert!(!r.valid);
    assert_eq!(r.lost_checkpoints.len(), 3, "one per replica: {:?}", r.lost_checkpoints);
    let r = check(&h, &staged_finals(&[("charged", 1), ("reserved", 1)]), all_nodes);
    assert!(r.stage_twice.iter().any(|s| s.stage == "(out of order)"), "{r:?}");
}

#[test]
fn a_keyed_create_sent_twice_is_valid_with_one_job_and_a_duplicate_with_two() {
    let mut h = vec![
        op(0, 1, Kind::Create, Phase::Invoke, 4, None, 0),
        op(5, 1, Kind::Create, Phase::Info, 4, None, 0),
        op(6, 1, Kind::Create, Phase::Invoke, 4, None, 0),
        op(7, 1, Kind::Create, Phase::Ok, 4, Some(104), 0),
    ];
    h.extend(completed(4, 104, 1, 10, 2));
    assert!(check(&h, &finals(&[0, 1, 2], &[(4, 104, "completed")]), all_nodes).valid);
    let two = finals(&[0, 1, 2], &[(4, 104, "completed"), (4, 105, "activatable")]);
    let r = check(&h, &two, all_nodes);
    assert!(!r.valid);
    assert_eq!(r.duplicate_creates[0].keys, vec![104, 105]);
}
