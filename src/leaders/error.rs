//! Every error a client can see, mapped once to a gRPC status with a message a
//! person can act on.

use tonic::{Code, Status};

use crate::auth::AuthError;
use crate::core::{CommandError, ErrorKind, PartitionId};
use crate::partition::SubmitError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    FailedPrecondition(String),
    /// FAILED_PRECONDITION because the job the command names is finished
    /// (completed, cancelled or expired): the job API says so for every
    /// adapter, and each shows it its protocol's way.
    #[error("{0}")]
    Finished(String),
    #[error("{0}")]
    ResourceExhausted(String),
    /// No token, or one that does not verify.
    #[error("{0}")]
    Unauthenticated(String),
    /// A token without the scope or tenant the request needs.
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    Unavailable(String),
    /// UNAVAILABLE because this node reaches no majority of the partition's
    /// replicas; nothing was sent, so the request may go to another partition.
    #[error("{0}")]
    OutOfReach(String),
    /// The request may or may not have taken effect.
    #[error("{0}")]
    OutcomeUnknown(String),
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn no_leader(partition: PartitionId, waited_ms: u128) -> Self {
        ApiError::Unavailable(format!(
            "partition {partition} has no reachable leader (waited {waited_ms} ms); the cluster may be electing \
             one or a majority of its replicas is down; retry with back-off"
        ))
    }

    pub fn outcome_unknown(partition: PartitionId, why: &str) -> Self {
        ApiError::OutcomeUnknown(format!(
            "the outcome is unknown: {why} (partition {partition}); the request may or may not have taken \
             effect. Read the job to find out; a create retried with the same idempotency_key is safe"
        ))
    }

    pub fn code(&self) -> Code {
        match self {
            ApiError::InvalidArgument(_) => Code::InvalidArgument,
            ApiError::NotFound(_) => Code::NotFound,
            ApiError::FailedPrecondition(_) | ApiError::Finished(_) => Code::FailedPrecondition,
            ApiError::ResourceExhausted(_) => Code::ResourceExhausted,
            ApiError::Unauthenticated(_) => Code::Unauthenticated,
            ApiError::PermissionDenied(_) => Code::PermissionDenied,
            ApiError::Unavailable(_) | ApiError::OutOfReach(_) => Code::Unavailable,
            ApiError::OutcomeUnknown(_) => Code::DeadlineExceeded,
            ApiError::Internal(_) => Code::Internal,
        }
    }

    pub fn from_code(code: i32, message: String) -> Self {
        match Code::from_i32(code) {
            Code::InvalidArgument => ApiError::InvalidArgument(message),
            Code::NotFound => ApiError::NotFound(message),
            Code::FailedPrecondition => ApiError::FailedPrecondition(message),
            Code::ResourceExhausted => ApiError::ResourceExhausted(message),
            Code::Unauthenticated => ApiError::Unauthenticated(message),
            Code::PermissionDenied => ApiError::PermissionDenied(message),
            Code::Unavailable => ApiError::Unavailable(message),
            Code::DeadlineExceeded => ApiError::OutcomeUnknown(message),
            _ => ApiError::Internal(message),
        }
    }

    /// The per-item error of the streaming calls.
    pub fn to_proto(&self) -> crate::proto::gateway::Error {
        crate::proto::gateway::Error { code: self.code() as i32, message: self.to_string() }
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Status {
        metrics::counter!("drover_gateway_errors_total", "code" => format!("{:?}", e.code())).increment(1);
        Status::new(e.code(), e.to_string())
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Unauthenticated(message) => ApiError::Unauthenticated(message),
            AuthError::PermissionDenied(message) => ApiError::PermissionDenied(message),
            AuthError::NotFound(message) => ApiError::NotFound(message),
            AuthError::Limited(message) => ApiError::ResourceExhausted(message),
        }
    }
}

impl From<AuthError> for Status {
    fn from(e: AuthError) -> Status {
        ApiError::from(e).into()
    }
}

impl From<CommandError> for ApiError {
    fn from(e: CommandError) -> Self {
        match e.kind {
            ErrorKind::InvalidArgument => ApiError::InvalidArgument(e.message),
            ErrorKind::NotFound => ApiError::NotFound(e.message),
            ErrorKind::FailedPrecondition => ApiError::FailedPrecondition(e.message),
            ErrorKind::ResourceExhausted => ApiError::ResourceExhausted(e.message),
            ErrorKind::PermissionDenied => ApiError::PermissionDenied(e.message),
        }
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Overloaded { .. } => ApiError::ResourceExhausted(e.to_string()),
            SubmitError::NotLeader { .. } | SubmitError::Stopped { .. } => ApiError::Unavailable(e.to_string()),
        }
    }
}

impl From<crate::storage::StorageError> for ApiError {
    fn from(e: crate::storage::StorageError) -> Self {
        ApiError::Internal(format!("storage: {e}"))
    }
}
