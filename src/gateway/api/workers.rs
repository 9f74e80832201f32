//! The job API's worker sessions, job schemas and the cluster's shape: who
//! may register, beat, end, list and direct sessions, and set and read schemas.
//! What a session is and how its commands reach every partition is
//! [`super::sessions`]'s.

use super::sessions;
use super::ApiError;
use super::Call;
use super::JobApi;
use crate::auth::{Verb, CLUSTER_READ, WORKERS_MANAGE};
use crate::core::JobKey;
use crate::proto::gateway as pb;

/// A job token a heartbeat renews lasts this long (plus the grace every job
/// token has): many beats, so one lost beat does not let it lapse.
const HEARTBEAT_JOB_TOKEN_MS: i64 = 30_000;

impl JobApi {
    pub async fn register_worker(
        &self,
        call: &Call,
        request: pb::RegisterWorkerRequest,
    ) -> Result<pb::RegisterWorkerResponse, ApiError> {
        self.register_checked(call, request, None).await
    }

    /// [`Self::register_worker`] under a session id the caller derived (an
    /// OJS worker's, from its principal, tenant and worker id); a repeat
    /// renews the session's lease.
    pub(crate) async fn register_worker_as(
        &self,
        call: &Call,
        request: pb::RegisterWorkerRequest,
        session: u64,
    ) -> Result<pb::RegisterWorkerResponse, ApiError> {
        self.register_checked(call, request, Some(session)).await
    }

    async fn register_checked(
        &self,
        call: &Call,
        request: pb::RegisterWorkerRequest,
        session: Option<u64>,
    ) -> Result<pb::RegisterWorkerResponse, ApiError> {
        let principal = &call.principal;
        principal.require_some(Verb::Work)?;
        for job_type in &request.job_types {
            principal.require_job(Verb::Work, job_type)?;
        }
        principal.require_tenants(&request.tenant_ids)?;
        sessions::register(&self.ctx, principal, request, session, call.deadline).await
    }

    pub async fn heartbeat(
        &self,
        call: &Call,
        request: pb::HeartbeatRequest,
    ) -> Result<pb::HeartbeatResponse, ApiError> {
        call.principal.require_some(Verb::Work)?;
        sessions::check_owner(&self.ctx, &call.principal, request.session_id, call.deadline).await?;
        let held: Vec<(u64, u32)> = request.jobs.iter().map(|j| (j.key, j.attempt)).collect();
        let sessions::Beaten { response: mut answer, renewed } =
            sessions::heartbeat(&self.ctx, &call.principal, request, call.deadline).await?;
        if self.ctx.auth.mints_job_tokens() {
            // Jobs the session holds get tokens that outlast the next few
            // beats; a listed job it does not hold gets none, so a beat cannot
            // mint a token for someone else's job.
            let until = (crate::auth::now_ms() as i64).saturating_add(HEARTBEAT_JOB_TOKEN_MS);
            answer.job_tokens = held
                .into_iter()
                .filter(|(key, _)| renewed.contains(&JobKey(*key)))
                .map(|(key, attempt)| pb::HeldJobToken {
                    key,
                    attempt,
                    token: self.ctx.auth.job_token(key, attempt, until),
                })
                .collect();
        }
        Ok(answer)
    }

    pub async fn deregister_worker(&self, call: &Call, request: pb::DeregisterWorkerRequest) -> Result<(), ApiError> {
        call.principal.require_some(Verb::Work)?;
        sessions::check_owner(&self.ctx, &call.principal, request.session_id, call.deadline).await?;
        sessions::deregister(&self.ctx, &call.principal, request.session_id, call.deadline).await
    }

    /// The live sessions that take jobs of the caller's tenants.
    pub async fn list_workers(
        &self,
        call: &Call,
        request: pb::ListWorkersRequest,
    ) -> Result<Vec<pb::WorkerSession>, ApiError> {
        let principal = &call.principal;
        if !principal.has(WORKERS_MANAGE) {
            principal.require(CLUSTER_READ)?;
        }
        let mut workers = sessions::list(&self.ctx, &request.label, call.deadline).await?;
        // Sessions that take jobs of the principal's tenants only.
        workers.retain(|w| principal.shares_tenant(&w.tenant_ids));
        // A session's id is what its worker acts as: shown only to those who
        // may direct it (workers:manage over every tenant it serves).
        for worker in &mut workers {
            if !(principal.has(WORKERS_MANAGE) && principal.require_tenants(&worker.tenant_ids).is_ok()) {
                worker.session_id = 0;
            }
        }
        Ok(workers)
    }

    pub async fn set_worker_state(
        &self,
        call: &Call,
        request: pb::SetWorkerStateRequest,
    ) -> Result<Vec<pb::WorkerSession>, ApiError> {
        let principal = &call.principal;
        principal.require(WORKERS_MANAGE)?;
        crate::auth::audit(
            principal,
            "set_worker_state",
            serde_json::json!({"session": request.session_id, "label": request.label, "all": request.all, "state": request.state}),
        );
        if principal.in_tenant("*") {
            return sessions::direct(&self.ctx, principal, request, call.deadline).await;
        }
        // Only sessions of the principal's own tenants, each by its id.
        if request.all {
            return Err(ApiError::PermissionDenied(format!(
                "all=true directs every tenant's workers, which needs tenant \"*\"; {} may direct only its \
                 tenants' sessions: name a label or a session",
                principal.name
            )));
        }
        if (request.session_id == 0) == request.label.is_empty() {
            return Err(ApiError::InvalidArgument(
                "name exactly one of session_id, label and all: which workers to direct".into(),
            ));
        }
        if crate::core::WorkerState::parse(&request.state).is_none() {
            return Err(ApiError::InvalidArgument(format!(
                "state must be running, quiet or terminate, got {:?}",
                request.state
            )));
        }
        let mut targets = sessions::list(&self.ctx, &request.label, call.deadline).await?;
        targets.retain(|w| {
            principal.require_tenants(&w.tenant_ids).is_ok()
                && (request.session_id == 0 || w.session_id == request.session_id)
        });
        if request.session_id != 0 && targets.is_empty() {
            return Err(ApiError::NotFound(format!("no live worker session {:x}", request.session_id)));
        }
        let mut directed = Vec::new();
        for target in targets {
            let one = pb::SetWorkerStateRequest {
                session_id: target.session_id,
                label: String::new(),
                all: false,
                state: request.state.clone(),
            };
            directed.extend(sessions::direct(&self.ctx, principal, one, call.deadline).await?);
        }
        Ok(directed)
    }

    pub async fn set_schema(&self, call: &Call, request: pb::SetSchemaRequest) -> Result<(), ApiError> {
        let principal = &call.principal;
        principal.require_job(Verb::Manage, &request.r#type)?;
        crate::auth::audit(
            principal,
            "set_schema",
            serde_json::json!({"type": request.r#type, "bytes": request.schema.len()}),
        );
        sessions::set_schema(&self.ctx, &call.principal, request, call.deadline).await
    }

    pub async fn get_schema(&self, call: &Call, request: pb::GetSchemaRequest) -> Result<String, ApiError> {
        let principal = &call.principal;
        let job_type = request.r#type;
        if !principal.may(Verb::Create, &job_type) {
            principal.require_job(Verb::Read, &job_type)?;
        }
        sessions::get_schema(&self.ctx, job_type, call.deadline).await
    }

    /// The cluster's shape: any principal may read it (clients read it to
    /// connect).
    pub async fn topology(&self, _call: &Call) -> pb::TopologyResponse {
        let topology = &self.ctx.topology;
        pb::TopologyResponse {
            brokers: super::status::cluster_status(&self.ctx).await,
            cluster_size: topology.cluster_size(),
            partitions_count: topology.partition_count(),
            replication_factor: topology.replication_factor,
            gateway_node_id: topology.node_id,
            cluster_version: u32::from(self.ctx.transport.peers.versions().cluster_version()),
        }
    }
}
