//! OJS job ids: UUIDv7 strings, mapped to Drover's job keys.
//!
//! A job the server names gets a UUIDv7 whose 48-bit time is the create's
//! gateway time (ms) and whose 74 random bits carry the job's key (64 bits)
//! and a 10-bit check of both, so the id alone leads to the job's partition
//! with no index. A job created with a client's own id keeps that id: it is
//! the create's idempotency key, found through the partition that key hashes
//! to for as long as the key is remembered (the de-duplication window).

use crate::core::{uuid_v7, JobKey, StableHash};

const CHECK_BITS: u32 = 10;

/// The UUIDv7 of the job with `key`, created at `at_ms` (Unix ms).
pub fn job_id(key: JobKey, at_ms: i64) -> String {
    uuid_v7(at_ms, (u128::from(check(key, at_ms)) << 64) | u128::from(key.0))
}

/// The key a server-made id carries, if `id` is one (its check holds).
/// A client's id passes the check by chance one time in 1024: callers
/// confirm by reading the job and comparing its id.
pub fn key_of(id: &str) -> Option<JobKey> {
    stamped_key_of(id).map(|(key, _)| key)
}

/// The key a server-made id carries and the time it was made with (Unix
/// ms), if `id` is one; as [`key_of`], only the job's id confirms it.
pub fn stamped_key_of(id: &str) -> Option<(JobKey, i64)> {
    if !is_uuidv7(id) {
        return None;
    }
    let value = u128::from_str_radix(&id.replace('-', ""), 16).ok()?;
    let at_ms = (value >> 80) as i64;
    let rand_a = (value >> 64) & 0xfff;
    let rand_b = value & ((1 << 62) - 1);
    let random = (rand_a << 62) | rand_b;
    let key = JobKey(random as u64);
    (u128::from(check(key, at_ms)) == random >> 64).then_some((key, at_ms))
}

fn check(key: JobKey, at_ms: i64) -> u16 {
    let hash = StableHash::new().part(&key.0.to_be_bytes()).part(&at_ms.to_be_bytes()).finish();
    (hash & ((1 << CHECK_BITS) - 1)) as u16
}

/// Whether `id` is a UUIDv7 as OJS writes them: lowercase hex, version 7,
/// RFC 4122 variant.
pub fn is_uuidv7(id: &str) -> bool {
    let bytes = id.as_bytes();
    bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, &b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            14 => b == b'7',
            19 => matches!(b, b'8' | b'9' | b'a' | b'b'),
            _ => b.is_ascii_digit() || (b'a'..=b'f').contains(&b),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_made_id_is_a_uuidv7_that_leads_back_to_its_key() {
        for (key, at) in [(JobKey::new(0, 1), 0), (JobKey::new(2, 123_456), 1_764_000_000_000), (JobKey(u64::MAX), 1)] {
            let id = job_id(key, at);
            assert!(is_uuidv7(&id), "{id}");
            assert_eq!(key_of(&id), Some(key), "{id}");
            assert_eq!(stamped_key_of(&id), Some((key, at)), "{id}");
        }
        assert_ne!(job_id(JobKey::new(0, 1), 5), job_id(JobKey::new(0, 2), 5));
    }

    #[test]
    fn ids_that_are_not_lowercase_uuidv7_are_refused() {
        for id in [
            "550e8400-e29b-41d4-a716-446655440000",
            "019461A8-1A2B-7C3D-8E4F-5A6B7C8D9E0F",
            "not-a-uuid-at-all",
            "",
            "019461a8-1a2b-7c3d-cf4f-5a6b7c8d9e0f",
        ] {
            assert!(!is_uuidv7(id), "{id}");
            assert_eq!(key_of(id), None);
        }
        assert!(is_uuidv7("019461a8-1a2b-7c3d-8e4f-5a6b7c8d9e0f"));
    }

    #[test]
    fn most_client_ids_fail_the_check() {
        let passing = (0..4096u64).filter(|n| key_of(&format!("019461a8-1a2b-7c3d-8e4f-{n:012x}")).is_some()).count();
        assert!(passing < 30, "{passing} of 4096 random ids passed the 10-bit check");
    }
}
