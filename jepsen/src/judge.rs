//! The verdict on a run, from what it kept: the history, every node's final
//! reads, the fault timeline, and what the schedules, workflows, limited
//! queue, session workers and attacker left. A run judges itself with
//! [`judge`] once it has written these; `drover-jepsen recheck` loads them
//! back ([`Kept::load`]) and judges them again the same way, so a change to
//! the checker can be tried on a kept run. Only the availability figures
//! (measured, not judged) are the run's alone.

use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::checker::Report;
use crate::history::{FinalReads, Op};
use crate::{attacker, checker, faults, limits, schedules, sessions, timing, workflows, workload, Nemesis, RunArgs};

/// What the run started with that its checks need besides its files.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunFacts {
    /// The wall clock at the history's zero (ms since the epoch): where the
    /// session workers' log lies on the history's time line.
    pub epoch_ms: u64,
}

/// Everything the checks read.
pub struct Kept {
    pub args: RunArgs,
    pub history: Vec<Op>,
    pub finals: FinalReads,
    /// Each partition's replicas.
    pub placement: Vec<Vec<usize>>,
    pub timeline: String,
    pub session_log: String,
    pub facts: RunFacts,
    /// With tokens: the attacker's attempts and its reads of its own jobs.
    pub attacks: Option<(Vec<attacker::Attempt>, FinalReads)>,
    pub schedules: Option<(Vec<schedules::ScheduleRead>, schedules::TickReads)>,
    pub workflows: Option<(Vec<workflows::WorkflowRead>, workflows::StepReads, workflows::StepReads)>,
    pub limits: Option<Vec<limits::JobRead>>,
}

fn read_json<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> anyhow::Result<Option<T>> {
    match std::fs::read_to_string(dir.join(name)) {
        Ok(text) => Ok(Some(serde_json::from_str(&text).with_context(|| format!("reading {name}"))?)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {name}")),
    }
}

impl Kept {
    /// Writes what [`Kept::load`] reads (the history and timeline are
    /// written as the run goes, or here for the history).
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        use std::io::Write;
        let mut history = std::io::BufWriter::new(std::fs::File::create(dir.join("history.jsonl"))?);
        for op in &self.history {
            writeln!(history, "{}", serde_json::to_string(op)?)?;
        }
        history.flush()?;
        std::fs::write(dir.join("finals.json"), serde_json::to_string(&self.finals)?)?;
        std::fs::write(dir.join("placement.json"), serde_json::to_string(&self.placement)?)?;
        std::fs::write(dir.join("run.json"), serde_json::to_string(&self.facts)?)?;
        if let Some((attempts, own)) = &self.attacks {
            let mut file = std::io::BufWriter::new(std::fs::File::create(dir.join("attacks.jsonl"))?);
            for attempt in attempts {
                writeln!(file, "{}", serde_json::to_string(attempt)?)?;
            }
            file.flush()?;
            std::fs::write(dir.join("attacker-finals.json"), serde_json::to_string(own)?)?;
        }
        if let Some(kept) = &self.schedules {
            std::fs::write(dir.join("schedules.json"), serde_json::to_string(kept)?)?;
        }
        if let Some(kept) = &self.workflows {
            std::fs::write(dir.join("workflows.json"), serde_json::to_string(kept)?)?;
        }
        if let Some(kept) = &self.limits {
            std::fs::write(dir.join("limits.json"), serde_json::to_string(kept)?)?;
        }
        Ok(())
    }

    /// Reads a finished run's directory. Files a run of an older suite did
    /// not keep are left out (and their checks with them).
    pub fn load(dir: &Path) -> anyhow::Result<Kept> {
        let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json"))?)?;
        let args: RunArgs = serde_json::from_value(config["args"].clone())?;
        let mut history = Vec::new();
        for line in std::fs::read_to_string(dir.join("history.jsonl"))?.lines() {
            history.push(serde_json::from_str::<Op>(line)?);
        }
        let finals = read_json(dir, "finals.json")?.context("the run kept no finals.json")?;
        let placement = match read_json(dir, "placement.json")? {
            Some(placement) => placement,
            None => crate::placement_of(args.nodes, args.partitions, &crate::locations(&args)),
        };
        let attacks = match std::fs::read_to_string(dir.join("attacks.jsonl")) {
            Ok(text) => {
                let attempts = text.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
                let own = read_json(dir, "attacker-finals.json")?.unwrap_or_default();
                Some((attempts, own))
            }
            Err(_) => None,
        };
        Ok(Kept {
            history,
            finals,
            placement,
            timeline: std::fs::read_to_string(dir.join("nemesis.jsonl")).unwrap_or_default(),
            session_log: std::fs::read_to_string(dir.join("session-workers.log")).unwrap_or_default(),
            facts: read_json(dir, "run.json")?.unwrap_or_default(),
            attacks,
            schedules: read_json(dir, "schedules.json")?,
            workflows: read_json(dir, "workflows.json")?,
            limits: read_json(dir, "limits.json")?,
            args,
        })
    }
}

/// The session workers the `workers` nemesis killed, as its timeline has
/// them: (when, which).
fn worker_kills(timeline: &str) -> Vec<(u64, String)> {
    timeline
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|e| e["event"] == "start" && e["nemesis"] == "workers")
        .filter_map(|e| Some((e["time_ms"].as_u64()?, e["detail"]["worker"].as_str()?.to_string())))
        .collect()
}

/// Every check on what the run kept, and the verdict: INVALID for any
/// anomaly, else UNKNOWN for any part of the run unobserved, else VALID.
pub fn judge(kept: &Kept) -> Report {
    let replicas = crate::replicas_in(&kept.placement);
    let mut report = checker::check(&kept.history, &kept.finals, replicas);
    let nemeses = &kept.args.nemesis;
    // A killed worker's jobs come back within the bound. Other faults may
    // hold the cluster up for longer, so the bound holds only when killing
    // workers is the only fault; loss is checked in every run.
    let kills = worker_kills(&kept.timeline);
    report.worker_kills = kills.len();
    if nemeses.iter().all(|n| *n == Nemesis::Workers) {
        let starts = sessions::parse_log(&kept.session_log, kept.facts.epoch_ms);
        let completed = kept
            .finals
            .values()
            .flat_map(|jobs| jobs.iter())
            .filter(|(_, job)| job.state == "completed")
            .map(|(key, job)| (*key, job.attempt))
            .collect();
        report.add_slow_recoveries(sessions::check(&starts, &kills, &completed));
    }
    if let Some((reads, ticks)) = &kept.schedules {
        report.add_ticks(schedules::check(reads, ticks));
    }
    if let Some((reads, before, after)) = &kept.workflows {
        report.add_workflows(workflows::check(reads, before, after));
    }
    if let Some(reads) = &kept.limits {
        report.add_limits(limits::check(reads));
    }
    // Late timers say something only when nothing but clocks was faulted.
    let clocks_only = nemeses.iter().all(|n| *n == Nemesis::Clock);
    let timeout = workload::ACTIVATION_TIMEOUT_MS as u64;
    report.add_timing(timing::check(&kept.history, &kept.finals, timeout, clocks_only));
    if let Some((attempts, own)) = &kept.attacks {
        report.add_cross_tenant(attacker::check(attempts, &kept.finals, own));
    }
    report.faults = faults::Tally::of(&kept.timeline);
    let names: Vec<String> = nemeses.iter().map(|n| format!("{n:?}").to_lowercase()).collect();
    for why in report.faults.unobserved(&names) {
        report.unobserved(why);
    }
    report.note_unread();
    report
}
