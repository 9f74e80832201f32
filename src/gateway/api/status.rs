//! The cluster's status as this node's gateway sees it: every node's view of
//! its partitions, for Topology, `/actuator/partitions` and the console.

use std::sync::Arc;
use std::time::Duration;

use tonic::Request;

use crate::context::NodeContext;
use crate::proto::cluster::StatusRequest;
use crate::proto::gateway::{BrokerInfo, PartitionInfo};
use crate::raft::ReplicaStatus;

fn partition_info(status: &ReplicaStatus) -> PartitionInfo {
    PartitionInfo {
        partition_id: status.partition,
        role: status.role.clone(),
        health: if status.leader.is_some() { "healthy" } else { "unhealthy" }.into(),
        term: status.term,
        leader_id: status.leader,
        commit_index: status.commit_index,
        applied_index: status.applied_index,
    }
}

/// Every node's view of its partitions; unreachable nodes appear with none.
pub async fn cluster_status(ctx: &Arc<NodeContext>) -> Vec<BrokerInfo> {
    let mut brokers = Vec::new();
    let versions = ctx.transport.peers.versions().members();
    let data_version = |node: u64| versions.iter().find(|(n, _)| *n == node).and_then(|(_, v)| *v).map_or(0, u32::from);
    for node in ctx.topology.members().into_keys() {
        if node == ctx.topology.node_id {
            brokers.push(BrokerInfo {
                node_id: node,
                address: ctx.topology.grpc_addr.to_string(),
                partitions: ctx.routing.replicas().iter().map(|r| partition_info(&r.status())).collect(),
                data_version: data_version(node),
            });
            continue;
        }
        let mut info = BrokerInfo { node_id: node, address: String::new(), partitions: Vec::new(), data_version: 0 };
        if let Some(mut client) = ctx.transport.peers.client(node) {
            let mut request = Request::new(StatusRequest {});
            request.set_timeout(Duration::from_millis(1500));
            if let Ok(reply) = client.status(request).await {
                let reply = reply.into_inner();
                info.address = reply.gateway_address;
                let statuses: Vec<ReplicaStatus> = bincode::deserialize(&reply.partitions).unwrap_or_default();
                info.partitions = statuses.iter().map(partition_info).collect();
            }
        }
        // Read after the call: its answer told this node the peer's version.
        info.data_version = data_version(node);
        brokers.push(info);
    }
    brokers
}

/// [`cluster_status`] as JSON for `/actuator/partitions`.
pub async fn cluster_status_json(ctx: &Arc<NodeContext>) -> serde_json::Value {
    let brokers = cluster_status(ctx).await;
    serde_json::Value::Array(
        brokers
            .into_iter()
            .map(|b| {
                serde_json::json!({
                    "nodeId": b.node_id,
                    "address": b.address,
                    "dataVersion": b.data_version,
                    "partitions": b.partitions.iter().map(|p| serde_json::json!({
                        "partitionId": p.partition_id,
                        "role": p.role,
                        "health": p.health,
                        "term": p.term,
                        "leaderId": p.leader_id,
                        "commitIndex": p.commit_index,
                        "appliedIndex": p.applied_index,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}
