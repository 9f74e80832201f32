//! `drover serve` and `drover dev-cluster`.

use std::time::Duration;

use drover::config::ServeArgs;
use drover::node::Node;

/// Resolves at the first SIGTERM or SIGINT.
pub(crate) async fn shutdown_signal() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

pub(crate) async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    drover::memory::setup_allocator();
    let config = args.resolve()?;
    let telemetry = drover::telemetry::init(&config.log_format, config.otlp_endpoint.as_deref(), "drover")?;
    let data_dir = config.data_dir.clone();
    let admin_scheme = if config.tls.admin.is_some() { "https" } else { "http" };
    let ojs_scheme = if config.tls.grpc.is_some() { "https" } else { "http" };
    let (partitions, replication, members) =
        (config.partitions, config.replication_factor, config.members.len().max(1));
    let malloc_trim = config.malloc_trim;
    let node = Node::start(config).await?;
    let (stop_trimming, trimming) = tokio::sync::watch::channel(false);
    if let Some(interval) = malloc_trim {
        node.ctx.tasks.spawn(drover::tasks::named("heap trims", move |status| {
            drover::memory::trim_periodically(interval, trimming, status)
        }));
    }
    println!("drover node {} started", node.ctx.topology.node_id);
    println!("  gateway (gRPC): {}", node.grpc_addr);
    println!("  cluster (gRPC): {}", node.cluster_addr);
    println!(
        "  admin (HTTP):   {admin_scheme}://{}  (/metrics /health /ready /actuator/partitions /actuator/jobstreams)",
        node.admin_addr
    );
    if let Some(ojs) = node.ojs_addr {
        println!("  OJS (HTTP):     {ojs_scheme}://{ojs}/ojs/v1  (Open Job Spec, docs/ojs.md)");
    }
    println!("  data:           {}", data_dir.display());
    println!("  partitions {partitions}, replication factor {replication}, members {members}");
    use std::io::Write;
    std::io::stdout().flush()?;

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    tracing::info!("stopping: no new work, finishing requests in flight");
    let _ = stop_trimming.send(true);
    node.shutdown().await;
    telemetry.shutdown();
    println!("drover node stopped");
    Ok(())
}

pub(crate) async fn dev_cluster(
    nodes: usize,
    partitions: u32,
    replication_factor: u32,
    dir: &std::path::Path,
    tls: bool,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut cluster =
        drover::bench::LocalCluster::start_with(nodes, partitions, replication_factor, Some(dir), &[], tls)?;
    cluster.wait_ready(Duration::from_secs(60)).await?;
    println!(
        "{nodes} nodes, {partitions} partitions, replication factor {replication_factor}; data and logs in {}",
        dir.display()
    );
    let admin = if tls { "https" } else { "http" };
    for (node, gateway) in cluster.nodes.iter().zip(cluster.gateways()) {
        println!("  node {}: gateway {gateway}  admin {admin}://{}", node.node_id, node.admin);
    }
    let first = &cluster.gateways()[0];
    if let Some((_, files)) = &cluster.tls {
        println!("TLS on every port; clients trust the throwaway CA {}:", files.ca.display());
        println!("      export {}={}", drover::client::TLS_CA_ENV, files.ca.display());
    }
    println!("try:  drover status --address {first}");
    println!("      drover job create --address {first} --type demo --variables '{{\"n\":1}}'");
    println!("Ctrl-C (or SIGTERM) stops the cluster (its data stays in {}).", dir.display());
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    cluster.stop();
    Ok(())
}
