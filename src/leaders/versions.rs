//! The version gate: a command, or a read, that older builds do not know is
//! sent only once every member of the cluster reads its data version (the
//! cluster version, `docs/upgrades.md`). Which version each command needs is
//! said once, by [`Command::since_version`]; [`super::submit_as`] checks it
//! for every batch it sends, so no caller places a gate by hand.

use super::ApiError;
use crate::context::NodeContext;
use crate::core::Command;

/// FAILED_PRECONDITION, naming the members behind, unless every member of
/// the cluster reads data version `version`: `what` needs it (a feature
/// whose commands or calls older builds do not know).
pub fn require_cluster_version(ctx: &NodeContext, version: u16, what: &str) -> Result<(), ApiError> {
    let versions = ctx.transport.peers.versions();
    if versions.cluster_version() >= version {
        return Ok(());
    }
    let behind: Vec<String> = versions
        .members()
        .into_iter()
        .filter(|(_, v)| v.is_none_or(|v| v < version))
        .map(|(n, v)| format!("node {n} ({})", v.map_or("not heard from".into(), |v| format!("version {v}"))))
        .collect();
    Err(ApiError::FailedPrecondition(format!(
        "{what} need every member at data version {version} or later; the cluster runs at {}: {}",
        versions.cluster_version(),
        behind.join(", ")
    )))
}

/// Refuses `commands` when one needs a data version some member does not
/// read yet; nothing is sent then.
pub fn check_commands(ctx: &NodeContext, commands: &[Command]) -> Result<(), ApiError> {
    match commands.iter().filter_map(Command::since_version).max() {
        Some((version, what)) => require_cluster_version(ctx, version, what),
        None => Ok(()),
    }
}

/// Whether every member of the cluster reads data version `version`: for
/// what a node does more of once they all do (a listing that also reads
/// queue limits), rather than refuses before.
pub fn cluster_reads(ctx: &NodeContext, version: u16) -> bool {
    ctx.transport.peers.versions().cluster_version() >= version
}
