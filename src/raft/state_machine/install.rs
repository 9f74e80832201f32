//! Installing a partition's records from a snapshot: what a follower that
//! receives one writes, and what a node restoring a backup writes, in place
//! of every record the partition had.

use std::sync::Arc;

use openraft::{BasicNode, LogId, StoredMembership};

use super::*;

/// What [`install_records`] wrote, for the engine that goes with it.
pub(super) struct Installed {
    pub(super) meta: StateSnapshot,
    jobs: Vec<crate::core::Job>,
    requests: crate::core::RequestCounts,
    /// The highest storage id of the request entries written.
    highest_request: Option<u64>,
    registry: Registry,
    finished: Finished,
}

impl Installed {
    /// The engine over what was installed. It reads nothing from the store
    /// (the batch is not written yet); it must not be used before it is.
    pub(super) fn engine(self, store: &Arc<Store>, partition: PartitionId) -> (PartitionState, Finished) {
        let requests = requests::DiskRequests::installed(store, partition, self.requests, self.highest_request);
        (PartitionState::restore_on(self.meta, self.jobs, Box::new(requests), self.registry), self.finished)
    }
}

/// Writes the records of the snapshot `input` holds (at most `size` bytes)
/// into `batch`, in place of every record the partition had. What a
/// follower installing a snapshot and a node restoring a backup both write.
pub(super) fn install_records(
    batch: &mut storage::Batch<'_>,
    partition: PartitionId,
    input: &mut impl std::io::BufRead,
    size: u64,
) -> Result<Installed, storage::StorageError> {
    let (version, mut body) = read_header(input, size)?;
    batch.delete_ids(Table::Jobs, partition, 0..u64::MAX);
    batch.delete_ids(Table::Done, partition, 0..u64::MAX);
    retention::clear(batch, partition);
    batch.delete_ids(Table::Expiry, partition, 0..u64::MAX);
    requests::clear(batch, partition);
    batch.delete_ids(Table::Specs, partition, 0..u64::MAX);
    let mut counts = crate::core::RequestCounts::default();
    let mut highest_request = None;
    read_requests(version, input, &mut body, |id, request, entry| {
        counts.add(&request);
        highest_request = highest_request.max(Some(id));
        requests::put(batch, partition, id, &request, &entry);
        Ok(())
    })?;
    for job in &body.jobs {
        batch.put(Table::Jobs, key(partition, job.key.0), records::encode_progress(job));
        batch.put(Table::Specs, key(partition, job.key.0), storage::encode(&*job.spec));
    }
    // Frames carry whole jobs; stored, each is split in two again.
    let mut tenants = std::collections::HashMap::with_capacity(body.finished.len());
    while let Some((job_key, record)) = next_frame(input)? {
        let job = decode_record(version, &record)?;
        batch.put(Table::Done, key(partition, job_key), records::encode_progress(&job));
        batch.put(Table::Specs, key(partition, job_key), storage::encode(&*job.spec));
        tenants.insert(job_key, job.spec.tenant.clone());
    }
    let mut finished = Finished::starting_at(body.finished_first);
    for (at, job) in &body.finished {
        let tenant = tenants.get(job).ok_or_else(|| {
            std::io::Error::other(format!("the snapshot's pruning order names job {job}, whose record it lacks"))
        })?;
        finished.append(batch, partition, *at, JobKey(*job), tenant);
    }
    batch.put(Table::Meta, meta_key(partition, SESSIONS), storage::encode(&body.registry.sessions));
    batch.put(Table::Meta, meta_key(partition, SESSION_OWNERS), storage::encode(&body.registry.owners));
    batch.put(Table::Meta, meta_key(partition, PAUSED), storage::encode(&body.registry.paused));
    batch.put(Table::Meta, meta_key(partition, SCHEDULES), storage::encode(&body.registry.schedules));
    batch.put(Table::Meta, meta_key(partition, SCHEMAS), storage::encode(&body.registry.schemas));
    named::WORKFLOWS.replace_all(batch, partition, &body.registry.workflows, |w| (&w.spec.tenant, &w.spec.id));
    named::LIMITS.replace_all(batch, partition, &body.registry.limits, |l| (&l.tenant, &l.job_type));
    match &body.registry.plan {
        Some(plan) => batch.put(Table::Meta, meta_key(partition, PLAN), storage::encode(plan)),
        None => batch.delete(Table::Meta, meta_key(partition, PLAN)),
    }
    let (meta, jobs, registry) = (body.engine, body.jobs, body.registry);
    Ok(Installed { meta, jobs, requests: counts, highest_request, registry, finished })
}

/// How many job keys of each partition a restore skips: 2^40, more than a
/// cluster creates in a partition in a month at 100,000 jobs a second, and
/// 1/256 of a partition's key space.
pub const RESTORED_KEY_GAP: u64 = 1 << 40;

/// Makes `store` hold a backup's part of `partition` (the snapshot format,
/// `size` bytes from `input`) as the whole state of a new group of
/// `voters`, this node being `node`: the records as a follower installing a
/// snapshot writes them, applied and committed up to `at` (where the part
/// was taken), the log purged up to it, and this node's vote for `at`'s term,
/// so the group's first election moves to the next term. Partition 0 takes
/// `plan` as its cluster plan (the new cluster's; none: its member list's),
/// never the backed-up cluster's, whose members are gone. Returns the jobs
/// restored (live and final). Synced before it returns.
pub fn restore(
    store: &Store,
    partition: PartitionId,
    (term, leader, index): (u64, NodeId, u64),
    input: &mut impl std::io::BufRead,
    size: u64,
    (node, voters, plan): (NodeId, &std::collections::BTreeMap<NodeId, String>, Option<&crate::core::ClusterPlan>),
) -> Result<u64, storage::StorageError> {
    let mut batch = store.batch();
    let Installed { meta: engine, jobs, finished, .. } = install_records(&mut batch, partition, input, size)?;
    match plan.filter(|_| partition == 0) {
        Some(plan) => batch.put(Table::Meta, meta_key(partition, PLAN), storage::encode(plan)),
        None => batch.delete(Table::Meta, meta_key(partition, PLAN)),
    }
    let at = LogId::new(openraft::CommittedLeaderId::new(term, leader), index);
    let nodes: std::collections::BTreeMap<NodeId, BasicNode> =
        voters.iter().map(|(id, addr)| (*id, BasicNode { addr: addr.clone() })).collect();
    let membership = openraft::Membership::new(vec![nodes.keys().copied().collect()], nodes);
    let restored = jobs.iter().filter(|job| !job.state.is_final()).count() as u64 + finished.order.len() as u64;
    // Keys the lost cluster handed out after the cut are not in the backup;
    // new jobs must not take them, or a key a producer kept would name
    // another job. Skip past all it can have handed out (docs/backups.md).
    let mut counters = engine;
    counters.next_counter = counters.next_counter.saturating_add(RESTORED_KEY_GAP);
    let meta = AppliedMeta {
        last_applied: Some(at),
        membership: StoredMembership::new(Some(at), membership),
        engine: counters,
        finished_next: finished.next(),
    };
    batch.put(Table::Meta, meta_key(partition, APPLIED), storage::encode(&meta));
    super::super::log_store::restored(&mut batch, partition, at, openraft::Vote::new(term, node));
    store.write_synced(batch);
    Ok(restored)
}
