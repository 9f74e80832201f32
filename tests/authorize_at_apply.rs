//! Authorization decided where the job lives: with the gateway's fast-path
//! checks skipped (the `gateway_skip_checks` failpoint, armed for this whole
//! binary), a principal of another tenant still neither changes a job nor
//! acts as a worker session, because the partition judges each command
//! with its principal at apply.

mod common;

use common::LocalNode;
use drover::auth::keys::{generate_secret, token_entry};
use drover::client::Client;
use drover::proto::gateway::*;
use tonic::Code;

struct Tenants {
    _dir: tempfile::TempDir,
    node: LocalNode,
    acme: Client,
    globex: Client,
}

/// One node with tokens on: `jobs:*` tokens for tenants acme and globex.
async fn start() -> Tenants {
    // Each test binary is its own process, and this one wants the failpoint everywhere.
    std::env::set_var("DROVER_FAILPOINTS", "gateway_skip_checks=1000000");
    let dir = tempfile::tempdir().unwrap();
    let (acme, globex) = (generate_secret(), generate_secret());
    let scopes = vec!["jobs:*".to_string()];
    let text = token_entry("acme", &acme, &scopes, &["acme".into()])
        + &token_entry("globex", &globex, &scopes, &["globex".into()]);
    let file = dir.path().join("tokens.toml");
    std::fs::write(&file, text).unwrap();
    let node = LocalNode::start_with(move |config| config.auth.tokens_file = Some(file)).await;
    let (acme, globex) = (node.client.with_token(&acme).unwrap(), node.client.with_token(&globex).unwrap());
    Tenants { _dir: dir, node, acme, globex }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_gateways_checks_skipped_another_tenant_still_changes_nothing() {
    let Tenants { acme, globex, node: _node, .. } = start().await;
    let register = RegisterWorkerRequest {
        worker_id: "acme-worker".into(),
        job_types: vec!["t".into()],
        tenant_ids: vec!["acme".into()],
        heartbeat_interval: 1_000,
        dead_after: 60_000,
        ..Default::default()
    };
    let session = acme.raw().register_worker(register).await.unwrap().into_inner().session_id;
    let create = CreateJobRequest {
        r#type: "t".into(),
        tenant_id: "acme".into(),
        variables: r#"{"owner":"acme"}"#.into(),
        retries: Some(3),
        ..Default::default()
    };
    let key = acme.create(create).await.unwrap();
    let activate = ActivateJobsRequest {
        r#type: "t".into(),
        max_jobs_to_activate: 1,
        timeout: 600_000,
        tenant_ids: vec!["acme".into()],
        session_id: session,
        ..Default::default()
    };
    let jobs = acme.raw().activate_jobs(activate).await.unwrap().into_inner().message().await.unwrap().unwrap().jobs;
    assert_eq!(jobs.iter().map(|j| j.key).collect::<Vec<_>>(), [key]);
    let attempt = jobs[0].attempt;

    let forged = r#"{"owner":"globex"}"#.to_string();
    let attempts = [
        (
            "complete",
            globex
                .raw()
                .complete_job(CompleteJobRequest { key, attempt, variables: forged.clone(), override_fence: false })
                .await,
        ),
        (
            "fail",
            globex
                .raw()
                .fail_job(FailJobRequest { key, attempt, retries: 0, variables: forged, ..Default::default() })
                .await
                .map(|_| tonic::Response::new(CompleteJobResponse::default())),
        ),
        (
            "retries",
            globex
                .raw()
                .update_job_retries(UpdateJobRetriesRequest { key, retries: 99 })
                .await
                .map(|_| tonic::Response::new(CompleteJobResponse::default())),
        ),
        (
            "cancel",
            globex
                .raw()
                .cancel_job(CancelJobRequest { key })
                .await
                .map(|_| tonic::Response::new(CompleteJobResponse::default())),
        ),
    ];
    for (what, answer) in attempts {
        let refused = answer.expect_err(what);
        assert_eq!(refused.code(), Code::NotFound, "globex's {what} of acme's job: {refused:?}");
    }
    let job = acme.get_job(key).await.unwrap();
    assert_eq!((job.state.as_str(), job.attempt, job.retries), ("activated", attempt, 3), "{job:?}");
    assert!(job.variables.contains("acme"), "the variables are acme's: {}", job.variables);

    let beat = HeartbeatRequest { session_id: session, state: "terminate".into(), ..Default::default() };
    let refused = globex.raw().heartbeat(beat).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "globex beats acme's session: {refused:?}");
    let end = DeregisterWorkerRequest { session_id: session };
    let refused = globex.raw().deregister_worker(end).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "globex ends acme's session: {refused:?}");

    // acme's session lives on, holding its job, in the state acme reported.
    let beat = HeartbeatRequest { session_id: session, jobs: vec![HeldJob { key, attempt }], ..Default::default() };
    let beaten = acme.raw().heartbeat(beat).await.unwrap().into_inner();
    assert_eq!((beaten.state.as_str(), beaten.revoked.len()), ("running", 0));
    acme.complete(key, attempt, "{}").await.unwrap();
}
