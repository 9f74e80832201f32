//! What each job cost the local nodes, read from Linux's `/proc` around a
//! workload: CPU time, context switches (every thread's, voluntary and
//! not) and read/write-class system calls, per node and per completed job,
//! with the Raft entries each node appended per job (its metrics). The
//! bench's own process (the producers and workers) is read the same way, so
//! that a figure per job can be told apart from the load generator's.

use serde::Serialize;

/// A process's counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ProcCounters {
    /// User and system CPU time of every thread, in milliseconds.
    pub cpu_ms: f64,
    /// Context switches of the threads alive now.
    pub switches: u64,
    /// Read- and write-class system calls (`syscr` + `syscw` of `/proc/PID/io`).
    pub syscalls: u64,
}

impl ProcCounters {
    /// Process `pid`'s counters (`None` where `/proc` cannot be read).
    pub fn read(pid: u32) -> Option<ProcCounters> {
        let dir = format!("/proc/{pid}");
        let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
        let io = std::fs::read_to_string(format!("{dir}/io")).unwrap_or_default();
        let mut switches = 0;
        for task in std::fs::read_dir(format!("{dir}/task")).ok()?.flatten() {
            if let Ok(status) = std::fs::read_to_string(task.path().join("status")) {
                switches += field(&status, "voluntary_ctxt_switches:") + field(&status, "nonvoluntary_ctxt_switches:");
            }
        }
        // SAFETY: sysconf only reads a configuration value.
        let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        Some(ProcCounters {
            cpu_ms: cpu_ticks(&stat)? as f64 * 1000.0 / ticks_per_s,
            switches,
            syscalls: syscalls(&io),
        })
    }

    fn since(&self, earlier: &ProcCounters) -> ProcCounters {
        ProcCounters {
            cpu_ms: (self.cpu_ms - earlier.cpu_ms).max(0.0),
            switches: self.switches.saturating_sub(earlier.switches),
            syscalls: self.syscalls.saturating_sub(earlier.syscalls),
        }
    }
}

/// utime + stime of a `/proc/PID/stat` line, in clock ticks. The command
/// name may hold spaces and parentheses: fields are counted after its last
/// `)`, where field 3 (the state) comes first.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

fn syscalls(io: &str) -> u64 {
    field(io, "syscr:") + field(io, "syscw:")
}

/// The number after `name` on its line of a `/proc` key-value file (0 when absent).
fn field(text: &str, name: &str) -> u64 {
    text.lines().find_map(|line| line.strip_prefix(name)).and_then(|value| value.trim().parse().ok()).unwrap_or(0)
}

/// One process's cost per completed job over a workload.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Cost {
    pub cpu_ms_per_job: f64,
    pub switches_per_job: f64,
    pub syscalls_per_job: f64,
    /// Raft entries the node appended per job (its log and its followers'
    /// appends alike); `None` for the bench's own process.
    pub raft_entries_per_job: Option<f64>,
}

impl Cost {
    pub fn between(before: &ProcCounters, after: &ProcCounters, entries: Option<f64>, jobs: u64) -> Cost {
        let spent = after.since(before);
        let per = |n: f64| if jobs == 0 { 0.0 } else { n / jobs as f64 };
        Cost {
            cpu_ms_per_job: per(spent.cpu_ms),
            switches_per_job: per(spent.switches as f64),
            syscalls_per_job: per(spent.syscalls as f64),
            raft_entries_per_job: entries.map(per),
        }
    }
}

/// The line the bench prints for the costs: all nodes together, then each.
pub fn describe(nodes: &[Cost], bench: Option<&Cost>) -> Vec<String> {
    let mut lines = Vec::new();
    if !nodes.is_empty() {
        let sum = |f: fn(&Cost) -> f64| nodes.iter().map(f).sum::<f64>();
        let entries: f64 = nodes.iter().filter_map(|c| c.raft_entries_per_job).sum();
        lines.push(format!(
            "per job, all nodes              CPU {:.3} ms, context switches {:.2}, read/write syscalls {:.2}, Raft entries appended {:.3}",
            sum(|c| c.cpu_ms_per_job),
            sum(|c| c.switches_per_job),
            sum(|c| c.syscalls_per_job),
            entries
        ));
        let each: Vec<String> = nodes
            .iter()
            .enumerate()
            .map(|(i, c)| {
                format!("node {i} {:.3} ms/{:.2}/{:.2}", c.cpu_ms_per_job, c.switches_per_job, c.syscalls_per_job)
            })
            .collect();
        lines.push(format!("  per node (CPU/switches/syscalls)  {}", each.join(", ")));
    }
    if let Some(bench) = bench {
        lines.push(format!(
            "  the bench's own clients         CPU {:.3} ms, context switches {:.2} per job",
            bench.cpu_ms_per_job, bench.switches_per_job
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_a_command_name_holding_spaces_and_parentheses() {
        let stat = "4242 (drover (node) 1) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 12 0 100 0 0";
        assert_eq!(cpu_ticks(stat), Some(300));
        assert_eq!(cpu_ticks("garbage"), None);
    }

    #[test]
    fn counters_come_from_named_fields_and_costs_divide_by_the_jobs() {
        let io = "rchar: 10\nwchar: 20\nsyscr: 7\nsyscw: 5\nread_bytes: 0\n";
        assert_eq!(syscalls(io), 12);
        assert_eq!(field("voluntary_ctxt_switches:\t41\n", "voluntary_ctxt_switches:"), 41);
        let before = ProcCounters { cpu_ms: 100.0, switches: 10, syscalls: 20 };
        let after = ProcCounters { cpu_ms: 300.0, switches: 410, syscalls: 220 };
        let cost = Cost::between(&before, &after, Some(150.0), 100);
        assert_eq!((cost.cpu_ms_per_job, cost.switches_per_job, cost.syscalls_per_job), (2.0, 4.0, 2.0));
        assert_eq!(cost.raft_entries_per_job, Some(1.5));
        assert_eq!(Cost::between(&before, &after, None, 0).cpu_ms_per_job, 0.0, "no jobs: no cost, not infinity");
    }

    #[test]
    fn this_process_can_be_read() {
        let me = ProcCounters::read(std::process::id()).expect("/proc/self");
        assert!(me.switches > 0);
    }
}
