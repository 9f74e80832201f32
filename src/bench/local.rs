//! A cluster of `drover serve` processes on this machine, in temporary (or
//! given) data directories: used by `drover bench --local-nodes` and
//! `drover dev-cluster`.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

pub struct LocalNodeProcess {
    pub node_id: u64,
    pub child: Child,
    pub grpc: String,
    pub cluster: String,
    pub admin: String,
    /// The node's Open Job Spec HTTP port.
    pub ojs: String,
    pub data_dir: PathBuf,
    /// `drover serve`'s arguments, to start it again as it was.
    args: Vec<String>,
    log: PathBuf,
}

/// Where local nodes are and how they reach each other (see
/// [`LocalCluster::start_located`]).
pub struct Topology<'a> {
    pub locations: &'a [String],
    pub dial: &'a dyn Fn(usize, usize, u16) -> String,
}

pub struct LocalCluster {
    pub nodes: Vec<LocalNodeProcess>,
    /// With TLS on every port: the throwaway CA's certificate (PEM) that
    /// clients trust, and the files it was written to.
    pub tls: Option<(Vec<u8>, crate::tls::DevFiles)>,
    /// With tokens on: the token admin reads send.
    pub token: Option<String>,
    _temp: Option<tempfile::TempDir>,
}

/// How often a start is tried again on fresh ports when a node finds one of
/// its ports taken (by another process between their choice and its bind).
const START_ATTEMPTS: usize = 3;

/// How long leadership must stay balanced, and unmoved, before a run starts.
const BALANCED_FOR: Duration = Duration::from_secs(2);

/// `count` distinct free ports: each is held until all are chosen.
fn free_ports(count: usize) -> anyhow::Result<Vec<u16>> {
    let held = (0..count).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<Result<Vec<_>, _>>()?;
    held.iter().map(|listener| Ok(listener.local_addr()?.port())).collect()
}

/// Why a node did not start.
struct StartFailure {
    error: anyhow::Error,
    /// One of its ports was taken: a new choice of ports may succeed.
    port_taken: bool,
}

/// How many partitions the busiest node leads more than the idlest.
pub fn imbalance(led_per_node: &[usize]) -> usize {
    let (min, max) = (led_per_node.iter().min(), led_per_node.iter().max());
    max.zip(min).map_or(0, |(max, min)| max - min)
}

impl LocalCluster {
    /// Starts `nodes` nodes. With `base_dir` the data stays there; otherwise a
    /// temporary directory is removed when the cluster is dropped.
    pub fn start(
        nodes: usize,
        partitions: u32,
        replication_factor: u32,
        base_dir: Option<&Path>,
        extra_args: &[String],
    ) -> anyhow::Result<LocalCluster> {
        Self::start_with(nodes, partitions, replication_factor, base_dir, extra_args, false)
    }

    /// Like [`LocalCluster::start`]; with `tls`, a throwaway CA and a
    /// certificate for 127.0.0.1 are written to the base directory's `tls/`
    /// and every port of every node serves TLS (mutual on the cluster port).
    pub fn start_with(
        nodes: usize,
        partitions: u32,
        replication_factor: u32,
        base_dir: Option<&Path>,
        extra_args: &[String],
        tls: bool,
    ) -> anyhow::Result<LocalCluster> {
        let topology = Topology { locations: &[], dial: &|_, _, port| format!("127.0.0.1:{port}") };
        Self::start_located(nodes, partitions, replication_factor, base_dir, extra_args, tls, &topology)
    }

    /// Like [`LocalCluster::start_with`], with node i at `locations[i]`
    /// (REGION/ZONE; none when empty) and node `from` dialing node `to` at
    /// `dial(from, to, to's cluster port)`: a delaying proxy between regions.
    pub fn start_located(
        nodes: usize,
        partitions: u32,
        replication_factor: u32,
        base_dir: Option<&Path>,
        extra_args: &[String],
        tls: bool,
        topology: &Topology,
    ) -> anyhow::Result<LocalCluster> {
        let temp = match base_dir {
            Some(_) => None,
            None => Some(tempfile::Builder::new().prefix("drover-local-").tempdir()?),
        };
        let base = base_dir.map(Path::to_path_buf).unwrap_or_else(|| temp.as_ref().expect("temp").path().to_path_buf());
        std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
        let tls = match tls {
            true => {
                let files = crate::tls::write_dev_certificates(&base.join("tls"), &["127.0.0.1", "localhost"])?;
                Some((std::fs::read(&files.ca)?, files))
            }
            false => None,
        };
        let mut extra_args = extra_args.to_vec();
        if let Some((_, files)) = &tls {
            let (cert, key, ca) = (files.cert.display(), files.key.display(), files.ca.display());
            for (flag, value) in [
                ("--tls-cert", cert.to_string()),
                ("--tls-key", key.to_string()),
                ("--cluster-tls-cert", cert.to_string()),
                ("--cluster-tls-key", key.to_string()),
                ("--cluster-tls-ca", ca.to_string()),
            ] {
                extra_args.extend([flag.to_string(), value]);
            }
        }
        // Only nodes that hold no data yet may be wiped and started again.
        let fresh = (0..nodes).all(|id| !base.join(format!("node-{id}")).exists());
        let mut attempt = 1;
        loop {
            match launch(&base, nodes, partitions, replication_factor, &extra_args, topology) {
                Ok(started) => return Ok(LocalCluster { nodes: started, tls, token: None, _temp: temp }),
                Err(failure) if fresh && failure.port_taken && attempt < START_ATTEMPTS => {
                    tracing::warn!("{:#}; starting the nodes again on other ports", failure.error);
                    for id in 0..nodes {
                        let _ = std::fs::remove_dir_all(base.join(format!("node-{id}")));
                    }
                    attempt += 1;
                }
                Err(failure) => return Err(failure.error),
            }
        }
    }

    /// SIGKILLs node `index` and waits for it to be gone.
    pub fn kill(&mut self, index: usize) {
        let node = &mut self.nodes[index];
        let _ = node.child.kill();
        let _ = node.child.wait();
    }

    /// SIGTERMs node `index` (a graceful stop, as Kubernetes does) and waits
    /// up to `limit` for it to exit; SIGKILLs it past that. Answers whether
    /// it exited by itself.
    pub fn terminate(&mut self, index: usize, limit: Duration) -> bool {
        let node = &mut self.nodes[index];
        unsafe {
            libc::kill(node.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + limit;
        loop {
            match node.child.try_wait() {
                Ok(Some(_)) => return true,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = node.child.kill();
                    let _ = node.child.wait();
                    return false;
                }
            }
        }
    }

    /// Starts node `index` again, exactly as it was started (its log appended to).
    pub fn restart(&mut self, index: usize) -> anyhow::Result<()> {
        let node = &mut self.nodes[index];
        node.child = spawn(&node.args, &node.log, true)?;
        await_started(node)
    }

    /// Every node's gateway: `https://` addresses with TLS.
    pub fn gateways(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https://" } else { "" };
        self.nodes.iter().map(|n| format!("{scheme}{}", n.grpc)).collect()
    }

    /// The CA clients of this cluster trust (PEM), with TLS.
    pub fn ca(&self) -> Option<&[u8]> {
        self.tls.as_ref().map(|(ca, _)| ca.as_slice())
    }

    /// A GET on node `index`'s admin port, over HTTPS with TLS.
    pub async fn admin_get(&self, index: usize, path: &str) -> std::io::Result<(u16, String)> {
        let admin = &self.nodes[index].admin;
        let token = self.token.as_deref();
        match self.ca() {
            Some(ca) => crate::tls::https_get_as(admin, path, ca, token).await,
            None => admin_get(admin, path, token).await,
        }
    }

    /// Waits until every node says `/ready`.
    pub async fn wait_ready(&self, limit: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        for (index, node) in self.nodes.iter().enumerate() {
            loop {
                if self.admin_get(index, "/ready").await.map(|(code, _)| code == 200).unwrap_or(false) {
                    break;
                }
                if started.elapsed() > limit {
                    bail!("node {} was not ready within {limit:?}", node.node_id);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// How many partitions each node leads now, as each node's own replicas
    /// say (a node that cannot be asked counts none).
    pub async fn leaders_per_node(&self) -> Vec<usize> {
        let mut led = Vec::with_capacity(self.nodes.len());
        for index in 0..self.nodes.len() {
            let body = self.admin_get(index, "/actuator/partitions").await.map(|(_, body)| body).unwrap_or_default();
            let status: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let local = status["local"].as_array().cloned().unwrap_or_default();
            led.push(local.iter().filter(|p| p["role"] == "leader" && p["cut_off"] != true).count());
        }
        led
    }

    /// Waits up to `limit` until every partition has a leader, no node leads
    /// more than one partition more than another (leader balance moves
    /// leadership there a few seconds after the first elections), and that
    /// has held, unmoved, for [`BALANCED_FOR`]: while leader balance moves
    /// partitions to their preferred replicas the counts can look balanced
    /// half-way, and the moves left would then happen during the run.
    /// Answers the partitions led per node at the end, balanced or not.
    pub async fn wait_balanced(&self, partitions: usize, limit: Duration) -> Vec<usize> {
        let started = Instant::now();
        let mut balanced_since: Option<(Instant, Vec<usize>)> = None;
        loop {
            let led = self.leaders_per_node().await;
            let balanced = led.iter().sum::<usize>() == partitions && imbalance(&led) <= 1;
            balanced_since = match balanced_since {
                Some((since, was)) if balanced && was == led => Some((since, was)),
                _ if balanced => Some((Instant::now(), led.clone())),
                _ => None,
            };
            if balanced_since.as_ref().is_some_and(|(since, _)| since.elapsed() >= BALANCED_FOR)
                || started.elapsed() > limit
            {
                return led;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Resident memory of each node, in bytes (Linux).
    pub fn resident_bytes(&self) -> Vec<u64> {
        self.nodes.iter().map(|n| crate::memory::resident_bytes(n.child.id())).collect()
    }

    pub fn stop(&mut self) {
        for node in &mut self.nodes {
            unsafe {
                libc::kill(node.child.id() as i32, libc::SIGTERM);
            }
        }
        for node in &mut self.nodes {
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                match node.child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                    _ => {
                        let _ = node.child.kill();
                        let _ = node.child.wait();
                        break;
                    }
                }
            }
        }
    }

    /// Copies the nodes' logs out of the cluster's temporary directory into
    /// `$TMPDIR/drover-bench-logs-<unix seconds>`, so that they outlive it;
    /// that directory, or None when the logs are not temporary (`--local-dir`).
    pub fn keep_temporary_logs(&self) -> anyhow::Result<Option<PathBuf>> {
        if self._temp.is_none() {
            return Ok(None);
        }
        let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let dir = std::env::temp_dir().join(format!("drover-bench-logs-{}", stamp.as_secs()));
        copy_logs(self.nodes.iter().map(|node| node.log.as_path()), &dir)?;
        Ok(Some(dir))
    }
}

/// Copies each of `logs` into `dir` under its own file name.
fn copy_logs<'a>(logs: impl Iterator<Item = &'a Path>, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    logs.map(|log| {
        let name = log.file_name().with_context(|| format!("{} names no file", log.display()))?;
        let copy = dir.join(name);
        std::fs::copy(log, &copy).with_context(|| format!("copying {} to {}", log.display(), copy.display()))?;
        Ok(copy)
    })
    .collect()
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.child.kill();
            let _ = node.child.wait();
        }
    }
}

/// `drover serve ARGS`, its log to `log`, its stdout piped; this binary, or
/// the one [`super::conditions::node_binary`] names.
fn spawn(args: &[String], log: &Path, append: bool) -> anyhow::Result<Child> {
    let exe = match super::conditions::node_binary() {
        Some(path) => path,
        None => std::env::current_exe().context("finding the drover binary")?,
    };
    let log = std::fs::OpenOptions::new().create(true).append(append).write(true).truncate(!append).open(log)?;
    Command::new(exe).args(args).stdout(Stdio::piped()).stderr(log).spawn().context("starting drover serve")
}

/// Waits for a node's first line (it has started), then keeps draining its
/// stdout so it never blocks on a full pipe.
fn await_started(node: &mut LocalNodeProcess) -> anyhow::Result<()> {
    let stdout = node.child.stdout.take().expect("piped");
    let mut lines = BufReader::new(stdout).lines();
    match lines.next() {
        Some(Ok(line)) if line.contains("started") => {}
        other => {
            let why = match other {
                None => "it exited".to_string(),
                Some(Ok(line)) => format!("it printed {line:?}"),
                Some(Err(e)) => format!("its output could not be read: {e}"),
            };
            let log = std::fs::read_to_string(&node.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(10).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            bail!(
                "node {} did not start ({why}); the end of {}:\n{}",
                node.node_id,
                node.log.display(),
                tail.join("\n")
            )
        }
    }
    std::thread::spawn(move || for _ in lines.map_while(Result::ok) {});
    Ok(())
}

/// A minimal HTTP GET against an admin port.
pub async fn admin_get(addr: &str, path: &str, token: Option<&str>) -> std::io::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{authorization}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let code = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((code, body))
}

/// Starts every node once, on newly chosen ports; on a failure stops the
/// ones started.
fn launch(
    base: &Path,
    nodes: usize,
    partitions: u32,
    replication_factor: u32,
    extra_args: &[String],
    topology: &Topology,
) -> Result<Vec<LocalNodeProcess>, StartFailure> {
    let fail = |error: anyhow::Error| StartFailure { error, port_taken: false };
    let chosen = free_ports(nodes * 4).map_err(fail)?;
    let ports: Vec<(u16, u16, u16)> = chosen.chunks(4).map(|p| (p[0], p[1], p[2])).collect();
    let ojs_ports: Vec<u16> = chosen.chunks(4).map(|p| p[3]).collect();
    let members = |from: usize| -> String {
        let entries: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(to, (_, cluster, _))| {
                let addr = (topology.dial)(from, to, *cluster);
                match topology.locations.get(to) {
                    Some(at) => format!("{to}={addr}@{at}"),
                    None => format!("{to}={addr}"),
                }
            })
            .collect();
        entries.join(",")
    };
    let mut started = Vec::new();
    for (id, (grpc, cluster, admin)) in ports.iter().enumerate() {
        let data_dir = base.join(format!("node-{id}"));
        let mut args: Vec<String> = vec!["serve".into(), "--node-id".into(), id.to_string(), "--data-dir".into()];
        args.push(data_dir.display().to_string());
        for (flag, value) in [
            ("--grpc-addr", format!("127.0.0.1:{grpc}")),
            ("--cluster-addr", format!("127.0.0.1:{cluster}")),
            ("--admin-addr", format!("127.0.0.1:{admin}")),
            ("--ojs-addr", format!("127.0.0.1:{}", ojs_ports[id])),
            ("--members", members(id)),
            ("--partitions", partitions.to_string()),
            ("--replication-factor", replication_factor.to_string()),
        ] {
            args.extend([flag.to_string(), value]);
        }
        args.extend(extra_args.iter().cloned());
        let log = base.join(format!("node-{id}.log"));
        started.push(LocalNodeProcess {
            node_id: id as u64,
            child: match spawn(&args, &log, false) {
                Ok(child) => child,
                Err(error) => {
                    stop_all(&mut started);
                    return Err(fail(error));
                }
            },
            grpc: format!("127.0.0.1:{grpc}"),
            cluster: format!("127.0.0.1:{cluster}"),
            admin: format!("127.0.0.1:{admin}"),
            ojs: format!("127.0.0.1:{}", ojs_ports[id]),
            data_dir,
            args,
            log,
        });
    }
    for index in 0..started.len() {
        if let Err(error) = await_started(&mut started[index]) {
            stop_all(&mut started);
            let log = std::fs::read_to_string(&started[index].log).unwrap_or_default();
            let port_taken = log.contains("Address already in use");
            return Err(StartFailure { error, port_taken });
        }
    }
    Ok(started)
}

fn stop_all(started: &mut [LocalNodeProcess]) {
    for node in started {
        let _ = node.child.kill();
        let _ = node.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_logs_are_copies_that_outlive_their_directory() {
        let nodes = tempfile::tempdir().unwrap();
        let logs: Vec<PathBuf> = (0..2).map(|i| nodes.path().join(format!("node-{i}.log"))).collect();
        for (i, log) in logs.iter().enumerate() {
            std::fs::write(log, format!("node {i} voted\n")).unwrap();
        }
        let kept = tempfile::tempdir().unwrap();
        let dir = kept.path().join("drover-bench-logs");
        let copies = copy_logs(logs.iter().map(PathBuf::as_path), &dir).unwrap();
        drop(nodes);
        assert_eq!(copies, vec![dir.join("node-0.log"), dir.join("node-1.log")]);
        assert_eq!(std::fs::read_to_string(&copies[1]).unwrap(), "node 1 voted\n");
    }
}
