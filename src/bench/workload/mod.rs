//! The two workloads: [`throughput`] and [`latency`], each run by [`run`];
//! the producers and workers are [`clients`]'s, the figures [`figures`]'s,
//! and what is read off the nodes around a run [`samples`]'s.

mod clients;
mod costs;
mod figures;
mod samples;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tokio::sync::watch;

use super::local::LocalCluster;
use super::BenchArgs;
use clients::*;
pub use clients::{authenticate, trust};
pub(crate) use clients::{next_job, now_micros};
pub use figures::{Figures, Percentiles};
pub(super) use samples::total;
use samples::*;

/// Give up waiting for completions after this long without progress.
const STALL_LIMIT: Duration = Duration::from_secs(30);

async fn run(
    args: &BenchArgs,
    gateways: &[String],
    cluster: Option<&LocalCluster>,
    jobs: u64,
    rate: Option<u64>,
    producers: Option<usize>,
) -> anyhow::Result<Figures> {
    let job_type = format!("bench-{}", rand::random::<u32>());
    let tracker = Arc::new(Tracker::new(jobs));
    let (stop_tx, stop_rx) = watch::channel(false);
    let rss_start = cluster.map(|c| c.resident_bytes()).unwrap_or_default();
    let syncs_before = wal_syncs(cluster).await;
    let doubts_before = push_doubts(cluster).await;
    let written_before = written(cluster).await;
    let cluster_requests_before = requests_by_method(cluster, crate::metrics::CLUSTER_REQUESTS).await;
    let client_requests_before = requests_by_method(cluster, "drover_grpc_requests_total").await;
    let client_messages_before = requests_by_method(cluster, crate::metrics::STREAM_MESSAGES).await;

    let leaders = match args.unrouted {
        true => None,
        false => match learn_leaders(gateways, stop_rx.clone()).await {
            Ok(leaders) => Some(leaders),
            Err(e) => {
                eprintln!(
                    "bench: no topology from {} ({e:#}): completions go through each worker's gateway",
                    gateways[0]
                );
                None
            }
        },
    };
    let mut workers = Vec::new();
    for i in 0..args.workers {
        let gateway = gateways[i % gateways.len()].clone();
        let (job_type, tracker, stop) = (job_type.clone(), Arc::clone(&tracker), stop_rx.clone());
        workers.push(match (args.zeebe, args.one_by_one) {
            (true, _) => tokio::spawn(work_one_by_one(gateway, job_type, tracker, stop, Protocol::Zeebe)),
            (false, true) => tokio::spawn(work_one_by_one(gateway, job_type, tracker, stop, Protocol::Drover)),
            (false, false) => {
                tokio::spawn(work(gateway, job_type, tracker, leaders.clone(), !args.one_job_per_message, stop))
            }
        });
    }
    // Let the streams register before the first job, as long-running workers would be.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let load_average_before = super::conditions::load_average();
    let cpu_before = super::conditions::CpuTimes::read();
    let pids: Vec<u32> = cluster.map(|c| c.nodes.iter().map(|n| n.child.id()).collect()).unwrap_or_default();
    let procs_before: Vec<Option<costs::ProcCounters>> = pids.iter().map(|p| costs::ProcCounters::read(*p)).collect();
    let bench_before = costs::ProcCounters::read(std::process::id());
    let entries_before = sample_per_node(cluster, "drover_raft_entries_appended_total ").await;
    let stages_before = match cluster {
        Some(cluster) => super::stages::read(cluster).await,
        None => Default::default(),
    };

    let rss_peak: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(rss_start.clone()));
    let rss_minutes: Arc<Mutex<Vec<Vec<u64>>>> = Arc::new(Mutex::new(vec![Vec::new(); rss_start.len()]));
    let sampler = cluster.map(|c| {
        let pids: Vec<u32> = c.nodes.iter().map(|n| n.child.id()).collect();
        let (peak, minutes, mut stop) = (Arc::clone(&rss_peak), Arc::clone(&rss_minutes), stop_rx.clone());
        let sampling_since = Instant::now();
        tokio::spawn(async move {
            loop {
                {
                    let minute = (sampling_since.elapsed().as_secs() / 60) as usize;
                    let (mut peak, mut minutes) = (peak.lock().expect("lock"), minutes.lock().expect("lock"));
                    for (i, pid) in pids.iter().enumerate() {
                        let rss = crate::memory::resident_bytes(*pid);
                        peak[i] = peak[i].max(rss);
                        if minutes[i].len() <= minute {
                            minutes[i].resize(minute + 1, 0);
                        }
                        minutes[i][minute] = minutes[i][minute].max(rss);
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        })
    });

    // The de-duplication table's size on each node, each minute: with keyed
    // creates, is it bounded?
    let dedupe_minutes: Arc<Mutex<Vec<Vec<f64>>>> = Arc::new(Mutex::new(vec![Vec::new(); rss_start.len()]));
    let dedupe_sampler = cluster.map(|c| {
        let nodes: Vec<String> = c.nodes.iter().map(|n| n.admin.clone()).collect();
        let (token, ca) = (c.token.clone(), c.ca().map(<[u8]>::to_vec));
        let (minutes, mut stop) = (Arc::clone(&dedupe_minutes), stop_rx.clone());
        tokio::spawn(async move {
            loop {
                for (i, admin) in nodes.iter().enumerate() {
                    let read = match &ca {
                        Some(ca) => crate::tls::https_get_as(admin, "/metrics", ca, token.as_deref()).await,
                        None => super::local::admin_get(admin, "/metrics", token.as_deref()).await,
                    };
                    if let Ok((200, body)) = read {
                        let entries: f64 = body
                            .lines()
                            .filter(|l| l.starts_with("drover_dedupe_entries{"))
                            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                            .sum();
                        minutes.lock().expect("lock")[i].push(entries);
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(60)) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        })
    });

    // Producers use gateways on partition leaders when the topology says
    // which: their keyless creates then stay on the node that takes them.
    let producer_gateways: Vec<String> = match &leaders {
        Some(leaders) => {
            let leading = leaders.leading_gateways();
            if leading.is_empty() {
                gateways.to_vec()
            } else {
                leading
            }
        }
        None => gateways.to_vec(),
    };
    let leaders_at_start = leaders.as_ref().map(|l| l.led_per_gateway());
    // Without a number, one producer per gateway they use.
    let producers = producers.unwrap_or(producer_gateways.len()).max(1);
    let started = Instant::now();
    let mut producer_tasks = Vec::new();
    let mut first = 0;
    for p in 0..producers as u64 {
        // The jobs and the rate are split evenly, the first producers taking
        // one more of each while there is a remainder.
        let range = first..first + share(jobs, producers as u64, p);
        first = range.end;
        let gateway = producer_gateways[p as usize % producer_gateways.len()].clone();
        let producer_rate = rate.map(|r| share(r, producers as u64, p).max(1));
        producer_tasks.push(tokio::spawn(produce(
            gateway,
            job_type.clone(),
            range,
            CreateShape {
                payload_bytes: args.payload_bytes,
                incompressible: args.incompressible,
                keyed: args.idempotency_keys,
                batched: !args.one_job_per_message,
            },
            args.in_flight,
            producer_rate,
            Arc::clone(&tracker),
        )));
    }
    let mut ack_latency = Histogram::<u64>::new(3)?;
    let mut created_per_producer = Vec::new();
    for task in producer_tasks {
        let histogram = task.await??;
        created_per_producer.push(histogram.len());
        ack_latency.add(histogram)?;
    }
    let produced_in = started.elapsed();

    let mut last = (0, Instant::now());
    loop {
        let done = tracker.completed_unique.load(Ordering::Relaxed);
        let acked = tracker.acked_total.load(Ordering::Relaxed);
        if done >= acked {
            break;
        }
        if done != last.0 {
            last = (done, Instant::now());
        } else if last.1.elapsed() > STALL_LIMIT {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    let procs_after: Vec<Option<costs::ProcCounters>> = pids.iter().map(|p| costs::ProcCounters::read(*p)).collect();
    let bench_after = costs::ProcCounters::read(std::process::id());
    let _ = stop_tx.send(true);
    let mut latency = Histogram::<u64>::new(3)?;
    for worker in workers {
        latency.add(worker.await??)?;
    }
    if let Some(sampler) = sampler {
        let _ = sampler.await;
    }
    if let Some(sampler) = dedupe_sampler {
        let _ = sampler.await;
    }
    let syncs_after = wal_syncs(cluster).await;
    let doubts_after = push_doubts(cluster).await;
    let written_after = written(cluster).await;
    let cluster_requests_after = requests_by_method(cluster, crate::metrics::CLUSTER_REQUESTS).await;
    let client_requests_after = requests_by_method(cluster, "drover_grpc_requests_total").await;
    let client_messages_after = requests_by_method(cluster, crate::metrics::STREAM_MESSAGES).await;

    let cpu = cpu_before.zip(super::conditions::CpuTimes::read()).and_then(|(before, after)| after.since(&before));
    let mut figures = Figures {
        producers,
        created_per_producer,
        leaders_per_node: leaders_at_start.into_iter().chain(leaders.map(|l| l.led_per_gateway())).collect(),
        load_average_before,
        cpu_steal_percent: cpu.map(|(steal, _)| steal),
        cpu_busy_percent: cpu.map(|(_, busy)| busy),
        pushed_outcome_unknown: (doubts_after.0 - doubts_before.0).max(0.0) as u64,
        handed_back_late: (doubts_after.1 - doubts_before.1).max(0.0) as u64,
        ..Figures::default()
    };
    if let Some(cluster) = cluster {
        figures.stages = super::stages::between(&stages_before, &super::stages::read(cluster).await);
    }
    for seq in 0..jobs as usize {
        let acked = tracker.acked[seq].load(Ordering::Relaxed);
        let completions = tracker.completions[seq].load(Ordering::Relaxed);
        if acked && completions == 0 {
            figures.lost += 1;
        }
        if completions > 1 {
            figures.completed_twice += 1;
        }
        figures.redelivered += tracker.deliveries[seq].load(Ordering::Relaxed).saturating_sub(1) as u64;
    }
    figures.jobs_created = tracker.acked_total.load(Ordering::Relaxed);
    figures.create_errors = tracker.create_errors.load(Ordering::Relaxed);
    figures.jobs_completed_unique = tracker.completed_unique.load(Ordering::Relaxed);
    figures.elapsed_s = elapsed.as_secs_f64();
    figures.jobs_per_s = figures.jobs_completed_unique as f64 / elapsed.as_secs_f64();
    figures.create_ack_per_s = figures.jobs_created as f64 / produced_in.as_secs_f64();
    figures.latency_ms = Some(Percentiles::of(&latency));
    figures.create_ack_latency_ms = Some(Percentiles::of(&ack_latency));
    if let Some(cluster) = cluster {
        figures.rss_start_mib = mib(&rss_start);
        figures.rss_peak_mib = mib(&rss_peak.lock().expect("lock"));
        figures.rss_end_mib = mib(&cluster.resident_bytes());
        figures.rss_peak_per_minute_mib = rss_minutes.lock().expect("lock").iter().map(|m| mib(m)).collect();
        figures.dedupe_entries_per_minute = dedupe_minutes.lock().expect("lock").clone();
    }
    if cluster.is_some() {
        figures.wal_syncs = syncs_after.iter().zip(&syncs_before).map(|(a, b)| a.saturating_sub(*b)).collect();
        let busiest = figures.wal_syncs.iter().copied().max().unwrap_or(0);
        if busiest > 0 {
            figures.jobs_per_sync = Some(figures.jobs_completed_unique as f64 / busiest as f64);
        }
        if figures.jobs_completed_unique > 0 {
            let per_job = |(after, before): (&(&str, f64), &(&str, f64))| {
                let bytes = (after.1 - before.1).max(0.0) / figures.jobs_completed_unique as f64;
                (after.0.to_string(), bytes.round())
            };
            figures.written_per_job = written_after.iter().zip(&written_before).map(per_job).collect();
        }
        let jobs = figures.jobs_completed_unique;
        figures.cluster_requests_per_job = per_job_by_method(&cluster_requests_before, &cluster_requests_after, jobs);
        figures.client_requests_per_job = per_job_by_method(&client_requests_before, &client_requests_after, jobs);
        figures.client_messages_per_job = per_job_by_method(&client_messages_before, &client_messages_after, jobs);
        let entries_after = sample_per_node(cluster, "drover_raft_entries_appended_total ").await;
        for (i, (before, after)) in procs_before.iter().zip(&procs_after).enumerate() {
            if let (Some(before), Some(after)) = (before, after) {
                let entries = entries_after.get(i).zip(entries_before.get(i)).map(|(a, b)| (a - b).max(0.0));
                figures.node_costs.push(costs::Cost::between(before, after, entries, jobs));
            }
        }
    }
    if let (Some(before), Some(after)) = (bench_before, bench_after) {
        figures.bench_cost = Some(costs::Cost::between(&before, &after, None, figures.jobs_completed_unique));
    }
    Ok(figures)
}

/// Producer `p`'s share of `total` split over `producers`.
fn share(total: u64, producers: u64, p: u64) -> u64 {
    total / producers + u64::from(p < total % producers)
}

pub async fn throughput(
    args: &BenchArgs,
    gateways: &[String],
    cluster: Option<&LocalCluster>,
) -> anyhow::Result<Figures> {
    run(args, gateways, cluster, args.jobs, None, Some(args.producers)).await
}

pub async fn latency(args: &BenchArgs, gateways: &[String], cluster: Option<&LocalCluster>) -> anyhow::Result<Figures> {
    let jobs = args.rate * args.duration;
    run(args, gateways, cluster, jobs, Some(args.rate), args.latency_producers).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn votes_or_hand_overs_between_nodes_are_a_change_of_leadership() {
        let with = |requests: &[(&str, f64)]| Figures {
            cluster_requests_per_job: requests.iter().map(|(m, n)| (m.to_string(), *n)).collect(),
            ..Default::default()
        };
        assert!(!with(&[("AppendEntries", 1.5), ("Push", 0.5), ("Vote", 0.0)]).leadership_changed());
        assert!(with(&[("AppendEntries", 1.5), ("Vote", 0.0004)]).leadership_changed());
        assert!(with(&[("Campaign", 0.00015)]).leadership_changed());
    }
}
