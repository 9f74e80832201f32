//! The process's metrics: the Prometheus recorder, every family's name and
//! help text, the per-stage latency histogram ([`stages`]) and the bound on
//! labels clients choose ([`labels`]).
//!
//! This is the ground floor: raft, partition, the gateway and the admin server
//! all count through it, and it imports none of them. Serving the exposition
//! over HTTP is the admin server's business, not this module's.

mod labels;
pub mod stages;

use std::sync::OnceLock;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub use labels::{job_type_label, MAX_JOB_TYPE_LABELS, OTHER_JOB_TYPES};

/// Client gRPC requests by method and status code (every service on the client port).
pub const GRPC_REQUESTS: &str = "drover_grpc_requests_total";
/// Requests on the OJS HTTP port, by route and HTTP status.
pub const OJS_REQUESTS: &str = "drover_ojs_requests_total";
/// How long OJS requests took, by route.
pub const OJS_REQUEST_SECONDS: &str = "drover_ojs_request_seconds";
/// Requests a node's cluster service answered, by method and code.
pub const CLUSTER_REQUESTS: &str = "drover_cluster_requests_total";
/// Jobs a gateway read from partition leaders (GetJob, and the reads
/// behind the Open Job Spec's and Zeebe's answers): with the jobs finished,
/// what a job costs in reads.
pub const JOB_READS: &str = "drover_gateway_job_reads_total";
/// Messages on the job streams of drover.v1 (CreateJobs, CompleteJobs,
/// StreamActivatedJobs and their batch forms), both ways, by method: with
/// the jobs they carried, what a job costs in messages.
pub const STREAM_MESSAGES: &str = "drover_gateway_stream_messages_total";

static RECORDER: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process-wide Prometheus recorder (installed on first use; several nodes
/// in one test process share it).
pub fn recorder() -> &'static PrometheusHandle {
    RECORDER.get_or_init(|| {
        let latency = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
        let counts = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0];
        PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &latency)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(stages::STAGE_METRIC.into()), stages::STAGE_BUCKETS))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Prefix("drover_raft_commands_per".into()), &counts))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Prefix("drover_storage_appends_per".into()), &counts))
            .expect("valid buckets")
            .install_recorder()
            .unwrap_or_else(|_| {
                // Another recorder is installed (an embedding application's):
                // build one we can still render, though nothing records into it.
                PrometheusBuilder::new().build_recorder().handle()
            })
    })
}

/// Bytes written by the node's database, from RocksDB's statistics.
pub const WRITTEN_METRIC: &str = "drover_rocksdb_written_bytes_total";
/// Key and value bytes put into each table (column family).
pub const PUT_METRIC: &str = "drover_storage_put_bytes_total";

/// Registers every metric family with its help text, so dashboards and alerts
/// see each one (at zero) before its first event.
pub fn register_metrics() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    recorder();
    let counters: &[(&str, &str)] = &[
        ("drover_plan_moves_total", "Partitions this node moved to the cluster plan's voters, as their leader (docs/membership.md)"),
        ("drover_plan_step_failures_total", "Tries to move a partition to the plan's voters that failed and are tried again"),
        (JOB_READS, "Jobs a gateway read from partition leaders (GetJob, and the reads behind OJS's and Zeebe's answers)"),
        ("drover_jobs_total", "Jobs reaching an outcome (created, activated, completed, failed, timed_out, yielded, incident, cancelled), counted by the partition leader"),
        ("drover_gateway_job_stream_push_total", "Jobs a gateway handed to a stream client"),
        ("drover_gateway_job_stream_push_fail_try_total", "Tries to hand a pushed job to a client that was not ready"),
        (
            "drover_gateway_job_stream_handed_back_total",
            "Pushed jobs that never reached a worker, yielded by the gateway at once, by reason: stream_closed (buffered for a client stream that closed) or late (their push was answered after its leader stopped waiting)",
        ),
        ("drover_broker_jobs_pushed_count_total", "Jobs a partition leader pushed to a stream and a client took"),
        ("drover_broker_jobs_push_fail_try_count_total", "Pushed jobs no client could take (code BLOCKED: not ready), yielded"),
        ("drover_gateway_errors_total", "Client requests answered with an error, by gRPC code"),
        ("drover_gateway_jobs_polled_total", "Jobs activated by ActivateJobs"),
        (GRPC_REQUESTS, "Client gRPC requests by method and status code"),
        (OJS_REQUESTS, "Requests on the Open Job Spec HTTP port by route and HTTP status"),
        (OJS_REQUEST_SECONDS, "Time to answer a request on the Open Job Spec HTTP port, by route"),
        (
            CLUSTER_REQUESTS,
            "Requests from other nodes (Raft, forwards, pushes, stream registrations) by method and status code",
        ),
        ("drover_partition_leader_changes_total", "Times this node became leader of a partition"),
        ("drover_raft_snapshots_built_total", "Snapshots built"),
        ("drover_raft_snapshots_installed_total", "Snapshots installed from a leader"),
        ("drover_jobs_pruned_total", "Records of completed and cancelled jobs removed after their retention, by partition"),
        ("drover_raft_entries_appended_total", "Raft log entries appended on this node"),
        ("drover_storage_wal_syncs_total", "WAL syncs (each covers every log append waiting)"),
        (
            WRITTEN_METRIC,
            "Bytes the node's RocksDB wrote, by kind: user (write batches), wal, flush and compaction (table files)",
        ),
        (PUT_METRIC, "Key and value bytes put into each table (column family) of the node's database"),
        ("drover_rocksdb_block_cache_hits_total", "RocksDB block cache lookups that found the block, by kind (filter, index, data)"),
        ("drover_rocksdb_block_cache_misses_total", "RocksDB block cache lookups that read the block from a table file, by kind"),
        (
            "drover_rocksdb_block_cache_loaded_bytes_total",
            "Bytes RocksDB read from table files into the block cache, by kind of block (filter, index, data)",
        ),
        ("drover_malloc_trim_released_bytes_total", "Resident memory handed back to the kernel by heap trims"),
    ];
    for (name, help) in counters {
        describe_counter!(*name, *help);
    }
    metrics::counter!("drover_broker_jobs_push_fail_try_count_total", "code" => "BLOCKED").absolute(0);
    for reason in ["stream_closed", "late"] {
        metrics::counter!("drover_gateway_job_stream_handed_back_total", "reason" => reason).absolute(0);
    }
    for name in [
        "drover_gateway_job_stream_push_total",
        "drover_gateway_job_stream_push_fail_try_total",
        "drover_broker_jobs_pushed_count_total",
        "drover_gateway_jobs_polled_total",
        JOB_READS,
        "drover_storage_wal_syncs_total",
    ] {
        metrics::counter!(name).absolute(0);
    }
    let gauges: &[(&str, &str)] = &[
        ("drover_gateway_job_stream_clients", "Worker streams connected to this gateway"),
        ("drover_gateway_job_stream_streams", "Aggregated streams on this gateway"),
        ("drover_gateway_job_stream_servers", "Brokers this gateway's streams are registered with"),
        ("drover_broker_open_job_stream_count", "Aggregated streams registered with this broker"),
        ("drover_gateway_parked_long_polls", "ActivateJobs requests waiting for jobs"),
        ("drover_jobs_activatable", "Activatable jobs per partition and type (on the leader)"),
        (
            "drover_jobs_unroutable",
            "Activatable jobs no open stream may take, by the labels they require (+) and prefer (~) (on the leader)",
        ),
        ("drover_partition_role_leader", "1 when this node leads the partition"),
        ("drover_partition_has_leader", "1 when this node knows a leader for the partition"),
        ("drover_partition_term", "Raft term of the partition on this node"),
        ("drover_partition_commit_index", "Committed log index of the partition on this node"),
        ("drover_partition_applied_index", "Applied log index of the partition on this node"),
        ("drover_rocksdb_memtable_bytes", "RocksDB memtable size, all column families"),
        ("drover_rocksdb_sst_bytes", "RocksDB SST files size, all column families"),
        ("drover_rocksdb_table_readers_bytes", "RocksDB memory held by open table files outside the block cache"),
        ("drover_rocksdb_block_cache_bytes", "RocksDB block cache in use (one cache for all column families)"),
        ("drover_rocksdb_write_stalled", "1 while RocksDB writes are stopped"),
        ("drover_rocksdb_pending_compaction_bytes", "RocksDB estimated pending compaction bytes"),
        ("drover_storage_wal_syncs", "WAL syncs since start"),
        ("drover_cluster_version", "The data version every member speaks, as this node knows it (docs/upgrades.md)"),
        ("drover_node_data_version", "The data version this node's build writes"),
        ("drover_plan_epoch", "The epoch of the cluster plan this node follows (0: never changed)"),
        ("drover_plan_members", "Members of the cluster plan this node follows"),
        ("drover_plan_partitions_moving", "Partitions whose voters are not yet the plan's target"),
        ("drover_plan_moves_pending", "Replica moves the cluster plan still has to make"),
        ("drover_plan_paused", "1 while the cluster plan's moves are paused"),
        ("drover_partitions", "Partitions new work is routed over (the plan's count in force)"),
        ("drover_plan_partitions_forming", "Partitions being added whose groups have not formed yet"),
        ("drover_storage_appends_synced", "Log appends covered by WAL syncs since start"),
    ];
    for (name, help) in gauges {
        describe_gauge!(*name, *help);
        metrics::gauge!(*name).increment(0.0);
    }
    metrics::gauge!("drover_node_data_version").set(f64::from(crate::codec::DATA_VERSION));
    let histograms: &[(&str, &str)] = &[
        ("drover_create_ack_seconds", "CreateJob received to acknowledged"),
        (
            "drover_plan_move_seconds",
            "A partition's move to the plan's voters, new replicas caught up to voters committed",
        ),
        ("drover_raft_append_to_commit_seconds", "Raft write submitted to committed and applied"),
        ("drover_storage_write_sync_seconds", "One group-commit WAL sync"),
        ("drover_raft_rpc_seconds", "Raft RPCs sent to peers, by rpc, from send to reply"),
        (
            "drover_raft_rpc_handled_seconds",
            "Raft RPCs from peers, by rpc, from receipt to reply (includes the log sync)",
        ),
        ("drover_job_create_to_activate_seconds", "A job's creation to its activation (leader clock)"),
        ("drover_job_activate_to_complete_seconds", "A job's activation to its completion (leader clock)"),
        ("drover_malloc_trim_seconds", "One heap trim (--malloc-trim-ms), the allocator busy throughout"),
    ];
    for (name, help) in histograms {
        describe_histogram!(*name, Unit::Seconds, *help);
    }
    describe_histogram!(
        stages::STAGE_METRIC,
        Unit::Seconds,
        "Where a job's time goes, by stage (gateway_forward, leader_call, leader_queue, raft_write, log_sync, \
         replicate, follower_append, apply, push, append_wait, append_behind); see docs/benchmarks.md"
    );
    describe_histogram!("drover_raft_commands_per_entry", "Commands batched into one Raft entry");
    describe_histogram!("drover_storage_appends_per_sync", "Log appends covered by one WAL sync");
}
