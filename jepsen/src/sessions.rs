//! Session workers as real processes, and the `workers` nemesis that kills
//! them with SIGKILL.
//!
//! Jobs of [`SESSION_TYPE`] (a tenth of the creates; each runs 2 s, so a
//! killed worker holds several) are worked only by `drover worker --exec`
//! processes with worker sessions (heartbeats every 500 ms, dead after 3 s,
//! room for [`CONCURRENCY`] jobs) and a 20 s activation timeout: a job held
//! by a killed worker comes back within the bound only because its session
//! dies. Each job's command appends
//! `start WORKER KEY ATTEMPT EPOCH_MS` to a shared log before it works, and
//! the checker reads it: after every kill, each job the killed worker held
//! must be activated again within [`RECOVERY_BOUND_MS`].

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde::Serialize;

/// Worked only by session worker processes.
pub const SESSION_TYPE: &str = "jepsen-session";
pub const HEARTBEAT_MS: u64 = 500;
pub const DEAD_AFTER_MS: u64 = 3_000;
/// A killed worker's jobs are activated again within dead-after and this much.
pub const RECOVERY_BOUND_MS: u64 = DEAD_AFTER_MS + 5_000;
/// Far longer than [`RECOVERY_BOUND_MS`], so a recovery within the bound is
/// the session's doing, not the timeout's; short enough that a job pushed
/// toward a gateway that died before delivering it (never seen by a worker,
/// so never in a heartbeat) comes back within the drain.
pub const ACTIVATION_TIMEOUT_MS: u64 = 20_000;
/// Session worker processes running at once.
pub const WORKERS: usize = 2;
/// Jobs each worker process runs at once. The bound is on the session, not
/// on spare capacity: when kills come back to back, one survivor must still
/// have room for everything the dead ones held (each holds at most this
/// many) and the new jobs, or a recovered job waits in the queue past the
/// bound for a reason that is not the broker's.
pub const CONCURRENCY: usize = 24;

/// The running session worker processes.
pub struct Workers {
    drover: PathBuf,
    log: PathBuf,
    dir: PathBuf,
    gateways: Vec<String>,
    /// Each running worker: its name, its process and the gateways it was given.
    running: Vec<(String, Child, Vec<String>)>,
    started: usize,
}

impl Workers {
    pub fn new(drover: &Path, dir: &Path, gateways: &[String]) -> Workers {
        Workers {
            drover: drover.to_path_buf(),
            log: dir.join("session-workers.log"),
            dir: dir.to_path_buf(),
            gateways: gateways.to_vec(),
            running: Vec::new(),
            started: 0,
        }
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Starts one more worker process.
    pub fn start(&mut self) -> anyhow::Result<String> {
        let name = format!("session-{}", self.started);
        // Every gateway, so the worker keeps beating when one dies.
        let gateways = self.gateways.join(",");
        self.started += 1;
        let script = format!(
            "printf 'start {name} %s %s %s\\n' \"$DROVER_JOB_KEY\" \"$DROVER_JOB_ATTEMPT\" \"$(date +%s%3N)\" >> {log}; \
             sleep 2; echo '{{}}'",
            log = self.log.display()
        );
        let stderr = std::fs::File::create(self.dir.join(format!("{name}.log")))?;
        let mut command = Command::new(&self.drover);
        // Dies with the run, as its nodes do: a run stopped at its bound
        // leaves no worker beating at the next run's addresses.
        // SAFETY: prctl only, between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
                Ok(())
            });
        }
        let child = command
            .arg("worker")
            .args(["--address", &gateways, "--type", SESSION_TYPE, "--name", &name, "--exec", &script])
            .args(["--concurrency", &CONCURRENCY.to_string(), "--timeout", &ACTIVATION_TIMEOUT_MS.to_string()])
            .args(["--heartbeat-interval", &HEARTBEAT_MS.to_string(), "--dead-after", &DEAD_AFTER_MS.to_string()])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()?;
        self.running.push((name.clone(), child, self.gateways.clone()));
        Ok(name)
    }

    /// The gateways workers use from now on (the `membership` nemesis
    /// changed the members): each running worker given a gateway not among
    /// them is SIGKILLed and replaced by one on these, so no worker is left
    /// with only gateways of nodes that left. Answers the replaced workers.
    pub fn follow(&mut self, gateways: &[String]) -> anyhow::Result<Vec<String>> {
        self.gateways = gateways.to_vec();
        let mut replaced = Vec::new();
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].2.iter().all(|g| gateways.contains(g)) {
                i += 1;
                continue;
            }
            let (name, mut child, _) = self.running.remove(i);
            child.kill()?;
            child.wait()?;
            replaced.push(name);
        }
        for _ in 0..replaced.len() {
            self.start()?;
        }
        Ok(replaced)
    }

    /// SIGKILLs the `index % running`th worker and starts a replacement;
    /// answers the killed worker's name.
    pub fn kill_one(&mut self, index: usize) -> anyhow::Result<String> {
        let (name, mut child, _) = self.running.remove(index % self.running.len());
        child.kill()?;
        child.wait()?;
        self.start()?;
        Ok(name)
    }

    pub fn stop_all(&mut self) {
        for (_, child, _) in &mut self.running {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.running.clear();
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// One start of a job's command, as the log has it.
#[derive(Clone, Debug, PartialEq)]
pub struct Start {
    pub worker: String,
    pub key: u64,
    pub attempt: u32,
    pub at_ms: u64,
}

/// Parses the log, with times made relative to `epoch_ms` (the history's zero).
pub fn parse_log(text: &str, epoch_ms: u64) -> Vec<Start> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            if parts.next()? != "start" {
                return None;
            }
            let worker = parts.next()?.to_string();
            let key = parts.next()?.parse().ok()?;
            let attempt = parts.next()?.parse().ok()?;
            let at: u64 = parts.next()?.parse().ok()?;
            Some(Start { worker, key, attempt, at_ms: at.saturating_sub(epoch_ms) })
        })
        .collect()
}

/// A job a killed worker held that came back late, or not at all.
#[derive(Debug, Serialize, PartialEq)]
pub struct SlowRecovery {
    pub key: u64,
    pub worker: String,
    pub killed_at_ms: u64,
    /// When it was activated again; `None`: never (the final reads say whether
    /// the worker finished it before it died).
    pub again_at_ms: Option<u64>,
}

/// For every kill (`(time, worker)`), every job the worker had started and
/// not seen started again before the kill must start again within
/// [`RECOVERY_BOUND_MS`] unless `completed_by` says that worker's attempt
/// completed it.
pub fn check(starts: &[Start], kills: &[(u64, String)], completed: &BTreeMap<u64, u32>) -> Vec<SlowRecovery> {
    let mut slow = Vec::new();
    for (killed_at, worker) in kills {
        // The latest attempt of each job started before the kill.
        let mut latest: BTreeMap<u64, &Start> = BTreeMap::new();
        for start in starts.iter().filter(|s| s.at_ms <= *killed_at) {
            let entry = latest.entry(start.key).or_insert(start);
            if start.attempt > entry.attempt {
                *entry = start;
            }
        }
        for held in latest.values().filter(|s| &s.worker == worker) {
            if completed.get(&held.key) == Some(&held.attempt) {
                continue; // it finished the job before it died
            }
            let again = starts
                .iter()
                .filter(|s| s.key == held.key && s.attempt > held.attempt && s.at_ms >= *killed_at)
                .map(|s| s.at_ms)
                .min();
            if again.is_none_or(|at| at - killed_at > RECOVERY_BOUND_MS) {
                slow.push(SlowRecovery {
                    key: held.key,
                    worker: worker.clone(),
                    killed_at_ms: *killed_at,
                    again_at_ms: again,
                });
            }
        }
    }
    slow
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(worker: &str, key: u64, attempt: u32, at_ms: u64) -> Start {
        Start { worker: worker.into(), key, attempt, at_ms }
    }

    #[test]
    fn the_log_is_read_relative_to_the_history_start() {
        let starts = parse_log("start session-1 42 2 1700000001500\ngarbage\n", 1_700_000_000_000);
        assert_eq!(starts, vec![start("session-1", 42, 2, 1_500)]);
    }

    #[test]
    fn a_killed_worker_s_jobs_must_start_again_within_the_bound() {
        let starts = vec![
            start("w1", 1, 1, 100), // held at the kill, back in time
            start("w2", 1, 2, 1_000 + RECOVERY_BOUND_MS - 1),
            start("w1", 2, 1, 200), // held at the kill, back too late
            start("w2", 2, 2, 1_000 + RECOVERY_BOUND_MS + 1),
            start("w1", 3, 1, 300), // completed by w1 before it died
            start("w1", 4, 1, 400), // held, never back, not completed by w1
            start("w2", 5, 1, 500), // another worker's
        ];
        let completed = BTreeMap::from([(3, 1), (4, 2)]);
        let slow = check(&starts, &[(1_000, "w1".into())], &completed);
        let keys: Vec<u64> = slow.iter().map(|s| s.key).collect();
        assert_eq!(keys, vec![2, 4]);
        assert_eq!(slow[1].again_at_ms, None);
    }
}
