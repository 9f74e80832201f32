//! `drover worker`: a worker that runs a shell command per job, and the
//! commands that list and direct the cluster's worker sessions.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Subcommand;
use drover::client::{Client, Control, JobOutcome, Worker, WorkerOptions};
use drover::proto::gateway::*;
use tokio::io::AsyncWriteExt;

use super::{status_error, Target};

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub(crate) struct WorkerCommand {
    #[command(subcommand)]
    pub manage: Option<WorkersCommand>,
    #[command(flatten)]
    pub run: WorkerArgs,
}

/// Which workers a direction covers: one session, a label, or all.
#[derive(clap::Args)]
pub(crate) struct WorkerTarget {
    /// The session id, as `drover worker list` shows it.
    session: Option<String>,
    /// Every worker with this name:value label.
    #[arg(long, conflicts_with = "session")]
    label: Option<String>,
    /// Every worker.
    #[arg(long, conflicts_with_all = ["session", "label"])]
    all: bool,
}

#[derive(Subcommand)]
pub(crate) enum WorkersCommand {
    /// List live worker sessions.
    List {
        /// Only workers with this name:value label.
        #[arg(long)]
        label: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// Take no new jobs; finish those held.
    Quiet {
        #[command(flatten)]
        which: WorkerTarget,
        #[command(flatten)]
        target: Target,
    },
    /// Take new jobs again.
    Resume {
        #[command(flatten)]
        which: WorkerTarget,
        #[command(flatten)]
        target: Target,
    },
    /// Stop: finish or fail held jobs within the grace period, deregister, exit.
    Terminate {
        #[command(flatten)]
        which: WorkerTarget,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(clap::Args)]
pub(crate) struct WorkerArgs {
    /// The job type to work on.
    #[arg(long = "type", short = 't', required = true)]
    job_type: Option<String>,
    /// The shell command run per job (via `sh -c`).
    #[arg(long, required = true)]
    exec: Option<String>,
    /// The worker's name.
    #[arg(long, default_value = "drover-cli")]
    name: String,
    /// Activation timeout per job, ms.
    #[arg(long, default_value_t = 60_000)]
    timeout: i64,
    /// Jobs run at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Back-off in ms before a failed job is retried.
    #[arg(long, default_value_t = 1_000)]
    retry_back_off: i64,
    /// name:value labels of the worker (repeatable), such as pool:critical or
    /// region:eu-west-1: its session's and its stream's; jobs that require a
    /// label go only to workers that have it (docs/regions.md).
    #[arg(long = "label")]
    labels: Vec<String>,
    /// How often the worker beats, ms (0: the server's default, 5000).
    #[arg(long, default_value_t = 0)]
    heartbeat_interval: i64,
    /// How long without a beat before the server declares the worker dead
    /// and hands its jobs to others, ms (0: the server's default, 30000).
    #[arg(long, default_value_t = 0)]
    dead_after: i64,
    /// On SIGTERM, SIGINT or a terminate from the server: how long to wait
    /// for running jobs before failing them as worker-shutdown, ms.
    #[arg(long, default_value_t = 25_000)]
    grace_period: u64,
    /// Run without a worker session (no heartbeats: a dead worker's jobs
    /// come back only at their activation timeout).
    #[arg(long)]
    no_session: bool,
    #[command(flatten)]
    target: Target,
}

pub(crate) async fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    let _telemetry = drover::telemetry::init("text", None, "drover-worker")?;
    let client = Client::connect_lazy(&args.target.address)?;
    let job_type = args.job_type.context("--type is required")?;
    let command = args.exec.context("--exec is required")?;
    let mut options = WorkerOptions::new(&job_type);
    options.worker = args.name.clone();
    options.timeout_ms = args.timeout;
    options.concurrency = args.concurrency;
    options.labels = args.labels;
    options.heartbeat_ms = args.heartbeat_interval;
    options.dead_after_ms = args.dead_after;
    options.grace_period = Duration::from_millis(args.grace_period);
    options.session = !args.no_session;
    let back_off = args.retry_back_off;
    eprintln!("working on jobs of type {job_type:?} from {} with `{command}`", args.target.address);
    let handler = move |job: ActivatedJob| {
        let command = command.clone();
        async move { run_command(&command, &job, back_off).await }
    };
    let worker = Worker::new(client, options);
    let signals = tokio::spawn(obey_signals(worker.controller()));
    worker.run(handler, std::future::pending()).await;
    signals.abort();
    eprintln!("worker stopped");
    Ok(())
}

/// The worker protocol's signals: SIGTERM and SIGINT shut down gracefully,
/// SIGTSTP quiets, SIGCONT resumes.
pub(crate) async fn obey_signals(control: tokio::sync::watch::Sender<Control>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut tstp = signal(SignalKind::from_raw(libc::SIGTSTP))?;
    let mut cont = signal(SignalKind::from_raw(libc::SIGCONT))?;
    loop {
        let wanted = tokio::select! {
            _ = term.recv() => Control::Shutdown,
            _ = int.recv() => Control::Shutdown,
            _ = tstp.recv() => Control::Quiet,
            _ = cont.recv() => Control::Run,
        };
        control.send_if_modified(|current| {
            // A shutdown is never undone by a later SIGTSTP or SIGCONT.
            if *current == Control::Shutdown || *current == wanted {
                return false;
            }
            eprintln!("signal: worker goes {wanted:?}");
            *current = wanted;
            true
        });
    }
}

pub(crate) async fn workers(command: WorkersCommand) -> anyhow::Result<()> {
    let (state, which, target) = match command {
        WorkersCommand::List { label, target } => {
            let client = Client::connect_lazy(&target.address)?;
            let request = ListWorkersRequest { label: label.unwrap_or_default() };
            let workers = client.raw().list_workers(request).await.map_err(status_error)?.into_inner().workers;
            print_workers(&workers);
            return Ok(());
        }
        WorkersCommand::Quiet { which, target } => ("quiet", which, target),
        WorkersCommand::Resume { which, target } => ("running", which, target),
        WorkersCommand::Terminate { which, target } => ("terminate", which, target),
    };
    let session_id = match &which.session {
        Some(id) => u64::from_str_radix(id, 16).with_context(|| format!("{id:?} is not a session id (hex)"))?,
        None => 0,
    };
    if session_id == 0 && which.label.is_none() && !which.all {
        bail!("name a session id, --label name:value or --all");
    }
    let client = Client::connect_lazy(&target.address)?;
    let request = SetWorkerStateRequest {
        session_id,
        label: which.label.unwrap_or_default(),
        all: which.all,
        state: state.into(),
    };
    let workers = client.raw().set_worker_state(request).await.map_err(status_error)?.into_inner().workers;
    print_workers(&workers);
    Ok(())
}

pub(crate) fn print_workers(workers: &[WorkerSession]) {
    for w in workers {
        println!(
            "{}",
            serde_json::json!({
                "session": format!("{:x}", w.session_id), "worker": w.worker_id, "hostname": w.hostname,
                "pid": w.pid, "types": w.job_types, "labels": w.labels, "state": w.reported_state,
                "directed": w.directed_state, "held": w.held_jobs, "last_heartbeat": w.last_heartbeat,
                "missing_on": w.missing_on,
            })
        );
    }
}

/// Runs the worker's command for one job.
pub(crate) async fn run_command(command: &str, job: &ActivatedJob, back_off_ms: i64) -> JobOutcome {
    let retries_left = (job.retries - 1).max(0);
    let fail = |message: String| JobOutcome::Fail { retries: retries_left, message, back_off_ms };
    let mut sh = tokio::process::Command::new("sh");
    // The command dies with the worker: a killed worker's jobs go to others,
    // and must not also run on here.
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        sh.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let spawned = sh
        .arg("-c")
        .arg(command)
        .env("DROVER_JOB_KEY", job.key.to_string())
        .env("DROVER_JOB_TYPE", &job.r#type)
        .env("DROVER_JOB_ATTEMPT", job.attempt.to_string())
        .env("DROVER_JOB_RETRIES", job.retries.to_string())
        .env("DROVER_JOB_STAGE", &job.stage)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => return fail(format!("could not start `{command}`: {e}")),
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(job.variables.as_bytes()).await;
    }
    let output = match child.wait_with_output().await {
        Ok(output) => output,
        Err(e) => return fail(format!("`{command}` failed to run: {e}")),
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let message: String = stderr.trim().chars().take(4000).collect();
        return fail(if message.is_empty() { format!("`{command}` exited with {}", output.status) } else { message });
    }
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_string();
    if stdout.is_empty() {
        return JobOutcome::Complete("{}".into());
    }
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&stdout) {
        Ok(_) => JobOutcome::Complete(stdout),
        Err(_) => fail(format!(
            "`{command}` printed something that is not a JSON object: {}",
            &stdout.chars().take(200).collect::<String>()
        )),
    }
}
