//! Where nodes are (region and zone) and which nodes hold each partition.
//! Part of the client build too: tools that check a cluster's replicas
//! (the fault suite) compute the same placement.
//!
//! Locations come from the member list (`ID=HOST:PORT@REGION/ZONE`), the
//! same on every node, so every node computes the same placement without
//! asking anyone. Without locations, partition `p` lives on nodes
//! `(p + i) mod cluster size`, as clusters formed before locations existed
//! do. With them, each partition's replicas go to distinct zones while there
//! are enough zones, and spread over regions, the least-loaded node first;
//! the placement is fixed when the cluster forms (the data directory records
//! a digest of it, and a node refuses a member list that would move replicas).

use std::collections::{BTreeMap, BTreeSet};

pub mod rebalance;

/// A node's id, as in the member list.
pub type NodeId = u64;
/// A partition's number.
pub type PartitionId = u32;

/// A node's region and zone; empty strings where not given.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
pub struct Location {
    pub region: String,
    pub zone: String,
}

impl Location {
    /// Parses `REGION/ZONE` or `REGION`.
    pub fn parse(text: &str) -> anyhow::Result<Location> {
        let (region, zone) = text.split_once('/').unwrap_or((text, ""));
        let valid = |s: &str| s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if region.is_empty() || !valid(region) || !valid(zone) || zone.contains('/') {
            anyhow::bail!(
                "location {text:?} must be REGION or REGION/ZONE of letters, digits, '-', '_' and '.', for example \
                 eu-west-1/eu-west-1a"
            );
        }
        Ok(Location { region: region.into(), zone: zone.into() })
    }

    pub fn is_empty(&self) -> bool {
        self.region.is_empty() && self.zone.is_empty()
    }

    /// The zone as a placement unit: a node without a zone is its own.
    fn zone_key(&self, node: NodeId) -> (String, String) {
        if self.zone.is_empty() {
            (self.region.clone(), format!("node-{node}"))
        } else {
            (self.region.clone(), self.zone.clone())
        }
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.region.is_empty(), self.zone.is_empty()) {
            (true, _) => f.write_str("-"),
            (false, true) => f.write_str(&self.region),
            (false, false) => write!(f, "{}/{}", self.region, self.zone),
        }
    }
}

/// The replicas of every partition, first node first.
pub fn place(partitions: u32, replication_factor: u32, locations: &BTreeMap<NodeId, Location>) -> Vec<Vec<NodeId>> {
    let size = locations.len().max(1) as u32;
    if locations.values().all(Location::is_empty) {
        return (0..partitions)
            .map(|p| (0..replication_factor).map(|i| ((p + i) % size) as NodeId).collect())
            .collect();
    }
    let mut load: BTreeMap<NodeId, u32> = locations.keys().map(|n| (*n, 0)).collect();
    let mut placement = Vec::with_capacity(partitions as usize);
    for p in 0..partitions {
        let mut chosen: Vec<NodeId> = Vec::new();
        let mut zones: BTreeSet<(String, String)> = BTreeSet::new();
        let mut regions: BTreeMap<String, u32> = BTreeMap::new();
        for _ in 0..replication_factor.min(size) {
            // Unused zone first, then the region with fewest replicas so far,
            // then the least-loaded node, then a rotation by partition.
            let best = locations
                .iter()
                .filter(|(n, _)| !chosen.contains(n))
                .min_by_key(|(n, loc)| {
                    (
                        zones.contains(&loc.zone_key(**n)),
                        regions.get(&loc.region).copied().unwrap_or(0),
                        load[n],
                        (**n as u32 + size - p % size) % size,
                    )
                })
                .map(|(n, loc)| (*n, loc.clone()))
                .expect("fewer replicas than nodes");
            zones.insert(best.1.zone_key(best.0));
            *regions.entry(best.1.region.clone()).or_default() += 1;
            *load.get_mut(&best.0).expect("known node") += 1;
            chosen.push(best.0);
        }
        placement.push(chosen);
    }
    placement
}

/// A digest of a placement, recorded when the cluster forms; 0 for the
/// rotation of clusters without locations (which records none).
pub fn digest(placement: &[Vec<NodeId>], locations: &BTreeMap<NodeId, Location>) -> u64 {
    if locations.values().all(Location::is_empty) {
        return 0;
    }
    // FNV-1a: stable across builds and platforms.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (p, nodes) in placement.iter().enumerate() {
        for n in std::iter::once(p as u64).chain(nodes.iter().copied()) {
            for byte in n.to_le_bytes() {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    hash.max(1)
}

/// Each partition's preferred leader: one of its replicas that `eligible`
/// accepts (any replica, when it accepts none of a partition's), chosen so
/// that leadership spreads evenly: the replica preferred for the fewest
/// partitions so far, the first in placement order among equals. Without
/// locations that is node `p mod cluster size` for partition `p`. Every node
/// computes the same from the same placement.
pub fn preferred_leaders(placement: &[Vec<NodeId>], eligible: impl Fn(NodeId) -> bool) -> Vec<NodeId> {
    let mut preferred_for: BTreeMap<NodeId, usize> = BTreeMap::new();
    let mut leaders = Vec::with_capacity(placement.len());
    for replicas in placement {
        let candidates: Vec<NodeId> = match replicas.iter().copied().filter(|n| eligible(*n)).collect::<Vec<_>>() {
            some if !some.is_empty() => some,
            _ => replicas.clone(),
        };
        // `min_by_key` keeps the first of equals: placement order breaks ties.
        let leader = candidates
            .into_iter()
            .min_by_key(|n| preferred_for.get(n).copied().unwrap_or(0))
            .expect("every partition has a replica");
        *preferred_for.entry(leader).or_default() += 1;
        leaders.push(leader);
    }
    leaders
}

/// The partitions a node's replicas belong to, for tests and tools.
pub fn partitions_of(placement: &[Vec<NodeId>], node: NodeId) -> Vec<PartitionId> {
    placement.iter().enumerate().filter(|(_, nodes)| nodes.contains(&node)).map(|(p, _)| p as PartitionId).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn locations(spec: &[&str]) -> BTreeMap<NodeId, Location> {
        spec.iter().enumerate().map(|(i, s)| (i as NodeId, Location::parse(s).unwrap())).collect()
    }

    #[test]
    fn without_locations_the_rotation_stays() {
        let none: BTreeMap<NodeId, Location> = (0..5).map(|n| (n, Location::default())).collect();
        assert_eq!(place(3, 3, &none), vec![vec![0, 1, 2], vec![1, 2, 3], vec![2, 3, 4]]);
        assert_eq!(digest(&place(3, 3, &none), &none), 0);
    }

    #[test]
    fn replicas_never_share_a_zone_while_there_are_enough_zones() {
        // Zone a holds three nodes; the rotation would put two replicas there.
        let locs = locations(&["r1/a", "r1/a", "r1/a", "r1/b", "r1/c", "r2/d"]);
        for (p, nodes) in place(12, 3, &locs).iter().enumerate() {
            let zones: BTreeSet<&str> = nodes.iter().map(|n| locs[n].zone.as_str()).collect();
            assert_eq!(zones.len(), 3, "partition {p}: {nodes:?}");
        }
    }

    #[test]
    fn replicas_spread_over_regions_and_load() {
        // Three nodes in A, two in B: every partition has a majority in one
        // region and a replica in the other.
        let locs = locations(&["a/a1", "a/a2", "a/a3", "b/b1", "b/b2"]);
        let placement = place(10, 3, &locs);
        let mut load = BTreeMap::new();
        for nodes in &placement {
            let regions: BTreeSet<&str> = nodes.iter().map(|n| locs[n].region.as_str()).collect();
            assert_eq!(regions.len(), 2, "{nodes:?}");
            for n in nodes {
                *load.entry(*n).or_insert(0) += 1;
            }
        }
        // Every partition needs a replica in b's two nodes, so b's nodes
        // carry a little more; never far from even.
        let (min, max) = (load.values().min().unwrap(), load.values().max().unwrap());
        assert!(max - min <= 2, "replicas per node {load:?}");
        assert_eq!(placement, place(10, 3, &locs), "the same on every node");
        assert_ne!(digest(&placement, &locs), 0);
    }

    #[test]
    fn preferred_leaders_spread_evenly_over_the_nodes() {
        let none = |n: u64| -> BTreeMap<NodeId, Location> { (0..n).map(|i| (i, Location::default())).collect() };
        // The rotation: partition p prefers node p mod size.
        assert_eq!(preferred_leaders(&place(6, 3, &none(3)), |_| true), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(preferred_leaders(&place(5, 3, &none(5)), |_| true), vec![0, 1, 2, 3, 4]);
        for (nodes, partitions) in [(3, 3), (3, 12), (5, 7), (4, 10)] {
            let leaders = preferred_leaders(&place(partitions, 3, &none(nodes)), |_| true);
            let mut led = vec![0; nodes as usize];
            for leader in &leaders {
                led[*leader as usize] += 1;
            }
            let (min, max) = (led.iter().min().unwrap(), led.iter().max().unwrap());
            assert!(max - min <= 1, "{nodes} nodes, {partitions} partitions: {led:?}");
        }
        // One replica: it leads.
        assert_eq!(preferred_leaders(&place(2, 1, &none(1)), |_| true), vec![0, 0]);
    }

    #[test]
    fn preferred_leaders_stay_in_leader_regions_while_a_replica_is_there() {
        let locs = locations(&["a/a1", "a/a2", "a/a3", "b/b1", "b/b2"]);
        let placement = place(10, 3, &locs);
        let in_a = |n: NodeId| locs[&n].region == "a";
        let leaders = preferred_leaders(&placement, in_a);
        for (p, leader) in leaders.iter().enumerate() {
            assert!(placement[p].contains(leader), "partition {p}: {leader} holds no replica");
            assert!(in_a(*leader), "partition {p} prefers {leader}, outside a");
        }
        let led: BTreeSet<NodeId> = leaders.iter().copied().collect();
        assert_eq!(led, [0, 1, 2].into(), "every node of a leads something");
        // No replica in the regions: any replica.
        let only_b = place(1, 1, &locations(&["b/b1"]));
        assert_eq!(preferred_leaders(&only_b, |_| false), vec![0]);
    }

    #[test]
    fn a_location_must_be_region_or_region_slash_zone() {
        assert_eq!(Location::parse("eu-west-1").unwrap().region, "eu-west-1");
        assert_eq!(Location::parse("eu-west-1/eu-west-1a").unwrap().zone, "eu-west-1a");
        for bad in ["", "/a", "a/b/c", "a b"] {
            assert!(Location::parse(bad).is_err(), "{bad:?}");
        }
    }
}
