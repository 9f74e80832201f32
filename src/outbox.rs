//! The transactional outbox relay (`drover outbox`): an application writes
//! its own rows and, in the same PostgreSQL transaction, a row into an outbox
//! table; the relay turns each committed outbox row into exactly one job.
//!
//! Each round locks a batch of unrelayed rows (`FOR UPDATE SKIP LOCKED`, so
//! several relays share the table without waiting on each other), creates
//! their jobs with the row's idempotency key (by default
//! `outbox:<namespace>:<table>:<id>`, see [`OutboxArgs::key_namespace`]),
//! and only then, in the same transaction, deletes the rows or marks them
//! relayed. A relay that dies mid-round leaves its rows unrelayed and
//! unlocked; the next round (of any relay) creates them again under the same
//! keys and gets the same jobs back, for as long as the keys' window lasts
//! (24 h by default). Rows whose create is refused for good (invalid type or
//! variables, a key reused with other content) are marked failed with the
//! reason and never sent again; rows whose create failed for now stay for
//! the next round.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{bail, Context as _};
use tokio_postgres::NoTls;

use crate::client::Client;
use crate::proto::gateway::{CreateJobRequest, CreateJobResponse};

#[derive(clap::Args, Clone, Debug)]
pub struct OutboxArgs {
    /// The PostgreSQL connection string, e.g. "host=127.0.0.1 user=app dbname=app"
    /// or postgres://app@127.0.0.1/app.
    #[arg(long, env = "DROVER_OUTBOX_POSTGRES")]
    pub postgres: String,
    /// The outbox table (optionally schema-qualified).
    #[arg(long, default_value = "drover_outbox")]
    pub table: String,
    /// Rows per round (one transaction, one stream of creates).
    #[arg(long, default_value_t = 200)]
    pub batch: i64,
    /// How long to wait before looking again when the table has nothing to relay.
    #[arg(long, default_value_t = 200)]
    pub poll_ms: u64,
    /// Delete relayed rows instead of marking them (relayed_at, job_key).
    #[arg(long)]
    pub delete: bool,
    /// Create the table (and its index) if it does not exist.
    #[arg(long)]
    pub create_table: bool,
    /// Print the table's definition and exit.
    #[arg(long)]
    pub print_schema: bool,
    /// What the default idempotency key (`outbox:<namespace>:<table>:<id>`)
    /// is scoped by, so that two databases relaying tables of one name into
    /// one cluster never share keys. Default: the PostgreSQL cluster's
    /// system identifier (when the relay's role may read it), the database's
    /// name and the table's OID. Set a new one after resetting the table's
    /// ids (TRUNCATE ... RESTART IDENTITY) within the keys' window; an empty
    /// one gives the keys of earlier relays (`outbox:<table>:<id>`).
    #[arg(long, env = "DROVER_OUTBOX_KEY_NAMESPACE")]
    pub key_namespace: Option<String>,
}

/// The default key's scope for `table` in the database `pg` is connected to
/// (see [`OutboxArgs::key_namespace`]).
async fn key_namespace(pg: &tokio_postgres::Client, table: &str) -> Result<String, tokio_postgres::Error> {
    // pg_control_system() may be closed to the relay's role: then the
    // database's name and the table's OID scope the keys.
    let system = match pg.query_one("SELECT system_identifier::text FROM pg_control_system()", &[]).await {
        Ok(row) => row.get::<_, String>(0),
        Err(error) => {
            tracing::debug!("outbox relay: no system identifier ({error}); keys are scoped by database and table");
            String::new()
        }
    };
    let row = pg.query_one(&format!("SELECT current_database()::text, '{table}'::regclass::oid::text"), &[]).await?;
    let (database, oid): (String, String) = (row.get(0), row.get(1));
    Ok(format!("{system}/{database}/{oid}"))
}

/// The outbox table's definition: what an application inserts into.
pub fn schema(table: &str) -> String {
    let index = format!("{}_pending", table.replace('.', "_"));
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
    id              bigserial PRIMARY KEY,
    type            text NOT NULL,
    variables       jsonb NOT NULL DEFAULT '{{}}',
    headers         jsonb NOT NULL DEFAULT '{{}}',
    idempotency_key text,
    tenant_id       text NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    relayed_at      timestamptz,
    job_key         bigint,
    failed_at       timestamptz,
    last_error      text
);
CREATE INDEX IF NOT EXISTS {index} ON {table} (id) WHERE relayed_at IS NULL AND failed_at IS NULL;"
    )
}

/// Table names are put into SQL text, so only plain identifiers pass.
fn check_table(table: &str) -> anyhow::Result<()> {
    let plain = |part: &str| {
        let mut chars = part.chars();
        chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if table.split('.').count() > 2 || !table.split('.').all(plain) {
        bail!("--table {table:?} must be a plain identifier (letters, digits, _), optionally schema.table");
    }
    Ok(())
}

/// Whether a create refused with this code will be refused again, whatever
/// the relay does: such a row is marked failed rather than retried forever.
fn refused_for_good(code: i32) -> bool {
    [tonic::Code::InvalidArgument, tonic::Code::FailedPrecondition, tonic::Code::ResourceExhausted]
        .iter()
        .any(|c| *c as i32 == code)
}

struct Row {
    id: i64,
    request: CreateJobRequest,
}

/// Runs the relay until `stop` resolves, reconnecting to PostgreSQL and
/// rotating through `gateways` when either fails.
pub async fn run(
    args: OutboxArgs,
    gateways: Vec<String>,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    check_table(&args.table)?;
    if args.print_schema {
        println!("{}", schema(&args.table));
        return Ok(());
    }
    if args.batch < 1 {
        bail!("--batch must be at least 1");
    }
    let clients: Vec<Client> = gateways
        .iter()
        .map(|g| Client::connect_lazy(g).with_context(|| format!("gateway address {g:?}")))
        .collect::<anyhow::Result<_>>()?;
    if clients.is_empty() {
        bail!("give at least one gateway with --address");
    }
    tokio::pin!(stop);
    tracing::info!(table = %args.table, gateways = ?gateways, "outbox relay started");
    let mut gateway = 0;
    let mut back_off = Duration::from_millis(100);
    let mut relayed = 0u64;
    loop {
        let round = async {
            let (mut pg, connection) = tokio_postgres::connect(&args.postgres, NoTls).await?;
            let connection = tokio::spawn(connection);
            if args.create_table {
                pg.batch_execute(&schema(&args.table)).await?;
            }
            let namespace = match &args.key_namespace {
                Some(namespace) => namespace.clone(),
                None => key_namespace(&pg, &args.table).await?,
            };
            let result = relay_until_error(&mut pg, &clients, &mut gateway, &args, &namespace, &mut relayed).await;
            connection.abort();
            result
        };
        tokio::select! {
            result = round => {
                let error = match result {
                    Ok(()) => return Ok(()),
                    Err(error) => error,
                };
                tracing::warn!("outbox relay: {error:#}; trying again in {back_off:?}");
            }
            _ = &mut stop => {
                tracing::info!("outbox relay: stopping after relaying {relayed} rows");
                return Ok(());
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(back_off) => {}
            _ = &mut stop => return Ok(()),
        }
        back_off = (back_off * 2).min(Duration::from_secs(5));
    }
}

async fn relay_until_error(
    pg: &mut tokio_postgres::Client,
    clients: &[Client],
    gateway: &mut usize,
    args: &OutboxArgs,
    namespace: &str,
    relayed: &mut u64,
) -> anyhow::Result<()> {
    loop {
        match relay_round(pg, &clients[*gateway % clients.len()], args, namespace).await {
            Ok(0) => tokio::time::sleep(Duration::from_millis(args.poll_ms)).await,
            Ok(n) => *relayed += n as u64,
            Err(RoundError::Gateway(status)) => {
                // Nothing was marked: the rows go again, through another gateway.
                *gateway += 1;
                tracing::warn!("outbox relay: creating jobs failed: {status}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(RoundError::Postgres(error)) => return Err(error.into()),
        }
    }
}

/// A row's idempotency key when it names none.
fn default_key(namespace: &str, table: &str, id: i64) -> String {
    if namespace.is_empty() {
        return format!("outbox:{table}:{id}");
    }
    format!("outbox:{namespace}:{table}:{id}")
}

enum RoundError {
    Gateway(tonic::Status),
    Postgres(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for RoundError {
    fn from(error: tokio_postgres::Error) -> Self {
        RoundError::Postgres(error)
    }
}

/// One transaction: lock a batch, create its jobs, delete or mark the rows.
/// Returns how many rows it settled (relayed or failed for good).
async fn relay_round(
    pg: &mut tokio_postgres::Client,
    gateway: &Client,
    args: &OutboxArgs,
    namespace: &str,
) -> Result<usize, RoundError> {
    let table = &args.table;
    let tx = pg.transaction().await?;
    let select = format!(
        "SELECT id, type, variables::text, headers::text, idempotency_key, tenant_id FROM {table} \
         WHERE relayed_at IS NULL AND failed_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
    );
    let rows: Vec<Row> = tx
        .query(&select, &[&args.batch])
        .await?
        .iter()
        .map(|row| {
            let id: i64 = row.get(0);
            let key: Option<String> = row.get(4);
            let headers: String = row.get(3);
            Row {
                id,
                request: CreateJobRequest {
                    r#type: row.get(1),
                    variables: row.get(2),
                    custom_headers: headers_of(&headers),
                    idempotency_key: key.unwrap_or_else(|| default_key(namespace, table, id)),
                    tenant_id: row.get(5),
                    ..Default::default()
                },
            }
        })
        .collect();
    if rows.is_empty() {
        tx.rollback().await?;
        return Ok(0);
    }
    let answers = create_all(gateway, &rows).await.map_err(RoundError::Gateway)?;
    let (mut done_ids, mut done_keys, mut failed_ids, mut failed_reasons) = (vec![], vec![], vec![], vec![]);
    for (row, answer) in rows.iter().zip(&answers) {
        match &answer.error {
            None => {
                done_ids.push(row.id);
                // Keys of partitions below 32768 fit; others wrap, as bigint is signed.
                done_keys.push(answer.key as i64);
            }
            Some(error) if refused_for_good(error.code) => {
                failed_ids.push(row.id);
                failed_reasons.push(error.message.clone());
            }
            // Unavailable for now: the row stays for the next round.
            Some(_) => {}
        }
    }
    if args.delete {
        tx.execute(&format!("DELETE FROM {table} WHERE id = ANY($1)"), &[&done_ids]).await?;
    } else {
        let mark = format!(
            "UPDATE {table} AS t SET relayed_at = now(), job_key = u.key \
             FROM unnest($1::bigint[], $2::bigint[]) AS u(id, key) WHERE t.id = u.id"
        );
        tx.execute(&mark, &[&done_ids, &done_keys]).await?;
    }
    if !failed_ids.is_empty() {
        let fail = format!(
            "UPDATE {table} AS t SET failed_at = now(), last_error = u.reason \
             FROM unnest($1::bigint[], $2::text[]) AS u(id, reason) WHERE t.id = u.id"
        );
        tx.execute(&fail, &[&failed_ids, &failed_reasons]).await?;
        tracing::warn!(rows = failed_ids.len(), "outbox rows refused for good: {}", failed_reasons[0]);
    }
    tx.commit().await?;
    Ok(done_ids.len() + failed_ids.len())
}

/// Creates every row's job over one `CreateJobs` stream; one answer per row.
async fn create_all(gateway: &Client, rows: &[Row]) -> Result<Vec<CreateJobResponse>, tonic::Status> {
    let requests: Vec<CreateJobRequest> = rows.iter().map(|r| r.request.clone()).collect();
    let mut call = tonic::Request::new(futures::stream::iter(requests));
    call.set_timeout(Duration::from_secs(30));
    let mut stream = gateway.raw().create_jobs(call).await?.into_inner();
    let mut answers = Vec::with_capacity(rows.len());
    while let Some(answer) = stream.message().await? {
        answers.push(answer);
    }
    if answers.len() != rows.len() {
        return Err(tonic::Status::unavailable(format!(
            "the gateway answered {} of {} creates",
            answers.len(),
            rows.len()
        )));
    }
    Ok(answers)
}

/// A headers column (a JSON object) as custom headers: strings as they are,
/// other values as JSON text.
fn headers_of(json: &str) -> HashMap<String, String> {
    let Ok(serde_json::Value::Object(map)) = serde_json::from_str(json) else { return HashMap::new() };
    map.into_iter()
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => (k, s),
            other => (k, other.to_string()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_table_names_are_accepted() {
        assert!(check_table("drover_outbox").is_ok());
        assert!(check_table("app.outbox_2").is_ok());
        for bad in ["", "1x", "a;drop table b", "a.b.c", "a b", "\"x\""] {
            assert!(check_table(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn headers_keep_strings_and_render_the_rest_as_json() {
        let headers = headers_of(r#"{"channel":"ops","retry":3}"#);
        assert_eq!(headers["channel"], "ops");
        assert_eq!(headers["retry"], "3");
        assert!(headers_of("not json").is_empty());
    }
}
