//! The commands that change a partition, the batches they are replicated
//! in, and what each one answers.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::failure::FailReason;
use super::history::{Via, YieldReason};
use super::ids::SessionId;
use super::ids::{JobKey, Millis, PartitionId};
use super::job::{field_len, ActivatedJobData, JobState, NewJob};
use super::limit::{LimitState, QueueLimit};
use super::plan::{ClusterPlan, PlanChange};
use super::principal::Principal;
use super::queue::QueueStats;
use super::routing::Taker;
use super::schedule::{Schedule, ScheduleSpec};
use super::session::{Session, SessionInfo, SessionTarget, WorkerState};
use super::workflow::{Workflow, WorkflowSpec};

/// Who an activation is for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Activation {
    pub job_type: String,
    /// Tenants whose jobs may be activated; never empty after validation.
    pub tenants: Vec<String>,
    pub worker: String,
    pub timeout_ms: i64,
    pub max_jobs: u32,
    /// The activated jobs' [`ActivatedJobData::encoded_len`] together stay
    /// within this, so they fit one message; the first job is taken whatever
    /// its size (the payload limit makes one job always fit).
    pub max_bytes: u64,
    /// The worker's session (0: none). A session that is quiet or told to
    /// terminate gets no jobs; one the partition does not know is refused.
    pub session: SessionId,
    /// How the activation reaches its worker, for the jobs' histories.
    pub via: Via,
    /// Who takes the jobs: only jobs whose routing admits it while
    /// `rivals` are open too are activated (see [`super::routing`]).
    pub taker: Taker,
    /// The other open takers of the type, as the leader knows them.
    pub rivals: Vec<Taker>,
}

#[cfg(test)]
impl Activation {
    /// A test's poll of `job_type` in `tenant`: worker "w", a minute's
    /// timeout, up to 10 jobs, no session; change the rest with `..`.
    pub fn plain(job_type: &str, tenant: &str) -> Activation {
        Activation {
            job_type: job_type.into(),
            tenants: vec![tenant.into()],
            worker: "w".into(),
            timeout_ms: 60_000,
            max_jobs: 10,
            max_bytes: u64::MAX,
            session: 0,
            via: Via::Unknown,
            taker: Default::default(),
            rivals: Vec::new(),
        }
    }
}

/// One change requested of a partition. Commands are replicated in batches.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Command {
    Create(NewJob),
    Activate(Activation),
    Complete {
        key: JobKey,
        attempt: u32,
        variables: Bytes,
    },
    /// A failed attempt. `variables` (a JSON object; empty for none) are
    /// merged into the job's: their top-level keys replace the job's, so the
    /// next attempt and `GetJob` see them. The merged variables and custom
    /// headers must fit `max_payload_bytes`, the gateway's limit when it built
    /// the command (so every replica judges alike).
    Fail {
        key: JobKey,
        attempt: u32,
        retries: i32,
        error_message: String,
        back_off_ms: i64,
        variables: Bytes,
        max_payload_bytes: u64,
        /// Overrides `retries` and `back_off_ms` for some reasons: see [`FailReason`].
        reason: FailReason,
    },
    UpdateTimeout {
        key: JobKey,
        attempt: u32,
        timeout_ms: i64,
    },
    UpdateRetries {
        key: JobKey,
        retries: i32,
        /// Who asked (the principal's name), for the job's history.
        by: String,
    },
    Cancel {
        key: JobKey,
        /// Who asked (the principal's name), for the job's history.
        by: String,
    },
    /// A pushed activation no client could take: activatable again, no retry used.
    Yield {
        key: JobKey,
        attempt: u32,
        /// The gateway that handed it back, and why: for the job's history.
        gateway: u64,
        reason: YieldReason,
    },
    /// A worker committed `stage` of an activated job (fenced by `attempt`):
    /// `variables` merge into the job's as with [`Command::Fail`], the stage
    /// becomes the job's recovery point, and the deadline moves to now + the
    /// activation's timeout. Stages only move forward along the declared chain.
    Checkpoint {
        key: JobKey,
        attempt: u32,
        stage: String,
        variables: Bytes,
        max_payload_bytes: u64,
    },
    /// A worker session starts (a repeat of a known id only renews its lease).
    Register(Arc<SessionInfo>),
    /// A session's heartbeat: renews its lease, records the state it reports,
    /// and extends the deadline of each listed job it still holds by the
    /// job's activation timeout. Answers [`CommandResult::Beat`].
    Beat {
        session: SessionId,
        state: WorkerState,
        /// (job, attempt) the worker holds on this partition.
        held: Vec<(JobKey, u32)>,
    },
    /// An operator directs sessions to a state. Answers the sessions it covered.
    Direct {
        target: SessionTarget,
        state: WorkerState,
    },
    /// A session ends: jobs it still holds are activatable again at once,
    /// no retry used. Ending an unknown session does nothing.
    EndSession {
        session: SessionId,
    },
    /// Reads every session (answers [`CommandResult::Sessions`]).
    ListSessions,
    /// Registers (or, with an empty schema, removes) the JSON Schema that
    /// creates of a job type must satisfy.
    SetSchema {
        job_type: String,
        schema: Bytes,
    },
    /// Reads a job type's schema (answers [`CommandResult::Schema`]).
    GetSchema {
        job_type: String,
    },
    /// Marks a backup's cut in the partition's log: the state machine keeps
    /// the partition's state as of this entry (or the few applied with it)
    /// for the backup named `id`, and answers [`CommandResult::BackupMarked`].
    /// The engine changes nothing. Data version 7 and later: sent only once
    /// every member reads it (new variants go last, so older entries decode).
    BackupMark {
        id: String,
    },
    /// `commands` on behalf of `by`, each answered in order as if it stood
    /// alone: every replica checks at apply that `by` may do each to the
    /// job or session it acts on (see [`crate::core::principal`]), so the
    /// guarantee does not rest on the gateway's read of a state that may
    /// lag. A refusal is that command's rejection (NOT_FOUND for another
    /// tenant's job, PERMISSION_DENIED for a missing scope) and changes
    /// nothing. One principal is carried once for a run of its commands
    /// (a leader merges the runs of one principal in an entry). Never
    /// nested. Data version 8 and later: sent only once every member reads it.
    As {
        by: Arc<Principal>,
        commands: Vec<Command>,
    },
    /// [`Command::Register`], and the principal it travels with
    /// ([`Command::As`]) owns the session: anyone else acting as it (beats,
    /// ends, activations, streams) needs `workers:manage` over every tenant
    /// it serves. Outside a principal's run, a plain registration. Data
    /// version 9 and later: sent only once every member reads it.
    RegisterOwned(Arc<SessionInfo>),
    /// Answers done when the principal it travels with may act as
    /// `session`, which a worker's stream names (its owner, or a manager of
    /// every tenant it serves); NOT_FOUND when the session is over. Changes
    /// nothing. Data version 9 and later.
    ActAs {
        session: SessionId,
    },
    /// Pauses (or resumes) `tenant`'s queue of `job_type`: while paused, its
    /// jobs wait and none is activated; creates still land. Answers done.
    /// Data version 11 and later ([`super::PAUSED_QUEUES`]).
    SetPaused {
        tenant: String,
        job_type: String,
        paused: bool,
    },
    /// Reads the figures of `tenants`' queues (of `job_type` only, when it is
    /// not empty); answers [`CommandResult::Queues`]. Changes nothing. Data
    /// version 11 and later.
    QueueStats {
        tenants: Vec<String>,
        job_type: String,
    },
    /// Registers a cron schedule, or changes the one of its tenant and name
    /// (upsert); answers [`CommandResult::ScheduleSet`]. Data version 12 and
    /// later ([`super::SCHEDULES`]), like the other schedule commands.
    PutSchedule {
        spec: Arc<ScheduleSpec>,
        /// Who asked (the principal's name), kept with the schedule.
        by: String,
    },
    /// Deletes a schedule (the jobs it made stay); answers the schedule.
    DeleteSchedule {
        tenant: String,
        name: String,
    },
    /// Pauses or resumes a schedule; answers the schedule.
    SetSchedulePaused {
        tenant: String,
        name: String,
        paused: bool,
    },
    /// Reads the schedules of `tenants` ("*": every tenant's); answers
    /// [`CommandResult::Schedules`]. Changes nothing.
    ListSchedules {
        tenants: Vec<String>,
    },
    /// Creates a workflow and its first jobs, on this partition (its home);
    /// answers [`CommandResult::Workflows`] with it. A repeat of the same
    /// spec answers the workflow as it is. Data version 13 and later
    /// ([`super::WORKFLOWS`]), like the other workflow commands.
    CreateWorkflow {
        spec: Arc<WorkflowSpec>,
        /// Who asked (the principal's name), kept with the workflow.
        by: String,
        /// The largest variables and headers a job it makes may have.
        max_payload_bytes: u64,
    },
    /// Cancels a running workflow; answers it. `request` names the call:
    /// a resend of the cancel that took effect is answered with the
    /// workflow, another cancel of a cancelled workflow is refused.
    CancelWorkflow {
        tenant: String,
        id: String,
        by: String,
        request: u64,
    },
    /// Reads one workflow; answers it. Changes nothing.
    GetWorkflow {
        tenant: String,
        id: String,
    },
    /// Reads the workflows of `tenants` ("*": every tenant's), newest first,
    /// at most `limit` (0: all), only running ones if `running`. Changes nothing.
    ListWorkflows {
        tenants: Vec<String>,
        running: bool,
        limit: u32,
    },
    /// Sets `tenant`'s queue of `job_type` a rate and concurrency limit
    /// (`None`: lifts it) on this partition; answers done. Sent to every
    /// partition, like a pause: the queue's creates go to its home, and each
    /// partition holds the jobs of it that it has to the limit (see
    /// [`super::limit`]). Data version 14 and later ([`super::limit::LIMITS`]).
    SetLimit {
        tenant: String,
        job_type: String,
        limit: Option<QueueLimit>,
    },
    /// Reads the limits of `tenants`' queues here (of `job_type` only, when
    /// it is not empty); answers [`CommandResult::Limits`]. Changes nothing.
    GetLimits {
        tenants: Vec<String>,
        job_type: String,
    },
    /// Changes the cluster plan (partition 0 only), starting from `initial`
    /// when the partition holds none yet; answers [`CommandResult::Plan`].
    /// Refused when `epoch` is given and is not the plan's. Data version 15
    /// and later ([`super::plan::PLANS`]).
    ChangePlan {
        initial: Box<ClusterPlan>,
        epoch: Option<u64>,
        change: PlanChange,
    },
    /// A partition's leader reports its voters to the plan (partition 0
    /// only; a report of the voters known changes nothing). The broker's own.
    ReportVoters {
        partition: PartitionId,
        voters: Vec<crate::core::NodeId>,
    },
    /// Reads the cluster plan (partition 0 only); answers
    /// [`CommandResult::Plan`]. Changes nothing.
    GetPlan,
    /// Asks a partition that an idempotency key hashed to under an older
    /// partition count whether it made a job for `request`: answers
    /// [`CommandResult::Created`] (not created) with that job, or, when it
    /// made none, remembers for `window_ms` that the key now goes to
    /// partition `to` and answers [`CommandResult::Elsewhere`]: a create of
    /// the key that reaches this partition later (from a gateway routing by
    /// the older count) is sent there. The broker's own. Data version 16
    /// ([`super::plan::MORE_PARTITIONS`]).
    ProbeKey {
        request: super::ids::RequestId,
        to: PartitionId,
        window_ms: Millis,
        fingerprint: u64,
    },
    /// Reads what a partition being added copies from partition 0 before it
    /// takes work (see [`Adoptable`]); answers [`CommandResult::Adoptable`].
    /// The broker's own. Data version 16.
    GetAdoptable,
    /// A partition being added takes partition 0's sessions, schemas,
    /// paused queues and queue limits, so that the fan-outs made before it
    /// existed hold on it too. The broker's own. Data version 16.
    Adopt(Box<Adoptable>),
    /// A failed attempt whose job's retry policy decides what follows
    /// (see [`super::retry`]): the job's own (its `drover.retry` header),
    /// or the default one. With retries left and an error that may retry,
    /// one retry is used and the job is due after the policy's back-off;
    /// otherwise it is an incident. Answers [`CommandResult::Failed`] with
    /// what was decided; `variables` and `max_payload_bytes` as for
    /// [`Command::Fail`]. Data version 17 ([`super::retry::RETRY_POLICIES`]).
    FailByPolicy {
        key: JobKey,
        attempt: u32,
        error_message: String,
        /// The error's type, matched against the policy's non-retryable ones.
        error_type: String,
        /// False when the worker says the error must not be retried.
        retryable: bool,
        /// The jitter the gateway drew, so every replica waits alike.
        jitter: u16,
        variables: Bytes,
        max_payload_bytes: u64,
    },
    /// A new leader's entry, first in it: the partition went `gap_ms`
    /// without an entry (no beat could commit meanwhile), so before timers
    /// fire, the leases that gap threatens
    /// ([`super::SessionInfo::threatened_by`]) restart from the entry's
    /// time, and only those: a dead worker with margin to spare is declared
    /// dead when its own lease ends. Anywhere but first it does nothing.
    /// Answers [`CommandResult::Done`]. The broker's own. Data version 18
    /// ([`super::session::LEASES_BY_MARGIN`]); before it, a take-over's
    /// entries set [`Batch::renew_sessions`].
    RenewLeases {
        gap_ms: Millis,
    },
    /// A completion that names its job by an outside id and perhaps not its
    /// activation (an Open Job Spec ack), with what it must find there
    /// ([`super::Guard`]): decided at apply, so its gateway need not read
    /// the job first. `attempt` is the activation's fence as for
    /// [`Command::Complete`], or 0 for whichever activation holds the job
    /// (never an override: the guard judges it). A job the id does not name
    /// is NOT_FOUND. Answers [`CommandResult::Completed`]. Data version 20
    /// ([`super::GUARDED_OUTCOMES`]).
    CompleteGuarded {
        key: JobKey,
        attempt: u32,
        variables: Bytes,
        guard: super::Guard,
    },
}

/// What every partition holds alike because gateways send it to every
/// partition: what a partition being added copies from partition 0.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Adoptable {
    pub sessions: Vec<Session>,
    pub owners: Vec<(SessionId, String)>,
    pub schemas: Vec<(String, Bytes)>,
    pub paused: Vec<(String, String, Millis)>,
    pub limits: Vec<super::limit::LimitRecord>,
}

/// One Raft entry's worth of commands, stamped with the leader's clock.
/// Applying a batch first fires every timer due at `now`, then runs the commands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    pub now: Millis,
    /// The leader's retention of final records when it wrote this entry; every
    /// replica prunes by the entry's own value, so they prune alike.
    pub retention: Retention,
    pub commands: Vec<Command>,
    /// Set on a new leader's entries until its first one has applied, below
    /// cluster version 18: every session's lease restarts from `now` before
    /// timers fire. While the partition had no leader, no beat could commit,
    /// and a worker that kept beating must not be declared dead for it. From
    /// version 18 on, a leader sends [`Command::RenewLeases`] instead, which
    /// restarts only the leases the gap threatens.
    pub renew_sessions: bool,
}

impl Batch {
    /// A batch under the default retention.
    pub fn at(now: Millis, commands: Vec<Command>) -> Self {
        Batch { now, retention: Retention::default(), commands, renew_sessions: false }
    }
}

/// How long a partition keeps the records of completed and cancelled jobs
/// readable (`GetJob`, fencing answers) after they finish: until they are
/// older than `max_age_ms`, or until more than `max_jobs` newer ones finished,
/// whichever comes first. Pruning happens as entries apply, so a record may
/// outlive its age on a partition that sees no writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Retention {
    pub max_age_ms: Millis,
    pub max_jobs: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention { max_age_ms: 10 * 60 * 1000, max_jobs: 100_000 }
    }
}

/// Why a command was refused. Maps to a gRPC status at the edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    InvalidArgument,
    NotFound,
    FailedPrecondition,
    /// A limit of the node was reached (a payload grew too large).
    ResourceExhausted,
    /// The request's principal may not touch this job: decided before a
    /// batch is proposed, and again at apply for a command carried with its
    /// principal ([`Command::As`]).
    PermissionDenied,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandError {
    pub kind: ErrorKind,
    pub message: String,
}

impl CommandError {
    pub fn not_found(key: JobKey) -> Self {
        CommandError { kind: ErrorKind::NotFound, message: format!("no job with key {key}") }
    }
    pub fn precondition(message: impl Into<String>) -> Self {
        CommandError { kind: ErrorKind::FailedPrecondition, message: message.into() }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        CommandError { kind: ErrorKind::InvalidArgument, message: message.into() }
    }
    pub fn exhausted(message: impl Into<String>) -> Self {
        CommandError { kind: ErrorKind::ResourceExhausted, message: message.into() }
    }
}

/// The data version a create of `spec` needs: the newest of what it carries
/// (an expiry, its own activation timeout), or none.
fn create_needs(spec: &super::JobSpec) -> Option<(u16, &'static str)> {
    let expiry = super::expires_at(spec).map(|_| (super::SCHEDULES, "job expiry (expires_at)"));
    let timeout = super::activation_timeout(spec).map(|_| (super::JOB_TIMEOUTS, "per-job activation timeouts"));
    expiry.into_iter().chain(timeout).max()
}

impl Command {
    /// The commands themselves: those a principal's run carries, or this one.
    pub fn each(&self) -> std::slice::Iter<'_, Command> {
        match self {
            Command::As { commands, .. } => commands.iter(),
            command => std::slice::from_ref(command).iter(),
        }
    }

    /// [`Command::each`], to change.
    pub fn each_mut(&mut self) -> std::slice::IterMut<'_, Command> {
        match self {
            Command::As { commands, .. } => commands.iter_mut(),
            command => std::slice::from_mut(command).iter_mut(),
        }
    }

    /// How many results this command answers: one for each it carries.
    pub fn results(&self) -> usize {
        match self {
            Command::As { commands, .. } => commands.len(),
            _ => 1,
        }
    }

    /// The data version from which this command may be sent, and the
    /// feature that needs it, when it is newer than the oldest version a
    /// build reads: a node sends it only once every member of the cluster
    /// reads that version (the cluster version, `docs/upgrades.md`), so no
    /// replica meets a command it cannot decode. The one table of the
    /// gates: the partition client checks it for every command it sends.
    pub fn since_version(&self) -> Option<(u16, &'static str)> {
        use super::{limit::LIMITS, plan::MORE_PARTITIONS, plan::PLANS, PAUSED_QUEUES, SCHEDULES, WORKFLOWS};
        Some(match self {
            Command::As { commands, .. } => return commands.iter().filter_map(Command::since_version).max(),
            Command::Create(job) => return create_needs(&job.spec),
            Command::BackupMark { .. } => (7, "backups"),
            Command::RegisterOwned(_) | Command::ActAs { .. } => (super::OWNED_SESSIONS, "worker sessions with owners"),
            Command::SetPaused { .. } | Command::QueueStats { .. } => {
                (PAUSED_QUEUES, "paused queues and queue listings")
            }
            Command::PutSchedule { spec, .. } if super::activation_timeout(&spec.template).is_some() => {
                (super::JOB_TIMEOUTS, "per-job activation timeouts")
            }
            Command::CreateWorkflow { spec, .. }
                if spec
                    .steps
                    .iter()
                    .chain(spec.callbacks.iter().map(|(_, step)| step))
                    .any(|step| super::activation_timeout(&step.template).is_some()) =>
            {
                (super::JOB_TIMEOUTS, "per-job activation timeouts")
            }
            Command::PutSchedule { .. }
            | Command::DeleteSchedule { .. }
            | Command::SetSchedulePaused { .. }
            | Command::ListSchedules { .. } => (SCHEDULES, "cron schedules"),
            Command::CreateWorkflow { .. }
            | Command::CancelWorkflow { .. }
            | Command::GetWorkflow { .. }
            | Command::ListWorkflows { .. } => (WORKFLOWS, "workflows"),
            Command::SetLimit { .. } | Command::GetLimits { .. } => (LIMITS, "queue limits"),
            Command::ChangePlan { change: super::plan::PlanChange::AddPartitions { .. }, .. }
            | Command::ProbeKey { .. }
            | Command::GetAdoptable
            | Command::Adopt(_) => (MORE_PARTITIONS, "adding partitions"),
            Command::ChangePlan { .. } | Command::ReportVoters { .. } | Command::GetPlan => {
                (PLANS, "cluster plan changes")
            }
            Command::FailByPolicy { .. } => (super::retry::RETRY_POLICIES, "failures decided by retry policies"),
            Command::RenewLeases { .. } => {
                (super::session::LEASES_BY_MARGIN, "restarting only the leases a take-over threatens")
            }
            Command::CompleteGuarded { .. } => (super::GUARDED_OUTCOMES, "completions guarded at their partition"),
            _ => return None,
        })
    }

    /// The job this command acts on by key, the attempt it is fenced by
    /// (none for a manager's command), and what acting on it takes: the one
    /// table that both the gateway's screen before proposing and the
    /// engine's authorization at apply read, so a new command on a job is
    /// judged alike in both by one entry here. `None` for commands that act
    /// on no one job (creates, activations, sessions: judged by what they
    /// name), and for the broker's own (a yield).
    pub fn acts_on(&self) -> Option<(JobKey, Option<u32>, super::principal::Verb)> {
        use super::principal::Verb;
        match self {
            Command::Complete { key, attempt, .. }
            | Command::Fail { key, attempt, .. }
            | Command::FailByPolicy { key, attempt, .. }
            | Command::UpdateTimeout { key, attempt, .. }
            | Command::Checkpoint { key, attempt, .. } => Some((*key, Some(*attempt), Verb::Work)),
            // Attempt 0 names whichever activation the guard admits, not an
            // override: judged as any worker's command on the job.
            Command::CompleteGuarded { key, attempt, .. } => {
                Some((*key, Some(*attempt).filter(|a| *a != 0), Verb::Work))
            }
            Command::UpdateRetries { key, .. } | Command::Cancel { key, .. } => Some((*key, None, Verb::Manage)),
            _ => None,
        }
    }

    /// Whether this command only reads the partition's state, so that its
    /// leader may answer it from what it applied, without a log entry
    /// ([`super::PartitionState::answer_read`]). Applied from the log (a batch
    /// an older leader proposed), each answers the same and changes nothing
    /// but a queue-figures read's dropping of spent windows.
    pub fn is_read(&self) -> bool {
        matches!(
            self,
            Command::ListSessions
                | Command::GetSchema { .. }
                | Command::QueueStats { .. }
                | Command::ListSchedules { .. }
                | Command::GetWorkflow { .. }
                | Command::ListWorkflows { .. }
                | Command::GetLimits { .. }
        )
    }

    /// Whether this is an operator's override of a job's fence: a worker's
    /// command with attempt 0, acting whatever the job's attempt.
    pub fn overrides_fence(&self) -> bool {
        matches!(
            self,
            Command::Complete { attempt: 0, .. }
                | Command::Fail { attempt: 0, .. }
                | Command::FailByPolicy { attempt: 0, .. }
                | Command::UpdateTimeout { attempt: 0, .. }
                | Command::Checkpoint { attempt: 0, .. }
        )
    }

    /// The bytes this command takes when encoded, within a few.
    pub fn encoded_len(&self) -> usize {
        let body = match self {
            Command::Create(job) => job.spec.encoded_len() + 32,
            Command::Activate(a) => {
                let tenants: usize = a.tenants.iter().map(|t| field_len(t.len())).sum();
                let takers: usize = std::iter::once(&a.taker).chain(&a.rivals).map(Taker::encoded_len).sum();
                field_len(a.job_type.len()) + field_len(tenants) + field_len(a.worker.len()) + field_len(takers) + 32
            }
            Command::Complete { variables, .. } => field_len(variables.len()) + 16,
            Command::CompleteGuarded { variables, guard, .. } => {
                let identity = match &guard.identity {
                    Some(super::Identity::Header { name, value }) => field_len(name.len()) + field_len(value.len()),
                    Some(super::Identity::Stamped { chosen, stamp, .. }) => {
                        field_len(chosen.len()) + field_len(stamp.len()) + 8
                    }
                    None => 0,
                };
                field_len(variables.len()) + identity + field_len(guard.worker.len()) + 24
            }
            Command::Fail { error_message, variables, .. } => {
                field_len(error_message.len()) + field_len(variables.len()) + 32
            }
            Command::FailByPolicy { error_message, error_type, variables, .. } => {
                field_len(error_message.len()) + field_len(error_type.len()) + field_len(variables.len()) + 32
            }
            Command::Checkpoint { stage, variables, .. } => field_len(stage.len()) + field_len(variables.len()) + 32,
            Command::Register(info) | Command::RegisterOwned(info) => {
                let strings = [&info.worker, &info.hostname].iter().map(|s| field_len(s.len())).sum::<usize>();
                let lists: usize = [&info.job_types, &info.labels, &info.tenants]
                    .iter()
                    .map(|list| field_len(list.iter().map(|s| field_len(s.len())).sum()))
                    .sum();
                strings + lists + 48
            }
            Command::Beat { held, .. } => field_len(held.len() * 12) + 16,
            Command::Direct { target: SessionTarget::Label(label), .. } => field_len(label.len()) + 16,
            Command::SetSchema { job_type, schema } => field_len(job_type.len()) + field_len(schema.len()),
            Command::GetSchema { job_type } => field_len(job_type.len()),
            Command::BackupMark { id } => field_len(id.len()),
            Command::SetPaused { tenant, job_type, .. } => field_len(tenant.len()) + field_len(job_type.len()) + 1,
            Command::QueueStats { tenants, job_type } => {
                tenants.iter().map(|t| field_len(t.len())).sum::<usize>() + field_len(job_type.len()) + 8
            }
            Command::PutSchedule { spec, by } => spec.encoded_len() + field_len(by.len()),
            Command::DeleteSchedule { tenant, name } | Command::SetSchedulePaused { tenant, name, .. } => {
                field_len(tenant.len()) + field_len(name.len()) + 1
            }
            Command::ListSchedules { tenants } => tenants.iter().map(|t| field_len(t.len())).sum::<usize>() + 8,
            Command::CreateWorkflow { spec, by, .. } => spec.encoded_len() + field_len(by.len()) + 8,
            Command::CancelWorkflow { tenant, id, by, .. } => {
                field_len(tenant.len()) + field_len(id.len()) + field_len(by.len()) + 8
            }
            Command::GetWorkflow { tenant, id } => field_len(tenant.len()) + field_len(id.len()),
            Command::ListWorkflows { tenants, .. } => tenants.iter().map(|t| field_len(t.len())).sum::<usize>() + 16,
            Command::SetLimit { tenant, job_type, .. } => field_len(tenant.len()) + field_len(job_type.len()) + 64,
            Command::GetLimits { tenants, job_type } => {
                tenants.iter().map(|t| field_len(t.len())).sum::<usize>() + field_len(job_type.len()) + 8
            }
            Command::ChangePlan { initial, .. } => {
                initial.members.values().map(|m| field_len(m.addr.len()) + 64).sum::<usize>()
                    + initial.target.iter().map(|t| 8 * t.len() + 8).sum::<usize>() * 2
                    + 128
            }
            Command::ReportVoters { voters, .. } => 8 * voters.len() + 16,
            Command::GetPlan | Command::GetAdoptable => 1,
            Command::RenewLeases { .. } => 8,
            Command::ProbeKey { request, .. } => bincode::serialized_size(request).unwrap_or(0) as usize + 32,
            Command::Adopt(adoptable) => bincode::serialized_size(adoptable).unwrap_or(0) as usize,
            Command::As { by, commands } => by.encoded_len() + commands.iter().map(Command::encoded_len).sum::<usize>(),
            Command::UpdateTimeout { .. }
            | Command::UpdateRetries { .. }
            | Command::Cancel { .. }
            | Command::Yield { .. }
            | Command::Direct { .. }
            | Command::EndSession { .. }
            | Command::ActAs { .. }
            | Command::ListSessions => 32,
        };
        4 + body
    }
}

/// The outcome of one command, in the order of the batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum CommandResult {
    /// The job a create made, or, for a repeat of a create the partition
    /// remembers (same request id or idempotency key), the job the first one
    /// made (`created: false`).
    Created {
        key: JobKey,
        created: bool,
        /// The job's state now; `None` for a repeat whose job is final and
        /// out of memory (its record is in storage).
        state: Option<JobState>,
    },
    Activated(Vec<ActivatedJobData>),
    Done,
    /// The new deadline after `UpdateTimeout`.
    Deadline(Millis),
    /// A heartbeat's answer: the state the server wants the worker in, the
    /// listed jobs the worker no longer holds (cancelled, timed out,
    /// reassigned, or finished through another activation): it stops them;
    /// and the listed jobs this session holds under the listed attempt (the
    /// only ones a beat renews, and the only ones it may get job tokens for).
    Beat {
        directed: WorkerState,
        revoked: Vec<JobKey>,
        renewed: Vec<JobKey>,
    },
    /// Sessions, each with how many jobs of this partition it holds.
    Sessions(Vec<(Session, u32)>),
    /// A job type's schema; empty when it has none.
    Schema(Bytes),
    /// The figures of a partition's queues.
    Queues(Vec<QueueStats>),
    Rejected(CommandError),
    /// Where a backup's state was taken: the log position of the last entry
    /// applied with its mark (see [`Command::BackupMark`]).
    BackupMarked {
        term: u64,
        leader: u64,
        index: u64,
    },
    /// A schedule as registered, and whether it is new.
    ScheduleSet {
        schedule: Schedule,
        created: bool,
    },
    /// Schedules, by tenant and name.
    Schedules(Vec<Schedule>),
    /// Workflows (one, for a create, cancel or read).
    Workflows(Vec<Workflow>),
    /// A create of a limited queue belongs on its home partition: made
    /// nothing here; the gateway sends it there.
    Elsewhere(PartitionId),
    /// The limits of a partition's queues, as it holds them now.
    Limits(Vec<LimitState>),
    /// The cluster plan (none: never changed, the member list's holds).
    Plan(Option<Box<ClusterPlan>>),
    /// What a partition being added copies ([`Command::GetAdoptable`]).
    Adoptable(Box<Adoptable>),
    /// What a failure by the job's policy decided ([`Command::FailByPolicy`]):
    /// the retries left (0: an incident) and the wait before the job is due.
    Failed {
        retries: i32,
        back_off_ms: i64,
    },
    /// A guarded completion's answer ([`Command::CompleteGuarded`]): the
    /// attempt it completed, which its sender may not have named.
    Completed {
        attempt: u32,
    },
}

/// What happened to a job, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Created,
    Activated,
    Completed,
    Failed,
    TimedOut,
    Yielded,
    Incident,
    Cancelled,
    Checkpointed,
    Expired,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Activated => "activated",
            Outcome::Completed => "completed",
            Outcome::Failed => "failed",
            Outcome::TimedOut => "timed_out",
            Outcome::Yielded => "yielded",
            Outcome::Incident => "incident",
            Outcome::Cancelled => "cancelled",
            Outcome::Checkpointed => "checkpointed",
            Outcome::Expired => "expired",
        }
    }
}
