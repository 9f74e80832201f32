//! Principals and what they may do: Taskcluster-style scopes with `*` suffix
//! wildcards, and tenants.
//!
//! Pure, so it sits with the engine: a gateway judges a request with it
//! before proposing, and every replica judges a command carried with its
//! principal ([`crate::core::Command::As`]) again at apply, alike.
//!
//! A scope a principal holds covers a scope a request needs when they are
//! equal, or when the held one ends in `*` and the needed one starts with
//! what comes before it: `jobs:work:orders-*` covers `jobs:work:orders-eu`,
//! and `*` covers everything. Job scopes are `jobs:<verb>:<job type>`.

use serde::{Deserialize, Serialize};

use super::{Job, DEFAULT_TENANT};

/// What a job scope allows, by verb.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// CreateJob, CreateJobs; AwaitJob on jobs it may create.
    Create,
    /// ActivateJobs, StreamActivatedJobs, CompleteJob(s), FailJob,
    /// UpdateJobTimeout, CheckpointJob, and the worker session RPCs.
    Work,
    /// GetJob, GetJobHistory, AwaitJob, ListJobs, GetSchema.
    Read,
    /// UpdateJobRetries, CancelJob, RetryJobs, CancelJobs, SetSchema.
    Manage,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Create => "create",
            Verb::Work => "work",
            Verb::Read => "read",
            Verb::Manage => "manage",
        }
    }
}

/// Reading the cluster's shape and health: `/metrics`, `/actuator/*` reads,
/// ListWorkers.
pub const CLUSTER_READ: &str = "cluster:read";
/// Failpoints and anything else that changes the cluster itself.
pub const CLUSTER_ADMIN: &str = "cluster:admin";
/// Directing worker sessions (SetWorkerState, `POST /actuator/workers/...`).
pub const WORKERS_MANAGE: &str = "workers:manage";

/// Who made a request, and what it may do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// The token's name, or the JWT's issuer and subject.
    pub name: String,
    pub scopes: Vec<String>,
    /// Tenants whose jobs it may see and touch; `*`: every tenant.
    pub tenants: Vec<String>,
    /// A job token's principal: only this job at this attempt, and only
    /// what working it takes. No scopes or tenants then.
    #[serde(default)]
    pub job: Option<(u64, u32)>,
}

/// Whether `held` covers the scope made of `parts` (concatenated).
fn covers(held: &str, parts: &[&str]) -> bool {
    let (prefix, wildcard) = match held.strip_suffix('*') {
        Some(prefix) => (prefix, true),
        None => (held, false),
    };
    let mut rest = prefix;
    for (i, part) in parts.iter().enumerate() {
        if rest.len() <= part.len() {
            if !part.starts_with(rest) {
                return false;
            }
            // The held scope is used up inside this part: with a wildcard
            // anything may follow; without one, nothing may.
            let exact = rest.len() == part.len() && parts[i + 1..].iter().all(|p| p.is_empty());
            return wildcard || exact;
        }
        let Some(after) = rest.strip_prefix(part) else { return false };
        rest = after;
    }
    false
}

impl Principal {
    /// Everything, everywhere: requests when authentication is off.
    pub fn anonymous() -> Principal {
        Principal { name: "anonymous".into(), scopes: vec!["*".into()], tenants: vec!["*".into()], job: None }
    }

    /// What a job token for `key` at `attempt` may do.
    pub fn for_job(key: u64, attempt: u32) -> Principal {
        Principal {
            name: format!("job token for {key} attempt {attempt}"),
            scopes: vec![],
            tenants: vec![],
            job: Some((key, attempt)),
        }
    }

    /// The broker acting on its own (raising an incident, say).
    pub fn system() -> Principal {
        Principal { name: "drover".into(), ..Principal::anonymous() }
    }

    /// Holds `*` for scopes and tenants: no check can refuse it.
    pub fn unrestricted(&self) -> bool {
        self.scopes.iter().any(|s| s == "*") && self.tenants.iter().any(|t| t == "*")
    }

    /// The bytes this principal takes when encoded, within a few: what
    /// carrying it with a command ([`crate::core::Command::As`]) adds.
    pub fn encoded_len(&self) -> usize {
        let strings = |list: &[String]| 8 + list.iter().map(|s| 8 + s.len()).sum::<usize>();
        8 + self.name.len() + strings(&self.scopes) + strings(&self.tenants) + 16
    }

    pub fn has(&self, scope: &str) -> bool {
        self.scopes.iter().any(|held| covers(held, &[scope]))
    }

    /// Holds `jobs:<verb>:<job_type>`.
    pub fn may(&self, verb: Verb, job_type: &str) -> bool {
        self.scopes.iter().any(|held| covers(held, &["jobs:", verb.as_str(), ":", job_type]))
    }

    /// Holds `jobs:<verb>:` for at least one job type.
    pub fn may_some(&self, verb: Verb) -> bool {
        let prefix = format!("jobs:{}:", verb.as_str());
        self.scopes.iter().any(|held| {
            covers(held, &[&prefix, "x"]) || held.strip_suffix('*').unwrap_or(held).starts_with(prefix.as_str())
        })
    }

    pub fn require(&self, scope: &str) -> Result<(), AuthError> {
        if self.has(scope) {
            return Ok(());
        }
        Err(self.denied(scope))
    }

    /// Holds `jobs:<verb>:` for some job type (the worker session RPCs,
    /// which name no type).
    pub fn require_some(&self, verb: Verb) -> Result<(), AuthError> {
        if self.may_some(verb) {
            return Ok(());
        }
        Err(self.denied(&format!("jobs:{}:<some type>", verb.as_str())))
    }

    pub fn require_job(&self, verb: Verb, job_type: &str) -> Result<(), AuthError> {
        if self.may(verb, job_type) {
            return Ok(());
        }
        Err(self.denied(&format!("jobs:{}:{job_type}", verb.as_str())))
    }

    fn denied(&self, scope: &str) -> AuthError {
        AuthError::PermissionDenied(format!(
            "{} lacks the scope {scope} this request needs (it holds {})",
            self.name,
            if self.scopes.is_empty() { "none".to_string() } else { self.scopes.join(", ") }
        ))
    }

    /// May see and touch jobs of `tenant` (empty: the default tenant).
    pub fn in_tenant(&self, tenant: &str) -> bool {
        let tenant = if tenant.is_empty() { DEFAULT_TENANT } else { tenant };
        self.tenants.iter().any(|t| t == "*" || t == tenant)
    }

    /// Shares a tenant with `tenants` (a stream's or a session's; none: the
    /// default tenant): what listings of streams and workers show it.
    pub fn shares_tenant(&self, tenants: &[String]) -> bool {
        if tenants.is_empty() {
            return self.in_tenant("");
        }
        tenants.iter().any(|t| self.in_tenant(t))
    }

    /// A request that names `tenant` (empty: the default tenant).
    pub fn require_tenant(&self, tenant: &str) -> Result<(), AuthError> {
        if self.in_tenant(tenant) {
            return Ok(());
        }
        let tenant = if tenant.is_empty() { DEFAULT_TENANT } else { tenant };
        Err(AuthError::PermissionDenied(format!(
            "{} may not act for tenant {tenant:?} (its tenants: {})",
            self.name,
            if self.tenants.is_empty() { "none".to_string() } else { self.tenants.join(", ") }
        )))
    }

    /// Every tenant a request names (none: the default tenant).
    pub fn require_tenants(&self, tenants: &[String]) -> Result<(), AuthError> {
        if tenants.is_empty() {
            return self.require_tenant("");
        }
        tenants.iter().try_for_each(|t| self.require_tenant(t))
    }

    /// May `verb` this job: it is in one of its tenants and its type is
    /// covered. A job of another tenant is not there for this principal.
    pub fn sees(&self, verb: Verb, job: &Job) -> bool {
        self.in_tenant(&job.spec.tenant) && self.may(verb, &job.spec.job_type)
    }

    /// A command on job `key` (of `job_tenant`, `job_type`) at `attempt`: as
    /// [`Principal::check_job`], except that a job token may work its own
    /// job at its own attempt and nothing else.
    pub fn check_command(
        &self,
        verb: Verb,
        job_tenant: &str,
        job_type: &str,
        key: u64,
        attempt: Option<u32>,
    ) -> Result<(), AuthError> {
        match self.job {
            // A token names an activation (attempt 1 or later), never the override.
            Some((own, own_attempt))
                if verb == Verb::Work && own == key && own_attempt != 0 && attempt == Some(own_attempt) =>
            {
                Ok(())
            }
            Some((own, own_attempt)) => Err(AuthError::PermissionDenied(format!(
                "a job token acts only on its own job and attempt (job {own} attempt {own_attempt}), and only to \
                 work it; this request is for job {key}{}",
                attempt.map(|a| format!(" attempt {a}")).unwrap_or_default()
            ))),
            // Attempt 0 fences nothing: it acts on the job whatever its
            // attempt, overriding whichever worker holds it. An operator's
            // tool, not a worker's default.
            None if verb == Verb::Work && attempt == Some(0) => {
                self.check_job(Verb::Work, job_tenant, job_type, key)?;
                if self.may(Verb::Manage, job_type) {
                    return Ok(());
                }
                Err(AuthError::PermissionDenied(format!(
                    "{} sent attempt 0 for job {key}, which acts whatever the job's attempt and so overrides the \
                     worker that holds it: that needs jobs:manage:{job_type}. A worker gives the attempt its \
                     activation answered.",
                    self.name
                )))
            }
            None => self.check_job(verb, job_tenant, job_type, key),
        }
    }

    /// Reading `job`: another tenant's job is NOT_FOUND, as if it did not
    /// exist; one of its tenants without the scope is PERMISSION_DENIED.
    pub fn check_job(&self, verb: Verb, job_tenant: &str, job_type: &str, key: u64) -> Result<(), AuthError> {
        if !self.in_tenant(job_tenant) {
            return Err(AuthError::NotFound(format!("no job with key {key}")));
        }
        self.require_job(verb, job_type)
    }
}

/// A refusal by authentication ([`crate::auth::Authenticator`]) or a
/// [`Principal`]'s checks, in their own words: the gateway maps each to its
/// gRPC status once ([`crate::gateway::ApiError`]), the admin server to its
/// HTTP status, the engine to a command's rejection.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(scopes: &[&str]) -> Principal {
        Principal {
            name: "t".into(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            tenants: vec!["acme".into()],
            job: None,
        }
    }

    #[test]
    fn attempt_zero_overrides_the_fence_and_so_needs_the_manage_scope() {
        let worker = holding(&["jobs:work:t"]);
        assert!(worker.check_command(Verb::Work, "acme", "t", 7, Some(3)).is_ok());
        let refused = worker.check_command(Verb::Work, "acme", "t", 7, Some(0)).unwrap_err();
        assert!(matches!(&refused, AuthError::PermissionDenied(m) if m.contains("jobs:manage:t")), "{refused:?}");
        let operator = holding(&["jobs:work:t", "jobs:manage:t"]);
        assert!(operator.check_command(Verb::Work, "acme", "t", 7, Some(0)).is_ok());
        // Another tenant's job stays NOT_FOUND, attempt 0 or not.
        let other = operator.check_command(Verb::Work, "globex", "t", 7, Some(0)).unwrap_err();
        assert!(matches!(other, AuthError::NotFound(_)), "{other:?}");
    }

    #[test]
    fn a_scope_covers_itself_and_a_star_covers_what_starts_with_its_prefix() {
        let p = holding(&["jobs:work:orders-*", "cluster:read"]);
        assert!(p.may(Verb::Work, "orders-eu"));
        assert!(p.may(Verb::Work, "orders-"));
        assert!(!p.may(Verb::Work, "order"));
        assert!(!p.may(Verb::Work, "payments"));
        assert!(!p.may(Verb::Create, "orders-eu"));
        assert!(p.has("cluster:read"));
        assert!(!p.has("cluster:readx"));
        assert!(!p.has("cluster:admin"));
        assert!(p.may_some(Verb::Work));
        assert!(!p.may_some(Verb::Read));
        let all_jobs = holding(&["jobs:*"]);
        assert!(all_jobs.may(Verb::Manage, "x") && all_jobs.may_some(Verb::Create));
        assert!(!all_jobs.has("cluster:read"));
        assert!(holding(&["*"]).has("anything:at:all"));
        let exact = holding(&["jobs:read:a"]);
        assert!(exact.may(Verb::Read, "a") && !exact.may(Verb::Read, "ab") && !exact.may(Verb::Read, ""));
        assert!(exact.may_some(Verb::Read));
    }

    #[test]
    fn tenants_are_listed_or_starred_and_empty_is_the_default_tenant() {
        let p = holding(&[]);
        assert!(p.in_tenant("acme"));
        assert!(!p.in_tenant("globex"));
        assert!(!p.in_tenant(""));
        let d = Principal { tenants: vec![DEFAULT_TENANT.into()], ..holding(&[]) };
        assert!(d.in_tenant("") && d.require_tenants(&[]).is_ok());
        let error = p.require_tenant("globex").unwrap_err();
        assert!(matches!(error, AuthError::PermissionDenied(_)), "{error}");
        assert!(error.to_string().contains("\"globex\""), "{error}");
        let missing = p.require_job(Verb::Create, "orders").unwrap_err();
        assert!(missing.to_string().contains("jobs:create:orders"), "{missing}");
        assert!(Principal::anonymous().unrestricted() && !p.unrestricted());
    }
}
