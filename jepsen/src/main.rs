//! `drover-jepsen`: runs Drover nodes in network namespaces, drives a workload
//! through several gateways, injects faults on a seeded schedule, heals,
//! drains, reads every job from every node and checks the history.
//!
//! Run as root. `drover-jepsen run --nemesis partition --time 60` runs one
//! test; `drover-jepsen suite` runs every nemesis and all of them combined.

mod attacker;
mod availability;
mod checker;
mod cluster;
mod controls;
mod expiry;
mod faketime;
mod faults;
mod history;
mod judge;
mod limits;
mod lossyfs;
mod membership;
mod nemesis;
mod net;
mod partition;
mod proxy;
mod schedules;
mod sessions;
mod suite;
mod timing;
mod workflows;
mod workload;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use nemesis::{Faults, Schedule};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::history::{FinalJob, FinalReads};

#[derive(Parser)]
#[command(name = "drover-jepsen", about = "Fault-injection tests for Drover")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
enum Nemesis {
    Partition,
    Kill,
    Pause,
    Badlinks,
    Restart,
    /// SIGKILLs a session worker process (not a node) and starts another.
    Workers,
    /// SIGTERMs the nodes in turn, each kept down until the heal, as a
    /// rolling upgrade does.
    Rolling,
    /// Steps or skews one node's wall clock (libfaketime), sometimes
    /// restarting it so that it leads with the wrong time.
    Clock,
    /// Stops a node, flips bits in, cuts short or deletes one of its
    /// database files (WAL, SST, MANIFEST), and starts it: a node that
    /// refuses is re-seeded from its peers.
    Corrupt,
    /// Every node's data directory is on a file system that keeps unsynced
    /// writes in memory: SIGKILLs one node, a minority or all of them (a
    /// power failure) and drops what they had not synced.
    Power,
    /// A rolling upgrade: SIGTERMs the nodes in turn, as `rolling` does, and
    /// starts each again on `--drover-next`, so the cluster runs two builds
    /// until every node was replaced. Not in the suite: it needs two builds.
    Upgrade,
    /// Adds, removes and replaces nodes through the cluster plan (spare node
    /// slots are provisioned for the nodes it adds).
    Membership,
}

impl Nemesis {
    const ALL: [Nemesis; 11] = [
        Nemesis::Partition,
        Nemesis::Kill,
        Nemesis::Pause,
        Nemesis::Badlinks,
        Nemesis::Restart,
        Nemesis::Workers,
        Nemesis::Rolling,
        Nemesis::Clock,
        Nemesis::Corrupt,
        Nemesis::Power,
        Nemesis::Membership,
    ];
}

#[derive(clap::Args, Clone, Debug, Serialize, Deserialize)]
struct RunArgs {
    /// Faults to inject (several: each round picks one of them).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "partition")]
    nemesis: Vec<Nemesis>,
    /// Seconds of workload under faults.
    #[arg(long, default_value_t = 30)]
    time: u64,
    /// Longest drain after healing, in seconds.
    #[arg(long, default_value_t = 90)]
    drain: u64,
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    #[arg(long, default_value_t = 3)]
    partitions: u32,
    /// Seed of the fault schedule and the workload (random if not given).
    #[arg(long)]
    seed: Option<u64>,
    /// The drover binary.
    #[arg(long, default_value = "target/release/drover")]
    drover: PathBuf,
    /// The build the `upgrade` nemesis moves each node to.
    #[arg(long)]
    #[serde(default)]
    drover_next: Option<PathBuf>,
    /// Where run directories go.
    #[arg(long, default_value = "jepsen/runs")]
    out: PathBuf,
    /// TLS on every port of every node (a throwaway CA, mutual TLS between
    /// nodes); clients and session workers connect over TLS.
    #[arg(long)]
    #[serde(default)]
    tls: bool,
    /// Bearer tokens on: nodes take a tokens file, and every client, session
    /// worker and admin read sends a token holding jobs:* and cluster:read
    /// for the default tenant only.
    #[arg(long)]
    #[serde(default)]
    tokens: bool,
    /// Test only: nodes acknowledge writes without syncing their WAL. With
    /// the `power` nemesis the checker must find lost jobs.
    #[arg(long)]
    #[serde(default)]
    skip_wal_sync: bool,
    /// Test only: `DROVER_FAILPOINTS` for every node (a planted bug; the
    /// negative controls set it).
    #[arg(long, hide = true)]
    #[serde(default)]
    failpoints: Option<String>,
    /// The negative control this run is (its name; see `controls`).
    #[arg(long, hide = true)]
    #[serde(default)]
    control: Option<String>,
    /// Producers creating jobs, each one create at a time.
    #[arg(long, default_value_t = 3)]
    #[serde(default = "default_producers")]
    producers: u64,
    /// Sets of in-process workers (each: two pollers, two streamers, two
    /// staged workers and one pushed-type streamer per gateway). Each worker
    /// handles one job at a time, and one job in twenty answers 2.5 s late,
    /// so one set completes about 65 jobs a second; long runs use more to
    /// reach their job counts. Session jobs become rarer by the same factor:
    /// their two worker processes do not scale with it.
    #[arg(long, default_value_t = 1)]
    #[serde(default = "default_worker_sets")]
    worker_sets: u64,
    /// Two regions: the first nodes (a majority) in region a, the others in
    /// b, each in its own zone, named in the member list. Links between the
    /// regions are 40 ms slow each way (jitter up to 5 ms) for the whole run,
    /// a delay fault adds to that, and nodes run --network-profile wan.
    #[arg(long)]
    #[serde(default)]
    regions: bool,
}

/// Each node slot's REGION/ZONE with --regions (none without): the members
/// formed with, then spare slots alternately in b and a, each in a zone of
/// its own.
fn locations(args: &RunArgs) -> Vec<String> {
    if !args.regions {
        return Vec::new();
    }
    let in_a = args.nodes / 2 + 1;
    let mut zones = (in_a, args.nodes - in_a);
    (0..slots(args))
        .map(|i| match i {
            _ if i < in_a => format!("a/a{}", i + 1),
            _ if i < args.nodes => format!("b/b{}", i - in_a + 1),
            _ if (i - args.nodes).is_multiple_of(2) => {
                zones.1 += 1;
                format!("b/b{}", zones.1)
            }
            _ => {
                zones.0 += 1;
                format!("a/a{}", zones.0)
            }
        })
        .collect()
}

/// Node slots of a run: its members, and with the membership nemesis spare
/// slots for the nodes it adds (see `membership::slots`).
fn slots(args: &RunArgs) -> usize {
    let mut distinct = args.nemesis.clone();
    distinct.sort_by_key(|n| *n as u8);
    distinct.dedup();
    membership::slots(args.nodes, args.time, distinct.len(), args.nemesis.contains(&Nemesis::Membership))
}

/// Links between regions, both ways, with --regions: (delay, jitter) in ms.
const REGION_DELAY_MS: (u64, u64) = (40, 5);

fn default_producers() -> u64 {
    3
}

fn default_worker_sets() -> u64 {
    1
}

#[derive(clap::Args)]
struct SuiteArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Seconds of the combined runs (default: --time).
    #[arg(long)]
    combined_time: Option<u64>,
    /// Nodes of the combined runs (default: --nodes).
    #[arg(long)]
    combined_nodes: Option<usize>,
    /// Run the combined run as --tls and --tokens say, not with both on.
    #[arg(long)]
    skip_secure: bool,
    /// Keep the nodes' data directories of valid runs too (by default only a
    /// failed run keeps them; its logs, history and report are always kept).
    #[arg(long)]
    keep_data: bool,
    /// Leave out the negative controls (see `controls`).
    #[arg(long)]
    skip_controls: bool,
    /// Seconds of each negative control (default: --time).
    #[arg(long)]
    control_time: Option<u64>,
}

#[derive(Subcommand)]
enum Command {
    /// One test run.
    Run(RunArgs),
    /// Every nemesis alone, then all combined over TLS with tokens (as --tls and
    /// --tokens say with --skip-secure), each for --time seconds, then the
    /// negative controls (unless --skip-controls): each plants one bug,
    /// which the checker must find with its class.
    Suite(SuiteArgs),
    /// The negative controls alone.
    Controls(SuiteArgs),
    /// Internal: the part of a run that executes inside the client namespace.
    #[command(hide = true)]
    Inner { dir: PathBuf },
    /// Checks a finished run again from what it kept, with every check the
    /// run made (only the availability figures are not measured again), as
    /// after a change to the checker: `drover-jepsen recheck RUN_DIR`.
    Recheck { dir: PathBuf },
    /// Internal: one node's delaying proxy to its peers, inside its namespace.
    #[command(hide = true)]
    Proxy {
        #[arg(long)]
        node: usize,
        /// `j=host:port` for every node j.
        #[arg(long, value_delimiter = ',')]
        targets: Vec<String>,
        /// The settings file it polls.
        #[arg(long)]
        control: PathBuf,
    },
    /// Internal: one node's data directory as a file system that loses what
    /// was written but not synced when told to (a power failure).
    #[command(hide = true)]
    Lossyfs {
        /// Where to mount it (the node's data directory).
        #[arg(long)]
        mount: PathBuf,
        /// The Unix socket it takes commands on.
        #[arg(long)]
        control: PathBuf,
    },
}

impl RunArgs {
    /// What the run is, for its directory and summary: the nemeses, then
    /// `tls` and `tokens` (not nemeses, but part of what was run).
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.nemesis.iter().map(|n| format!("{n:?}").to_lowercase()).collect();
        if self.tls {
            names.push("tls".into());
        }
        if self.tokens {
            names.push("tokens".into());
        }
        if self.regions {
            names.push("regions".into());
        }
        if let Some(control) = &self.control {
            names.push(format!("control-{control}"));
        }
        names
    }
}

#[derive(Serialize, Deserialize)]
struct InnerConfig {
    args: RunArgs,
    seed: u64,
    gateways: Vec<String>,
    namespaces: Vec<String>,
    ips: Vec<String>,
    drover: PathBuf,
    #[serde(default)]
    drover_next: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            let (verdict, _) = run(args)?;
            std::process::exit(verdict.code());
        }
        Command::Suite(suite) => {
            let controls = !suite.skip_controls;
            std::process::exit(suite::run(suite, true, controls)?);
        }
        Command::Controls(suite) => std::process::exit(suite::run(suite, false, true)?),
        Command::Inner { dir } => {
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            match runtime.block_on(inner(&dir)) {
                Ok(verdict) => std::process::exit(verdict.code()),
                Err(e) => {
                    // The summary line is read from the report: say there why
                    // the run ended without a verdict.
                    let _ = std::fs::write(dir.join("report.txt"), format!("no verdict: the run failed: {e:#}\n"));
                    Err(e)
                }
            }
        }
        Command::Recheck { dir } => {
            let started = std::time::Instant::now();
            let kept = judge::Kept::load(&dir)?;
            let report = judge::judge(&kept);
            println!("{}\n{}", report.summary(), report.details());
            println!("checked {} operations in {} ms", kept.history.len(), started.elapsed().as_millis());
            std::process::exit(report.verdict().code());
        }
        Command::Proxy { node, targets, control } => proxy::serve(node, &targets, &control),
        Command::Lossyfs { mount, control } => lossyfs::serve(&mount, &control),
    }
}

/// The disk a suite needs free where its runs go: each run's three data
/// directories take about 70 MB each (RocksDB preallocates its WAL), and a
/// full disk fails runs with errors that look like findings.
const SUITE_DISK_BYTES: u64 = 2 << 30;

/// Fails unless the file system holding `dir` has `needed` bytes free.
fn check_free_space(dir: &Path, needed: u64) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    // SAFETY: `path` is a NUL-terminated string and `stat` a plain struct
    // that statvfs fills in.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("statvfs {}", dir.display()));
    }
    let free = stat.f_bavail as u64 * stat.f_frsize as u64;
    if free < needed {
        bail!(
            "{} has {} MB free; the suite needs {} MB for its runs' data (free some space, or pass --out elsewhere)",
            dir.display(),
            free >> 20,
            needed >> 20
        );
    }
    Ok(())
}

/// Removes a finished run's node data directories (and the damaged ones the
/// corrupt nemesis set aside), keeping its logs, history and report.
fn remove_node_data(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let is_node_dir =
            entry.file_name().to_string_lossy().starts_with("node-") && entry.file_type().is_ok_and(|t| t.is_dir());
        if is_node_dir {
            if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                eprintln!("jepsen: could not remove {}: {e}", entry.path().display());
            }
        }
    }
}

/// The signal (SIGTERM or SIGINT) that asked this process to stop; 0 until one did.
static STOP_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_stop_signal(signal: libc::c_int) {
    STOP_SIGNAL.store(signal, Ordering::SeqCst);
}

fn stop_signal() -> i32 {
    STOP_SIGNAL.load(Ordering::SeqCst)
}

/// From now on SIGTERM and SIGINT ask the run to stop (it then ends its
/// inner part and removes its network) instead of ending the process.
fn catch_stop_signals() {
    let handler = on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGINT, handler);
    }
}

/// The longest a run may take, start to verdict: its faults (a run with
/// several nemeses goes on until each was drawn once, up to
/// `EVERY_NEMESIS_GRACE` past --time), its drain (with the membership
/// nemesis twice: the plan settles first), the reads after it
/// (`after_drain`), and starting and stopping nodes.
fn run_bound(args: &RunArgs) -> Duration {
    let faults = args.time + EVERY_NEMESIS_GRACE.as_secs() + 10;
    let drain = args.drain * if args.nemesis.contains(&Nemesis::Membership) { 2 } else { 1 };
    Duration::from_secs(faults + drain + after_drain(args).as_secs() + 240)
}

/// Unmounts (lazily) every file system mounted under `dir`: a run stopped
/// before its lossy file systems could unmount leaves them behind.
fn unmount_under(dir: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    for mount in mounts.lines().filter_map(|line| line.split_whitespace().nth(1)) {
        if Path::new(mount).starts_with(dir) {
            if let Ok(path) = std::ffi::CString::new(mount) {
                // SAFETY: a NUL-terminated path.
                unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

/// Sets up the namespaces, runs the test inside the client namespace, tears
/// everything down, and prints the one-line summary. Returns the verdict,
/// and the run's directory. A run that does not end within its bound, or
/// is asked to stop by a signal, is stopped: its network is removed either
/// way, and a run out of time is UNKNOWN.
fn run(args: RunArgs) -> anyhow::Result<(checker::Verdict, PathBuf)> {
    catch_stop_signals();
    let seed = args.seed.unwrap_or_else(rand::random);
    if !(3..100).contains(&args.nodes) {
        bail!("--nodes must be between 3 and 99 (partitions and majorities need 3)");
    }
    let drover = std::fs::canonicalize(&args.drover)
        .with_context(|| format!("the drover binary {} (build it first, or pass --drover)", args.drover.display()))?;
    let names = args.names();
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let dir = args.out.join(format!("{stamp}-{}-{seed}", names.join("+")));
    std::fs::create_dir_all(&dir)?;
    let dir = std::fs::canonicalize(&dir)?;
    // The binaries this run uses, linked into the run directory: a rebuild
    // during the run cannot pull them away, and the run can be repeated with them.
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    let drover = keep(&drover, &bin.join("drover"))?;
    let drover_next = match &args.drover_next {
        Some(next) => {
            let next = std::fs::canonicalize(next).with_context(|| format!("the next build {}", next.display()))?;
            Some(keep(&next, &bin.join("drover-next"))?)
        }
        None if args.nemesis.contains(&Nemesis::Upgrade) => bail!("the upgrade nemesis needs --drover-next"),
        None => None,
    };
    let runner = keep(&std::env::current_exe()?, &bin.join("drover-jepsen"))?;
    let prefix = format!("drj{:05}", seed % 100_000);
    // A namespace and an address for every node slot, spare ones too.
    let slots = slots(&args);
    let net = net::Network::create(&prefix, slots).context("creating the test network (run as root)")?;
    let scheme = if args.tls { "https://" } else { "" };
    if args.tls {
        // Peers dial each other through the proxies on 127.0.0.1, clients the nodes' addresses.
        let mut certify = std::process::Command::new(&drover);
        certify.arg("dev-certificates").arg("--out").arg(dir.join("tls"));
        for name in ["127.0.0.1".to_string(), "localhost".into()].into_iter().chain((0..slots).map(|i| net.node_ip(i)))
        {
            certify.args(["--name", &name]);
        }
        let output = certify.output().context("running drover dev-certificates")?;
        if !output.status.success() {
            bail!("drover dev-certificates failed: {}", String::from_utf8_lossy(&output.stderr));
        }
    }
    if args.tokens {
        // One token for the whole workload, as a tokens-file entry.
        let mut tokens_file = mint_token(
            &drover,
            &dir.join("token"),
            &["--name", "jepsen", "--scopes", "jobs:*,cluster:read", "--tenants", "<default>"],
        )?;
        // And the attacker's, for its own tenant only (see `attacker`).
        let attacker = ["--name", attacker::NAME, "--scopes", attacker::SCOPES, "--tenants", attacker::NAME];
        tokens_file.extend(mint_token(&drover, &dir.join("attacker-token"), &attacker)?);
        if args.nemesis.contains(&Nemesis::Membership) {
            // The membership nemesis changes the cluster plan: cluster:admin
            // for every tenant, which no other client holds.
            let admin = ["--name", "jepsen-admin", "--scopes", "cluster:admin", "--tenants", "*"];
            tokens_file.extend(mint_token(&drover, &dir.join("admin-token"), &admin)?);
        }
        std::fs::write(dir.join("tokens.toml"), &tokens_file)?;
        // And job tokens: the session workers report each outcome with theirs.
        let key = std::process::Command::new(&drover)
            .args(["token", "secret", "--name", "job-tokens"])
            .output()
            .context("running drover token secret")?;
        std::fs::write(dir.join("job-token.key"), String::from_utf8(key.stdout)?.trim())?;
    }
    let config = InnerConfig {
        seed,
        gateways: (0..slots).map(|i| format!("{scheme}{}:26500", net.node_ip(i))).collect(),
        namespaces: (0..slots).map(|i| net.node_ns(i)).collect(),
        ips: (0..slots).map(|i| net.node_ip(i)).collect(),
        drover,
        drover_next,
        args: args.clone(),
    };
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config)?)?;
    let spares = if slots > args.nodes { format!(" (and {} spare slots)", slots - args.nodes) } else { String::new() };
    println!(
        "jepsen: nemesis {} for {} s on {} nodes{spares}, seed {seed}, run dir {}",
        names.join("+"),
        args.time,
        args.nodes,
        dir.display()
    );
    let mut inner = std::process::Command::new("ip");
    inner.args(["netns", "exec", &net.client_ns()]).arg(&runner).arg("inner").arg(&dir);
    if args.tls {
        // The workload's clients and the session worker processes trust the run's CA.
        inner.env(drover::client::TLS_CA_ENV, dir.join("tls").join("ca.pem"));
    }
    if args.tokens {
        // The workload's clients and the session worker processes send it.
        inner.env(drover::client::TOKEN_ENV, std::fs::read_to_string(dir.join("token"))?);
    }
    let bound = run_bound(&args);
    let started = Instant::now();
    let mut child = inner.spawn()?;
    let mut stopped_for = None;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if stopped_for.is_none() && (stop_signal() != 0 || started.elapsed() > bound) {
            stopped_for = Some(match stop_signal() {
                0 => format!("the run did not end within its bound of {} s", bound.as_secs()),
                signal => format!("the run was stopped by signal {signal}"),
            });
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let asked = Instant::now();
            while child.try_wait()?.is_none() && asked.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // Its nodes, proxies and file systems die with it (parent-death
    // signals); a file system that could not unmount is unmounted here.
    unmount_under(&dir);
    drop(net);
    if let Some(why) = &stopped_for {
        let _ = std::fs::write(dir.join("report.txt"), format!("UNKNOWN ({why}): no verdict\n"));
    }
    let report = std::fs::read_to_string(dir.join("report.txt")).unwrap_or_else(|_| "no report: the run failed".into());
    let mut lines = report.trim().lines();
    println!("jepsen: {} | seed {seed} | {}", names.join("+"), lines.next().unwrap_or_default());
    for line in lines {
        println!("jepsen:   {line}");
    }
    match (stopped_for, status.code().and_then(checker::Verdict::from_code)) {
        (Some(why), _) if stop_signal() != 0 => bail!("{why}; see {}", dir.display()),
        (Some(_), _) => Ok((checker::Verdict::Unknown, dir)),
        (None, Some(verdict)) => Ok((verdict, dir)),
        (None, None) => bail!("the run failed ({status}); see {}", dir.display()),
    }
}

/// Hard-links (or copies) `from` to `to` and returns `to`.
fn keep(from: &Path, to: &Path) -> anyhow::Result<PathBuf> {
    let _ = std::fs::remove_file(to);
    if std::fs::hard_link(from, to).is_err() {
        std::fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    }
    Ok(to.to_path_buf())
}

fn append_line(path: &Path, value: &impl Serialize) {
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
        let _ = writeln!(file, "{}", serde_json::to_string(value).unwrap_or_default());
    }
}

/// How long the reads after the drain may take in all (workflows, the
/// limited queue, schedules): half the drain, between 20 s and a minute,
/// so a run ends in time whatever the cluster does. A healthy cluster
/// answers them in seconds.
fn after_drain(args: &RunArgs) -> Duration {
    Duration::from_secs((args.drain / 2).clamp(20, 60))
}
/// How far past --time a run with several nemeses goes on until each was
/// drawn once.
const EVERY_NEMESIS_GRACE: Duration = Duration::from_secs(150);

/// Ends the process when it is asked to stop, saying so in the report: its
/// nodes, proxies and file systems die with it, and the run outside removes
/// the network.
fn stop_on_signals(dir: &Path) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut int) = (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?);
    let report = dir.join("report.txt");
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        let _ = std::fs::write(&report, format!("UNKNOWN (the run was stopped by {name}): no verdict\n"));
        std::process::exit(checker::Verdict::Unknown.code());
    });
    Ok(())
}

async fn inner(dir: &Path) -> anyhow::Result<checker::Verdict> {
    stop_on_signals(dir)?;
    let config: InnerConfig = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let args = &config.args;
    let mut rng = StdRng::seed_from_u64(config.seed);
    let network = net::Network::attach(&config.namespaces, &config.ips);
    let mut proxies = proxy::Proxies::start(&std::env::current_exe()?, dir, &config.namespaces, &config.ips)?;
    let locations = locations(args);
    let slots = config.ips.len();
    if args.regions {
        let region = |i: usize| locations[i].split('/').next().unwrap_or_default().to_string();
        let base: proxy::Delays = (0..slots)
            .flat_map(|a| (0..slots).map(move |b| (a, b)))
            .filter(|(a, b)| region(*a) != region(*b))
            .map(|link| (link, REGION_DELAY_MS.0))
            .collect();
        proxies.set_base(base, REGION_DELAY_MS.1)?;
    }
    let mut nodes =
        cluster::Nodes::from_parts(&config.drover, dir, (&config.namespaces, &config.ips), args.nodes, args.partitions);
    nodes.next = config.drover_next.clone();
    nodes.locations = locations.clone();
    if args.tls {
        let certificates = dir.join("tls");
        let ca = std::fs::read(certificates.join("ca.pem")).context("reading the run's CA")?;
        nodes.tls = Some((certificates, ca));
    }
    if args.tokens {
        nodes.token = Some(std::fs::read_to_string(dir.join("token")).context("reading the run's token")?);
    }
    nodes.clocks = args.nemesis.contains(&Nemesis::Clock);
    nodes.skip_wal_sync = args.skip_wal_sync;
    nodes.failpoints = args.failpoints.clone();
    let disks = if args.nemesis.contains(&Nemesis::Power) {
        let mounts: Vec<PathBuf> = (0..slots).map(|i| nodes.data_dir(i)).collect();
        Some(cluster::LossyDisks::mount(&std::env::current_exe()?, dir, &mounts).await?)
    } else {
        None
    };
    for i in 0..args.nodes {
        nodes.start(i)?;
    }
    nodes.wait_ready(Duration::from_secs(60)).await?;
    // The cron workload's schedules tick from before the first fault.
    schedules::register(&nodes.live_gateways(&config.gateways), args.partitions).await?;
    limits::set(&nodes.live_gateways(&config.gateways)).await?;

    let shared = Arc::new(workload::Shared {
        recorder: workload::Recorder::new(),
        gateways: config.gateways.clone(),
        live: Arc::clone(&nodes.live),
        next_id: AtomicU64::new(1),
        stop_creating: AtomicBool::new(false),
        draining: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        backlog: Default::default(),
        worker_sets: args.worker_sets.max(1),
        leaks: Default::default(),
        ojs: config.ips.iter().map(|ip| format!("{ip}:{}", cluster::OJS_PORT)).collect(),
        ca: nodes.tls.as_ref().map(|(_, ca)| ca.clone()),
    });
    // With tokens, a second tenant attacks the first (see `attacker`).
    let attacker = match args.tokens {
        true => {
            let token = std::fs::read_to_string(dir.join("attacker-token")).context("reading the attacker's token")?;
            let admins = (0..slots).map(|i| nodes.admin(i)).collect();
            let ca = nodes.tls.as_ref().map(|(_, ca)| ca.clone());
            Some(Arc::new(attacker::Attacker::new(token.trim(), &config.gateways, admins, ca)?))
        }
        false => None,
    };
    let mut tasks = Vec::new();
    // Workflows: one producer, two workers (see `workflows`).
    let acknowledged = Arc::new(workflows::Acknowledged::default());
    tasks.push(tokio::spawn(workflows::producer(Arc::clone(&shared), Arc::clone(&acknowledged))));
    // Their process numbers are apart from the workload's.
    for home in 0..2 {
        tasks.push(tokio::spawn(workflows::worker(Arc::clone(&shared), 90_000 + home as u64, home)));
    }
    // A limited queue: one producer, three workers (see `limits`).
    let limited = Arc::new(limits::Acknowledged::default());
    tasks.push(tokio::spawn(limits::producer(Arc::clone(&shared), Arc::clone(&limited))));
    for home in 0..3 {
        tasks.push(tokio::spawn(limits::worker(Arc::clone(&shared), 91_000 + home as u64, home)));
    }
    let producers = args.producers.max(1);
    for p in 0..producers {
        tasks.push(tokio::spawn(workload::producer(Arc::clone(&shared), p, config.seed ^ (p + 1))));
    }
    // (Not a zip with `repeat(attacker.iter()).flatten()`: without an
    // attacker that iterator never yields, and never ends.)
    if let Some(attacker) = &attacker {
        for task in 0..attacker::TASKS {
            let seed = config.seed ^ (0xa77a_c4e5 + task);
            tasks.push(tokio::spawn(attacker::attack(Arc::clone(&shared), Arc::clone(attacker), seed)));
        }
    }
    // Workers' process numbers follow the producers', one per worker task.
    let mut next_process = producers..;
    for _ in 0..args.worker_sets.max(1) {
        for _ in 0..2 {
            let p = next_process.next().unwrap();
            tasks.push(tokio::spawn(workload::poller(Arc::clone(&shared), p, config.seed ^ (p + 1))));
        }
        for _ in 0..2 {
            let p = next_process.next().unwrap();
            let any = workload::Gateways::Any;
            let worker = workload::streamer(Arc::clone(&shared), p, config.seed ^ (p + 1), workload::JOB_TYPE, any);
            tasks.push(tokio::spawn(worker));
        }
        for _ in 0..2 {
            let p = next_process.next().unwrap();
            tasks.push(tokio::spawn(workload::staged(Arc::clone(&shared), p, config.seed ^ (p + 1))));
        }
        // Part of the polled type's work goes through the OJS port.
        let p = next_process.next().unwrap();
        tasks.push(tokio::spawn(workload::ojs_poller(Arc::clone(&shared), p, config.seed ^ (p + 1))));
        // One stream-only worker per gateway, always on that gateway (a
        // spare slot's waits until its node is a member).
        for node in 0..slots {
            let p = next_process.next().unwrap();
            let home = workload::Gateways::Home(node);
            let worker = workload::streamer(Arc::clone(&shared), p, config.seed ^ (p + 1), workload::PUSHED_TYPE, home);
            tasks.push(tokio::spawn(worker));
        }
    }

    // Session workers: real processes, killed by the `workers` nemesis.
    let mut session_workers = sessions::Workers::new(&config.drover, dir, &nodes.live_gateways(&config.gateways));
    for _ in 0..sessions::WORKERS {
        session_workers.start()?;
    }
    // When each fault that stopped a node began, for the availability figures.
    let mut stops: Vec<availability::Stop> = Vec::new();

    // The fault schedule.
    let timeline = dir.join("nemesis.jsonl");
    let started = Instant::now();
    let end = started + Duration::from_secs(args.time);
    let mut schedule = Schedule::new(&args.nemesis);
    let membership = args.nemesis.contains(&Nemesis::Membership);
    let admin_token = std::fs::read_to_string(dir.join("admin-token")).ok().map(|t| t.trim().to_string());
    let mut faults = Faults {
        network: &network,
        proxies: &proxies,
        nodes: &mut nodes,
        workers: &mut session_workers,
        disks: disks.as_ref(),
        gateways: &config.gateways,
        membership,
        admin_token,
        reserve: usize::from(membership && args.nemesis.contains(&Nemesis::Corrupt)),
        notes: Vec::new(),
    };
    // Membership events between faults (nodes the plan retired, stopped).
    let note = |faults: &mut Faults, shared: &workload::Shared| {
        for note in faults.notes.drain(..) {
            let mut event = serde_json::json!({ "time_ms": shared.recorder.now_ms(), "event": "membership" });
            if let (Some(event), serde_json::Value::Object(note)) = (event.as_object_mut(), note) {
                event.extend(note);
            }
            append_line(&timeline, &event);
        }
    };
    // Faults from the start to the end: a round is a calm of 1-2 s, then a
    // fault held 2-5 s (a pause 3-5 s, longer than an election and the
    // activation timeout), whole even when it runs past --time. A run of
    // several nemeses goes on until each was drawn once (up to a grace).
    let mut drawn: std::collections::BTreeSet<u8> = std::collections::BTreeSet::new();
    let distinct = {
        let mut distinct: Vec<u8> = args.nemesis.iter().map(|n| *n as u8).collect();
        distinct.sort_unstable();
        distinct.dedup();
        distinct.len()
    };
    loop {
        let now = Instant::now();
        let every_drawn = drawn.len() >= distinct;
        if now >= end && (every_drawn || now >= end + EVERY_NEMESIS_GRACE) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..2_000))).await;
        let nemesis = schedule.nemeses.next(&mut rng);
        drawn.insert(nemesis as u8);
        let began = shared.recorder.now_ms();
        let fault = faults.inject(nemesis, &mut schedule, &mut rng).await?;
        note(&mut faults, &shared);
        let t = shared.recorder.now_ms();
        if fault.stops_nodes {
            let kind = format!("{nemesis:?}/{}", fault.kind).to_lowercase();
            stops.push((began, kind, fault.description.clone()));
        }
        append_line(
            &timeline,
            &serde_json::json!({
                "time_ms": t, "event": "start", "nemesis": nemesis, "kind": fault.kind,
                "fault": fault.description, "detail": fault.detail,
            }),
        );
        // Pauses outlast the longest wait before an election (2.4 s by default) and
        // the workload's 2 s activation timeout.
        let shortest = if nemesis == Nemesis::Pause { 3_000 } else { 2_000 };
        tokio::time::sleep(Duration::from_millis(rng.random_range(shortest..5_000))).await;
        faults.heal().await?;
        note(&mut faults, &shared);
        append_line(&timeline, &serde_json::json!({ "time_ms": shared.recorder.now_ms(), "event": "heal" }));
    }

    // Heal everything, stop creating, and drain with well-behaved workers.
    faults.heal().await?;
    note(&mut faults, &shared);
    shared.stop_creating.store(true, Ordering::Relaxed);
    shared.draining.store(true, Ordering::Relaxed);
    append_line(&timeline, &serde_json::json!({ "time_ms": shared.recorder.now_ms(), "event": "drain" }));
    let drain_end = Instant::now() + Duration::from_secs(args.drain);
    let drain_start = Instant::now();
    // The members change no more: changes whose outcome is unknown are made,
    // moves finish, and nodes that left stop.
    let mut settled_plan = None;
    if membership {
        let (settled, plan) = faults.settle(&mut schedule, &mut rng, Duration::from_secs(args.drain)).await?;
        settled_plan = plan;
        note(&mut faults, &shared);
        let mut event = serde_json::json!({ "time_ms": shared.recorder.now_ms(), "event": "settled" });
        if let (Some(event), serde_json::Value::Object(settled)) = (event.as_object_mut(), settled) {
            event.extend(settled);
        }
        append_line(&timeline, &event);
    }
    if let Err(e) = nodes.wait_ready(Duration::from_secs(60)).await {
        // The drain reads what it can: a node that never answers is an
        // unread replica (UNKNOWN), a job none holds is lost.
        let event = serde_json::json!({
            "time_ms": shared.recorder.now_ms(), "event": "not ready", "why": format!("{e:#}"),
        });
        append_line(&timeline, &event);
    }
    // Where each partition's replicas are: as the cluster formed, or as the
    // plan has them now that the members changed.
    let mut placement = match settled_plan {
        Some(plan) => plan.current,
        None => placement_of(args.nodes, args.partitions, &locations),
    };
    let gateways = || nodes.live_gateways(&config.gateways);
    let mut finals;
    // Reading every job from every replica is heavy on long runs (tens of
    // thousands of jobs each): it happens once clients have heard every
    // acknowledged job completed, every `full_read_every` besides (jobs whose
    // completion was lost, incidents), and at the deadline.
    // A third of the run's length, between 5 and 30 s: cheap on short runs.
    let full_read_every = Duration::from_secs((args.time / 3).clamp(5, 30));
    let mut last_full_read = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let history = shared.recorder.take();
        let due = checker::unfinished(&history) == 0
            || last_full_read.elapsed() >= full_read_every
            || Instant::now() > drain_end;
        if !due {
            continue;
        }
        last_full_read = Instant::now();
        if membership {
            match membership::read_plan(&gateways(), Duration::from_secs(20)).await {
                Ok(plan) => placement = plan.current,
                Err(e) => eprintln!("jepsen: reading the cluster plan for the replicas: {e:#}"),
            }
        }
        finals = final_reads(&nodes, nodes.token.as_deref()).await;
        let history = shared.recorder.take();
        let report = checker::check(&history, &finals, replicas_in(&placement));
        // (A completion rolled back is not waited for: the leader that
        // acknowledged it had applied it, so no lagging replica explains it.)
        let settled = report.lost.is_empty() && report.divergent.is_empty() && report.unread_replicas.is_empty();
        if settled || Instant::now() > drain_end {
            let event = serde_json::json!({
                "time_ms": shared.recorder.now_ms(), "event": "drained", "settled": settled,
                "drain_ms": drain_start.elapsed().as_millis() as u64,
            });
            append_line(&timeline, &event);
            break;
        }
    }
    // The workflows end (their workers still run), then every replica's
    // steps are read; any still running is read again, and the replicas
    // after it: an end a replica showed, a later read of its workflow
    // shows, and a job a workflow names, a later read of the replicas. The
    // reads after the drain take at most `after_drain` in all, each two
    // fifths of it at most.
    let budget = after_drain(args);
    let after_drain = Instant::now() + budget;
    let part = budget * 2 / 5;
    let left = || after_drain.saturating_duration_since(Instant::now());
    let ids = acknowledged.ids();
    let mut workflow_reads = workflows::finish(&gateways(), &ids, left().min(part)).await;
    let steps_before = step_reads(&nodes, nodes.token.as_deref()).await;
    let running: Vec<String> = workflow_reads.iter().filter(|w| w.state == "running").map(|w| w.id.clone()).collect();
    let steps_after = if running.is_empty() {
        steps_before.clone()
    } else {
        let again = workflows::finish(&gateways(), &running, left().min(Duration::from_secs(5))).await;
        for read in again {
            if let Some(first) = workflow_reads.iter_mut().find(|w| w.id == read.id) {
                *first = read;
            }
        }
        step_reads(&nodes, nodes.token.as_deref()).await
    };
    // The limited queue's jobs run out; their histories are read.
    let limited_reads = limits::finish(&gateways(), &limited.keys(), left().min(part)).await;
    // The schedules stop where they are; every replica's ticks are read.
    let schedule_reads = schedules::finish(&gateways(), args.partitions, left().max(Duration::from_secs(5))).await;
    let ticks = tick_reads(&nodes, nodes.token.as_deref()).await;
    shared.stop.store(true, Ordering::Relaxed);
    session_workers.stop_all();
    // Every task ends soon after `stop`; one stuck in a call is left.
    let joined = futures::future::join_all(tasks.iter_mut());
    if tokio::time::timeout(Duration::from_secs(10), joined).await.is_err() {
        tasks.iter().for_each(tokio::task::JoinHandle::abort);
    }
    let history = shared.recorder.take();
    let attacks = match &attacker {
        Some(attacker) => Some((attacker.attempts(), final_reads(&nodes, Some(&attacker.token)).await)),
        None => None,
    };
    let kept = judge::Kept {
        args: args.clone(),
        history,
        finals,
        placement,
        timeline: std::fs::read_to_string(&timeline).unwrap_or_default(),
        session_log: std::fs::read_to_string(session_workers.log()).unwrap_or_default(),
        facts: judge::RunFacts { epoch_ms: shared.recorder.epoch_ms() },
        attacks,
        schedules: Some((schedule_reads, ticks)),
        workflows: Some((workflow_reads, steps_before, steps_after)),
        limits: Some(limited_reads),
    };
    kept.write(dir)?;
    let mut report = judge::judge(&kept);
    report.availability = availability::measure(&kept.history, &stops);
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(&report)?)?;
    std::fs::write(dir.join("verdict.json"), serde_json::to_string_pretty(&controls::Outcome::of(&report))?)?;
    let text = format!("{}\navailability: {}\n{}\n", report.summary(), report.availability.summary(), report.details());
    std::fs::write(dir.join("report.txt"), text)?;
    nodes.stop_all();
    drop(disks);
    drop(proxies);
    Ok(report.verdict())
}

/// Mints a token with `drover token secret ARGS`: writes the secret to
/// `secret_to` and answers its tokens-file entry, a line of its own.
fn mint_token(drover: &std::path::Path, secret_to: &std::path::Path, args: &[&str]) -> anyhow::Result<Vec<u8>> {
    let output = std::process::Command::new(drover)
        .args(["token", "secret"])
        .args(args)
        .output()
        .context("running drover token secret")?;
    if !output.status.success() {
        bail!("drover token secret failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    std::fs::write(secret_to, String::from_utf8(output.stdout)?.trim())?;
    let mut entry = output.stderr;
    entry.push(b'\n');
    Ok(entry)
}

/// Each partition's replicas where the cluster placed them when it formed
/// (node locations decide it, as they do in Drover).
fn placement_of(nodes: usize, partitions: u32, locations: &[String]) -> Vec<Vec<usize>> {
    use drover::placement::{place, Location};
    let located: std::collections::BTreeMap<u64, Location> = (0..nodes)
        .map(|i| (i as u64, locations.get(i).and_then(|l| Location::parse(l).ok()).unwrap_or_default()))
        .collect();
    place(partitions, nodes.min(3) as u32, &located)
        .into_iter()
        .map(|replicas| replicas.into_iter().map(|n| n as usize).collect())
        .collect()
}

/// The nodes holding a job's partition, by its key, in `placement`.
fn replicas_in(placement: &[Vec<usize>]) -> impl Fn(u64) -> Vec<usize> + Clone + '_ {
    move |key: u64| placement.get((key >> 48) as usize).cloned().unwrap_or_default()
}

/// Every node's own view of every job (not routed to leaders) that `token`
/// may read: the workload's jobs (by the id in their variables) with the
/// workload's token, the attacker's own with the attacker's.
async fn final_reads(nodes: &cluster::Nodes, token: Option<&str>) -> FinalReads {
    let mut finals: FinalReads = BTreeMap::new();
    for i in nodes.members() {
        let Some(listed) = node_jobs(nodes, i, token).await else { continue };
        let mut jobs = BTreeMap::new();
        for job in &listed {
            let text = job["variables"].as_str().unwrap_or("{}");
            let variables: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
            let marked =
                text.contains(attacker::NAME) || job["result"].as_str().unwrap_or_default().contains(attacker::NAME);
            let tenant = job["tenant"].as_str().unwrap_or_default().to_string();
            let id = match workload::id_in(&variables) {
                Some(id) => id,
                // The attacker's own jobs carry no id.
                None if tenant == attacker::NAME => 0,
                None => continue,
            };
            if let (Some(key), Some(state)) = (job["key"].as_u64(), job["state"].as_str()) {
                let job_type = job["type"].as_str().unwrap_or_default().to_string();
                let checkpoints = job["checkpoints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| Some((c["stage"].as_str()?.to_string(), c["attempt"].as_u64()? as u32)))
                    .collect();
                let attempt = job["attempt"].as_u64().unwrap_or(0) as u32;
                let timers = serde_json::from_value(job["timers"].clone()).unwrap_or_default();
                let actors = serde_json::from_value(job["actors"].clone()).unwrap_or_default();
                // The attacker's mark on its own job is no forgery.
                let forged = marked && tenant != attacker::NAME;
                let state = state.to_string();
                let expires_at = job["expiresAt"].as_i64().unwrap_or(0);
                let activated_at = serde_json::from_value(job["activatedAt"].clone()).unwrap_or_default();
                let activations = job["activations"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|a| Some((a["attempt"].as_u64()? as u32, a["worker"].as_str()?.to_string())))
                    .collect();
                let failures = serde_json::from_value(job["failures"].clone()).unwrap_or_default();
                let job = FinalJob {
                    id,
                    state,
                    job_type,
                    checkpoints,
                    attempt,
                    timers,
                    tenant,
                    actors,
                    forged,
                    expires_at,
                    activated_at,
                    activations,
                    failures,
                };
                jobs.insert(key, job);
            }
        }
        finals.insert(i, jobs);
    }
    finals
}

/// Every job node `i` holds (its replicas, live and retained) that `token`
/// may read, a page at a time; `None` when the node does not answer.
async fn node_jobs(nodes: &cluster::Nodes, i: usize, token: Option<&str>) -> Option<Vec<serde_json::Value>> {
    let mut listed = Vec::new();
    let mut path = "/actuator/jobs".to_string();
    loop {
        let Ok((200, body)) = nodes.admin_get_as(i, &path, token).await else { return None };
        let mut value = serde_json::from_str::<serde_json::Value>(&body).ok()?;
        if let serde_json::Value::Array(jobs) = value["jobs"].take() {
            listed.extend(jobs);
        }
        match value["next"].as_u64() {
            Some(after) => path = format!("/actuator/jobs?after={after}"),
            None => return Some(listed),
        }
    }
}

/// Every node's jobs made by a workflow, with their workflow, step and state.
async fn step_reads(nodes: &cluster::Nodes, token: Option<&str>) -> workflows::StepReads {
    let mut reads = workflows::StepReads::new();
    for i in nodes.members() {
        let Some(listed) = node_jobs(nodes, i, token).await else { continue };
        let steps = listed.iter().filter_map(|job| Some((job["key"].as_u64()?, workflows::step_of(job)?))).collect();
        reads.insert(i, steps);
    }
    reads
}

/// Every node's jobs made by a schedule, with their schedule and tick.
async fn tick_reads(nodes: &cluster::Nodes, token: Option<&str>) -> schedules::TickReads {
    let mut reads = schedules::TickReads::new();
    for i in nodes.members() {
        let Some(listed) = node_jobs(nodes, i, token).await else { continue };
        let ticks = listed.iter().filter_map(|job| Some((job["key"].as_u64()?, schedules::tick_of(job)?))).collect();
        reads.insert(i, ticks);
    }
    reads
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(nemesis: &[Nemesis], nodes: usize, regions: bool) -> RunArgs {
        let Command::Run(mut args) = Cli::try_parse_from(["drover-jepsen", "run"]).expect("defaults").command else {
            unreachable!("a run")
        };
        args.nemesis = nemesis.to_vec();
        args.nodes = nodes;
        args.regions = regions;
        args
    }

    #[test]
    fn spare_slots_come_with_the_membership_nemesis_only() {
        assert_eq!(slots(&args(&[Nemesis::Partition, Nemesis::Kill], 3, false)), 3);
        assert_eq!(slots(&args(&[Nemesis::Membership], 3, false)), 9);
        // Named twice, counted once.
        assert_eq!(slots(&args(&[Nemesis::Membership, Nemesis::Membership], 3, false)), 9);
    }

    #[test]
    fn spare_slots_get_zones_of_their_own_in_both_regions() {
        assert_eq!(locations(&args(&[Nemesis::Badlinks], 5, true)), ["a/a1", "a/a2", "a/a3", "b/b1", "b/b2"]);
        let located = locations(&args(&[Nemesis::Membership], 3, true));
        assert_eq!(located[..5], ["a/a1", "a/a2", "b/b1", "b/b2", "a/a3"]);
        assert_eq!(located.len(), 9);
        let distinct: std::collections::BTreeSet<&String> = located.iter().collect();
        assert_eq!(distinct.len(), 9);
    }

    #[test]
    fn replicas_are_the_placement_s_by_a_key_s_partition() {
        let placement = vec![vec![0, 1, 2], vec![3, 1, 4]];
        let replicas = replicas_in(&placement);
        assert_eq!(replicas(1 << 48 | 17), [3, 1, 4]);
        assert_eq!(replicas(5), [0, 1, 2]);
        assert!(replicas(7 << 48).is_empty());
        assert_eq!(placement_of(3, 3, &[]).len(), 3);
    }
}
