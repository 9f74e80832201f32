//! `drover cluster ...`: the cluster plan: show it, add, remove and replace
//! nodes, add partitions, pause, resume and cancel the moves
//! (docs/membership.md).

use clap::Subcommand;
use drover::client::Client;
use drover::proto::gateway::change_cluster_plan_request::Change;
use drover::proto::gateway::*;

use super::{status_error, Target};

#[derive(Subcommand)]
pub(crate) enum PlanCommand {
    /// Show the plan: members, each partition's voters now and where they go.
    Plan {
        /// Stop starting moves (those under way finish).
        #[arg(long, conflicts_with_all = ["resume", "cancel"])]
        pause: bool,
        /// Start moves again.
        #[arg(long, conflicts_with = "cancel")]
        resume: bool,
        /// Drop the moves not yet made: each partition keeps the voters it has.
        #[arg(long)]
        cancel: bool,
        /// Partitions moving at once, at most.
        #[arg(long)]
        max_moves: Option<u32>,
        /// Print the plan as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Add a node started with --join-plan: ID=HOST:PORT[@REGION/ZONE], its
    /// cluster address. Replicas move to it until the load is even.
    AddNode {
        #[arg(value_name = "ID=HOST:PORT[@REGION/ZONE]")]
        node: String,
    },
    /// Make the members nodes 0..SIZE (their addresses from --address-template)
    /// and wait, with --wait, until the plan is carried out: adds the ids
    /// below SIZE that are not members, removes the members from SIZE up.
    /// What the Helm chart's hooks run when clusterSize changes.
    Scale {
        #[arg(long)]
        size: u64,
        /// Each node's cluster address, `{id}` standing for its id, e.g.
        /// drover-{id}.drover-headless.default.svc:26502.
        #[arg(long)]
        address_template: String,
        /// Each node's REGION/ZONE, by id, comma separated (none: no locations).
        #[arg(long, value_delimiter = ',')]
        locations: Vec<String>,
        /// Only remove (before a StatefulSet shrinks, whose pods must leave first).
        #[arg(long)]
        remove_only: bool,
        /// Wait until no partition moves, at most this many seconds (0: do not wait).
        #[arg(long, default_value_t = 0)]
        wait: u64,
    },
    /// Raise the partition count to TO: the new partitions form on the
    /// members the placement rules pick, then take new keyless creates;
    /// existing jobs stay where they are. Nothing to do when the cluster has
    /// TO partitions or more. With --wait, waits until they take work.
    AddPartitions {
        #[arg(long)]
        to: u32,
        /// Wait until the new partitions take work, at most this many seconds (0: do not wait).
        #[arg(long, default_value_t = 0)]
        wait: u64,
    },
    /// Move every replica of node ID to the other members, then drop it.
    RemoveNode {
        #[arg(value_name = "ID")]
        node: u64,
    },
    /// Give each of node OLD's replicas to a new node (started with
    /// --join-plan, under an id never used), then drop OLD: how a node whose
    /// disk is lost comes back.
    ReplaceNode {
        #[arg(value_name = "OLD")]
        old: u64,
        #[arg(value_name = "NEW=HOST:PORT[@REGION/ZONE]")]
        new: String,
    },
}

fn plan_node(text: &str) -> anyhow::Result<PlanNode> {
    let (members, locations) = drover::config::parse_members_as(&[text.to_string()], true)?;
    let (id, address) = members.into_iter().next().ok_or_else(|| anyhow::anyhow!("name a node: ID=HOST:PORT"))?;
    let location = locations.get(&id).cloned().unwrap_or_default();
    Ok(PlanNode { node_id: id, address, region: location.region, zone: location.zone })
}

pub(crate) async fn cluster(command: PlanCommand, target: &Target) -> anyhow::Result<()> {
    let client = Client::connect_lazy(&target.address)?;
    let change = match command {
        PlanCommand::Scale { size, address_template, locations, remove_only, wait } => {
            return scale(&client, size, &address_template, &locations, remove_only, wait).await;
        }
        PlanCommand::Plan { pause, resume, cancel, max_moves, json } => {
            let change = match (pause, resume, cancel, max_moves) {
                (true, ..) => Some(Change::Pause(true)),
                (_, true, ..) => Some(Change::Pause(false)),
                (_, _, true, _) => Some(Change::Cancel(true)),
                (_, _, _, Some(moves)) => Some(Change::MaxMoves(moves)),
                _ => None,
            };
            let plan = match change {
                Some(change) => client
                    .raw()
                    .change_cluster_plan(ChangeClusterPlanRequest { change: Some(change) })
                    .await
                    .map_err(status_error)?
                    .into_inner(),
                None => {
                    client.raw().get_cluster_plan(GetClusterPlanRequest {}).await.map_err(status_error)?.into_inner()
                }
            };
            print(&plan, json);
            return Ok(());
        }
        PlanCommand::AddPartitions { to, wait } => return add_partitions(&client, to, wait).await,
        PlanCommand::AddNode { node } => Change::AddNode(plan_node(&node)?),
        PlanCommand::RemoveNode { node } => Change::RemoveNode(node),
        PlanCommand::ReplaceNode { old, new } => {
            Change::ReplaceNode(ReplaceNode { old_node_id: old, new_node: Some(plan_node(&new)?) })
        }
    };
    let request = ChangeClusterPlanRequest { change: Some(change) };
    let plan = client.raw().change_cluster_plan(request).await.map_err(status_error)?.into_inner();
    print(&plan, false);
    Ok(())
}

/// Adds and removes members until they are nodes 0..size; then waits up to
/// `wait` seconds for the plan to settle.
async fn scale(
    client: &Client,
    size: u64,
    template: &str,
    locations: &[String],
    remove_only: bool,
    wait: u64,
) -> anyhow::Result<()> {
    if !template.contains("{id}") {
        anyhow::bail!("--address-template must contain {{id}}, where each node's id goes");
    }
    let plan = client.raw().get_cluster_plan(GetClusterPlanRequest {}).await.map_err(status_error)?.into_inner();
    let members: Vec<u64> = plan.members.iter().filter_map(|m| m.node.as_ref().map(|n| n.node_id)).collect();
    let leaving: Vec<u64> =
        plan.members.iter().filter(|m| m.leaving).filter_map(|m| m.node.as_ref().map(|n| n.node_id)).collect();
    let mut changes = Vec::new();
    for id in members.iter().copied().filter(|id| *id >= size && !leaving.contains(id)) {
        changes.push((format!("remove node {id}"), Change::RemoveNode(id)));
    }
    if !remove_only {
        for id in (0..size).filter(|id| !members.contains(id)) {
            if plan.retired.contains(&id) {
                anyhow::bail!(
                    "node id {id} left the cluster before, and ids are never used again: a StatefulSet cannot bring                      ordinal {id} back (docs/membership.md, Kubernetes)"
                );
            }
            let location = locations.get(id as usize).map(String::as_str).unwrap_or("");
            let entry = format!(
                "{id}={}{}",
                template.replace("{id}", &id.to_string()),
                match location {
                    "" => String::new(),
                    at => format!("@{at}"),
                }
            );
            changes.push((format!("add node {entry}"), Change::AddNode(plan_node(&entry)?)));
        }
    }
    for (what, change) in changes {
        let request = ChangeClusterPlanRequest { change: Some(change) };
        match client.raw().change_cluster_plan(request).await {
            Ok(_) => println!("{what}: planned"),
            // A repeat of a change another run made already.
            Err(status) if status.code() == tonic::Code::FailedPrecondition && status.message().contains("already") => {
                println!("{what}: {}", status.message())
            }
            Err(status) => return Err(status_error(status)),
        }
    }
    if wait == 0 {
        return Ok(());
    }
    let until = std::time::Instant::now() + std::time::Duration::from_secs(wait);
    loop {
        let plan = client.raw().get_cluster_plan(GetClusterPlanRequest {}).await.map_err(status_error)?.into_inner();
        let gone = plan.members.iter().all(|m| m.node.as_ref().is_none_or(|n| n.node_id < size));
        if plan.partitions.iter().all(|p| !p.moving) && (gone || !plan.members.iter().any(|m| m.leaving)) {
            print(&plan, false);
            return Ok(());
        }
        if std::time::Instant::now() > until {
            print(&plan, false);
            anyhow::bail!("the plan still has moves to make after {wait} s");
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

/// Raises the partition count to `to` unless it is there already; then
/// waits up to `wait` seconds until new work is routed over them all.
async fn add_partitions(client: &Client, to: u32, wait: u64) -> anyhow::Result<()> {
    let plan = client.raw().get_cluster_plan(GetClusterPlanRequest {}).await.map_err(status_error)?.into_inner();
    if plan.partitions.len() as u32 >= to {
        println!("the cluster has {} partitions already", plan.partitions.len());
    } else {
        let request = ChangeClusterPlanRequest { change: Some(Change::AddPartitionsTo(to)) };
        client.raw().change_cluster_plan(request).await.map_err(status_error)?;
        println!("partitions {} to {}: planned", plan.partitions.len(), to - 1);
    }
    let until = std::time::Instant::now() + std::time::Duration::from_secs(wait);
    loop {
        let plan = client.raw().get_cluster_plan(GetClusterPlanRequest {}).await.map_err(status_error)?.into_inner();
        let formed = plan.partitions_in_force as usize == plan.partitions.len();
        if formed || std::time::Instant::now() >= until {
            print(&plan, false);
            if !formed && wait > 0 {
                anyhow::bail!("partitions still forming after {wait} s");
            }
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

fn nodes(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

fn print(plan: &ClusterPlan, json: bool) {
    if json {
        let members: Vec<serde_json::Value> = plan
            .members
            .iter()
            .map(|m| {
                let node = m.node.clone().unwrap_or_default();
                serde_json::json!({
                    "node": node.node_id, "address": node.address, "region": node.region, "zone": node.zone,
                    "leaving": m.leaving, "replicas": m.replicas, "target_replicas": m.target_replicas,
                })
            })
            .collect();
        let partitions: Vec<serde_json::Value> = plan
            .partitions
            .iter()
            .map(|p| serde_json::json!({"partition": p.partition_id, "current": p.current, "target": p.target, "moving": p.moving, "forming": p.forming}))
            .collect();
        super::print_json(&serde_json::json!({
            "epoch": plan.epoch, "changed": plan.changed, "paused": plan.paused, "max_moves": plan.max_moves,
            "replication_factor": plan.replication_factor, "retired": plan.retired,
            "partitions_in_force": plan.partitions_in_force, "formed_partitions": plan.formed_partitions,
            "members": members, "partitions": partitions,
        }));
        return;
    }
    let moving = plan.partitions.iter().filter(|p| p.moving).count();
    println!(
        "plan epoch {}{}: {} members, replication factor {}, {moving} partitions moving{} (at most {} at once)",
        plan.epoch,
        if plan.changed { "" } else { " (as the cluster formed)" },
        plan.members.len(),
        plan.replication_factor,
        if plan.paused { ", PAUSED" } else { "" },
        plan.max_moves
    );
    println!("{:<6} {:<28} {:<24} {:>9} {:>7}", "NODE", "ADDRESS", "LOCATION", "REPLICAS", "TARGET");
    for member in &plan.members {
        let node = member.node.clone().unwrap_or_default();
        let location = match (node.region.as_str(), node.zone.as_str()) {
            ("", _) => "-".to_string(),
            (region, "") => region.to_string(),
            (region, zone) => format!("{region}/{zone}"),
        };
        let leaving = if member.leaving { " leaving" } else { "" };
        println!(
            "{:<6} {:<28} {:<24} {:>9} {:>7}{leaving}",
            node.node_id, node.address, location, member.replicas, member.target_replicas
        );
    }
    if plan.partitions_in_force != 0 && plan.partitions_in_force as usize != plan.partitions.len() {
        println!(
            "{} partitions, new work routed over the first {} until the rest have formed",
            plan.partitions.len(),
            plan.partitions_in_force
        );
    }
    println!("{:<10} {:<16} {:<16}", "PARTITION", "VOTERS", "TARGET");
    for p in &plan.partitions {
        let mark = match (p.moving, p.forming) {
            (_, true) => "  forming",
            (true, _) => "  moving",
            _ => "",
        };
        println!("{:<10} {:<16} {:<16}{mark}", p.partition_id, nodes(&p.current), nodes(&p.target));
    }
    if !plan.retired.is_empty() {
        println!("retired ids (never used again): {}", nodes(&plan.retired));
    }
}
