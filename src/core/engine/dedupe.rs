//! The creates a partition remembers for their window: a repeat of a
//! request id or idempotency key finds the job the first one made. Each
//! entry expires by the partition's clock; storage keeps them by expiry.

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

impl PartitionState {
    pub(super) fn expire_requests(&mut self, out: &mut ApplyOutput) {
        let bound = request_expiry_bound(self.clock);
        while let Some(entry) = self.request_expiry.first_entry() {
            if *entry.key() >= bound {
                break;
            }
            let (id, request) = entry.remove_entry();
            if self.requests.remove(&request).is_some() {
                self.count_key(&request, false);
            }
            out.requests_expired.push(id);
        }
    }
    /// Counts an idempotency key of its tenant in, or out.
    pub(super) fn count_key(&mut self, request: &RequestId, added: bool) {
        let RequestId::Key { tenant, .. } = request else { return };
        if added {
            match self.keys_by_tenant.get_mut(tenant) {
                Some(count) => *count += 1,
                None => {
                    self.keys_by_tenant.insert(tenant.clone(), 1);
                }
            }
        } else if let Some(count) = self.keys_by_tenant.get_mut(tenant) {
            *count -= 1;
            if *count == 0 {
                self.keys_by_tenant.remove(tenant);
            }
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
        let entry = Deduped { job, expires_at: self.clock.saturating_add(window.max(0)), fingerprint };
        let id = request_storage_id(entry.expires_at, self.next_request_seq);
        self.next_request_seq += 1;
        if let Some(displaced) = self.request_expiry.insert(id, request.clone()) {
            // Only when over a million entries expire in one ms: forget the
            // older one rather than keep an entry storage cannot hold.
            if self.requests.remove(&displaced).is_some() {
                self.count_key(&displaced, false);
            }
        }
        // Every entry expires a window after it came, so the table churns at a
        // steady size. Left to itself, a hash table that churns grows only when
        // an insert finds no empty slot, which can be many windows after the
        // entries outgrew half of it (about seven minutes at 500 creates a
        // second): a step of memory long after the load began. Kept at most half
        // full, it reaches its size while the first window fills, and its own
        // clean-ups of removed entries stay in place. (`capacity()` counts
        // removed entries' slots as taken until such a clean-up, so the room is
        // noted when the table grows, the one moment it has none.)
        if self.requests.len() + 1 > self.requests_room / 2 {
            self.requests.reserve(self.requests.len() + 1);
            self.requests_room = self.requests.capacity();
        }
        if self.requests.insert(request.clone(), entry).is_none() {
            self.count_key(request, true);
        }
        out.requests_added.push((id, request.clone(), entry));
    }
    /// Entries the dedupe table can hold before it grows (tests).
    #[cfg(test)]
    pub(crate) fn dedupe_capacity(&self) -> usize {
        self.requests.capacity()
    }
}
