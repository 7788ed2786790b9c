//! Secrets: password hashes, access tokens, API keys and codes. Only hashes are ever stored.
use argon2::password_hash::{phc::PasswordHash, PasswordHasher, PasswordVerifier};
use argon2::Argon2;
use jsonwebtoken::{decode, encode, Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rand::distr::{Alphanumeric, SampleString};
use rand::Rng;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The fixed prefix of every API key.
pub const KEY_PREFIX: &str = "engram_";

/// Hashes a password with argon2id (blocking: call from `spawn_blocking`).
pub fn hash_password(password: &str) -> anyhow::Result<String> {
    Argon2::default()
        .hash_password(password.as_bytes())
        .map(|h| h.to_string())
        .map_err(|e| anyhow::anyhow!("hashing password: {e}"))
}

/// Checks a password against its stored PHC string (blocking).
pub fn verify_password(password: &str, phc: &str) -> bool {
    PasswordHash::new(phc)
        .map(|parsed| {
            Argon2::default()
                .verify_password(password.as_bytes(), &parsed)
                .is_ok()
        })
        .unwrap_or(false)
}

/// A PHC hash of a random password, verified against when the e-mail is unknown so that a login
/// takes as long for an unknown e-mail as for a wrong password.
pub fn dummy_password_hash() -> &'static str {
    static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DUMMY.get_or_init(|| hash_password(&random_token(24)).unwrap_or_default())
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    iat: i64,
    exp: i64,
}

/// Issues an HS256 access token for a user.
pub fn issue_token(secret: &[u8], user_id: i64, ttl_secs: i64) -> anyhow::Result<String> {
    let now = chrono::Utc::now().timestamp();
    let claims = Claims {
        sub: user_id.to_string(),
        iat: now,
        exp: now + ttl_secs,
    };
    Ok(encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret),
    )?)
}

/// The user id of a valid, unexpired token.
pub fn verify_token(secret: &[u8], token: &str) -> Option<i64> {
    let mut validation = Validation::new(Algorithm::HS256);
    validation.leeway = 0;
    decode::<Claims>(token, &DecodingKey::from_secret(secret), &validation)
        .ok()?
        .claims
        .sub
        .parse()
        .ok()
}

/// A random base62 string from the thread's CSPRNG.
pub fn random_token(len: usize) -> String {
    Alphanumeric.sample_string(&mut rand::rng(), len)
}

/// A new API key: the prefix and 40 random base62 characters.
pub fn new_api_key() -> String {
    format!("{KEY_PREFIX}{}", random_token(40))
}

/// A random six-digit verification code.
pub fn new_verification_code() -> String {
    format!("{:06}", rand::rng().random_range(0..1_000_000u32))
}

/// SHA-256 of a secret, the only form in which keys, codes and fingerprints are stored.
pub fn sha256(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// How a key is shown after creation: `engram_AbCd…wxyz`.
pub fn mask_key(prefix: &str, last4: &str) -> String {
    format!("{prefix}…{last4}")
}

/// Whether two byte strings are equal, in time independent of where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_keys_have_the_prefix_and_enough_randomness() {
        let key = new_api_key();
        assert!(key.starts_with("engram_"));
        assert_eq!(key.len(), 7 + 40);
        assert_ne!(key, new_api_key());
    }

    #[test]
    fn tokens_round_trip_and_expired_or_forged_ones_fail() {
        let secret = b"0123456789abcdef0123456789abcdef";
        let t = issue_token(secret, 42, 60).unwrap();
        assert_eq!(verify_token(secret, &t), Some(42));
        assert_eq!(verify_token(b"another-secret-another-secret-xx", &t), None);
        let expired = issue_token(secret, 42, -10).unwrap();
        assert_eq!(verify_token(secret, &expired), None);
    }

    #[test]
    fn passwords_verify_only_with_the_right_password() {
        let h = hash_password("correct horse").unwrap();
        assert!(h.starts_with("$argon2id$"));
        assert!(verify_password("correct horse", &h));
        assert!(!verify_password("wrong horse", &h));
    }

    #[test]
    fn codes_are_six_digits() {
        for _ in 0..100 {
            let c = new_verification_code();
            assert_eq!(c.len(), 6);
            assert!(c.chars().all(|ch| ch.is_ascii_digit()));
        }
    }
}
