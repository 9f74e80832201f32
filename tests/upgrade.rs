//! A data directory written by the previous release opens with this build:
//! migrated in place, with every job, session, schema and idempotency key
//! intact. The fixture (`tests/fixtures/format-6.tar.gz`) is a real data
//! directory of storage format 6, made by `scripts/make-upgrade-fixture.sh`
//! with the release before versioned encodings.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use common::NodeProcess;
use drover::proto::gateway::*;
use tonic::Code;

/// The fixture's node ran with these: the test's must keep them (they are
/// the node's settings, not the records').
const FLAGS: [&str; 4] = ["--idempotency-window-secs", "315360000", "--finished-retention-secs", "315360000"];

fn unpack(into: &Path) {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-6.tar.gz");
    std::fs::create_dir_all(into).unwrap();
    let status = std::process::Command::new("tar").arg("-C").arg(into).arg("-xzf").arg(&fixture).status().unwrap();
    assert!(status.success(), "unpacking {}", fixture.display());
}

fn format_of(dir: &Path) -> serde_json::Value {
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cluster.json")).unwrap()).unwrap();
    record
}

/// Every job, by type (the fixture has one of each).
async fn jobs_by_type(client: &drover::client::Client) -> BTreeMap<String, Job> {
    let listed = client
        .raw()
        .list_jobs(ListJobsRequest { page_size: 100, ..Default::default() })
        .await
        .expect("ListJobs")
        .into_inner();
    listed.jobs.into_iter().map(|job| (job.r#type.clone(), job)).collect()
}

async fn check(node: &NodeProcess) {
    node.wait_ready().await;
    let client = node.client().await;
    let jobs = jobs_by_type(&client).await;
    let types: Vec<&str> = jobs.keys().map(String::as_str).collect();
    assert_eq!(types, ["broken", "delayed", "done", "gone", "held", "keyed", "plain", "typed"], "every job is there");
    let state = |t: &str| jobs[t].state.as_str();
    assert_eq!(state("done"), "completed");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&jobs["done"].result).unwrap(),
        serde_json::json!({"sent": true})
    );
    assert_eq!(state("broken"), "incident");
    assert_eq!(jobs["broken"].error_message, "printer on fire");
    assert_eq!(state("gone"), "cancelled");
    assert_eq!(state("delayed"), "scheduled");
    assert_eq!(state("plain"), "activatable");
    assert_eq!(jobs["plain"].custom_headers.get("channel").map(String::as_str), Some("ops"));
    assert_eq!(jobs["plain"].priority, 5);
    assert_eq!(state("held"), "activated", "the worker's ten-year activation holds");
    assert_ne!(jobs["held"].session_id, 0, "held through the worker's session");

    // The history of a job came through whole.
    let history = client
        .raw()
        .get_job_history(GetJobRequest { key: jobs["broken"].key, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let kinds: Vec<&str> = history.events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["created", "activated", "failed", "incident"], "{kinds:?}");

    // The worker's session is live (the new leader renewed its lease).
    let workers = client.raw().list_workers(ListWorkersRequest::default()).await.unwrap().into_inner().workers;
    let session = workers.iter().find(|w| w.worker_id == "fixture-worker").expect("the fixture's worker session");
    assert_eq!(session.session_id, jobs["held"].session_id);
    assert_eq!(session.held_jobs, 1);

    // The schema still holds creates of its type to it.
    let refused = client
        .raw()
        .create_job(CreateJobRequest { r#type: "typed".into(), variables: r#"{"x":1}"#.into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");

    // The idempotency key still names its job.
    let again = client
        .raw()
        .create_job(CreateJobRequest {
            r#type: "keyed".into(),
            variables: r#"{"order":77}"#.into(),
            idempotency_key: "order-77".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((again.key, again.created), (jobs["keyed"].key, false), "the key's job, not a new one");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_format_6_data_directory_is_migrated_with_every_job_session_schema_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("node");
    unpack(&data);
    assert_eq!(format_of(&data)["format"], 6, "the fixture is of the previous format");

    let mut node = NodeProcess::start(&data, &FLAGS);
    check(&node).await;
    let record = format_of(&data);
    assert_eq!(record["format"], drover_format(), "{record}");
    assert!(record.get("migrating_from").is_none(), "the migration finished: {record}");

    // Restarted, it reads its own records: nothing is migrated twice.
    node.signal(libc::SIGTERM);
    node.exited(Duration::from_secs(30)).await;
    let node = NodeProcess::start(&data, &FLAGS);
    check(&node).await;
}

/// The format this build writes, as `cluster.json` records it.
fn drover_format() -> u64 {
    7
}

/// Once every member has spoken this build's data version, each node records
/// it as the cluster version (in its data directory, for good), reports it,
/// and refuses a caller that speaks an older one.
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_records_the_version_every_member_speaks_and_refuses_older_callers_after() {
    let cluster = common::ProcessCluster::start(3, 1, 3, &[]);
    let version = u64::from(drover::codec::DATA_VERSION);
    for id in 0..3 {
        let dir = cluster.data_dir(id);
        common::eventually(Duration::from_secs(30), "every node to record the cluster version", || {
            let dir = dir.clone();
            async move { format_of(&dir)["cluster_version"] == version }
        })
        .await;
        assert_eq!(cluster.metric(id, "drover_cluster_version").await, version as f64);
    }
    let client = drover::client::Client::connect(&cluster.gateway(0)).await.unwrap();
    let topology = client.topology().await.unwrap();
    assert_eq!(u64::from(topology.cluster_version), version);
    for broker in &topology.brokers {
        assert_eq!(u64::from(broker.data_version), version, "node {} as node 0 heard it", broker.node_id);
    }

    // A caller naming no version speaks the oldest: refused, saying why.
    let address = format!("http://{}", cluster.node(1).cluster);
    let mut old = drover::proto::cluster::cluster_client::ClusterClient::connect(address.clone()).await.unwrap();
    let refused = old.status(drover::proto::cluster::StatusRequest {}).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("run a build of data version"), "{}", refused.message());
    let mut current = common::peer(address).await.unwrap();
    current.status(drover::proto::cluster::StatusRequest {}).await.expect("a caller of this version is answered");
}
