//! The console's cluster page: every node's partitions (role, term, lag), and
//! this node's own rates, latencies and background loops.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use axum::Extension;
use minijinja::{context, Value};

use super::*;
use crate::auth::Principal;
use crate::context::NodeContext;

/// The cluster: every node's partitions (role, term, lag), and this node's
/// own rates and latencies.
pub(super) async fn cluster(
    State(ctx): State<Arc<NodeContext>>,
    Extension(principal): Extension<Arc<Principal>>,
) -> Response {
    if let Err(error) = principal.require(crate::auth::CLUSTER_READ) {
        return failure(&ctx, &principal, "The cluster", &error.into());
    }
    let brokers = crate::gateway::api::cluster_status(&ctx).await;
    let mut partitions: std::collections::BTreeMap<u32, Vec<(u64, &PartitionInfo)>> = Default::default();
    for broker in &brokers {
        for p in &broker.partitions {
            partitions.entry(p.partition_id).or_default().push((broker.node_id, p));
        }
    }
    let partitions: Vec<Value> = partitions
        .iter()
        .map(|(id, replicas)| {
            let committed = replicas.iter().map(|(_, p)| p.commit_index).max().unwrap_or(0);
            let leader = replicas.iter().find(|(_, p)| p.role == "leader");
            let term = replicas.iter().map(|(_, p)| p.term).max().unwrap_or(0);
            context! {
                id => id,
                leader => leader.map(|(node, _)| *node),
                term => term,
                committed => committed,
                replicas => replicas.iter().map(|(node, p)| context! {
                    node => node,
                    role => &p.role,
                    term => p.term,
                    applied => p.applied_index,
                    lag => committed.saturating_sub(p.applied_index),
                }).collect::<Vec<_>>(),
            }
        })
        .collect();
    let nodes: Vec<Value> = brokers
        .iter()
        .map(|b| {
            context! {
                id => b.node_id,
                address => &b.address,
                reachable => b.node_id == ctx.topology.node_id || !b.address.is_empty(),
                leads => b.partitions.iter().filter(|p| p.role == "leader").count(),
                replicas => b.partitions.len(),
                healthy => !b.partitions.is_empty() && b.partitions.iter().all(|p| p.health == "healthy"),
            }
        })
        .collect();
    let samples = samples::samples();
    let series = |f: fn(&samples::Sample) -> f64| samples.iter().map(f).collect::<Vec<f64>>();
    let spark = |label: &str, unit: &str, values: Vec<f64>| {
        let last = values.last().copied().unwrap_or(0.0);
        context! {
            label => label,
            unit => unit,
            last => format!("{last:.1}"),
            svg => Value::from_safe_string(samples::sparkline(&values, unit)),
        }
    };
    let sparks = vec![
        spark("Jobs created", "jobs/s", series(|s| s.created)),
        spark("Jobs completed", "jobs/s", series(|s| s.completed)),
        spark("Jobs failed", "jobs/s", series(|s| s.failed)),
        spark("Client requests", "req/s", series(|s| s.requests)),
        spark("Create ack, mean", "ms", series(|s| s.ack_mean_ms)),
        spark("Create ack, p99 bucket", "ms", series(|s| s.ack_p99_ms)),
    ];
    let tasks: Vec<Value> = ctx
        .tasks
        .list()
        .into_iter()
        .map(|t| {
            context! {
                name => t.name,
                state => format!("{:?}", t.state).to_lowercase(),
                status => t.status,
                last_error => t.last_error,
                errors => t.errors,
            }
        })
        .collect();
    // The plan this node follows (docs/membership.md): members, and each
    // partition's voters with where they are going.
    let (plan, changed) = ctx.topology.shown_plan().map_or((None, false), |(plan, changed)| (Some(plan), changed));
    let plan = plan.map(|plan| {
        let nodes = |ids: &[u64]| ids.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
        context! {
            epoch => plan.epoch,
            changed => changed,
            paused => plan.paused,
            max_moves => plan.max_moves,
            retired => nodes(&plan.retired.iter().copied().collect::<Vec<_>>()),
            members => plan.members.iter().map(|(id, m)| context! {
                id => id,
                address => &m.addr,
                location => m.location().to_string(),
                leaving => plan.leaving.contains(id),
            }).collect::<Vec<_>>(),
            partitions => (0..plan.partitions()).map(|p| context! {
                id => p,
                current => nodes(&plan.current[p as usize]),
                target => nodes(&plan.target[p as usize]),
                moving => plan.moving(p),
                now => plan.may_move(p),
            }).collect::<Vec<_>>(),
        }
    });
    let page = context! {
        plan => plan,
        ready => ctx.routing.ready(),
        partitions_count => ctx.topology.partition_count(),
        replication_factor => ctx.topology.replication_factor,
        nodes => nodes,
        partitions => partitions,
        sparks => sparks,
        window_seconds => samples::INTERVAL.as_secs() * samples::KEPT as u64,
        tasks => tasks,
    };
    render(&ctx, Some(&principal), "cluster.html", page)
}
