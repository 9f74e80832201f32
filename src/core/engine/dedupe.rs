//! The creates a partition remembers for their window: a repeat of a
//! request id or idempotency key finds the job the first one made. Each
//! entry expires by the partition's clock; storage keeps them by expiry.
//!
//! The engine reaches the entries through a [`RequestTable`]: in memory
//! ([`MemoryRequests`], for tests and for reading a snapshot), or on disk
//! where a replica keeps them (`raft::state_machine::requests`), so the
//! table's size is bounded by its configured limit on disk, not by memory.
//! Either way the engine decides what is added, what expires and when; the
//! table only holds the entries and their counts.

use std::collections::{BTreeMap, HashMap};

use super::{ApplyOutput, PartitionState};
use crate::core::{payload_fingerprint, Deduped, JobKey, JobSpec, Millis, RequestId};

/// Bits of a request entry's storage id below its expiry time.
const REQUEST_SEQ_BITS: u32 = 20;
/// Expiry times fit in the 44 bits above: until the year 2527.
const MAX_REQUEST_EXPIRY: Millis = (1 << (64 - REQUEST_SEQ_BITS)) - 1;

/// Where a request entry is stored: its expiry time in the high bits, so
/// entries are stored in the order they expire, and a sequence number below it.
pub fn request_storage_id(expires_at: Millis, seq: u64) -> u64 {
    let at = expires_at.clamp(0, MAX_REQUEST_EXPIRY) as u64;
    (at << REQUEST_SEQ_BITS) | (seq & ((1 << REQUEST_SEQ_BITS) - 1))
}

/// Request entries with storage ids below this have expired at `now`.
pub fn request_expiry_bound(now: Millis) -> u64 {
    request_storage_id(now.saturating_add(1), 0)
}

/// How many entries a table holds, and how many idempotency keys of each
/// tenant: what the gateway bounds (see its `bound_dedupe`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestCounts {
    pub entries: usize,
    keys_by_tenant: HashMap<String, usize>,
}

impl RequestCounts {
    /// Counts `request`'s entry in.
    pub fn add(&mut self, request: &RequestId) {
        self.entries += 1;
        if let RequestId::Key { tenant, .. } = request {
            match self.keys_by_tenant.get_mut(tenant) {
                Some(count) => *count += 1,
                None => {
                    self.keys_by_tenant.insert(tenant.clone(), 1);
                }
            }
        }
    }
    /// Counts `request`'s entry out.
    pub fn remove(&mut self, request: &RequestId) {
        self.entries = self.entries.saturating_sub(1);
        if let RequestId::Key { tenant, .. } = request {
            if let Some(count) = self.keys_by_tenant.get_mut(tenant) {
                *count -= 1;
                if *count == 0 {
                    self.keys_by_tenant.remove(tenant);
                }
            }
        }
    }
    pub fn keys_of_tenant(&self, tenant: &str) -> usize {
        self.keys_by_tenant.get(tenant).copied().unwrap_or(0)
    }
}

/// A partition's remembered creates, by request and by storage id. Every
/// change the engine makes it also reports in [`ApplyOutput`], so a table
/// on disk may hold changes apart until the caller has written them.
pub trait RequestTable: std::fmt::Debug + Send + Sync {
    /// The entry remembered for `request`.
    fn find(&self, request: &RequestId) -> Option<Deduped>;
    /// The request whose entry has storage id `id`.
    fn at(&self, id: u64) -> Option<RequestId>;
    fn insert(&mut self, id: u64, request: &RequestId, entry: Deduped);
    fn remove(&mut self, id: u64, request: &RequestId);
    /// Entries with storage ids below `bound`, in id order. Every call's
    /// bound is at least the last one's; an entry may be inserted below a
    /// bound already asked for (a window of 0 ms), and is then reported by
    /// the next call.
    fn expiring(&mut self, bound: u64) -> Vec<(u64, RequestId)>;
    fn counts(&self) -> &RequestCounts;
    /// The changes reported so far are stored: a table on disk reads them
    /// from there from now on.
    fn written(&mut self) {}
}

impl Default for Box<dyn RequestTable> {
    fn default() -> Self {
        Box::new(MemoryRequests::default())
    }
}

/// A request table held in memory.
#[derive(Debug, Default)]
pub struct MemoryRequests {
    /// Request id -> the job it made. The standard (SipHash) hasher: keys
    /// include producers' idempotency keys, chosen by clients.
    by_request: HashMap<RequestId, Deduped>,
    by_id: BTreeMap<u64, RequestId>,
    counts: RequestCounts,
}

impl MemoryRequests {
    pub fn new(entries: impl IntoIterator<Item = (u64, RequestId, Deduped)>) -> Self {
        let mut table = MemoryRequests::default();
        for (id, request, entry) in entries {
            table.insert(id, &request, entry);
        }
        table
    }
    /// Every entry with its storage id, in id order.
    pub fn entries(&self) -> impl Iterator<Item = (u64, &RequestId, &Deduped)> {
        self.by_id.iter().map(|(id, request)| (*id, request, &self.by_request[request]))
    }
}

impl RequestTable for MemoryRequests {
    fn find(&self, request: &RequestId) -> Option<Deduped> {
        self.by_request.get(request).copied()
    }
    fn at(&self, id: u64) -> Option<RequestId> {
        self.by_id.get(&id).cloned()
    }
    fn insert(&mut self, id: u64, request: &RequestId, entry: Deduped) {
        self.by_id.insert(id, request.clone());
        if self.by_request.insert(request.clone(), entry).is_none() {
            self.counts.add(request);
        }
    }
    fn remove(&mut self, id: u64, request: &RequestId) {
        self.by_id.remove(&id);
        if self.by_request.remove(request).is_some() {
            self.counts.remove(request);
        }
    }
    fn expiring(&mut self, bound: u64) -> Vec<(u64, RequestId)> {
        self.by_id.range(..bound).map(|(id, request)| (*id, request.clone())).collect()
    }
    fn counts(&self) -> &RequestCounts {
        &self.counts
    }
}

impl PartitionState {
    /// The request entries' changes reported so far are stored (see
    /// [`RequestTable::written`]).
    pub fn requests_written(&mut self) {
        self.requests.written();
    }
    pub(super) fn expire_requests(&mut self, out: &mut ApplyOutput) {
        let bound = request_expiry_bound(self.clock);
        for (id, request) in self.requests.expiring(bound) {
            self.requests.remove(id, &request);
            out.requests_expired.push((id, request));
        }
    }
    pub(super) fn remember(
        &mut self,
        request: &RequestId,
        job: JobKey,
        spec: &JobSpec,
        window: Millis,
        out: &mut ApplyOutput,
    ) {
        let fingerprint = match request {
            RequestId::Key { .. } => payload_fingerprint(spec),
            RequestId::Gateway { .. } => 0,
        };
        let expires_at = self.clock.saturating_add(window.max(0));
        self.remember_entry(request, Deduped { job, expires_at, fingerprint }, out);
    }

    /// Remembers `entry` for `request` until it expires.
    pub(super) fn remember_entry(&mut self, request: &RequestId, entry: Deduped, out: &mut ApplyOutput) {
        let id = request_storage_id(entry.expires_at, self.next_request_seq);
        self.next_request_seq += 1;
        if let Some(displaced) = self.requests.at(id) {
            // Only when two entries expire in one ms with sequence numbers
            // 2^20 apart: forget the older one rather than keep an entry
            // storage cannot hold.
            self.requests.remove(id, &displaced);
            out.requests_expired.push((id, displaced));
        }
        self.requests.insert(id, request, entry);
        out.requests_added.push((id, request.clone(), entry));
    }
}
