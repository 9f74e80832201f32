//! The checks that hold Drover's timers to real time, whatever the nodes'
//! wall clocks do (the `clock` nemesis steps and skews them):
//!
//! - **early reactivation**: a job handed to a second worker while the
//!   first still held it: the second activation was returned before the
//!   first one's lease could have run out (the poll that got it was sent,
//!   or the stream that was pushed it registered its session, at `r`; its
//!   lease began after `r` and lasts the activation timeout) by more than
//!   [`SKEW_BOUND_MS`], and the first worker had not failed, completed or
//!   given it back (a streaming worker ending its session gives back what
//!   it holds).
//! - **early timer**: a delayed job activated before its delay had passed
//!   since its create was first sent, or a failed job activated again
//!   before its back-off had passed since the failure was sent, by more than
//!   [`SKEW_BOUND_MS`].
//! - **late timer**: a delay or back-off that made its job due more than
//!   [`LATE_BOUND_MS`] after its time, in the partition's own time (the
//!   job's `created`, `failed` and `due` events, as the replicas hold them).
//!   A due job may still wait for a free worker; that is the workload's
//!   capacity, not the timer, so the partition's events are what is judged.
//!   Checked only in runs whose only faults are clock faults: any other fault
//!   (a partition without a leader) may hold every timer up, which is
//!   availability, not timing.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::history::{FinalReads, Kind, Op, Phase, TimerEvent};

/// How far a timer may run ahead of real time: the stated skew bound.
pub const SKEW_BOUND_MS: u64 = 250;
/// How far behind its time a timer may fire when only clocks are faulted:
/// a leader killed and restarted hands its timers to the next one within an
/// election (2.4 s by default), and a restarted node may lead at once.
pub const LATE_BOUND_MS: u64 = 5_000;

#[derive(Debug, Serialize, PartialEq)]
pub struct EarlyReactivation {
    pub id: u64,
    pub key: u64,
    pub first_attempt: u32,
    /// When the poll that returned the first activation was sent.
    pub first_requested_ms: u64,
    pub second_attempt: u32,
    /// When the second activation was returned.
    pub second_ms: u64,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct TimerMiss {
    pub id: u64,
    pub key: u64,
    /// `delay` or `back-off`.
    pub timer: &'static str,
    pub wait_ms: u64,
    /// The earliest (early, ms into the run) or latest (late, in the
    /// partition's time) it could rightly fire.
    pub bound_ms: u64,
    /// Early: when the job was next returned to a worker (ms into the run).
    /// Late: when the partition made it due (its time).
    pub fired_ms: u64,
}

#[derive(Debug, Default, Serialize, PartialEq)]
pub struct Timing {
    pub early_reactivations: Vec<EarlyReactivation>,
    pub early_timers: Vec<TimerMiss>,
    pub late_timers: Vec<TimerMiss>,
}

pub fn check(history: &[Op], finals: &FinalReads, activation_timeout_ms: u64, check_late: bool) -> Timing {
    let mut timing = Timing::default();
    // Activations returned to workers, by job key, in attempt order.
    let mut activations: BTreeMap<u64, Vec<&Op>> = BTreeMap::new();
    for op in history.iter().filter(|o| o.kind == Kind::Activate && o.phase == Phase::Ok) {
        if let Some(key) = op.key {
            activations.entry(key).or_default().push(op);
        }
    }
    for list in activations.values_mut() {
        list.sort_by_key(|o| (o.attempt, o.time_ms));
    }
    // When each activation was first let go by its worker (a failure or a
    // completion sent, whatever became of it).
    let mut released: BTreeMap<(u64, u32), u64> = BTreeMap::new();
    for op in history.iter().filter(|o| matches!(o.kind, Kind::Fail | Kind::Complete)) {
        if let Some(key) = op.key {
            let at = released.entry((key, op.attempt)).or_insert(op.time_ms);
            *at = (*at).min(op.time_ms);
        }
    }

    // When each streaming worker ended a session (it gave back all it held).
    let mut sessions_ended: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for op in history.iter().filter(|o| o.kind == Kind::Release) {
        sessions_ended.entry(op.process).or_default().push(op.time_ms);
    }
    for (key, list) in &activations {
        for (i, first) in list.iter().enumerate() {
            let Some(requested) = first.requested_ms else { continue };
            let lease_ends = requested + activation_timeout_ms;
            let given_back = sessions_ended
                .get(&first.process)
                .and_then(|ends| ends.iter().copied().filter(|at| *at >= first.time_ms).min())
                .unwrap_or(u64::MAX);
            let let_go = released.get(&(*key, first.attempt)).copied().unwrap_or(u64::MAX).min(given_back);
            for second in list[i + 1..].iter().filter(|o| o.attempt > first.attempt) {
                if second.time_ms + SKEW_BOUND_MS < lease_ends && second.time_ms < let_go {
                    timing.early_reactivations.push(EarlyReactivation {
                        id: first.id,
                        key: *key,
                        first_attempt: first.attempt,
                        first_requested_ms: requested,
                        second_attempt: second.attempt,
                        second_ms: second.time_ms,
                    });
                }
            }
        }
    }

    // Early, in real time: a job returned to a worker before its delay had
    // passed since its create was first sent, or before its back-off had
    // passed since the failure was sent.
    let mut first_send: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
    let mut key_of: BTreeMap<u64, u64> = BTreeMap::new();
    for op in history.iter().filter(|o| o.kind == Kind::Create) {
        match (op.phase, op.wait_ms, op.key) {
            (Phase::Invoke, Some(delay), _) => {
                first_send.entry(op.id).or_insert((op.time_ms, delay));
            }
            (Phase::Ok, _, Some(key)) => {
                key_of.insert(op.id, key);
            }
            _ => {}
        }
    }
    for (id, (sent, delay)) in &first_send {
        let Some(key) = key_of.get(id) else { continue };
        let Some(first) = activations.get(key).and_then(|l| l.first()) else { continue };
        timing.early("delay", *id, *key, *delay, *sent, first.time_ms);
    }
    // Only failures that took effect set a back-off: one refused (the
    // activation had already timed out) leaves the job to its timeout.
    let failed: std::collections::BTreeSet<(u64, u32)> = history
        .iter()
        .filter(|o| o.kind == Kind::Fail && o.phase == Phase::Ok)
        .filter_map(|o| Some((o.key?, o.attempt)))
        .collect();
    for op in history.iter().filter(|o| o.kind == Kind::Fail && o.phase == Phase::Invoke) {
        let (Some(key), Some(back_off)) = (op.key, op.wait_ms) else { continue };
        if !failed.contains(&(key, op.attempt)) {
            continue;
        }
        let next = activations.get(&key).and_then(|l| l.iter().find(|a| a.attempt > op.attempt));
        if let Some(next) = next {
            timing.early("back-off", op.id, key, back_off, op.time_ms, next.time_ms);
        }
    }

    // Late, in the partition's time: each delay or back-off to the due event
    // that ended it.
    if check_late {
        let mut seen = std::collections::BTreeSet::new();
        for jobs in finals.values() {
            for (key, job) in jobs {
                if !seen.insert(*key) {
                    continue;
                }
                let delay = first_send.get(&job.id).map(|(_, d)| *d);
                timing.late_timers.extend(late(job.id, *key, &job.timers, delay));
            }
        }
    }
    timing
}

/// The timers of one job that made it due more than [`LATE_BOUND_MS`] after
/// their time: its delay (if it had one) from its `created` event, and each
/// back-off from its `failed` event, to the next `due` event.
fn late(id: u64, key: u64, events: &[TimerEvent], delay: Option<u64>) -> Vec<TimerMiss> {
    let mut misses = Vec::new();
    for (i, event) in events.iter().enumerate() {
        let (timer, wait) = match (event.kind.as_str(), delay) {
            ("created", Some(delay)) => ("delay", delay as i64),
            ("failed", _) if event.back_off > 0 => ("back-off", event.back_off),
            _ => continue,
        };
        let Some(due) = events[i + 1..].iter().find(|e| e.kind == "due") else { continue };
        let latest = event.at + wait + LATE_BOUND_MS as i64;
        if due.at > latest {
            misses.push(TimerMiss {
                id,
                key,
                timer,
                wait_ms: wait as u64,
                bound_ms: latest as u64,
                fired_ms: due.at as u64,
            });
        }
    }
    misses
}

impl Timing {
    /// Records a timer of `wait_ms` set at `sent` (real time) whose job was
    /// next returned to a worker at `activated`, if that was early.
    fn early(&mut self, timer: &'static str, id: u64, key: u64, wait_ms: u64, sent: u64, activated: u64) {
        let earliest = sent + wait_ms;
        if activated + SKEW_BOUND_MS < earliest {
            self.early_timers.push(TimerMiss { id, key, timer, wait_ms, bound_ms: earliest, fired_ms: activated });
        }
    }

    pub fn anomalies(&self) -> usize {
        self.early_reactivations.len() + self.early_timers.len() + self.late_timers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::FinalJob;

    fn activation(time_ms: u64, key: u64, attempt: u32, requested_ms: Option<u64>) -> Op {
        Op {
            time_ms,
            kind: Kind::Activate,
            phase: Phase::Ok,
            id: 1,
            key: Some(key),
            attempt,
            requested_ms,
            ..Op::default()
        }
    }

    fn op(time_ms: u64, kind: Kind, phase: Phase, key: Option<u64>, attempt: u32, wait_ms: Option<u64>) -> Op {
        Op { time_ms, kind, phase, id: 1, key, attempt, wait_ms, ..Op::default() }
    }

    fn check_history(history: &[Op]) -> Timing {
        check(history, &FinalReads::new(), 2_000, false)
    }

    /// One node holding job `key` (id 1) with these timer events.
    fn finals(key: u64, events: &[(&str, i64, i64)]) -> FinalReads {
        let timers = events
            .iter()
            .map(|(kind, at, back_off)| TimerEvent { kind: kind.to_string(), at: *at, back_off: *back_off })
            .collect();
        let job = FinalJob {
            id: 1,
            state: "completed".into(),
            job_type: "jepsen".into(),
            checkpoints: Vec::new(),
            attempt: 2,
            timers,
            ..FinalJob::default()
        };
        [(0, [(key, job)].into())].into()
    }

    #[test]
    fn a_job_handed_out_again_within_its_lease_is_an_early_reactivation() {
        let history = vec![activation(1_100, 7, 1, Some(1_000)), activation(2_000, 7, 2, None)];
        let timing = check_history(&history);
        assert_eq!(timing.early_reactivations.len(), 1, "{timing:?}");
        assert_eq!(timing.early_reactivations[0].second_attempt, 2);
    }

    #[test]
    fn a_job_handed_out_again_after_its_lease_or_once_let_go_is_not() {
        // After the lease (less the bound).
        let after = vec![activation(1_100, 7, 1, Some(1_000)), activation(2_800, 7, 2, None)];
        assert_eq!(check_history(&after).anomalies(), 0);
        // Failed by its worker first.
        let let_go = vec![
            activation(1_100, 7, 1, Some(1_000)),
            op(1_200, Kind::Fail, Phase::Invoke, Some(7), 1, None),
            activation(1_500, 7, 2, None),
        ];
        assert_eq!(check_history(&let_go).anomalies(), 0);
        // An activation with no known request time is not judged.
        let unknown = vec![activation(1_100, 7, 1, None), activation(1_200, 7, 2, None)];
        assert_eq!(check_history(&unknown).anomalies(), 0);
    }

    #[test]
    fn a_pushed_job_is_held_to_its_lease_from_its_stream_s_session() {
        // Pushed jobs used to be left out (no poll time): 35% of the creates.
        // Their session registered at 1,000, the push returned at 1,500: the
        // lease ran until 3,000 at the earliest.
        let pushed = |t| Op { process: 4, ..activation(t, 7, 1, Some(1_000)) };
        let early = vec![pushed(1_500), activation(2_400, 7, 2, None)];
        assert_eq!(check_history(&early).early_reactivations.len(), 1, "handed out again 600 ms early");
        // The worker ended its session first: it gave the job back.
        let ended = Op { time_ms: 1_800, process: 4, kind: Kind::Release, phase: Phase::Ok, ..Op::default() };
        let given_back = vec![pushed(1_500), ended.clone(), activation(2_400, 7, 2, None)];
        assert_eq!(check_history(&given_back).anomalies(), 0);
        // Another worker's session ending gives back nothing of this one's.
        let other = vec![pushed(1_500), Op { process: 5, ..ended }, activation(2_400, 7, 2, None)];
        assert_eq!(check_history(&other).early_reactivations.len(), 1);
    }

    #[test]
    fn a_delayed_job_activated_before_its_delay_is_an_early_timer() {
        let history = vec![
            op(1_000, Kind::Create, Phase::Invoke, None, 0, Some(2_000)),
            op(1_050, Kind::Create, Phase::Ok, Some(9), 0, None),
            activation(2_500, 9, 1, Some(2_400)),
        ];
        let timing = check_history(&history);
        assert_eq!(timing.early_timers.len(), 1, "{timing:?}");
        assert_eq!((timing.early_timers[0].timer, timing.early_timers[0].bound_ms), ("delay", 3_000));
        let on_time = vec![history[0].clone(), history[1].clone(), activation(3_100, 9, 1, Some(3_000))];
        assert_eq!(check_history(&on_time).anomalies(), 0);
    }

    #[test]
    fn a_failed_job_back_before_its_back_off_is_an_early_timer() {
        let history = vec![
            activation(100, 9, 1, Some(0)),
            op(200, Kind::Fail, Phase::Invoke, Some(9), 1, Some(1_000)),
            op(250, Kind::Fail, Phase::Ok, Some(9), 1, Some(1_000)),
            activation(600, 9, 2, Some(500)),
        ];
        let timing = check_history(&history);
        assert_eq!(timing.early_timers.len(), 1, "{timing:?}");
        assert_eq!(timing.early_timers[0].timer, "back-off");
        // A failure refused (its activation had timed out) set no back-off.
        let refused = vec![
            history[0].clone(),
            history[1].clone(),
            op(250, Kind::Fail, Phase::Fail, Some(9), 1, None),
            history[3].clone(),
        ];
        assert_eq!(check_history(&refused).anomalies(), 0);
    }

    #[test]
    fn a_delay_or_back_off_that_made_its_job_due_late_in_partition_time_is_a_late_timer() {
        let create = vec![
            op(1_000, Kind::Create, Phase::Invoke, None, 0, Some(2_000)),
            op(1_050, Kind::Create, Phase::Ok, Some(9), 0, None),
        ];
        // Created at 50,000 with a 2 s delay: due by 57,000 at the latest.
        let late = finals(9, &[("created", 50_000, 0), ("due", 58_000, 0)]);
        let timing = check(&create, &late, 2_000, true);
        assert_eq!(timing.late_timers.len(), 1, "{timing:?}");
        assert_eq!((timing.late_timers[0].timer, timing.late_timers[0].bound_ms), ("delay", 57_000));
        assert_eq!(check(&create, &late, 2_000, false).anomalies(), 0, "late is checked only when asked");
        let on_time = finals(9, &[("created", 50_000, 0), ("due", 52_010, 0)]);
        assert_eq!(check(&create, &on_time, 2_000, true).anomalies(), 0);
        // A back-off: failed at 60,000 asking 1 s, due at 70,000.
        let backed_off = finals(9, &[("created", 50_000, 0), ("failed", 60_000, 1_000), ("due", 70_000, 0)]);
        let timing = check(&[], &backed_off, 2_000, true);
        assert_eq!(timing.late_timers.len(), 1, "{timing:?}");
        assert_eq!(timing.late_timers[0].timer, "back-off");
    }
}
