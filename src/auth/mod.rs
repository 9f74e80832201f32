//! Authentication and authorization of client requests.
//!
//! This module owns:
//! - [`Authenticator`]: turns a bearer token into a [`Principal`]. Tokens
//!   come from a tokens file (secrets stored as SHA-256 hashes, each with
//!   scopes and tenants) and from JWTs signed by a configured issuer's key (a
//!   JWKS file; RS256 or ES256), so an OIDC provider can issue them. Both
//!   files are reloaded when they change, checked at most every
//!   [`RELOAD_EVERY`].
//! - [`scopes`]: what a principal may do (Taskcluster-style scopes with `*`
//!   suffix wildcards, and tenants).
//! - [`keys`]: `drover token ...`: signing keys, signed tokens, hashed
//!   secrets.
//!
//! With neither file configured, authentication is off: every request is
//! [`Principal::anonymous`], as before, and the start-up log says so.

pub mod keys;
pub mod scopes;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::gateway::ApiError;
pub use scopes::{Principal, Verb, CLUSTER_ADMIN, CLUSTER_READ, WORKERS_MANAGE};

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
}

pub struct Authenticator {
    settings: AuthSettings,
    loaded: RwLock<Arc<Loaded>>,
    /// Milliseconds since the epoch of the last look at the files.
    checked_at: AtomicU64,
}

fn now_ms() -> u64 {
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
        Ok(Arc::new(Authenticator { settings, loaded: RwLock::new(Arc::new(loaded)), checked_at: now_ms().into() }))
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
                let principal = Principal { name: entry.name, scopes: entry.scopes, tenants: entry.tenants };
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

    /// The principal `authorization` (the header's value) names. No header
    /// with authentication on, an unknown secret, or a JWT that does not
    /// verify: UNAUTHENTICATED, saying which.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Arc<Principal>, ApiError> {
        if !self.enabled() {
            return Ok(Arc::new(Principal::anonymous()));
        }
        let Some(header) = authorization else {
            return Err(ApiError::Unauthenticated(
                "this request carries no token: send `authorization: Bearer <token>`".into(),
            ));
        };
        let Some(token) = header.strip_prefix("Bearer ").or_else(|| header.strip_prefix("bearer ")) else {
            return Err(ApiError::Unauthenticated("the authorization header must be `Bearer <token>`".into()));
        };
        let token = token.trim();
        let loaded = self.current();
        // A JWT has three dot-separated parts; a secret has no dots.
        if token.split('.').count() == 3 {
            return self.verify_jwt(&loaded, token);
        }
        loaded
            .tokens
            .get(&hash_secret(token))
            .cloned()
            .ok_or_else(|| ApiError::Unauthenticated("the token is not one this cluster knows".into()))
    }

    fn verify_jwt(&self, loaded: &Loaded, token: &str) -> Result<Arc<Principal>, ApiError> {
        let refused = |why: String| ApiError::Unauthenticated(format!("the JWT was refused: {why}"));
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
                    return Ok(Arc::new(Principal { name, scopes, tenants: claims.tenants }));
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
