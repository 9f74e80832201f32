//! Each job's history: what happened to it, when, by whose hand.
//!
//! Events are recorded by the engine as it applies commands, so the history
//! is replicated, stored and snapshotted with the job and kept with its final
//! record for the retention window. It is bounded: the first
//! [`HISTORY_HEAD`] events and the last [`HISTORY_TAIL`] are kept, with a
//! count of those dropped between them; runs of deadline extensions of one
//! activation (heartbeats, timeout updates) are coalesced into one event.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use super::failure::FailReason;
use super::ids::Millis;
use super::ids::SessionId;

/// Events kept from a job's start.
pub const HISTORY_HEAD: usize = 8;
/// Events kept from its end.
pub const HISTORY_TAIL: usize = 32;
/// Longest failure message kept in an event, in bytes.
pub const HISTORY_MESSAGE_BYTES: usize = 512;

/// How an activation reached its worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Via {
    /// Not recorded (tests, tools).
    #[default]
    Unknown,
    /// `ActivateJobs` through this gateway node.
    Poll { gateway: u64 },
    /// Pushed to this gateway's aggregated stream.
    Push { gateway: u64, stream: u64 },
}

/// Why a pushed activation came back without reaching a worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum YieldReason {
    /// Not recorded (tests, tools).
    #[default]
    Unknown,
    /// The gateway had no client with room for it (all at their limit, or
    /// their send buffers full).
    NotReady,
    /// It waited in a stream's buffer when the stream closed.
    StreamClosed,
    /// Its push reached the stream after the leader stopped waiting for the
    /// answer: no client took it, and the gateway handed it back itself.
    Late,
}

impl YieldReason {
    pub fn as_str(self) -> &'static str {
        match self {
            YieldReason::Unknown => "",
            YieldReason::NotReady => "no client ready",
            YieldReason::StreamClosed => "stream closed",
            YieldReason::Late => "push answered too late",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// By `user` (empty: not named), through a gateway (0: unknown).
    Created {
        user: String,
        gateway: u64,
        idempotency_key: String,
    },
    /// A scheduled job became activatable (its run_at, delay or back-off ended).
    Due,
    Activated {
        attempt: u32,
        worker: String,
        session: SessionId,
        via: Via,
    },
    /// Handed back without reaching a worker: by `gateway` (0: unknown), for `reason`.
    Yielded {
        attempt: u32,
        gateway: u64,
        reason: YieldReason,
    },
    TimedOut {
        attempt: u32,
    },
    /// The deadline moved (heartbeats, timeout updates): `count` such moves
    /// since `at`, the last to `deadline`.
    Extended {
        attempt: u32,
        deadline: Millis,
        count: u32,
    },
    Failed {
        attempt: u32,
        reason: FailReason,
        message: String,
        retries: i32,
        back_off_ms: Millis,
    },
    Incident,
    RetriesUpdated {
        retries: i32,
        by: String,
    },
    Checkpointed {
        attempt: u32,
        stage: String,
    },
    Cancelled {
        by: String,
    },
    Completed {
        attempt: u32,
    },
    /// A command acted on attempt `attempt` whatever its fence (an
    /// operator's override: attempt 0), sent by `by`. Recorded after the
    /// command's own event. Data version 8 and later.
    FenceOverridden {
        attempt: u32,
        by: String,
    },
    /// Not activated by its expiry time (`at`): discarded. Data version 12 and later.
    Expired {
        at: Millis,
    },
}

impl EventKind {
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Created { .. } => "created",
            EventKind::Due => "due",
            EventKind::Activated { .. } => "activated",
            EventKind::Yielded { .. } => "yielded",
            EventKind::TimedOut { .. } => "timed_out",
            EventKind::Extended { .. } => "extended",
            EventKind::Failed { .. } => "failed",
            EventKind::Incident => "incident",
            EventKind::RetriesUpdated { .. } => "retries_updated",
            EventKind::Checkpointed { .. } => "checkpointed",
            EventKind::Cancelled { .. } => "cancelled",
            EventKind::Completed { .. } => "completed",
            EventKind::FenceOverridden { .. } => "fence_overridden",
            EventKind::Expired { .. } => "expired",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobEvent {
    /// Leader time of the entry that recorded it.
    pub at: Millis,
    pub kind: EventKind,
}

/// A job's bounded history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    head: Vec<JobEvent>,
    tail: VecDeque<JobEvent>,
    /// Events dropped between the head and the tail.
    dropped: u64,
}

impl History {
    pub fn record(&mut self, at: Millis, kind: EventKind) {
        if let EventKind::Extended { attempt, deadline, .. } = &kind {
            let last = self.tail.back_mut().or_else(|| self.head.last_mut());
            if let Some(JobEvent { kind: EventKind::Extended { attempt: a, deadline: d, count }, .. }) = last {
                if a == attempt {
                    *d = *deadline;
                    *count += 1;
                    return;
                }
            }
        }
        let kind = match kind {
            EventKind::Failed { attempt, reason, mut message, retries, back_off_ms } => {
                if message.len() > HISTORY_MESSAGE_BYTES {
                    let mut end = HISTORY_MESSAGE_BYTES;
                    while !message.is_char_boundary(end) {
                        end -= 1;
                    }
                    message.truncate(end);
                }
                EventKind::Failed { attempt, reason, message, retries, back_off_ms }
            }
            other => other,
        };
        let event = JobEvent { at, kind };
        if self.head.len() < HISTORY_HEAD {
            self.head.push(event);
            return;
        }
        self.tail.push_back(event);
        if self.tail.len() > HISTORY_TAIL {
            self.tail.pop_front();
            self.dropped += 1;
        }
    }

    /// Every kept event, oldest first.
    pub fn events(&self) -> impl Iterator<Item = &JobEvent> {
        self.head.iter().chain(self.tail.iter())
    }

    /// How many events were dropped between the first and the last ones kept.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_keeps_its_first_and_last_events_and_counts_the_rest() {
        let mut history = History::default();
        for retries in 0..100 {
            history.record(i64::from(retries), EventKind::RetriesUpdated { retries, by: String::new() });
        }
        let kept: Vec<i64> = history.events().map(|e| e.at).collect();
        assert_eq!(kept.len(), HISTORY_HEAD + HISTORY_TAIL);
        assert_eq!(kept[..3], [0, 1, 2]);
        assert_eq!(*kept.last().unwrap(), 99);
        assert_eq!(history.dropped(), 100 - (HISTORY_HEAD + HISTORY_TAIL) as u64);
    }

    #[test]
    fn extensions_of_one_activation_are_coalesced() {
        let mut history = History::default();
        history.record(1, EventKind::Extended { attempt: 1, deadline: 10, count: 1 });
        history.record(2, EventKind::Extended { attempt: 1, deadline: 20, count: 1 });
        history.record(3, EventKind::Extended { attempt: 2, deadline: 30, count: 1 });
        let events: Vec<&JobEvent> = history.events().collect();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].kind, EventKind::Extended { attempt: 1, deadline: 20, count: 2 });
    }
}
