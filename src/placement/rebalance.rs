//! Where replicas go when the members change: from the placement in force
//! and the new member list, the target placement, reached by moving as few
//! replicas as it can, and the moves that lead there. The rules are the
//! placement's ([`crate::placement`]): a partition's replicas in distinct
//! zones while there are enough, spread over regions, and as even a load per
//! node as the zones allow. Pure and deterministic, so every node computes
//! the same; the cluster plan that carries the moves out is
//! `docs/design/membership.md` (proposed: nothing calls this yet).

use std::collections::{BTreeMap, BTreeSet};

use super::{Location, NodeId, PartitionId};

/// One replica of a partition moving from one node to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Move {
    pub partition: PartitionId,
    pub from: NodeId,
    pub to: NodeId,
}

/// The placement `members` should hold, from `current`: replicas on nodes
/// that are no longer members are replaced, partitions short of
/// `replication_factor` replicas are filled, and replicas move from the
/// most to the least loaded nodes while that keeps each partition's zones
/// and regions as spread as they were; a partition whose replicas share a
/// zone while another zone could take one is spread first.
pub fn target(
    current: &[Vec<NodeId>],
    members: &BTreeMap<NodeId, Location>,
    replication_factor: u32,
) -> Vec<Vec<NodeId>> {
    let want = (replication_factor as usize).min(members.len());
    let mut placement: Vec<Vec<NodeId>> =
        current.iter().map(|nodes| nodes.iter().copied().filter(|n| members.contains_key(n)).collect()).collect();
    let mut load: BTreeMap<NodeId, usize> = members.keys().map(|n| (*n, 0)).collect();
    for nodes in &placement {
        for n in nodes {
            *load.get_mut(n).expect("a member") += 1;
        }
    }
    // Fill: an unused zone first, then the region with fewest replicas of
    // the partition, then the least loaded node (the lowest id among equals).
    for nodes in placement.iter_mut() {
        while nodes.len() < want {
            let best = members
                .iter()
                .filter(|(n, _)| !nodes.contains(n))
                .min_by_key(|(n, loc)| {
                    let zone_used = nodes.iter().any(|m| zone_of(members, *m) == loc_zone(loc, **n));
                    let region_count = nodes.iter().filter(|m| members[m].region == loc.region).count();
                    (zone_used, region_count, load[n], **n)
                })
                .map(|(n, _)| *n)
                .expect("fewer replicas than members");
            nodes.push(best);
            *load.get_mut(&best).expect("a member") += 1;
        }
    }
    // Repair: a partition whose replicas share a zone while another zone
    // could take one moves a replica there (the least loaded node of the
    // unused zones).
    for nodes in placement.iter_mut() {
        loop {
            let zones: BTreeSet<_> = nodes.iter().map(|n| zone_of(members, *n)).collect();
            if zones.len() == nodes.len() {
                break;
            }
            // A replica whose zone another replica shares (the later one).
            let from = *nodes
                .iter()
                .enumerate()
                .rev()
                .find(|(i, n)| nodes[..*i].iter().any(|m| zone_of(members, *m) == zone_of(members, **n)))
                .map(|(_, n)| n)
                .expect("a shared zone");
            let to = members
                .iter()
                .filter(|(n, loc)| !nodes.contains(n) && !zones.contains(&loc_zone(loc, **n)))
                .min_by_key(|(n, loc)| {
                    let region_count = nodes.iter().filter(|m| members[m].region == loc.region).count();
                    (region_count, load[n], **n)
                })
                .map(|(n, _)| *n);
            let Some(to) = to else { break };
            let at = nodes.iter().position(|n| *n == from).expect("a replica");
            nodes[at] = to;
            *load.get_mut(&from).expect("a member") -= 1;
            *load.get_mut(&to).expect("a member") += 1;
        }
    }
    // Regions: a partition whose replicas leave a region out while they
    // share another moves one there (a node in a zone it does not use, the
    // least loaded), as a new cluster's placement spreads them.
    let regions: BTreeSet<&str> = members.values().map(|l| l.region.as_str()).collect();
    for nodes in placement.iter_mut() {
        loop {
            let used: BTreeSet<&str> = nodes.iter().map(|n| members[n].region.as_str()).collect();
            if used.len() >= regions.len().min(nodes.len()) {
                break;
            }
            // The later replica of the region that holds the most of them.
            let crowded = *used
                .iter()
                .max_by_key(|r| nodes.iter().filter(|n| members[*n].region == **r).count())
                .expect("replicas in some region");
            let from = *nodes.iter().rev().find(|n| members[*n].region == crowded).expect("a replica there");
            let zones: BTreeSet<_> = nodes.iter().filter(|n| **n != from).map(|n| zone_of(members, *n)).collect();
            let to = members
                .iter()
                .filter(|(n, loc)| !nodes.contains(n) && !used.contains(loc.region.as_str()))
                .filter(|(n, loc)| !zones.contains(&loc_zone(loc, **n)))
                .min_by_key(|(n, _)| (load[n], **n))
                .map(|(n, _)| *n);
            let Some(to) = to else { break };
            let at = nodes.iter().position(|n| *n == from).expect("a replica");
            nodes[at] = to;
            *load.get_mut(&from).expect("a member") -= 1;
            *load.get_mut(&to).expect("a member") += 1;
        }
    }
    // Even out: one replica at a time from the most to the least loaded
    // node that can take it without losing a zone or a region's spread.
    let bound = placement.len() * want + 1;
    for _ in 0..bound {
        let Some(step) = best_step(&placement, members, &load) else { break };
        let nodes = &mut placement[step.partition as usize];
        let at = nodes.iter().position(|n| *n == step.from).expect("the replica moves from its node");
        nodes[at] = step.to;
        *load.get_mut(&step.from).expect("a member") -= 1;
        *load.get_mut(&step.to).expect("a member") += 1;
    }
    placement
}

/// The replica moves from `current` to `target`: each partition's replicas
/// that leave, paired in order with those that arrive. A partition that
/// only loses replicas (fewer members than its replication factor) has none.
pub fn moves(current: &[Vec<NodeId>], target: &[Vec<NodeId>]) -> Vec<Move> {
    let mut moves = Vec::new();
    for (p, (before, after)) in current.iter().zip(target).enumerate() {
        let leaving = before.iter().filter(|n| !after.contains(n));
        let arriving = after.iter().filter(|n| !before.contains(n));
        for (from, to) in leaving.zip(arriving) {
            moves.push(Move { partition: p as PartitionId, from: *from, to: *to });
        }
    }
    moves
}

/// Replicas per member in `placement`.
pub fn load(placement: &[Vec<NodeId>], members: &BTreeMap<NodeId, Location>) -> BTreeMap<NodeId, usize> {
    let mut load: BTreeMap<NodeId, usize> = members.keys().map(|n| (*n, 0)).collect();
    for n in placement.iter().flatten() {
        if let Some(count) = load.get_mut(n) {
            *count += 1;
        }
    }
    load
}

fn loc_zone(loc: &Location, node: NodeId) -> (String, String) {
    if loc.zone.is_empty() {
        (loc.region.clone(), format!("node-{node}"))
    } else {
        (loc.region.clone(), loc.zone.clone())
    }
}

fn zone_of(members: &BTreeMap<NodeId, Location>, node: NodeId) -> (String, String) {
    loc_zone(&members[&node], node)
}

/// How spread a partition's replicas are: distinct zones, distinct regions.
fn spread(nodes: &[NodeId], members: &BTreeMap<NodeId, Location>) -> (usize, usize) {
    let zones: BTreeSet<_> = nodes.iter().map(|n| zone_of(members, *n)).collect();
    let regions: BTreeSet<_> = nodes.iter().map(|n| members[n].region.clone()).collect();
    (zones.len(), regions.len())
}

/// The move that narrows the gap between the most and the least loaded
/// nodes by one, keeping the partition's spread: `None` when the load is
/// even (within one) or no replica can move without losing spread.
fn best_step(
    placement: &[Vec<NodeId>],
    members: &BTreeMap<NodeId, Location>,
    load: &BTreeMap<NodeId, usize>,
) -> Option<Move> {
    let mut by_load: Vec<(usize, NodeId)> = load.iter().map(|(n, l)| (*l, *n)).collect();
    by_load.sort_unstable();
    // Most loaded first (highest id among equals), least loaded first.
    for &(high, from) in by_load.iter().rev() {
        for &(low, to) in &by_load {
            if high <= low + 1 {
                break;
            }
            for (p, nodes) in placement.iter().enumerate() {
                if !nodes.contains(&from) || nodes.contains(&to) {
                    continue;
                }
                let moved: Vec<NodeId> = nodes.iter().map(|n| if *n == from { to } else { *n }).collect();
                if spread(&moved, members) >= spread(nodes, members) {
                    return Some(Move { partition: p as PartitionId, from, to });
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::place;

    fn members(spec: &[(NodeId, &str)]) -> BTreeMap<NodeId, Location> {
        spec.iter().map(|(n, s)| (*n, Location::parse(s).unwrap())).collect()
    }

    /// Every partition has `rf` replicas on members, in distinct zones.
    fn assert_spread(placement: &[Vec<NodeId>], members: &BTreeMap<NodeId, Location>, rf: usize) {
        for (p, nodes) in placement.iter().enumerate() {
            assert_eq!(nodes.len(), rf, "partition {p}: {nodes:?}");
            assert!(nodes.iter().all(|n| members.contains_key(n)), "partition {p} on a non-member: {nodes:?}");
            assert_eq!(spread(nodes, members).0, rf, "partition {p} shares a zone: {nodes:?}");
        }
    }

    fn assert_even(placement: &[Vec<NodeId>], members: &BTreeMap<NodeId, Location>) {
        let load = load(placement, members);
        let (min, max) = (load.values().min().unwrap(), load.values().max().unwrap());
        assert!(max - min <= 1, "replicas per node {load:?}");
    }

    #[test]
    fn three_nodes_grow_to_five_and_shrink_to_four_spread_by_zone_with_even_load() {
        let three = members(&[(0, "r/a"), (1, "r/b"), (2, "r/c")]);
        let start = place(6, 3, &three);
        let five = members(&[(0, "r/a"), (1, "r/b"), (2, "r/c"), (3, "r/d"), (4, "r/e")]);
        let grown = target(&start, &five, 3);
        assert_spread(&grown, &five, 3);
        assert_even(&grown, &five);
        // 18 replicas over 5 nodes: the two new ones take 3 or 4 each, and
        // only that many replicas move.
        let moved = moves(&start, &grown);
        let new_load = load(&grown, &five);
        assert_eq!(moved.len(), new_load[&3] + new_load[&4], "{moved:?}");
        assert!(moved.iter().all(|m| m.to == 3 || m.to == 4), "only to the new nodes: {moved:?}");
        // Node 1 leaves: its replicas go to the others, nothing else moves.
        let four = members(&[(0, "r/a"), (2, "r/c"), (3, "r/d"), (4, "r/e")]);
        let shrunk = target(&grown, &four, 3);
        assert_spread(&shrunk, &four, 3);
        assert_even(&shrunk, &four);
        let moved = moves(&grown, &shrunk);
        assert!(moved.iter().all(|m| m.from == 1), "only node 1's replicas move: {moved:?}");
        assert_eq!(moved.len(), load(&grown, &five)[&1]);
        // Balanced already: nothing to do.
        assert_eq!(target(&shrunk, &four, 3), shrunk);
    }

    #[test]
    fn a_replaced_node_hands_its_replicas_to_the_new_one_in_its_zone() {
        let before = members(&[(0, "r/a"), (1, "r/b"), (2, "r/c"), (3, "r/a"), (4, "r/b"), (5, "r/c")]);
        let start = place(12, 3, &before);
        // Node 4 (zone b) is lost and replaced by node 6, also in zone b.
        let after = members(&[(0, "r/a"), (1, "r/b"), (2, "r/c"), (3, "r/a"), (5, "r/c"), (6, "r/b")]);
        let replaced = target(&start, &after, 3);
        assert_spread(&replaced, &after, 3);
        let moved = moves(&start, &replaced);
        assert!(moved.iter().all(|m| m.from == 4 && m.to == 6), "{moved:?}");
        assert_eq!(moved.len(), load(&start, &before)[&4], "each of node 4's replicas, once");
    }

    #[test]
    fn zones_are_kept_before_load_when_they_cannot_both_be() {
        // Zone a has three nodes, b and c one each: every partition needs b
        // and c, so they carry every partition and the a nodes share the rest.
        let uneven = members(&[(0, "r/a"), (1, "r/a"), (2, "r/a"), (3, "r/b"), (4, "r/c")]);
        let start: Vec<Vec<NodeId>> = vec![vec![0, 1, 2]; 6];
        let placed = target(&start, &uneven, 3);
        assert_spread(&placed, &uneven, 3);
        let load = load(&placed, &uneven);
        assert_eq!((load[&3], load[&4]), (6, 6), "{load:?}");
        assert_eq!(load[&0] + load[&1] + load[&2], 6, "{load:?}");
    }

    #[test]
    fn without_zones_each_node_is_its_own_and_fewer_members_than_replicas_keep_what_they_can() {
        let none: BTreeMap<NodeId, Location> = (0..4).map(|n| (n, Location::default())).collect();
        let start = place(4, 3, &(0..3).map(|n| (n, Location::default())).collect());
        let grown = target(&start, &none, 3);
        assert_spread(&grown, &none, 3);
        assert_even(&grown, &none);
        let two: BTreeMap<NodeId, Location> = (0..2).map(|n| (n, Location::default())).collect();
        let shrunk = target(&grown, &two, 3);
        assert!(shrunk.iter().all(|nodes| nodes.len() == 2), "two replicas each on two members: {shrunk:?}");
        // Replicas only leave the departed nodes, and only for the members.
        for m in moves(&grown, &shrunk) {
            assert!(m.from >= 2 && m.to < 2, "{m:?}");
        }
    }

    #[test]
    fn any_membership_change_ends_spread_over_the_zones_and_settled() {
        // A small deterministic generator: 300 clusters, each a random
        // start on 3-7 nodes over 2-5 zones, then a random new member list.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        };
        for case in 0..300 {
            let zones = 2 + next(4);
            let spec = |count: u64, first: NodeId, next: &mut dyn FnMut(u64) -> u64| -> BTreeMap<NodeId, Location> {
                (first..first + count).map(|n| (n, Location::parse(&format!("r/z{}", next(zones))).unwrap())).collect()
            };
            let before = spec(3 + next(5), 0, &mut next);
            let partitions = 1 + next(12) as u32;
            let start = place(partitions, 3, &before);
            // Keep some members, drop others, add new ones.
            let mut after: BTreeMap<NodeId, Location> =
                before.iter().filter(|_| next(4) != 0).map(|(n, l)| (*n, l.clone())).collect();
            after.extend(spec(next(4), 100, &mut next));
            if after.len() < 3 {
                continue;
            }
            let placed = target(&start, &after, 3);
            let distinct_zones = after.iter().map(|(n, l)| loc_zone(l, *n)).collect::<BTreeSet<_>>().len();
            for (p, nodes) in placed.iter().enumerate() {
                assert_eq!(nodes.len(), 3, "case {case}, partition {p}: {nodes:?}");
                assert!(nodes.iter().all(|n| after.contains_key(n)), "case {case}: {nodes:?}");
                assert_eq!(spread(nodes, &after).0, distinct_zones.min(3), "case {case}, partition {p}: {nodes:?}");
            }
            assert_eq!(target(&placed, &after, 3), placed, "case {case}: a second pass moves nothing");
        }
    }

    #[test]
    fn a_replacement_in_another_region_does_not_leave_a_region_without_a_replica() {
        // Region b's node 5 is replaced by node 6 in region a: partition 0
        // would have all three replicas in a while node 4 is in b.
        let members = members(&[(0, "a/a1"), (1, "a/a2"), (4, "b/b1"), (6, "a/a3")]);
        let current = vec![vec![0, 1, 6], vec![4, 0, 1]];
        let target = target(&current, &members, 3);
        for (p, nodes) in target.iter().enumerate() {
            assert_eq!(spread(nodes, &members), (3, 2), "partition {p} covers both regions: {nodes:?}");
        }
        assert_spread(&target, &members, 3);
    }
}
