//! What authentication and authorization refuse, in auth's own words: the
//! gateway maps each to its gRPC status once ([`crate::gateway::ApiError`]),
//! the admin server to its HTTP status.

/// A refusal by [`super::Authenticator`] or a [`super::Principal`]'s checks.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No token, or one that does not verify.
    #[error("{0}")]
    Unauthenticated(String),
    /// A token without the scope or tenant the request needs.
    #[error("{0}")]
    PermissionDenied(String),
    /// Another tenant's job: for this principal it is not there at all.
    #[error("{0}")]
    NotFound(String),
    /// The principal is over its rate or stream limit on this node.
    #[error("{0}")]
    Limited(String),
}
