//! `drover-jepsen`: runs Drover nodes in network namespaces, drives a workload
//! through several gateways, injects faults on a seeded schedule, heals,
//! drains, reads every job from every node and checks the history.
//!
//! Run as root. `drover-jepsen run --nemesis partition --time 60` runs one
//! test; `drover-jepsen suite` runs every nemesis and all of them combined.

mod checker;
mod cluster;
mod history;
mod net;
mod workload;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
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
    /// Where run directories go.
    #[arg(long, default_value = "jepsen/runs")]
    out: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// One test run.
    Run(RunArgs),
    /// Every nemesis alone, then all combined, each for --time seconds.
    Suite(RunArgs),
    /// Internal: the part of a run that executes inside the client namespace.
    #[command(hide = true)]
    Inner { dir: PathBuf },
}

#[derive(Serialize, Deserialize)]
struct InnerConfig {
    args: RunArgs,
    seed: u64,
    gateways: Vec<String>,
    namespaces: Vec<String>,
    ips: Vec<String>,
    drover: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            let valid = run(args)?;
            std::process::exit(if valid { 0 } else { 1 });
        }
        Command::Suite(args) => {
            let (mut passed, mut failed) = (0, 0);
            let mut combos: Vec<Vec<Nemesis>> = [Nemesis::Partition, Nemesis::Kill, Nemesis::Pause, Nemesis::Badlinks]
                .iter()
                .map(|n| vec![*n])
                .collect();
            combos.push(vec![Nemesis::Partition, Nemesis::Kill, Nemesis::Pause, Nemesis::Badlinks]);
            for nemesis in combos {
                let args = RunArgs { nemesis, ..args.clone() };
                match run(args) {
                    Ok(true) => passed += 1,
                    Ok(false) => failed += 1,
                    Err(e) => {
                        eprintln!("jepsen: run failed: {e:#}");
                        failed += 1;
                    }
                }
            }
            println!("jepsen: {passed} passed, {failed} failed");
            std::process::exit(if failed == 0 { 0 } else { 1 });
        }
        Command::Inner { dir } => {
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            let valid = runtime.block_on(inner(&dir))?;
            std::process::exit(if valid { 0 } else { 1 });
        }
    }
}

/// Sets up the namespaces, runs the test inside the client namespace, tears
/// everything down, and prints the one-line summary.
fn run(args: RunArgs) -> anyhow::Result<bool> {
    let seed = args.seed.unwrap_or_else(rand::random);
    let drover = std::fs::canonicalize(&args.drover)
        .with_context(|| format!("the drover binary {} (build it first, or pass --drover)", args.drover.display()))?;
    let names: Vec<String> = args.nemesis.iter().map(|n| format!("{n:?}").to_lowercase()).collect();
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let dir = args.out.join(format!("{stamp}-{}-{seed}", names.join("+")));
    std::fs::create_dir_all(&dir)?;
    let dir = std::fs::canonicalize(&dir)?;
    // The binaries this run uses, linked into the run directory: a rebuild
    // during the run cannot pull them away, and the run can be repeated with them.
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    let drover = keep(&drover, &bin.join("drover"))?;
    let runner = keep(&std::env::current_exe()?, &bin.join("drover-jepsen"))?;
    let prefix = format!("drj{:05}", seed % 100_000);
    let net = net::Network::create(&prefix, args.nodes).context("creating the test network (run as root)")?;
    let config = InnerConfig {
        seed,
        gateways: (0..args.nodes).map(|i| format!("{}:26500", net.node_ip(i))).collect(),
        namespaces: (0..args.nodes).map(|i| net.node_ns(i)).collect(),
        ips: (0..args.nodes).map(|i| net.node_ip(i)).collect(),
        drover,
        args: args.clone(),
    };
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config)?)?;
    println!(
        "jepsen: nemesis {} for {} s on {} nodes, seed {seed}, run dir {}",
        names.join("+"),
        args.time,
        args.nodes,
        dir.display()
    );
    let status = std::process::Command::new("ip")
        .args(["netns", "exec", &net.client_ns()])
        .arg(&runner)
        .arg("inner")
        .arg(&dir)
        .status()?;
    drop(net);
    let report = std::fs::read_to_string(dir.join("report.txt")).unwrap_or_else(|_| "no report: the run failed".into());
    println!("jepsen: {} | seed {seed} | {}", names.join("+"), report.trim());
    if status.code() == Some(1) || status.code() == Some(0) {
        Ok(status.success())
    } else {
        bail!("the run failed ({status}); see {}", dir.display())
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

async fn inner(dir: &Path) -> anyhow::Result<bool> {
    let config: InnerConfig = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
    let args = &config.args;
    let mut rng = StdRng::seed_from_u64(config.seed);
    let network = net::Network::attach(&config.namespaces, &config.ips);
    let mut nodes = cluster::Nodes::from_parts(&config.drover, dir, &config.namespaces, &config.ips, args.partitions);
    for i in 0..args.nodes {
        nodes.start(i)?;
    }
    nodes.wait_ready(Duration::from_secs(60)).await?;

    let shared = Arc::new(workload::Shared {
        recorder: workload::Recorder::new(),
        gateways: config.gateways.clone(),
        next_id: AtomicU64::new(1),
        stop_creating: AtomicBool::new(false),
        draining: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    });
    let mut tasks = Vec::new();
    for p in 0..3u64 {
        tasks.push(tokio::spawn(workload::producer(Arc::clone(&shared), p, config.seed ^ (p + 1))));
    }
    for p in 3..5u64 {
        tasks.push(tokio::spawn(workload::poller(Arc::clone(&shared), p, config.seed ^ (p + 1))));
    }
    for p in 5..7u64 {
        tasks.push(tokio::spawn(workload::streamer(Arc::clone(&shared), p, config.seed ^ (p + 1))));
    }

    // The fault schedule.
    let timeline = dir.join("nemesis.jsonl");
    let started = Instant::now();
    let end = started + Duration::from_secs(args.time);
    while Instant::now() + Duration::from_secs(4) < end {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1_500..3_000))).await;
        let nemesis = *args.nemesis.choose(&mut rng).expect("at least one nemesis");
        let description = inject(nemesis, &network, &mut nodes, &mut rng).await?;
        let t = shared.recorder.now_ms();
        append_line(
            &timeline,
            &serde_json::json!({ "time_ms": t, "event": "start", "nemesis": nemesis, "fault": description }),
        );
        let hold = rng.random_range(2_000..5_000).min(end.saturating_duration_since(Instant::now()).as_millis() as u64);
        tokio::time::sleep(Duration::from_millis(hold)).await;
        network.heal();
        nodes.heal()?;
        append_line(&timeline, &serde_json::json!({ "time_ms": shared.recorder.now_ms(), "event": "heal" }));
    }
    tokio::time::sleep(end.saturating_duration_since(Instant::now())).await;

    // Heal everything, stop creating, and drain with well-behaved workers.
    network.heal();
    nodes.heal()?;
    shared.stop_creating.store(true, Ordering::Relaxed);
    shared.draining.store(true, Ordering::Relaxed);
    append_line(&timeline, &serde_json::json!({ "time_ms": shared.recorder.now_ms(), "event": "drain" }));
    nodes.wait_ready(Duration::from_secs(60)).await?;
    let drain_end = Instant::now() + Duration::from_secs(args.drain);
    let replicas = |key: u64| -> Vec<usize> {
        let partition = (key >> 48) as usize;
        (0..args.nodes.min(3)).map(|i| (partition + i) % args.nodes).collect()
    };
    let mut finals;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        finals = final_reads(&nodes).await;
        let history = shared.recorder.take();
        let report = checker::check(&history, &finals, replicas);
        let settled = report.lost.is_empty() && report.divergent.is_empty();
        if settled || Instant::now() > drain_end {
            break;
        }
    }
    shared.stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    }
    let history = shared.recorder.take();
    let report = checker::check(&history, &finals, replicas);
    for op in &history {
        append_line(&dir.join("history.jsonl"), op);
    }
    std::fs::write(dir.join("finals.json"), serde_json::to_string(&finals)?)?;
    std::fs::write(dir.join("report.json"), serde_json::to_string_pretty(&report)?)?;
    std::fs::write(dir.join("report.txt"), report.summary())?;
    nodes.stop_all();
    Ok(report.valid)
}

async fn inject(
    nemesis: Nemesis,
    network: &net::Network,
    nodes: &mut cluster::Nodes,
    rng: &mut StdRng,
) -> anyhow::Result<String> {
    let n = nodes.ips.len();
    let all: Vec<usize> = (0..n).collect();
    Ok(match nemesis {
        Nemesis::Partition => {
            let kind = rng.random_range(0..3);
            let (side_a, side_b): (Vec<usize>, Vec<usize>) = match kind {
                0 => {
                    let victim = rng.random_range(0..n);
                    (vec![victim], all.iter().copied().filter(|i| *i != victim).collect())
                }
                1 => {
                    let mut shuffled = all.clone();
                    shuffled.shuffle(rng);
                    let cut = rng.random_range(1..n);
                    (shuffled[..cut].to_vec(), shuffled[cut..].to_vec())
                }
                _ => {
                    let leader = nodes.leader_of(0).await.unwrap_or(0);
                    (vec![leader], all.iter().copied().filter(|i| *i != leader).collect())
                }
            };
            for a in &side_a {
                network.block(*a, &side_b.iter().map(|b| nodes.ips[*b].clone()).collect::<Vec<_>>())?;
            }
            for b in &side_b {
                network.block(*b, &side_a.iter().map(|a| nodes.ips[*a].clone()).collect::<Vec<_>>())?;
            }
            format!("partition {side_a:?} | {side_b:?}")
        }
        Nemesis::Kill => {
            if rng.random_bool(0.2) {
                for i in 0..n {
                    nodes.kill(i);
                }
                "SIGKILL all nodes".to_string()
            } else {
                let victim = rng.random_range(0..n);
                nodes.kill(victim);
                format!("SIGKILL node {victim}")
            }
        }
        Nemesis::Pause => {
            let victim =
                if rng.random_bool(0.5) { nodes.leader_of(0).await.unwrap_or(0) } else { rng.random_range(0..n) };
            nodes.signal(victim, libc::SIGSTOP);
            format!("SIGSTOP node {victim}")
        }
        Nemesis::Badlinks => {
            let victim = rng.random_range(0..n);
            let percent = rng.random_range(10..40);
            network.lossy(victim, percent)?;
            format!("drop {percent}% of packets into node {victim}")
        }
    })
}

/// Every node's own view of every job (not routed to leaders).
async fn final_reads(nodes: &cluster::Nodes) -> FinalReads {
    let mut finals: FinalReads = BTreeMap::new();
    for i in 0..nodes.ips.len() {
        let Ok((200, body)) = cluster::http_get(&nodes.admin(i), "/actuator/jobs").await else { continue };
        let Ok(value) = serde_json::from_str::<serde_json::Value>(&body) else { continue };
        let mut jobs = BTreeMap::new();
        for job in value["jobs"].as_array().into_iter().flatten() {
            let variables: serde_json::Value =
                serde_json::from_str(job["variables"].as_str().unwrap_or("{}")).unwrap_or_default();
            if let (Some(id), Some(key), Some(state)) =
                (variables["id"].as_u64(), job["key"].as_u64(), job["state"].as_str())
            {
                jobs.insert(key, FinalJob { id, state: state.to_string() });
            }
        }
        finals.insert(i, jobs);
    }
    finals
}
