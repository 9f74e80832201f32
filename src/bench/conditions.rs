//! What a figure was taken under, printed before the figures: the machine's
//! load average, how fast one of its cores runs a fixed piece of work, and how
//! long one small synced write takes on the disk the nodes write to; and, for
//! each workload, the share of CPU time the hypervisor took away (steal). A
//! newcomer's rerun is comparable only beside these.
//!
//! Before it measures, the bench has the kernel write back the machine's
//! dirty page cache (`sync`) and says how much there was. A build just before
//! a run leaves hundreds of MiB of it (the binary, written and copied), whose
//! write-back in the first half minute competes with the nodes' WAL syncs: a
//! 20 s run at 1,000 jobs/s with 375 MiB dirty had a p99 of 17 ms and a
//! p99.9 of 175 ms, against 7 and 13 ms after it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

/// Another build of drover for the bench's local nodes to run
/// (`$DROVER_BENCH_NODE_BIN`), to compare two builds of the node under the
/// same bench client; `None`: the bench's own binary.
pub fn node_binary() -> Option<PathBuf> {
    std::env::var_os("DROVER_BENCH_NODE_BIN").map(PathBuf::from)
}

/// The 1-minute load average (Linux), if it can be read.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

#[derive(Clone, Debug, Serialize)]
pub struct Conditions {
    pub load_average: Option<f64>,
    /// Where the synced writes went (the nodes' data directories are there).
    pub disk_dir: String,
    pub fdatasync_samples: usize,
    pub fdatasync_p50_ms: f64,
    pub fdatasync_p99_ms: f64,
    /// The median round trip of a small message over a loopback TCP
    /// connection (`TCP_NODELAY`, one thread each side).
    pub loopback_rtt_p50_ms: f64,
    /// The floor a replicated create cannot beat here: the leader's and a
    /// follower's fdatasync in series plus one round trip between them.
    pub floor_ms: f64,
    /// The fastest of several runs of [`cpu_reference`] on one core: lower
    /// is a faster core. Figures scale with it on a CPU-bound workload.
    pub cpu_reference_ms: f64,
    /// The binary local nodes run when it is not the bench's own
    /// (`$DROVER_BENCH_NODE_BIN`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_binary: Option<String>,
    /// The machine's dirty page cache before the bench wrote it back, and
    /// how long that took (`None` where `/proc/meminfo` cannot be read).
    pub dirty_before_mib: Option<f64>,
    pub write_back_ms: f64,
}

impl Conditions {
    pub fn print(&self) {
        let load = self.load_average.map_or("unknown".to_string(), |l| format!("{l:.2}"));
        println!(
            "conditions: load average {load}; CPU reference {:.1} ms (lower is faster); 4 KiB write + fdatasync in \
             {}: p50 {:.3} ms, p99 {:.3} ms ({} samples)",
            self.cpu_reference_ms, self.disk_dir, self.fdatasync_p50_ms, self.fdatasync_p99_ms, self.fdatasync_samples
        );
        println!(
            "conditions: loopback round trip p50 {:.3} ms; floor (two fdatasyncs in series and a round trip) {:.3} ms",
            self.loopback_rtt_p50_ms, self.floor_ms
        );
        if let Some(dirty) = self.dirty_before_mib {
            println!(
                "conditions: dirty page cache before the run {dirty:.1} MiB, written back first ({:.0} ms)",
                self.write_back_ms
            );
        }
        if let Some(binary) = &self.node_binary {
            println!("conditions: local nodes run {binary} ($DROVER_BENCH_NODE_BIN)");
        }
    }
}

/// Measures `samples` appends of 4 KiB, each followed by `fdatasync`, in a
/// scratch file in `dir` (removed afterwards).
pub fn measure(dir: &Path, samples: usize) -> std::io::Result<Conditions> {
    let load_average = load_average();
    let dirty_before_mib = std::fs::read_to_string("/proc/meminfo").ok().as_deref().and_then(dirty_mib);
    let writing_back = Instant::now();
    // SAFETY: `sync` takes no arguments and only asks the kernel to write back.
    unsafe { libc::sync() };
    let write_back_ms = (writing_back.elapsed().as_secs_f64() * 1000.0).round();
    let scratch = tempfile::Builder::new().prefix("drover-bench-fdatasync-").tempfile_in(dir)?;
    let mut file = scratch.as_file();
    let block = [0x5au8; 4096];
    let mut took: Vec<f64> = Vec::with_capacity(samples);
    for _ in 0..samples.max(1) {
        let started = Instant::now();
        file.write_all(&block)?;
        file.sync_data()?;
        took.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let fdatasync_p50_ms = quantile_ms(&mut took, 0.5);
    let fdatasync_p99_ms = quantile_ms(&mut took, 0.99);
    let loopback_rtt_p50_ms = loopback_rtt_p50_ms(samples.max(1))?;
    Ok(Conditions {
        load_average,
        disk_dir: dir.display().to_string(),
        fdatasync_samples: took.len(),
        fdatasync_p50_ms,
        fdatasync_p99_ms,
        loopback_rtt_p50_ms,
        floor_ms: ((2.0 * fdatasync_p50_ms + loopback_rtt_p50_ms) * 1000.0).round() / 1000.0,
        cpu_reference_ms: cpu_reference_ms(5),
        node_binary: node_binary().map(|path| path.display().to_string()),
        dirty_before_mib,
        write_back_ms,
    })
}

/// The `q` quantile of `samples` (milliseconds), to the microsecond.
fn quantile_ms(samples: &mut [f64], q: f64) -> f64 {
    samples.sort_by(f64::total_cmp);
    let at = samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at * 1000.0).round() / 1000.0
}

/// The median of `samples` round trips of 64 bytes over a loopback TCP
/// connection to an echoing thread.
fn loopback_rtt_p50_ms(samples: usize) -> std::io::Result<f64> {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut stream, _) = listener.accept()?;
        stream.set_nodelay(true)?;
        let mut message = [0u8; 64];
        while stream.read_exact(&mut message).is_ok() {
            stream.write_all(&message)?;
        }
        Ok(())
    });
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    let mut message = [0x5au8; 64];
    let mut took: Vec<f64> = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        stream.write_all(&message)?;
        stream.read_exact(&mut message)?;
        took.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    drop(stream);
    echo.join().map_err(|_| std::io::Error::other("the loopback echo thread panicked"))??;
    Ok(quantile_ms(&mut took, 0.5))
}

/// The `Dirty:` line of a `/proc/meminfo`, in MiB.
fn dirty_mib(meminfo: &str) -> Option<f64> {
    let line = meminfo.lines().find(|l| l.starts_with("Dirty:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some((kib / 1024.0 * 10.0).round() / 10.0)
}

/// A fixed piece of single-threaded work of the kind a node does per job:
/// encode records (allocation, copies), hash them and sort. Returns a value
/// that depends on every step, so none of it can be optimised away.
pub fn cpu_reference() -> u64 {
    #[derive(Serialize)]
    struct Record<'a> {
        key: u64,
        job_type: &'a str,
        variables: &'a str,
        attempt: u32,
    }
    let variables = "x".repeat(256);
    let mut digest = 0u64;
    let mut keys = Vec::with_capacity(20_000);
    for key in 0..20_000u64 {
        let encoded = bincode::serialize(&Record { key, job_type: "reference", variables: &variables, attempt: 1 })
            .unwrap_or_default();
        let hash = encoded.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ *b as u64).wrapping_mul(0x100_0000_01b3));
        keys.push(hash);
        digest ^= hash;
    }
    keys.sort_unstable();
    digest ^ keys[keys.len() / 2]
}

/// The fastest of `runs` runs of [`cpu_reference`], in milliseconds.
pub fn cpu_reference_ms(runs: usize) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..runs.max(1) {
        let started = Instant::now();
        std::hint::black_box(cpu_reference());
        best = best.min(started.elapsed().as_secs_f64() * 1000.0);
    }
    (best * 100.0).round() / 100.0
}

/// The machine's CPU time counters (Linux `/proc/stat`, in clock ticks):
/// all of it, and what the hypervisor gave to other guests (steal).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuTimes {
    pub total: u64,
    pub steal: u64,
    pub idle: u64,
}

impl CpuTimes {
    pub fn read() -> Option<CpuTimes> {
        CpuTimes::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The first (all CPUs) line of `/proc/stat`: user nice system idle
    /// iowait irq softirq steal ...
    fn parse(stat: &str) -> Option<CpuTimes> {
        let line = stat.lines().next()?;
        let mut fields = line.split_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let ticks: Vec<u64> = fields.take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
        if ticks.len() < 8 {
            return None;
        }
        Some(CpuTimes { total: ticks.iter().sum(), steal: ticks[7], idle: ticks[3] + ticks[4] })
    }

    /// Percent of the CPU time since `earlier` that was stolen, and that was
    /// busy (neither idle nor stolen).
    pub fn since(&self, earlier: &CpuTimes) -> Option<(f64, f64)> {
        let total = self.total.checked_sub(earlier.total).filter(|t| *t > 0)? as f64;
        let steal = self.steal.saturating_sub(earlier.steal) as f64;
        let idle = self.idle.saturating_sub(earlier.idle) as f64;
        let round = |x: f64| (x * 10.0).round() / 10.0;
        Some((round(steal / total * 100.0), round((total - steal - idle).max(0.0) / total * 100.0)))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_measurement_reports_what_it_sampled() {
        let dir = tempfile::tempdir().unwrap();
        let conditions = super::measure(dir.path(), 5).unwrap();
        assert_eq!(conditions.fdatasync_samples, 5);
        assert!(conditions.fdatasync_p50_ms <= conditions.fdatasync_p99_ms);
        assert!(conditions.loopback_rtt_p50_ms > 0.0, "a round trip takes some time");
        assert!(conditions.floor_ms >= 2.0 * conditions.fdatasync_p50_ms);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the scratch file is removed");
        assert!(conditions.cpu_reference_ms > 0.0 && conditions.cpu_reference_ms.is_finite());
    }

    #[test]
    fn the_dirty_page_cache_is_read_from_meminfo() {
        let meminfo = "MemTotal:       24000000 kB\nDirty:            383840 kB\nWriteback:             0 kB\n";
        assert_eq!(super::dirty_mib(meminfo), Some(374.8));
        assert_eq!(super::dirty_mib("MemTotal: 1 kB\n"), None);
    }

    #[test]
    fn steal_and_busy_shares_come_from_the_difference_of_two_readings() {
        let before = super::CpuTimes::parse("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3").unwrap();
        let after = super::CpuTimes::parse("cpu  400 0 150 900 50 0 0 100 0 0\n").unwrap();
        // 600 ticks: 100 stolen, 100 idle, 400 busy.
        assert_eq!(after.since(&before), Some((16.7, 66.7)));
        assert_eq!(before.since(&before), None, "no time passed");
        assert_eq!(super::CpuTimes::parse("intr 1 2 3"), None);
    }
}
