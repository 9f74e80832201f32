//! What is read off the nodes' metrics around a run: syncs, bytes written,
//! requests and messages per job, memory.

use std::collections::BTreeMap;

use super::super::local::LocalCluster;

/// Pushed jobs of unknown outcome and jobs handed back late, summed over
/// the local nodes.
pub(super) async fn push_doubts(cluster: Option<&LocalCluster>) -> (f64, f64) {
    let unknown = "drover_broker_jobs_push_fail_try_count_total{code=\"UNKNOWN\"} ";
    let late = "drover_gateway_job_stream_handed_back_total{reason=\"late\"} ";
    (sample_per_node(cluster, unknown).await.iter().sum(), sample_per_node(cluster, late).await.iter().sum())
}

pub(super) async fn wal_syncs(cluster: Option<&LocalCluster>) -> Vec<u64> {
    sample_per_node(cluster, "drover_storage_wal_syncs_total ").await.into_iter().map(|v| v as u64).collect()
}

/// Bytes the local nodes' databases have written, by kind, then the bytes
/// put into each table, summed over nodes.
pub(super) async fn written(cluster: Option<&LocalCluster>) -> Vec<(&'static str, f64)> {
    let mut out = Vec::new();
    for kind in ["user", "wal", "flush", "compaction"] {
        let sample = format!("{}{{kind=\"{kind}\"}} ", crate::metrics::WRITTEN_METRIC);
        out.push((kind, sample_per_node(cluster, &sample).await.iter().sum()));
    }
    for table in crate::storage::Table::ALL.map(crate::storage::Table::cf_name) {
        let sample = format!("{}{{table=\"{table}\"}} ", crate::metrics::PUT_METRIC);
        out.push((table, sample_per_node(cluster, &sample).await.iter().sum()));
    }
    out
}

/// Requests counted in `metric` (by `method` and `code`), by method, summed
/// over the local nodes and codes.
pub(super) async fn requests_by_method(cluster: Option<&LocalCluster>, metric: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let Some(cluster) = cluster else { return out };
    let prefix = format!("{metric}{{");
    for index in 0..cluster.nodes.len() {
        let Ok((_, body)) = cluster.admin_get(index, "/metrics").await else { continue };
        for line in body.lines() {
            let Some((labels, value)) = line.strip_prefix(&prefix).and_then(|rest| rest.rsplit_once("} ")) else {
                continue;
            };
            let (Some(method), Ok(value)) =
                (super::super::stages::label(labels, "method"), value.trim().parse::<f64>())
            else {
                continue;
            };
            *out.entry(method.to_string()).or_default() += value;
        }
    }
    out
}

/// Per job, what `after` counted more than `before`, largest first.
pub(super) fn per_job_by_method(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    jobs: u64,
) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = after
        .iter()
        .map(|(method, n)| (method.clone(), (n - before.get(method).copied().unwrap_or(0.0)) / jobs.max(1) as f64))
        .filter(|(_, n)| *n > 0.0)
        .collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    out
}

/// Each local node's value of the sample whose line starts with `prefix`
/// (name, labels and the space before the value); 0 where it is missing.
pub(super) async fn sample_per_node(cluster: Option<&LocalCluster>, prefix: &str) -> Vec<f64> {
    let mut out = Vec::new();
    let Some(cluster) = cluster else { return out };
    for index in 0..cluster.nodes.len() {
        let value = match cluster.admin_get(index, "/metrics").await {
            Ok((_, body)) => body
                .lines()
                .find_map(|l| l.strip_prefix(prefix))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0),
            Err(_) => 0.0,
        };
        out.push(value);
    }
    out
}

/// The sum over the local nodes of every sample of `name`, whatever its
/// labels; `None` when no node reports it (a build without the metric).
pub(in crate::bench) async fn total(cluster: Option<&LocalCluster>, name: &str) -> Option<f64> {
    let cluster = cluster?;
    let mut sum = None;
    for index in 0..cluster.nodes.len() {
        let Ok((_, body)) = cluster.admin_get(index, "/metrics").await else { continue };
        for line in body.lines().filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with([' ', '{']))) {
            if let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
                *sum.get_or_insert(0.0) += value;
            }
        }
    }
    sum
}

pub(super) fn mib(bytes: &[u64]) -> Vec<f64> {
    bytes.iter().map(|b| (*b as f64 / (1024.0 * 1024.0) * 10.0).round() / 10.0).collect()
}
