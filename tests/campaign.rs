//! A live campaign against a running 3-node cluster: seeded, mutated versions
//! of valid requests to every drover.v1 RPC (the client streams too) and to
//! every RPC of Zeebe's gateway that Drover serves (and two it does not),
//! through every gateway, for a bounded number of requests. Every answer must be a proper status (never
//! UNKNOWN or INTERNAL), and every node must still run and be ready at the end.

mod common;

use std::time::Duration;

use common::ProcessCluster;
use drover::client::Client;
use drover::proto::gateway::*;
use drover::proto::zeebe as zb;
use drover::proto::zeebe::gateway_client::GatewayClient as ZeebeClient;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::Code;

const REQUESTS: usize = 4000;

/// Values that break assumptions: empty, huge, odd characters, bad JSON.
struct Mutator {
    rng: StdRng,
    keys: Vec<u64>,
}

impl Mutator {
    fn text(&mut self) -> String {
        match self.rng.random_range(0..10) {
            0 => String::new(),
            1 => "x".repeat(self.rng.random_range(200..5000)),
            2 => "\u{0}\u{7f}é😀\n\t".into(),
            3 => "../../etc/passwd".into(),
            4 => "jepsen".into(),
            _ => "t".into(),
        }
    }

    fn json(&mut self) -> String {
        match self.rng.random_range(0..8) {
            0 => String::new(),
            1 => "{".into(),
            2 => "[1,2,3]".into(),
            3 => "null".into(),
            4 => format!(r#"{{"deep":{}{}}}"#, "[".repeat(200), "]".repeat(200)),
            5 => format!(r#"{{"big":"{}"}}"#, "y".repeat(self.rng.random_range(1000..100_000))),
            _ => r#"{"n":1}"#.into(),
        }
    }

    fn number(&mut self) -> i64 {
        match self.rng.random_range(0..8) {
            0 => 0,
            1 => -1,
            2 => i64::MAX,
            3 => i64::MIN,
            4 => self.rng.random_range(-1000..1000),
            _ => self.rng.random_range(1..60_000),
        }
    }

    fn key(&mut self) -> u64 {
        match self.rng.random_range(0..6) {
            0 => 0,
            1 => u64::MAX,
            2 => self.rng.random(),
            _ if !self.keys.is_empty() => self.keys[self.rng.random_range(0..self.keys.len())],
            _ => 1,
        }
    }

    fn attempt(&mut self) -> u32 {
        match self.rng.random_range(0..4) {
            0 => 0,
            1 => u32::MAX,
            _ => self.rng.random_range(1..4),
        }
    }

    fn strings(&mut self) -> Vec<String> {
        (0..self.rng.random_range(0..4)).map(|_| self.text()).collect()
    }

    fn filter(&mut self) -> Option<JobFilter> {
        self.rng.random_ratio(4, 5).then(|| JobFilter {
            state: self.text(),
            r#type: self.text(),
            tenant_id: self.text(),
            ..Default::default()
        })
    }

    /// One mutated call; its status (Ok for any answer that is not an error).
    async fn call(
        &mut self,
        client: &Client,
        zeebe: &ZeebeClient<tonic::transport::Channel>,
    ) -> (&'static str, Result<(), tonic::Status>) {
        let mut raw = client.raw();
        let which = self.rng.random_range(0..38);
        if which >= 28 {
            return self.zeebe_call(which - 28, zeebe.clone()).await;
        }
        let key = self.key();
        let attempt = self.attempt();
        let answer = match which {
            0 => {
                let request = CreateJobRequest {
                    r#type: self.text(),
                    variables: self.json(),
                    retries: Some(self.number() as i32),
                    tenant_id: if self.rng.random_ratio(1, 4) { self.text() } else { String::new() },
                    idempotency_key: if self.rng.random_ratio(1, 3) { self.text() } else { String::new() },
                    stages: self.strings(),
                    ..Default::default()
                };
                let made = raw.create_job(request).await.map(|r| r.into_inner().key);
                if let Ok(key) = made {
                    self.keys.push(key);
                }
                ("CreateJob", made.map(drop))
            }
            1 => {
                let request = ActivateJobsRequest {
                    r#type: self.text(),
                    worker: self.text(),
                    timeout: self.number(),
                    max_jobs_to_activate: self.number() as i32,
                    request_timeout: self.number().min(50),
                    fetch_variable: self.strings(),
                    tenant_ids: self.strings(),
                    ..Default::default()
                };
                ("ActivateJobs", raw.activate_jobs(request).await.map(drop))
            }
            2 => ("StreamActivatedJobs", raw.stream_activated_jobs(self.stream_request()).await.map(drop)),
            3 => (
                "CompleteJob",
                raw.complete_job(CompleteJobRequest {
                    key,
                    attempt,
                    variables: self.json(),
                    override_fence: self.rng.random(),
                })
                .await
                .map(drop),
            ),
            4 => {
                let request = FailJobRequest {
                    key,
                    attempt,
                    retries: self.number() as i32,
                    error_message: self.text(),
                    retry_back_off: self.number(),
                    reason: self.text(),
                    variables: self.json(),
                    override_fence: self.rng.random(),
                    ..Default::default()
                };
                ("FailJob", raw.fail_job(request).await.map(drop))
            }
            5 => {
                let request =
                    UpdateJobTimeoutRequest { key, attempt, timeout: self.number(), override_fence: self.rng.random() };
                ("UpdateJobTimeout", raw.update_job_timeout(request).await.map(drop))
            }
            6 => {
                let request = UpdateJobRetriesRequest { key, retries: self.number() as i32 };
                ("UpdateJobRetries", raw.update_job_retries(request).await.map(drop))
            }
            7 => ("CancelJob", raw.cancel_job(CancelJobRequest { key }).await.map(drop)),
            8 => {
                let request = GetJobRequest {
                    key,
                    idempotency_key: if self.rng.random_ratio(1, 3) { self.text() } else { String::new() },
                    tenant_id: self.text(),
                    ..Default::default()
                };
                ("GetJob", raw.get_job(request).await.map(drop))
            }
            9 => ("GetJobHistory", raw.get_job_history(GetJobRequest { key, ..Default::default() }).await.map(drop)),
            10 => {
                // Not 0: that waits the default minute, which would only slow the campaign.
                let timeout = match self.number().clamp(-5, 50) {
                    0 => 1,
                    t => t,
                };
                let request = AwaitJobRequest { key, timeout, ..Default::default() };
                ("AwaitJob", raw.await_job(request).await.map(drop))
            }
            11 => {
                let request = CheckpointJobRequest { key, attempt, stage: self.text(), variables: self.json() };
                ("CheckpointJob", raw.checkpoint_job(request).await.map(drop))
            }
            12 => {
                let request = ListJobsRequest {
                    filter: self.filter(),
                    page_size: self.number() as i32,
                    page_token: if self.rng.random_ratio(1, 3) { self.text() } else { String::new() },
                };
                ("ListJobs", raw.list_jobs(request).await.map(drop))
            }
            13 => {
                let request = RetryJobsRequest { filter: self.filter(), retries: self.number() as i32, dry_run: true };
                ("RetryJobs", raw.retry_jobs(request).await.map(drop))
            }
            14 => {
                let request = CancelJobsRequest { filter: self.filter(), dry_run: true };
                ("CancelJobs", raw.cancel_jobs(request).await.map(drop))
            }
            15 => ("Topology", raw.topology(TopologyRequest {}).await.map(drop)),
            16 => {
                let request = RegisterWorkerRequest {
                    worker_id: self.text(),
                    hostname: self.text(),
                    job_types: self.strings(),
                    labels: self.strings(),
                    tenant_ids: self.strings(),
                    heartbeat_interval: self.number(),
                    dead_after: self.number(),
                    concurrency: self.rng.random(),
                    ..Default::default()
                };
                ("RegisterWorker", raw.register_worker(request).await.map(drop))
            }
            17 => {
                let request = HeartbeatRequest {
                    session_id: self.key(),
                    state: self.text(),
                    jobs: vec![HeldJob { key, attempt }],
                };
                ("Heartbeat", raw.heartbeat(request).await.map(drop))
            }
            18 => {
                ("DeregisterWorker", raw.deregister_worker(DeregisterWorkerRequest { session_id: key }).await.map(drop))
            }
            19 => ("ListWorkers", raw.list_workers(ListWorkersRequest { label: self.text() }).await.map(drop)),
            20 => {
                let request =
                    SetWorkerStateRequest { session_id: key, label: self.text(), all: false, state: self.text() };
                ("SetWorkerState", raw.set_worker_state(request).await.map(drop))
            }
            21 => {
                let request = SetSchemaRequest { r#type: self.text(), schema: self.json() };
                ("SetSchema", raw.set_schema(request).await.map(drop))
            }
            22 => ("GetSchema", raw.get_schema(GetSchemaRequest { r#type: self.text() }).await.map(drop)),
            23 => {
                let requests: Vec<CreateJobRequest> = (0..self.rng.random_range(0..5))
                    .map(|_| CreateJobRequest {
                        r#type: self.text(),
                        variables: self.json(),
                        retries: Some(self.number() as i32),
                        ..Default::default()
                    })
                    .collect();
                ("CreateJobs", drain(raw.create_jobs(tokio_stream::iter(requests)).await).await)
            }
            24 => {
                let batches: Vec<CreateJobBatch> = (0..self.rng.random_range(0..3))
                    .map(|_| CreateJobBatch {
                        jobs: (0..self.rng.random_range(0..4))
                            .map(|_| CreateJobRequest {
                                r#type: self.text(),
                                variables: self.json(),
                                retries: Some(self.number() as i32),
                                ..Default::default()
                            })
                            .collect(),
                    })
                    .collect();
                ("CreateJobBatches", drain(raw.create_job_batches(tokio_stream::iter(batches)).await).await)
            }
            25 => {
                let batches: Vec<CompleteJobBatch> = (0..self.rng.random_range(0..3))
                    .map(|_| CompleteJobBatch {
                        jobs: (0..self.rng.random_range(0..4))
                            .map(|_| CompleteJobRequest {
                                key: self.key(),
                                attempt: self.attempt(),
                                variables: self.json(),
                                override_fence: self.rng.random(),
                            })
                            .collect(),
                    })
                    .collect();
                ("CompleteJobBatches", drain(raw.complete_job_batches(tokio_stream::iter(batches)).await).await)
            }
            26 => {
                let request = self.stream_request();
                ("StreamActivatedJobBatches", raw.stream_activated_job_batches(request).await.map(drop))
            }
            _ => {
                let requests: Vec<CompleteJobRequest> = (0..self.rng.random_range(0..5))
                    .map(|_| CompleteJobRequest {
                        key: self.key(),
                        attempt: self.attempt(),
                        variables: self.json(),
                        override_fence: self.rng.random(),
                    })
                    .collect();
                ("CompleteJobs", drain(raw.complete_jobs(tokio_stream::iter(requests)).await).await)
            }
        };
        answer
    }
}

impl Mutator {
    /// A mutated request for a stream of pushed jobs (either form).
    fn stream_request(&mut self) -> StreamActivatedJobsRequest {
        StreamActivatedJobsRequest {
            r#type: self.text(),
            worker: self.text(),
            timeout: self.number(),
            max_jobs_in_flight: self.number() as i32,
            tenant_ids: self.strings(),
            ..Default::default()
        }
    }

    /// A Zeebe job key: one of Drover's (with or without an activation tag) or a wild one.
    fn zeebe_key(&mut self) -> i64 {
        match self.rng.random_range(0..4) {
            0 => self.number(),
            _ => self.key() as i64,
        }
    }

    /// One mutated call to Zeebe's gateway service.
    async fn zeebe_call(
        &mut self,
        which: usize,
        mut zeebe: ZeebeClient<tonic::transport::Channel>,
    ) -> (&'static str, Result<(), tonic::Status>) {
        let job_key = self.zeebe_key();
        match which {
            0 => {
                let request = zb::ActivateJobsRequest {
                    r#type: self.text(),
                    worker: self.text(),
                    timeout: self.number(),
                    max_jobs_to_activate: self.number() as i32,
                    // Negative: answer at once; a long poll would only slow the campaign.
                    request_timeout: -1,
                    fetch_variable: self.strings(),
                    tenant_ids: self.strings(),
                };
                ("zeebe ActivateJobs", drain(zeebe.activate_jobs(request).await).await)
            }
            1 => {
                let request = zb::StreamActivatedJobsRequest {
                    r#type: self.text(),
                    worker: self.text(),
                    timeout: self.number(),
                    fetch_variable: self.strings(),
                    tenant_ids: self.strings(),
                };
                ("zeebe StreamActivatedJobs", zeebe.stream_activated_jobs(request).await.map(drop))
            }
            2 => {
                let request = zb::CompleteJobRequest { job_key, variables: self.json() };
                ("zeebe CompleteJob", zeebe.complete_job(request).await.map(drop))
            }
            3 => {
                let request = zb::FailJobRequest {
                    job_key,
                    retries: self.number() as i32,
                    error_message: self.text(),
                    retry_back_off: self.number(),
                    variables: self.json(),
                };
                ("zeebe FailJob", zeebe.fail_job(request).await.map(drop))
            }
            4 => {
                let request = zb::ThrowErrorRequest {
                    job_key,
                    error_code: self.text(),
                    error_message: self.text(),
                    variables: self.json(),
                };
                ("zeebe ThrowError", zeebe.throw_error(request).await.map(drop))
            }
            5 => {
                let request = zb::UpdateJobRetriesRequest { job_key, retries: self.number() as i32 };
                ("zeebe UpdateJobRetries", zeebe.update_job_retries(request).await.map(drop))
            }
            6 => {
                let request = zb::UpdateJobTimeoutRequest { job_key, timeout: self.number() };
                ("zeebe UpdateJobTimeout", zeebe.update_job_timeout(request).await.map(drop))
            }
            7 => ("zeebe Topology", zeebe.topology(zb::TopologyRequest {}).await.map(drop)),
            8 => {
                let request =
                    zb::PublishMessageRequest { name: self.text(), variables: self.json(), ..Default::default() };
                ("zeebe PublishMessage", zeebe.publish_message(request).await.map(drop))
            }
            _ => {
                let request = zb::CreateProcessInstanceRequest { bpmn_process_id: self.text(), ..Default::default() };
                ("zeebe CreateProcessInstance", zeebe.create_process_instance(request).await.map(drop))
            }
        }
    }
}

/// A streamed answer read to its end: its first error, if any.
async fn drain<T>(answer: Result<tonic::Response<tonic::Streaming<T>>, tonic::Status>) -> Result<(), tonic::Status> {
    let mut stream = answer?.into_inner();
    while let Some(item) = stream.message().await.transpose() {
        item?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutated_requests_to_every_rpc_get_proper_statuses_and_every_node_stays_up() {
    let mut cluster = ProcessCluster::start(3, 3, 3, &[]);
    cluster.wait_ready().await;
    let clients: Vec<Client> = (0..3).map(|i| Client::connect_lazy(&cluster.gateway(i)).unwrap()).collect();
    let zeebes: Vec<ZeebeClient<tonic::transport::Channel>> = (0..3)
        .map(|i| {
            let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.node(i).grpc)).unwrap();
            ZeebeClient::new(endpoint.connect_lazy())
        })
        .collect();
    let mut mutator = Mutator { rng: StdRng::seed_from_u64(20261124), keys: Vec::new() };
    let mut improper = Vec::new();
    let mut by_code: std::collections::BTreeMap<String, usize> = Default::default();
    let mut slowest: std::collections::BTreeMap<&str, Duration> = Default::default();
    for i in 0..REQUESTS {
        let started = std::time::Instant::now();
        let (rpc, answer) = mutator.call(&clients[i % 3], &zeebes[i % 3]).await;
        let took = started.elapsed();
        let slowest = slowest.entry(rpc).or_insert(Duration::ZERO);
        *slowest = (*slowest).max(took);
        let code = answer.as_ref().err().map_or(Code::Ok, |s| s.code());
        *by_code.entry(format!("{code:?}")).or_default() += 1;
        if matches!(code, Code::Unknown | Code::Internal) {
            improper.push(format!("request {i} ({rpc}): {:?}", answer.unwrap_err()));
        }
    }
    println!("{REQUESTS} mutated requests: {by_code:?}");
    println!("the slowest answer of each RPC: {slowest:?}");
    assert!(improper.is_empty(), "{} improper answers:\n{}", improper.len(), improper.join("\n"));
    for id in 0..3 {
        let node = cluster.nodes[id].as_mut().expect("started");
        assert!(node.child.try_wait().unwrap().is_none(), "node {id} exited during the campaign");
    }
    tokio::time::timeout(Duration::from_secs(30), cluster.wait_ready())
        .await
        .expect("every node ready after the campaign");
}
