//! Workflows (see [`crate::core::workflow`]): creating and cancelling them,
//! and advancing each in the apply that ends one of its jobs. Every job a
//! workflow makes is on this partition, so the end of a step and what
//! follows it are one apply: no leader change repeats or loses either.

use std::sync::Arc;

use bytes::Bytes;

use super::{ApplyOutput, PartitionState};
use crate::core::workflow::{Kind, State, StepRef, StepState, Workflow, WorkflowSpec, RETAIN_MS};
use crate::core::{CommandError, CommandResult, ErrorKind, JobKey, JobState, Millis, NewJob};

/// The most workflows one partition keeps, running or finished. Finished
/// ones are forgotten [`RETAIN_MS`] after they end, or sooner, oldest
/// first, when running ones need the room.
pub const MAX_WORKFLOWS: usize = 50_000;

/// (tenant, id).
pub(super) type Name = (String, String);

/// How a completed step's error begins when its result was not kept.
const NOT_KEPT: &str = "its result is not kept";

fn name_of(spec: &WorkflowSpec) -> Name {
    (spec.tenant.clone(), spec.id.clone())
}

fn unknown(tenant: &str, id: &str) -> CommandError {
    CommandError { kind: ErrorKind::NotFound, message: format!("no workflow {id:?} in tenant {tenant:?}") }
}

impl PartitionState {
    /// Creates a workflow and its first jobs (a chain's first step, every
    /// step of a group or batch). A repeat of the same spec answers the
    /// workflow as it is now.
    pub(super) fn create_workflow(
        &mut self,
        spec: &Arc<WorkflowSpec>,
        by: &str,
        max_payload_bytes: u64,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        spec.validate().map_err(CommandError::invalid)?;
        let name = name_of(spec);
        if let Some(existing) = self.workflows.get(&name) {
            if existing.spec != *spec {
                return Err(CommandError::precondition(format!(
                    "workflow {:?} exists with other steps; a workflow's id names one workflow",
                    spec.id
                )));
            }
            return Ok(CommandResult::Workflows(vec![existing.clone()]));
        }
        if self.workflows.len() >= MAX_WORKFLOWS && !self.forget_oldest_finished(out) {
            return Err(CommandError::exhausted(format!(
                "this partition holds {MAX_WORKFLOWS} running workflows, the most it keeps; let some finish first"
            )));
        }
        let mut workflow = Workflow::new(Arc::clone(spec), by, self.clock, max_payload_bytes);
        out.workflows.push((spec.kind.as_str(), "created"));
        if spec.kind != Kind::Chain {
            for i in 0..spec.steps.len() {
                self.start_step(&mut workflow, StepRef::Step(i), out);
            }
        }
        self.advance(&mut workflow, out);
        let answer = workflow.clone();
        self.keep_workflow(workflow, out);
        Ok(CommandResult::Workflows(vec![answer]))
    }

    /// Cancels a running workflow: steps not made are never made, and
    /// jobs that wait are cancelled; a job a worker holds may finish (its
    /// end is recorded, and nothing follows it).
    pub(super) fn cancel_workflow(
        &mut self,
        tenant: &str,
        id: &str,
        by: &str,
        request: u64,
        out: &mut ApplyOutput,
    ) -> Result<CommandResult, CommandError> {
        let name = (tenant.to_string(), id.to_string());
        let Some(mut workflow) = self.workflows.remove(&name) else { return Err(unknown(tenant, id)) };
        if workflow.state == State::Cancelled && request != 0 && workflow.cancelled_by == request {
            // The resend of the cancel that took effect (its answer was lost).
            let answer = workflow.clone();
            self.workflows.insert(name, workflow);
            return Ok(CommandResult::Workflows(vec![answer]));
        }
        if workflow.state != State::Running {
            let state = workflow.state.as_str();
            self.workflows.insert(name, workflow);
            return Err(CommandError::precondition(format!("workflow {id:?} is already {state}")));
        }
        self.end_workflow(&mut workflow, State::Cancelled, out);
        workflow.cancelled_by = request;
        let why = format!("{by} (cancelling workflow {id:?})");
        let count = workflow.steps.len() + workflow.callbacks.len();
        for n in 0..count {
            let which =
                if n < workflow.steps.len() { StepRef::Step(n) } else { StepRef::Callback(n - workflow.steps.len()) };
            let now = self.clock;
            let step = workflow.step_mut(which);
            match step.state {
                StepState::Waiting => {
                    step.state = StepState::Cancelled;
                    step.ended_at = now;
                }
                StepState::Created => {
                    let key = step.job;
                    let waiting = self.jobs.get(&key).is_some_and(|job| job.state != JobState::Activated);
                    if waiting {
                        step.state = StepState::Cancelled;
                        step.ended_at = now;
                        self.step_jobs.remove(&key);
                        // Live and waiting, so the cancel succeeds.
                        let _ = self.cancel(key, &why, out);
                    }
                }
                _ => {}
            }
        }
        let answer = workflow.clone();
        self.keep_workflow(workflow, out);
        Ok(CommandResult::Workflows(vec![answer]))
    }

    /// One workflow, by tenant and id.
    pub(super) fn get_workflow(&self, tenant: &str, id: &str) -> Result<CommandResult, CommandError> {
        let name = (tenant.to_string(), id.to_string());
        match self.workflows.get(&name) {
            Some(workflow) => Ok(CommandResult::Workflows(vec![workflow.clone()])),
            None => Err(unknown(tenant, id)),
        }
    }

    /// The workflows of `tenants` ("*": every tenant's), newest first, at
    /// most `limit` (0: all), those still running only if `running`.
    pub(super) fn list_workflows(&self, tenants: &[String], running: bool, limit: u32) -> Vec<Workflow> {
        let every = tenants.iter().any(|t| t == "*");
        let mut found: Vec<&Workflow> = self
            .workflows
            .iter()
            .filter(|((tenant, _), w)| (every || tenants.contains(tenant)) && (!running || w.state == State::Running))
            .map(|(_, w)| w)
            .collect();
        found.sort_by_key(|w| std::cmp::Reverse((w.created_at, w.spec.id.clone())));
        if limit > 0 {
            found.truncate(limit as usize);
        }
        found.into_iter().cloned().collect()
    }

    /// The workflows as stored.
    pub fn workflow_records(&self) -> Vec<Workflow> {
        self.workflows.values().cloned().collect()
    }

    /// A workflow as stored, by tenant and id.
    pub fn workflow_record(&self, tenant: &str, id: &str) -> Option<&Workflow> {
        self.workflows.get(&(tenant.to_string(), id.to_string()))
    }

    /// Restores stored workflows and the index of their live jobs.
    pub(super) fn restore_workflows(&mut self, records: Vec<Workflow>) {
        for workflow in records {
            let name = name_of(&workflow.spec);
            for (which, step) in workflow.each().filter(|(_, s)| s.state == StepState::Created) {
                self.step_jobs.insert(step.job, (name.clone(), which));
            }
            if workflow.state != State::Running {
                self.retired.insert((workflow.ended_at, name.clone()));
            }
            self.workflows.insert(name, workflow);
        }
    }

    /// Records the end of a job, if it is a workflow's step that had not
    /// ended, and advances its workflow. `result` is a completed job's.
    pub(super) fn step_ended(
        &mut self,
        key: JobKey,
        state: StepState,
        result: &Bytes,
        error: &str,
        out: &mut ApplyOutput,
    ) {
        if self.step_jobs.is_empty() {
            return;
        }
        let Some((name, which)) = self.step_jobs.remove(&key) else { return };
        let Some(mut workflow) = self.workflows.remove(&name) else { return };
        let now = self.clock;
        // The results a workflow keeps are bounded by what one job may
        // carry: a step after one not kept fails, saying why.
        let kept: usize = workflow.each().map(|(_, s)| s.result.len()).sum();
        let limit = workflow.max_payload_bytes;
        let fits = limit == 0 || (kept + result.len()) as u64 <= limit;
        match workflow.get_mut(which) {
            Some(step) if step.state == StepState::Created && step.job == key => {
                step.state = state;
                step.ended_at = now;
                step.error = error.to_string();
                if fits {
                    step.result = result.clone();
                } else {
                    step.error = format!(
                        "{NOT_KEPT}: with the results kept before it, the workflow's would take {} bytes, more than \
                         the {limit} a job may carry",
                        kept + result.len()
                    );
                }
            }
            // Not this workflow's job (an index entry left behind): nothing to record.
            _ => {
                self.workflows.insert(name, workflow);
                return;
            }
        }
        self.advance(&mut workflow, out);
        self.keep_workflow(workflow, out);
    }

    /// Cancels a step's job coming back to wait (its worker died, it timed
    /// out or failed with retries left) when its workflow has ended (was
    /// cancelled while a worker held the job): nothing follows it, and it
    /// must not run again. Answers whether it did.
    pub(super) fn cancel_if_workflow_ended(&mut self, key: JobKey, out: &mut ApplyOutput) -> bool {
        let Some((name, which)) = self.step_jobs.get(&key).cloned() else { return false };
        let Some(mut workflow) = self.workflows.remove(&name) else { return false };
        if workflow.state == State::Running {
            self.workflows.insert(name, workflow);
            return false;
        }
        self.step_jobs.remove(&key);
        let now = self.clock;
        if let Some(step) = workflow.get_mut(which).filter(|s| s.state == StepState::Created && s.job == key) {
            step.state = StepState::Cancelled;
            step.ended_at = now;
        }
        let why = format!("its workflow {:?} ({})", workflow.spec.id, workflow.state.as_str());
        self.keep_workflow(workflow, out);
        // Live (the caller is making it ready), so the cancel succeeds.
        let _ = self.cancel(key, &why, out);
        true
    }

    /// Forgets finished workflows whose retention ran out.
    pub(super) fn forget_workflows(&mut self, out: &mut ApplyOutput) {
        let now = self.clock;
        while let Some((ended, _)) = self.retired.first() {
            if ended.saturating_add(RETAIN_MS) > now {
                break;
            }
            let (_, name) = self.retired.pop_first().expect("just looked");
            self.forget(name, out);
        }
    }

    /// Forgets a finished workflow, and the index entries of any job of it
    /// a worker still holds (that job's end is nobody's step now).
    fn forget(&mut self, name: Name, out: &mut ApplyOutput) {
        if let Some(workflow) = self.workflows.remove(&name) {
            for (_, step) in workflow.each().filter(|(_, s)| s.state == StepState::Created) {
                self.step_jobs.remove(&step.job);
            }
        }
        out.workflows_changed.push(name);
    }

    /// Forgets the finished workflow that ended first, to make room;
    /// answers whether there was one.
    fn forget_oldest_finished(&mut self, out: &mut ApplyOutput) -> bool {
        let Some((_, name)) = self.retired.pop_first() else { return false };
        self.forget(name, out);
        true
    }

    /// Puts a workflow (back) in memory, to be stored.
    fn keep_workflow(&mut self, workflow: Workflow, out: &mut ApplyOutput) {
        let name = name_of(&workflow.spec);
        if workflow.state != State::Running {
            self.retired.insert((workflow.ended_at, name.clone()));
        }
        self.workflows.insert(name.clone(), workflow);
        out.workflows_changed.push(name);
    }

    fn end_workflow(&mut self, workflow: &mut Workflow, state: State, out: &mut ApplyOutput) {
        workflow.state = state;
        workflow.ended_at = self.clock;
        out.workflows.push((workflow.spec.kind.as_str(), state.as_str()));
    }

    /// Makes the job of a waiting step. A create the partition refuses (a
    /// schema the template fails) fails the step at once.
    fn start_step(&mut self, workflow: &mut Workflow, which: StepRef, out: &mut ApplyOutput) {
        let spec = Arc::clone(&workflow.spec);
        let parents = match which {
            StepRef::Step(i) if spec.kind == Kind::Chain && i > 0 => Some(workflow.results(i)),
            StepRef::Callback(_) => Some(workflow.results(workflow.steps.len())),
            StepRef::Step(_) => None,
        };
        let retries = match which {
            StepRef::Step(i) => spec.steps[i].retries,
            StepRef::Callback(i) => spec.callbacks[i].1.retries,
        };
        let made = spec.job_for(which, parents.as_deref());
        let size = made.variables.len() + made.custom_headers.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        let upto = match which {
            StepRef::Step(i) => i,
            StepRef::Callback(_) => workflow.steps.len(),
        };
        let dropped = parents.is_some() && workflow.steps[..upto].iter().any(|s| s.error.starts_with(NOT_KEPT));
        if dropped || (workflow.max_payload_bytes > 0 && size as u64 > workflow.max_payload_bytes) {
            let now = self.clock;
            let error = format!(
                "its variables with the results before it (parent_results) take {} bytes, more than the {} a \
                 job may have: pass references to large results instead",
                if dropped { "more".to_string() } else { size.to_string() },
                workflow.max_payload_bytes
            );
            let step = workflow.step_mut(which);
            step.created_at = now;
            step.state = StepState::Failed;
            step.ended_at = now;
            step.error = error;
            return;
        }
        let job =
            NewJob { spec: Arc::new(made), retries, run_at: None, delay_ms: 0, request: None, dedupe_window_ms: 0 };
        let now: Millis = self.clock;
        let made = self.create(&job, out);
        let step = workflow.step_mut(which);
        step.created_at = now;
        match made {
            Ok(CommandResult::Created { key, .. }) => {
                step.job = key;
                if self.jobs.contains_key(&key) {
                    step.state = StepState::Created;
                    self.step_jobs.insert(key, (name_of(&spec), which));
                } else {
                    // Ended as it was made: an expiry already past.
                    step.state = StepState::Failed;
                    step.ended_at = now;
                    step.error = "expired when it was made".into();
                }
            }
            Ok(other) => {
                step.state = StepState::Failed;
                step.ended_at = now;
                step.error = format!("the create was answered with {other:?}");
            }
            Err(error) => {
                step.state = StepState::Failed;
                step.ended_at = now;
                step.error = error.message;
            }
        }
    }

    /// Does what a running workflow's steps call for next, until it waits
    /// for a job or ends. Reads only the workflow's recorded states, so
    /// running it again changes nothing.
    fn advance(&mut self, workflow: &mut Workflow, out: &mut ApplyOutput) {
        while workflow.state == State::Running {
            match workflow.spec.kind {
                Kind::Chain => {
                    if workflow.steps.iter().any(|s| matches!(s.state, StepState::Failed | StepState::Cancelled)) {
                        let now = self.clock;
                        for step in workflow.steps.iter_mut().filter(|s| s.state == StepState::Waiting) {
                            step.state = StepState::Cancelled;
                            step.ended_at = now;
                        }
                        self.end_workflow(workflow, State::Failed, out);
                        return;
                    }
                    match workflow.steps.iter().position(|s| s.state != StepState::Completed) {
                        None => self.end_workflow(workflow, State::Completed, out),
                        Some(i) if workflow.steps[i].state == StepState::Waiting => {
                            self.start_step(workflow, StepRef::Step(i), out)
                        }
                        Some(_) => return,
                    }
                }
                Kind::Group | Kind::Batch => {
                    let (completed, _, ended) = workflow.counts();
                    if ended < workflow.steps.len() {
                        return;
                    }
                    let all_completed = completed == workflow.steps.len();
                    let mut fired = false;
                    for i in 0..workflow.callbacks.len() {
                        if workflow.callbacks[i].state != StepState::Waiting {
                            fired |= workflow.callbacks[i].state != StepState::Skipped;
                            continue;
                        }
                        if workflow.spec.callbacks[i].0.fires(all_completed) {
                            fired = true;
                            self.start_step(workflow, StepRef::Callback(i), out);
                        } else {
                            workflow.callbacks[i].state = StepState::Skipped;
                            workflow.callbacks[i].ended_at = self.clock;
                        }
                    }
                    if workflow.callbacks.iter().any(|c| !c.state.ended()) {
                        return;
                    }
                    let callback_failed = workflow.callbacks.iter().any(|c| c.state == StepState::Failed);
                    // A batch whose callbacks ran ends by them (OJS); one
                    // that fired none ends, like a group, by its steps.
                    let state = match (callback_failed, fired, all_completed) {
                        (true, _, _) => State::Failed,
                        (false, true, _) | (false, false, true) => State::Completed,
                        (false, false, false) => State::Failed,
                    };
                    self.end_workflow(workflow, state, out);
                }
            }
        }
    }
}
