//! The job API's workflows (see [`crate::core::workflow`]): each lives,
//! with every job it makes, on the partition its tenant and id hash to, so
//! its log carries the creation, every step's end and what follows it. A
//! listing reads every partition.

use std::sync::Arc;

use super::validate;
use super::ApiError;
use super::Call;
use super::JobApi;
use crate::auth::Verb;
use crate::core::workflow::{workflow_partition, Kind, Step, StepSpec, When, Workflow, WorkflowSpec};
use crate::core::{Command, CommandResult};
use crate::leaders::fanout::everywhere_as;
use crate::proto::gateway as pb;

/// The longest id a caller may give.
const MAX_ID: usize = 64;
/// A listing's default and greatest length.
const LIST_DEFAULT: u32 = 100;
const LIST_MAX: u32 = 1_000;

impl JobApi {
    /// Creates a workflow and its first jobs; answers it.
    pub async fn create_workflow(
        &self,
        call: &Call,
        request: pb::CreateWorkflowRequest,
    ) -> Result<pb::Workflow, ApiError> {
        let principal = &call.principal;
        let tenant = validate::tenant_id("tenant_id", request.tenant_id.clone())?;
        principal.require_tenant(&tenant)?;
        let spec = self.workflow_spec(request, tenant)?;
        for job_type in spec.job_types() {
            principal.require_job(Verb::Create, job_type)?;
        }
        crate::auth::audit(
            principal,
            "create_workflow",
            serde_json::json!({"id": spec.id, "tenant": spec.tenant, "kind": spec.kind.as_str()}),
        );
        let partition = workflow_partition(&spec.tenant, &spec.id, self.ctx.topology.formed_partitions);
        let max_payload_bytes = self.ctx.settings.limits.max_payload_bytes as u64;
        let command = Command::CreateWorkflow { spec: Arc::new(spec), by: principal.name.clone(), max_payload_bytes };
        let workflow = self.one_workflow(call, partition, command).await?;
        tracing::info!(
            workflow = workflow.id,
            tenant = workflow.tenant_id,
            kind = workflow.kind,
            steps = workflow.steps.len(),
            "workflow created"
        );
        Ok(workflow)
    }

    /// One workflow: NOT_FOUND too when the caller may not read one of its
    /// job types.
    pub async fn get_workflow(&self, call: &Call, request: pb::GetWorkflowRequest) -> Result<pb::Workflow, ApiError> {
        call.principal.require_some(Verb::Read)?;
        let (tenant, id) = named(call, &request.tenant_id, &request.id)?;
        let partition = workflow_partition(&tenant, &id, self.ctx.topology.formed_partitions);
        let command = Command::GetWorkflow { tenant: tenant.clone(), id: id.clone() };
        let found = self.run(call, partition, command).await;
        match found {
            Ok(CommandResult::Workflows(mut one)) if one.len() == 1 && readable(call, &one[0]) => {
                Ok(to_pb(one.remove(0), partition))
            }
            Ok(CommandResult::Workflows(_)) | Err(ApiError::NotFound(_)) => {
                Err(ApiError::NotFound(format!("no workflow {id:?} in tenant {tenant:?}")))
            }
            Ok(other) => Err(unexpected(other)),
            Err(error) => Err(error),
        }
    }

    /// The workflows of the tenants the caller acts for (or of one), whose
    /// job types it may read; newest first.
    pub async fn list_workflows(
        &self,
        call: &Call,
        request: pb::ListWorkflowsRequest,
    ) -> Result<Vec<pb::Workflow>, ApiError> {
        let principal = &call.principal;
        principal.require_some(Verb::Read)?;
        let tenants = validate::listed_tenants(principal, request.tenant_id)?;
        let limit = match request.limit {
            0 => LIST_DEFAULT,
            n => n.min(LIST_MAX),
        };
        let running = request.running;
        let command = |_| Command::ListWorkflows { tenants: tenants.clone(), running, limit };
        let mut workflows = Vec::new();
        for (partition, result) in
            everywhere_as(&self.ctx, Some(principal), command, call.deadline).await.into_iter().enumerate()
        {
            match result? {
                CommandResult::Workflows(some) => {
                    workflows.extend(some.into_iter().filter(|w| readable(call, w)).map(|w| (w, partition as u32)))
                }
                other => return Err(unexpected(other)),
            }
        }
        workflows.sort_by_key(|(w, _)| std::cmp::Reverse((w.created_at, w.spec.id.clone())));
        workflows.truncate(limit as usize);
        Ok(workflows.into_iter().map(|(w, partition)| to_pb(w, partition)).collect())
    }

    /// Cancels a running workflow; answers it.
    pub async fn cancel_workflow(
        &self,
        call: &Call,
        request: pb::GetWorkflowRequest,
    ) -> Result<pb::Workflow, ApiError> {
        // Of its job types, checked where the workflow lives.
        call.principal.require_some(Verb::Manage)?;
        let (tenant, id) = named(call, &request.tenant_id, &request.id)?;
        crate::auth::audit(&call.principal, "cancel_workflow", serde_json::json!({"id": id, "tenant": tenant}));
        let partition = workflow_partition(&tenant, &id, self.ctx.topology.formed_partitions);
        // Names this call: a resend of it after a lost answer is answered as done.
        let request = rand::random::<u64>().max(1);
        let command = Command::CancelWorkflow { tenant, id, by: call.principal.name.clone(), request };
        self.one_workflow(call, partition, command).await
    }

    /// The workflow a create or cancel answers; its steps' results and
    /// errors only for a caller who may read every job it makes.
    async fn one_workflow(&self, call: &Call, partition: u32, command: Command) -> Result<pb::Workflow, ApiError> {
        match self.run(call, partition, command).await? {
            CommandResult::Workflows(mut one) if one.len() == 1 => {
                let workflow = one.remove(0);
                let readable = readable(call, &workflow);
                let mut answer = to_pb(workflow, partition);
                if !readable {
                    for step in answer.steps.iter_mut().chain(answer.callbacks.iter_mut()) {
                        step.result.clear();
                        step.error.clear();
                    }
                }
                Ok(answer)
            }
            other => Err(unexpected(other)),
        }
    }

    /// A workflow as the engine keeps it, validated here so a mistake is
    /// answered before anything is replicated.
    fn workflow_spec(&self, request: pb::CreateWorkflowRequest, tenant: String) -> Result<WorkflowSpec, ApiError> {
        let kind = Kind::parse(&request.kind).ok_or_else(|| {
            ApiError::InvalidArgument(format!("kind {:?} is not a workflow: give chain, group or batch", request.kind))
        })?;
        let id = if request.id.is_empty() {
            crate::core::uuid_v7(crate::auth::now_ms() as i64, rand::random::<u128>())
        } else {
            valid_id(&request.id)?;
            request.id
        };
        let mut steps = Vec::with_capacity(request.steps.len());
        for (i, job) in request.steps.into_iter().enumerate() {
            steps.push(self.step_spec(job, &tenant, &format!("steps[{i}]"))?);
        }
        let mut callbacks = Vec::new();
        let given = [
            (When::Complete, request.on_complete),
            (When::Success, request.on_success),
            (When::Failure, request.on_failure),
        ];
        for (when, job) in given {
            if let Some(job) = job {
                callbacks.push((when, self.step_spec(job, &tenant, when.as_str())?));
            }
        }
        let spec = WorkflowSpec { tenant, id, name: request.name, kind, steps, callbacks };
        spec.validate().map_err(ApiError::InvalidArgument)?;
        Ok(spec)
    }

    /// One step's job, checked as a create would be.
    fn step_spec(&self, mut job: pb::CreateJobRequest, tenant: &str, what: &str) -> Result<StepSpec, ApiError> {
        if !job.idempotency_key.is_empty() || job.idempotency_window != 0 || job.run_at != 0 || job.delay != 0 {
            return Err(ApiError::InvalidArgument(format!(
                "{what}: a workflow's job takes no idempotency key, run_at or delay: the workflow makes it once, \
                 when its turn comes"
            )));
        }
        if !job.tenant_id.is_empty() && job.tenant_id != tenant {
            return Err(ApiError::InvalidArgument(format!(
                "{what}: the job's tenant_id {:?} is not the workflow's, {tenant:?}; leave it empty",
                job.tenant_id
            )));
        }
        job.tenant_id = tenant.to_string();
        job.ordering_key.clear();
        let settings = &self.ctx.settings;
        let job = validate::new_job(job, String::new(), &settings.limits, &settings.dedupe, || {
            self.ctx.gateway.next_request_id()
        })
        .map_err(|error| about(what, error))?;
        Ok(StepSpec { template: job.spec, retries: job.retries })
    }
}

/// `error` about one of a workflow's jobs, saying which.
fn about(what: &str, error: ApiError) -> ApiError {
    match error {
        ApiError::InvalidArgument(m) => ApiError::InvalidArgument(format!("{what}: {m}")),
        ApiError::ResourceExhausted(m) => ApiError::ResourceExhausted(format!("{what}: {m}")),
        other => other,
    }
}

/// A workflow's tenant (checked against the caller) and id.
fn named(call: &Call, tenant: &str, id: &str) -> Result<(String, String), ApiError> {
    let tenant = validate::tenant_id("tenant_id", tenant.to_string())?;
    call.principal.require_tenant(&tenant)?;
    valid_id(id)?;
    Ok((tenant, id.to_string()))
}

fn valid_id(id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty() && id.len() <= MAX_ID && id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    match ok {
        true => Ok(()),
        false => Err(ApiError::InvalidArgument(format!(
            "workflow id {id:?} is not valid: 1 to {MAX_ID} letters, digits, '-', '_' or '.'"
        ))),
    }
}

/// Whether the caller may read every job a workflow makes.
fn readable(call: &Call, workflow: &Workflow) -> bool {
    workflow.spec.job_types().into_iter().all(|job_type| call.principal.may(Verb::Read, job_type))
}

fn unexpected(result: CommandResult) -> ApiError {
    ApiError::Internal(format!("a workflow command was answered with {result:?}"))
}

fn step_to_pb(name: String, job_type: &str, step: Step) -> pb::WorkflowStep {
    pb::WorkflowStep {
        name,
        r#type: job_type.to_string(),
        state: step.state.as_str().into(),
        job_key: step.job.0,
        created_at: step.created_at,
        ended_at: step.ended_at,
        result: String::from_utf8_lossy(&step.result).into_owned(),
        error: step.error,
    }
}

/// A workflow as `drover.v1` gives it.
pub fn to_pb(w: Workflow, partition: u32) -> pb::Workflow {
    let (completed, failed, _) = w.counts();
    let spec = Arc::clone(&w.spec);
    let steps = w
        .steps
        .into_iter()
        .enumerate()
        .map(|(i, step)| step_to_pb(i.to_string(), &spec.steps[i].template.job_type, step))
        .collect();
    let callbacks = w
        .callbacks
        .into_iter()
        .enumerate()
        .map(|(i, step)| {
            let (when, callback) = &spec.callbacks[i];
            step_to_pb(when.as_str().into(), &callback.template.job_type, step)
        })
        .collect();
    pb::Workflow {
        id: spec.id.clone(),
        tenant_id: spec.tenant.clone(),
        kind: spec.kind.as_str().into(),
        name: spec.name.clone(),
        state: w.state.as_str().into(),
        steps,
        callbacks,
        created_at: w.created_at,
        ended_at: w.ended_at,
        created_by: w.by,
        steps_completed: completed as u32,
        steps_failed: failed as u32,
        partition_id: partition,
    }
}
