//! Authorization at apply: a command carried with its principal
//! ([`Command::As`]) is judged against the job or session it acts on, as
//! this replica holds them at this point of the log. Every replica holds
//! the same there, so every replica decides alike, and no command acts on a
//! job whose owner the deciding node did not yet know.

use super::{ApplyOutput, PartitionState};
use crate::core::principal::{AuthError, Principal, Verb, WORKERS_MANAGE};
use crate::core::{Command, CommandError, ErrorKind, EventKind, JobKey, SessionId, SessionTarget};

impl PartitionState {
    /// Whether `by` may run `command` here and now. A job of a tenant `by`
    /// does not act for is NOT_FOUND, as if it did not exist; a missing
    /// scope, or a session of another tenant, is PERMISSION_DENIED.
    pub(super) fn authorize(&self, by: &Principal, command: &Command) -> Result<(), CommandError> {
        if let Some((key, attempt, verb)) = command.acts_on() {
            return self.may_act_on(by, verb, key, attempt).map_err(refusal);
        }
        let verdict = match command {
            // Judged above by their entry in `Command::acts_on`; one missing
            // there is refused, never let through.
            Command::Complete { .. }
            | Command::CompleteGuarded { .. }
            | Command::Fail { .. }
            | Command::FailByPolicy { .. }
            | Command::UpdateTimeout { .. }
            | Command::Checkpoint { .. }
            | Command::UpdateRetries { .. }
            | Command::Cancel { .. } => {
                Err(AuthError::PermissionDenied("a command on a job that names no job it acts on".into()))
            }
            Command::Create(job) => {
                by.require_tenant(&job.spec.tenant).and_then(|()| by.require_job(Verb::Create, &job.spec.job_type))
            }
            // Of a session, only an owned one's owner is judged here: the
            // tenant check for a session was the gateway's alone before data
            // version 9, and entries of then apply as they did.
            Command::Activate(activation) => by
                .require_tenants(&activation.tenants)
                .and_then(|()| by.require_job(Verb::Work, &activation.job_type))
                .and_then(|()| self.may_act_as_owned(by, activation.session)),
            Command::Register(info) | Command::RegisterOwned(info) => {
                by.require_tenants(&info.tenants).and_then(|()| {
                    by.require_some(Verb::Work)?;
                    info.job_types.iter().try_for_each(|job_type| by.require_job(Verb::Work, job_type))?;
                    // A repeat renews the session's lease: its owner's to send.
                    self.may_act_as_owned(by, info.id)
                })
            }
            Command::ActAs { session } => self.may_act_as(by, *session),
            Command::Beat { session, .. } | Command::EndSession { session } => {
                self.may_act_as(by, *session).and_then(|()| by.require_some(Verb::Work))
            }
            Command::Direct { target, .. } => by.require(WORKERS_MANAGE).and_then(|()| match target {
                SessionTarget::One(session) => self.may_act_as(by, *session),
                // Every session with a label, or every session: every tenant's.
                SessionTarget::Label(_) | SessionTarget::All => by.require_tenant("*"),
            }),
            Command::SetSchema { job_type, .. } => by.require_job(Verb::Manage, job_type),
            Command::GetSchema { job_type } => by.require_job(Verb::Read, job_type),
            Command::ListSessions => Ok(()),
            Command::SetPaused { tenant, job_type, .. } => {
                by.require_tenant(tenant).and_then(|()| by.require_job(Verb::Manage, job_type))
            }
            // Every queue: the gateway keeps those of the types `by` may read.
            Command::QueueStats { tenants, job_type } if job_type.is_empty() => {
                by.require_tenants(tenants).and_then(|()| by.require_some(Verb::Read))
            }
            Command::QueueStats { tenants, job_type } => {
                by.require_tenants(tenants).and_then(|()| by.require_job(Verb::Read, job_type))
            }
            // A schedule makes jobs of its type in its tenant: whoever may
            // create them may schedule them.
            Command::PutSchedule { spec, .. } => {
                by.require_tenant(&spec.tenant).and_then(|()| by.require_job(Verb::Create, &spec.template.job_type))
            }
            Command::DeleteSchedule { tenant, name } | Command::SetSchedulePaused { tenant, name, .. } => {
                by.require_tenant(tenant).and_then(|()| match self.schedule_type(tenant, name) {
                    Some(job_type) => by.require_job(Verb::Create, job_type),
                    None => Ok(()),
                })
            }
            // The gateway keeps those of the types `by` may read.
            Command::ListSchedules { tenants } => {
                by.require_tenants(tenants).and_then(|()| by.require_some(Verb::Read))
            }
            // A workflow makes jobs of every type its steps name: whoever may
            // create them all may create it.
            Command::CreateWorkflow { spec, .. } => by.require_tenant(&spec.tenant).and_then(|()| {
                spec.job_types().into_iter().try_for_each(|job_type| by.require_job(Verb::Create, job_type))
            }),
            // Cancelling one cancels its jobs: as cancelling each of them does.
            Command::CancelWorkflow { tenant, id, .. } => {
                by.require_tenant(tenant).and_then(|()| match self.workflow_record(tenant, id) {
                    Some(workflow) => workflow
                        .spec
                        .job_types()
                        .into_iter()
                        .try_for_each(|job_type| by.require_job(Verb::Manage, job_type)),
                    None => Ok(()),
                })
            }
            // The gateway keeps those whose every type `by` may read.
            Command::GetWorkflow { tenant, .. } => by.require_tenant(tenant).and_then(|()| by.require_some(Verb::Read)),
            Command::ListWorkflows { tenants, .. } => {
                by.require_tenants(tenants).and_then(|()| by.require_some(Verb::Read))
            }
            Command::SetLimit { tenant, job_type, .. } => {
                by.require_tenant(tenant).and_then(|()| by.require_job(Verb::Manage, job_type))
            }
            Command::GetLimits { tenants, job_type } if job_type.is_empty() => {
                by.require_tenants(tenants).and_then(|()| by.require_some(Verb::Read))
            }
            Command::GetLimits { tenants, job_type } => {
                by.require_tenants(tenants).and_then(|()| by.require_job(Verb::Read, job_type))
            }
            // The plan places every tenant's jobs: an admin of all of them.
            Command::ChangePlan { .. } => {
                by.require(crate::core::principal::CLUSTER_ADMIN).and_then(|()| by.require_tenant("*"))
            }
            Command::GetPlan => by.require(crate::core::principal::CLUSTER_READ),
            Command::As { .. } => Err(AuthError::PermissionDenied("a principal's commands are not nested".into())),
            // The broker's own commands: never a client's.
            Command::Yield { .. }
            | Command::BackupMark { .. }
            | Command::ReportVoters { .. }
            | Command::ProbeKey { .. }
            | Command::GetAdoptable
            | Command::Adopt(_)
            | Command::RenewLeases { .. } => {
                if by.unrestricted() {
                    Ok(())
                } else {
                    Err(AuthError::PermissionDenied(format!("{} may not send this command", by.name)))
                }
            }
        };
        verdict.map_err(refusal)
    }

    /// Writes in the job's history that `by` acted on it whatever its
    /// attempt (`command` took effect with attempt 0).
    pub(super) fn note_override(&mut self, by: &str, command: &Command, out: &mut ApplyOutput) {
        let (Command::Complete { key, .. }
        | Command::Fail { key, .. }
        | Command::FailByPolicy { key, .. }
        | Command::UpdateTimeout { key, .. }
        | Command::Checkpoint { key, .. }) = command
        else {
            return;
        };
        let now = self.clock;
        let job = match self.jobs.get_mut(key) {
            Some(job) => {
                out.touched.push(*key);
                job
            }
            // Completed by it: on its way to storage.
            None => match out.finished.iter_mut().rev().find(|job| job.key == *key) {
                Some(job) => job,
                None => return,
            },
        };
        job.history.record(now, EventKind::FenceOverridden { attempt: job.attempt, by: by.to_string() });
    }

    /// `verb` on job `key` at `attempt`. A job no longer in memory (final,
    /// or never created) is left to the command, which changes nothing on
    /// it; a job token is still held to its own job.
    fn may_act_on(&self, by: &Principal, verb: Verb, key: JobKey, attempt: Option<u32>) -> Result<(), AuthError> {
        match self.jobs.get(&key) {
            Some(job) => by.check_command(verb, &job.spec.tenant, &job.spec.job_type, key.0, attempt),
            None if by.job.is_some() => by.check_command(verb, "", "", key.0, attempt),
            None => Ok(()),
        }
    }

    /// Acting as session `session`: `by` acts for every tenant it serves. A
    /// session this partition does not know is left to the command. The
    /// refusal is PERMISSION_DENIED, not NOT_FOUND: a gateway ends a session
    /// a partition does not know, and a stranger's beat must not end it.
    fn may_act_as(&self, by: &Principal, session: SessionId) -> Result<(), AuthError> {
        match self.sessions.get(&session) {
            Some(known) if by.require_tenants(&known.info.tenants).is_err() => {
                Err(AuthError::PermissionDenied(format!(
                    "{} may not act as worker session {session:x}: it serves tenants {} does not",
                    by.name, by.name
                )))
            }
            _ => self.may_act_as_owned(by, session),
        }
    }

    /// Acting as an owned session: its owner may, and a principal holding
    /// `workers:manage` (over every tenant it serves: [`Self::may_act_as`]
    /// checks those). A session with no owner (registered before data
    /// version 9, or with no principal) is anyone's of its tenants.
    fn may_act_as_owned(&self, by: &Principal, session: SessionId) -> Result<(), AuthError> {
        match self.session_owners.get(&session) {
            Some(owner) if *owner != by.name && !by.has(WORKERS_MANAGE) => Err(AuthError::PermissionDenied(format!(
                "{} may not act as worker session {session:x}: {owner:?} registered it, and acting as another \
                 principal's session needs {WORKERS_MANAGE}",
                by.name
            ))),
            _ => Ok(()),
        }
    }
}

/// An authorization refusal as a command's rejection: NOT_FOUND for another
/// tenant's job, PERMISSION_DENIED for the rest.
fn refusal(error: AuthError) -> CommandError {
    let kind = match error {
        AuthError::NotFound(_) => ErrorKind::NotFound,
        _ => ErrorKind::PermissionDenied,
    };
    CommandError { kind, message: error.to_string() }
}
