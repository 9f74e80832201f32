//! A partition leader's steady clock, and the time a new leader resumes from
//! (see the module doc of [`super`], "Time").

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::GatewayLink;
use crate::core::{Millis, NodeId, PartitionId};
use crate::raft::Replica;

/// A partition leader's steady clock: see the module doc.
pub(super) struct LeaderClock {
    base: Millis,
    started: Instant,
}

/// How long a new leader without a clock estimate waits for its peers' clocks.
pub(super) const PEER_CLOCKS_WAIT: Duration = Duration::from_millis(500);

impl LeaderClock {
    pub(super) async fn start(replica: &Replica, link: &dyn GatewayLink) -> Self {
        let shared = replica.state();
        let base = match shared.clock_estimate() {
            Some(estimate) => estimate,
            None => {
                let replicated = shared.read(|s| s.clock());
                let peers: Vec<NodeId> =
                    replica.status().members.into_iter().filter(|n| *n != replica.node_id()).collect();
                let answers = link.peer_clocks(peers.clone(), replica.partition, PEER_CLOCKS_WAIT).await;
                let estimates: Vec<Millis> = answers.iter().filter_map(|a| a.estimate).collect();
                let mut walls: Vec<Millis> = answers.iter().map(|a| a.wall).collect();
                walls.push(now_millis());
                resume_time(replica, replicated, &estimates, walls, peers.len() + 1)
            }
        };
        LeaderClock { base, started: Instant::now() }
    }

    pub(super) fn now(&self) -> Millis {
        self.base.saturating_add(self.started.elapsed().as_millis() as Millis)
    }
}

/// The time a leader that has seen no entry apply since it started takes up
/// from, never before the replicated time:
/// - with estimates of the partition's time from enough peers that, with
///   itself, a majority of the replicas answered: the lower median of those
///   estimates. A peer that kept running knows the partition's time from the
///   entries it applied and its own steady clock, so the time goes on from
///   where the partition was, whatever the wall clocks say;
/// - otherwise (a new partition, or most replicas restarted too), with a
///   majority's wall clocks (its own among them): their lower median, so the
///   partition's time, which jobs' timestamps show, stays near the wall
///   clocks and one node's clock moves nothing;
/// - alone (no peers): its own wall clock;
/// - with neither: the replicated time plus the time this replica has run,
///   so timers fire late by the outage, never early.
///
/// Estimates come first because the partition's time may lag the wall
/// clocks (every hand-over starts from an entry's time as a replica saw it
/// applied, and a leader without a majority resumes from its last entry):
/// moving it up to them while leases run would end those leases early by
/// the lag. That can still happen after most replicas restarted together.
pub(super) fn resume_time(
    replica: &Replica,
    replicated: Millis,
    estimates: &[Millis],
    walls: Vec<Millis>,
    replicas: usize,
) -> Millis {
    let partition = replica.partition;
    let resume = choose_resume_time(replicated, estimates, &walls, replicas);
    if matches!(resume, Resume::WallClocks(_)) {
        warn_if_wall_clock_off(partition, &walls);
    }
    match resume {
        Resume::Estimates(time) | Resume::WallClocks(time) | Resume::OwnWallClock(time) => time,
        Resume::Replicated => {
            tracing::warn!(
                partition,
                answered = walls.len(),
                replicas,
                "leading without a majority's clocks: the partition's time resumes from its last entry"
            );
            replicated.saturating_add(replica.running_for().as_millis() as Millis)
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum Resume {
    Estimates(Millis),
    WallClocks(Millis),
    OwnWallClock(Millis),
    /// From the replicated time plus the time this replica has run.
    Replicated,
}

/// The decision of [`resume_time`]; `walls` ends with this node's own.
pub(super) fn choose_resume_time(
    replicated: Millis,
    estimates: &[Millis],
    walls: &[Millis],
    replicas: usize,
) -> Resume {
    let lower_median = |values: &[Millis]| {
        let mut values = values.to_vec();
        values.sort_unstable();
        values[(values.len() - 1) / 2].max(replicated)
    };
    if replicas <= 1 {
        return Resume::OwnWallClock(walls.last().copied().unwrap_or(replicated).max(replicated));
    }
    let majority = replicas / 2 + 1;
    if !estimates.is_empty() && estimates.len() + 1 >= majority {
        return Resume::Estimates(lower_median(estimates));
    }
    if walls.len() >= majority {
        return Resume::WallClocks(lower_median(walls));
    }
    Resume::Replicated
}

pub(super) fn warn_if_wall_clock_off(partition: PartitionId, walls: &[Millis]) {
    let Some(own) = walls.last().copied() else { return };
    let mut sorted = walls.to_vec();
    sorted.sort_unstable();
    let median = sorted[(sorted.len() - 1) / 2];
    if own.abs_diff(median) > 1_000 {
        tracing::warn!(
            partition,
            off_ms = own - median,
            ?walls,
            "this node's wall clock is off the other replicas'; the partition's time does not follow it"
        );
    }
}

pub fn now_millis() -> Millis {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as Millis).unwrap_or(0)
}

#[cfg(test)]
mod clock_tests {
    use super::{choose_resume_time, Resume};

    #[test]
    fn a_restarted_leader_resumes_from_its_peers_estimates_never_their_wall_clocks() {
        // Three replicas: one peer's estimate and this node make a majority.
        // The wall clocks are a second ahead of the partition's time (it
        // resumed from an entry after an earlier outage): they must not move it.
        let walls = [10_000, 10_000];
        assert_eq!(choose_resume_time(5_000, &[9_000], &walls, 3), Resume::Estimates(9_000));
        // Of several estimates the lower median, never before the replicated time.
        assert_eq!(choose_resume_time(5_000, &[9_000, 8_500, 9_100, 9_050], &walls, 5), Resume::Estimates(9_000));
        assert_eq!(choose_resume_time(9_500, &[9_000], &walls, 3), Resume::Estimates(9_500));
    }

    #[test]
    fn without_a_majority_of_estimates_a_majority_of_wall_clocks_sets_the_time() {
        // A new partition, or a full restart: the lower median of the wall
        // clocks (this node's last), so one clock an hour ahead moves nothing.
        assert_eq!(choose_resume_time(5_000, &[], &[10_000, 3_610_000], 3), Resume::WallClocks(10_000));
        assert_eq!(choose_resume_time(5_000, &[9_000], &[10_000, 11_000, 12_000], 5), Resume::WallClocks(11_000));
        assert_eq!(choose_resume_time(50_000, &[], &[10_000, 11_000], 3), Resume::WallClocks(50_000));
    }

    #[test]
    fn with_neither_the_time_resumes_from_the_last_entry() {
        assert_eq!(choose_resume_time(5_000, &[], &[10_000], 3), Resume::Replicated);
    }

    #[test]
    fn a_single_node_takes_its_own_wall_clock() {
        assert_eq!(choose_resume_time(5_000, &[], &[12_000], 1), Resume::OwnWallClock(12_000));
        assert_eq!(choose_resume_time(15_000, &[], &[12_000], 1), Resume::OwnWallClock(15_000));
    }
}
