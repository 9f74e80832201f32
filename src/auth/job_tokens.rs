//! Job-scoped temporary credentials, as Taskcluster's `claimTask` hands out:
//! each activation carries a token that acts only on that job and attempt
//! (CompleteJob(s), FailJob, UpdateJobTimeout, CheckpointJob) and expires
//! [`GRACE_MS`] after the job's deadline, as the minting gateway's wall clock
//! reads that deadline (`NodeContext::job_token`). UpdateJobTimeout, CheckpointJob and a
//! session's Heartbeat answer a fresh one with the later expiry. A leaked
//! job token cannot touch another job, nor the same job's next attempt.
//!
//! A token is `drj_<key>_<attempt>_<expires ms>_<HMAC-SHA256, hex>`, signed
//! with a key every node of the cluster shares (`--job-token-key`), so any
//! gateway verifies what any other minted, and nothing is stored.

use std::path::Path;

use anyhow::Context as _;

/// How long a job token outlives the deadline it was minted for.
pub const GRACE_MS: i64 = 30_000;
const PREFIX: &str = "drj_";

/// The shared key job tokens are signed with.
pub struct JobTokens {
    key: ring::hmac::Key,
}

/// What a verified job token allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobGrant {
    pub key: u64,
    pub attempt: u32,
    pub expires_ms: i64,
}

impl JobTokens {
    /// Reads the key file: at least 32 bytes, the same on every node.
    pub fn load(path: &Path) -> anyhow::Result<JobTokens> {
        let bytes = std::fs::read(path).with_context(|| format!("reading the job token key {}", path.display()))?;
        let secret = String::from_utf8_lossy(&bytes);
        anyhow::ensure!(
            secret.trim().len() >= 32,
            "{}: a job token key must hold at least 32 characters (drover token secret makes one)",
            path.display()
        );
        Ok(JobTokens::from_secret(secret.trim().as_bytes()))
    }

    pub fn from_secret(secret: &[u8]) -> JobTokens {
        JobTokens { key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret) }
    }

    fn signed_part(key: u64, attempt: u32, expires_ms: i64) -> String {
        format!("{PREFIX}{key}_{attempt}_{expires_ms}")
    }

    /// A token for `key` at `attempt`, valid until `expires_ms` (epoch ms).
    pub fn mint(&self, key: u64, attempt: u32, expires_ms: i64) -> String {
        let signed = Self::signed_part(key, attempt, expires_ms);
        let tag = ring::hmac::sign(&self.key, signed.as_bytes());
        let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        format!("{signed}_{hex}")
    }

    /// A token for a job whose deadline is `deadline_ms`: it lasts [`GRACE_MS`] longer.
    pub fn for_deadline(&self, key: u64, attempt: u32, deadline_ms: i64) -> String {
        self.mint(key, attempt, deadline_ms.saturating_add(GRACE_MS))
    }

    /// Whether `token` looks like a job token (so no other source is asked).
    pub fn is_job_token(token: &str) -> bool {
        token.starts_with(PREFIX)
    }

    /// The grant a token carries, if this key signed it; expiry is the
    /// caller's to judge.
    pub fn verify(&self, token: &str) -> Option<JobGrant> {
        let (signed, hex) = token.rsplit_once('_')?;
        let mut parts = signed.strip_prefix(PREFIX)?.split('_');
        let key = parts.next()?.parse().ok()?;
        let attempt = parts.next()?.parse().ok()?;
        let expires_ms = parts.next()?.parse().ok()?;
        if parts.next().is_some() || hex.len() != 64 {
            return None;
        }
        let tag: Vec<u8> =
            (0..32).map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()).collect::<Option<_>>()?;
        // Constant time, by ring.
        ring::hmac::verify(&self.key, signed.as_bytes(), &tag).ok()?;
        Some(JobGrant { key, attempt, expires_ms })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_verifies_only_whole_and_under_its_own_key() {
        let tokens = JobTokens::from_secret(b"0123456789abcdef0123456789abcdef");
        let token = tokens.mint(42, 3, 1_000);
        assert_eq!(tokens.verify(&token), Some(JobGrant { key: 42, attempt: 3, expires_ms: 1_000 }));
        assert!(JobTokens::is_job_token(&token));
        // Another job, another attempt, a later expiry: the tag no longer fits.
        for forged in
            [token.replacen("_42_", "_43_", 1), token.replacen("_3_", "_4_", 1), token.replace("_1000_", "_9000_")]
        {
            assert_eq!(tokens.verify(&forged), None, "{forged}");
        }
        assert_eq!(JobTokens::from_secret(b"another key, just as long as that").verify(&token), None);
        assert_eq!(tokens.verify("drj_42_3_1000_zz"), None);
        assert_eq!(tokens.verify(&token[..token.len() - 2]), None);
    }
}
