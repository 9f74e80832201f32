//! What a workload measured, and its percentiles.

use hdrhistogram::Histogram;
use serde::Serialize;

use super::super::Workload;

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub count: u64,
}

impl Percentiles {
    pub(crate) fn of(h: &Histogram<u64>) -> Self {
        let ms = |micros: u64| micros as f64 / 1000.0;
        Percentiles {
            p50: ms(h.value_at_quantile(0.50)),
            p99: ms(h.value_at_quantile(0.99)),
            p999: ms(h.value_at_quantile(0.999)),
            max: ms(h.max()),
            count: h.len(),
        }
    }
}

#[derive(Debug, Default, Serialize)]
pub struct Figures {
    /// Producers that created the jobs, each on its own gateway while there
    /// are gateways enough (the latency workload's rate is split over them).
    pub producers: usize,
    /// Creates each producer had acknowledged.
    pub created_per_producer: Vec<u64>,
    pub jobs_created: u64,
    pub create_errors: u64,
    pub jobs_completed_unique: u64,
    pub lost: u64,
    pub completed_twice: u64,
    pub redelivered: u64,
    pub elapsed_s: f64,
    pub jobs_per_s: f64,
    pub create_ack_per_s: f64,
    pub latency_ms: Option<Percentiles>,
    pub create_ack_latency_ms: Option<Percentiles>,
    pub rss_start_mib: Vec<f64>,
    pub rss_peak_mib: Vec<f64>,
    pub rss_end_mib: Vec<f64>,
    /// Each node's peak resident set in each minute of the run (is memory flat?).
    pub rss_peak_per_minute_mib: Vec<Vec<f64>>,
    /// Each node's de-duplication entries (all its replicas) at the start of
    /// each minute of the run.
    pub dedupe_entries_per_minute: Vec<Vec<f64>>,
    pub wal_syncs: Vec<u64>,
    pub jobs_per_sync: Option<f64>,
    /// How many partitions each gateway's node led when the workload began
    /// and when it ended (empty when the topology did not say): a node that
    /// leads every partition does all the leaders' work.
    pub leaders_per_node: Vec<Vec<usize>>,
    /// The machine's 1-minute load average just before the workload started.
    pub load_average_before: Option<f64>,
    /// Of the machine's CPU time during the workload, the percent that was
    /// busy (everything on it, the bench included) and that the hypervisor
    /// gave to other guests (steal).
    pub cpu_busy_percent: Option<f64>,
    pub cpu_steal_percent: Option<f64>,
    /// Where the time went, by stage, summed over the local nodes.
    pub stages: Vec<super::super::stages::StageFigure>,
    /// Bytes the local nodes' databases wrote per completed job, summed over
    /// nodes, by kind (user: write batches; wal; flush; compaction), then the
    /// bytes put into each table (the user bytes' sources, deletes aside).
    pub written_per_job: Vec<(String, f64)>,
    /// Requests between the local nodes per completed job, by method
    /// (Raft appends, forwards, pushes...), largest first.
    pub cluster_requests_per_job: Vec<(String, f64)>,
    /// Client requests the local gateways answered per completed job, by method.
    pub client_requests_per_job: Vec<(String, f64)>,
    /// Messages both ways on the local gateways' job streams per completed
    /// job, by method.
    pub client_messages_per_job: Vec<(String, f64)>,
    /// Pushed jobs whose leader could not tell whether a worker got them,
    /// summed over the local nodes; of those, the ones their gateway handed
    /// back when it came to the push. The rest wait for their activation
    /// timeout (a run's slowest job then takes that long).
    pub pushed_outcome_unknown: u64,
    pub handed_back_late: u64,
    /// What each completed job cost each local node (CPU, context switches,
    /// syscalls, Raft entries), from `/proc` and the nodes' metrics.
    pub node_costs: Vec<super::costs::Cost>,
    /// The same of the bench's own process (producers and workers).
    pub bench_cost: Option<super::costs::Cost>,
}

impl Figures {
    /// Whether a partition's leadership changed during the workload: the
    /// local nodes asked each other for votes, or a leader handed over.
    pub fn leadership_changed(&self) -> bool {
        self.cluster_requests_per_job
            .iter()
            .any(|(method, per_job)| matches!(method.as_str(), "Vote" | "Campaign") && *per_job > 0.0)
    }

    pub fn print(&self, workload: Workload) {
        println!("== {workload:?} ==");
        println!("  producers (jobs each)         {} {:?}", self.producers, self.created_per_producer);
        println!("  jobs created (acknowledged)   {}", self.jobs_created);
        println!("  create errors                 {}", self.create_errors);
        println!("  jobs completed (unique)       {}", self.jobs_completed_unique);
        println!("  lost / completed twice        {} / {}", self.lost, self.completed_twice);
        println!("  redelivered                   {}", self.redelivered);
        println!("  elapsed                       {:.2} s", self.elapsed_s);
        println!("  end-to-end throughput         {:.0} jobs/s", self.jobs_per_s);
        println!("  create acknowledgements       {:.0} /s", self.create_ack_per_s);
        if let Some(l) = self.latency_ms {
            println!(
                "  create sent -> worker received  p50 {:.2} ms  p99 {:.2} ms  p99.9 {:.2} ms  max {:.2} ms",
                l.p50, l.p99, l.p999, l.max
            );
        }
        if let Some(l) = self.create_ack_latency_ms {
            println!(
                "  create acknowledgement         p50 {:.2} ms  p99 {:.2} ms  p99.9 {:.2} ms  max {:.2} ms",
                l.p50, l.p99, l.p999, l.max
            );
        }
        if !self.rss_peak_mib.is_empty() {
            println!(
                "  RSS per node (MiB)  start {:?}  peak {:?}  end {:?}",
                self.rss_start_mib, self.rss_peak_mib, self.rss_end_mib
            );
        }
        if self.rss_peak_per_minute_mib.iter().any(|minutes| minutes.len() > 1) {
            for (node, minutes) in self.rss_peak_per_minute_mib.iter().enumerate() {
                println!("  RSS peak per minute, node {node} (MiB)  {minutes:?}");
            }
            for (node, minutes) in self.dedupe_entries_per_minute.iter().enumerate() {
                println!("  de-duplication entries each minute, node {node}  {minutes:?}");
            }
        }
        if let Some(jobs_per_sync) = self.jobs_per_sync {
            println!("  WAL syncs per node {:?}; jobs per sync {:.1}", self.wal_syncs, jobs_per_sync);
        }
        match self.leaders_per_node.as_slice() {
            [start, end] if start != end => {
                println!("  partitions led per node       {start:?} at the start, {end:?} at the end")
            }
            [start, ..] => println!("  partitions led per node       {start:?}"),
            [] => {}
        }
        if !self.written_per_job.is_empty() {
            let kinds: Vec<String> = self.written_per_job.iter().map(|(k, b)| format!("{k} {b:.0}")).collect();
            let (written, tables) = kinds.split_at(kinds.len().min(4));
            println!("  bytes written per job, all nodes  {}", written.join(", "));
            println!("    put by table                    {}", tables.join(", "));
        }
        for (what, requests) in [
            ("requests between nodes", &self.cluster_requests_per_job),
            ("client requests", &self.client_requests_per_job),
            ("client stream messages", &self.client_messages_per_job),
        ] {
            if !requests.is_empty() {
                let total: f64 = requests.iter().map(|(_, n)| n).sum();
                let each: Vec<String> = requests.iter().map(|(m, n)| format!("{m} {n:.3}")).collect();
                println!("  {what} per job  {total:.3}: {}", each.join(", "));
            }
        }
        if self.pushed_outcome_unknown > 0 || self.handed_back_late > 0 {
            println!(
                "  pushed jobs of unknown outcome  {} ({} handed back by their gateway, the rest wait for their activation timeout)",
                self.pushed_outcome_unknown, self.handed_back_late
            );
        }
        if let Some(load) = self.load_average_before {
            println!("  load average before           {load:.2}");
        }
        if let (Some(busy), Some(steal)) = (self.cpu_busy_percent, self.cpu_steal_percent) {
            println!("  CPU during the run            busy {busy:.1}%, stolen {steal:.1}%");
        }
        for line in super::costs::describe(&self.node_costs, self.bench_cost.as_ref()) {
            println!("  {line}");
        }
        super::super::stages::print(&self.stages);
    }
}
