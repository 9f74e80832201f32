//! A replica's remembered creates, on disk: the engine's request table
//! ([`RequestTable`]) read from RocksDB, so a partition's de-duplication
//! window costs disk and block cache, not memory, however many keys it holds.
//!
//! The `requests` table holds each entry twice: by storage id (expiry time
//! first), which is the order entries expire in, and by request id (an
//! [`index_key`]), which is how a repeat finds it. Both are written and
//! deleted in the apply batch that adds or expires the entry, from what the
//! engine reports ([`crate::core::ApplyOutput`]); until that batch is written
//! the table answers from the changes it holds ([`DiskRequests::written`]).
//! Expiry reads the entries by storage id from where the last expiry
//! stopped, so it never walks the deletions behind it. A create reads
//! neither key when bounds the table keeps in memory (the highest storage
//! id stored, each gateway's highest sequence number) show that nothing
//! can be there: nearly every create is new.
//!
//! Data version 10 added the index. A replica that starts without it (a data
//! directory of an older build) writes it from the entries by storage id
//! before it serves, and records that it did (`request_index`): a start cut
//! short writes it again.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::core::{Deduped, PartitionId, RequestCounts, RequestId, RequestTable};
use crate::storage::{self, index_key, key, meta_key, Batch, StorageError, Store, Table};

/// Set once a partition's entries are indexed by request id.
const INDEXED: &str = "request_index";
/// Entries indexed per batch when an older directory is indexed.
const INDEX_BATCH: usize = 4096;

/// A request's index key, in an order of its own: a gateway's requests by
/// node, epoch and sequence number (big-endian), so each new one sorts after
/// the stored ones and a lookup of it ends at the first table file's range;
/// idempotency keys by tenant, user and key.
fn request_key(partition: PartitionId, request: &RequestId) -> Vec<u8> {
    let mut by = Vec::with_capacity(32);
    match request {
        RequestId::Gateway { node, epoch, seq } => {
            by.extend_from_slice(&gateway_prefix(*node, *epoch));
            by.extend_from_slice(&seq.to_be_bytes());
        }
        RequestId::Key { tenant, user, key } => {
            by.push(1);
            for part in [tenant, user] {
                by.extend_from_slice(&(part.len() as u32).to_be_bytes());
                by.extend_from_slice(part.as_bytes());
            }
            by.extend_from_slice(key.as_bytes());
        }
    }
    index_key(partition, &by)
}

/// What the index keys of a gateway's (node, epoch) begin with.
fn gateway_prefix(node: u64, epoch: u64) -> [u8; 17] {
    let mut prefix = [0; 17];
    prefix[1..9].copy_from_slice(&node.to_be_bytes());
    prefix[9..].copy_from_slice(&epoch.to_be_bytes());
    prefix
}

/// Stores an entry the engine added.
pub(super) fn put(batch: &mut Batch<'_>, partition: PartitionId, id: u64, request: &RequestId, entry: &Deduped) {
    batch.put(Table::Requests, key(partition, id), storage::encode(&(request, entry)));
    batch.put(Table::Requests, request_key(partition, request), storage::encode(&(id, entry)));
}

/// Deletes an entry the engine expired.
pub(super) fn delete(batch: &mut Batch<'_>, partition: PartitionId, id: u64, request: &RequestId) {
    batch.delete(Table::Requests, key(partition, id));
    batch.delete(Table::Requests, request_key(partition, request));
}

/// Deletes every entry of the partition (a snapshot or a backup replaces them).
pub(super) fn clear(batch: &mut Batch<'_>, partition: PartitionId) {
    batch.delete_ids(Table::Requests, partition, 0..u64::MAX);
    batch.delete_index(Table::Requests, partition);
    batch.put(Table::Meta, meta_key(partition, INDEXED), []);
}

/// The request table of one partition of a replica.
pub struct DiskRequests {
    store: Arc<Store>,
    partition: PartitionId,
    counts: RequestCounts,
    /// Changes not yet written, by request: `None` where one was removed.
    by_request: HashMap<RequestId, Option<Deduped>>,
    /// The same changes by storage id.
    by_id: BTreeMap<u64, Option<RequestId>>,
    /// Stored entries below this storage id have been reported expiring.
    scanned_below: u64,
    /// No stored entry lies in `scanned_below..next_stored` (the last scan
    /// stopped at `next_stored`, and every insert since lowers it): while the
    /// bound stays below it, an apply needs no scan (each scan is an iterator
    /// and a seek, on every replica, with every entry).
    next_stored: u64,
    /// No entry is stored above this storage id: the last stored one when
    /// the table was opened, raised by every insert. A new create's id is
    /// above it unless a longer window's entry expires later, so most creates
    /// learn that nothing holds their id without reading the table.
    highest_stored: Option<u64>,
    /// For a gateway's (node, epoch): no entry of its requests is stored or
    /// unwritten with a sequence number above this one. A gateway numbers
    /// its creates in order, so most of them learn that they are new without
    /// reading the table; a repeat, or one that arrives after a later one,
    /// reads it as before. Set at a (node, epoch)'s first insert, from the
    /// table (one seek), and raised by each insert; at most
    /// [`GATEWAYS_KEPT`] of them, forgotten together when full.
    gateways: HashMap<(u64, u64), u64>,
}

/// The gateways' (node, epoch) a table keeps a bound for: a node's gateway
/// draws a new epoch at each start, so a long-lived replica sees a few per
/// node.
const GATEWAYS_KEPT: usize = 256;

/// A gateway's request: its (node, epoch) and its sequence number.
fn gateway_seq(request: &RequestId) -> Option<((u64, u64), u64)> {
    match request {
        RequestId::Gateway { node, epoch, seq } => Some(((*node, *epoch), *seq)),
        RequestId::Key { .. } => None,
    }
}

impl std::fmt::Debug for DiskRequests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskRequests")
            .field("partition", &self.partition)
            .field("counts", &self.counts)
            .field("unwritten", &self.by_id.len())
            .finish()
    }
}

impl DiskRequests {
    /// The partition's stored entries, counted as they stream by (and
    /// indexed by request id if an older build stored them).
    pub fn open(store: &Arc<Store>, partition: PartitionId) -> Result<DiskRequests, StorageError> {
        let indexed = store.get(Table::Meta, meta_key(partition, INDEXED))?.is_some();
        let mut counts = RequestCounts::default();
        let mut batch = store.batch();
        let mut pending = 0;
        store.for_each(Table::Requests, partition, |id, bytes| {
            let (request, entry): (RequestId, Deduped) = storage::decode("request entry", bytes)?;
            counts.add(&request);
            if !indexed {
                batch.put(Table::Requests, request_key(partition, &request), storage::encode(&(id, &entry)));
                pending += 1;
                if pending == INDEX_BATCH {
                    store.write(std::mem::replace(&mut batch, store.batch()));
                    pending = 0;
                }
            }
            Ok(())
        })?;
        if !indexed {
            batch.put(Table::Meta, meta_key(partition, INDEXED), []);
            store.write_synced(batch);
            if counts.entries > 0 {
                tracing::info!(partition, entries = counts.entries, "remembered creates indexed by request id");
            }
        }
        let last = store.last(Table::Requests, partition)?;
        Ok(DiskRequests::installed(store, partition, counts, last.map(|(id, _)| id)))
    }

    /// The table of the partition's entries, counted as `counts`, the
    /// highest at storage id `highest_stored`: those stored (from
    /// [`DiskRequests::open`]) or those a snapshot installs. It reads
    /// nothing, so it may be made before the batch that writes them is.
    pub fn installed(
        store: &Arc<Store>,
        partition: PartitionId,
        counts: RequestCounts,
        highest_stored: Option<u64>,
    ) -> DiskRequests {
        DiskRequests {
            store: Arc::clone(store),
            partition,
            counts,
            by_request: HashMap::new(),
            by_id: BTreeMap::new(),
            scanned_below: 0,
            next_stored: 0,
            highest_stored,
            gateways: HashMap::new(),
        }
    }

    /// The highest sequence number of a gateway's (node, epoch) stored or
    /// unwritten: the last index key of its prefix, and the changes held.
    fn highest_seq(&self, (node, epoch): (u64, u64)) -> Option<u64> {
        let prefix = gateway_prefix(node, epoch);
        let stored = must(
            "the last remembered create of a gateway",
            self.store.last_in_index(Table::Requests, self.partition, &prefix, &u64::MAX.to_be_bytes()),
        );
        let stored = stored.map(|rest| u64::from_be_bytes(rest.try_into().expect("an 8-byte sequence number")));
        let unwritten = self.by_request.keys().filter_map(gateway_seq).filter(|(of, _)| *of == (node, epoch));
        stored.into_iter().chain(unwritten.map(|(_, seq)| seq)).max()
    }
}

/// A read the engine cannot go on without: like a failed write, a failed
/// read ends the process (see `storage`), rather than let a replica decide
/// a create without the entry it may have.
fn must<T>(what: &str, read: Result<T, StorageError>) -> T {
    read.unwrap_or_else(|e| storage::fail_stop(&format!("read of {what}"), &e))
}

impl RequestTable for DiskRequests {
    fn find(&self, request: &RequestId) -> Option<Deduped> {
        if let Some(change) = self.by_request.get(request) {
            return *change;
        }
        if let Some((of, seq)) = gateway_seq(request) {
            if self.gateways.get(&of).is_some_and(|highest| seq > *highest) {
                return None;
            }
        }
        let stored = must("a remembered create", self.store.get(Table::Requests, request_key(self.partition, request)));
        stored.map(|bytes| {
            must("a remembered create", storage::decode::<(u64, Deduped)>("request index entry", &bytes)).1
        })
    }
    fn at(&self, id: u64) -> Option<RequestId> {
        if let Some(change) = self.by_id.get(&id) {
            return change.clone();
        }
        if self.highest_stored.is_none_or(|highest| id > highest) {
            return None;
        }
        let stored = must("a remembered create", self.store.get(Table::Requests, key(self.partition, id)));
        stored.map(|bytes| {
            must("a remembered create", storage::decode::<(RequestId, Deduped)>("request entry", &bytes)).0
        })
    }
    fn insert(&mut self, id: u64, request: &RequestId, entry: Deduped) {
        // An entry of a 0 ms window is stored below the bound it was made
        // at: the next expiry scan starts from it.
        self.scanned_below = self.scanned_below.min(id);
        self.next_stored = self.next_stored.min(id);
        self.highest_stored = self.highest_stored.max(Some(id));
        if let Some((of, seq)) = gateway_seq(request) {
            match self.gateways.get_mut(&of) {
                Some(highest) => *highest = (*highest).max(seq),
                None => {
                    if self.gateways.len() == GATEWAYS_KEPT {
                        self.gateways.clear();
                    }
                    let highest = self.highest_seq(of).unwrap_or(0).max(seq);
                    self.gateways.insert(of, highest);
                }
            }
        }
        self.counts.add(request);
        self.by_request.insert(request.clone(), Some(entry));
        self.by_id.insert(id, Some(request.clone()));
    }
    fn remove(&mut self, id: u64, request: &RequestId) {
        self.counts.remove(request);
        self.by_request.insert(request.clone(), None);
        self.by_id.insert(id, None);
    }
    fn expiring(&mut self, bound: u64) -> Vec<(u64, RequestId)> {
        let mut expiring = Vec::new();
        if bound > self.scanned_below && bound > self.next_stored {
            let mut stopped_at = u64::MAX;
            let scan = self.store.scan_while(Table::Requests, self.partition, self.scanned_below, |id, bytes| {
                if id >= bound {
                    stopped_at = id;
                    return Ok(false);
                }
                // An unwritten change of this id stands for it (below).
                if !self.by_id.contains_key(&id) {
                    let (request, _): (RequestId, Deduped) = storage::decode("request entry", bytes)?;
                    expiring.push((id, request));
                }
                Ok(true)
            });
            must("remembered creates", scan);
            self.scanned_below = bound;
            self.next_stored = stopped_at;
        } else if bound > self.scanned_below {
            // Nothing stored below the bound that was not reported already.
            self.scanned_below = bound;
        }
        expiring.extend(self.by_id.range(..bound).filter_map(|(id, change)| Some((*id, change.clone()?))));
        expiring.sort_unstable_by_key(|(id, _)| *id);
        expiring
    }
    fn counts(&self) -> &RequestCounts {
        &self.counts
    }
    fn written(&mut self) {
        self.by_request.clear();
        self.by_id.clear();
    }
}
