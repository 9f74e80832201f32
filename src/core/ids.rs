//! The identities the job model is built on: partitions, nodes, job keys,
//! the fences an attempt is named by, tenants, and the requests that make a
//! job (with the stable hash that places them).

use std::fmt;

use serde::{Deserialize, Serialize};

/// A partition id, `0..partition_count`.
pub type PartitionId = u32;

/// Milliseconds since the Unix epoch, as stamped by a partition leader.
pub type Millis = i64;

/// A node's id in the cluster, `0..cluster_size`.
pub type NodeId = u64;

/// A worker session's id, drawn at random by the gateway that registered it;
/// never 0 (0 on a job or stream means "no session").
pub type SessionId = u64;

/// The most partitions a cluster may have. Their ids fit 12 bits, so the top
/// four bits of every [`JobKey`] are zero (the Zeebe gateway carries an
/// attempt tag there).
pub const MAX_PARTITIONS: u32 = 4096;

/// How many low bits of a [`JobKey`] hold the per-partition counter.
const COUNTER_BITS: u32 = 48;
const COUNTER_MASK: u64 = (1 << COUNTER_BITS) - 1;

/// A job's identity. The partition sits in the high 16 bits and a per-partition
/// counter (starting at 1) in the low 48, so any gateway routes by key alone.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobKey(pub u64);

impl JobKey {
    pub fn new(partition: PartitionId, counter: u64) -> Self {
        JobKey(((partition as u64) << COUNTER_BITS) | (counter & COUNTER_MASK))
    }
    pub fn partition(self) -> PartitionId {
        (self.0 >> COUNTER_BITS) as PartitionId
    }
    pub fn counter(self) -> u64 {
        self.0 & COUNTER_MASK
    }
}

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Set in the attempt a job command carries when it names the activation by
/// its tag ([`attempt_tag`]) rather than exactly: the Zeebe gateway's job keys
/// have room for the tag, and Zeebe's requests have no field for an attempt.
pub const TAGGED_ATTEMPT: u32 = 1 << 31;

/// How many tags there are: attempts `n` and `n + ATTEMPT_TAGS` share one.
pub const ATTEMPT_TAGS: u32 = 7;

/// The tag of an attempt, `1..=ATTEMPT_TAGS`; 0 for attempt 0.
pub fn attempt_tag(attempt: u32) -> u32 {
    if attempt == 0 {
        0
    } else {
        (attempt - 1) % ATTEMPT_TAGS + 1
    }
}

/// Whether a command that names activation `fence` may act on the job's
/// activation `attempt`. `fence` is the attempt the command carries:
/// - 0: any activation (an operator's override);
/// - [`TAGGED_ATTEMPT`] | t: any attempt whose tag is t;
/// - anything else: exactly that attempt.
pub fn fence_admits(fence: u32, attempt: u32) -> bool {
    if fence == 0 {
        true
    } else if fence & TAGGED_ATTEMPT != 0 {
        attempt_tag(attempt) == fence & !TAGGED_ATTEMPT
    } else {
        fence == attempt
    }
}

/// A fence as a person reads it, for error messages.
pub fn describe_fence(fence: u32) -> String {
    if fence & TAGGED_ATTEMPT != 0 {
        format!("the activation tagged {}", fence & !TAGGED_ATTEMPT)
    } else {
        format!("activation attempt {fence}")
    }
}

/// The tenant used when a request names none.
pub const DEFAULT_TENANT: &str = "<default>";

/// What makes two creates "the same request", so a retried create finds the
/// job the first one made. Gateways and producers' idempotency keys share one
/// table: `(request id) -> job key`, replicated with the jobs.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RequestId {
    /// Made by a gateway for a create that carried no idempotency key. The
    /// epoch is drawn at each gateway start, so ids never repeat across restarts.
    Gateway { node: u64, epoch: u64, seq: u64 },
    /// A producer's idempotency key, unique within a tenant and user.
    Key { tenant: String, user: String, key: String },
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestId::Gateway { node, epoch, seq } => write!(f, "request {node}/{epoch:x}/{seq}"),
            RequestId::Key { tenant, user, key } if user.is_empty() => {
                write!(f, "idempotency key {key:?} of tenant {tenant:?}")
            }
            RequestId::Key { tenant, user, key } => {
                write!(f, "idempotency key {key:?} of tenant {tenant:?} and user {user:?}")
            }
        }
    }
}

/// How a read names a job: by key, or by the request that created it (an
/// idempotency key, within its window).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobRef {
    Key(JobKey),
    Request(RequestId),
}

impl JobRef {
    /// The partition that holds the job, or remembers the request.
    pub fn partition(&self, partitions: u32) -> PartitionId {
        match self {
            JobRef::Key(key) => key.partition(),
            JobRef::Request(RequestId::Key { tenant, user, key }) => {
                idempotency_partition(tenant, user, key, partitions)
            }
            JobRef::Request(RequestId::Gateway { .. }) => 0,
        }
    }
}

impl fmt::Display for JobRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobRef::Key(key) => write!(f, "key {key}"),
            JobRef::Request(request) => write!(f, "{request}"),
        }
    }
}

/// A stable 64-bit FNV-1a hash over length-prefixed parts: the same on
/// every platform and version, so replicas and gateways agree on it.
#[derive(Clone, Copy)]
pub struct StableHash(u64);

impl StableHash {
    pub fn new() -> Self {
        StableHash(0xcbf2_9ce4_8422_2325)
    }
    /// Adds one part; its length goes first, so ("ab","c") and ("a","bc") differ.
    pub fn part(mut self, bytes: &[u8]) -> Self {
        for byte in (bytes.len() as u64).to_le_bytes().iter().chain(bytes) {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
        self
    }
    pub fn finish(self) -> u64 {
        self.0
    }
}

impl Default for StableHash {
    fn default() -> Self {
        Self::new()
    }
}

/// The partition of a create with an idempotency key: every repeat of the
/// key goes to the partition that remembers it.
pub fn idempotency_partition(tenant: &str, user: &str, key: &str, partitions: u32) -> PartitionId {
    let mut hash = StableHash::new().part(tenant.as_bytes()).part(key.as_bytes());
    if !user.is_empty() {
        hash = hash.part(user.as_bytes());
    }
    (hash.finish() % u64::from(partitions.max(1))) as PartitionId
}

/// The UUIDv7 (RFC 9562) of time `at_ms` (Unix ms) whose 74 random bits
/// are the low bits of `random`: ids of workflows and of OJS jobs. Pure: the
/// caller draws the time and the randomness.
pub fn uuid_v7(at_ms: i64, random: u128) -> String {
    let time = (at_ms.max(0) as u128) & ((1 << 48) - 1);
    let random = random & ((1 << 74) - 1);
    let rand_a = (random >> 62) & 0xfff;
    let rand_b = random & ((1 << 62) - 1);
    let value = (time << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b;
    let hex = format!("{value:032x}");
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}
