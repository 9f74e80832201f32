//! The `drover` command: run a node, use a cluster from the shell, run a
//! command-line worker, benchmark.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use drover::client::{Client, Control, JobOutcome, Worker, WorkerOptions};
use drover::config::ServeArgs;
use drover::node::Node;
use drover::proto::gateway::*;
use tokio::io::AsyncWriteExt;

/// jemalloc (the default `jemalloc` feature), for Rust's allocations and, through
/// the unprefixed `malloc`, for RocksDB's. It hands freed memory back to the
/// kernel on its own, where glibc keeps what compactions used
/// (docs/operations.md, "Memory").
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read at its start (`MALLOC_CONF` in the environment
/// overrides them): freed pages go back to the kernel after about a second
/// (jemalloc's default is ten), with `MADV_DONTNEED`, so they leave the
/// resident set at once (lazily freed pages stay in it until the kernel needs
/// them). A node's memory is mostly memtables filling and being flushed, and
/// each flush frees tens of MiB at once: returned within a second, the
/// highest resident peak of ten minutes at 1,000 jobs/s was 6–7% lower and
/// the end 8–16% lower, and throughput did not move (docs/benchmarks.md).
/// Eight arenas, what jemalloc makes on the 2-core machine the figures come
/// from: by default it makes four per core of the host, whatever a pod's CPU
/// limit, and each holds memory of its own. Its background thread starts
/// with `drover serve` (`memory::setup_allocator`).
#[cfg(feature = "jemalloc")]
#[allow(non_upper_case_globals)]
#[unsafe(export_name = "malloc_conf")]
pub static malloc_conf: &[u8; 47] = b"dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:8\0";

#[derive(Parser)]
#[command(name = "drover", version, about = "A clustered, replicated job broker")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct Target {
    /// A node's gateway address; several, comma separated, for clients that
    /// fail over (the worker, the outbox relay).
    #[arg(long, short = 'a', env = "DROVER_ADDRESS", default_value = "127.0.0.1:26500", global = true)]
    address: String,
}

#[derive(Subcommand)]
enum Command {
    /// Start a node (with no flags: one node, one partition, data under ./data).
    Serve(Box<ServeArgs>),
    /// Create, read and finish jobs.
    Job {
        #[command(subcommand)]
        command: JobCommand,
        #[command(flatten)]
        target: Target,
    },
    /// Run a shell command for every job of a type: the job's variables on
    /// stdin, a JSON object on stdout completes it, a non-zero exit fails it
    /// with stderr as the error message. Or, with a subcommand, list and
    /// direct the cluster's workers.
    Worker(Box<WorkerCommand>),
    /// Register, show or remove the JSON Schema of a job type's variables.
    Schema {
        #[command(subcommand)]
        command: SchemaCommand,
        #[command(flatten)]
        target: Target,
    },
    /// Write a throwaway CA and a node certificate it signed, for trying TLS
    /// (`ca.pem`, `node.pem`, `node-key.pem`). Never for production.
    DevCertificates {
        /// The directory to write them to.
        #[arg(long)]
        out: std::path::PathBuf,
        /// A host name or IP address the certificate names (repeatable).
        #[arg(long = "name", required = true)]
        names: Vec<String>,
    },
    /// Tokens: signing keys, signed JWTs, and secrets for the tokens file.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Show the node and cluster as the gateway sees them.
    Status {
        #[command(flatten)]
        target: Target,
    },
    /// Relay a PostgreSQL outbox table into jobs: every committed row becomes
    /// exactly one job (`--address` may name several gateways, comma separated).
    Outbox {
        #[command(flatten)]
        args: drover::outbox::OutboxArgs,
        #[command(flatten)]
        target: Target,
    },
    /// Measure throughput and latency of a cluster (or of local nodes it starts).
    Bench(drover::bench::BenchArgs),
    /// Start a local cluster of several nodes on this machine, for trying things out.
    DevCluster {
        /// Nodes to start.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        #[arg(long, default_value_t = 3)]
        partitions: u32,
        #[arg(long, default_value_t = 3)]
        replication_factor: u32,
        /// Where the nodes keep their data (one folder each) and logs.
        #[arg(long, default_value = "./dev-cluster")]
        data_dir: std::path::PathBuf,
        /// TLS on every port of every node, with a throwaway CA and
        /// certificate written to DATA_DIR/tls (mutual TLS between nodes).
        #[arg(long)]
        tls: bool,
    },
    /// Cluster commands.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Nodes, partitions, leaders, followers, terms, indexes and health.
    Status,
}

/// Which jobs a listing or bulk command covers.
#[derive(clap::Args)]
struct FilterArgs {
    /// scheduled, activatable, activated, completed, incident or cancelled.
    #[arg(long)]
    state: Option<String>,
    #[arg(long = "type", short = 't')]
    job_type: Option<String>,
    #[arg(long)]
    tenant: Option<String>,
    /// The last committed stage.
    #[arg(long)]
    stage: Option<String>,
    /// A substring of the last failure's message.
    #[arg(long)]
    error: Option<String>,
    /// Created at or after this time (Unix epoch, ms).
    #[arg(long)]
    created_from: Option<i64>,
    /// Created before this time (Unix epoch, ms).
    #[arg(long)]
    created_to: Option<i64>,
}

impl FilterArgs {
    fn filter(self) -> JobFilter {
        JobFilter {
            state: self.state.unwrap_or_default(),
            r#type: self.job_type.unwrap_or_default(),
            tenant_id: self.tenant.unwrap_or_default(),
            stage: self.stage.unwrap_or_default(),
            error_contains: self.error.unwrap_or_default(),
            created_from: self.created_from.unwrap_or_default(),
            created_to: self.created_to.unwrap_or_default(),
        }
    }
}

/// A job named by the idempotency key its producer gave.
#[derive(clap::Args)]
struct ByIdempotencyKey {
    #[arg(long, conflicts_with = "key")]
    idempotency_key: Option<String>,
    #[arg(long, default_value = "")]
    tenant: String,
    #[arg(long, default_value = "")]
    user: String,
}

impl ByIdempotencyKey {
    /// A read of the job with `key`, or of the one this idempotency key names.
    fn get_request(self, key: Option<u64>) -> GetJobRequest {
        GetJobRequest {
            key: key.unwrap_or_default(),
            idempotency_key: self.idempotency_key.unwrap_or_default(),
            tenant_id: self.tenant,
            user: self.user,
            include_history: false,
        }
    }
}

#[derive(Subcommand)]
enum JobCommand {
    /// Create a job and print its key.
    Create {
        /// The job type.
        #[arg(long = "type", short = 't')]
        job_type: String,
        /// Variables, a JSON object.
        #[arg(long, default_value = "{}")]
        variables: String,
        /// Retries before an incident.
        #[arg(long)]
        retries: Option<i32>,
        #[arg(long, default_value_t = 0)]
        priority: i32,
        /// Delay in ms before the job is activatable.
        #[arg(long, default_value_t = 0)]
        delay: i64,
        /// A custom header, KEY=VALUE (repeatable).
        #[arg(long = "header", value_parser = parse_header)]
        headers: Vec<(String, String)>,
        #[arg(long, default_value = "")]
        tenant: String,
        /// Makes the create idempotent: within the key's window, the same key
        /// (and tenant and user) answers with the first job instead of making another.
        #[arg(long, default_value = "")]
        idempotency_key: String,
        /// Who initiated the job; part of the idempotency key's scope.
        #[arg(long, default_value = "")]
        user: String,
        /// A stage the job's worker checkpoints, in order (repeatable).
        #[arg(long = "stage")]
        stages: Vec<String>,
        /// A name:value label the job's worker must have, such as
        /// region:eu-west-1 (repeatable).
        #[arg(long = "require")]
        required_labels: Vec<String>,
        /// A name:value label the job would rather its worker had (repeatable).
        #[arg(long = "prefer")]
        preferred_labels: Vec<String>,
    },
    /// Print a job as JSON, by key or by idempotency key.
    Get {
        #[arg(required_unless_present = "idempotency_key")]
        key: Option<u64>,
        #[command(flatten)]
        by: ByIdempotencyKey,
    },
    /// Show what happened to a job, oldest first, with times relative to its creation.
    History {
        #[arg(required_unless_present = "idempotency_key")]
        key: Option<u64>,
        #[command(flatten)]
        by: ByIdempotencyKey,
        /// Print the events as JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// List jobs matching a filter, over every partition, in key order.
    List {
        #[command(flatten)]
        filter: FilterArgs,
        /// Jobs per page (at most 1000).
        #[arg(long, default_value_t = 100)]
        page_size: i32,
        /// Continue from a previous page's token.
        #[arg(long, default_value = "")]
        page_token: String,
        /// Page through every match instead of printing one page.
        #[arg(long)]
        all: bool,
        /// One JSON object per job instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Make every incident matching a filter activatable again.
    RetryAll {
        #[command(flatten)]
        filter: FilterArgs,
        /// Retries each job gets.
        #[arg(long, default_value_t = 1)]
        retries: i32,
        /// Only count the matching jobs.
        #[arg(long)]
        dry_run: bool,
    },
    /// Cancel every job matching a filter that is not final.
    CancelAll {
        #[command(flatten)]
        filter: FilterArgs,
        /// Only count the matching jobs.
        #[arg(long)]
        dry_run: bool,
    },
    /// Wait until a job is completed or cancelled, then print it. Exits 0 when
    /// it completed, 3 when it was cancelled, 4 when the wait ended first.
    Wait {
        #[arg(required_unless_present = "idempotency_key")]
        key: Option<u64>,
        #[command(flatten)]
        by: ByIdempotencyKey,
        /// How long to wait, in ms (at most 600000).
        #[arg(long, default_value_t = 60_000)]
        timeout_ms: i64,
    },
    /// Complete an activated job.
    Complete {
        key: u64,
        #[arg(long, default_value = "{}")]
        variables: String,
        /// The activation's fencing token; 0 completes whatever activation is current.
        #[arg(long, default_value_t = 0)]
        attempt: u32,
    },
    /// Fail an activated job.
    Fail {
        key: u64,
        /// Retries left after this failure; 0 raises an incident.
        #[arg(long)]
        retries: i32,
        #[arg(long, default_value = "")]
        message: String,
        /// Back-off in ms before the retry.
        #[arg(long, default_value_t = 0)]
        back_off: i64,
        #[arg(long, default_value_t = 0)]
        attempt: u32,
        /// failed, malformed-payload (an incident at once), resource-unavailable,
        /// intermittent, worker-shutdown (no retry used) or internal-error.
        #[arg(long, default_value = "failed")]
        reason: String,
    },
    /// Give a job retries (resolves an incident).
    Retries { key: u64, retries: i32 },
    /// Set an activated job's deadline to now + TIMEOUT ms.
    Timeout { key: u64, timeout: i64 },
    /// Cancel a job.
    Cancel { key: u64 },
    /// Activate jobs once (long polling up to --wait ms) and print them.
    Activate {
        #[arg(long = "type", short = 't')]
        job_type: String,
        #[arg(long, default_value_t = 10)]
        max: i32,
        #[arg(long, default_value_t = 60_000)]
        timeout: i64,
        #[arg(long, default_value_t = 0)]
        wait: i64,
        #[arg(long, default_value = "cli")]
        worker: String,
    },
}

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
struct WorkerCommand {
    #[command(subcommand)]
    manage: Option<WorkersCommand>,
    #[command(flatten)]
    run: WorkerArgs,
}

/// Which workers a direction covers: one session, a label, or all.
#[derive(clap::Args)]
struct WorkerTarget {
    /// The session id, as `drover worker list` shows it.
    session: Option<String>,
    /// Every worker with this name:value label.
    #[arg(long, conflicts_with = "session")]
    label: Option<String>,
    /// Every worker.
    #[arg(long, conflicts_with_all = ["session", "label"])]
    all: bool,
}

#[derive(Subcommand)]
enum WorkersCommand {
    /// List live worker sessions.
    List {
        /// Only workers with this name:value label.
        #[arg(long)]
        label: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// Take no new jobs; finish those held.
    Quiet {
        #[command(flatten)]
        which: WorkerTarget,
        #[command(flatten)]
        target: Target,
    },
    /// Take new jobs again.
    Resume {
        #[command(flatten)]
        which: WorkerTarget,
        #[command(flatten)]
        target: Target,
    },
    /// Stop: finish or fail held jobs within the grace period, deregister, exit.
    Terminate {
        #[command(flatten)]
        which: WorkerTarget,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Subcommand)]
enum SchemaCommand {
    /// Register FILE (a JSON Schema) for TYPE: later creates must satisfy it.
    Set {
        #[arg(value_name = "TYPE")]
        job_type: String,
        file: std::path::PathBuf,
    },
    /// Print TYPE's schema.
    Get {
        #[arg(value_name = "TYPE")]
        job_type: String,
    },
    /// Remove TYPE's schema.
    Remove {
        #[arg(value_name = "TYPE")]
        job_type: String,
    },
}

#[derive(clap::Args)]
struct WorkerArgs {
    /// The job type to work on.
    #[arg(long = "type", short = 't', required = true)]
    job_type: Option<String>,
    /// The shell command run per job (via `sh -c`).
    #[arg(long, required = true)]
    exec: Option<String>,
    /// The worker's name.
    #[arg(long, default_value = "drover-cli")]
    name: String,
    /// Activation timeout per job, ms.
    #[arg(long, default_value_t = 60_000)]
    timeout: i64,
    /// Jobs run at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Back-off in ms before a failed job is retried.
    #[arg(long, default_value_t = 1_000)]
    retry_back_off: i64,
    /// name:value labels of the worker (repeatable), such as pool:critical or
    /// region:eu-west-1: its session's and its stream's; jobs that require a
    /// label go only to workers that have it (docs/regions.md).
    #[arg(long = "label")]
    labels: Vec<String>,
    /// How often the worker beats, ms (0: the server's default, 5000).
    #[arg(long, default_value_t = 0)]
    heartbeat_interval: i64,
    /// How long without a beat before the server declares the worker dead
    /// and hands its jobs to others, ms (0: the server's default, 30000).
    #[arg(long, default_value_t = 0)]
    dead_after: i64,
    /// On SIGTERM, SIGINT or a terminate from the server: how long to wait
    /// for running jobs before failing them as worker-shutdown, ms.
    #[arg(long, default_value_t = 25_000)]
    grace_period: u64,
    /// Run without a worker session (no heartbeats: a dead worker's jobs
    /// come back only at their activation timeout).
    #[arg(long)]
    no_session: bool,
    #[command(flatten)]
    target: Target,
}

fn parse_header(value: &str) -> Result<(String, String), String> {
    value.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| "use KEY=VALUE".into())
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve(*args).await,
        Command::Job { command, target } => job(command, &target).await,
        Command::Worker(command) => match command.manage {
            Some(manage) => workers(manage).await,
            None => worker(command.run).await,
        },
        Command::Schema { command, target } => schema(command, &target).await,
        Command::Token { command } => token(command),
        Command::DevCertificates { out, names } => {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let files = drover::tls::write_dev_certificates(&out, &names)?;
            println!("CA {}\ncertificate {}\nkey {}", files.ca.display(), files.cert.display(), files.key.display());
            Ok(())
        }
        Command::Outbox { args, target } => {
            let _telemetry = drover::telemetry::init("text", None, "drover-outbox")?;
            let gateways = target.address.split(',').map(str::to_string).collect();
            drover::outbox::run(args, gateways, shutdown_signal()).await
        }
        Command::Bench(args) => {
            if !drover::bench::run(args).await? {
                bail!("jobs were lost or completed twice");
            }
            Ok(())
        }
        Command::DevCluster { nodes, partitions, replication_factor, data_dir, tls } => {
            dev_cluster(nodes, partitions, replication_factor, &data_dir, tls).await
        }
        Command::Status { target } | Command::Cluster { command: ClusterCommand::Status, target } => {
            status(&target).await
        }
    }
}

/// Resolves at the first SIGTERM or SIGINT.
async fn shutdown_signal() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    drover::node::memory::setup_allocator();
    let config = args.resolve()?;
    let telemetry = drover::telemetry::init(&config.log_format, config.otlp_endpoint.as_deref(), "drover")?;
    let data_dir = config.data_dir.clone();
    let admin_scheme = if config.tls.admin.is_some() { "https" } else { "http" };
    let (partitions, replication, members) =
        (config.partitions, config.replication_factor, config.members.len().max(1));
    let malloc_trim = config.malloc_trim;
    let node = Node::start(config).await?;
    let (stop_trimming, trimming) = tokio::sync::watch::channel(false);
    if let Some(interval) = malloc_trim {
        tokio::spawn(drover::node::memory::trim_periodically(interval, trimming));
    }
    println!("drover node {} started", node.ctx.node_id);
    println!("  gateway (gRPC): {}", node.grpc_addr);
    println!("  cluster (gRPC): {}", node.cluster_addr);
    println!(
        "  admin (HTTP):   {admin_scheme}://{}  (/metrics /health /ready /actuator/partitions /actuator/jobstreams)",
        node.admin_addr
    );
    println!("  data:           {}", data_dir.display());
    println!("  partitions {partitions}, replication factor {replication}, members {members}");
    use std::io::Write;
    std::io::stdout().flush()?;

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    tracing::info!("stopping: no new work, finishing requests in flight");
    let _ = stop_trimming.send(true);
    node.shutdown().await;
    telemetry.shutdown();
    println!("drover node stopped");
    Ok(())
}

async fn dev_cluster(
    nodes: usize,
    partitions: u32,
    replication_factor: u32,
    dir: &std::path::Path,
    tls: bool,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut cluster =
        drover::bench::LocalCluster::start_with(nodes, partitions, replication_factor, Some(dir), &[], tls)?;
    cluster.wait_ready(Duration::from_secs(60)).await?;
    println!(
        "{nodes} nodes, {partitions} partitions, replication factor {replication_factor}; data and logs in {}",
        dir.display()
    );
    let admin = if tls { "https" } else { "http" };
    for (node, gateway) in cluster.nodes.iter().zip(cluster.gateways()) {
        println!("  node {}: gateway {gateway}  admin {admin}://{}", node.node_id, node.admin);
    }
    let first = &cluster.gateways()[0];
    if let Some((_, files)) = &cluster.tls {
        println!("TLS on every port; clients trust the throwaway CA {}:", files.ca.display());
        println!("      export {}={}", drover::client::TLS_CA_ENV, files.ca.display());
    }
    println!("try:  drover status --address {first}");
    println!("      drover job create --address {first} --type demo --variables '{{\"n\":1}}'");
    println!("Ctrl-C (or SIGTERM) stops the cluster (its data stays in {}).", dir.display());
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    cluster.stop();
    Ok(())
}

/// A job's history as a timeline: seconds since the first event, then what happened.
fn print_history(history: &GetJobHistoryResponse, json: bool) {
    let start = history.events.first().map_or(0, |e| e.at);
    for (i, e) in history.events.iter().enumerate() {
        if json {
            println!("{}", serde_json::to_string(&event_json(e)).unwrap_or_default());
            continue;
        }
        let what = drover::client::describe_event(e, start);
        println!("{:>+10.3}s  {what}", (e.at - start) as f64 / 1000.0);
        if i + 1 == 8 && history.dropped > 0 {
            println!("{:>11}  ... {} events not kept ...", "", history.dropped);
        }
    }
}

fn event_json(e: &JobEvent) -> serde_json::Value {
    serde_json::json!({
        "at": e.at, "kind": e.kind, "attempt": e.attempt, "worker": e.worker,
        "session": format!("{:x}", e.session_id), "via": e.via, "gateway": e.gateway_node_id,
        "stream": e.stream_id, "reason": e.reason, "message": e.message, "retries": e.retries,
        "back_off": e.back_off, "stage": e.stage, "deadline": e.deadline, "count": e.count,
        "user": e.user, "idempotency_key": e.idempotency_key,
    })
}

fn print_json(value: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(value).expect("json"));
}

fn job_json(job: &drover::proto::gateway::Job) -> serde_json::Value {
    serde_json::json!({
        "key": job.key,
        "type": job.r#type,
        "state": job.state,
        "tenantId": job.tenant_id,
        "variables": serde_json::from_str::<serde_json::Value>(&job.variables).unwrap_or(serde_json::Value::Null),
        "customHeaders": job.custom_headers,
        "retries": job.retries,
        "priority": job.priority,
        "attempt": job.attempt,
        "worker": job.worker,
        "deadline": job.deadline,
        "dueAt": job.due_at,
        "createdAt": job.created_at,
        "errorMessage": job.error_message,
        "result": serde_json::from_str::<serde_json::Value>(&job.result).unwrap_or(serde_json::Value::Null),
        "partitionId": job.partition_id,
        "failureReason": job.failure_reason,
        "idempotencyKey": job.idempotency_key,
        "user": job.user,
        "stages": job.stages,
        "stage": job.stage,
        "requiredLabels": job.required_labels,
        "preferredLabels": job.preferred_labels,
        "checkpoints": job.checkpoints.iter().map(|c| serde_json::json!({
            "stage": c.stage, "attempt": c.attempt, "at": c.at,
        })).collect::<Vec<_>>(),
    })
}

fn print_bulk(verb: &str, dry_run: bool, answer: &BulkJobsResponse) {
    if dry_run {
        println!("{} jobs match (dry run: nothing changed)", answer.matched);
        return;
    }
    println!("{} jobs matched, {} {verb}, {} failed", answer.matched, answer.changed, answer.failed);
    for error in &answer.errors {
        eprintln!("  {error}");
    }
}

fn status_error(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", status.code(), status.message())
}

async fn job(command: JobCommand, target: &Target) -> anyhow::Result<()> {
    let client = Client::connect(&target.address)
        .await
        .with_context(|| format!("connecting to {} (is a node running? set --address)", target.address))?;
    let mut raw = client.raw();
    match command {
        JobCommand::Create {
            job_type,
            variables,
            retries,
            priority,
            delay,
            headers,
            tenant,
            idempotency_key,
            user,
            stages,
            required_labels,
            preferred_labels,
        } => {
            let request = CreateJobRequest {
                r#type: job_type,
                variables,
                custom_headers: headers.into_iter().collect::<HashMap<_, _>>(),
                retries,
                priority,
                delay,
                tenant_id: tenant,
                idempotency_key,
                user,
                stages,
                required_labels,
                preferred_labels,
                ..Default::default()
            };
            let reply = raw.create_job(request).await.map_err(status_error)?.into_inner();
            if !reply.created {
                eprintln!("job {} already existed: the idempotency key names it", reply.key);
            }
            println!("{}", reply.key);
        }
        JobCommand::Get { key, by } => {
            let request = by.get_request(key);
            let job = raw.get_job(request).await.map_err(status_error)?.into_inner().job;
            print_json(&job_json(&job.context("GetJob answered no job")?));
        }
        JobCommand::History { key, by, json } => {
            let request = by.get_request(key);
            let history = raw.get_job_history(request).await.map_err(status_error)?.into_inner();
            print_history(&history, json);
        }
        JobCommand::List { filter, page_size, mut page_token, all, json } => {
            let filter = filter.filter();
            if !json {
                println!(
                    "{:<20} {:<20} {:<12} {:>7} {:>7} {:<16} error",
                    "key", "type", "state", "retries", "attempt", "stage"
                );
            }
            loop {
                let request = ListJobsRequest { filter: Some(filter.clone()), page_size, page_token };
                let page = raw.list_jobs(request).await.map_err(status_error)?.into_inner();
                for job in &page.jobs {
                    if json {
                        println!("{}", job_json(job));
                    } else {
                        println!(
                            "{:<20} {:<20} {:<12} {:>7} {:>7} {:<16} {}",
                            job.key, job.r#type, job.state, job.retries, job.attempt, job.stage, job.error_message
                        );
                    }
                }
                page_token = page.next_page_token;
                if page_token.is_empty() {
                    break;
                }
                if !all {
                    eprintln!("more: --page-token {page_token}");
                    break;
                }
            }
        }
        JobCommand::RetryAll { filter, retries, dry_run } => {
            let request = RetryJobsRequest { filter: Some(filter.filter()), retries, dry_run };
            let answer = raw.retry_jobs(request).await.map_err(status_error)?.into_inner();
            print_bulk("retried", dry_run, &answer);
        }
        JobCommand::CancelAll { filter, dry_run } => {
            let request = CancelJobsRequest { filter: Some(filter.filter()), dry_run };
            let answer = raw.cancel_jobs(request).await.map_err(status_error)?.into_inner();
            print_bulk("cancelled", dry_run, &answer);
        }
        JobCommand::Wait { key, by, timeout_ms } => {
            let request = AwaitJobRequest {
                key: key.unwrap_or_default(),
                idempotency_key: by.idempotency_key.unwrap_or_default(),
                tenant_id: by.tenant,
                user: by.user,
                timeout: timeout_ms,
            };
            let mut call = tonic::Request::new(request);
            call.set_timeout(Duration::from_millis(timeout_ms.max(0) as u64 + 10_000));
            let mut answers = raw.await_job(call).await.map_err(status_error)?.into_inner();
            let reply = answers.message().await.map_err(status_error)?.context("AwaitJob sent no answer")?;
            let job = reply.job.context("AwaitJob answered no job")?;
            print_json(&job_json(&job));
            match (reply.r#final, job.state.as_str()) {
                (true, "completed") => {}
                (true, _) => std::process::exit(3),
                (false, _) => {
                    eprintln!("job {} is still {} after {timeout_ms} ms", job.key, job.state);
                    std::process::exit(4);
                }
            }
        }
        JobCommand::Complete { key, variables, attempt } => {
            client.complete(key, attempt, &variables).await.map_err(status_error)?;
            println!("completed {key}");
        }
        JobCommand::Fail { key, retries, message, back_off, attempt, reason } => {
            client.fail_for(&reason, key, attempt, retries, &message, back_off).await.map_err(status_error)?;
            println!("failed {key} ({reason})");
        }
        JobCommand::Retries { key, retries } => {
            raw.update_job_retries(UpdateJobRetriesRequest { key, retries }).await.map_err(status_error)?;
            println!("job {key} has {retries} retries");
        }
        JobCommand::Timeout { key, timeout } => {
            let reply = raw
                .update_job_timeout(UpdateJobTimeoutRequest { key, timeout, attempt: 0 })
                .await
                .map_err(status_error)?
                .into_inner();
            println!("job {key} now times out at {}", reply.deadline);
        }
        JobCommand::Cancel { key } => {
            raw.cancel_job(CancelJobRequest { key }).await.map_err(status_error)?;
            println!("cancelled {key}");
        }
        JobCommand::Activate { job_type, max, timeout, wait, worker } => {
            let jobs = client.activate(&job_type, &worker, max, timeout, wait).await.map_err(status_error)?;
            let jobs: Vec<_> = jobs
                .iter()
                .map(|j| {
                    serde_json::json!({
                        "key": j.key, "type": j.r#type, "attempt": j.attempt, "retries": j.retries,
                        "deadline": j.deadline, "worker": j.worker,
                        "variables": serde_json::from_str::<serde_json::Value>(&j.variables).unwrap_or_default(),
                        "customHeaders": j.custom_headers,
                    })
                })
                .collect();
            print_json(&serde_json::Value::Array(jobs));
        }
    }
    Ok(())
}

async fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    let _telemetry = drover::telemetry::init("text", None, "drover-worker")?;
    let client = Client::connect_lazy(&args.target.address)?;
    let job_type = args.job_type.context("--type is required")?;
    let command = args.exec.context("--exec is required")?;
    let mut options = WorkerOptions::new(&job_type);
    options.worker = args.name.clone();
    options.timeout_ms = args.timeout;
    options.concurrency = args.concurrency;
    options.labels = args.labels;
    options.heartbeat_ms = args.heartbeat_interval;
    options.dead_after_ms = args.dead_after;
    options.grace_period = Duration::from_millis(args.grace_period);
    options.session = !args.no_session;
    let back_off = args.retry_back_off;
    eprintln!("working on jobs of type {job_type:?} from {} with `{command}`", args.target.address);
    let handler = move |job: ActivatedJob| {
        let command = command.clone();
        async move { run_command(&command, &job, back_off).await }
    };
    let worker = Worker::new(client, options);
    let signals = tokio::spawn(obey_signals(worker.controller()));
    worker.run(handler, std::future::pending()).await;
    signals.abort();
    eprintln!("worker stopped");
    Ok(())
}

/// The worker protocol's signals: SIGTERM and SIGINT shut down gracefully,
/// SIGTSTP quiets, SIGCONT resumes.
async fn obey_signals(control: tokio::sync::watch::Sender<Control>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut tstp = signal(SignalKind::from_raw(libc::SIGTSTP))?;
    let mut cont = signal(SignalKind::from_raw(libc::SIGCONT))?;
    loop {
        let wanted = tokio::select! {
            _ = term.recv() => Control::Shutdown,
            _ = int.recv() => Control::Shutdown,
            _ = tstp.recv() => Control::Quiet,
            _ = cont.recv() => Control::Run,
        };
        control.send_if_modified(|current| {
            // A shutdown is never undone by a later SIGTSTP or SIGCONT.
            if *current == Control::Shutdown || *current == wanted {
                return false;
            }
            eprintln!("signal: worker goes {wanted:?}");
            *current = wanted;
            true
        });
    }
}

async fn workers(command: WorkersCommand) -> anyhow::Result<()> {
    let (state, which, target) = match command {
        WorkersCommand::List { label, target } => {
            let client = Client::connect_lazy(&target.address)?;
            let request = ListWorkersRequest { label: label.unwrap_or_default() };
            let workers = client.raw().list_workers(request).await.map_err(status_error)?.into_inner().workers;
            print_workers(&workers);
            return Ok(());
        }
        WorkersCommand::Quiet { which, target } => ("quiet", which, target),
        WorkersCommand::Resume { which, target } => ("running", which, target),
        WorkersCommand::Terminate { which, target } => ("terminate", which, target),
    };
    let session_id = match &which.session {
        Some(id) => u64::from_str_radix(id, 16).with_context(|| format!("{id:?} is not a session id (hex)"))?,
        None => 0,
    };
    if session_id == 0 && which.label.is_none() && !which.all {
        bail!("name a session id, --label name:value or --all");
    }
    let client = Client::connect_lazy(&target.address)?;
    let request = SetWorkerStateRequest {
        session_id,
        label: which.label.unwrap_or_default(),
        all: which.all,
        state: state.into(),
    };
    let workers = client.raw().set_worker_state(request).await.map_err(status_error)?.into_inner().workers;
    print_workers(&workers);
    Ok(())
}

fn print_workers(workers: &[WorkerSession]) {
    for w in workers {
        println!(
            "{}",
            serde_json::json!({
                "session": format!("{:x}", w.session_id), "worker": w.worker_id, "hostname": w.hostname,
                "pid": w.pid, "types": w.job_types, "labels": w.labels, "state": w.reported_state,
                "directed": w.directed_state, "held": w.held_jobs, "last_heartbeat": w.last_heartbeat,
                "missing_on": w.missing_on,
            })
        );
    }
}

async fn schema(command: SchemaCommand, target: &Target) -> anyhow::Result<()> {
    let client = Client::connect_lazy(&target.address)?;
    match command {
        SchemaCommand::Set { job_type, file } => {
            let schema =
                std::fs::read_to_string(&file).with_context(|| format!("reading the schema {}", file.display()))?;
            client.raw().set_schema(SetSchemaRequest { r#type: job_type, schema }).await.map_err(status_error)?;
        }
        SchemaCommand::Get { job_type } => {
            let schema = client.raw().get_schema(GetSchemaRequest { r#type: job_type.clone() }).await;
            let schema = schema.map_err(status_error)?.into_inner().schema;
            if schema.is_empty() {
                bail!("job type {job_type:?} has no schema");
            }
            println!("{schema}");
        }
        SchemaCommand::Remove { job_type } => {
            let request = SetSchemaRequest { r#type: job_type, schema: String::new() };
            client.raw().set_schema(request).await.map_err(status_error)?;
        }
    }
    Ok(())
}

/// Runs the worker's command for one job.
async fn run_command(command: &str, job: &ActivatedJob, back_off_ms: i64) -> JobOutcome {
    let retries_left = (job.retries - 1).max(0);
    let fail = |message: String| JobOutcome::Fail { retries: retries_left, message, back_off_ms };
    let mut sh = tokio::process::Command::new("sh");
    // The command dies with the worker: a killed worker's jobs go to others,
    // and must not also run on here.
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        sh.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let spawned = sh
        .arg("-c")
        .arg(command)
        .env("DROVER_JOB_KEY", job.key.to_string())
        .env("DROVER_JOB_TYPE", &job.r#type)
        .env("DROVER_JOB_ATTEMPT", job.attempt.to_string())
        .env("DROVER_JOB_RETRIES", job.retries.to_string())
        .env("DROVER_JOB_STAGE", &job.stage)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => return fail(format!("could not start `{command}`: {e}")),
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(job.variables.as_bytes()).await;
    }
    let output = match child.wait_with_output().await {
        Ok(output) => output,
        Err(e) => return fail(format!("`{command}` failed to run: {e}")),
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let message: String = stderr.trim().chars().take(4000).collect();
        return fail(if message.is_empty() { format!("`{command}` exited with {}", output.status) } else { message });
    }
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_string();
    if stdout.is_empty() {
        return JobOutcome::Complete("{}".into());
    }
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&stdout) {
        Ok(_) => JobOutcome::Complete(stdout),
        Err(_) => fail(format!(
            "`{command}` printed something that is not a JSON object: {}",
            &stdout.chars().take(200).collect::<String>()
        )),
    }
}

async fn status(target: &Target) -> anyhow::Result<()> {
    let client = Client::connect(&target.address)
        .await
        .with_context(|| format!("connecting to {} (is a node running? set --address)", target.address))?;
    let topology = tokio::time::timeout(Duration::from_secs(10), client.topology())
        .await
        .context("the node did not answer within 10 s")?
        .map_err(status_error)?;
    println!(
        "cluster: {} nodes, {} partitions, replication factor {} (answered by node {})",
        topology.cluster_size, topology.partitions_count, topology.replication_factor, topology.gateway_node_id
    );
    for broker in &topology.brokers {
        let address = if broker.address.is_empty() { "unreachable" } else { broker.address.as_str() };
        println!("node {} ({address})", broker.node_id);
        for p in &broker.partitions {
            let leader = p.leader_id.map(|l| l.to_string()).unwrap_or_else(|| "none".into());
            println!(
                "  partition {:>3}  {:<9} {:<9} term {:<4} leader {:<4} commit {:<8} applied {}",
                p.partition_id, p.role, p.health, p.term, leader, p.commit_index, p.applied_index
            );
        }
    }
    if topology.brokers.iter().any(|b| b.address.is_empty()) {
        bail!("some nodes did not answer");
    }
    Ok(())
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Write a new ES256 signing key (`signing-key.pem`, owner-only) and the
    /// JWK set that verifies its tokens (`jwks.json`, for --jwks-file).
    Keygen {
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Print a JWT signed with a key from `drover token keygen`.
    Create {
        /// The signing key (PEM).
        #[arg(long, env = "DROVER_SIGNING_KEY")]
        key: std::path::PathBuf,
        /// The issuer (`iss`); a node accepts it when listed in --jwt-issuer.
        #[arg(long, default_value = "drover")]
        issuer: String,
        /// Who the token is for (`sub`).
        #[arg(long)]
        subject: String,
        /// Scopes, comma separated (jobs:work:orders-*,cluster:read).
        #[arg(long, value_delimiter = ',')]
        scopes: Vec<String>,
        /// Tenants, comma separated (`*`: every tenant; `<default>`: the default tenant).
        #[arg(long, value_delimiter = ',', default_value = "<default>")]
        tenants: Vec<String>,
        /// How long it is valid: 90s, 30m, 12h, 7d.
        #[arg(long, default_value = "1h")]
        ttl: String,
    },
    /// Print a new random secret and the tokens-file entry (its hash) to add.
    Secret {
        /// The token's name, as audit lines and errors show it.
        #[arg(long)]
        name: String,
        #[arg(long, value_delimiter = ',')]
        scopes: Vec<String>,
        #[arg(long, value_delimiter = ',', default_value = "<default>")]
        tenants: Vec<String>,
    },
}

/// `90s`, `30m`, `12h`, `7d`.
fn parse_ttl(text: &str) -> anyhow::Result<Duration> {
    let (digits, unit) = text.split_at(text.len().saturating_sub(1));
    let amount: u64 = digits.parse().map_err(|_| anyhow::anyhow!("ttl {text:?} is not like 90s, 30m, 12h or 7d"))?;
    let secs = match unit {
        "s" => amount,
        "m" => amount * 60,
        "h" => amount * 3600,
        "d" => amount * 86_400,
        _ => anyhow::bail!("ttl {text:?} is not like 90s, 30m, 12h or 7d"),
    };
    anyhow::ensure!(secs > 0, "ttl must be more than zero");
    Ok(Duration::from_secs(secs))
}

fn token(command: TokenCommand) -> anyhow::Result<()> {
    match command {
        TokenCommand::Keygen { out } => {
            let key = drover::auth::keys::write_signing_key(&out)?;
            println!(
                "signing key {} (key id {})\nJWK set {}",
                out.join("signing-key.pem").display(),
                key.key_id,
                out.join("jwks.json").display()
            );
        }
        TokenCommand::Create { key, issuer, subject, scopes, tenants, ttl } => {
            let pem = std::fs::read_to_string(&key).with_context(|| format!("reading {}", key.display()))?;
            let ttl = parse_ttl(&ttl)?;
            println!("{}", drover::auth::keys::create_token(&pem, &issuer, &subject, &scopes, &tenants, ttl)?);
        }
        TokenCommand::Secret { name, scopes, tenants } => {
            let secret = drover::auth::keys::generate_secret();
            eprintln!("# the secret (give it to the client; it is not stored anywhere):");
            println!("{secret}");
            eprintln!("# add to the tokens file:");
            eprint!("{}", drover::auth::keys::token_entry(&name, &secret, &scopes, &tenants));
        }
    }
    Ok(())
}
