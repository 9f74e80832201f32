//! Workflows: a chain (steps one after another, each given its
//! predecessors' results), a group (steps side by side) or a batch (a group
//! with callbacks fired by the outcome of its steps).
//!
//! A workflow lives on one partition, its **home**, chosen by its tenant and
//! id, and every job it makes lives there too. So the apply of the entry
//! that ends a step's job is the one that records the end and advances the
//! workflow (creates the next step, fires a callback, ends the workflow):
//! whichever leader is in office, and however often leaders change, each
//! step's job is made once, each end is recorded once and each callback
//! fires once. Workflows spread over the cluster by id; one workflow's jobs
//! do not (see `docs/workflows.md` for the trade).
//!
//! This module owns the model and its rules; the engine's `workflows`
//! applies them. Data version [`WORKFLOWS`] on.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::ids::{JobKey, Millis};
use super::job::JobSpec;

/// The data version from which workflows exist: their commands travel, and
/// snapshots holding workflows are written at this version or later.
pub const WORKFLOWS: u16 = 13;

/// The custom header naming the workflow that made a job.
pub const WORKFLOW_HEADER: &str = "drover.workflow";
/// The custom header naming the step (its index, or a callback's name).
pub const STEP_HEADER: &str = "drover.step";
/// The variable a step's job finds its predecessors' results in.
pub const PARENT_RESULTS: &str = "parent_results";

/// The most steps (jobs, for a group or batch) one workflow has.
pub const MAX_STEPS: usize = 256;
/// The longest workflow name.
pub const MAX_NAME: usize = 200;
/// How long a finished workflow stays readable before its partition forgets it.
pub const RETAIN_MS: Millis = 24 * 3_600_000;

/// What a workflow does with its steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// One after another; a step that does not complete stops the chain.
    Chain,
    /// All at once; the group ends when every step ended.
    Group,
    /// A group with callbacks, fired once every step ended.
    Batch,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Chain => "chain",
            Kind::Group => "group",
            Kind::Batch => "batch",
        }
    }
    pub fn parse(name: &str) -> Option<Kind> {
        match name {
            "chain" => Some(Kind::Chain),
            "group" => Some(Kind::Group),
            "batch" => Some(Kind::Batch),
            _ => None,
        }
    }
}

/// When a batch's callback fires (OJS's firing matrix).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum When {
    /// Every step ended, whatever their outcome.
    Complete,
    /// Every step completed.
    Success,
    /// Every step ended and one did not complete.
    Failure,
}

impl When {
    pub fn as_str(self) -> &'static str {
        match self {
            When::Complete => "on_complete",
            When::Success => "on_success",
            When::Failure => "on_failure",
        }
    }
    pub fn parse(name: &str) -> Option<When> {
        match name {
            "on_complete" | "complete" => Some(When::Complete),
            "on_success" | "success" => Some(When::Success),
            "on_failure" | "failure" => Some(When::Failure),
            _ => None,
        }
    }
    /// Whether it fires for steps that all completed (`all_completed`) or not.
    pub fn fires(self, all_completed: bool) -> bool {
        match self {
            When::Complete => true,
            When::Success => all_completed,
            When::Failure => !all_completed,
        }
    }
}

/// One job a workflow makes: its spec (tenant the workflow's) and retries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepSpec {
    pub template: Arc<JobSpec>,
    pub retries: i32,
}

/// What a user creates.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkflowSpec {
    pub tenant: String,
    /// A UUIDv7, made by the gateway.
    pub id: String,
    pub name: String,
    pub kind: Kind,
    pub steps: Vec<StepSpec>,
    /// A batch's callbacks, at most one of each kind.
    pub callbacks: Vec<(When, StepSpec)>,
}

/// Where a step stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepState {
    /// Not made yet (a chain's later steps; a callback not yet due).
    #[default]
    Waiting,
    /// Its job exists and has not ended.
    Created,
    Completed,
    /// Its job ended otherwise: an incident (retries used up), expired or
    /// cancelled by someone else than the workflow.
    Failed,
    /// Never made, or cancelled, because the workflow stopped.
    Cancelled,
    /// A callback the outcome did not call for.
    Skipped,
}

impl StepState {
    pub fn as_str(self) -> &'static str {
        match self {
            StepState::Waiting => "waiting",
            StepState::Created => "created",
            StepState::Completed => "completed",
            StepState::Failed => "failed",
            StepState::Cancelled => "cancelled",
            StepState::Skipped => "skipped",
        }
    }
    pub fn ended(self) -> bool {
        matches!(self, StepState::Completed | StepState::Failed | StepState::Cancelled | StepState::Skipped)
    }
}

/// A step (or callback) as its workflow keeps it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Step {
    pub state: StepState,
    /// Its job, once made (0: none).
    pub job: JobKey,
    pub created_at: Millis,
    pub ended_at: Millis,
    /// A completed step's result (its job's result variables).
    pub result: Bytes,
    /// Why a failed step failed.
    pub error: String,
}

/// Where a workflow stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Completed => "completed",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
        }
    }
}

/// A workflow as its home partition keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workflow {
    pub spec: Arc<WorkflowSpec>,
    pub by: String,
    pub created_at: Millis,
    /// When it reached its final state (0: running).
    pub ended_at: Millis,
    pub state: State,
    /// One per step of the spec, in order.
    pub steps: Vec<Step>,
    /// One per callback of the spec, in order.
    pub callbacks: Vec<Step>,
    /// The largest variables (and headers) a job it makes may have: a
    /// step whose predecessors' results would make more fails instead.
    pub max_payload_bytes: u64,
    /// The request that cancelled it (0: none), so that its resend is
    /// answered as done rather than refused.
    pub cancelled_by: u64,
}

/// Which of a workflow's jobs a job is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepRef {
    Step(usize),
    Callback(usize),
}

impl WorkflowSpec {
    /// The bytes this spec takes when encoded, within a few.
    pub fn encoded_len(&self) -> usize {
        let steps: usize = self.steps.iter().map(|s| s.template.encoded_len() + 8).sum();
        let callbacks: usize = self.callbacks.iter().map(|(_, s)| s.template.encoded_len() + 12).sum();
        [&self.tenant, &self.id, &self.name].iter().map(|s| 8 + s.len()).sum::<usize>() + steps + callbacks + 24
    }

    /// Checks what the engine needs of a spec.
    pub fn validate(&self) -> Result<(), String> {
        if self.id.is_empty() || self.id.len() > 64 {
            return Err("a workflow's id is 1 to 64 bytes".into());
        }
        if self.name.len() > MAX_NAME {
            return Err(format!("a workflow's name is at most {MAX_NAME} bytes"));
        }
        if self.steps.is_empty() {
            return Err(format!("a {} needs at least one step", self.kind.as_str()));
        }
        if self.steps.len() > MAX_STEPS {
            return Err(format!("a workflow has at most {MAX_STEPS} steps; this one has {}", self.steps.len()));
        }
        if self.kind != Kind::Batch && !self.callbacks.is_empty() {
            return Err(format!("a {} takes no callbacks: only a batch does", self.kind.as_str()));
        }
        for (i, (when, _)) in self.callbacks.iter().enumerate() {
            if self.callbacks[..i].iter().any(|(w, _)| w == when) {
                return Err(format!("the callback {} is given twice", when.as_str()));
            }
        }
        let all = self.steps.iter().chain(self.callbacks.iter().map(|(_, s)| s));
        for step in all {
            if step.template.tenant != self.tenant {
                return Err("a workflow's jobs belong to the workflow's tenant".into());
            }
            if !step.template.idempotency_key.is_empty() {
                return Err("a workflow's jobs take no idempotency key: the workflow makes each once".into());
            }
            if step.retries < 0 {
                return Err("retries must be zero or more".into());
            }
        }
        Ok(())
    }

    /// Every job type the workflow makes, without repeats.
    pub fn job_types(&self) -> Vec<&str> {
        let mut types: Vec<&str> = Vec::new();
        for step in self.steps.iter().chain(self.callbacks.iter().map(|(_, s)| s)) {
            if !types.contains(&step.template.job_type.as_str()) {
                types.push(&step.template.job_type);
            }
        }
        types
    }

    /// The spec of step (or callback) `which`'s job: its template, with the
    /// headers naming the workflow and the step, and `parent_results` (JSON
    /// values, in step order) among its variables when given.
    pub fn job_for(&self, which: StepRef, parent_results: Option<&[Bytes]>) -> JobSpec {
        let (template, step) = match which {
            StepRef::Step(i) => (&self.steps[i].template, i.to_string()),
            StepRef::Callback(i) => (&self.callbacks[i].1.template, self.callbacks[i].0.as_str().to_string()),
        };
        let mut spec = JobSpec::clone(template);
        spec.custom_headers.retain(|(name, _)| name != WORKFLOW_HEADER && name != STEP_HEADER);
        spec.custom_headers.push((WORKFLOW_HEADER.to_string(), self.id.clone()));
        spec.custom_headers.push((STEP_HEADER.to_string(), step));
        if let Some(results) = parent_results {
            spec.variables = with_parent_results(&spec.variables, results);
        }
        spec
    }
}

/// `variables` (a JSON object) with [`PARENT_RESULTS`] set to `results`, each
/// a JSON value (an empty one is `null`).
fn with_parent_results(variables: &[u8], results: &[Bytes]) -> Bytes {
    let mut object = match serde_json::from_slice::<serde_json::Value>(variables) {
        Ok(serde_json::Value::Object(object)) => object,
        _ => serde_json::Map::new(),
    };
    let results = results
        .iter()
        .map(|r| serde_json::from_slice(r).unwrap_or(serde_json::Value::Null))
        .collect::<Vec<serde_json::Value>>();
    object.insert(PARENT_RESULTS.to_string(), serde_json::Value::Array(results));
    Bytes::from(serde_json::Value::Object(object).to_string())
}

impl Workflow {
    /// A new workflow, every step waiting.
    pub fn new(spec: Arc<WorkflowSpec>, by: &str, now: Millis, max_payload_bytes: u64) -> Self {
        Workflow {
            max_payload_bytes,
            cancelled_by: 0,
            steps: vec![Step::default(); spec.steps.len()],
            callbacks: vec![Step::default(); spec.callbacks.len()],
            spec,
            by: by.to_string(),
            created_at: now,
            ended_at: 0,
            state: State::Running,
        }
    }

    pub fn step(&self, which: StepRef) -> &Step {
        match which {
            StepRef::Step(i) => &self.steps[i],
            StepRef::Callback(i) => &self.callbacks[i],
        }
    }

    pub fn step_mut(&mut self, which: StepRef) -> &mut Step {
        match which {
            StepRef::Step(i) => &mut self.steps[i],
            StepRef::Callback(i) => &mut self.callbacks[i],
        }
    }

    /// The step `which`, if this workflow has it.
    pub fn get_mut(&mut self, which: StepRef) -> Option<&mut Step> {
        match which {
            StepRef::Step(i) => self.steps.get_mut(i),
            StepRef::Callback(i) => self.callbacks.get_mut(i),
        }
    }

    /// Every step and callback, with which it is.
    pub fn each(&self) -> impl Iterator<Item = (StepRef, &Step)> {
        let steps = self.steps.iter().enumerate().map(|(i, s)| (StepRef::Step(i), s));
        steps.chain(self.callbacks.iter().enumerate().map(|(i, s)| (StepRef::Callback(i), s)))
    }

    /// Steps (not callbacks) in each state: (completed, failed, ended).
    pub fn counts(&self) -> (usize, usize, usize) {
        let count = |state| self.steps.iter().filter(|s| s.state == state).count();
        let ended = self.steps.iter().filter(|s| s.state.ended()).count();
        (count(StepState::Completed), count(StepState::Failed), ended)
    }

    /// The results of every step so far, in order (an empty result for a
    /// step without one).
    pub fn results(&self, upto: usize) -> Vec<Bytes> {
        self.steps[..upto].iter().map(|s| s.result.clone()).collect()
    }
}

/// The partition a workflow lives on: by its tenant and id, like a
/// schedule's by its name.
pub fn workflow_partition(tenant: &str, id: &str, partitions: u32) -> super::ids::PartitionId {
    let hash = super::ids::StableHash::new().part(b"workflow").part(tenant.as_bytes()).part(id.as_bytes());
    (hash.finish() % u64::from(partitions.max(1))) as super::ids::PartitionId
}
