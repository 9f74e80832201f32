//! The per-stage breakdown printed beside a workload's end-to-end figures:
//! every local node's `drover_stage_seconds` read before and after the
//! workload, the difference summed over nodes, and quantiles estimated from
//! the buckets (linear within a bucket, as Prometheus' `histogram_quantile`
//! does). See `crate::metrics::stages` for what each stage covers.

use std::collections::BTreeMap;

use serde::Serialize;

use super::local::LocalCluster;
use crate::metrics::stages::{Stage, STAGE_METRIC};

/// One stage's histogram: cumulative counts by upper bound (seconds), and the sum.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StageHistogram {
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
}

impl StageHistogram {
    fn count(&self) -> u64 {
        self.buckets.last().map_or(0, |(_, n)| *n)
    }

    /// The `q` quantile in seconds, estimated within its bucket.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        let rank = q * count as f64;
        let mut below = (0.0, 0u64);
        for &(bound, cumulative) in &self.buckets {
            if cumulative as f64 >= rank {
                if bound.is_infinite() {
                    return Some(below.0);
                }
                let inside = (cumulative - below.1) as f64;
                let fraction = if inside > 0.0 { (rank - below.1 as f64) / inside } else { 1.0 };
                return Some(below.0 + (bound - below.0) * fraction);
            }
            below = (bound, cumulative);
        }
        Some(below.0)
    }

    fn add(&mut self, other: &StageHistogram, sign: i64) {
        if self.buckets.is_empty() {
            self.buckets = other.buckets.iter().map(|(b, _)| (*b, 0)).collect();
        }
        for ((_, mine), (_, theirs)) in self.buckets.iter_mut().zip(&other.buckets) {
            *mine = (*mine as i64 + sign * *theirs as i64).max(0) as u64;
        }
        self.sum += sign as f64 * other.sum;
    }
}

/// Every stage's histogram in one Prometheus text exposition.
pub fn parse(text: &str) -> BTreeMap<String, StageHistogram> {
    let mut out: BTreeMap<String, StageHistogram> = BTreeMap::new();
    let bucket_prefix = format!("{STAGE_METRIC}_bucket{{");
    let sum_prefix = format!("{STAGE_METRIC}_sum{{");
    for line in text.lines() {
        let (is_bucket, rest) = if let Some(rest) = line.strip_prefix(&bucket_prefix) {
            (true, rest)
        } else if let Some(rest) = line.strip_prefix(&sum_prefix) {
            (false, rest)
        } else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else { continue };
        let Some(stage) = label(labels, "stage") else { continue };
        let Ok(value) = value.trim().parse::<f64>() else { continue };
        let histogram = out.entry(stage.to_string()).or_default();
        if is_bucket {
            let bound = match label(labels, "le") {
                Some("+Inf") => f64::INFINITY,
                Some(le) => match le.parse() {
                    Ok(bound) => bound,
                    Err(_) => continue,
                },
                None => continue,
            };
            histogram.buckets.push((bound, value as u64));
        } else {
            histogram.sum = value;
        }
    }
    for histogram in out.values_mut() {
        histogram.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

pub(super) fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    labels.split(',').find_map(|pair| pair.strip_prefix(name)?.strip_prefix("=\"")?.strip_suffix('"'))
}

/// Every node's stage histograms, summed.
pub async fn read(cluster: &LocalCluster) -> BTreeMap<String, StageHistogram> {
    let mut total: BTreeMap<String, StageHistogram> = BTreeMap::new();
    for index in 0..cluster.nodes.len() {
        if let Ok((200, body)) = cluster.admin_get(index, "/metrics").await {
            for (stage, histogram) in parse(&body) {
                total.entry(stage).or_default().add(&histogram, 1);
            }
        }
    }
    total
}

#[derive(Clone, Debug, Serialize)]
pub struct StageFigure {
    pub stage: String,
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// What happened between two readings, stage by stage, in the order a job
/// meets them.
pub fn between(
    before: &BTreeMap<String, StageHistogram>,
    after: &BTreeMap<String, StageHistogram>,
) -> Vec<StageFigure> {
    let mut figures = Vec::new();
    for stage in Stage::ALL {
        let name = stage.as_str();
        let Some(after) = after.get(name) else { continue };
        let mut delta = StageHistogram::default();
        delta.add(after, 1);
        if let Some(before) = before.get(name) {
            delta.add(before, -1);
        }
        let count = delta.count();
        if count == 0 {
            continue;
        }
        let ms = |seconds: Option<f64>| (seconds.unwrap_or(0.0) * 1e6).round() / 1e3;
        figures.push(StageFigure {
            stage: name.to_string(),
            count,
            mean_ms: ms(Some(delta.sum / count as f64)),
            p50_ms: ms(delta.quantile(0.5)),
            p99_ms: ms(delta.quantile(0.99)),
        });
    }
    figures
}

pub fn print(figures: &[StageFigure]) {
    if figures.is_empty() {
        return;
    }
    println!("  stages, all nodes (ms; p50/p99 estimated within buckets):");
    for f in figures {
        println!(
            "    {:<16} {:>9} x  mean {:>8.3}  p50 {:>8.3}  p99 {:>8.3}",
            f.stage, f.count, f.mean_ms, f.p50_ms, f.p99_ms
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# TYPE drover_stage_seconds histogram
drover_stage_seconds_bucket{stage=\"apply\",le=\"0.001\"} 50
drover_stage_seconds_bucket{stage=\"apply\",le=\"0.002\"} 90
drover_stage_seconds_bucket{stage=\"apply\",le=\"+Inf\"} 100
drover_stage_seconds_sum{stage=\"apply\"} 0.2
drover_stage_seconds_count{stage=\"apply\"} 100
drover_stage_seconds_bucket{stage=\"push\",le=\"0.001\"} 0
drover_stage_seconds_bucket{stage=\"push\",le=\"0.002\"} 0
drover_stage_seconds_bucket{stage=\"push\",le=\"+Inf\"} 0
drover_other_seconds_bucket{stage=\"apply\",le=\"0.001\"} 7
";

    #[test]
    fn the_exposition_is_read_by_stage_and_bound() {
        let parsed = parse(TEXT);
        assert_eq!(parsed.len(), 2);
        let apply = &parsed["apply"];
        assert_eq!(apply.buckets, vec![(0.001, 50), (0.002, 90), (f64::INFINITY, 100)]);
        assert!((apply.sum - 0.2).abs() < 1e-12);
    }

    #[test]
    fn quantiles_interpolate_within_their_bucket() {
        let apply = &parse(TEXT)["apply"];
        // 50 of 100 at or below 1 ms: the median is the first bucket's top.
        assert!((apply.quantile(0.5).unwrap() - 0.001).abs() < 1e-9);
        // The 70th is half way through the second bucket.
        assert!((apply.quantile(0.7).unwrap() - 0.0015).abs() < 1e-9);
        // Beyond the last finite bound, the bound is all that is known.
        assert!((apply.quantile(0.99).unwrap() - 0.002).abs() < 1e-9);
        assert_eq!(parse(TEXT)["push"].quantile(0.5), None);
    }

    #[test]
    fn a_workload_is_what_was_added_between_two_readings() {
        let before = parse(TEXT);
        // Every bucket doubled: the workload added what TEXT holds.
        let after = parse(&TEXT.replace("} 100", "} 200").replace("} 90", "} 180").replace("} 50", "} 100"));
        let figures = between(&before, &after);
        assert_eq!(figures.len(), 1, "push saw nothing and is left out");
        assert_eq!((figures[0].stage.as_str(), figures[0].count), ("apply", 100));
        assert_eq!(figures[0].p50_ms, 1.0);
        assert_eq!(figures[0].mean_ms, 0.0, "the sum did not move");
    }
}
