//! What clients waited during a run: figures, not checks. A slow recovery
//! loses nothing, so it never makes a run invalid; these numbers are what
//! the failover and rolling-restart targets are measured by.
//!
//! - After each fault that stops a node (a kill, a restart, a rolling
//!   SIGTERM, a crash that drops unsynced writes): the longest any partition
//!   went without an acknowledged create, from its last acknowledgement
//!   before the fault to its first after it.
//! - Over the whole run: the longest any single create, and any single
//!   completion, waited from its invocation to its acknowledgement.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::history::{Kind, Op, Phase};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Availability {
    pub pauses: Vec<Pause>,
    pub longest_create_ms: u64,
    pub longest_completion_ms: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pause {
    /// When the fault began, ms into the run.
    pub at_ms: u64,
    /// Its nemesis and kind, as `kill/one` or `rolling/sigterm`.
    pub kind: String,
    pub fault: String,
    /// The longest gap in any partition's create acknowledgements across it;
    /// `None` when no create was acknowledged on some partition afterwards.
    pub pause_ms: Option<u64>,
}

impl Availability {
    pub fn summary(&self) -> String {
        let pauses: Vec<String> = self
            .pauses
            .iter()
            .map(|p| format!("{} {}", p.kind, p.pause_ms.map_or_else(|| "none after".to_string(), |ms| ms.to_string())))
            .collect();
        format!(
            "longest create wait {} ms, longest completion wait {} ms; acknowledgement pause after each node stop (ms): [{}]",
            self.longest_create_ms,
            self.longest_completion_ms,
            pauses.join(", ")
        )
    }
}

/// A job key's partition (its high bits).
fn partition_of(key: u64) -> u64 {
    key >> 48
}

/// A fault that stopped nodes: when it began (ms into the run), its kind and
/// its description.
pub type Stop = (u64, String, String);

/// The figures of `history`, for the node-stopping faults `stops`.
pub fn measure(history: &[Op], stops: &[Stop]) -> Availability {
    // Each process runs one operation at a time: an invocation's completion
    // is that process's next event.
    let mut open: BTreeMap<u64, &Op> = BTreeMap::new();
    let (mut longest_create, mut longest_completion) = (0, 0);
    let mut acks: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for op in history {
        if op.phase == Phase::Invoke {
            open.insert(op.process, op);
            continue;
        }
        let Some(invoked) = open.remove(&op.process) else { continue };
        if op.phase != Phase::Ok || invoked.kind != op.kind {
            continue;
        }
        let waited = op.time_ms.saturating_sub(invoked.time_ms);
        match op.kind {
            Kind::Create => {
                longest_create = longest_create.max(waited);
                if let Some(key) = op.key {
                    acks.entry(partition_of(key)).or_default().push(op.time_ms);
                }
            }
            Kind::Complete => longest_completion = longest_completion.max(waited),
            _ => {}
        }
    }
    for times in acks.values_mut() {
        times.sort_unstable();
    }
    let pauses = stops
        .iter()
        .map(|(at, kind, fault)| {
            // Partitions with no acknowledgement before the fault say nothing
            // of it; one with none after it never recovered within the run.
            let mut gaps = acks.values().filter_map(|times| {
                let before = times.iter().rev().find(|t| **t <= *at)?;
                Some(times.iter().find(|t| **t > *at).map(|after| after - before))
            });
            let longest = gaps.try_fold(0, |longest, gap| Some(longest.max(gap?)));
            Pause { at_ms: *at, kind: kind.clone(), fault: fault.clone(), pause_ms: longest }
        })
        .collect();
    Availability { pauses, longest_create_ms: longest_create, longest_completion_ms: longest_completion }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(time_ms: u64, process: u64, kind: Kind, phase: Phase, key: Option<u64>) -> Op {
        Op { time_ms, process, kind, phase, key, ..Default::default() }
    }

    #[test]
    fn waits_pair_each_invocation_with_its_process_s_next_event() {
        let history = vec![
            op(0, 1, Kind::Create, Phase::Invoke, None),
            op(5, 2, Kind::Complete, Phase::Invoke, None),
            op(40, 1, Kind::Create, Phase::Ok, Some(1)),
            op(45, 1, Kind::Create, Phase::Invoke, None),
            // Unknown outcomes are not waits that ended.
            op(2_000, 1, Kind::Create, Phase::Info, None),
            op(905, 2, Kind::Complete, Phase::Ok, None),
        ];
        let figures = measure(&history, &[]);
        assert_eq!((figures.longest_create_ms, figures.longest_completion_ms), (40, 900));
    }

    #[test]
    fn a_pause_is_the_longest_partition_gap_across_the_fault() {
        let p0 = |n: u64| n;
        let p1 = |n: u64| (1 << 48) | n;
        let mut history = Vec::new();
        for (t, key) in [(100, p0(1)), (200, p1(1)), (1_000, p0(2)), (2_500, p1(2)), (3_000, p0(3))] {
            history.push(op(t - 1, 7, Kind::Create, Phase::Invoke, None));
            history.push(op(t, 7, Kind::Create, Phase::Ok, Some(key)));
        }
        let kill = |at: u64| (at, "kill/one".to_string(), "SIGKILL nodes [0]".to_string());
        let figures = measure(&history, &[kill(300), kill(2_600), kill(2_900)]);
        let pauses: Vec<Option<u64>> = figures.pauses.iter().map(|p| p.pause_ms).collect();
        // Partition 1 went from 200 to 2,500; partition 0 from 100 to 1,000.
        // After 2,600 partition 1 acknowledged nothing more.
        assert_eq!(pauses, [Some(2_300), None, None]);
    }
}
