//! What a figure was taken under, printed before the figures: the machine's
//! load average and how long one small synced write takes on the disk the
//! nodes write to. A newcomer's rerun is comparable only beside these.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;

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
}

impl Conditions {
    pub fn print(&self) {
        let load = self.load_average.map_or("unknown".to_string(), |l| format!("{l:.2}"));
        println!(
            "conditions: load average {load}; 4 KiB write + fdatasync in {}: p50 {:.3} ms, p99 {:.3} ms ({} samples)",
            self.disk_dir, self.fdatasync_p50_ms, self.fdatasync_p99_ms, self.fdatasync_samples
        );
    }
}

/// Measures `samples` appends of 4 KiB, each followed by `fdatasync`, in a
/// scratch file in `dir` (removed afterwards).
pub fn measure(dir: &Path, samples: usize) -> std::io::Result<Conditions> {
    let load_average = load_average();
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
    took.sort_by(f64::total_cmp);
    let at = |q: f64| took[((took.len() - 1) as f64 * q).round() as usize];
    Ok(Conditions {
        load_average,
        disk_dir: dir.display().to_string(),
        fdatasync_samples: took.len(),
        fdatasync_p50_ms: (at(0.5) * 1000.0).round() / 1000.0,
        fdatasync_p99_ms: (at(0.99) * 1000.0).round() / 1000.0,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_measurement_reports_what_it_sampled() {
        let dir = tempfile::tempdir().unwrap();
        let conditions = super::measure(dir.path(), 5).unwrap();
        assert_eq!(conditions.fdatasync_samples, 5);
        assert!(conditions.fdatasync_p50_ms <= conditions.fdatasync_p99_ms);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the scratch file is removed");
    }
}
