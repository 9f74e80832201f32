//! Guards: what an outcome that names its job by an outside id, and perhaps
//! not its activation, must find at the partition before it lands.
//!
//! A protocol whose workers name a job by an id of its own (the Open Job
//! Spec's UUIDs) and may leave the activation out used to have its gateway
//! read the job first, check the id and the activation, then write. A
//! [`Guard`] carries those checks into the command, so the partition decides
//! them at apply against the job as it is there and then, in one write, and
//! every replica decides alike. Data version 20 ([`GUARDED_OUTCOMES`]).

use serde::{Deserialize, Serialize};

use super::{EventKind, FailReason, Job, JobState, Millis};

/// The data version from which a completion may carry a [`Guard`]
/// ([`super::Command::CompleteGuarded`]).
pub const GUARDED_OUTCOMES: u16 = 20;

/// Which job an outside id names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Identity {
    /// An id a client chose, kept as the job's custom header `name`.
    Header { name: String, value: String },
    /// An id made from the job's key and a time: the job has no custom
    /// header `chosen` (it was not made with a client's id), and its header
    /// `stamp`, or its creation time when it has none, is `at`.
    Stamped { chosen: String, stamp: String, at: Millis },
}

/// What a guarded outcome must find. Each check is made only when given.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Guard {
    /// The job is the one the outside id names.
    pub identity: Option<Identity>,
    /// The job's activation is this worker's (non-empty).
    pub worker: String,
    /// No earlier activation ended without its worker's word ([`lapse`]):
    /// an outcome that names neither attempt nor worker may be that
    /// worker's, who may still be at work without knowing it lost the job.
    pub no_lapse: bool,
}

/// Why a guard refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The job at that key is not the one the id names.
    NotThisJob,
    /// The job's activation is not the one the outcome is for.
    NotThisActivation(String),
}

impl Guard {
    /// Whether `job` (as it is now) passes every check given.
    pub fn admits(&self, job: &Job) -> Result<(), Refusal> {
        if !self.identity.as_ref().is_none_or(|identity| identity.names(job)) {
            return Err(Refusal::NotThisJob);
        }
        if job.state != JobState::Activated {
            // The fence decides what an outcome of a job not held answers.
            return Ok(());
        }
        if !self.worker.is_empty() && self.worker != job.worker {
            return Err(Refusal::NotThisActivation(format!(
                "job {} is held by worker {:?} now, not {:?}: that activation is over and its outcome is refused",
                job.key, job.worker, self.worker
            )));
        }
        match lapse(job) {
            Some(lapse) if self.no_lapse => Err(Refusal::NotThisActivation(format!(
                "job {} is at attempt {} after an earlier activation lapsed ({lapse}); an outcome that names \
                 neither attempt nor worker may be that worker's, so it is refused: send the attempt the \
                 activation answered, or the worker that took it",
                job.key, job.attempt
            ))),
            _ => Ok(()),
        }
    }
}

impl Identity {
    fn names(&self, job: &Job) -> bool {
        let header = |name: &str| job.spec.custom_headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        match self {
            Identity::Header { name, value } => header(name) == Some(value.as_str()),
            Identity::Stamped { chosen, stamp, at } => {
                header(chosen).is_none()
                    && header(stamp).map_or(Some(job.created_at), |text| text.parse().ok()) == Some(*at)
            }
        }
    }
}

/// An earlier activation of `job` that ended without its worker's word: it
/// timed out, or its worker's session died or ended. A history that
/// dropped events is taken to hold one once the job was activated again.
pub fn lapse(job: &Job) -> Option<String> {
    let lapsed =
        job.history.events().find_map(|event| match &event.kind {
            EventKind::TimedOut { attempt } if *attempt < job.attempt => Some(format!("attempt {attempt} timed out")),
            EventKind::Failed {
                attempt, reason: reason @ (FailReason::WorkerDied | FailReason::SessionEnded), ..
            } if *attempt < job.attempt => Some(format!("attempt {attempt} ended as {}", reason.as_str())),
            _ => None,
        });
    lapsed.or_else(|| {
        (job.history.dropped() > 0 && job.attempt > 1).then(|| "its early history is no longer kept".into())
    })
}
