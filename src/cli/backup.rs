//! `drover backup ...`: take, list, verify, delete and restore backups
//! (the work is [`drover::backup`]'s; docs/backups.md).

use anyhow::Context as _;
use clap::Subcommand;
use drover::backup::{self, Destination, Listed};
use drover::client::Client;
use drover::config::ServeArgs;

use super::Target;

#[derive(Subcommand)]
pub(crate) enum BackupCommand {
    /// Take an online backup of every partition (needs `cluster:admin`): a
    /// cut marked in each partition's log, each part copied to DEST.
    Create {
        /// A directory (local, or a mounted volume), or s3://BUCKET/PREFIX
        /// (credentials, region and endpoint from the AWS variables:
        /// docs/backups.md).
        #[arg(long, value_name = "DEST")]
        to: String,
        /// The backup's name in DEST. [default: drover-YYYYMMDD-HHMMSS, UTC]
        #[arg(long)]
        id: Option<String>,
    },
    /// List the backups in DEST, complete or not.
    List {
        #[arg(long, value_name = "DEST")]
        from: String,
    },
    /// Read every part of a backup as a restore would and check it whole.
    Verify {
        #[arg(long, value_name = "DEST")]
        from: String,
        #[arg(long)]
        id: String,
    },
    /// Delete a backup from DEST.
    Delete {
        #[arg(long, value_name = "DEST")]
        from: String,
        #[arg(long)]
        id: String,
    },
    /// Build this node's data directory for a new cluster from a backup:
    /// give the flags the node will be started with (`drover serve`), on an
    /// empty data directory; do it on every node, then start them.
    Restore {
        #[arg(long, value_name = "DEST")]
        from: String,
        #[arg(long)]
        id: String,
        #[command(flatten)]
        serve: Box<ServeArgs>,
    },
}

pub(crate) async fn backup(command: BackupCommand, target: &Target) -> anyhow::Result<()> {
    match command {
        BackupCommand::Create { to, id } => {
            let destination = Destination::open(&to)?;
            let id = id.unwrap_or_else(backup::default_id);
            let client = Client::connect_lazy(&target.address)
                .with_context(|| format!("reaching the gateway at {}", target.address))?;
            let manifest = backup::create(&client, &destination, &id).await?;
            println!(
                "backup {id} in {destination}: {} partitions, {} jobs, {} bytes",
                manifest.parts.len(),
                manifest.records(),
                manifest.bytes()
            );
            for part in &manifest.parts {
                println!(
                    "  partition {:>3}  index {:<10} term {:<5} {:>10} jobs {:>12} bytes",
                    part.partition, part.index, part.term, part.records, part.bytes
                );
            }
        }
        BackupCommand::List { from } => {
            let destination = Destination::open(&from)?;
            for listed in backup::list(&destination).await? {
                match listed {
                    Listed::Complete(m) => println!(
                        "{}  complete    {} partitions  {} jobs  {} bytes  cluster version {}  taken at {} ms",
                        m.backup_id,
                        m.partitions_count,
                        m.records(),
                        m.bytes(),
                        m.cluster_version,
                        m.created_at_ms
                    ),
                    Listed::Incomplete { backup_id } => println!("{backup_id}  INCOMPLETE  (no manifest)"),
                    Listed::Damaged { backup_id, error } => println!("{backup_id}  DAMAGED     {error}"),
                }
            }
        }
        BackupCommand::Verify { from, id } => {
            let destination = Destination::open(&from)?;
            let verified = backup::verify(&destination, &id).await?;
            println!(
                "backup {id} is whole: {} partitions, {} jobs, {} bytes",
                verified.manifest.parts.len(),
                verified.records,
                verified.manifest.bytes()
            );
        }
        BackupCommand::Delete { from, id } => {
            let destination = Destination::open(&from)?;
            let files = backup::delete(&destination, &id).await?;
            println!("deleted backup {id} ({files} files) from {destination}");
        }
        BackupCommand::Restore { from, id, serve } => {
            let destination = Destination::open(&from)?;
            let config = serve.resolve()?;
            let jobs = backup::restore(&destination, &id, &config).await?;
            println!(
                "node {} restored from backup {id}: {jobs} jobs in {}; start it with the same flags (drover serve)",
                config.node_id,
                config.data_dir.display()
            );
        }
    }
    Ok(())
}
