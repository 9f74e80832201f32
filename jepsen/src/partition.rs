//! The shapes a network partition can take, as grudges: for every node, the
//! nodes whose packets it drops on arrival. The nemesis turns a grudge into
//! nftables input rules, one table per node.
//!
//! Two-way kinds (isolate, halves, ring, bridge) hold symmetric grudges; a
//! one-way grudge drops packets in one direction only.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

/// Node -> the nodes whose packets it drops.
pub type Grudge = BTreeMap<usize, BTreeSet<usize>>;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// One random node against the rest.
    IsolateOne,
    /// The nodes shuffled and cut in two at a random point.
    Halves,
    /// The leader of partition 0 against the rest.
    IsolateLeader,
    /// Every node sees a majority, each a different one.
    Ring,
    /// Two halves that both see one bridge node, but not each other.
    Bridge,
    /// One node drops what arrives from one or all of the others; they still
    /// hear it.
    OneWay,
}

impl Kind {
    pub const ALL: [Kind; 6] =
        [Kind::IsolateOne, Kind::Halves, Kind::IsolateLeader, Kind::Ring, Kind::Bridge, Kind::OneWay];
}

/// The grudge that cuts every node of `a` from every node of `b`, both ways.
pub fn split(a: &[usize], b: &[usize]) -> Grudge {
    let mut grudge = Grudge::new();
    for x in a {
        grudge.entry(*x).or_default().extend(b.iter().copied());
    }
    for y in b {
        grudge.entry(*y).or_default().extend(a.iter().copied());
    }
    grudge.retain(|_, from| !from.is_empty());
    grudge
}

/// A majorities ring over the nodes in `order` (a shuffled list of every node):
/// each node hears only its ring neighbours within distance `d`, the smallest
/// distance at which `2d + 1` nodes are a majority. Every node then sees a
/// majority, and the sets differ because each misses different nodes.
///
/// With 3 nodes (or fewer) no such ring exists: a majority is 2, and symmetric
/// links cannot give three nodes three different pairs. Then it is the bridge,
/// which does have the property there: the two ends see {end, bridge}, the
/// bridge sees all three.
pub fn ring(order: &[usize]) -> Grudge {
    let n = order.len();
    let majority = n / 2 + 1;
    let d = (majority - 1).div_ceil(2);
    if 2 * d + 1 >= n {
        return bridge(order);
    }
    let mut grudge = Grudge::new();
    for (pos, node) in order.iter().enumerate() {
        for (other_pos, other) in order.iter().enumerate() {
            let distance = pos.abs_diff(other_pos).min(n - pos.abs_diff(other_pos));
            if distance > d {
                grudge.entry(*node).or_default().insert(*other);
            }
        }
    }
    grudge
}

/// The first node of `order` is the bridge; the rest are cut in two halves
/// (the first ⌊(n-1)/2⌋ nodes after the bridge, and the others) that do not
/// see each other. Both halves see the bridge, and with an odd number of nodes
/// each half plus the bridge is a majority.
pub fn bridge(order: &[usize]) -> Grudge {
    let Some((_, rest)) = order.split_first() else { return Grudge::new() };
    let (a, b) = rest.split_at(rest.len() / 2);
    split(a, b)
}

/// `node` drops every packet arriving from `from`, nothing else.
pub fn one_way(node: usize, from: &[usize]) -> Grudge {
    let mut grudge = Grudge::new();
    let from: BTreeSet<usize> = from.iter().copied().filter(|f| *f != node).collect();
    if !from.is_empty() {
        grudge.insert(node, from);
    }
    grudge
}

/// The nodes each of `nodes` hears (itself included), by node id.
pub fn hears(grudge: &Grudge, nodes: &[usize]) -> BTreeMap<usize, BTreeSet<usize>> {
    nodes
        .iter()
        .map(|i| (*i, nodes.iter().copied().filter(|j| grudge.get(i).is_none_or(|from| !from.contains(j))).collect()))
        .collect()
}

/// Whether every dropped direction is dropped the other way too.
#[cfg(test)]
pub fn symmetric(grudge: &Grudge) -> bool {
    grudge.iter().all(|(a, from)| from.iter().all(|b| grudge.get(b).is_some_and(|f| f.contains(a))))
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::SeedableRng;

    use super::*;

    fn majority(n: usize) -> usize {
        n / 2 + 1
    }

    #[test]
    fn ring_gives_every_node_a_different_majority() {
        for n in 3..=9 {
            let mut order: Vec<usize> = (0..n).collect();
            order.shuffle(&mut StdRng::seed_from_u64(n as u64));
            let grudge = ring(&order);
            assert!(symmetric(&grudge), "{n} nodes: {grudge:?}");
            let hears = hears(&grudge, &(0..n).collect::<Vec<_>>());
            for (i, set) in &hears {
                assert!(set.contains(i));
                assert!(set.len() >= majority(n), "{n} nodes: node {i} hears {set:?}");
                assert!(set.len() < n || n == 3, "{n} nodes: node {i} hears everyone");
            }
            let distinct: BTreeSet<&BTreeSet<usize>> = hears.values().collect();
            assert_eq!(distinct.len(), n, "{n} nodes: {hears:?}");
        }
    }

    #[test]
    fn five_node_ring_is_neighbours_only() {
        let grudge = ring(&[3, 0, 4, 1, 2]);
        let hears = hears(&grudge, &[0, 1, 2, 3, 4]);
        assert_eq!(hears[&3], BTreeSet::from([2, 3, 0]));
        assert_eq!(hears[&0], BTreeSet::from([3, 0, 4]));
        assert_eq!(hears[&4], BTreeSet::from([0, 4, 1]));
        assert_eq!(hears[&1], BTreeSet::from([4, 1, 2]));
        assert_eq!(hears[&2], BTreeSet::from([1, 2, 3]));
    }

    #[test]
    fn three_node_ring_is_a_bridge() {
        let grudge = ring(&[1, 2, 0]);
        assert_eq!(grudge, bridge(&[1, 2, 0]));
        let hears = hears(&grudge, &[0, 1, 2]);
        assert_eq!(hears[&1], BTreeSet::from([0, 1, 2]));
        assert_eq!(hears[&2], BTreeSet::from([1, 2]));
        assert_eq!(hears[&0], BTreeSet::from([0, 1]));
    }

    #[test]
    fn bridge_sees_all_and_the_halves_do_not_see_each_other() {
        for (n, order) in [(3, vec![2, 0, 1]), (5, vec![4, 1, 3, 0, 2])] {
            let grudge = bridge(&order);
            assert!(symmetric(&grudge));
            let hears = hears(&grudge, &(0..n).collect::<Vec<_>>());
            assert_eq!(hears[&order[0]].len(), n, "the bridge sees all");
            let half = (n - 1) / 2;
            let (a, b) = order[1..].split_at(half);
            for x in a {
                assert_eq!(hears[x], a.iter().copied().chain([order[0]]).collect());
                assert!(hears[x].len() >= majority(n));
            }
            for y in b {
                assert_eq!(hears[y], b.iter().copied().chain([order[0]]).collect());
                assert!(hears[y].len() >= majority(n));
            }
        }
    }

    #[test]
    fn one_way_drops_one_direction() {
        let grudge = one_way(1, &[0, 1, 2]);
        assert_eq!(grudge, Grudge::from([(1, BTreeSet::from([0, 2]))]));
        assert!(!symmetric(&grudge));
        let hears = hears(&grudge, &[0, 1, 2]);
        assert_eq!(hears[&1], BTreeSet::from([1]));
        assert_eq!(hears[&0], BTreeSet::from([0, 1, 2]));
        assert!(one_way(1, &[1]).is_empty());
    }

    #[test]
    fn split_is_symmetric() {
        let grudge = split(&[0], &[1, 2]);
        assert!(symmetric(&grudge));
        assert_eq!(hears(&grudge, &[0, 1, 2])[&0], BTreeSet::from([0]));
        assert_eq!(hears(&grudge, &[0, 1, 2])[&1], BTreeSet::from([1, 2]));
    }

    #[test]
    fn hears_names_nodes_by_id_when_ids_have_gaps() {
        // Members after the membership nemesis removed 0 and 2 and added 4 and 7.
        let grudge = split(&[4], &[1, 7]);
        let hears = hears(&grudge, &[1, 4, 7]);
        assert_eq!(hears[&4], BTreeSet::from([4]));
        assert_eq!(hears[&7], BTreeSet::from([1, 7]));
        assert_eq!(hears.len(), 3);
    }
}
