//! Delay and jitter on node-to-node links, without netem: every node dials its
//! peers through a small TCP proxy that runs in the node's own namespace.
//!
//! Node i's proxy listens on `127.0.0.1:(40000 + j)` for every node j and
//! forwards to node j's real cluster address; every node is given the member
//! list `j=127.0.0.1:(40000 + j)` and still binds its cluster address on its
//! own IP. The proxy dials from the node's own IP, so the nftables rules of
//! the partition and loss faults (which match source addresses at the
//! receiver) apply to the proxied connections as they did to direct ones.
//!
//! The proxy holds each chunk of bytes it reads for the link's base delay plus
//! a random jitter, never releasing a chunk before the one read ahead of it,
//! so bytes keep their order. It reads its settings from `proxy-<i>.json` in
//! the run directory every 50 ms (a missing file means no delay), and exits
//! when the process that started it dies. The proxies run for the whole run,
//! with no delay outside delay faults, so every run goes through them.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// Node i's proxy for node j listens on `127.0.0.1:(BASE_PORT + j)`.
pub const BASE_PORT: u16 = 40_000;
/// How long the proxy waits for a connection to the real address.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const POLL_EVERY: Duration = Duration::from_millis(50);

/// The address node j has in every node's member list.
pub fn member_addr(j: usize) -> String {
    format!("127.0.0.1:{}", BASE_PORT as usize + j)
}

/// One proxy's settings, the contents of `proxy-<i>.json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settings {
    /// Node j -> milliseconds added to the bytes this node sends to j.
    #[serde(default)]
    pub delay_ms: BTreeMap<usize, u64>,
    /// Node j -> milliseconds added to the bytes j sends back on this node's
    /// connections.
    #[serde(default)]
    pub reply_delay_ms: BTreeMap<usize, u64>,
    /// Up to this many milliseconds more, at random, on every delayed chunk.
    #[serde(default)]
    pub jitter_ms: u64,
}

/// Directed link delays: `(a, b) -> ms` delays the bytes a sends to b.
pub type Delays = BTreeMap<(usize, usize), u64>;

/// Every proxy's settings for the given link delays. A node's bytes to a peer
/// go through its own proxy on connections it opened, and through the peer's
/// proxy (as replies) on connections the peer opened.
pub fn settings(n: usize, delays: &Delays, jitter_ms: u64) -> Vec<Settings> {
    let mut all: Vec<Settings> = (0..n).map(|_| Settings { jitter_ms, ..Default::default() }).collect();
    for (&(from, to), &ms) in delays {
        if from == to || from >= n || to >= n || ms == 0 {
            continue;
        }
        all[from].delay_ms.insert(to, ms);
        all[to].reply_delay_ms.insert(from, ms);
    }
    all
}

fn control_file(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("proxy-{i}.json"))
}

/// The proxies of a run, started and steered by the inner process.
pub struct Proxies {
    dir: PathBuf,
    children: Vec<Option<Child>>,
    /// Delays every link keeps for the whole run (links between regions),
    /// and their jitter; faults add to them.
    base: Delays,
    base_jitter_ms: u64,
}

impl Proxies {
    /// Starts one proxy in every node namespace and waits until each listens.
    pub fn start(runner: &Path, dir: &Path, namespaces: &[String], ips: &[String]) -> anyhow::Result<Proxies> {
        use std::io::BufRead;
        let mut proxies =
            Proxies { dir: dir.to_path_buf(), children: Vec::new(), base: Delays::new(), base_jitter_ms: 0 };
        for i in 0..namespaces.len() {
            let _ = std::fs::remove_file(control_file(dir, i));
        }
        let targets: Vec<String> = ips.iter().enumerate().map(|(j, ip)| format!("{j}={ip}:26502")).collect();
        for (i, ns) in namespaces.iter().enumerate() {
            let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join(format!("proxy-{i}.log")))?;
            let mut command = Command::new("ip");
            // Dies with this process, even before it could say so itself.
            unsafe {
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
                    Ok(())
                });
            }
            let mut child = command
                .args(["netns", "exec", ns])
                .arg(runner)
                .arg("proxy")
                .args(["--node", &i.to_string()])
                .args(["--targets", &targets.join(",")])
                .arg("--control")
                .arg(control_file(dir, i))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(log)
                .spawn()
                .context("starting a proxy")?;
            let mut line = String::new();
            let stdout = child.stdout.take().expect("piped");
            std::io::BufReader::new(stdout).read_line(&mut line)?;
            proxies.children.push(Some(child));
            if line.trim() != "ready" {
                anyhow::bail!("the proxy of node {i} did not start; see proxy-{i}.log");
            }
        }
        Ok(proxies)
    }

    /// Delays the links as given (every other link gets no delay).
    pub fn delay(&self, delays: &Delays, jitter_ms: u64) -> anyhow::Result<()> {
        let mut total = self.base.clone();
        for (link, ms) in delays {
            *total.entry(*link).or_default() += ms;
        }
        self.write(&total, jitter_ms.max(self.base_jitter_ms))
    }

    /// Delays `base` keeps on its links for the whole run.
    pub fn set_base(&mut self, base: Delays, jitter_ms: u64) -> anyhow::Result<()> {
        self.base = base;
        self.base_jitter_ms = jitter_ms;
        self.clear();
        Ok(())
    }

    fn write(&self, delays: &Delays, jitter_ms: u64) -> anyhow::Result<()> {
        for (i, settings) in settings(self.children.len(), delays, jitter_ms).iter().enumerate() {
            let path = control_file(&self.dir, i);
            let tmp = path.with_extension("json.tmp");
            std::fs::write(&tmp, serde_json::to_string(settings)?)?;
            std::fs::rename(&tmp, &path)?;
        }
        Ok(())
    }

    /// Removes every delay but the base ones.
    pub fn clear(&self) {
        if !self.base.is_empty() {
            let _ = self.write(&self.base, self.base_jitter_ms);
            return;
        }
        for i in 0..self.children.len() {
            let _ = std::fs::remove_file(control_file(&self.dir, i));
        }
    }

    pub fn stop(&mut self) {
        for child in self.children.iter_mut() {
            if let Some(mut child) = child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl Drop for Proxies {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The `proxy` subcommand: runs in node `node`'s namespace until its parent dies.
pub fn serve(node: usize, targets: &[String], control: &Path) -> anyhow::Result<()> {
    // The parent-death signal set when it was started ends it with the run;
    // watching the parent id as well covers a parent that died before that.
    let parent = unsafe { libc::getppid() };
    if parent == 1 {
        return Ok(());
    }
    let targets: Vec<(usize, String)> = targets
        .iter()
        .map(|t| {
            let (j, addr) = t.split_once('=').context("a target is j=host:port")?;
            Ok((j.parse()?, addr.to_string()))
        })
        .collect::<anyhow::Result<_>>()?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async move {
        let (tx, rx) = watch::channel(Settings::default());
        for (j, target) in targets {
            let port = BASE_PORT + u16::try_from(j)?;
            let listener = TcpListener::bind(("127.0.0.1", port))
                .await
                .with_context(|| format!("node {node}: binding 127.0.0.1:{port}"))?;
            tokio::spawn(accept(listener, j, target, rx.clone()));
        }
        println!("ready");
        let mut current = Settings::default();
        loop {
            tokio::time::sleep(POLL_EVERY).await;
            if unsafe { libc::getppid() } != parent {
                return Ok(());
            }
            let settings = match std::fs::read_to_string(control) {
                Ok(text) => match serde_json::from_str(&text) {
                    Ok(settings) => settings,
                    Err(e) => {
                        eprintln!("proxy {node}: ignoring {}: {e}", control.display());
                        continue;
                    }
                },
                Err(_) => Settings::default(),
            };
            if settings != current {
                eprintln!("proxy {node}: {}", serde_json::to_string(&settings)?);
                current = settings.clone();
                let _ = tx.send(settings);
            }
        }
    })
}

async fn accept(listener: TcpListener, to: usize, target: String, settings: watch::Receiver<Settings>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        tokio::spawn(relay(stream, to, target.clone(), settings.clone()));
    }
}

/// Forwards one connection to `target` (node `to`), both ways, delayed.
async fn relay(downstream: TcpStream, to: usize, target: String, settings: watch::Receiver<Settings>) {
    let Ok(Ok(upstream)) = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&target)).await else {
        return; // dropping the accepted connection closes it: the node sees the failure
    };
    let _ = downstream.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (down_read, down_write) = downstream.into_split();
    let (up_read, up_write) = upstream.into_split();
    let out = pump(down_read, up_write, settings.clone(), move |s| s.delay_ms.get(&to).copied().unwrap_or(0));
    let back = pump(up_read, down_write, settings, move |s| s.reply_delay_ms.get(&to).copied().unwrap_or(0));
    // An error either way ends both; an end of stream is passed on and the
    // other direction continues.
    let _ = tokio::try_join!(out, back);
}

/// Copies `from` to `to`, holding every chunk for its delay, in order.
pub async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    settings: watch::Receiver<Settings>,
    base_of: impl Fn(&Settings) -> u64,
) -> std::io::Result<()> {
    // A chunk and when to write it; `None` is the end of the stream.
    let (tx, mut rx) = mpsc::channel::<(Instant, Option<Vec<u8>>)>(256);
    let reader = async move {
        let mut buffer = vec![0u8; 64 * 1024];
        let mut last = Instant::now();
        loop {
            let n = from.read(&mut buffer).await?;
            let (base, jitter) = {
                let settings = settings.borrow();
                (base_of(&settings), settings.jitter_ms)
            };
            let at = release_at(Instant::now(), base, jitter, last, &mut rand::rng());
            last = at;
            let chunk = (n > 0).then(|| buffer[..n].to_vec());
            if tx.send((at, chunk)).await.is_err() || n == 0 {
                return Ok::<(), std::io::Error>(());
            }
        }
    };
    let writer = async move {
        while let Some((at, chunk)) = rx.recv().await {
            if at > Instant::now() {
                tokio::time::sleep_until(at).await;
            }
            match chunk {
                Some(bytes) => to.write_all(&bytes).await?,
                None => {
                    to.shutdown().await?;
                    break;
                }
            }
        }
        Ok::<(), std::io::Error>(())
    };
    tokio::try_join!(reader, writer).map(|_| ())
}

/// When a chunk read at `now` may be written: after its base delay and a
/// random jitter (none on a link without delay), and never before the chunk
/// read ahead of it (`last`).
fn release_at(now: Instant, base_ms: u64, jitter_ms: u64, last: Instant, rng: &mut impl Rng) -> Instant {
    let extra = if base_ms == 0 { 0 } else { base_ms + rng.random_range(0..=jitter_ms) };
    (now + Duration::from_millis(extra)).max(last)
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    use super::*;

    #[test]
    fn settings_put_each_link_on_both_proxies() {
        // Node 1 slow to send to everyone.
        let delays: Delays = [((1, 0), 100), ((1, 2), 100)].into();
        let all = settings(3, &delays, 20);
        assert_eq!(all[1].delay_ms, BTreeMap::from([(0, 100), (2, 100)]));
        assert!(all[1].reply_delay_ms.is_empty());
        assert_eq!(all[0].reply_delay_ms, BTreeMap::from([(1, 100)]));
        assert_eq!(all[2].reply_delay_ms, BTreeMap::from([(1, 100)]));
        assert!(all[0].delay_ms.is_empty() && all[2].delay_ms.is_empty());
        assert!(all.iter().all(|s| s.jitter_ms == 20));
        // The file format: a missing field is no delay.
        let parsed: Settings = serde_json::from_str(r#"{"delay_ms":{"2":50}}"#).unwrap();
        assert_eq!(parsed.delay_ms, BTreeMap::from([(2, 50)]));
        assert_eq!(parsed.jitter_ms, 0);
    }

    #[test]
    fn release_times_never_go_backwards() {
        let mut rng = StdRng::seed_from_u64(7);
        let start = Instant::now();
        let mut last = start;
        for step in 0..1_000u64 {
            let now = start + Duration::from_millis(step);
            let at = release_at(now, 50, 100, last, &mut rng);
            assert!(at >= last);
            assert!(at >= now + Duration::from_millis(50));
            assert!(at <= (now + Duration::from_millis(150)).max(last));
            last = at;
        }
        // No delay: written at once (but still not ahead of earlier chunks).
        assert_eq!(release_at(start, 0, 100, start, &mut rng), start);
    }

    #[tokio::test]
    async fn pump_delays_without_reordering() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (settings_tx, settings) =
            watch::channel(Settings { delay_ms: BTreeMap::from([(1, 40)]), jitter_ms: 30, ..Default::default() });
        // client -> [proxy side a | pump | proxy side b] -> server
        let proxy_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_addr = proxy_listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (down, _) = proxy_listener.accept().await.unwrap();
            let up = TcpStream::connect(addr).await.unwrap();
            let (down_read, _down_write) = down.into_split();
            let (_up_read, up_write) = up.into_split();
            pump(down_read, up_write, settings, |s| s.delay_ms.get(&1).copied().unwrap_or(0)).await.unwrap();
        });
        let mut client = TcpStream::connect(proxy_addr).await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let sent: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        let started = Instant::now();
        for piece in sent.chunks(1_000) {
            client.write_all(piece).await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        client.shutdown().await.unwrap();
        let mut received = Vec::new();
        server.read_to_end(&mut received).await.unwrap();
        assert_eq!(received, sent);
        assert!(started.elapsed() >= Duration::from_millis(40));
        drop(settings_tx);
    }
}
