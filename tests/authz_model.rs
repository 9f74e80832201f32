//! The authorization layer against a small reference model of who may do
//! what: random principals (scopes, tenants, job tokens) × verbs × jobs
//! (tenant, type) × attempts, every decision the leader's check makes (and
//! the tenant and scope tests listings filter with) compared with the
//! model's, over 100,000 cases.
//!
//! The model is written from docs/security.md, not from the code: a scope
//! covers a need when equal, or when it ends in `*` and the need starts
//! with what comes before; another tenant's job is NOT_FOUND before any
//! scope is looked at; attempt 0 on a worker's command needs the manage
//! scope too; a job token works its own job at its own attempt and nothing
//! else, and one naming attempt 0 (the override, for which none is minted)
//! works nothing.

use drover::auth::{AuthError, Principal, Verb};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SCOPES: [&str; 12] = [
    "*",
    "jobs:*",
    "jobs:work:*",
    "jobs:work:pay",
    "jobs:work:pay*",
    "jobs:read:pay-eu",
    "jobs:read:*",
    "jobs:manage:pay",
    "jobs:manage:*",
    "jobs:create:ship",
    "jobs:wor*",
    "cluster:read",
];
const TENANTS: [&str; 4] = ["*", "acme", "globex", "<default>"];
const JOB_TENANTS: [&str; 4] = ["acme", "globex", "", "initech"];
const TYPES: [&str; 4] = ["pay", "pay-eu", "ship", "p"];
const VERBS: [Verb; 4] = [Verb::Create, Verb::Work, Verb::Read, Verb::Manage];

#[derive(Debug, PartialEq)]
enum Decision {
    Allowed,
    NotFound,
    Denied,
}

fn decided(result: Result<(), AuthError>) -> Decision {
    match result {
        Ok(()) => Decision::Allowed,
        Err(AuthError::NotFound(_)) => Decision::NotFound,
        Err(AuthError::PermissionDenied(_)) => Decision::Denied,
        Err(other) => panic!("a check answered {other:?}"),
    }
}

/// The model: does `held` cover `needed`?
fn covers(held: &str, needed: &str) -> bool {
    match held.strip_suffix('*') {
        Some(prefix) => needed.starts_with(prefix),
        None => held == needed,
    }
}

fn model_may(scopes: &[String], verb: Verb, job_type: &str) -> bool {
    let needed = format!("jobs:{}:{job_type}", verb.as_str());
    scopes.iter().any(|s| covers(s, &needed))
}

fn model_in_tenant(tenants: &[String], job_tenant: &str) -> bool {
    let tenant = if job_tenant.is_empty() { "<default>" } else { job_tenant };
    tenants.iter().any(|t| t == "*" || t == tenant)
}

/// What the model says of a command `verb` on a job of `job_tenant` and
/// `job_type`, keyed `key`, at `attempt`.
fn model(
    principal: &Principal,
    verb: Verb,
    (job_tenant, job_type, key): (&str, &str, u64),
    attempt: Option<u32>,
) -> Decision {
    if let Some((own, own_attempt)) = principal.job {
        let own_work = verb == Verb::Work && own == key && own_attempt != 0 && attempt == Some(own_attempt);
        return if own_work { Decision::Allowed } else { Decision::Denied };
    }
    if !model_in_tenant(&principal.tenants, job_tenant) {
        return Decision::NotFound;
    }
    let mut allowed = model_may(&principal.scopes, verb, job_type);
    if verb == Verb::Work && attempt == Some(0) {
        allowed &= model_may(&principal.scopes, Verb::Manage, job_type);
    }
    if allowed {
        Decision::Allowed
    } else {
        Decision::Denied
    }
}

fn random_principal(rng: &mut StdRng) -> Principal {
    if rng.random_ratio(1, 8) {
        return Principal::for_job(rng.random_range(1..4), rng.random_range(0..3));
    }
    let pick = |rng: &mut StdRng, from: &[&str], most: usize| -> Vec<String> {
        (0..rng.random_range(0..=most)).map(|_| from[rng.random_range(0..from.len())].to_string()).collect()
    };
    let scopes = pick(rng, &SCOPES, 3);
    let tenants = pick(rng, &TENANTS, 2);
    Principal { name: "model".into(), scopes, tenants, job: None }
}

#[test]
fn every_decision_of_the_authorization_layer_agrees_with_the_model() {
    let mut rng = StdRng::seed_from_u64(0x5eed_a07f);
    let mut decisions = [0usize; 3];
    for case in 0..100_000 {
        let principal = random_principal(&mut rng);
        let verb = VERBS[rng.random_range(0..VERBS.len())];
        let job_tenant = JOB_TENANTS[rng.random_range(0..JOB_TENANTS.len())];
        let job_type = TYPES[rng.random_range(0..TYPES.len())];
        let key = rng.random_range(1..4);
        let attempt = match verb {
            Verb::Work => Some(rng.random_range(0..3)),
            _ => None,
        };
        let expected = model(&principal, verb, (job_tenant, job_type, key), attempt);
        let got = decided(principal.check_command(verb, job_tenant, job_type, key, attempt));
        assert_eq!(
            got, expected,
            "case {case}: {principal:?} {verb:?} on a {job_type:?} job of tenant {job_tenant:?} (key {key}) at \
             attempt {attempt:?}"
        );
        decisions[expected as usize] += 1;

        // What listings and the gateway's fast path ask: its tenants, its types.
        if principal.job.is_none() {
            assert_eq!(
                principal.in_tenant(job_tenant),
                model_in_tenant(&principal.tenants, job_tenant),
                "case {case}: {principal:?} in tenant {job_tenant:?}"
            );
            assert_eq!(
                principal.may(verb, job_type),
                model_may(&principal.scopes, verb, job_type),
                "case {case}: {principal:?} may {verb:?} {job_type:?}"
            );
        }
    }
    // Every outcome came up often: the cases explore the whole table.
    assert!(decisions.iter().all(|n| *n > 5_000), "decisions allowed / not found / denied: {decisions:?}");
}
