//! The command line, one module per command group: [`serve`] (a node and a
//! local cluster), [`job`], [`worker`] (the shell worker and the fleet's
//! sessions), [`schema`], [`token`], [`backup`]; this file the commands' shape and the
//! dispatch. Everything it does goes through the client library or, for
//! `serve`, the node's start-up.

mod backup;
mod cluster;
mod job;
mod queue;
mod schedule;
mod schema;
mod serve;
mod token;
mod worker;
mod workflow;

use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use drover::client::Client;
use drover::config::ServeArgs;

use backup::BackupCommand;
use job::JobCommand;
use queue::QueueCommand;
use schedule::ScheduleCommand;
use schema::SchemaCommand;
use token::TokenCommand;
use worker::WorkerCommand;
use workflow::WorkflowCommand;

#[derive(Parser)]
#[command(name = "drover", version, about = "A clustered, replicated job broker")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Args, Clone)]
pub(crate) struct Target {
    /// A node's gateway address; several, comma separated, for clients that
    /// fail over (the worker, the outbox relay).
    #[arg(long, short = 'a', env = "DROVER_ADDRESS", default_value = "127.0.0.1:26500", global = true)]
    pub address: String,
}

#[derive(Subcommand)]
pub(crate) enum Command {
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
    /// List queues (a tenant's jobs of one type) with their figures; pause
    /// and resume them.
    Queue {
        #[command(subcommand)]
        command: QueueCommand,
        #[command(flatten)]
        target: Target,
    },
    /// Cron schedules: register one (a job at each tick of a cron
    /// expression, whichever leader is in office), list them with their
    /// next and last runs, pause, resume and delete them.
    Schedule {
        #[command(subcommand)]
        command: ScheduleCommand,
        #[command(flatten)]
        target: Target,
    },
    /// Workflows: create a chain, group or batch of jobs (each step made
    /// once, whichever leader is in office), show one with its steps, list
    /// them, cancel one.
    Workflow {
        #[command(subcommand)]
        command: WorkflowCommand,
        #[command(flatten)]
        target: Target,
    },
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
    /// Backups: create, list, verify, delete, restore (docs/backups.md).
    Backup {
        #[command(subcommand)]
        command: BackupCommand,
        #[command(flatten)]
        target: Target,
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
pub(crate) enum ClusterCommand {
    /// Nodes, partitions, leaders, followers, terms, indexes and health.
    Status,
    #[command(flatten)]
    Plan(cluster::PlanCommand),
}

pub(crate) async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve::serve(*args).await,
        Command::Job { command, target } => job::job(command, &target).await,
        Command::Worker(command) => match command.manage {
            Some(manage) => worker::workers(manage).await,
            None => worker::worker(command.run).await,
        },
        Command::Queue { command, target } => queue::queue(command, &target).await,
        Command::Schedule { command, target } => schedule::schedule(command, &target).await,
        Command::Workflow { command, target } => workflow::workflow(command, &target).await,
        Command::Schema { command, target } => schema::schema(command, &target).await,
        Command::Backup { command, target } => backup::backup(command, &target).await,
        Command::Token { command } => token::token(command),
        Command::DevCertificates { out, names } => {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let files = drover::tls::write_dev_certificates(&out, &names)?;
            println!("CA {}\ncertificate {}\nkey {}", files.ca.display(), files.cert.display(), files.key.display());
            Ok(())
        }
        Command::Outbox { args, target } => {
            let _telemetry = drover::telemetry::init("text", None, "drover-outbox")?;
            let gateways = target.address.split(',').map(str::to_string).collect();
            drover::outbox::run(args, gateways, serve::shutdown_signal()).await
        }
        Command::Bench(args) => {
            if !drover::bench::run(args).await? {
                bail!("jobs were lost or completed twice");
            }
            Ok(())
        }
        Command::DevCluster { nodes, partitions, replication_factor, data_dir, tls } => {
            serve::dev_cluster(nodes, partitions, replication_factor, &data_dir, tls).await
        }
        Command::Status { target } | Command::Cluster { command: ClusterCommand::Status, target } => {
            status(&target).await
        }
        Command::Cluster { command: ClusterCommand::Plan(command), target } => cluster::cluster(command, &target).await,
    }
}

pub(crate) fn print_json(value: &serde_json::Value) {
    println!("{}", serde_json::to_string_pretty(value).expect("json"));
}

pub(crate) fn status_error(status: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!("{:?}: {}", status.code(), status.message())
}

pub(crate) async fn status(target: &Target) -> anyhow::Result<()> {
    let client = Client::connect(&target.address)
        .await
        .with_context(|| format!("connecting to {} (is a node running? set --address)", target.address))?;
    let topology = tokio::time::timeout(Duration::from_secs(10), client.topology())
        .await
        .context("the node did not answer within 10 s")?
        .map_err(status_error)?;
    println!(
        "cluster: {} nodes, {} partitions, replication factor {}, data version {} (answered by node {})",
        topology.cluster_size,
        topology.partitions_count,
        topology.replication_factor,
        topology.cluster_version,
        topology.gateway_node_id
    );
    for broker in &topology.brokers {
        let address = if broker.address.is_empty() { "unreachable" } else { broker.address.as_str() };
        let version = match broker.data_version {
            0 => "data version unknown".to_string(),
            v => format!("data version {v}"),
        };
        println!("node {} ({address}, {version})", broker.node_id);
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

/// A Unix-ms time as the CLI prints it (UTC to the second), or "-" for none.
pub(crate) fn time(ms: i64) -> String {
    if ms == 0 {
        return "-".into();
    }
    let (year, month, day, h, m, s, _) = drover::calendar::utc_parts(ms);
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02}Z")
}
