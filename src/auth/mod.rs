//! Authentication and authorization of client requests.
//!
//! This module owns:
//! - [`Authenticator`]: turns a bearer token into a [`Principal`]. Tokens
//!   come from a tokens file (secrets stored as SHA-256 hashes, each with
//!   scopes and tenants) and from JWTs signed by a configured issuer's key (a
//!   JWKS file; RS256 or ES256), so an OIDC provider can issue them. Both
//!   files are reloaded when they change, checked at most every
//!   [`RELOAD_EVERY`].
//! - What a principal may do (Taskcluster-style scopes with `*` suffix
//!   wildcards, and tenants) is pure and lives with the engine
//!   ([`crate::core::principal`]), which judges commands again at apply;
//!   it is re-exported here.
//! - [`keys`]: `drover token ...`: signing keys, signed tokens, hashed
//!   secrets.
//!
//! With neither file configured, authentication is off: every request is
//! [`Principal::anonymous`], as before, and the start-up log says so.

pub mod job_tokens;
pub mod keys;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

pub use crate::core::principal::{AuthError, Principal, Verb, CLUSTER_ADMIN, CLUSTER_READ, WORKERS_MANAGE};

/// How often the tokens and JWKS files are checked for changes.
pub const RELOAD_EVERY: Duration = Duration::from_secs(2);
/// Clock skew allowed on a JWT's `exp` and `nbf`.
const LEEWAY_SECS: u64 = 30;

/// Where principals come from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthSettings {
    /// TOML: `[[token]]` tables with `name`, `sha256`, `scopes`, `tenants`.
    pub tokens_file: Option<PathBuf>,
    /// A JWK set: the keys JWTs are verified with.
    pub jwks_file: Option<PathBuf>,
    /// Accepted `iss` values; a JWT from any other issuer is refused.
    pub jwt_issuers: Vec<String>,
    /// When set, a JWT's `aud` must include it.
    pub jwt_audience: Option<String>,
    /// Calls one principal may start per second on this node (a stream
    /// counts once, not per message); 0: no limit. Only with tokens on.
    pub requests_per_second: u32,
    /// Job streams (StreamActivatedJobs, drover.v1 and Zeebe) one principal
    /// may hold open on this node; 0: no limit. Only with tokens on.
    pub streams: u32,
    /// The key job tokens are signed with, the same on every node; without
    /// it, activations carry none.
    pub job_token_key: Option<PathBuf>,
}

impl AuthSettings {
    pub fn enabled(&self) -> bool {
        self.tokens_file.is_some() || self.jwks_file.is_some()
    }
}

/// One entry of the tokens file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    pub name: String,
    /// Hex SHA-256 of the secret.
    pub sha256: String,
    #[serde(default)]
    pub scopes: Vec<String>,
    #[serde(default)]
    pub tenants: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    token: Vec<TokenEntry>,
}

/// The claims Drover reads from a JWT. Scopes come from `scope` (OAuth's
/// space-separated string) or `scopes` (a list); tenants from `tenants`.
#[derive(Debug, Deserialize)]
struct Claims {
    iss: String,
    exp: u64,
    #[serde(default)]
    sub: String,
    #[serde(default)]
    scope: String,
    #[serde(default)]
    scopes: Vec<String>,
    #[serde(default)]
    tenants: Vec<String>,
}

/// What the files said when last read.
#[derive(Default)]
struct Loaded {
    /// Hex SHA-256 of a secret -> its principal.
    tokens: HashMap<String, Arc<Principal>>,
    /// Keys by `kid`, and those without one.
    keys: Vec<(Option<String>, Algorithm, DecodingKey)>,
    stamps: Vec<Option<(SystemTime, u64)>>,
    /// JWTs these keys verified, with their principal and expiry (seconds
    /// since the epoch): a client sends the same token on every call, and a
    /// signature check costs far more than a lookup. Gone with a reload.
    verified: Mutex<HashMap<String, (Arc<Principal>, u64)>>,
}

/// JWTs remembered at most; past it the memory starts over.
const MAX_VERIFIED: usize = 10_000;
/// Principals' rate buckets kept before idle ones are dropped.
const MAX_BUCKETS: usize = 10_000;

pub struct Authenticator {
    settings: AuthSettings,
    loaded: RwLock<Arc<Loaded>>,
    /// Milliseconds since the epoch of the last look at the files.
    checked_at: AtomicU64,
    /// Per principal name: tokens left in its bucket, and when it was filled.
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
    /// Per principal name: job streams open on this node.
    streams: Arc<Mutex<HashMap<String, u32>>>,
    job_tokens: Option<job_tokens::JobTokens>,
}

/// One open job stream of a principal; dropping it gives the slot back.
pub struct StreamPermit {
    name: String,
    streams: Arc<Mutex<HashMap<String, u32>>>,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut streams = self.streams.lock().expect("stream counts");
        if let Some(count) = streams.get_mut(&self.name) {
            *count -= 1;
            if *count == 0 {
                streams.remove(&self.name);
            }
        }
    }
}

/// Milliseconds since the Unix epoch, by this machine's clock.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Hex SHA-256 of a token secret, as the tokens file stores it.
pub fn hash_secret(secret: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    std::fs::metadata(path).ok().map(|m| (m.modified().unwrap_or(UNIX_EPOCH), m.len()))
}

impl Authenticator {
    /// Reads the files now: a missing or malformed one is an error at start.
    pub fn load(settings: AuthSettings) -> anyhow::Result<Arc<Authenticator>> {
        if settings.jwks_file.is_some() && settings.jwt_issuers.is_empty() {
            bail!("--jwks-file needs at least one --jwt-issuer: JWTs are accepted only from named issuers");
        }
        let loaded = Self::read(&settings)?;
        let job_tokens = match &settings.job_token_key {
            Some(_) if !settings.enabled() => {
                bail!("--job-token-key needs tokens on (--tokens-file or --jwks-file): job tokens stand in for them")
            }
            Some(path) => Some(job_tokens::JobTokens::load(path)?),
            None => None,
        };
        Ok(Arc::new(Authenticator {
            job_tokens,
            settings,
            loaded: RwLock::new(Arc::new(loaded)),
            checked_at: now_ms().into(),
            buckets: Mutex::default(),
            streams: Arc::default(),
        }))
    }

    pub fn enabled(&self) -> bool {
        self.settings.enabled()
    }

    fn stamps(settings: &AuthSettings) -> Vec<Option<(SystemTime, u64)>> {
        [&settings.tokens_file, &settings.jwks_file].iter().map(|p| p.as_deref().and_then(stamp)).collect()
    }

    fn read(settings: &AuthSettings) -> anyhow::Result<Loaded> {
        let stamps = Self::stamps(settings);
        let mut loaded = Loaded { stamps, ..Loaded::default() };
        if let Some(path) = &settings.tokens_file {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let file: TokensFile =
                toml::from_str(&text).with_context(|| format!("{} is not a tokens file", path.display()))?;
            for entry in file.token {
                let hash = entry.sha256.to_ascii_lowercase();
                if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                    bail!("{}: token {:?}: sha256 must be 64 hex digits", path.display(), entry.name);
                }
                let principal = Principal { name: entry.name, scopes: entry.scopes, tenants: entry.tenants, job: None };
                loaded.tokens.insert(hash, Arc::new(principal));
            }
        }
        if let Some(path) = &settings.jwks_file {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            let set: JwkSet =
                serde_json::from_str(&text).with_context(|| format!("{} is not a JWK set", path.display()))?;
            for jwk in &set.keys {
                let algorithm = match &jwk.algorithm {
                    jsonwebtoken::jwk::AlgorithmParameters::RSA(_) => Algorithm::RS256,
                    jsonwebtoken::jwk::AlgorithmParameters::EllipticCurve(p)
                        if p.curve == jsonwebtoken::jwk::EllipticCurve::P256 =>
                    {
                        Algorithm::ES256
                    }
                    _ => bail!("{}: only RSA (RS256) and P-256 (ES256) keys are accepted", path.display()),
                };
                let key = DecodingKey::from_jwk(jwk).with_context(|| format!("{}: a malformed key", path.display()))?;
                loaded.keys.push((jwk.common.key_id.clone(), algorithm, key));
            }
        }
        Ok(loaded)
    }

    /// The files' current contents: read again when one changed. A change
    /// that does not load (a half-written file) keeps the old contents.
    fn current(&self) -> Arc<Loaded> {
        let now = now_ms();
        let last = self.checked_at.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= RELOAD_EVERY.as_millis() as u64
            && self.checked_at.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            let stamps = Self::stamps(&self.settings);
            let changed = stamps != self.loaded.read().expect("auth lock").stamps;
            if changed {
                match Self::read(&self.settings) {
                    Ok(loaded) => {
                        *self.loaded.write().expect("auth lock") = Arc::new(loaded);
                        metrics::counter!("drover_auth_reloads_total").increment(1);
                        tracing::info!("reloaded the tokens and JWKS files");
                    }
                    Err(error) => tracing::warn!("kept the previous tokens and keys: {error:#}"),
                }
            }
        }
        Arc::clone(&self.loaded.read().expect("auth lock"))
    }

    /// Counts one call of `principal` against its per-second limit:
    /// RESOURCE_EXHAUSTED past it.
    pub fn admit(&self, principal: &Principal) -> Result<(), AuthError> {
        let rate = self.settings.requests_per_second;
        if rate == 0 || !self.enabled() {
            return Ok(());
        }
        let now = Instant::now();
        let mut buckets = self.buckets.lock().expect("rate buckets");
        if buckets.len() >= MAX_BUCKETS {
            // Buckets idle for a second are full again: forgetting them changes nothing.
            buckets.retain(|_, (_, filled)| now.duration_since(*filled) < Duration::from_secs(1));
        }
        let (tokens, filled) = buckets.entry(principal.name.clone()).or_insert((f64::from(rate), now));
        *tokens = (*tokens + now.duration_since(*filled).as_secs_f64() * f64::from(rate)).min(f64::from(rate));
        *filled = now;
        if *tokens < 1.0 {
            metrics::counter!("drover_auth_limited_total", "limit" => "requests").increment(1);
            return Err(AuthError::Limited(format!(
                "{} started more than {rate} calls a second on this node; slow down and retry with back-off \
                 (the limit is --principal-requests-per-second)",
                principal.name
            )));
        }
        *tokens -= 1.0;
        Ok(())
    }

    /// A slot for one more job stream of `principal`, held until the permit
    /// drops: RESOURCE_EXHAUSTED when it holds as many as allowed.
    pub fn open_stream(&self, principal: &Principal) -> Result<Option<StreamPermit>, AuthError> {
        let limit = self.settings.streams;
        if limit == 0 || !self.enabled() {
            return Ok(None);
        }
        let mut streams = self.streams.lock().expect("stream counts");
        let count = streams.entry(principal.name.clone()).or_insert(0);
        if *count >= limit {
            metrics::counter!("drover_auth_limited_total", "limit" => "streams").increment(1);
            return Err(AuthError::Limited(format!(
                "{} holds {limit} job streams on this node, as many as allowed; close one, or raise \
                 --principal-streams",
                principal.name
            )));
        }
        *count += 1;
        Ok(Some(StreamPermit { name: principal.name.clone(), streams: Arc::clone(&self.streams) }))
    }

    /// The principal `authorization` (the header's value) names. No header
    /// with authentication on, an unknown secret, or a JWT that does not
    /// verify: UNAUTHENTICATED, saying which.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Arc<Principal>, AuthError> {
        if !self.enabled() {
            return Ok(Arc::new(Principal::anonymous()));
        }
        let Some(header) = authorization else {
            return Err(AuthError::Unauthenticated(
                "this request carries no token: send `authorization: Bearer <token>`".into(),
            ));
        };
        let Some(token) = header.strip_prefix("Bearer ").or_else(|| header.strip_prefix("bearer ")) else {
            return Err(AuthError::Unauthenticated("the authorization header must be `Bearer <token>`".into()));
        };
        let token = token.trim();
        if job_tokens::JobTokens::is_job_token(token) {
            return self.job_principal(token);
        }
        let loaded = self.current();
        // A JWT has three dot-separated parts; a secret has no dots.
        if token.split('.').count() == 3 {
            return self.verify_jwt(&loaded, token);
        }
        loaded
            .tokens
            .get(&hash_secret(token))
            .cloned()
            .ok_or_else(|| AuthError::Unauthenticated("the token is not one this cluster knows".into()))
    }

    fn job_principal(&self, token: &str) -> Result<Arc<Principal>, AuthError> {
        let Some(tokens) = &self.job_tokens else {
            return Err(AuthError::Unauthenticated("this cluster hands out no job tokens (no --job-token-key)".into()));
        };
        let grant = tokens.verify(token).ok_or_else(|| {
            AuthError::Unauthenticated(
                "the job token does not verify: it was altered or is from another cluster".into(),
            )
        })?;
        if now_ms() as i64 > grant.expires_ms {
            return Err(AuthError::Unauthenticated(format!(
                "the job token for job {} attempt {} has expired; the worker's own token still works, or renew it \
                 with UpdateJobTimeout or a heartbeat before it runs out",
                grant.key, grant.attempt
            )));
        }
        metrics::counter!("drover_auth_job_token_calls_total").increment(1);
        Ok(Arc::new(Principal::for_job(grant.key, grant.attempt)))
    }

    /// A job token for `key` at `attempt` whose deadline is `deadline_ms`;
    /// empty when this node hands out none.
    pub fn job_token(&self, key: u64, attempt: u32, deadline_ms: i64) -> String {
        match &self.job_tokens {
            Some(tokens) => tokens.for_deadline(key, attempt, deadline_ms),
            None => String::new(),
        }
    }

    /// Whether activations carry job tokens.
    pub fn mints_job_tokens(&self) -> bool {
        self.job_tokens.is_some()
    }

    fn verify_jwt(&self, loaded: &Loaded, token: &str) -> Result<Arc<Principal>, AuthError> {
        let refused = |why: String| AuthError::Unauthenticated(format!("the JWT was refused: {why}"));
        let now = now_ms() / 1000;
        if let Some((principal, exp)) = loaded.verified.lock().expect("verified JWTs").get(token) {
            if now <= exp.saturating_add(LEEWAY_SECS) {
                return Ok(Arc::clone(principal));
            }
        }
        if loaded.keys.is_empty() {
            return Err(refused("this cluster accepts no JWTs (no --jwks-file)".into()));
        }
        let header = jsonwebtoken::decode_header(token).map_err(|e| refused(e.to_string()))?;
        let candidates = loaded.keys.iter().filter(|(kid, algorithm, _)| {
            *algorithm == header.alg && (header.kid.is_none() || kid.is_none() || *kid == header.kid)
        });
        let mut validation = Validation::new(header.alg);
        validation.leeway = LEEWAY_SECS;
        validation.set_issuer(&self.settings.jwt_issuers);
        validation.set_required_spec_claims(&["exp", "iss"]);
        match &self.settings.jwt_audience {
            Some(audience) => validation.set_audience(&[audience]),
            None => validation.validate_aud = false,
        }
        let mut last = format!("no key for algorithm {:?} and key id {:?}", header.alg, header.kid);
        for (_, _, key) in candidates {
            match jsonwebtoken::decode::<Claims>(token, key, &validation) {
                Ok(data) => {
                    let claims = data.claims;
                    let mut scopes = claims.scopes;
                    scopes.extend(claims.scope.split_whitespace().map(String::from));
                    let name = format!("{}#{}", claims.iss, claims.sub);
                    let principal = Arc::new(Principal { name, scopes, tenants: claims.tenants, job: None });
                    let mut verified = loaded.verified.lock().expect("verified JWTs");
                    if verified.len() >= MAX_VERIFIED {
                        verified.clear();
                    }
                    verified.insert(token.to_string(), (Arc::clone(&principal), claims.exp));
                    return Ok(principal);
                }
                Err(error) => {
                    last = match error.kind() {
                        jsonwebtoken::errors::ErrorKind::ExpiredSignature => "it has expired".into(),
                        jsonwebtoken::errors::ErrorKind::InvalidIssuer => {
                            format!("its issuer is not one of {}", self.settings.jwt_issuers.join(", "))
                        }
                        jsonwebtoken::errors::ErrorKind::InvalidAudience => "it is for another audience".into(),
                        jsonwebtoken::errors::ErrorKind::InvalidSignature => "its signature does not verify".into(),
                        _ => error.to_string(),
                    };
                    // Only a bad signature may be another key's to verify.
                    if !matches!(error.kind(), jsonwebtoken::errors::ErrorKind::InvalidSignature) {
                        break;
                    }
                }
            }
        }
        Err(refused(last))
    }
}

/// Writes one audit line (JSON, target `drover::audit`) for an
/// administrative action: who, what, and its details (which jobs).
pub fn audit(principal: &Principal, action: &str, details: serde_json::Value) {
    let line = serde_json::json!({ "principal": principal.name, "action": action, "details": details });
    tracing::info!(target: "drover::audit", "{line}");
    metrics::counter!("drover_audit_events_total").increment(1);
}
