//! A running node: the wiring of storage, partition replicas, leader actors,
//! the gateway, the cluster service and the admin HTTP server, and its orderly
//! shutdown. What the running parts share is [`crate::context::NodeContext`];
//! this module only puts it together, starts the servers and loops around
//! it, and stops them.

pub mod data_dir;
mod membership;
mod supervisor;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use crate::context::NodeContext;

use crate::config::NodeConfig;
use crate::proto::cluster::cluster_server::ClusterServer;
use crate::proto::gateway::gateway_server::GatewayServer;
use crate::proto::zeebe::gateway_server::GatewayServer as ZeebeServer;
use crate::raft::{Formation, PeerChannels, Replica};
use crate::storage::Store;
use crate::tasks::named;
use tonic::codec::CompressionEncoding;
use tonic::server::NamedService;
use tower::Layer as _;

/// The longest a stopping node spends handing its partitions' leadership over.
const HAND_OVER_LIMIT: Duration = Duration::from_secs(3);
/// Calls a peer cancelled before this node took them, at most, before the
/// cluster port closes the peer's connection. HTTP/2's default (20) guards
/// against "rapid reset" floods from strangers; peers legitimately cancel
/// every call that times out, and a node that was frozen (SIGSTOP, a VM
/// pause) or cut off reads them all at once when it comes back. Closing the
/// connection then failed every other call on it: Raft appends, and pushes
/// whose outcome stayed unknown until the jobs' activation timeout. A freeze
/// long enough for a peer to pile up more than this is past the peers'
/// keepalive (about 10 s), which drops the connection anyway. Each waiting
/// stream holds its request headers, so the bound matters on a port strangers
/// can reach: keep the cluster port private or behind mutual TLS.
const PEER_RESET_STREAMS: usize = 1_000;

/// A started node. Drop does not stop it; call [`Node::shutdown`].
pub struct Node {
    pub ctx: Arc<NodeContext>,
    pub grpc_addr: SocketAddr,
    pub cluster_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// The OJS HTTP port, when served.
    pub ojs_addr: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
    background: Vec<JoinHandle<()>>,
    cluster_stop: watch::Sender<bool>,
    cluster_server: JoinHandle<()>,
    /// The leadership loops of replicas the cluster plan opened.
    plan_loops: Arc<std::sync::Mutex<std::collections::BTreeMap<crate::core::PartitionId, JoinHandle<()>>>>,
}

/// Where a node's partitions are: the members, which nodes host each
/// partition, and what the data directory records of it. `cluster_addr` is
/// this node's own address when no members are given.
pub struct Layout {
    pub members: std::collections::BTreeMap<crate::core::NodeId, String>,
    pub placement: Vec<Vec<crate::core::NodeId>>,
    pub identity: data_dir::Identity,
}

impl Layout {
    pub fn of(config: &NodeConfig, cluster_addr: &str) -> Layout {
        Self::planned(config, cluster_addr, None)
    }

    /// The layout under the cluster plan this node last followed, if any:
    /// its members and placement; or, for a node being added that follows
    /// none yet, no replica here (each partition's other members are where
    /// it looks for the plan and the leaders).
    pub fn planned(config: &NodeConfig, cluster_addr: &str, plan: Option<&crate::core::ClusterPlan>) -> Layout {
        let mut members = config.members.clone();
        if members.is_empty() {
            members.insert(config.node_id, cluster_addr.to_string());
        }
        let identity = |members: &std::collections::BTreeMap<_, _>, placement: &[Vec<_>]| {
            let locations: std::collections::BTreeMap<_, _> =
                members.keys().map(|n| (*n, config.locations.get(n).cloned().unwrap_or_default())).collect();
            data_dir::Identity {
                node_id: config.node_id,
                partitions: config.partitions,
                replication_factor: config.replication_factor,
                cluster_size: members.len() as u32,
                placement: crate::placement::digest(placement, &locations),
            }
        };
        if let Some(plan) = plan {
            let members = plan.members.iter().map(|(n, m)| (*n, m.addr.clone())).collect();
            let placement = plan.placement();
            let identity = identity(&members, &placement);
            return Layout { members, placement, identity };
        }
        if config.join_plan {
            // Not listed (a pod beyond the size the cluster formed with):
            // its own entry is only for itself; peers learn its address
            // from the plan.
            members.entry(config.node_id).or_insert_with(|| cluster_addr.to_string());
            let others: Vec<_> = members.keys().copied().filter(|n| *n != config.node_id).collect();
            let placement = vec![others; config.partitions as usize];
            let identity = identity(&members, &placement);
            return Layout { members, placement, identity };
        }
        let locations: std::collections::BTreeMap<_, _> =
            members.keys().map(|n| (*n, config.locations.get(n).cloned().unwrap_or_default())).collect();
        let placement = crate::placement::place(config.partitions, config.replication_factor, &locations);
        let identity = data_dir::Identity {
            node_id: config.node_id,
            partitions: config.partitions,
            replication_factor: config.replication_factor,
            cluster_size: members.len() as u32,
            placement: crate::placement::digest(&placement, &locations),
        };
        Layout { members, placement, identity }
    }
}

impl Node {
    pub async fn start(config: NodeConfig) -> anyhow::Result<Node> {
        // Before anything records: a counter bumped before the recorder is
        // installed (a leader elected during start-up, say) is lost.
        crate::metrics::register_metrics();
        let tasks = crate::tasks::Tasks::new();
        let cluster_listener = TcpListener::bind(config.cluster_addr)
            .await
            .with_context(|| format!("binding the cluster address {}", config.cluster_addr))?;
        let cluster_addr = cluster_listener.local_addr()?;
        let grpc_listener = TcpListener::bind(config.grpc_addr)
            .await
            .with_context(|| format!("binding the gRPC address {}", config.grpc_addr))?;
        let grpc_addr = grpc_listener.local_addr()?;
        let admin_listener = TcpListener::bind(config.admin_addr)
            .await
            .with_context(|| format!("binding the admin address {}", config.admin_addr))?;
        let admin_addr = admin_listener.local_addr()?;
        let ojs_listener = match config.ojs_addr {
            Some(addr) => {
                Some(TcpListener::bind(addr).await.with_context(|| format!("binding the OJS address {addr}"))?)
            }
            None => None,
        };
        let ojs_addr = ojs_listener.as_ref().map(TcpListener::local_addr).transpose()?;

        let tls = &config.tls;
        let load = |port, files: &Option<crate::tls::TlsFiles>, http1| {
            files.clone().map(|files| crate::tls::ReloadingServer::load(port, files, http1)).transpose()
        };
        let grpc_tls = load("gateway", &tls.grpc, false)?;
        let cluster_tls = load("cluster", &tls.cluster, false)?;
        let admin_tls = load("admin", &tls.admin, true)?;
        // The OJS port is a client port: the gateway's certificate, over HTTP/1.1.
        let ojs_tls = load("OJS", &tls.grpc, true)?;
        let peer_tls = tls.cluster.clone().map(crate::tls::ReloadingClient::load).transpose()?;
        let auth = crate::auth::Authenticator::load(config.auth.clone()).context("loading tokens and keys")?;
        if auth.enabled() {
            tracing::info!("client requests need a token (tokens file or JWT)");
        } else {
            let mut open = vec![format!("gRPC {grpc_addr}"), format!("admin {admin_addr}")];
            open.extend(ojs_addr.map(|addr| format!("OJS {addr}")));
            tracing::warn!(
                ports = %open.join(", "),
                "authentication is OFF: anyone who reaches these ports may do anything; give --tokens-file or \
                 --jwks-file to turn tokens on (docs/security.md says how to make either)"
            );
        }
        let ports = [
            ("gateway", grpc_tls.is_some()),
            ("cluster", cluster_tls.is_some()),
            ("admin", admin_tls.is_some()),
            ("OJS", ojs_tls.is_some()),
        ];
        for (port, on) in ports.into_iter().filter(|(port, _)| *port != "OJS" || ojs_addr.is_some()) {
            if on {
                tracing::info!(port, "serving TLS");
            } else {
                tracing::warn!(
                    port,
                    "serving PLAINTEXT: anyone who reaches the port reads and sends its traffic; give it a \
                     certificate and key (docs/security.md)"
                );
            }
        }

        let plan = data_dir::read_plan(&config.data_dir)?;
        let Layout { members, placement, identity } =
            Layout::planned(&config, &cluster_addr.to_string(), plan.as_ref());
        let join = match (config.join_plan, config.join_existing) {
            (true, _) => data_dir::Join::Plan,
            (false, true) => data_dir::Join::Existing,
            (false, false) => data_dir::Join::Form,
        };
        let opened = data_dir::open(&config.data_dir, identity, join)?;
        let formation = opened.formation;
        let store = Store::open_with(&config.data_dir.join("db"), config.storage_memory)
            .with_context(|| format!("opening storage in {}", config.data_dir.display()))?;
        if let Some(from) = opened.migrate_from {
            migrate(&config.data_dir, &store, from)?;
        }
        // One limit on node-to-node messages, for every client and server.
        let max_cluster_message = config.limits.max_cluster_message_bytes();
        let versions = Arc::new(crate::transport::Versions::new(
            config.node_id,
            members.keys().copied().collect(),
            opened.cluster_version,
        ));
        let peers = PeerChannels::new(members.clone(), max_cluster_message, peer_tls, Arc::clone(&versions));
        let (stop, stop_rx) = watch::channel(false);
        // The cluster port stops last: a stopping node still hands its
        // leadership over and answers its groups' Raft RPCs until they stop.
        let (cluster_stop, cluster_stop_rx) = watch::channel(false);

        // The cluster service answers before the replicas exist (peers may call
        // early); it says UNAVAILABLE until the context is set.
        let late_ctx: Arc<OnceLock<Arc<NodeContext>>> = Arc::new(OnceLock::new());
        let cluster_service = crate::cluster::ClusterService::new(Arc::clone(&late_ctx));
        let mut servers = Vec::new();
        let cluster_server = tokio::spawn(serve_grpc(
            "cluster",
            tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .initial_connection_window_size(Some(4 << 20))
                .initial_stream_window_size(Some(1 << 20))
                .http2_max_pending_accept_reset_streams(Some(PEER_RESET_STREAMS))
                .add_service(crate::gateway::Observe::cluster(crate::transport::Admit::new(
                    ClusterServer::new(cluster_service)
                        .max_decoding_message_size(max_cluster_message)
                        .max_encoding_message_size(max_cluster_message),
                    Arc::clone(&versions),
                ))),
            cluster_listener,
            cluster_tls,
            cluster_stop_rx,
        ));

        let raft_settings =
            crate::raft::RaftSettings { snapshot_dir: config.data_dir.join("snapshots"), ..config.raft.clone() };
        // Parts of backups staged before a restart are not finished: taken again.
        crate::raft::clear_staged_backups(&raft_settings.snapshot_dir)
            .with_context(|| format!("clearing staged backups in {}", raft_settings.snapshot_dir.display()))?;
        let mut replicas = std::collections::BTreeMap::new();
        for (partition, hosts) in (0..).zip(&placement) {
            if !hosts.contains(&config.node_id) {
                continue;
            }
            let group = hosts.iter().map(|id| (*id, members[id].clone())).collect();
            // A replica the plan placed here that is not yet among its
            // group's voters is a newcomer, copied from its leader; a
            // partition being added forms from its placement, as before the
            // restart (a no-op with Raft state here).
            let formation = match plan.as_ref() {
                Some(plan) if plan.forming(partition) => Formation::New,
                Some(plan) if !plan.current[partition as usize].contains(&config.node_id) => Formation::Joining,
                Some(_) => membership::voter_formation(&store, partition, config.partitions, formation)?,
                None => formation,
            };
            let replica = Replica::start(
                partition,
                config.node_id,
                &group,
                Arc::clone(&store),
                peers.clone(),
                &raft_settings,
                formation,
            )
            .await
            .with_context(|| format!("starting partition {partition}"))?;
            replicas.insert(partition, replica);
        }
        let mut background = Vec::new();
        match formation {
            Formation::Formed => {}
            // Every group it hosts was formed now or had Raft state already.
            Formation::New => {
                store.flush();
                data_dir::record_formed(&config.data_dir, identity)?;
            }
            Formation::Joining => {
                tracing::warn!(
                    "joining the cluster with an empty data directory: each partition's leader copies it here; \
                     a partition votes once it has caught up"
                );
                let (dir, store, joining) =
                    (config.data_dir.clone(), Arc::clone(&store), replicas.values().cloned().collect());
                background.push(tasks.spawn(named("join", move |status| {
                    record_formed_once_caught_up(dir, identity, store, joining, status)
                })));
            }
        }

        let topology = Arc::new(crate::context::Topology::new(&config, members, placement, (grpc_addr, admin_addr)));
        if let Some(plan) = &plan {
            topology.follow_plan(plan);
        }
        // The counts seen before the restart: idempotency keys made under
        // an older count are still looked for where they hashed then.
        topology.recall_counts(data_dir::read_counts(&config.data_dir)?.unwrap_or_default());
        let ctx = Arc::new(NodeContext::new(
            &config,
            topology,
            (Arc::clone(&store), replicas),
            peers,
            stop_rx.clone(),
            auth,
            Arc::clone(&tasks),
        ));
        if let Some(hold) = crate::failpoints::fire("start_hold") {
            tokio::time::sleep(hold).await;
        }
        let _ = late_ctx.set(Arc::clone(&ctx));
        ctx.gateway.streams.connect(Arc::new(crate::cluster::Links::new(Arc::downgrade(&ctx))));

        for replica in ctx.routing.replicas().iter() {
            let (ctx, replica, stopping) = (Arc::clone(&ctx), Arc::clone(replica), stop_rx.clone());
            let name = format!("leadership p{}", replica.partition);
            background.push(
                tasks.spawn(named(name, move |status| supervisor::lead_while_leader(ctx, replica, stopping, status))),
            );
        }
        let loops = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new()));
        let hosting = membership::Hosting {
            store: Arc::clone(&store),
            settings: raft_settings.clone(),
            data_dir: config.data_dir.clone(),
            formation,
            loops: Arc::clone(&loops),
        };
        let (plans, stopping) = (Arc::clone(&ctx), stop_rx.clone());
        background.push(
            tasks.spawn(named("cluster plan", move |status| membership::follow_plan(plans, hosting, stopping, status))),
        );
        let (refresh, stopping) = (Arc::clone(&ctx), stop_rx.clone());
        background.push(tasks.spawn(named("stream registrations", move |status| {
            crate::cluster::refresh_stream_registrations(refresh, stopping, status)
        })));
        let (dir, stopping) = (config.data_dir.clone(), stop_rx.clone());
        background
            .push(tasks.spawn(named("cluster version", move |status| {
                record_cluster_version(dir, versions, stopping, status)
            })));
        let (gauges, stopping) = (Arc::clone(&ctx), stop_rx.clone());
        background
            .push(tasks.spawn(named("gauges", move |status| crate::admin::record_gauges(gauges, stopping, status))));
        let (clocks, stopping) = (Arc::clone(&ctx), stop_rx.clone());
        background.push(tasks.spawn(named("partition clocks", move |status| {
            crate::cluster::learn_partition_clocks(clocks, stopping, status)
        })));
        let (dir, ttl, stopping) = (raft_settings.snapshot_dir.clone(), config.backup_staged_ttl, stop_rx.clone());
        background.push(
            tasks.spawn(named("staged backups", move |status| expire_staged_backups(dir, ttl, stopping, status))),
        );

        // Every client service answers through the call layer: who calls, by
        // when, counted in flight, traced (crate::gateway::call).
        let calls = crate::gateway::CallLayer::new(Arc::clone(&ctx));
        let gateway = crate::gateway::GatewayService::new(Arc::clone(&ctx));
        let zeebe = crate::gateway::ZeebeService::new(Arc::clone(&ctx));
        let (health, health_service) = tonic_health::server::health_reporter();
        for service in [
            "",
            <GatewayServer<crate::gateway::GatewayService> as NamedService>::NAME,
            <ZeebeServer<crate::gateway::ZeebeService> as NamedService>::NAME,
        ] {
            health.set_service_status(service, tonic_health::ServingStatus::Serving).await;
        }
        // Requests hold at most one job; replies may hold a whole job record
        // (variables, result, error message) or an ActivateJobs batch cut to
        // the request size plus one job, so they get the cluster's limit.
        // Zeebe's clients read at most 4 MiB per message: its service cuts
        // its replies to that. Both take and give gzip (some Zeebe clients
        // compress every call); replies are compressed for clients that
        // accept it.
        servers.push(tokio::spawn(serve_grpc(
            "gateway",
            tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .http2_keepalive_interval(Some(Duration::from_secs(30)))
                .add_service(crate::gateway::Observe::new(
                    calls.layer(
                        GatewayServer::new(gateway)
                            .accept_compressed(CompressionEncoding::Gzip)
                            .send_compressed(CompressionEncoding::Gzip)
                            .max_decoding_message_size(config.limits.max_request_bytes())
                            .max_encoding_message_size(max_cluster_message),
                    ),
                ))
                .add_service(crate::gateway::Observe::new(
                    calls.layer(
                        ZeebeServer::new(zeebe)
                            .accept_compressed(CompressionEncoding::Gzip)
                            .send_compressed(CompressionEncoding::Gzip)
                            .max_decoding_message_size(config.limits.max_request_bytes())
                            .max_encoding_message_size(crate::gateway::zeebe::MAX_MESSAGE_BYTES),
                    ),
                ))
                // Probes carry no token: the health service is the one open
                // service (crate::gateway::call::OPEN_SERVICES).
                .add_service(health_service),
            grpc_listener,
            grpc_tls,
            stop_rx.clone(),
        )));
        if let Some(listener) = ojs_listener {
            let stop = stop_rx.clone();
            servers.push(tokio::spawn(crate::gateway::ojs::serve(Arc::clone(&ctx), listener, ojs_tls, stop)));
        }
        servers.push(tokio::spawn(crate::admin::serve(Arc::clone(&ctx), admin_listener, admin_tls, stop_rx)));

        Ok(Node {
            ctx,
            grpc_addr,
            cluster_addr,
            admin_addr,
            ojs_addr,
            stop,
            servers,
            background,
            cluster_stop,
            cluster_server,
            plan_loops: loops,
        })
    }

    /// Stops accepting work, lets in-flight requests finish, stops the leader
    /// actors and Raft groups, and syncs storage.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let streams = self.ctx.gateway.streams.close_all().await;
        // Brokers stop pushing to this gateway at once, instead of yielding
        // their pushes until the registrations expire.
        crate::cluster::remove_all_everywhere(&self.ctx, &streams).await;
        // Partitions this node leads get a leader elsewhere now, not after an
        // election timeout; requests waiting on them (here or forwarded from
        // other gateways) then finish there.
        crate::cluster::hand_over_leadership(&self.ctx, HAND_OVER_LIMIT).await;
        // Servers stop accepting at once; requests already running may finish
        // (bounded by the request timeout). Idle client connections are not
        // waited for.
        let grace = Instant::now() + self.ctx.settings.request_timeout;
        while self.ctx.gateway.requests_in_flight() > 0 && Instant::now() < grace {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for server in self.servers {
            server.abort();
        }
        for task in self.background {
            task.abort();
        }
        for (_, task) in std::mem::take(&mut *self.plan_loops.lock().expect("leadership loops")) {
            task.abort();
        }
        self.ctx.routing.stop_leaders().await;
        for replica in self.ctx.routing.replicas().iter() {
            replica.shutdown().await;
        }
        let _ = self.cluster_stop.send(true);
        self.cluster_server.abort();
        self.ctx.store.flush();
        self.ctx.store.flush_memtables();
    }
}

/// Migrates the records of a data directory of format `from` in place (an
/// interrupted migration resumes), then records the directory as migrated.
fn migrate(dir: &std::path::Path, store: &Store, from: u32) -> anyhow::Result<()> {
    tracing::warn!(
        from,
        to = data_dir::FORMAT,
        "migrating the data directory's records in place; an older build refuses the directory from now on"
    );
    let started = Instant::now();
    let migrated = store.migrate_from_6().with_context(|| format!("migrating {} from format {from}", dir.display()))?;
    data_dir::record_migrated(dir)?;
    tracing::info!(
        records = migrated.records,
        bytes = migrated.bytes,
        resumed = migrated.resumed,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "migrated the data directory to format {}",
        data_dir::FORMAT
    );
    Ok(())
}

/// Records in the data directory each cluster version every member reached,
/// so the node never speaks down to an older build again, even after a
/// restart (see [`crate::transport::versions`]).
async fn record_cluster_version(
    dir: std::path::PathBuf,
    versions: Arc<crate::transport::Versions>,
    mut stop: watch::Receiver<bool>,
    status: crate::tasks::LoopStatus,
) {
    let mut cluster = versions.watch();
    loop {
        let version = *cluster.borrow_and_update();
        metrics::gauge!("drover_cluster_version").set(f64::from(version));
        if version > versions.floor() {
            match data_dir::record_cluster_version(&dir, version) {
                Ok(()) => {
                    versions.raise_floor(version);
                    tracing::info!(version, "every member of the cluster speaks data version {version}");
                }
                Err(e) => status.error(format!("recording cluster version {version}: {e:#}")),
            }
        }
        let members = versions.members();
        let heard: Vec<String> =
            members.iter().map(|(n, v)| format!("{n}={}", v.map_or("?".to_string(), |v| v.to_string()))).collect();
        status.set(format!("cluster version {} (members {})", versions.cluster_version(), heard.join(" ")));
        tokio::select! {
            changed = cluster.changed() => if changed.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
            // The members' versions change without the cluster version.
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

/// Records a joining node as formed once every replica on it has caught up
/// with its group's leader.
async fn record_formed_once_caught_up(
    dir: std::path::PathBuf,
    identity: data_dir::Identity,
    store: Arc<Store>,
    replicas: Vec<Arc<Replica>>,
    status: crate::tasks::LoopStatus,
) {
    for replica in &replicas {
        status.set(format!("waiting for partition {} to catch up with its leader", replica.partition));
        if !replica.caught_up().await {
            return; // stopped before it caught up; the next start goes on joining
        }
    }
    store.flush();
    match data_dir::record_formed(&dir, identity) {
        Ok(()) => {
            status.set("joined: every partition here has caught up");
            tracing::info!("every partition on this node has caught up with its leader: joined")
        }
        Err(e) => {
            status.error(format!("recording that this node joined: {e:#}"));
            tracing::error!("recording that this node joined: {e:#}; it will try again at its next start")
        }
    }
}

async fn serve_grpc(
    name: &'static str,
    router: tonic::transport::server::Router,
    listener: TcpListener,
    tls: Option<Arc<crate::tls::ReloadingServer>>,
    stop: watch::Receiver<bool>,
) {
    let incoming = tokio_stream::wrappers::ReceiverStream::new(crate::tls::accept(listener, tls, stop.clone()));
    let mut stop = stop;
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    if let Err(e) = router.serve_with_incoming_shutdown(incoming, shutdown).await {
        tracing::error!("{name} server failed: {e}");
    }
}

/// Deletes, once a minute, the staged backup parts that no `drover backup
/// create` came back for within `ttl` (it died before releasing them): each
/// is a whole copy of a partition's state on this node's disk.
async fn expire_staged_backups(
    dir: std::path::PathBuf,
    ttl: std::time::Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
    status: crate::tasks::LoopStatus,
) {
    loop {
        match crate::raft::expire_staged_backups(&dir, ttl) {
            Ok(expired) => {
                for id in &expired {
                    tracing::warn!(backup = %id, "deleted this node's staged parts of backup {id}: no one read or released them within {} s", ttl.as_secs());
                }
                metrics::counter!("drover_backup_staged_expired_total").increment(expired.len() as u64);
                status.set(format!("staged backups older than {} s deleted", ttl.as_secs()));
            }
            Err(error) => status.error(format!("expiring staged backups in {}: {error}", dir.display())),
        }
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_secs(60)) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
