//! `drover schema ...`: a job type's JSON Schema.

use anyhow::{bail, Context};
use clap::Subcommand;
use drover::client::Client;
use drover::proto::gateway::*;

use super::{status_error, Target};

#[derive(Subcommand)]
pub(crate) enum SchemaCommand {
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

pub(crate) async fn schema(command: SchemaCommand, target: &Target) -> anyhow::Result<()> {
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
