//! Which gateway to send a job's commands to: the one on the node that leads
//! the job's partition, as the cluster's `Topology` says.
//!
//! Any gateway takes any command and forwards it to the partition's leader,
//! so routing is only a saving: a command sent to the leader's own gateway
//! skips the forward (a gRPC round trip between nodes, and its CPU). A stale
//! map therefore costs a forward, never an error, and is refreshed on a
//! schedule rather than waited for.
//!
//! A node's gateway is known by the address it reports (its `--grpc-addr`);
//! it is used only when it is one of the addresses the caller connects to
//! (the same host and port). A node listening on `0.0.0.0` (the default) or
//! reached through a proxy or a Service is therefore never routed to, and
//! its partitions' commands go wherever the caller would send them anyway:
//! routing needs nodes that listen on the address clients dial.

use std::collections::HashMap;
use std::sync::RwLock;

use crate::proto::gateway::TopologyResponse;

/// The partition a job key belongs to (its top 16 bits).
pub fn partition_of(key: u64) -> u32 {
    (key >> 48) as u32
}

/// The leader's gateway of each partition, among `gateways`.
#[derive(Debug)]
pub struct Leaders {
    gateways: Vec<String>,
    by_partition: RwLock<HashMap<u32, usize>>,
}

/// `address` without a scheme or a trailing slash: `host:port`.
fn host_port(address: &str) -> &str {
    let address = address.split_once("://").map_or(address, |(_, rest)| rest);
    address.trim_end_matches('/')
}

impl Leaders {
    /// A map over the caller's `gateways` (as it connects to them), empty
    /// until [`Leaders::learn`].
    pub fn new(gateways: &[String]) -> Leaders {
        Leaders { gateways: gateways.to_vec(), by_partition: RwLock::default() }
    }

    /// Takes in what `topology` says of every partition's leader.
    pub fn learn(&self, topology: &TopologyResponse) {
        // Two brokers may both say they lead while an election settles: the
        // higher term wins.
        let mut map: HashMap<u32, (u64, usize)> = HashMap::new();
        for broker in &topology.brokers {
            let Some(gateway) = self.gateways.iter().position(|g| host_port(g) == host_port(&broker.address)) else {
                continue;
            };
            for partition in broker.partitions.iter().filter(|p| p.role == "leader") {
                let entry = map.entry(partition.partition_id).or_insert((partition.term, gateway));
                if partition.term > entry.0 {
                    *entry = (partition.term, gateway);
                }
            }
        }
        *self.by_partition.write().expect("leaders lock") =
            map.into_iter().map(|(partition, (_, gateway))| (partition, gateway)).collect();
    }

    /// The gateway (as given to [`Leaders::new`]) on the node leading the
    /// partition of job `key`, if known.
    pub fn gateway_of_key(&self, key: u64) -> Option<&str> {
        let index = *self.by_partition.read().expect("leaders lock").get(&partition_of(key))?;
        Some(&self.gateways[index])
    }

    /// The gateways that lead at least one partition, in the order given to
    /// [`Leaders::new`]: where a producer's keyless creates need no forward.
    pub fn leading_gateways(&self) -> Vec<String> {
        let map = self.by_partition.read().expect("leaders lock");
        let mut indexes: Vec<usize> = map.values().copied().collect();
        indexes.sort_unstable();
        indexes.dedup();
        indexes.into_iter().map(|i| self.gateways[i].clone()).collect()
    }

    /// How many partitions each gateway's node leads, in the order given to
    /// [`Leaders::new`]: where a cluster's leader work sits.
    pub fn led_per_gateway(&self) -> Vec<usize> {
        let mut led = vec![0; self.gateways.len()];
        for index in self.by_partition.read().expect("leaders lock").values() {
            led[*index] += 1;
        }
        led
    }

    /// How many partitions have a known leader gateway.
    pub fn known(&self) -> usize {
        self.by_partition.read().expect("leaders lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::gateway::{BrokerInfo, PartitionInfo};

    fn broker(node_id: u64, address: &str, leads: &[u32], follows: &[u32]) -> BrokerInfo {
        let info = |id: u32, role: &str| PartitionInfo { partition_id: id, role: role.into(), ..Default::default() };
        let mut partitions: Vec<PartitionInfo> = leads.iter().map(|p| info(*p, "leader")).collect();
        partitions.extend(follows.iter().map(|p| info(*p, "follower")));
        BrokerInfo { node_id, address: address.into(), partitions, data_version: 0 }
    }

    #[test]
    fn a_key_goes_to_the_gateway_of_its_partitions_leader() {
        let gateways = vec!["http://127.0.0.1:7000".to_string(), "127.0.0.1:7001".to_string()];
        let leaders = Leaders::new(&gateways);
        assert_eq!(leaders.gateway_of_key(5), None, "nothing is known before the topology");
        leaders.learn(&TopologyResponse {
            brokers: vec![
                broker(0, "127.0.0.1:7000", &[0, 2], &[1]),
                broker(1, "127.0.0.1:7001/", &[1], &[0, 2]),
                broker(2, "0.0.0.0:7002", &[3], &[]),
            ],
            ..Default::default()
        });
        assert_eq!(leaders.gateway_of_key(7), Some("http://127.0.0.1:7000"), "partition 0");
        assert_eq!(leaders.gateway_of_key((1 << 48) | 7), Some("127.0.0.1:7001"), "partition 1");
        assert_eq!(leaders.gateway_of_key((2 << 48) | 7), Some("http://127.0.0.1:7000"), "partition 2");
        assert_eq!(leaders.gateway_of_key((3 << 48) | 7), None, "a gateway the caller does not use");
        assert_eq!(leaders.known(), 3);
        assert_eq!(leaders.leading_gateways(), gateways, "both lead something");
        assert_eq!(leaders.led_per_gateway(), vec![2, 1], "partition 3's gateway is not the caller's");
        leaders
            .learn(&TopologyResponse { brokers: vec![broker(1, "127.0.0.1:7001", &[0], &[])], ..Default::default() });
        assert_eq!(leaders.gateway_of_key(7), Some("127.0.0.1:7001"), "a new leader replaces the old");
        assert_eq!(leaders.known(), 1, "what the new topology does not say is forgotten");
    }

    #[test]
    fn of_two_brokers_that_say_they_lead_the_higher_term_wins() {
        let gateways = vec!["127.0.0.1:7000".to_string(), "127.0.0.1:7001".to_string()];
        let leaders = Leaders::new(&gateways);
        let mut old = broker(0, "127.0.0.1:7000", &[0], &[]);
        old.partitions[0].term = 4;
        let mut new = broker(1, "127.0.0.1:7001", &[0], &[]);
        new.partitions[0].term = 5;
        for brokers in [vec![old.clone(), new.clone()], vec![new, old]] {
            leaders.learn(&TopologyResponse { brokers, ..Default::default() });
            assert_eq!(leaders.gateway_of_key(1), Some("127.0.0.1:7001"));
        }
    }
}
