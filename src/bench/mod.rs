//! `drover bench`: throughput and latency of a cluster, measured through the
//! public gRPC API the way users compare brokers.
//!
//! - `throughput`: producers create `--jobs` jobs over `CreateJobBatches`
//!   streams with up to `--in-flight` unacknowledged creates each (the creates
//!   the window allows leave together in one message), while workers receive
//!   them over `StreamActivatedJobBatches` and complete the jobs of each message
//!   together over `CompleteJobBatches`. `--one-job-per-message` uses the
//!   one-job forms (`CreateJobs`, `StreamActivatedJobs`, `CompleteJobs`).
//!   Every payload carries a sequence number, so lost and doubly completed jobs
//!   are counted, not assumed.
//! - `latency`: a fixed `--rate` of creates for `--duration`; the latency is
//!   "worker received - create sent", in an HDR histogram. The rate is split
//!   over one paced producer per gateway that leads a partition (per gateway
//!   given, without the topology), so the creates spread over the partitions
//!   as a fleet of producers' would; `--latency-producers 1` puts them all on
//!   one gateway, and so, with `--create-placement local`, on its partition.
//!
//! - `failover` and `rolling-restart` (with `--local-nodes` ≥ 3): what
//!   clients wait while a leader is killed, and while every node is
//!   restarted in turn; see [`faults`].
//!
//! With `--tls` (and `--local-nodes`), every port of every node serves TLS,
//! and clients connect over it.
//!
//! With `--zeebe`, workers use Zeebe's protocol instead (StreamActivatedJobs
//! and one CompleteJob call per job); `--one-by-one` works the same way
//! through drover.v1. The two measure what the Zeebe facade itself costs.

mod conditions;
pub mod delay;
mod faults;
mod limited;
mod local;
mod ojs;
mod regions;
mod stages;
mod workload;

use std::time::Duration;

use anyhow::{bail, Context};
use serde::Serialize;

pub use local::{admin_get, LocalCluster};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    Throughput,
    Latency,
    /// Partition 0's leader SIGKILLed `--kills` times under creates: the
    /// longest pause in acknowledgements after each kill.
    Failover,
    /// Every node SIGTERMed and restarted in turn under creates and
    /// completions: the longest any of them waited.
    #[value(name = "rolling-restart")]
    #[serde(rename = "rolling-restart")]
    RollingRestart,
    /// The throughput workload's jobs through the Open Job Spec HTTP binding:
    /// one request per enqueue, per fetch of up to 32 jobs and per ack.
    Ojs,
    /// A queue limited to --limit-rate jobs a second, a backlog beyond it and
    /// a streaming worker per gateway, the home partition's leader killed
    /// half way through --duration: what the workers receive each second
    /// (needs --local-nodes 3 or more).
    Limited,
    /// Five local nodes in two regions, 40 ms apart each way: create-to-worker
    /// latency of a worker in each region at --rate, with leaders in one
    /// region, then the other (starts its own nodes; --local-nodes is not used).
    Regions,
}

#[derive(clap::Args, Clone, Debug, Serialize)]
pub struct BenchArgs {
    /// Workloads to run, in order.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "throughput,latency")]
    pub workload: Vec<Workload>,
    /// Gateways of a running cluster (comma separated). Ignored with --local-nodes.
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:26500")]
    pub address: Vec<String>,
    /// OJS HTTP ports of a running cluster, for the ojs workload (comma
    /// separated). Ignored with --local-nodes.
    #[arg(long, value_delimiter = ',')]
    pub ojs_address: Vec<String>,
    /// Start this many local nodes in temporary directories for the run.
    #[arg(long)]
    pub local_nodes: Option<usize>,
    /// With --local-nodes: keep the nodes' data directories and logs
    /// (node-N.log) here instead of a temporary directory.
    #[arg(long)]
    pub local_dir: Option<std::path::PathBuf>,
    /// Partitions of the local cluster.
    #[arg(long, default_value_t = 1)]
    pub partitions: u32,
    /// Replication factor of the local cluster.
    #[arg(long, default_value_t = 1)]
    pub replication_factor: u32,
    /// Jobs of the throughput workload.
    #[arg(long, default_value_t = 100_000)]
    pub jobs: u64,
    /// Size of each job's JSON variables.
    #[arg(long, default_value_t = 256)]
    pub payload_bytes: usize,
    /// Pad the variables with characters that do not compress (storage
    /// then holds what the payloads weigh: for sizing a partition's state).
    #[arg(long)]
    pub incompressible: bool,
    /// Concurrent producers.
    #[arg(long, default_value_t = 4)]
    pub producers: usize,
    /// Producers of the latency workload, each at --rate divided by their
    /// number. [default: one per gateway that leads a partition, or per
    /// gateway given when the topology is not known or with --unrouted]
    #[arg(long)]
    pub latency_producers: Option<usize>,
    /// Unacknowledged creates per producer.
    #[arg(long, default_value_t = 256)]
    pub in_flight: usize,
    /// Workers receiving over StreamActivatedJobs.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Creates per second of the latency workload.
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Seconds the latency workload runs.
    #[arg(long, default_value_t = 20)]
    pub duration: u64,
    /// The limited workload's limit, jobs a second.
    #[arg(long, default_value_t = 1000)]
    pub limit_rate: u64,
    /// Leader kills the failover workload makes.
    #[arg(long, default_value_t = 5)]
    pub kills: usize,
    /// How long the rolling restart keeps each node down before starting it
    /// again (a pod being replaced), ms.
    #[arg(long, default_value_t = 5_000)]
    pub down_ms: u64,
    /// Give every create an idempotency key (unique per job), so each one
    /// costs what a keyed create costs: the key's entry, kept for its window.
    #[arg(long)]
    pub idempotency_keys: bool,
    /// Workers speak Zeebe's gateway protocol (gateway_protocol.Gateway):
    /// they stream jobs through it and complete each with a CompleteJob
    /// call, as Zeebe's clients do, with the per-stream limit a Zeebe stream
    /// gets. Producers still create through drover.v1.
    #[arg(long)]
    pub zeebe: bool,
    /// Producers and workers send and receive one job per message
    /// (CreateJobs, StreamActivatedJobs, CompleteJobs) instead of the batch
    /// forms (CreateJobBatches, StreamActivatedJobBatches, CompleteJobBatches).
    #[arg(long)]
    pub one_job_per_message: bool,
    /// Workers work as Zeebe's clients do (as with --zeebe: the default
    /// per-stream limit, a CompleteJob call per job) but through drover.v1,
    /// so that the two runs differ only in the service.
    #[arg(long)]
    pub one_by_one: bool,
    /// With --local-nodes: TLS on every port of every node (a throwaway CA,
    /// mutual TLS between nodes), clients over TLS.
    #[arg(long)]
    pub tls: bool,
    /// With --local-nodes: bearer tokens on (a tokens file), and every client
    /// sends a token holding jobs:* and cluster:read for the default tenant,
    /// so each keyed command is checked against its job. Against a running
    /// cluster, clients send $DROVER_TOKEN.
    #[arg(long)]
    pub tokens: bool,
    /// The PEM CA that signs a running cluster's gateway certificates, for
    /// `https://` addresses. [default: $DROVER_TLS_CA, else the public web's roots]
    #[arg(long)]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Print JSON instead of a table: with --local-nodes first an object
    /// with the conditions, then one object per workload.
    #[arg(long)]
    pub json: bool,
    /// Clients do not learn the topology: producers use the gateways in
    /// the order given and workers complete through their stream's gateway,
    /// instead of producers using gateways on partition leaders and workers
    /// completing on the job's partition leader (which saves the forwards).
    #[arg(long)]
    pub unrouted: bool,
    /// With --local-nodes: the nodes' `--push-placement` (`random`, the
    /// nodes' default, or `local`: a leader prefers an equivalent stream on
    /// its own gateway to the one picked at random).
    #[arg(long, value_enum)]
    pub push_placement: Option<PushPlacement>,
}

/// The nodes' `--push-placement`, for `drover bench --local-nodes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PushPlacement {
    Random,
    Local,
}

impl PushPlacement {
    fn as_str(self) -> &'static str {
        match self {
            PushPlacement::Random => "random",
            PushPlacement::Local => "local",
        }
    }
}

/// How long the bench waits for the local nodes' leadership to balance.
const BALANCE_WAIT: Duration = Duration::from_secs(20);

#[derive(Serialize)]
struct Report<'a, F: Serialize> {
    workload: Workload,
    parameters: &'a BenchArgs,
    figures: F,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<bool> {
    if args.jobs == 0
        || args.producers == 0
        || args.latency_producers == Some(0)
        || args.workers == 0
        || args.in_flight == 0
    {
        bail!("--jobs, --producers, --latency-producers, --workers and --in-flight must be at least 1");
    }
    let tokens_dir = tempfile::Builder::new().prefix("drover-bench-tokens-").tempdir()?;
    let token = match (args.tokens, args.local_nodes) {
        (true, Some(_)) => {
            let secret = crate::auth::keys::generate_secret();
            let scopes = ["jobs:*".to_string(), "cluster:read".to_string()];
            let entry = crate::auth::keys::token_entry("bench", &secret, &scopes, &["<default>".to_string()]);
            std::fs::write(tokens_dir.path().join("tokens.toml"), entry)?;
            Some(secret)
        }
        (true, None) => bail!("--tokens makes a tokens file for --local-nodes; for a running cluster set DROVER_TOKEN"),
        (false, _) => None,
    };
    // The conditions go first, so that every figure below is read beside them.
    let mut floor_ms = None;
    if args.local_nodes.is_some() {
        let disk = args.local_dir.clone().unwrap_or_else(std::env::temp_dir);
        std::fs::create_dir_all(&disk).with_context(|| format!("creating {}", disk.display()))?;
        let conditions = conditions::measure(&disk, 200).context("measuring the disk's fdatasync latency")?;
        floor_ms = Some(conditions.floor_ms);
        if args.json {
            println!("{}", serde_json::json!({ "conditions": conditions }));
        } else {
            conditions.print();
        }
    }
    let mut cluster = match args.local_nodes {
        Some(n) => {
            let mut extra: Vec<String> = match &token {
                Some(_) => vec!["--tokens-file".into(), tokens_dir.path().join("tokens.toml").display().to_string()],
                None => Vec::new(),
            };
            if let Some(placement) = args.push_placement {
                extra.extend(["--push-placement".to_string(), placement.as_str().to_string()]);
            }
            let mut cluster = LocalCluster::start_with(
                n,
                args.partitions,
                args.replication_factor,
                args.local_dir.as_deref(),
                &extra,
                args.tls,
            )?;
            cluster.token = token.clone();
            cluster.wait_ready(Duration::from_secs(60)).await?;
            // Figures taken while one node leads every partition are another
            // cluster's: wait for leader balance (DROVER_BALANCE_LEADERS=false
            // turns it off, and then this gives up after the limit).
            let led = cluster.wait_balanced(args.partitions as usize, BALANCE_WAIT).await;
            if local::imbalance(&led) > 1 {
                eprintln!("bench: leadership is not balanced after {BALANCE_WAIT:?}: partitions led per node {led:?}");
            }
            Some(cluster)
        }
        None => None,
    };
    workload::authenticate(token);
    let gateways = match &cluster {
        Some(c) => c.gateways(),
        None => args.address.clone(),
    };
    let ca = match (&cluster, &args.tls_ca) {
        (Some(cluster), _) => cluster.ca().map(<[u8]>::to_vec),
        (None, Some(path)) => Some(std::fs::read(path).with_context(|| format!("reading {}", path.display()))?),
        (None, None) => None,
    };
    workload::trust(ca);
    let mut clean = true;
    let mut leadership_changed = false;
    for workload in &args.workload {
        if *workload == Workload::Regions {
            let figures = regions::regions(&args).await?;
            if args.json {
                println!("{}", serde_json::to_string(&Report { workload: *workload, parameters: &args, figures })?);
            } else {
                figures.print();
            }
            continue;
        }
        if *workload == Workload::Ojs {
            let addresses = match &cluster {
                Some(cluster) => cluster.nodes.iter().map(|n| n.ojs.clone()).collect(),
                None => args.ojs_address.clone(),
            };
            let figures = ojs::ojs(&args, &addresses, cluster.as_ref()).await?;
            clean &= figures.lost == 0 && figures.completed_twice == 0;
            if args.json {
                println!("{}", serde_json::to_string(&Report { workload: *workload, parameters: &args, figures })?);
            } else {
                figures.print();
            }
            continue;
        }
        if *workload == Workload::Limited {
            let Some(cluster) = cluster.as_mut() else {
                bail!("the limited workload kills and restarts a node: it needs --local-nodes");
            };
            let figures = limited::limited(&args, cluster).await?;
            if args.json {
                println!("{}", serde_json::to_string(&Report { workload: *workload, parameters: &args, figures })?);
            } else {
                figures.print();
            }
            continue;
        }
        if matches!(workload, Workload::Failover | Workload::RollingRestart) {
            let Some(cluster) = cluster.as_mut() else {
                bail!("the {workload:?} workload kills and restarts nodes: it needs --local-nodes");
            };
            let figures = match workload {
                Workload::Failover => faults::failover(&args, cluster).await?,
                _ => faults::rolling_restart(&args, cluster).await?,
            };
            if args.json {
                println!("{}", serde_json::to_string(&Report { workload: *workload, parameters: &args, figures })?);
            } else {
                figures.print(&format!("{workload:?}"));
            }
            continue;
        }
        let figures = match workload {
            Workload::Throughput => workload::throughput(&args, &gateways, cluster.as_ref()).await?,
            _ => workload::latency(&args, &gateways, cluster.as_ref()).await?,
        };
        clean &= figures.lost == 0 && figures.completed_twice == 0;
        leadership_changed |= figures.leadership_changed();
        if args.json {
            println!("{}", serde_json::to_string(&Report { workload: *workload, parameters: &args, figures })?);
        } else {
            figures.print(*workload);
            // The same latency read against this disk: what a newcomer's
            // rerun on another disk should land near.
            if let (Some(l), Some(floor)) = (figures.latency_ms, floor_ms) {
                println!(
                    "  create sent -> worker received, above the floor of {floor:.3} ms  p50 {:.2} ms  p99 {:.2} ms",
                    l.p50 - floor,
                    l.p99 - floor
                );
            }
        }
    }
    if let Some(cluster) = cluster.as_mut() {
        cluster.stop();
        // An election in a benchmark is a stall to explain: keep what the
        // nodes logged about it, which a temporary directory would lose.
        match leadership_changed.then(|| cluster.keep_temporary_logs()) {
            Some(Ok(Some(dir))) => eprintln!(
                "bench: a partition's leadership changed during the run (Vote or Campaign requests between nodes); \
                 the nodes' logs are kept in {}",
                dir.display()
            ),
            Some(Err(error)) => {
                eprintln!("bench: a partition's leadership changed; keeping the logs failed: {error:#}")
            }
            Some(Ok(None)) | None => {}
        }
    }
    Ok(clean)
}
