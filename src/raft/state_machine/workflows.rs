//! A partition's workflows in storage: one record each in the meta table,
//! under the partition's `workflow` prefix, rewritten when it changes and
//! deleted when the partition forgets it (data version 13 on). One record
//! each, not one for all: a step's end rewrites its own workflow only.

use std::collections::BTreeSet;

use crate::core::workflow::Workflow;
use crate::core::{PartitionId, PartitionState};
use crate::storage::{self, meta_key, Batch, StorageError, Store, Table};

/// What every workflow record's key begins with, after the partition.
const PREFIX: &str = "workflow\0";

fn prefix(partition: PartitionId) -> Vec<u8> {
    meta_key(partition, PREFIX)
}

fn record_key(partition: PartitionId, tenant: &str, id: &str) -> Vec<u8> {
    let mut key = prefix(partition);
    key.extend_from_slice(tenant.as_bytes());
    key.push(0);
    key.extend_from_slice(id.as_bytes());
    key
}

/// The partition's stored workflows.
pub(super) fn load(store: &Store, partition: PartitionId) -> Result<Vec<Workflow>, StorageError> {
    let mut workflows = Vec::new();
    store.scan_prefix(Table::Meta, &prefix(partition), |_, bytes| {
        workflows.push(storage::decode("workflow", bytes)?);
        Ok(())
    })?;
    Ok(workflows)
}

/// Writes the workflows an apply changed as `engine` now holds them, and
/// deletes those it forgot.
pub(super) fn write_changed(
    batch: &mut Batch<'_>,
    partition: PartitionId,
    engine: &PartitionState,
    changed: &BTreeSet<(String, String)>,
) {
    for (tenant, id) in changed {
        let key = record_key(partition, tenant, id);
        match engine.workflow_record(tenant, id) {
            Some(workflow) => batch.put(Table::Meta, key, storage::encode(workflow)),
            None => batch.delete(Table::Meta, key),
        }
    }
}

/// Makes the stored workflows exactly `workflows` (a snapshot's).
pub(super) fn replace_all(batch: &mut Batch<'_>, partition: PartitionId, workflows: &[Workflow]) {
    batch.delete_prefix(Table::Meta, &prefix(partition));
    for workflow in workflows {
        let key = record_key(partition, &workflow.spec.tenant, &workflow.spec.id);
        batch.put(Table::Meta, key, storage::encode(workflow));
    }
}
