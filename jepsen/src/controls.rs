//! Negative controls: runs with one bug planted in the nodes each, each of
//! which the checker must find, with the class that names that bug. A
//! control passes only when its run is INVALID and that class found
//! something; a class that never caught its planted bug is not a check.
//!
//! Each bug is a failpoint of Drover's (`src/failpoints.rs`, armed on every
//! node alike through `DROVER_FAILPOINTS`) or the WAL switch
//! (`--skip-wal-sync`). Bugs that act where entries are applied pick what
//! they act on from the entry itself, so every replica acts alike and the
//! bug shows as itself, not as replicas that disagree; the others act where
//! a leader proposes, or a gateway answers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::checker::{Report, Verdict};
use crate::Nemesis;

/// The longest drain of a control: a planted bug's damage does not heal,
/// so a control's drain runs out more often than a real run's, and every
/// class a control is held to is one no drain cut short can make (a lost
/// job can be one still unfinished, a completion rolled back cannot).
pub const DRAIN_SECS: u64 = 40;

/// One planted bug and what must catch it.
pub struct Control {
    /// Its name in the suite's summary.
    pub name: &'static str,
    /// What it plants, in words.
    pub plants: &'static str,
    pub nemesis: &'static [Nemesis],
    /// `DROVER_FAILPOINTS` on every node.
    pub failpoints: &'static str,
    pub skip_wal_sync: bool,
    /// With tokens, so with the attacker.
    pub tokens: bool,
    /// The checker's classes that name the bug: at least one must be found.
    pub caught_by: &'static [&'static str],
}

pub const CONTROLS: [Control; 7] = [
    Control {
        name: "no-wal-sync",
        plants: "nodes acknowledge writes without syncing their WAL, and lose power",
        nemesis: &[Nemesis::Power],
        failpoints: "",
        skip_wal_sync: true,
        tokens: false,
        // A write acknowledged and forgotten, in a class that only a
        // forgotten write makes (lost and divergent jobs may be unfinished).
        caught_by: &["completion rolled back", "duplicated", "duplicate create"],
    },
    Control {
        name: "completion-twice",
        plants: "a leader acknowledges a completion and hands the job out again",
        nemesis: &[Nemesis::Partition],
        failpoints: "leader_complete_requeues=20",
        skip_wal_sync: false,
        tokens: false,
        caught_by: &["duplicated"],
    },
    Control {
        name: "incident-from-nowhere",
        plants: "a leader proposes a worker's failure with no retries left",
        nemesis: &[Nemesis::Partition],
        failpoints: "leader_fail_exhausts=20",
        skip_wal_sync: false,
        tokens: false,
        caught_by: &["unexplained incident"],
    },
    Control {
        name: "tick-dropped",
        plants: "schedules pass over one tick in ten without making its job",
        nemesis: &[Nemesis::Partition],
        failpoints: "apply_drop_tick=1",
        skip_wal_sync: false,
        tokens: false,
        caught_by: &["tick missed"],
    },
    Control {
        name: "limit-overrun",
        plants: "limited queues let every activation through",
        nemesis: &[Nemesis::Partition],
        failpoints: "apply_limit_overrun=1",
        skip_wal_sync: false,
        tokens: false,
        caught_by: &["limit exceeded"],
    },
    Control {
        name: "cross-tenant-read",
        plants: "a principal's reads skip the job's tenant",
        nemesis: &[Nemesis::Partition],
        failpoints: "read_any_tenant=1000",
        skip_wal_sync: false,
        tokens: true,
        caught_by: &["cross-tenant read"],
    },
    Control {
        name: "completion-rolled-back",
        plants: "a leader acknowledges a completion and cancels the job",
        nemesis: &[Nemesis::Partition],
        failpoints: "leader_complete_cancels=20",
        skip_wal_sync: false,
        tokens: false,
        caught_by: &["completion rolled back"],
    },
];

/// What a run came to, as it keeps it in `verdict.json`: the verdict, each
/// class with how often it was found, and why it is UNKNOWN if it is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub verdict: String,
    pub classes: BTreeMap<String, usize>,
    pub unknown: Vec<String>,
}

impl Outcome {
    pub fn of(report: &Report) -> Outcome {
        Outcome {
            verdict: report.verdict().to_string(),
            classes: report.classes().into_iter().map(|(name, n)| (name.to_string(), n)).collect(),
            unknown: report.unknown.clone(),
        }
    }
}

impl Control {
    /// Whether `outcome` caught this control's bug: INVALID, with one of
    /// its classes found. Answers the classes found, for the summary.
    pub fn caught(&self, outcome: &Outcome) -> (bool, Vec<String>) {
        let found: Vec<String> =
            outcome.classes.iter().filter(|(_, n)| **n > 0).map(|(name, n)| format!("{name} {n}")).collect();
        let by_its_class = self.caught_by.iter().any(|class| outcome.classes.get(*class).is_some_and(|n| *n > 0));
        (outcome.verdict == Verdict::Invalid.to_string() && by_its_class, found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_passes_only_when_its_own_class_caught_it() {
        let control = &CONTROLS[1];
        let mut report = Report { valid: true, ..Report::default() };
        assert!(!control.caught(&Outcome::of(&report)).0, "a valid run caught nothing");
        report.valid = false;
        report.stale = vec![7];
        let (caught, found) = control.caught(&Outcome::of(&report));
        assert!(!caught, "INVALID for another class is not this control's catch");
        assert_eq!(found, vec!["stale 1".to_string()]);
        report.duplicated = vec![7];
        assert!(control.caught(&Outcome::of(&report)).0);
    }

    #[test]
    fn every_control_names_classes_the_checker_has() {
        let classes: Vec<&str> = Report::default().classes().into_iter().map(|(name, _)| name).collect();
        for control in &CONTROLS {
            assert!(!control.caught_by.is_empty(), "{}", control.name);
            for class in control.caught_by {
                assert!(classes.contains(class), "{}: no class {class:?}", control.name);
            }
        }
    }
}
