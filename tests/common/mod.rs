//! Helpers that start real nodes: in-process (`Node::start` on loopback ports)
//! or as `drover serve` child processes that can be killed with real signals.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use drover::client::Client;
use drover::config::NodeConfig;
use drover::node::Node;

/// Running nodes under libfaketime: the fault suite's module, shared.
#[path = "../../jepsen/src/faketime.rs"]
pub mod faketime;
mod ports;

pub use ports::free_port;

/// Waits for `check` to hold, polling, and panics with `what` after `limit`.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < limit, "timed out after {limit:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A node running inside the test process. Dropping it shuts the node down
/// (so RocksDB is closed before the test process exits); tests that use it run
/// on the multi-threaded runtime.
pub struct LocalNode {
    node: Option<Node>,
    pub client: Client,
    pub dir: tempfile::TempDir,
}

impl Drop for LocalNode {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(node.shutdown()));
        }
    }
}

impl LocalNode {
    pub async fn start() -> LocalNode {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(adjust: impl FnOnce(&mut NodeConfig)) -> LocalNode {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = NodeConfig::local(dir.path().join("node"));
        adjust(&mut config);
        let node = Node::start(config).await.expect("node starts");
        let ctx = node.ctx.clone();
        eventually(Duration::from_secs(20), "the node to lead its partitions", || {
            let ctx = ctx.clone();
            async move { (0..ctx.topology.partition_count()).all(|p| ctx.routing.local_leader(p).is_some()) }
        })
        .await;
        let client = Client::connect(&node.grpc_addr.to_string()).await.expect("client connects");
        LocalNode { node: Some(node), client, dir }
    }

    pub fn node(&self) -> &Node {
        self.node.as_ref().expect("running")
    }
}

/// A `drover serve` child process.
pub struct NodeProcess {
    pub child: Child,
    pub grpc: String,
    pub cluster: String,
    pub admin: String,
    /// The OJS port, when it was started with `--ojs-addr`.
    pub ojs: Option<String>,
    pub data_dir: PathBuf,
}

pub fn drover_bin() -> &'static str {
    env!("CARGO_BIN_EXE_drover")
}

/// One of the `drover` CLI's commands pointed at one node:
/// `Cli::new("queue", addr).run(&["list"])` runs
/// `drover queue list --address addr`.
#[allow(dead_code)] // not every test binary runs the CLI
pub struct Cli {
    command: &'static str,
    address: String,
}

#[allow(dead_code)]
impl Cli {
    pub fn new(command: &'static str, address: impl Into<String>) -> Cli {
        Cli { command, address: address.into() }
    }

    /// Whether it succeeded, its output and its errors.
    pub async fn run(&self, args: &[&str]) -> (bool, String, String) {
        let mut all = vec![self.command];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--address", &self.address]);
        run_drover(&all, &[]).await
    }
}

/// Runs `drover ARGS...` to its end, as an operator would, with `envs`
/// added to its environment; its exit status, stdout and stderr.
#[allow(dead_code)] // not every test binary runs the CLI
pub async fn run_drover(args: &[&str], envs: &[(&str, &str)]) -> (bool, String, String) {
    let mut command = tokio::process::Command::new(drover_bin());
    command.args(args).env("RUST_LOG", "warn").kill_on_drop(true);
    for (name, value) in envs {
        command.env(name, value);
    }
    let output = tokio::time::timeout(std::time::Duration::from_secs(120), command.output())
        .await
        .unwrap_or_else(|_| panic!("drover {args:?} did not finish within 120 s"))
        .expect("run drover");
    let text = |bytes: Vec<u8>| String::from_utf8_lossy(&bytes).into_owned();
    (output.status.success(), text(output.stdout), text(output.stderr))
}

impl NodeProcess {
    /// Starts a single node on ephemeral loopback ports and waits until it
    /// prints its addresses.
    pub fn start(data_dir: &Path, extra: &[&str]) -> NodeProcess {
        Self::spawn(data_dir, &loopback_args(extra))
    }

    /// Starts `drover serve --data-dir DIR ARGS...` and waits for its addresses.
    pub fn spawn(data_dir: &Path, args: &[String]) -> NodeProcess {
        Self::try_spawn(data_dir, args).expect("drover serve printed its addresses within 30 s")
    }

    /// Like [`NodeProcess::spawn`], but a node that exits before printing its
    /// addresses (a port taken by a parallel test) is an error, not a panic.
    pub fn try_spawn(data_dir: &Path, args: &[String]) -> Result<NodeProcess, String> {
        let child = serve_command(data_dir, args).stderr(Stdio::inherit()).spawn().expect("spawn drover serve");
        Self::await_addresses(child, data_dir, args)
    }

    /// Like [`NodeProcess::start`] with extra environment variables, and the
    /// node's stderr captured instead of passed on: the returned thread ends
    /// with all of it once the node has exited.
    pub fn start_capturing_stderr(
        data_dir: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> (NodeProcess, std::thread::JoinHandle<String>) {
        let args = loopback_args(extra);
        let mut command = serve_command(data_dir, &args);
        command.envs(env.iter().copied()).stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn drover serve");
        let mut stderr = child.stderr.take().expect("stderr piped");
        let captured = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
            text
        });
        let node = Self::await_addresses(child, data_dir, &args).expect("drover serve printed its addresses");
        (node, captured)
    }

    fn await_addresses(mut child: Child, data_dir: &Path, args: &[String]) -> Result<NodeProcess, String> {
        let stdout = child.stdout.take().expect("stdout piped");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut grpc = None;
        let mut cluster = None;
        let mut admin = None;
        let mut ojs = None;
        let wants_ojs = args.iter().any(|a| a == "--ojs-addr");
        let deadline = Instant::now() + Duration::from_secs(30);
        while grpc.is_none() || admin.is_none() || (wants_ojs && ojs.is_none()) {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(line) = rx.recv_timeout(left) else {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("drover serve {args:?} exited or stalled before printing its addresses"));
            };
            if let Some(addr) = line.trim().strip_prefix("gateway (gRPC):") {
                grpc = Some(addr.trim().to_string());
            }
            if let Some(addr) = line.trim().strip_prefix("cluster (gRPC):") {
                cluster = Some(addr.trim().to_string());
            }
            if let Some(rest) = line.trim().strip_prefix("admin (HTTP):") {
                let url = rest.split_whitespace().next().unwrap_or_default();
                admin = Some(url.trim_start_matches("https://").trim_start_matches("http://").to_string());
            }
            if let Some(rest) = line.trim().strip_prefix("OJS (HTTP):") {
                let url = rest.split_whitespace().next().unwrap_or_default();
                let host = url.trim_start_matches("https://").trim_start_matches("http://");
                ojs = Some(host.trim_end_matches("/ojs/v1").to_string());
            }
        }
        let cluster = cluster.unwrap_or_default();
        let (grpc, admin) = (grpc.unwrap(), admin.unwrap());
        Ok(NodeProcess { child, grpc, cluster, admin, ojs, data_dir: data_dir.to_path_buf() })
    }

    pub async fn client(&self) -> Client {
        Client::connect(&self.grpc).await.expect("client connects")
    }

    /// Waits for the node to exit by itself and returns how it did.
    pub async fn exited(&mut self, limit: Duration) -> std::process::ExitStatus {
        exited(&mut self.child, limit).await
    }

    /// Waits until the node answers a write (its partitions have leaders).
    pub async fn wait_ready(&self) {
        let admin = self.admin.clone();
        eventually(Duration::from_secs(30), "the node's /ready to say ready", || {
            let admin = admin.clone();
            async move { http_get(&admin, "/ready").await.map(|(code, _)| code == 200).unwrap_or(false) }
        })
        .await;
    }

    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL the node");
        self.child.wait().expect("reap the node");
    }

    pub fn signal(&self, signal: i32) {
        let rc = unsafe { libc::kill(self.child.id() as i32, signal) };
        assert_eq!(rc, 0, "sending signal {signal}");
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for a child process to exit by itself and returns how it did.
pub async fn exited(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("poll the process") {
            return status;
        }
        assert!(started.elapsed() < limit, "the process still runs after {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Ephemeral loopback ports for every listener, then `extra`.
fn loopback_args(extra: &[&str]) -> Vec<String> {
    ["--grpc-addr", "127.0.0.1:0", "--cluster-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
}

/// `drover serve --data-dir DIR ARGS...`, its stdout piped, logging warnings.
fn serve_command(data_dir: &Path, args: &[String]) -> Command {
    let mut command = Command::new(drover_bin());
    command.arg("serve").arg("--data-dir").arg(data_dir).args(args).env("RUST_LOG", "warn").stdout(Stdio::piped());
    command
}

/// A minimal HTTP/1.1 GET; returns the status code and body.
pub async fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    http_request("GET", addr, path).await
}

/// A minimal HTTP/1.1 request without a body; returns the status code and body.
pub async fn http_request(method: &str, addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    http_request_with(method, addr, path, "").await
}

/// Like [`http_request`], with extra header lines (each ending in `\r\n`).
pub async fn http_request_with(method: &str, addr: &str, path: &str, headers: &str) -> std::io::Result<(u16, String)> {
    let (code, _, body) = http_exchange(method, addr, path, headers, "").await?;
    Ok((code, body))
}

/// A minimal HTTP/1.1 exchange with a body; returns the status code, the
/// response's head (status line and headers) and its body.
pub async fn http_exchange(
    method: &str,
    addr: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> std::io::Result<(u16, String, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").map(|(h, b)| (h.to_string(), b.to_string())).unwrap_or_default();
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") { dechunk(&body) } else { body };
    Ok((code, head, body))
}

fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else { break };
        if size == 0 || after.len() < size {
            break;
        }
        out.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    out
}

/// Ports of one node of a [`ProcessCluster`], fixed so a restart reuses them.
#[derive(Clone, Copy)]
struct Ports {
    grpc: u16,
    cluster: u16,
    admin: u16,
}

/// One partition's Raft status as a node reports it on /actuator/partitions.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct PartitionStatus {
    pub partition: u32,
    pub role: String,
    pub term: u64,
    pub leader: Option<u64>,
    pub applied_index: u64,
    pub snapshot_index: Option<u64>,
    pub purged_index: Option<u64>,
    #[serde(default)]
    pub cut_off: bool,
}

/// Several `drover serve` processes forming one cluster on loopback.
pub struct ProcessCluster {
    pub nodes: Vec<Option<NodeProcess>>,
    ports: Vec<Ports>,
    args: Vec<String>,
    /// Each node's member list.
    members: Vec<String>,
    pub dir: tempfile::TempDir,
}

impl ProcessCluster {
    pub fn start(size: usize, partitions: u32, replication_factor: u32, extra: &[&str]) -> ProcessCluster {
        Self::start_with(size, partitions, replication_factor, extra, &|_, port| format!("127.0.0.1:{port}"))
    }

    /// Three nodes, every partition on each, whose nodes have `failpoints`
    /// armed (`DROVER_FAILPOINTS`; empty: none, but armable at run time).
    pub fn start_with_failpoints(failpoints: &str, partitions: u32, extra: &[&str]) -> ProcessCluster {
        // Each test runs in its own process (nextest), and nodes inherit its environment.
        std::env::set_var("DROVER_FAILPOINTS", failpoints);
        Self::start(3, partitions, 3, extra)
    }

    /// A live node other than `node`.
    pub fn other_than(&self, node: usize) -> usize {
        self.live().into_iter().find(|id| *id != node).expect("another live node")
    }

    /// Like [`ProcessCluster::start`], but nodes dial node i at
    /// `dial(i, its cluster port)` (a proxy in front of it, say).
    pub fn start_with(
        size: usize,
        partitions: u32,
        replication_factor: u32,
        extra: &[&str],
        dial: &dyn Fn(usize, u16) -> String,
    ) -> ProcessCluster {
        Self::start_located(size, partitions, replication_factor, extra, &[], &|_, to, port| dial(to, port))
    }

    /// Like [`ProcessCluster::start`], with node i at `locations[i]`
    /// (REGION/ZONE in the member list; none when empty), and node `from`
    /// dialing node `to` at `dial(from, to, its cluster port)`: each node has
    /// its own member list, so links between regions can go through proxies.
    pub fn start_located(
        size: usize,
        partitions: u32,
        replication_factor: u32,
        extra: &[&str],
        locations: &[&str],
        dial: &dyn Fn(usize, usize, u16) -> String,
    ) -> ProcessCluster {
        // Ports are picked free and then released, so a parallel test can take
        // one first; such a start is retried on other ports.
        for _ in 0..5 {
            let mut cluster = Self::laid_out(size, partitions, replication_factor, extra, locations, dial);
            if (0..size).all(|id| cluster.try_start_node(id).is_ok()) {
                return cluster;
            }
        }
        panic!("could not start a {size}-node cluster on free ports in 5 attempts");
    }

    /// A cluster's ports, data directories and flags, with no node started
    /// (to prepare their data directories first); start each with
    /// [`ProcessCluster::start_node`].
    pub fn unstarted(size: usize, partitions: u32, replication_factor: u32, extra: &[&str]) -> ProcessCluster {
        Self::laid_out(size, partitions, replication_factor, extra, &[], &|_, _, port| format!("127.0.0.1:{port}"))
    }

    fn laid_out(
        size: usize,
        partitions: u32,
        replication_factor: u32,
        extra: &[&str],
        locations: &[&str],
        dial: &dyn Fn(usize, usize, u16) -> String,
    ) -> ProcessCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let ports: Vec<Ports> =
            (0..size).map(|_| Ports { grpc: free_port(), cluster: free_port(), admin: free_port() }).collect();
        let members: Vec<String> = (0..size)
            .map(|from| {
                let entries: Vec<String> = ports
                    .iter()
                    .enumerate()
                    .map(|(to, p)| match locations.get(to) {
                        Some(at) => format!("{to}={}@{at}", dial(from, to, p.cluster)),
                        None => format!("{to}={}", dial(from, to, p.cluster)),
                    })
                    .collect();
                entries.join(",")
            })
            .collect();
        let mut args = vec![
            "--partitions".to_string(),
            partitions.to_string(),
            "--replication-factor".into(),
            replication_factor.to_string(),
        ];
        // Leader balance moves leadership a few seconds after an election,
        // under whatever a test does then; tests that find a leader and act
        // on it want it to stay. The balance test, the fault suite and the
        // bench run with it on, as a cluster does by default.
        if !extra.iter().any(|a| a.starts_with("--balance-leaders")) {
            args.extend(["--balance-leaders".to_string(), "false".into()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        ProcessCluster { nodes: (0..size).map(|_| None).collect(), ports, args, members, dir }
    }

    fn try_start_node(&mut self, id: usize) -> Result<(), String> {
        let (data, args) = self.node_args(id);
        self.nodes[id] = Some(NodeProcess::try_spawn(&data, &args)?);
        Ok(())
    }

    /// Node `id`'s data directory and the flags it starts with.
    pub fn node_args(&self, id: usize) -> (PathBuf, Vec<String>) {
        let p = self.ports[id];
        let mut args = vec![
            "--node-id".to_string(),
            id.to_string(),
            "--grpc-addr".into(),
            format!("127.0.0.1:{}", p.grpc),
            "--cluster-addr".into(),
            format!("127.0.0.1:{}", p.cluster),
            "--admin-addr".into(),
            format!("127.0.0.1:{}", p.admin),
            "--members".into(),
            self.members[id].clone(),
        ];
        args.extend(self.args.iter().cloned());
        (self.dir.path().join(format!("node-{id}")), args)
    }

    pub fn start_node(&mut self, id: usize) {
        self.start_node_with(id, &[]);
    }

    /// Starts a node to be added to the running cluster (`--join-plan`),
    /// under the next id, at `location` (REGION/ZONE; empty: none), with
    /// every member and itself in its member list. Answers its id.
    pub fn start_joining(&mut self, location: &str) -> usize {
        let id = self.ports.len();
        let ports = Ports { grpc: free_port(), cluster: free_port(), admin: free_port() };
        self.ports.push(ports);
        let entry = match location {
            "" => format!("{id}=127.0.0.1:{}", ports.cluster),
            at => format!("{id}=127.0.0.1:{}@{at}", ports.cluster),
        };
        self.members.push(format!("{},{entry}", self.members[0]));
        self.nodes.push(None);
        self.start_node_with(id, &["--join-plan"]);
        id
    }

    /// Starts a node the member list does not name, as a StatefulSet's pod
    /// beyond the size the cluster formed with: the next id, with
    /// `--join-if-unlisted`, its cluster port `cluster_port`. Answers its id.
    pub fn start_unlisted(&mut self, cluster_port: u16) -> usize {
        let id = self.ports.len();
        self.ports.push(Ports { grpc: free_port(), cluster: cluster_port, admin: free_port() });
        self.members.push(self.members[0].clone());
        self.nodes.push(None);
        self.start_node_with(id, &["--join-if-unlisted"]);
        id
    }

    /// Node `id`'s cluster (node-to-node) address.
    pub fn cluster_addr(&self, id: usize) -> String {
        format!("127.0.0.1:{}", self.ports[id].cluster)
    }

    /// Starts node `id` with its usual arguments and `extra`.
    pub fn start_node_with(&mut self, id: usize, extra: &[&str]) {
        let (data, mut args) = self.node_args(id);
        args.extend(extra.iter().map(|s| s.to_string()));
        self.nodes[id] = Some(NodeProcess::spawn(&data, &args));
    }

    pub fn data_dir(&self, id: usize) -> PathBuf {
        self.node_args(id).0
    }

    pub fn kill(&mut self, id: usize) {
        if let Some(mut node) = self.nodes[id].take() {
            node.kill();
        }
    }

    pub fn node(&self, id: usize) -> &NodeProcess {
        self.nodes[id].as_ref().expect("node is running")
    }

    pub fn live(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|i| self.nodes[*i].is_some()).collect()
    }

    pub fn gateway(&self, id: usize) -> String {
        format!("127.0.0.1:{}", self.ports[id].grpc)
    }

    /// The sum of a metric family's samples on a node (0 if it does not answer).
    pub async fn metric(&self, id: usize, name: &str) -> f64 {
        let admin = format!("127.0.0.1:{}", self.ports[id].admin);
        let Ok((_, body)) = http_get(&admin, "/metrics").await else { return 0.0 };
        metric_sum(&body, name)
    }

    /// The cluster requests node `id` answered for `method`, by any code
    /// (a message on a stream between nodes counts as the request it
    /// carries; a stream's opening counts under the stream's method).
    pub async fn answered(&self, id: usize, method: &str) -> f64 {
        let admin = format!("127.0.0.1:{}", self.ports[id].admin);
        let Ok((_, body)) = http_get(&admin, "/metrics").await else { return 0.0 };
        let label = format!("method=\"{method}\"");
        body.lines()
            .filter(|l| l.starts_with("drover_cluster_requests_total{") && l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// The node's view of its partitions, or None if it does not answer.
    pub async fn status(&self, id: usize) -> Option<Vec<PartitionStatus>> {
        let admin = format!("127.0.0.1:{}", self.ports[id].admin);
        let (code, body) = http_get(&admin, "/actuator/partitions").await.ok()?;
        if code != 200 {
            return None;
        }
        let value: serde_json::Value = serde_json::from_str(&body).ok()?;
        serde_json::from_value(value.get("local")?.clone()).ok()
    }

    /// The node that leads `partition`, once it has led it in one term for
    /// longer than `held` (a hand-over needs a leader that has held its term
    /// past its followers' lease).
    pub async fn held_leader(&self, partition: u32, held: Duration) -> usize {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen: Option<(usize, u64, Instant)> = None;
        loop {
            assert!(Instant::now() < deadline, "no node held partition {partition} for {held:?} within 30 s");
            let leader = self.leader_of(partition, Duration::from_secs(20)).await;
            let statuses = self.status(leader).await.unwrap_or_default();
            let term = statuses.into_iter().find(|s| s.partition == partition && s.role == "leader").map(|s| s.term);
            match (term, seen) {
                (Some(term), Some((l, t, since))) if l == leader && t == term => {
                    if since.elapsed() > held {
                        return leader;
                    }
                }
                (Some(term), _) => seen = Some((leader, term, Instant::now())),
                (None, _) => seen = None,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until a live node leads `partition` and every live replica agrees.
    pub async fn leader_of(&self, partition: u32, limit: Duration) -> usize {
        let started = Instant::now();
        loop {
            let mut views = Vec::new();
            for id in self.live() {
                if let Some(statuses) = self.status(id).await {
                    if let Some(s) = statuses.into_iter().find(|s| s.partition == partition) {
                        views.push((id, s));
                    }
                }
            }
            let leaders: Vec<usize> = views.iter().filter(|(_, s)| s.role == "leader").map(|(id, _)| *id).collect();
            if let [leader] = leaders[..] {
                if views.iter().all(|(_, s)| s.leader == Some(leader as u64)) {
                    return leader;
                }
            }
            assert!(
                started.elapsed() < limit,
                "no agreed leader for partition {partition} within {limit:?}: {views:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Jobs node `id` holds (its replicas, live and retained) whose variables
    /// contain `marker`.
    pub async fn jobs_with(&self, id: usize, marker: &str) -> Vec<serde_json::Value> {
        let mut jobs = Vec::new();
        let mut path = "/actuator/jobs".to_string();
        loop {
            let Ok((200, body)) = http_get(&self.node(id).admin, &path).await else { return Vec::new() };
            let view: serde_json::Value = serde_json::from_str(&body).expect("jobs view is JSON");
            let page = view["jobs"].as_array().expect("jobs array").iter();
            jobs.extend(page.filter(|j| j["variables"].as_str().is_some_and(|v| v.contains(marker))).cloned());
            match view["next"].as_u64() {
                Some(after) => path = format!("/actuator/jobs?after={after}"),
                None => return jobs,
            }
        }
    }

    pub async fn wait_ready(&self) {
        for id in self.live() {
            self.node(id).wait_ready().await;
        }
    }
}

/// Forwards connections on a loopback port to `target`, holding every chunk
/// of bytes for `delay` in each direction, in order: a slow link, which this
/// kernel cannot make itself (no netem). Returns the port. The proxy lives as
/// long as the test's runtime.
pub fn delaying_proxy(target: u16, delay: Duration) -> u16 {
    let target = std::net::SocketAddr::from(([127, 0, 0, 1], target));
    let link = drover::bench::delay::DelayLink::start(target, delay, Duration::ZERO).expect("start a proxy");
    let port = link.port();
    // Never cut: it lives with the runtime.
    std::mem::forget(link);
    port
}

/// The sum of the samples of `name` (a family, or one series with its labels)
/// in a Prometheus exposition.
pub fn metric_sum(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with([' ', '{'])))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A client of a node's cluster service that calls as a peer of this build
/// does: naming its data version (`drover-data-version`), which the node
/// admits. A client without it speaks the oldest version, which a node
/// refuses once its cluster has moved past it.
pub type PeerClient = drover::proto::cluster::cluster_client::ClusterClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, PeerStamp>,
>;

#[derive(Clone, Copy)]
pub struct PeerStamp;

impl tonic::service::Interceptor for PeerStamp {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let version = drover::codec::DATA_VERSION.to_string().parse().expect("a number");
        request.metadata_mut().insert(drover::transport::versions::VERSION_HEADER, version);
        Ok(request)
    }
}

/// [`PeerClient`] on `channel`.
pub fn peer_of(channel: tonic::transport::Channel) -> PeerClient {
    drover::proto::cluster::cluster_client::ClusterClient::with_interceptor(channel, PeerStamp)
}

/// [`PeerClient`] connected to `address` (`http://host:port`).
pub async fn peer(address: String) -> Result<PeerClient, tonic::transport::Error> {
    Ok(peer_of(tonic::transport::Endpoint::from_shared(address)?.connect().await?))
}
