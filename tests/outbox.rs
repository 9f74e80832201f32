//! The outbox relay against a real PostgreSQL server (a throwaway cluster
//! made with `initdb` in a temporary directory, run as the `postgres` user
//! when the tests run as root) and three real Drover nodes: rows inserted by
//! concurrent transactions, some rolled back, relayed by two relays while
//! one is SIGKILLed and restarted. Every committed row becomes exactly one
//! job; no rolled-back row does.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{drover_bin, free_port, ProcessCluster};
use drover::client::Client;
use drover::proto::gateway::{JobFilter, ListJobsRequest};

/// A PostgreSQL server of its own, on a free loopback port, removed on drop.
struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Postgres {
    fn start() -> Postgres {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL is installed (scripts/setup.sh installs postgresql-15)")
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|b| b.join("initdb").exists())
            .max()
            .expect("an initdb under /usr/lib/postgresql/*/bin");
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let port = free_port();
        let as_root = unsafe { libc::geteuid() } == 0;
        if as_root {
            // PostgreSQL refuses to run as root: the server runs as `postgres`.
            let status = Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir.path()).status().unwrap();
            assert!(status.success(), "chown the PostgreSQL directory");
        }
        let pg = Postgres { bin, data, port, _dir: dir };
        pg.run("initdb", &["-D", pg.data.to_str().unwrap(), "-A", "trust", "-U", "drover", "-E", "UTF8", "--no-sync"]);
        let options = format!("-p {port} -k {} -c listen_addresses=127.0.0.1", pg.data.display());
        let log = pg.data.join("server.log");
        pg.run(
            "pg_ctl",
            &["start", "-w", "-t", "60", "-D", pg.data.to_str().unwrap(), "-o", &options, "-l", log.to_str().unwrap()],
        );
        pg
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let program = self.bin.join(tool);
        let mut command = if unsafe { libc::geteuid() } == 0 {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        };
        let output = command.args(args).stdin(Stdio::null()).output().expect("run a PostgreSQL tool");
        assert!(output.status.success(), "{tool} {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    }

    fn url(&self) -> String {
        self.url_of("postgres")
    }

    fn url_of(&self, database: &str) -> String {
        format!("host=127.0.0.1 port={} user=drover dbname={database}", self.port)
    }

    async fn connect(&self) -> tokio_postgres::Client {
        self.connect_to("postgres").await
    }

    async fn connect_to(&self, database: &str) -> tokio_postgres::Client {
        let url = self.url_of(database);
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.expect("connect");
        tokio::spawn(connection);
        client
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.data.to_str().unwrap().to_string();
        let program = self.bin.join("pg_ctl");
        let mut command = if unsafe { libc::geteuid() } == 0 {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        };
        let _ = command.args(["stop", "-m", "immediate", "-D", &data]).output();
    }
}

/// A `drover outbox` process, killed on drop.
struct Relay(Child);

impl Relay {
    fn start(pg: &Postgres, gateways: &str, log: &Path) -> Relay {
        Relay::start_on(&pg.url(), gateways, log)
    }

    fn start_on(postgres: &str, gateways: &str, log: &Path) -> Relay {
        let log = std::fs::File::create(log).unwrap();
        let child = Command::new(drover_bin())
            .args(["outbox", "--postgres", postgres, "--table", "drover_outbox", "--batch", "100"])
            .args(["--address", gateways])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start drover outbox");
        Relay(child)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Outbox rows where `condition` holds.
async fn count(client: &tokio_postgres::Client, condition: &str) -> i64 {
    let query = format!("SELECT count(*) FROM drover_outbox WHERE {condition}");
    client.query_one(&query, &[]).await.expect("count rows").get(0)
}

const WRITERS: usize = 20;
const TRANSACTIONS: usize = 60;
const ROWS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_outbox_row_becomes_one_job_while_a_relay_is_killed() {
    let pg = Postgres::start();
    let cluster = ProcessCluster::start(3, 3, 3, &["--heartbeat-ms", "50", "--election-timeout-ms", "300"]);
    cluster.wait_ready().await;
    pg.connect().await.batch_execute(&drover::outbox::schema("drover_outbox")).await.expect("create the outbox");

    let logs = tempfile::tempdir().unwrap();
    let gateways =
        |first: usize| (0..3).map(|i| cluster.node((first + i) % 3).grpc.clone()).collect::<Vec<_>>().join(",");
    let mut first = Relay::start(&pg, &gateways(0), &logs.path().join("relay-1.log"));
    let _second = Relay::start(&pg, &gateways(1), &logs.path().join("relay-2.log"));

    // Writers: each transaction inserts ten rows; every sixth one rolls back.
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let client = pg.connect().await;
        writers.push(tokio::spawn(async move {
            let mut client = client;
            let mut committed = Vec::new();
            let mut rolled_back = Vec::new();
            for txn in 0..TRANSACTIONS {
                let tx = client.transaction().await.unwrap();
                let markers: Vec<String> = (0..ROWS).map(|row| format!("w{writer}-t{txn}-r{row}")).collect();
                for marker in &markers {
                    let variables = format!(r#"{{"marker":"{marker}"}}"#);
                    tx.execute(
                        "INSERT INTO drover_outbox (type, variables, headers) VALUES ('outbox-e2e', $1::text::jsonb, '{\"source\":\"test\"}')",
                        &[&variables],
                    )
                    .await
                    .unwrap();
                }
                if txn % 6 == 5 {
                    tx.rollback().await.unwrap();
                    rolled_back.extend(markers);
                } else {
                    tx.commit().await.unwrap();
                    committed.extend(markers);
                }
            }
            (committed, rolled_back)
        }));
    }

    // Midway, one relay dies without a word, and comes back.
    let pg_client = pg.connect().await;
    let started = Instant::now();
    while count(&pg_client, "relayed_at IS NOT NULL").await < 2_000 {
        assert!(started.elapsed() < Duration::from_secs(60), "the relays relayed under 2000 rows in 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.0.kill().expect("SIGKILL the first relay");
    first.0.wait().unwrap();
    first = Relay::start(&pg, &gateways(2), &logs.path().join("relay-1b.log"));

    let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
    for writer in writers {
        let (c, r) = writer.await.unwrap();
        committed.extend(c);
        rolled_back.extend(r);
    }
    assert_eq!(committed.len(), 10_000);
    let started = Instant::now();
    loop {
        if count(&pg_client, "relayed_at IS NULL").await == 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "rows still unrelayed after 120 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(first);

    // Every job of the type, from every partition.
    let client = Client::connect(&cluster.node(0).grpc).await.unwrap();
    let mut jobs_by_marker: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut token = String::new();
    loop {
        let filter = JobFilter { r#type: "outbox-e2e".into(), ..Default::default() };
        let request = ListJobsRequest { filter: Some(filter), page_size: 1000, page_token: token };
        let page = client.raw().list_jobs(request).await.unwrap().into_inner();
        for job in &page.jobs {
            let variables: serde_json::Value = serde_json::from_str(&job.variables).unwrap();
            let marker = variables["marker"].as_str().expect("a marker").to_string();
            assert_eq!(job.custom_headers.get("source").map(String::as_str), Some("test"));
            jobs_by_marker.entry(marker).or_default().push(job.key);
        }
        token = page.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    let twice: Vec<_> = jobs_by_marker.iter().filter(|(_, keys)| keys.len() > 1).collect();
    assert!(twice.is_empty(), "rows that became several jobs: {twice:?}");
    let missing: Vec<_> = committed.iter().filter(|m| !jobs_by_marker.contains_key(*m)).collect();
    assert!(
        missing.is_empty(),
        "{} committed rows made no job, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    let phantom: Vec<_> = rolled_back.iter().filter(|m| jobs_by_marker.contains_key(*m)).collect();
    assert!(phantom.is_empty(), "rolled-back rows made jobs: {phantom:?}");
    assert_eq!(jobs_by_marker.len(), committed.len());

    // Each row records the job it became.
    let rows = pg_client.query("SELECT variables->>'marker', job_key FROM drover_outbox", &[]).await.unwrap();
    assert_eq!(rows.len(), committed.len());
    for row in rows {
        let (marker, key): (String, i64) = (row.get(0), row.get(1));
        assert_eq!(jobs_by_marker[&marker], vec![key as u64], "row {marker} names another job");
    }
}

/// Two databases relay outbox tables of one name into one cluster, each with
/// a row of the same id and content: each row is its own job, since the
/// default key is scoped by the database and table it came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outboxes_of_one_name_in_two_databases_make_a_job_each() {
    let pg = Postgres::start();
    let cluster = ProcessCluster::start(1, 1, 1, &[]);
    cluster.wait_ready().await;
    let admin = pg.connect().await;
    let logs = tempfile::tempdir().unwrap();
    let mut relays = Vec::new();
    let mut clients = Vec::new();
    for database in ["orders", "billing"] {
        admin.batch_execute(&format!("CREATE DATABASE {database}")).await.expect("create a database");
        let client = pg.connect_to(database).await;
        client.batch_execute(&drover::outbox::schema("drover_outbox")).await.expect("create the outbox");
        client
            .execute("INSERT INTO drover_outbox (type, variables) VALUES ('outbox-twins', '{}')", &[])
            .await
            .expect("insert a row");
        let log = logs.path().join(format!("{database}.log"));
        relays.push(Relay::start_on(&pg.url_of(database), &cluster.node(0).grpc, &log));
        clients.push(client);
    }
    let mut keys = Vec::new();
    for client in &clients {
        let started = Instant::now();
        while count(client, "relayed_at IS NOT NULL").await < 1 {
            assert!(started.elapsed() < Duration::from_secs(60), "a row unrelayed after 60 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(count(client, "failed_at IS NOT NULL").await, 0, "no row failed");
        let row = client.query_one("SELECT id, job_key FROM drover_outbox", &[]).await.unwrap();
        let (id, key): (i64, i64) = (row.get(0), row.get(1));
        assert_eq!(id, 1, "both rows have the same id");
        keys.push(key);
    }
    assert_ne!(keys[0], keys[1], "the second database's row got the first one's job");
    let gateway = Client::connect(&cluster.node(0).grpc).await.unwrap();
    let filter = JobFilter { r#type: "outbox-twins".into(), ..Default::default() };
    let request = ListJobsRequest { filter: Some(filter), page_size: 10, ..Default::default() };
    let listed = gateway.raw().list_jobs(request).await.unwrap().into_inner();
    assert_eq!(listed.jobs.len(), 2, "one job per row");
}
