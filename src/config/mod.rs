//! The one place that reads node settings: flags, `DROVER_*` environment
//! variables and an optional TOML file, in that order of precedence, then
//! defaults. Everything else receives a validated [`NodeConfig`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Deserialize;

mod limits;
mod members;

pub use limits::Limits;
use members::{node_id_from_hostname, own_location};
pub use members::{parse_members, parse_members_as};

use crate::core::Retention;
use crate::placement::Location;
use crate::raft::{NodeId, RaftSettings};

/// Settings of `drover serve`. Every flag has an environment variable, and every
/// setting may also come from the TOML file given by `--config` (same names,
/// snake_case: `node_id = 1`, `members = ["0=a:26502", ...]`).
#[derive(clap::Args, Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeArgs {
    /// A TOML file with any of the settings below; flags and environment win.
    #[arg(long, env = "DROVER_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// This node's id, 0..cluster size. With `auto`-like host names such as
    /// `drover-2`, pass `--node-id-from-hostname` instead. [default: 0]
    #[arg(long, env = "DROVER_NODE_ID")]
    pub node_id: Option<u64>,
    /// Take the node id from the number after the last '-' of the host name
    /// (a StatefulSet pod ordinal: `drover-2` is node 2).
    #[arg(long, env = "DROVER_NODE_ID_FROM_HOSTNAME")]
    pub node_id_from_hostname: Option<bool>,
    /// Where the node keeps its RocksDB database. [default: ./data]
    #[arg(long, env = "DROVER_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Client gRPC listen address. [default: 0.0.0.0:26500]
    #[arg(long, env = "DROVER_GRPC_ADDR")]
    pub grpc_addr: Option<String>,
    /// Node-to-node gRPC listen address. [default: 127.0.0.1:26502 for a single
    /// node, 0.0.0.0:26502 when members are given]
    #[arg(long, env = "DROVER_CLUSTER_ADDR")]
    pub cluster_addr: Option<String>,
    /// Admin HTTP listen address (/metrics, /health, /ready, /actuator). [default: 0.0.0.0:9600]
    #[arg(long, env = "DROVER_ADMIN_ADDR")]
    pub admin_addr: Option<String>,
    /// Open Job Spec HTTP listen address (/ojs/v1/..., docs/ojs.md), served with
    /// the gRPC port's TLS and tokens. [default: off]
    #[arg(long, env = "DROVER_OJS_ADDR")]
    pub ojs_addr: Option<String>,
    /// For running the Open Job Spec conformance suite only: an OJS
    /// heartbeat answers the `quiet` or `terminate` that a held job's
    /// `options.metadata.test_directive` names, as the suite's worker cases
    /// ask. It lets a job's payload direct its worker, so it is refused with
    /// tokens on (docs/ojs.md). [default: false]
    #[arg(long, env = "DROVER_OJS_TEST_DIRECTIVES", num_args = 0..=1, default_missing_value = "true")]
    pub ojs_test_directives: Option<bool>,
    /// Every member's node-to-node address as ID=HOST:PORT, comma separated, the
    /// same list on every node. Each may end in @REGION/ZONE (or @REGION),
    /// for all members or none: replicas are then placed over zones and
    /// regions, and jobs routed by region (docs/regions.md). [default: this
    /// node alone]
    #[arg(long, env = "DROVER_MEMBERS", value_delimiter = ',')]
    pub members: Option<Vec<String>>,
    /// On an empty data directory, join the existing cluster instead of
    /// forming it: each partition's leader copies it here. For re-seeding a
    /// node that lost its data (docs/operations.md); ignored once the node
    /// has formed or joined. [default: false]
    #[arg(long, env = "DROVER_JOIN_EXISTING", num_args = 0..=1, default_missing_value = "true")]
    pub join_existing: Option<bool>,
    /// Start as a node being added to a running cluster (`drover cluster
    /// add-node`, or `replace-node` for one whose disk is lost): it hosts
    /// nothing until the cluster plan places replicas here, and learns the
    /// plan from the members listed in --members (docs/membership.md).
    /// Ignored once the node follows a plan. [default: false]
    #[arg(long, env = "DROVER_JOIN_PLAN", num_args = 0..=1, default_missing_value = "true")]
    pub join_plan: Option<bool>,
    /// A node whose id is not in --members starts as with --join-plan
    /// instead of refusing (a StatefulSet's pods beyond the size the
    /// cluster formed with). [default: false]
    #[arg(long, env = "DROVER_JOIN_IF_UNLISTED", num_args = 0..=1, default_missing_value = "true")]
    pub join_if_unlisted: Option<bool>,
    /// Partitions in the cluster; fixed when the cluster first forms. [default: 1]
    #[arg(long, env = "DROVER_PARTITIONS")]
    pub partitions: Option<u32>,
    /// This node's region, such as eu-west-1: its gateways' streams are
    /// "near" the partitions it leads, and Zeebe workers connected here get
    /// the label region:REGION. [default: its member entry's, or none]
    #[arg(long, env = "DROVER_REGION")]
    pub region: Option<String>,
    /// This node's zone within its region. [default: its member entry's, or none]
    #[arg(long, env = "DROVER_ZONE")]
    pub zone: Option<String>,
    /// Regions partitions prefer their leader in, comma separated: a leader
    /// elsewhere hands leadership to a caught-up replica in one of them.
    /// [default: none, any replica may lead]
    #[arg(long, env = "DROVER_LEADER_REGIONS", value_delimiter = ',')]
    pub leader_regions: Option<Vec<String>>,
    /// Move each partition's leadership to its preferred replica (one per
    /// partition, spread evenly over the nodes, in a leader region if any is
    /// set) once that replica has caught up, as Kafka's preferred-leader
    /// election does: after a restart or a failover leadership comes back,
    /// so no node ends up doing every leader's work. `false`: leadership
    /// stays where elections put it (leader regions still apply).
    /// [default: true]
    #[arg(long, env = "DROVER_BALANCE_LEADERS", num_args = 0..=1, default_missing_value = "true")]
    pub balance_leaders: Option<bool>,
    /// Raft timing preset: `lan` (heartbeat 250 ms, election timeout
    /// 600-1200 ms) or `wan` (heartbeat 500 ms, election timeout 2500-5000
    /// ms, for round trips up to about 150 ms); --heartbeat-ms and
    /// --election-timeout-ms override it. [default: lan]
    #[arg(long, env = "DROVER_NETWORK_PROFILE")]
    pub network_profile: Option<String>,
    /// Where a create without an idempotency key goes: `local`, a partition
    /// this node leads (round-robin among them; all partitions when it leads
    /// none), which saves a forward to another node; or `round-robin` over
    /// all partitions, which spreads one client's jobs over every partition
    /// even when it reaches a single gateway (one pinned connection behind a
    /// load balancer). [default: local]
    #[arg(long, env = "DROVER_CREATE_PLACEMENT")]
    pub create_placement: Option<String>,
    /// Which stream a partition leader pushes activated jobs to: `random`,
    /// one picked at random among those that may take them and have room, so
    /// jobs spread evenly over the gateways' workers; or `local`: the stream
    /// picked at random is swapped for one on this node's own gateway that
    /// takes the same jobs (tenants, labels) and has room, if any, which saves a request between nodes per push and
    /// another per completion reported elsewhere, at the price of jobs
    /// following partition leadership: workers on a gateway whose node leads
    /// no partition get jobs only when the others' streams are full.
    /// [default: random]
    #[arg(long, env = "DROVER_PUSH_PLACEMENT")]
    pub push_placement: Option<String>,
    /// Replicas per partition; fixed when the cluster first forms. [default: 1,
    /// or min(3, members) when members are given]
    #[arg(long, env = "DROVER_REPLICATION_FACTOR")]
    pub replication_factor: Option<u32>,
    /// Largest variables + custom headers of one job, in bytes. Every message
    /// limit follows from it: requests up to this + 1 MiB, node-to-node
    /// messages and replies up to 4 times that (at least 64 MiB); give every
    /// node the same value. [default: 4194304]
    #[arg(long, env = "DROVER_MAX_PAYLOAD_BYTES")]
    pub max_payload_bytes: Option<usize>,
    /// The long poll of a Zeebe client's ActivateJobs that asks for the
    /// default (requestTimeout 0), in ms; below 20000, which some Zeebe
    /// clients take for a dead call. [default: 10000]
    #[arg(long, env = "DROVER_ZEEBE_LONG_POLL_MS")]
    pub zeebe_long_poll_ms: Option<i64>,
    /// Deadline of a request that carries none, in ms. [default: 10000]
    #[arg(long, env = "DROVER_REQUEST_TIMEOUT_MS")]
    pub request_timeout_ms: Option<u64>,
    /// How often the node hands heap memory it has freed back to the kernel
    /// (a purge of every jemalloc arena; glibc's `malloc_trim` in a build
    /// without jemalloc), in ms; 0: never. Lowers resident memory between
    /// RocksDB flushes, not its peaks; each trim holds the allocator for up
    /// to tens of ms (docs/benchmarks.md). [default: 0]
    #[arg(long, env = "DROVER_MALLOC_TRIM_MS")]
    pub malloc_trim_ms: Option<u64>,
    /// RocksDB's memtables, all column families together, in MiB (at least
    /// 4); past it the largest is flushed. [default: 64]
    #[arg(long, env = "DROVER_MEMTABLE_MIB")]
    pub memtable_mib: Option<usize>,
    /// RocksDB's block cache in MiB. [default: 32]
    #[arg(long, env = "DROVER_BLOCK_CACHE_MIB")]
    pub block_cache_mib: Option<usize>,
    /// Raft heartbeat interval in ms; also how long a follower has to answer
    /// an append (its disk sync included), so keep it above the worst round
    /// trip between nodes. [default: 250]
    #[arg(long, env = "DROVER_HEARTBEAT_MS")]
    pub heartbeat_ms: Option<u64>,
    /// Minimum Raft election timeout in ms (the maximum is twice it). [default: 600]
    #[arg(long, env = "DROVER_ELECTION_TIMEOUT_MS")]
    pub election_timeout_ms: Option<u64>,
    /// Raft entries applied between snapshots. [default: 20000]
    #[arg(long, env = "DROVER_SNAPSHOT_EVERY")]
    pub snapshot_every: Option<u64>,
    /// Raft log entries kept behind a snapshot, for followers slightly behind;
    /// followers further behind get the snapshot. [default: 5000]
    #[arg(long, env = "DROVER_LOG_KEEP_AFTER_SNAPSHOT")]
    pub log_keep_after_snapshot: Option<u64>,
    /// How long completed and cancelled jobs stay readable, in seconds. [default: 600]
    #[arg(long, env = "DROVER_FINISHED_RETENTION_SECS")]
    pub finished_retention_secs: Option<u64>,
    /// At most this many completed and cancelled jobs are kept per partition;
    /// the oldest go first. [default: 100000]
    #[arg(long, env = "DROVER_FINISHED_RETENTION_JOBS")]
    pub finished_retention_jobs: Option<u64>,
    /// How long a partition remembers a create that carried no idempotency
    /// key, in seconds, so a gateway that re-sends it after a failover finds
    /// the first job; gateways re-send for at most a third of it. [default: 30]
    #[arg(long, env = "DROVER_REQUEST_DEDUPE_WINDOW_SECS")]
    pub request_dedupe_window_secs: Option<u64>,
    /// How long an idempotency key names its job, in seconds. [default: 86400]
    #[arg(long, env = "DROVER_IDEMPOTENCY_WINDOW_SECS")]
    pub idempotency_window_secs: Option<u64>,
    /// How long a node keeps its staged parts of a backup that no `drover
    /// backup create` read to the end and released (it died), in seconds.
    /// [default: 21600]
    #[arg(long, env = "DROVER_BACKUP_STAGED_TTL_SECS")]
    pub backup_staged_ttl_secs: Option<u64>,
    /// The most creates one partition remembers for de-duplication
    /// (idempotency keys, and creates a gateway may re-send). A create with a
    /// new idempotency key past it is RESOURCE_EXHAUSTED until older ones
    /// expire; a repeat of a remembered key is answered as always, and
    /// creates without a key go on. [default: 1000000]
    #[arg(long, env = "DROVER_IDEMPOTENCY_MAX_KEYS")]
    pub idempotency_max_keys: Option<u64>,
    /// The most idempotency keys of one tenant one partition remembers: its
    /// share of --idempotency-max-keys, so one tenant's keys cannot use the
    /// whole table up. [default: --idempotency-max-keys]
    #[arg(long, env = "DROVER_IDEMPOTENCY_MAX_KEYS_PER_TENANT")]
    pub idempotency_max_keys_per_tenant: Option<u64>,
    /// Log lines: `text` or `json`. Filter with RUST_LOG. [default: text]
    #[arg(long, env = "DROVER_LOG_FORMAT")]
    pub log_format: Option<String>,
    /// OTLP/gRPC endpoint for traces; none are exported when unset.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// PEM certificate (chain) of the client gRPC port; with --tls-key, the
    /// port serves TLS only. Reloaded when the file changes.
    #[arg(long, env = "DROVER_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the client gRPC port.
    #[arg(long, env = "DROVER_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM certificate of the admin HTTP port. [default: --tls-cert's]
    #[arg(long, env = "DROVER_ADMIN_TLS_CERT")]
    pub admin_tls_cert: Option<PathBuf>,
    /// PEM private key of the admin HTTP port. [default: --tls-key's]
    #[arg(long, env = "DROVER_ADMIN_TLS_KEY")]
    pub admin_tls_key: Option<PathBuf>,
    /// PEM certificate of the cluster port, which this node also presents
    /// to its peers; needs --cluster-tls-key and --cluster-tls-ca.
    #[arg(long, env = "DROVER_CLUSTER_TLS_CERT")]
    pub cluster_tls_cert: Option<PathBuf>,
    /// PEM private key of the cluster port.
    #[arg(long, env = "DROVER_CLUSTER_TLS_KEY")]
    pub cluster_tls_key: Option<PathBuf>,
    /// PEM certificate of the cluster CA: peers must present a certificate
    /// it signed (mutual TLS), and this node trusts no other for its peers.
    #[arg(long, env = "DROVER_CLUSTER_TLS_CA")]
    pub cluster_tls_ca: Option<PathBuf>,
    /// TOML file of bearer tokens (`[[token]]` with name, sha256 of the
    /// secret, scopes, tenants); reloaded when it changes. With it or
    /// --jwks-file, every client request needs a token.
    #[arg(long, env = "DROVER_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// JWK set (RS256 or ES256 keys) that JWTs are verified with; reloaded
    /// when it changes. Needs --jwt-issuer.
    #[arg(long, env = "DROVER_JWKS_FILE")]
    pub jwks_file: Option<PathBuf>,
    /// An accepted JWT issuer (`iss`); several are comma separated.
    #[arg(long, env = "DROVER_JWT_ISSUERS", value_delimiter = ',')]
    pub jwt_issuer: Option<Vec<String>>,
    /// When set, a JWT's audience (`aud`) must include it.
    #[arg(long, env = "DROVER_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
    /// With tokens on: calls one principal may start per second on a node
    /// (a stream counts once); past it, RESOURCE_EXHAUSTED. 0: no limit. [default: 0]
    #[arg(long, env = "DROVER_PRINCIPAL_REQUESTS_PER_SECOND")]
    pub principal_requests_per_second: Option<u32>,
    /// With tokens on: job streams one principal may hold open on a node;
    /// past it, RESOURCE_EXHAUSTED. 0: no limit. [default: 1000]
    #[arg(long, env = "DROVER_PRINCIPAL_STREAMS")]
    pub principal_streams: Option<u32>,
    /// With tokens on: a file holding the secret (32 characters or more,
    /// the same on every node) that job tokens are signed with; each
    /// activation then carries a token for that job and attempt alone.
    #[arg(long, env = "DROVER_JOB_TOKEN_KEY")]
    pub job_token_key: Option<PathBuf>,
}

/// TLS on each port; `None`: plaintext.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub grpc: Option<crate::tls::TlsFiles>,
    pub admin: Option<crate::tls::TlsFiles>,
    /// Always with `client_ca`: the cluster port is mutual TLS.
    pub cluster: Option<crate::tls::TlsFiles>,
}

/// A certificate and key given together, or neither.
fn tls_pair(
    what: &str,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
) -> anyhow::Result<Option<crate::tls::TlsFiles>> {
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(crate::tls::TlsFiles { cert, key, client_ca })),
        (None, None) => Ok(None),
        (Some(_), None) => bail!("{what}: a TLS certificate was given without its key"),
        (None, Some(_)) => bail!("{what}: a TLS key was given without its certificate"),
    }
}

/// Zeebe clients give up on a long poll that takes 20 s or more.
const MAX_ZEEBE_LONG_POLL_MS: i64 = 20_000;

/// How long partitions remember creates, so that repeats find the first job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DedupeWindows {
    /// Creates without an idempotency key, identified by their gateway.
    pub request: Duration,
    /// Creates with an idempotency key.
    pub idempotency: Duration,
    /// Entries one partition's table holds at most.
    pub max_keys: u64,
    /// Idempotency keys of one tenant one partition's table holds at most.
    pub max_keys_per_tenant: u64,
}

impl Default for DedupeWindows {
    fn default() -> Self {
        DedupeWindows {
            request: Duration::from_secs(30),
            idempotency: Duration::from_secs(24 * 3600),
            max_keys: 1_000_000,
            max_keys_per_tenant: 1_000_000,
        }
    }
}

/// A node's validated settings.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub node_id: NodeId,
    pub data_dir: PathBuf,
    pub grpc_addr: SocketAddr,
    pub cluster_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// Where the OJS HTTP binding listens; `None`: not served.
    pub ojs_addr: Option<SocketAddr>,
    /// Whether OJS heartbeats answer the conformance suite's test
    /// directives (`--ojs-test-directives`; never with tokens on).
    pub ojs_test_directives: bool,
    /// Node id -> node-to-node address. Empty: this node alone, at its bound
    /// cluster address.
    pub members: BTreeMap<NodeId, String>,
    /// Node id -> location, from the member list; empty locations when it
    /// names none.
    pub locations: BTreeMap<NodeId, Location>,
    /// This node's location.
    pub location: Location,
    /// Regions partitions prefer their leaders in (empty: any).
    pub leader_regions: Vec<String>,
    /// Leadership moves to each partition's preferred replica
    /// ([`crate::placement::preferred_leaders`]).
    pub balance_leaders: bool,
    /// Creates without an idempotency key go to a partition this node leads
    /// (true) or round-robin over all partitions (false).
    pub local_creates: bool,
    /// Partition leaders push to a stream on this node's gateway when one
    /// may take the jobs (true), or pick among all at random (false).
    pub local_pushes: bool,
    /// Join the existing cluster instead of forming it, if the data directory
    /// has formed nothing yet (see [`crate::raft::Formation`]).
    pub join_existing: bool,
    /// A node being added to a running cluster: it hosts what the cluster
    /// plan places on it ([`crate::core::ClusterPlan`]).
    pub join_plan: bool,
    pub partitions: u32,
    pub replication_factor: u32,
    pub limits: Limits,
    pub request_timeout: Duration,
    /// How often `drover serve` trims the process's heap; `None`: never.
    /// Process-wide, so [`crate::node::Node::start`] does not act on it.
    pub malloc_trim: Option<Duration>,
    pub storage_memory: crate::storage::MemoryBudget,
    pub raft: RaftSettings,
    /// Stamped by this node's partition leaders on the entries they write.
    pub retention: Retention,
    pub dedupe: DedupeWindows,
    /// How long a staged backup part nobody released is kept.
    pub backup_staged_ttl: Duration,
    pub log_format: String,
    pub otlp_endpoint: Option<String>,
    pub tls: TlsSettings,
    pub auth: crate::auth::AuthSettings,
}

impl NodeConfig {
    /// A single node on loopback with ephemeral ports; for tests and benches.
    pub fn local(data_dir: PathBuf) -> NodeConfig {
        NodeConfig {
            node_id: 0,
            data_dir,
            grpc_addr: "127.0.0.1:0".parse().expect("literal"),
            cluster_addr: "127.0.0.1:0".parse().expect("literal"),
            admin_addr: "127.0.0.1:0".parse().expect("literal"),
            ojs_addr: None,
            ojs_test_directives: false,
            members: BTreeMap::new(),
            locations: BTreeMap::new(),
            location: Location::default(),
            leader_regions: Vec::new(),
            balance_leaders: true,
            local_creates: true,
            local_pushes: false,
            join_existing: false,
            join_plan: false,
            partitions: 1,
            replication_factor: 1,
            limits: Limits::default(),
            request_timeout: Duration::from_secs(10),
            malloc_trim: None,
            storage_memory: Default::default(),
            raft: RaftSettings::default(),
            retention: Retention::default(),
            dedupe: DedupeWindows::default(),
            backup_staged_ttl: Duration::from_secs(6 * 3600),
            log_format: "text".into(),
            otlp_endpoint: None,
            tls: TlsSettings::default(),
            auth: crate::auth::AuthSettings::default(),
        }
    }
}

fn parse_addr(name: &str, value: &str) -> anyhow::Result<SocketAddr> {
    value.parse().with_context(|| format!("{name} {value:?} is not an address like 0.0.0.0:26500"))
}

impl ServeArgs {
    /// Merges flags/environment over the file over defaults, and validates.
    pub fn resolve(self) -> anyhow::Result<NodeConfig> {
        let file: ServeArgs = match &self.config {
            Some(path) => {
                let text =
                    std::fs::read_to_string(path).with_context(|| format!("reading config file {}", path.display()))?;
                toml::from_str(&text).with_context(|| format!("parsing config file {}", path.display()))?
            }
            None => ServeArgs::default(),
        };
        macro_rules! pick {
            ($field:ident) => {
                self.$field.clone().or(file.$field.clone())
            };
        }
        let node_id = match (pick!(node_id), pick!(node_id_from_hostname).unwrap_or(false)) {
            (Some(id), _) => id,
            (None, true) => node_id_from_hostname()?,
            (None, false) => 0,
        };
        let listed = members::lists(&pick!(members).unwrap_or_default(), node_id);
        let join_plan = pick!(join_plan).unwrap_or(false) || (!listed && pick!(join_if_unlisted).unwrap_or(false));
        let (members, locations) = members::parse_members_as(&pick!(members).unwrap_or_default(), join_plan)?;
        if !members.is_empty() && !members.contains_key(&node_id) && !join_plan {
            bail!(
                "node id {node_id} is not in the member list (ids {:?}); give every node the same list and its own id",
                members.keys().collect::<Vec<_>>()
            );
        }
        let clustered = !members.is_empty();
        let default_cluster = if clustered { "0.0.0.0:26502" } else { "127.0.0.1:26502" };
        let partitions = pick!(partitions).unwrap_or(1);
        let replication_factor =
            pick!(replication_factor).unwrap_or(if clustered { members.len().min(3) as u32 } else { 1 });
        if partitions == 0 || partitions > crate::core::MAX_PARTITIONS {
            bail!("partitions must be between 1 and {}, got {partitions}", crate::core::MAX_PARTITIONS);
        }
        let cluster_size = members.len().max(1) as u32;
        if replication_factor == 0 || replication_factor > cluster_size {
            bail!(
                "replication factor must be between 1 and the cluster size ({cluster_size}), got {replication_factor}"
            );
        }
        let location = own_location(locations.get(&node_id), pick!(region), pick!(zone))?;
        let local_creates = match pick!(create_placement).as_deref() {
            None | Some("local") => true,
            Some("round-robin") => false,
            Some(other) => bail!("--create-placement {other:?} is not `local` or `round-robin`"),
        };
        let local_pushes = match pick!(push_placement).as_deref() {
            None | Some("random") => false,
            Some("local") => true,
            Some(other) => bail!("--push-placement {other:?} is not `random` or `local`"),
        };
        let leader_regions = pick!(leader_regions).unwrap_or_default();
        if let Some(region) = leader_regions.iter().find(|r| !locations.values().any(|l| l.region == **r)) {
            if !locations.is_empty() {
                bail!("leader region {region:?} is no member's region (member entries name their @REGION/ZONE)");
            }
        }
        let defaults = match pick!(network_profile).as_deref() {
            None | Some("lan") => RaftSettings::default(),
            Some("wan") => RaftSettings::wan(),
            Some(other) => bail!("network profile must be lan or wan, got {other:?}"),
        };
        let raft = RaftSettings {
            heartbeat_interval: pick!(heartbeat_ms).map(Duration::from_millis).unwrap_or(defaults.heartbeat_interval),
            election_timeout_min: pick!(election_timeout_ms)
                .map(Duration::from_millis)
                .unwrap_or(defaults.election_timeout_min),
            snapshot_every: pick!(snapshot_every).unwrap_or(defaults.snapshot_every),
            keep_after_snapshot: pick!(log_keep_after_snapshot).unwrap_or(defaults.keep_after_snapshot),
            ..defaults
        };
        if raft.election_timeout_min <= raft.heartbeat_interval * 2 {
            bail!("the election timeout must be more than twice the heartbeat interval");
        }
        let ojs_test_directives = pick!(ojs_test_directives).unwrap_or(false);
        if ojs_test_directives && (pick!(tokens_file).is_some() || pick!(jwks_file).is_some()) {
            bail!(
                "--ojs-test-directives lets a job's payload direct the worker that holds it: it is for running the \
                 OJS conformance suite on a node of its own, and is refused with tokens on"
            );
        }
        let mut limits = Limits::default();
        if let Some(max) = pick!(max_payload_bytes) {
            limits.max_payload_bytes = max;
        }
        if let Some(ms) = pick!(zeebe_long_poll_ms) {
            if !(1..MAX_ZEEBE_LONG_POLL_MS).contains(&ms) {
                bail!("the Zeebe long poll must be between 1 and {} ms, got {ms}", MAX_ZEEBE_LONG_POLL_MS - 1);
            }
            limits.zeebe_long_poll_ms = ms;
        }
        let mut retention = Retention::default();
        if let Some(secs) = pick!(finished_retention_secs) {
            retention.max_age_ms = i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX);
        }
        if let Some(jobs) = pick!(finished_retention_jobs) {
            retention.max_jobs = jobs;
        }
        let mut storage_memory = crate::storage::MemoryBudget::default();
        if let Some(mib) = pick!(memtable_mib) {
            if mib < 4 {
                bail!("--memtable-mib must be at least 4 (MiB), not {mib}");
            }
            storage_memory.memtables = mib << 20;
        }
        if let Some(mib) = pick!(block_cache_mib) {
            storage_memory.block_cache = mib << 20;
        }
        let mut dedupe = DedupeWindows::default();
        if let Some(secs) = pick!(request_dedupe_window_secs) {
            if secs < 3 {
                bail!("the request dedupe window must be at least 3 s (gateways re-send creates for a third of it)");
            }
            dedupe.request = Duration::from_secs(secs);
        }
        if let Some(secs) = pick!(idempotency_window_secs) {
            if secs < 60 {
                bail!("the idempotency window must be at least 60 s");
            }
            dedupe.idempotency = Duration::from_secs(secs);
        }
        if let Some(keys) = pick!(idempotency_max_keys) {
            if keys == 0 {
                bail!(
                    "--idempotency-max-keys must be at least 1: a partition that remembers no create cannot take one"
                );
            }
            dedupe.max_keys = keys;
        }
        dedupe.max_keys_per_tenant = pick!(idempotency_max_keys_per_tenant).unwrap_or(dedupe.max_keys);
        if dedupe.max_keys_per_tenant == 0 || dedupe.max_keys_per_tenant > dedupe.max_keys {
            bail!(
                "--idempotency-max-keys-per-tenant must be between 1 and --idempotency-max-keys ({}), not {}",
                dedupe.max_keys,
                dedupe.max_keys_per_tenant
            );
        }
        let backup_staged_ttl = match pick!(backup_staged_ttl_secs) {
            Some(secs) if secs < 60 => {
                bail!("--backup-staged-ttl-secs must be at least 60: a backup reads its parts after staging them")
            }
            Some(secs) => Duration::from_secs(secs),
            None => Duration::from_secs(6 * 3600),
        };
        let log_format = pick!(log_format).unwrap_or_else(|| "text".into());
        if log_format != "text" && log_format != "json" {
            bail!("log format must be text or json, got {log_format:?}");
        }
        let grpc_tls = tls_pair("the client gRPC port", pick!(tls_cert), pick!(tls_key), None)?;
        let admin_tls = match tls_pair("the admin port", pick!(admin_tls_cert), pick!(admin_tls_key), None)? {
            Some(files) => Some(files),
            None => grpc_tls.clone(),
        };
        let cluster_ca = pick!(cluster_tls_ca);
        let cluster_tls =
            tls_pair("the cluster port", pick!(cluster_tls_cert), pick!(cluster_tls_key), cluster_ca.clone())?;
        match (&cluster_tls, cluster_ca) {
            (Some(_), None) => bail!("the cluster port's TLS needs --cluster-tls-ca: peers are verified against it"),
            (None, Some(_)) => bail!("--cluster-tls-ca was given without --cluster-tls-cert and --cluster-tls-key"),
            _ => {}
        }
        Ok(NodeConfig {
            node_id,
            data_dir: pick!(data_dir).unwrap_or_else(|| PathBuf::from("./data")),
            grpc_addr: parse_addr("grpc address", &pick!(grpc_addr).unwrap_or_else(|| "0.0.0.0:26500".into()))?,
            cluster_addr: parse_addr(
                "cluster address",
                &pick!(cluster_addr).unwrap_or_else(|| default_cluster.into()),
            )?,
            admin_addr: parse_addr("admin address", &pick!(admin_addr).unwrap_or_else(|| "0.0.0.0:9600".into()))?,
            ojs_addr: pick!(ojs_addr).map(|addr| parse_addr("OJS address", &addr)).transpose()?,
            ojs_test_directives,
            members,
            locations,
            location,
            leader_regions,
            balance_leaders: pick!(balance_leaders).unwrap_or(true),
            local_creates,
            local_pushes,
            join_existing: pick!(join_existing).unwrap_or(false),
            join_plan,
            partitions,
            replication_factor,
            limits,
            request_timeout: Duration::from_millis(pick!(request_timeout_ms).unwrap_or(10_000)),
            malloc_trim: Some(pick!(malloc_trim_ms).unwrap_or(0)).filter(|ms| *ms > 0).map(Duration::from_millis),
            storage_memory,
            raft,
            retention,
            dedupe,
            backup_staged_ttl,
            log_format,
            otlp_endpoint: pick!(otlp_endpoint).filter(|e| !e.is_empty()),
            tls: TlsSettings { grpc: grpc_tls, admin: admin_tls, cluster: cluster_tls },
            auth: crate::auth::AuthSettings {
                tokens_file: pick!(tokens_file),
                jwks_file: pick!(jwks_file),
                jwt_issuers: pick!(jwt_issuer).unwrap_or_default().into_iter().filter(|i| !i.is_empty()).collect(),
                jwt_audience: pick!(jwt_audience).filter(|a| !a.is_empty()),
                requests_per_second: pick!(principal_requests_per_second).unwrap_or(0),
                streams: pick!(principal_streams).unwrap_or(1000),
                job_token_key: pick!(job_token_key),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_must_be_dense_and_well_formed() {
        assert!(parse_members(&["0=a:1".into(), "1=b:2".into()]).is_ok());
        let (_, locations) = parse_members(&["0=a:1@eu/a".into(), "1=b:2@us".into()]).unwrap();
        assert_eq!((locations[&0].region.as_str(), locations[&0].zone.as_str()), ("eu", "a"));
        assert_eq!(locations[&1].region, "us");
        assert!(parse_members(&["0=a:1@eu/a".into(), "1=b:2".into()]).is_err(), "all or none");
        assert!(parse_members(&["0=a:1".into(), "2=b:2".into()]).is_err());
        assert!(parse_members(&["a:1".into()]).is_err());
        assert!(parse_members(&["0=a:1".into(), "0=b:2".into()]).is_err());
    }

    #[test]
    fn create_placement_is_local_unless_round_robin_is_asked_for() {
        assert!(ServeArgs::default().resolve().unwrap().local_creates);
        let args = ServeArgs { create_placement: Some("round-robin".into()), ..Default::default() };
        assert!(!args.resolve().unwrap().local_creates);
        let args = ServeArgs { create_placement: Some("nearest".into()), ..Default::default() };
        assert!(args.resolve().unwrap_err().to_string().contains("not `local` or `round-robin`"));
    }

    #[test]
    fn push_placement_is_random_unless_local_is_asked_for() {
        assert!(!ServeArgs::default().resolve().unwrap().local_pushes);
        let args = ServeArgs { push_placement: Some("local".into()), ..Default::default() };
        assert!(args.resolve().unwrap().local_pushes);
        let args = ServeArgs { push_placement: Some("nearest".into()), ..Default::default() };
        assert!(args.resolve().unwrap_err().to_string().contains("not `random` or `local`"));
    }

    #[test]
    fn ojs_test_directives_are_off_by_default_and_refused_with_tokens() {
        assert!(!ServeArgs::default().resolve().unwrap().ojs_test_directives);
        let args = ServeArgs { ojs_test_directives: Some(true), ..Default::default() };
        assert!(args.resolve().unwrap().ojs_test_directives);
        let args = ServeArgs {
            ojs_test_directives: Some(true),
            tokens_file: Some("tokens.toml".into()),
            ..Default::default()
        };
        let error = args.resolve().unwrap_err().to_string();
        assert!(error.contains("refused with tokens on"), "{error}");
    }

    #[test]
    fn unknown_node_id_is_refused() {
        let args = ServeArgs { node_id: Some(5), members: Some(vec!["0=a:1".into()]), ..Default::default() };
        let error = args.resolve().unwrap_err().to_string();
        assert!(error.contains("not in the member list"), "{error}");
    }

    #[test]
    fn flags_win_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("drover.toml");
        std::fs::write(&path, "partitions = 4\ngrpc_addr = \"127.0.0.1:1\"\n").unwrap();
        let args = ServeArgs { config: Some(path), partitions: Some(2), ..Default::default() };
        let config = args.resolve().unwrap();
        assert_eq!(config.partitions, 2);
        assert_eq!(config.grpc_addr.port(), 1);
    }

    #[test]
    fn memory_settings_have_defaults_bounds_and_a_file_form() {
        let config = ServeArgs::default().resolve().unwrap();
        assert_eq!(config.storage_memory, crate::storage::MemoryBudget::default());
        assert_eq!(config.malloc_trim, None, "the heap trim is off unless asked for");
        let error = ServeArgs { memtable_mib: Some(2), ..Default::default() }.resolve().unwrap_err().to_string();
        assert!(error.contains("at least 4"), "{error}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("drover.toml");
        std::fs::write(&path, "memtable_mib = 24\nblock_cache_mib = 8\nmalloc_trim_ms = 5000\n").unwrap();
        let config = ServeArgs { config: Some(path), ..Default::default() }.resolve().unwrap();
        assert_eq!(config.storage_memory.memtables, 24 << 20);
        assert_eq!(config.storage_memory.block_cache, 8 << 20);
        assert_eq!(config.malloc_trim, Some(Duration::from_secs(5)));
    }
}
