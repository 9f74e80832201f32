//! Workflows under faults: a producer creates chains, groups and batches
//! (with all three callbacks) of ids of its own, through random gateways,
//! sending a create whose answer it lost again with the same id; workers
//! complete their steps, and fail one step in five workflows for good, so
//! chains stop, groups fail and batches fire `on_failure`. Once the faults
//! are healed and the workflows ended, the checker reads each workflow and
//! every replica's jobs and holds each workflow to its rule:
//!
//! - `step twice`: two jobs (by key, over every replica) for one step;
//! - `step lost`: a step whose job ended on the replicas while its workflow
//!   still holds it running, a chain's next step never made after one
//!   completed, a step the workflow holds made that no replica has, or an
//!   acknowledged workflow no partition knows;
//! - `callback twice`: two jobs for one callback, or a job for a callback
//!   the steps' outcome did not call for;
//! - `callback lost`: a callback the steps' outcome called for with no job.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use drover::client::Client;
use drover::proto::gateway::{CreateJobRequest, CreateWorkflowRequest, FailJobRequest, GetWorkflowRequest};
use serde::{Deserialize, Serialize};

use crate::schedules::through_any;
use crate::workload::Shared;

/// The job type of every step and callback.
pub const STEP_TYPE: &str = "jepsen-wf";
/// Steps per workflow.
const STEPS: usize = 3;
/// A workflow every so often.
const EVERY: Duration = Duration::from_millis(400);
const CALLBACKS: [&str; 3] = ["on_complete", "on_success", "on_failure"];

/// The ids of the workflows whose create was answered.
#[derive(Default)]
pub struct Acknowledged(Mutex<BTreeSet<String>>);

impl Acknowledged {
    pub fn ids(&self) -> Vec<String> {
        self.0.lock().unwrap().iter().cloned().collect()
    }
}

fn job(variables: serde_json::Value) -> CreateJobRequest {
    CreateJobRequest {
        r#type: STEP_TYPE.into(),
        variables: variables.to_string(),
        retries: Some(5),
        ..Default::default()
    }
}

/// The `n`th workflow: kinds in turn, one in five with a step that fails.
fn workflow(n: u64) -> CreateWorkflowRequest {
    let kind = ["chain", "group", "batch"][(n % 3) as usize];
    let failing = n.is_multiple_of(5);
    let steps = (0..STEPS).map(|i| job(serde_json::json!({ "fail": failing && i == 1 }))).collect();
    let mut request =
        CreateWorkflowRequest { kind: kind.into(), id: format!("jepsen-wf-{n}"), steps, ..Default::default() };
    if kind == "batch" {
        request.on_complete = Some(job(serde_json::json!({ "callback": "on_complete" })));
        request.on_success = Some(job(serde_json::json!({ "callback": "on_success" })));
        request.on_failure = Some(job(serde_json::json!({ "callback": "on_failure" })));
    }
    request
}

/// Creates workflows until the producers stop.
pub async fn producer(shared: Arc<Shared>, acknowledged: Arc<Acknowledged>) {
    let mut n = 0;
    while !shared.stop_creating.load(Ordering::Relaxed) {
        n += 1;
        let request = workflow(n);
        let id = request.id.clone();
        let created = through_any(&shared.live_gateways(), Duration::from_secs(10), "creating a workflow", |client| {
            let request = request.clone();
            async move { client.raw().create_workflow(request).await }
        })
        .await;
        if created.is_ok() {
            acknowledged.0.lock().unwrap().insert(id);
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// Works the steps and callbacks through gateway `home` and the next ones
/// in turn: completes each, or fails it for good when it says so.
pub async fn worker(shared: Arc<Shared>, process: u64, home: usize) {
    shared.poll_in_turn((process, home), STEP_TYPE, "jepsen-wf-worker", 10, work).await
}

async fn work(client: Client, jobs: Vec<drover::proto::gateway::ActivatedJob>) {
    for job in jobs {
        let fail = job.variables.contains("\"fail\":true");
        let answer = if fail {
            let request = FailJobRequest {
                key: job.key,
                attempt: job.attempt,
                retries: 0,
                error_message: "the fault suite's failing step".into(),
                ..Default::default()
            };
            client.raw().fail_job(request).await.map(drop)
        } else {
            client.complete(job.key, job.attempt, r#"{"done":true}"#).await
        };
        // A lost answer: the job times out and is worked again.
        drop(answer);
    }
}

/// A workflow as its partition answered it at the end.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkflowRead {
    pub id: String,
    pub kind: String,
    /// Empty when no partition knows it.
    pub state: String,
    /// (step or callback name, state, job key).
    pub steps: Vec<(String, String, u64)>,
}

/// Waits up to `limit` for every acknowledged workflow to end, and reads
/// each: within `limit` in all, whatever the cluster does (one no gateway
/// answered for by then is `unread`).
pub async fn finish(gateways: &[String], ids: &[String], limit: Duration) -> Vec<WorkflowRead> {
    let until = Instant::now() + limit;
    let mut reads = Vec::new();
    for id in ids {
        loop {
            let get = GetWorkflowRequest { id: id.clone(), ..Default::default() };
            let left = until.saturating_duration_since(Instant::now());
            let answer = through_any(gateways, left, "reading a workflow", |client| {
                let get = get.clone();
                async move {
                    match client.raw().get_workflow(get).await {
                        Err(status) if status.code() == tonic::Code::NotFound => Ok(None),
                        other => other.map(|w| Some(w.into_inner())),
                    }
                }
            })
            .await;
            let read = match answer {
                Ok(Some(w)) => {
                    let named = w.steps.iter().chain(&w.callbacks);
                    let steps = named.map(|s| (s.name.clone(), s.state.clone(), s.job_key)).collect();
                    WorkflowRead { id: id.clone(), kind: w.kind, state: w.state, steps }
                }
                Ok(None) => WorkflowRead { id: id.clone(), ..Default::default() },
                // No gateway answered: not judged (counted as unread).
                Err(_) => WorkflowRead { id: id.clone(), state: "unread".into(), ..Default::default() },
            };
            if !matches!(read.state.as_str(), "running" | "unread") || Instant::now() >= until {
                reads.push(read);
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    reads
}

/// Node -> job key -> (workflow, step, state) of every job a workflow made.
pub type StepReads = BTreeMap<usize, BTreeMap<u64, (String, String, String)>>;

/// The workflow, step and state of a job, from the actuator's view.
pub fn step_of(job: &serde_json::Value) -> Option<(String, String, String)> {
    let workflow = job["workflow"].as_str()?.to_string();
    Some((workflow, job["step"].as_str()?.to_string(), job["state"].as_str()?.to_string()))
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Anomaly {
    pub workflow: String,
    pub step: String,
    pub why: String,
}

/// What the workflows came to.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Workflows {
    pub workflows: usize,
    /// Steps and callbacks made, over every workflow.
    pub jobs: usize,
    pub step_twice: Vec<Anomaly>,
    pub step_lost: Vec<Anomaly>,
    pub callback_twice: Vec<Anomaly>,
    pub callback_lost: Vec<Anomaly>,
    /// A workflow whose own state its steps' contradict: ended otherwise
    /// than its rule says, or running with nothing left to wait for.
    pub wrong_end: Vec<Anomaly>,
    /// Workflows no gateway answered for at the end: not judged (the
    /// verdict is UNKNOWN).
    pub unread: usize,
}

impl Workflows {
    pub fn anomalies(&self) -> usize {
        self.step_twice.len()
            + self.step_lost.len()
            + self.callback_twice.len()
            + self.callback_lost.len()
            + self.wrong_end.len()
    }

    pub fn summary(&self) -> String {
        format!(
            "workflows {} ({} jobs, {} unread): step lost {}, step twice {}, callback lost {}, callback twice {}, \
             wrong end {}",
            self.workflows,
            self.jobs,
            self.unread,
            self.step_lost.len(),
            self.step_twice.len(),
            self.callback_lost.len(),
            self.callback_twice.len(),
            self.wrong_end.len()
        )
    }

    pub fn lines(&self) -> Vec<String> {
        let classes = [
            ("step lost", &self.step_lost),
            ("step twice", &self.step_twice),
            ("callback lost", &self.callback_lost),
            ("callback twice", &self.callback_twice),
            ("wrong end", &self.wrong_end),
        ];
        classes
            .into_iter()
            .flat_map(|(class, found)| {
                found.iter().map(move |a| format!("{class}: {} {}: {}", a.workflow, a.step, a.why))
            })
            .collect()
    }
}

fn ended(state: &str) -> bool {
    matches!(state, "completed" | "incident" | "cancelled" | "expired")
}

/// (workflow, step) -> key -> the states replicas hold it in.
type Made<'a> = BTreeMap<(String, String), BTreeMap<u64, Vec<&'a str>>>;

fn made_of(jobs: &StepReads) -> Made<'_> {
    let mut made: Made<'_> = BTreeMap::new();
    for (key, (workflow, step, state)) in jobs.values().flatten() {
        made.entry((workflow.clone(), step.clone())).or_default().entry(*key).or_default().push(state.as_str());
    }
    made
}

/// Each workflow against its rule, by its read and every replica's jobs
/// read `before` it and `after` it: a job that ended on a replica before the
/// workflow's read must have ended in it, and a job the workflow names
/// must be on a replica after it. (A workflow that had ended when read
/// changes no more: both reads agree on it.)
pub fn check(reads: &[WorkflowRead], before: &StepReads, after: &StepReads) -> Workflows {
    let ended_before = made_of(before);
    let made = made_of(after);
    let mut found = Workflows { workflows: reads.len(), jobs: made.len(), ..Workflows::default() };
    let unread = reads.iter().filter(|w| w.state == "unread").count();
    found.unread = unread;
    let anomaly =
        |w: &WorkflowRead, step: &str, why: String| Anomaly { workflow: w.id.clone(), step: step.into(), why };
    for w in reads {
        let of = |step: &str| made.get(&(w.id.clone(), step.to_string()));
        if w.state.is_empty() {
            found.step_lost.push(anomaly(w, "*", "acknowledged, and no partition knows it".into()));
            continue;
        }
        if w.state == "unread" {
            continue;
        }
        for (step, keys) in made.range((w.id.clone(), String::new())..).take_while(|((id, _), _)| *id == w.id) {
            if keys.len() > 1 {
                let why = format!("jobs {:?}", keys.keys().collect::<Vec<_>>());
                match CALLBACKS.contains(&step.1.as_str()) {
                    true => found.callback_twice.push(anomaly(w, &step.1, why)),
                    false => found.step_twice.push(anomaly(w, &step.1, why)),
                }
            }
        }
        let mut outcomes = Vec::new();
        for (i, (name, state, key)) in w.steps.iter().enumerate() {
            let on_replicas = of(name).and_then(|keys| keys.get(key));
            if *key != 0 && on_replicas.is_none() {
                found.step_lost.push(anomaly(w, name, format!("the workflow holds job {key}, no replica does")));
            }
            // Read after the replicas (see `finish`): an end a replica
            // shows, the workflow's own read shows too.
            let before = ended_before.get(&(w.id.clone(), name.clone())).and_then(|keys| keys.get(key));
            let job_ended = before.is_some_and(|states| states.iter().all(|s| ended(s)));
            if state == "created" && job_ended {
                found.step_lost.push(anomaly(w, name, "its job ended and the workflow never took the end".into()));
            }
            if !CALLBACKS.contains(&name.as_str()) {
                outcomes.push(state.as_str());
                let next_waits =
                    w.steps.get(i + 1).is_some_and(|(n, s, _)| s == "waiting" && !CALLBACKS.contains(&n.as_str()));
                if w.kind == "chain" && state == "completed" && next_waits {
                    found.step_lost.push(anomaly(w, name, "completed, and the next step was never made".into()));
                }
            }
        }
        if w.kind == "batch" && outcomes.iter().all(|s| !matches!(*s, "waiting" | "created")) {
            let all_completed = outcomes.iter().all(|s| *s == "completed");
            for callback in CALLBACKS {
                let due = match callback {
                    "on_complete" => true,
                    "on_success" => all_completed,
                    _ => !all_completed,
                };
                let jobs = of(callback).map_or(0, BTreeMap::len);
                if due && jobs == 0 {
                    found.callback_lost.push(anomaly(w, callback, "due by the steps' outcome, never made".into()));
                }
                if !due && jobs > 0 {
                    found.callback_twice.push(anomaly(
                        w,
                        callback,
                        "made, and the steps' outcome did not call for it".into(),
                    ));
                }
            }
        }
        if let Some(why) = wrong_end(w, &outcomes) {
            found.wrong_end.push(anomaly(w, "*", why));
        }
    }
    found
}

/// Why a workflow's own state contradicts its steps' (`outcomes`, steps
/// only), if it does.
fn wrong_end(w: &WorkflowRead, outcomes: &[&str]) -> Option<String> {
    let all_completed = outcomes.iter().all(|s| *s == "completed");
    let any_live = w.steps.iter().any(|(_, s, _)| s == "created");
    let expected = match (w.kind.as_str(), w.state.as_str()) {
        (_, "running") if !any_live => return Some("running, with no step or callback left to end".into()),
        (_, "running") => return None,
        ("chain" | "group", "completed") => all_completed,
        ("chain" | "group", "failed") => !all_completed,
        // A batch ends by its callbacks, which this run never fails.
        ("batch", "completed") => true,
        (_, other) => return Some(format!("ended {other}, which nothing in this run asks for")),
    };
    (!expected).then(|| format!("ended {} with its steps {outcomes:?}", w.state))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(id: &str, kind: &str, state: &str, steps: &[(&str, &str, u64)]) -> WorkflowRead {
        WorkflowRead {
            id: id.into(),
            kind: kind.into(),
            state: state.into(),
            steps: steps.iter().map(|(n, s, k)| (n.to_string(), s.to_string(), *k)).collect(),
        }
    }

    /// (key, workflow, step, state) of the jobs one node holds.
    type Held<'a> = &'a [(u64, &'a str, &'a str, &'a str)];

    fn jobs(nodes: &[(usize, Held<'_>)]) -> StepReads {
        nodes
            .iter()
            .map(|(node, held)| {
                let held = held.iter().map(|(k, w, s, st)| (*k, (w.to_string(), s.to_string(), st.to_string())));
                (*node, held.collect())
            })
            .collect()
    }

    #[test]
    fn a_chain_that_ran_each_step_once_is_clean() {
        let w = read("w", "chain", "completed", &[("0", "completed", 1), ("1", "completed", 2)]);
        let held: &[_] = &[(1, "w", "0", "completed"), (2, "w", "1", "completed")];
        let found = check(&[w], &jobs(&[(0, held), (1, held)]), &jobs(&[(0, held), (1, held)]));
        assert_eq!((found.anomalies(), found.jobs), (0, 2), "{found:?}");
    }

    #[test]
    fn two_jobs_for_one_step_or_callback_are_twice() {
        let w = read("w", "batch", "completed", &[("0", "completed", 1), ("on_complete", "completed", 3)]);
        let held: &[_] = &[
            (1, "w", "0", "completed"),
            (2, "w", "0", "completed"),
            (3, "w", "on_complete", "completed"),
            (4, "w", "on_complete", "activatable"),
        ];
        let found = check(&[w], &jobs(&[(0, held)]), &jobs(&[(0, held)]));
        assert_eq!((found.step_twice.len(), found.callback_twice.len()), (1, 1), "{found:?}");
    }

    #[test]
    fn an_end_the_workflow_never_took_and_a_next_step_never_made_are_lost() {
        let stuck = read("a", "chain", "running", &[("0", "created", 1), ("1", "waiting", 0)]);
        let skipped = read("b", "chain", "running", &[("0", "completed", 2), ("1", "waiting", 0)]);
        let held: &[_] = &[(1, "a", "0", "completed"), (2, "b", "0", "completed")];
        let found = check(&[stuck, skipped], &jobs(&[(0, held)]), &jobs(&[(0, held)]));
        assert_eq!(found.step_lost.len(), 2, "{found:?}");
        let gone = read("c", "", "", &[]);
        assert_eq!(
            check(&[gone], &StepReads::new(), &StepReads::new()).step_lost.len(),
            1,
            "an acknowledged workflow nobody knows"
        );
        // No answer cannot be judged; it is counted, and a run with one is
        // UNKNOWN, never VALID (`Verdict`): it used to pass unremarked.
        let unread = read("d", "", "unread", &[]);
        let found = check(&[unread], &StepReads::new(), &StepReads::new());
        assert_eq!((found.anomalies(), found.unread), (0, 1), "counted, not judged");
    }

    #[test]
    fn reads_after_a_workflow_read_name_its_new_jobs_and_reads_before_it_its_ended_ones() {
        // Read before: step 0 still running. The workflow, read next, made
        // step 1; read after, both are on the replicas.
        let w = read("w", "chain", "running", &[("0", "completed", 1), ("1", "created", 2)]);
        let before: &[_] = &[(1, "w", "0", "activated")];
        let after: &[_] = &[(1, "w", "0", "completed"), (2, "w", "1", "activatable")];
        let found = check(std::slice::from_ref(&w), &jobs(&[(0, before)]), &jobs(&[(0, after)]));
        assert_eq!(found.anomalies(), 0, "{found:?}");
        // Step 1's job ended before the read, and the workflow still holds it made.
        let ended: &[_] = &[(1, "w", "0", "completed"), (2, "w", "1", "completed")];
        let found = check(&[w], &jobs(&[(0, ended)]), &jobs(&[(0, ended)]));
        assert_eq!(found.step_lost.len(), 1, "{found:?}");
    }

    #[test]
    fn a_workflow_ended_against_its_steps_or_stuck_running_is_a_wrong_end() {
        let chain_done = read("a", "chain", "completed", &[("0", "completed", 1), ("1", "failed", 2)]);
        let group_stuck = read("b", "group", "running", &[("0", "completed", 3), ("1", "completed", 4)]);
        let fine = read("c", "group", "failed", &[("0", "completed", 5), ("1", "failed", 6)]);
        let held: &[_] = &[
            (1, "a", "0", "completed"),
            (2, "a", "1", "incident"),
            (3, "b", "0", "completed"),
            (4, "b", "1", "completed"),
            (5, "c", "0", "completed"),
            (6, "c", "1", "incident"),
        ];
        let found = check(&[chain_done, group_stuck, fine], &jobs(&[(0, held)]), &jobs(&[(0, held)]));
        let wrong: Vec<&str> = found.wrong_end.iter().map(|a| a.workflow.as_str()).collect();
        assert_eq!(wrong, vec!["a", "b"], "{found:?}");
    }

    #[test]
    fn a_batch_fires_what_its_outcome_calls_for_and_nothing_else() {
        let steps = [("0", "completed", 1), ("1", "failed", 2)];
        let w = read("w", "batch", "completed", &steps);
        // on_complete and on_failure are due; on_success is not.
        let held: &[_] = &[
            (1, "w", "0", "completed"),
            (2, "w", "1", "incident"),
            (3, "w", "on_complete", "completed"),
            (5, "w", "on_success", "completed"),
        ];
        let found = check(&[w], &jobs(&[(0, held)]), &jobs(&[(0, held)]));
        let lost: Vec<&str> = found.callback_lost.iter().map(|a| a.step.as_str()).collect();
        let twice: Vec<&str> = found.callback_twice.iter().map(|a| a.step.as_str()).collect();
        assert_eq!((lost, twice), (vec!["on_failure"], vec!["on_success"]));
    }
}
