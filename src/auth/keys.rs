//! What `drover token` makes: an ES256 signing key with its JWK set, JWTs
//! signed with that key, and random secrets with their tokens-file entries.
//! For small deployments without an OIDC provider; a provider's tokens are
//! verified the same way through its JWKS.

use std::path::Path;

use anyhow::Context as _;
use base64::Engine as _;
use serde::Serialize;

/// The signing key and the JWK set its tokens are verified with.
pub struct SigningKey {
    /// PKCS#8 PEM of the private key.
    pub private_pem: String,
    /// A JWK set holding the public key alone.
    pub jwks: String,
    pub key_id: String,
}

/// The claims `drover token create` signs.
#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    sub: &'a str,
    iat: u64,
    exp: u64,
    scopes: &'a [String],
    tenants: &'a [String],
}

fn key_id(public: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, public);
    digest.as_ref()[..8].iter().map(|b| format!("{b:02x}")).collect()
}

fn jwks_of(key: &rcgen::KeyPair) -> anyhow::Result<(String, String)> {
    // An uncompressed P-256 point: 0x04, then x and y, 32 bytes each.
    let raw = key.public_key_raw();
    anyhow::ensure!(raw.len() == 65 && raw[0] == 4, "the key is not an uncompressed P-256 point");
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let kid = key_id(raw);
    let jwks = serde_json::json!({
        "keys": [{
            "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": kid,
            "x": b64(&raw[1..33]), "y": b64(&raw[33..]),
        }]
    });
    Ok((serde_json::to_string_pretty(&jwks)?, kid))
}

/// A new ES256 (P-256) signing key.
pub fn generate_signing_key() -> anyhow::Result<SigningKey> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let (jwks, key_id) = jwks_of(&key)?;
    Ok(SigningKey { private_pem: key.serialize_pem(), jwks, key_id })
}

/// Writes `signing-key.pem` (owner-only) and `jwks.json` into `dir`.
pub fn write_signing_key(dir: &Path) -> anyhow::Result<SigningKey> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let key = generate_signing_key()?;
    crate::tls::write_private(&dir.join("signing-key.pem"), &key.private_pem)?;
    std::fs::write(dir.join("jwks.json"), &key.jwks)?;
    Ok(key)
}

/// A JWT for `subject` from `issuer`, signed with the PEM key, valid for `ttl`.
pub fn create_token(
    private_pem: &str,
    issuer: &str,
    subject: &str,
    scopes: &[String],
    tenants: &[String],
    ttl: std::time::Duration,
) -> anyhow::Result<String> {
    let key = rcgen::KeyPair::from_pem(private_pem).context("the signing key is not a PEM private key")?;
    let (_, kid) = jwks_of(&key).context("the signing key must be an ES256 (P-256) key")?;
    let encoding = jsonwebtoken::EncodingKey::from_ec_pem(private_pem.as_bytes())?;
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some(kid);
    let iat = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let claims = Claims { iss: issuer, sub: subject, iat, exp: iat + ttl.as_secs().max(1), scopes, tenants };
    Ok(jsonwebtoken::encode(&header, &claims, &encoding)?)
}

/// A new random secret (`drv_` and 43 base64url characters: 256 bits).
pub fn generate_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("drv_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The tokens-file entry for `secret`: only its hash is stored.
pub fn token_entry(name: &str, secret: &str, scopes: &[String], tenants: &[String]) -> String {
    let list = |items: &[String]| items.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ");
    format!(
        "[[token]]\nname = {name:?}\nsha256 = \"{}\"\nscopes = [{}]\ntenants = [{}]\n",
        super::hash_secret(secret),
        list(scopes),
        list(tenants)
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{AuthSettings, Authenticator};
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_signed_token_verifies_against_its_jwks_and_a_secret_against_its_entry() {
        let dir = tempfile::tempdir().unwrap();
        write_signing_key(dir.path()).unwrap();
        let secret = generate_secret();
        let entry = token_entry("ops", &secret, &strings(&["cluster:read"]), &strings(&["*"]));
        std::fs::write(dir.path().join("tokens.toml"), &entry).unwrap();
        let auth = Authenticator::load(AuthSettings {
            tokens_file: Some(dir.path().join("tokens.toml")),
            jwks_file: Some(dir.path().join("jwks.json")),
            jwt_issuers: strings(&["drover"]),
            ..AuthSettings::default()
        })
        .unwrap();
        let pem = std::fs::read_to_string(dir.path().join("signing-key.pem")).unwrap();
        let scopes = strings(&["jobs:work:orders"]);
        let token =
            create_token(&pem, "drover", "worker-1", &scopes, &strings(&["acme"]), Duration::from_secs(60)).unwrap();
        let principal = auth.authenticate(Some(&format!("Bearer {token}"))).unwrap();
        assert_eq!(principal.name, "drover#worker-1");
        assert_eq!(principal.scopes, scopes);
        assert_eq!(principal.tenants, strings(&["acme"]));
        let ops = auth.authenticate(Some(&format!("Bearer {secret}"))).unwrap();
        assert_eq!(ops.name, "ops");
        for (header, why) in [
            (None, "carries no token"),
            (Some("Basic abc".to_string()), "Bearer <token>"),
            (Some(format!("Bearer {secret}x")), "not one this cluster knows"),
        ] {
            let error = auth.authenticate(header.as_deref()).unwrap_err();
            assert!(matches!(error, crate::auth::AuthError::Unauthenticated(_)), "{error}");
            assert!(error.to_string().contains(why), "{error}");
        }
    }

    #[test]
    fn expired_wrong_issuer_and_foreign_key_tokens_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let key = write_signing_key(dir.path()).unwrap();
        let other = generate_signing_key().unwrap();
        let auth = Authenticator::load(AuthSettings {
            jwks_file: Some(dir.path().join("jwks.json")),
            jwt_issuers: strings(&["drover"]),
            ..AuthSettings::default()
        })
        .unwrap();
        let sign = |pem: &str, issuer: &str, exp_offset: i64| {
            let encoding = jsonwebtoken::EncodingKey::from_ec_pem(pem.as_bytes()).unwrap();
            let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
            header.kid = Some(key.key_id.clone());
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
            let claims = serde_json::json!({"iss": issuer, "sub": "w", "exp": now + exp_offset, "scope": "jobs:*"});
            jsonwebtoken::encode(&header, &claims, &encoding).unwrap()
        };
        let good = sign(&key.private_pem, "drover", 60);
        assert_eq!(auth.authenticate(Some(&format!("Bearer {good}"))).unwrap().scopes, strings(&["jobs:*"]));
        for (token, why) in [
            (sign(&key.private_pem, "drover", -3600), "expired"),
            (sign(&key.private_pem, "someone-else", 60), "issuer"),
            (sign(&other.private_pem, "drover", 60), "signature"),
        ] {
            let error = auth.authenticate(Some(&format!("Bearer {token}"))).unwrap_err();
            assert!(matches!(error, crate::auth::AuthError::Unauthenticated(_)), "{error}");
            assert!(error.to_string().contains(why), "{why}: {error}");
        }
    }

    #[test]
    fn a_changed_tokens_file_is_read_again_and_a_broken_one_keeps_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        let (first, second) = (generate_secret(), generate_secret());
        std::fs::write(&path, token_entry("a", &first, &[], &[])).unwrap();
        let auth =
            Authenticator::load(AuthSettings { tokens_file: Some(path.clone()), ..AuthSettings::default() }).unwrap();
        assert!(auth.authenticate(Some(&format!("Bearer {first}"))).is_ok());
        std::fs::write(&path, format!("{}\n", token_entry("b", &second, &[], &[]))).unwrap();
        auth.checked_at.store(0, std::sync::atomic::Ordering::Relaxed);
        assert!(auth.authenticate(Some(&format!("Bearer {first}"))).is_err(), "a removed token is refused");
        assert_eq!(auth.authenticate(Some(&format!("Bearer {second}"))).unwrap().name, "b");
        std::fs::write(&path, "[[token]]\nname = 3\n# half written, longer than before").unwrap();
        auth.checked_at.store(0, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(auth.authenticate(Some(&format!("Bearer {second}"))).unwrap().name, "b");
    }
}
