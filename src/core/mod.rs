//! The pure job state machine: `(state, command, leader time) -> (state, effects)`.
//!
//! This module owns the job model and every rule of the lifecycle. It does no IO,
//! reads no clock and draws no random numbers: time arrives inside each [`Batch`],
//! stamped by the partition leader, so Raft apply on every replica, snapshot
//! restore and unit tests all run the same code and reach the same state.
//!
//! It must never name RocksDB, openraft or tonic types.

mod command;
mod engine;
mod failure;
mod guard;
mod history;
mod ids;
mod job;
mod lifecycle;
pub mod limit;
pub mod plan;
pub mod principal;
mod queue;
pub mod retry;
mod routing;
pub mod schedule;
mod session;
pub mod workflow;

pub use command::*;
pub use engine::{
    request_expiry_bound, request_storage_id, ApplyOutput, MemoryRequests, PartitionState, Plants, RequestCounts,
    RequestTable, StateSnapshot,
};
pub use failure::*;
pub use guard::{lapse, Guard, Identity, Refusal, GUARDED_OUTCOMES};
pub use history::*;
pub use ids::*;
pub use job::*;
pub use lifecycle::{event_text, lifecycle_kinds, Happened, Lifecycle, MAX_EVENT_TEXT};
pub use limit::{LimitState, QueueLimit, LIMITS};
pub use plan::{ClusterPlan, Member, PlanChange, PLANS};
pub use queue::*;
pub use routing::*;
pub use schedule::{Schedule, ScheduleSpec, SCHEDULES};
pub use session::*;
pub use workflow::{Workflow, WorkflowSpec, WORKFLOWS};

#[cfg(test)]
mod authorize_tests;
#[cfg(test)]
mod expiry_tests;
#[cfg(test)]
mod growth_tests;
#[cfg(test)]
mod guard_tests;
#[cfg(test)]
mod limit_tests;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod queue_tests;
#[cfg(test)]
mod retry_tests;
#[cfg(test)]
mod schedule_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod timeout_tests;
#[cfg(test)]
mod workflow_tests;
