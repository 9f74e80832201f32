//! The console's sparklines: every [`INTERVAL`], this node's own metrics are
//! rendered, a few figures read from them, and the rates since the previous
//! reading kept for the last [`KEPT`] intervals. Nothing is stored: a
//! restarted node starts a new line.

use std::collections::VecDeque;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::watch;

pub const INTERVAL: Duration = Duration::from_secs(2);
pub const KEPT: usize = 90;

/// The cumulative figures one reading takes from the metrics text.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Reading {
    created: f64,
    completed: f64,
    failed: f64,
    requests: f64,
    ack_sum: f64,
    ack_count: f64,
    /// Cumulative count of create acknowledgements at or under each bound of
    /// [`ACK_BOUNDS`].
    ack_buckets: [f64; ACK_BOUNDS.len()],
}

/// The create-ack histogram's bucket bounds (seconds), as the recorder is
/// configured in `metrics::recorder`.
const ACK_BOUNDS: [f64; 14] = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// One interval's rates and latencies.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct Sample {
    /// Unix epoch ms at the end of the interval.
    pub at: u64,
    /// Jobs per second, as counted by the partition leaders on this node.
    pub created: f64,
    pub completed: f64,
    pub failed: f64,
    /// Client gRPC requests per second through this node's gateway.
    pub requests: f64,
    /// CreateJob acknowledgements through this gateway: mean and the bound
    /// of the bucket holding the 99th percentile, in milliseconds (0 when
    /// there were none).
    pub ack_mean_ms: f64,
    pub ack_p99_ms: f64,
}

fn store() -> &'static Mutex<VecDeque<Sample>> {
    static SAMPLES: OnceLock<Mutex<VecDeque<Sample>>> = OnceLock::new();
    SAMPLES.get_or_init(|| Mutex::new(VecDeque::with_capacity(KEPT)))
}

/// The samples kept, oldest first.
pub fn samples() -> Vec<Sample> {
    store().lock().expect("samples lock").iter().copied().collect()
}

/// Takes a reading every [`INTERVAL`] until `stop`. Several nodes in one
/// process share the recorder, and so the samples: one sampler is enough.
pub async fn run(mut stop: watch::Receiver<bool>, status: crate::tasks::LoopStatus) {
    static RUNNING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if RUNNING.swap(true, std::sync::atomic::Ordering::SeqCst) {
        status.set("another node in this process samples the metrics");
        return;
    }
    let mut last = read(&crate::metrics::recorder().render());
    let mut last_at = std::time::Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(INTERVAL) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
        let now = read(&crate::metrics::recorder().render());
        let seconds = last_at.elapsed().as_secs_f64();
        last_at = std::time::Instant::now();
        let sample = between(&last, &now, seconds, crate::auth::now_ms());
        last = now;
        let mut samples = store().lock().expect("samples lock");
        if samples.len() == KEPT {
            samples.pop_front();
        }
        samples.push_back(sample);
        status.set(format!("{} samples kept", samples.len()));
    }
    RUNNING.store(false, std::sync::atomic::Ordering::SeqCst);
}

fn between(before: &Reading, after: &Reading, seconds: f64, at: u64) -> Sample {
    let rate = |a: f64, b: f64| if seconds > 0.0 { ((b - a).max(0.0)) / seconds } else { 0.0 };
    let acks = after.ack_count - before.ack_count;
    let (ack_mean_ms, ack_p99_ms) = if acks > 0.0 {
        let mean = (after.ack_sum - before.ack_sum) / acks * 1000.0;
        let wanted = acks * 0.99;
        let p99 = ACK_BOUNDS
            .iter()
            .zip(after.ack_buckets.iter().zip(before.ack_buckets.iter()))
            .find(|(_, (a, b))| *a - *b >= wanted)
            .map_or(ACK_BOUNDS[ACK_BOUNDS.len() - 1], |(bound, _)| *bound);
        (mean, p99 * 1000.0)
    } else {
        (0.0, 0.0)
    };
    Sample {
        at,
        created: rate(before.created, after.created),
        completed: rate(before.completed, after.completed),
        failed: rate(before.failed, after.failed),
        requests: rate(before.requests, after.requests),
        ack_mean_ms,
        ack_p99_ms,
    }
}

/// Sums the figures this module follows from Prometheus text.
fn read(text: &str) -> Reading {
    let mut reading = Reading::default();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<f64>() else { continue };
        let (name, labels) = series.split_once('{').unwrap_or((series, ""));
        match name {
            "drover_jobs_total" => {
                if labels.contains("outcome=\"created\"") {
                    reading.created += value;
                } else if labels.contains("outcome=\"completed\"") {
                    reading.completed += value;
                } else if labels.contains("outcome=\"failed\"") {
                    reading.failed += value;
                }
            }
            "drover_grpc_requests_total" => reading.requests += value,
            "drover_create_ack_seconds_sum" => reading.ack_sum += value,
            "drover_create_ack_seconds_count" => reading.ack_count += value,
            "drover_create_ack_seconds_bucket" => {
                let Some(le) = labels.split("le=\"").nth(1).and_then(|rest| rest.split('"').next()) else {
                    continue;
                };
                if let Ok(bound) = le.parse::<f64>() {
                    if let Some(i) = ACK_BOUNDS.iter().position(|b| (b - bound).abs() < 1e-9) {
                        reading.ack_buckets[i] += value;
                    }
                }
            }
            _ => {}
        }
    }
    reading
}

/// An inline SVG line of `values` (scaled to their maximum), with its last
/// value and maximum in the title.
pub fn sparkline(values: &[f64], unit: &str) -> String {
    const WIDTH: f64 = 240.0;
    const HEIGHT: f64 = 36.0;
    let max = values.iter().copied().fold(0.0_f64, f64::max);
    let step = if values.len() > 1 { WIDTH / (KEPT - 1) as f64 } else { 0.0 };
    let offset = WIDTH - step * values.len().saturating_sub(1) as f64;
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let y = if max > 0.0 { HEIGHT - 2.0 - (v / max) * (HEIGHT - 4.0) } else { HEIGHT - 2.0 };
            format!("{:.1},{:.1}", offset + step * i as f64, y)
        })
        .collect();
    let last = values.last().copied().unwrap_or(0.0);
    format!(
        r#"<svg class="spark" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img"><title>last {last:.1} {unit}, max {max:.1} {unit}</title><polyline fill="none" stroke="currentColor" stroke-width="1.5" points="{}"/></svg>"#,
        points.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = r#"# TYPE drover_jobs_total counter
drover_jobs_total{partition="1",type="a",outcome="created"} 10
drover_jobs_total{partition="2",type="a",outcome="created"} 5
drover_jobs_total{partition="1",type="a",outcome="completed"} 4
drover_grpc_requests_total{method="CreateJob",code="OK"} 15
drover_create_ack_seconds_bucket{le="0.001"} 10
drover_create_ack_seconds_bucket{le="0.002"} 15
drover_create_ack_seconds_bucket{le="+Inf"} 15
drover_create_ack_seconds_sum 0.015
drover_create_ack_seconds_count 15
"#;

    const AFTER: &str = r#"drover_jobs_total{partition="1",type="a",outcome="created"} 30
drover_jobs_total{partition="2",type="a",outcome="created"} 25
drover_jobs_total{partition="1",type="a",outcome="completed"} 24
drover_jobs_total{partition="1",type="a",outcome="failed"} 2
drover_grpc_requests_total{method="CreateJob",code="OK"} 55
drover_create_ack_seconds_bucket{le="0.001"} 20
drover_create_ack_seconds_bucket{le="0.002"} 30
drover_create_ack_seconds_bucket{le="0.005"} 55
drover_create_ack_seconds_bucket{le="+Inf"} 55
drover_create_ack_seconds_sum 0.095
drover_create_ack_seconds_count 55
"#;

    #[test]
    fn rates_and_latencies_come_from_the_difference_of_two_readings() {
        let sample = between(&read(BEFORE), &read(AFTER), 2.0, 7);
        assert_eq!(sample.created, 20.0);
        assert_eq!(sample.completed, 10.0);
        assert_eq!(sample.failed, 1.0);
        assert_eq!(sample.requests, 20.0);
        assert!((sample.ack_mean_ms - 2.0).abs() < 1e-9, "{}", sample.ack_mean_ms);
        // 40 acks: 10 under 1 ms, 15 under 2 ms, the rest under 5 ms.
        assert_eq!(sample.ack_p99_ms, 5.0);
    }

    #[test]
    fn a_quiet_interval_has_no_latency_and_a_flat_line() {
        let sample = between(&read(AFTER), &read(AFTER), 2.0, 7);
        assert_eq!((sample.created, sample.ack_mean_ms, sample.ack_p99_ms), (0.0, 0.0, 0.0));
        let svg = sparkline(&[0.0, 0.0], "jobs/s");
        assert!(svg.contains("points=\"237.3,34.0 240.0,34.0\""), "{svg}");
    }
}
