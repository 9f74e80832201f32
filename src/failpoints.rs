//! Fault injection for tests: off unless `DROVER_FAILPOINTS` is set.
//!
//! `DROVER_FAILPOINTS=name=count[@hold_ms],...` arms each named point to fire
//! `count` times; a firing point may also hold its caller for `hold_ms`. The
//! variable is read once, at the first check. While the variable is set (even
//! empty), `PUT /actuator/failpoints/NAME?count=N&hold_ms=H` on the admin port
//! arms a point at run time, so a test can arm it on one node it chose
//! (the leader, say); without it the route answers 404. Points compiled in:
//!
//! - `forward_lose_reply`: a gateway treats the answer to a forwarded batch
//!   as lost (the batch committed, the reply never arrived), then holds for
//!   `hold_ms` before it handles that, as a gateway cut off from the leader
//!   would.
//! - `leader_push_hold`: a partition leader holds a push of activated jobs
//!   for `hold_ms` before sending it, as a leader about to crash would.
//! - `apply_hold`: a replica holds the next batch of committed entries for
//!   `hold_ms` before applying it, as a slow follower would;
//!   `apply_hold_P` the same for partition P's replica only.
//! - `wal_sync_hold`: a node's group-commit writer holds its next WAL sync
//!   for `hold_ms`, as a stalled disk would.
//! - `append_stream_unimplemented`: a node answers an append stream's
//!   opening with UNIMPLEMENTED, as a node of a version without it would.
//! - `deliver_unimplemented`: the same for a delivery stream (pushes and
//!   releases to this node's gateway, forwards to its leaders).
//! - `start_hold`: a starting node holds for `hold_ms` just before it
//!   serves, its cluster port open and answering "node is starting", as a
//!   node slow to open its data would.
//! - `gateway_skip_checks`: a gateway lets a principal's command through
//!   without its fast-path checks of the job's or session's tenant (the
//!   screen against the applied state, the session owner's tenants), as a
//!   gateway that misjudged would; the partition's check at apply remains.
//! - `retry_policy_at_gateway`: a gateway decides a failure by the job's
//!   retry policy itself, from a read of the job, and sends the failure it
//!   decided, as it does while a member is older than data version 17.
//!
//! Planted bugs, one each, for the fault suite's negative controls
//! (`jepsen/src/controls.rs`): each is a bug the suite's checker must find.
//! Those a leader acts on fire once per command, in the order the leader
//! proposes (the entry it writes carries the bug to every replica alike):
//!
//! - `leader_complete_requeues`: a leader proposes a worker's completion as
//!   a hand-back of the job, and answers it as done: the job is handed out
//!   and completed again.
//! - `leader_complete_cancels`: a leader proposes a worker's completion as
//!   a cancel of the job, and answers it as done: an acknowledged
//!   completion the replicas never hold.
//! - `leader_fail_exhausts`: a leader proposes a worker's failure that
//!   leaves retries as one that leaves none (a failure by the job's policy
//!   that may retry as one that may not): an incident nobody asked for.
//! - `read_any_tenant`: a node's job reads (`GetJob`, `GetJobHistory`,
//!   `AwaitJob`) skip the check of the job's tenant.
//!
//! Those that act where entries are applied never use up a firing: they
//! act whenever they are armed (any count), on what the entry decides, so
//! every replica applying the same entries acts alike (a restart and a
//! snapshot change nothing):
//!
//! - `apply_drop_tick`: a schedule passes over every tick at 7 s into a
//!   10 s period of the partition's time without making its job, though it
//!   records the tick as run.
//! - `apply_limit_overrun`: a limited queue lets every activation start,
//!   whatever its rate and concurrency (starts and slots are still counted).
//!
//! Production never sets the variable; a check is one read of a flag.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

struct Point {
    remaining: u32,
    hold: Duration,
}

fn points() -> &'static Mutex<HashMap<String, Point>> {
    static POINTS: OnceLock<Mutex<HashMap<String, Point>>> = OnceLock::new();
    POINTS.get_or_init(|| Mutex::new(parse(&std::env::var("DROVER_FAILPOINTS").unwrap_or_default())))
}

fn parse(spec: &str) -> HashMap<String, Point> {
    let mut points = HashMap::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((name, rest)) = item.split_once('=') else {
            tracing::warn!("ignoring failpoint {item:?}: expected name=count[@hold_ms]");
            continue;
        };
        let (count, hold) = rest.split_once('@').unwrap_or((rest, "0"));
        match (count.parse(), hold.parse()) {
            (Ok(remaining), Ok(hold)) => {
                tracing::warn!("failpoint {name} armed: fires {remaining} times, holds {hold} ms");
                points.insert(name.to_string(), Point { remaining, hold: Duration::from_millis(hold) });
            }
            _ => tracing::warn!("ignoring failpoint {item:?}: expected name=count[@hold_ms]"),
        }
    }
    points
}

/// Whether failpoints may be armed at run time: `DROVER_FAILPOINTS` is set.
pub fn enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var_os("DROVER_FAILPOINTS").is_some())
}

/// Arms `name` to fire `count` times, holding its caller for `hold` each time.
pub fn arm(name: &str, count: u32, hold: Duration) {
    tracing::warn!("failpoint {name} armed: fires {count} times, holds {} ms", hold.as_millis());
    points().lock().expect("failpoints lock").insert(name.to_string(), Point { remaining: count, hold });
}

/// Whether `name` is armed with firings left, without using one up: for
/// points that must act alike on every replica (see the module doc).
pub fn armed(name: &str) -> bool {
    enabled() && points().lock().expect("failpoints lock").get(name).is_some_and(|p| p.remaining > 0)
}

/// Whether the point fires now (using up one of its firings), and for how
/// long it holds its caller.
pub fn fire(name: &str) -> Option<Duration> {
    if !enabled() {
        return None;
    }
    let mut points = points().lock().expect("failpoints lock");
    let point = points.get_mut(name)?;
    if point.remaining == 0 {
        return None;
    }
    point.remaining -= 1;
    tracing::warn!("failpoint {name} fired");
    Some(point.hold)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_fires_as_often_as_armed() {
        let points = parse("a=2@150, b=1,bad, c=x");
        assert_eq!(points["a"].remaining, 2);
        assert_eq!(points["a"].hold, Duration::from_millis(150));
        assert_eq!(points["b"].hold, Duration::ZERO);
        assert!(!points.contains_key("bad") && !points.contains_key("c"));
    }

    #[test]
    fn an_unset_point_is_neither_armed_nor_fires() {
        // The tests run without DROVER_FAILPOINTS: nothing is armed.
        assert!(!armed("apply_drop_tick"));
        assert_eq!(fire("leader_complete_cancels"), None);
    }
}
