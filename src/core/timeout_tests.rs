//! Jobs that name their own activation timeout: each activation holds them
//! that long, whatever the taker asks, and the create needs data version 19.

use super::*;

const TYPE: &str = "render";

fn create(headers: Vec<(String, String)>) -> Command {
    Command::Create(NewJob::plain(JobSpec { job_type: TYPE.into(), custom_headers: headers, ..Default::default() }))
}

fn timed(ms: &str) -> Vec<(String, String)> {
    vec![(ACTIVATION_TIMEOUT_HEADER.to_string(), ms.to_string())]
}

fn activate(state: &mut PartitionState, now: Millis, timeout_ms: i64) -> Vec<ActivatedJobData> {
    let command = Command::Activate(Activation { timeout_ms, max_jobs: 10, ..Activation::plain(TYPE, "") });
    let mut out = state.apply(&Batch::at(now, vec![command]));
    match out.results.pop() {
        Some(CommandResult::Activated(jobs)) => jobs,
        other => panic!("an activation: {other:?}"),
    }
}

#[test]
fn a_job_with_its_own_timeout_is_held_that_long_whatever_the_taker_asks() {
    let mut state = PartitionState::new(0);
    let out = state.apply(&Batch::at(1_000, vec![create(timed("60000")), create(Vec::new())]));
    assert_eq!(out.results.len(), 2);
    let jobs = activate(&mut state, 2_000, 5_000);
    let deadlines: Vec<Millis> = jobs.iter().map(|job| job.deadline).collect();
    assert_eq!(deadlines, vec![62_000, 7_000], "the first job's own 60 s, the second the taker's 5 s");
    let (own, plain) = (jobs[0].key, jobs[1].key);
    // Past the taker's timeout only the job without its own is taken back.
    state.apply(&Batch::at(7_001, Vec::new()));
    assert_eq!(state.job(own).map(|j| j.state), Some(JobState::Activated));
    assert_eq!(state.job(plain).map(|j| j.state), Some(JobState::Activatable));
    assert_eq!(state.next_timer(), Some(62_000));
    // Its next activation holds it for its own 60 s again, and it times out then.
    let again = activate(&mut state, 8_000, 1_000);
    assert_eq!(again.iter().map(|j| (j.key, j.deadline)).collect::<Vec<_>>(), vec![(plain, 9_000)]);
    state.apply(&Batch::at(62_001, Vec::new()));
    let job = state.job(own).expect("a timed-out job is kept");
    assert_eq!(job.state, JobState::Activatable);
    assert!(job.history.events().any(|e| e.kind == EventKind::TimedOut { attempt: 1 }));
}

#[test]
fn a_timeout_header_that_is_not_a_positive_whole_number_is_the_takers() {
    for text in ["0", "-5", "soon", ""] {
        let spec = JobSpec { custom_headers: timed(text), ..Default::default() };
        assert_eq!(activation_timeout(&spec), None, "{text:?}");
    }
    let mut state = PartitionState::new(0);
    state.apply(&Batch::at(1_000, vec![create(timed("soon"))]));
    let jobs = activate(&mut state, 2_000, 5_000);
    assert_eq!(jobs.iter().map(|j| j.deadline).collect::<Vec<_>>(), vec![7_000]);
}

#[test]
fn creates_that_carry_a_timeout_need_data_version_19() {
    assert_eq!(create(Vec::new()).since_version(), None);
    assert_eq!(create(timed("1000")).since_version().map(|(v, _)| v), Some(JOB_TIMEOUTS));
    // With an expiry too, the newer of the two.
    let mut both = timed("1000");
    both.push((EXPIRES_AT_HEADER.to_string(), "5000".to_string()));
    assert_eq!(create(both).since_version().map(|(v, _)| v), Some(JOB_TIMEOUTS.max(SCHEDULES)));
    let expiry_only = vec![(EXPIRES_AT_HEADER.to_string(), "5000".to_string())];
    assert_eq!(create(expiry_only).since_version().map(|(v, _)| v), Some(SCHEDULES));
}
