//! The job API's cron schedules (see [`crate::core::schedule`]): each lives
//! on the partition its tenant and name hash to, whose log carries its
//! registration, its pauses and every tick, so a tick makes its job once
//! whichever leader is in office. A listing reads every partition.

use std::sync::Arc;

use super::validate;
use super::ApiError;
use super::Call;
use super::JobApi;
use crate::auth::Verb;
use crate::core::schedule::{schedule_partition, valid_schedule_name, Misfire, Overlap, Timetable};
use crate::core::{Command, CommandResult, Schedule, ScheduleSpec};
use crate::leaders;
use crate::leaders::fanout::everywhere_as;
use crate::proto::gateway as pb;

impl JobApi {
    /// Registers or changes a schedule; answers it and whether it is new.
    pub async fn put_schedule(
        &self,
        call: &Call,
        request: pb::PutScheduleRequest,
    ) -> Result<pb::PutScheduleResponse, ApiError> {
        let principal = &call.principal;
        let tenant = validate::tenant_id("tenant_id", request.tenant_id.clone())?;
        principal.require_tenant(&tenant)?;
        let spec = self.schedule_spec(request, tenant)?;
        principal.require_job(Verb::Create, &spec.template.job_type)?;
        crate::auth::audit(
            principal,
            "put_schedule",
            serde_json::json!({"name": spec.name, "tenant": spec.tenant, "expression": spec.expression}),
        );
        let partition = schedule_partition(&spec.tenant, &spec.name, self.ctx.topology.formed_partitions);
        let command = Command::PutSchedule { spec: Arc::new(spec), by: principal.name.clone() };
        match self.run(call, partition, command).await? {
            CommandResult::ScheduleSet { schedule, created } => {
                tracing::info!(
                    schedule = schedule.spec.name,
                    tenant = schedule.spec.tenant,
                    expression = schedule.spec.expression,
                    created,
                    "schedule registered"
                );
                Ok(pb::PutScheduleResponse { schedule: Some(to_pb(schedule, partition)), created })
            }
            other => Err(unexpected(other)),
        }
    }

    /// One schedule, by tenant and name: NOT_FOUND too when the caller may
    /// not read its job type.
    pub async fn get_schedule(&self, call: &Call, request: pb::GetScheduleRequest) -> Result<pb::Schedule, ApiError> {
        call.principal.require_some(Verb::Read)?;
        let (tenant, name) = self.named(call, &request.tenant_id, &request.name)?;
        let partition = schedule_partition(&tenant, &name, self.ctx.topology.formed_partitions);
        let command = Command::ListSchedules { tenants: vec![tenant.clone()] };
        let CommandResult::Schedules(all) = self.run(call, partition, command).await? else {
            return Err(ApiError::Internal("a schedule read was answered with something else".into()));
        };
        let found = all.into_iter().find(|s| s.spec.name == name).filter(|s| readable(call, s));
        found
            .map(|s| to_pb(s, partition))
            .ok_or_else(|| ApiError::NotFound(format!("no schedule named {name:?} in tenant {tenant:?}")))
    }

    /// The schedules of the tenants the caller acts for (or of one), whose
    /// job types it may read; by tenant and name.
    pub async fn list_schedules(
        &self,
        call: &Call,
        request: pb::ListSchedulesRequest,
    ) -> Result<Vec<pb::Schedule>, ApiError> {
        let principal = &call.principal;
        principal.require_some(Verb::Read)?;
        let tenants = validate::listed_tenants(principal, request.tenant_id)?;
        let command = |_| Command::ListSchedules { tenants: tenants.clone() };
        let mut schedules = Vec::new();
        for (partition, result) in
            everywhere_as(&self.ctx, Some(principal), command, call.deadline).await.into_iter().enumerate()
        {
            match result? {
                CommandResult::Schedules(some) => {
                    schedules.extend(some.into_iter().filter(|s| readable(call, s)).map(|s| (s, partition as u32)))
                }
                other => return Err(unexpected(other)),
            }
        }
        schedules.sort_by(|(a, _), (b, _)| (&a.spec.tenant, &a.spec.name).cmp(&(&b.spec.tenant, &b.spec.name)));
        Ok(schedules.into_iter().map(|(s, partition)| to_pb(s, partition)).collect())
    }

    /// Deletes a schedule; answers what it was.
    pub async fn delete_schedule(
        &self,
        call: &Call,
        request: pb::GetScheduleRequest,
    ) -> Result<pb::Schedule, ApiError> {
        // Of its job type, checked where the schedule lives.
        call.principal.require_some(Verb::Create)?;
        let (tenant, name) = self.named(call, &request.tenant_id, &request.name)?;
        crate::auth::audit(&call.principal, "delete_schedule", serde_json::json!({"name": name, "tenant": tenant}));
        let partition = schedule_partition(&tenant, &name, self.ctx.topology.formed_partitions);
        let command = Command::DeleteSchedule { tenant, name };
        self.one_schedule(call, partition, command).await
    }

    /// Pauses or resumes a schedule; answers it.
    pub async fn set_schedule_paused(
        &self,
        call: &Call,
        request: pb::SetSchedulePausedRequest,
    ) -> Result<pb::Schedule, ApiError> {
        call.principal.require_some(Verb::Create)?;
        let (tenant, name) = self.named(call, &request.tenant_id, &request.name)?;
        let what = if request.paused { "pause_schedule" } else { "resume_schedule" };
        crate::auth::audit(&call.principal, what, serde_json::json!({"name": name, "tenant": tenant}));
        let partition = schedule_partition(&tenant, &name, self.ctx.topology.formed_partitions);
        let command = Command::SetSchedulePaused { tenant, name, paused: request.paused };
        self.one_schedule(call, partition, command).await
    }

    /// A schedule's tenant (checked against the caller) and name.
    fn named(&self, call: &Call, tenant: &str, name: &str) -> Result<(String, String), ApiError> {
        let tenant = validate::tenant_id("tenant_id", tenant.to_string())?;
        call.principal.require_tenant(&tenant)?;
        valid_schedule_name(name).map_err(ApiError::InvalidArgument)?;
        Ok((tenant, name.to_string()))
    }

    async fn one_schedule(&self, call: &Call, partition: u32, command: Command) -> Result<pb::Schedule, ApiError> {
        match self.run(call, partition, command).await? {
            CommandResult::Schedules(mut one) if one.len() == 1 => Ok(to_pb(one.remove(0), partition)),
            other => Err(unexpected(other)),
        }
    }

    /// `command` on `partition`, as the caller (checked again at apply).
    pub(super) async fn run(&self, call: &Call, partition: u32, command: Command) -> Result<CommandResult, ApiError> {
        let mut results =
            leaders::submit_as(&self.ctx, Some(&call.principal), partition, vec![command], call.deadline).await?;
        match results.pop() {
            Some(CommandResult::Rejected(error)) => Err(error.into()),
            Some(result) => Ok(result),
            None => Err(ApiError::Internal(format!("partition {partition} returned no result"))),
        }
    }

    /// A registration as the engine keeps it, validated here so a mistake
    /// is answered before anything is replicated.
    fn schedule_spec(&self, request: pb::PutScheduleRequest, tenant: String) -> Result<ScheduleSpec, ApiError> {
        valid_schedule_name(&request.name).map_err(ApiError::InvalidArgument)?;
        Timetable::parse(&request.expression, &request.timezone).map_err(ApiError::InvalidArgument)?;
        let overlap = Overlap::parse(&request.overlap).ok_or_else(|| {
            ApiError::InvalidArgument(format!(
                "overlap {:?} is not a policy: give skip, allow, enqueue or cancel_previous",
                request.overlap
            ))
        })?;
        let misfire = Misfire::parse(&request.misfire).ok_or_else(|| {
            ApiError::InvalidArgument(format!(
                "misfire {:?} is not a policy: give fire_once or fire_all",
                request.misfire
            ))
        })?;
        let mut job = request.job.ok_or_else(|| {
            ApiError::InvalidArgument("job is missing: the template each tick makes a job from".into())
        })?;
        let expiring = job.expires_at != 0 || job.custom_headers.contains_key(crate::core::EXPIRES_AT_HEADER);
        if !job.idempotency_key.is_empty()
            || job.idempotency_window != 0
            || job.run_at != 0
            || job.delay != 0
            || expiring
        {
            return Err(ApiError::InvalidArgument(
                "a schedule's job takes no idempotency key, run_at, delay or expires_at: each tick makes a new job \
                 at its tick"
                    .into(),
            ));
        }
        if !job.tenant_id.is_empty() && job.tenant_id != tenant {
            return Err(ApiError::InvalidArgument(format!(
                "the job's tenant_id {:?} is not the schedule's, {tenant:?}; leave it empty",
                job.tenant_id
            )));
        }
        job.tenant_id = tenant.clone();
        job.ordering_key.clear();
        let settings = &self.ctx.settings;
        let job = validate::new_job(job, String::new(), &settings.limits, &settings.dedupe, || {
            self.ctx.gateway.next_request_id()
        })?;
        let spec = ScheduleSpec {
            tenant,
            name: request.name,
            expression: request.expression.trim().to_string(),
            timezone: if request.timezone.is_empty() { "UTC".into() } else { request.timezone },
            template: job.spec,
            retries: job.retries,
            overlap,
            misfire,
            paused: request.paused,
            description: request.description,
        };
        spec.validate().map_err(ApiError::InvalidArgument)?;
        Ok(spec)
    }
}

/// Whether the caller may read the jobs a schedule makes.
fn readable(call: &Call, schedule: &Schedule) -> bool {
    call.principal.may(Verb::Read, &schedule.spec.template.job_type)
}

fn unexpected(result: CommandResult) -> ApiError {
    ApiError::Internal(format!("a schedule command was answered with {result:?}"))
}

/// A schedule as `drover.v1` gives it.
pub fn to_pb(s: Schedule, partition: u32) -> pb::Schedule {
    let t = &s.spec.template;
    let job = pb::CreateJobRequest {
        r#type: t.job_type.clone(),
        variables: String::from_utf8_lossy(&t.variables).into_owned(),
        custom_headers: t.custom_headers.iter().cloned().collect(),
        retries: Some(s.spec.retries),
        priority: t.priority,
        tenant_id: t.tenant.clone(),
        user: t.user.clone(),
        stages: t.stages.clone(),
        retry_back_off: t.retry_back_off_ms,
        required_labels: t.routing.required.clone(),
        preferred_labels: t.routing.preferred.clone(),
        ..Default::default()
    };
    pb::Schedule {
        name: s.spec.name,
        tenant_id: s.spec.tenant,
        expression: s.spec.expression,
        timezone: s.spec.timezone,
        job: Some(job),
        overlap: s.spec.overlap.as_str().into(),
        misfire: s.spec.misfire.as_str().into(),
        paused: s.spec.paused,
        description: s.spec.description,
        next_run_at: s.next_at,
        last_run_at: s.last_at,
        last_job_key: s.last_job.0,
        runs: s.runs,
        skipped: s.skipped,
        missed: s.missed,
        last_error: s.last_error,
        created_at: s.created_at,
        updated_at: s.updated_at,
        updated_by: s.by,
        partition_id: partition,
    }
}
