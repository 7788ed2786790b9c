//! API keys: created with the full secret shown once, stored as SHA-256 only.
use chrono::{DateTime, Utc};
use sqlx::PgExecutor;

use super::crypto;
use super::error::{AppError, AppResult};
use super::time::{iso, iso_opt};
use crate::types::ApiKeyView;

/// The account (and machine) a valid key acts for.
#[derive(Debug, Clone, Copy)]
pub struct KeyOwner {
    pub key_id: i64,
    pub user_id: i64,
    /// The machine account that created the key, if any.
    pub machine_id: Option<i64>,
}

type KeyRow = (
    i64,
    String,
    String,
    String,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
);

fn view((id, name, prefix, last4, created_at, last_used_at): KeyRow) -> ApiKeyView {
    ApiKeyView {
        id,
        name,
        key: crypto::mask_key(&prefix, &last4),
        is_active: true,
        created_at: iso(created_at),
        last_used_at: iso_opt(last_used_at),
    }
}

/// Creates a key; the returned view carries the full secret, the only time it is shown.
pub async fn create(
    db: impl PgExecutor<'_>,
    user_id: i64,
    machine_id: Option<i64>,
    name: &str,
) -> AppResult<ApiKeyView> {
    let secret = crypto::new_api_key();
    let prefix: String = secret.chars().take(crypto::KEY_PREFIX.len() + 4).collect();
    let last4: String = secret.chars().skip(secret.chars().count() - 4).collect();
    let (id, created_at): (i64, DateTime<Utc>) = sqlx::query_as(
        "insert into api_keys (user_id, machine_id, name, key_hash, key_prefix, key_last4) values ($1, $2, $3, $4, $5, $6) returning id, created_at",
    )
    .bind(user_id)
    .bind(machine_id)
    .bind(name)
    .bind(crypto::sha256(&secret))
    .bind(&prefix)
    .bind(&last4)
    .fetch_one(db)
    .await?;
    Ok(ApiKeyView {
        id,
        name: name.to_string(),
        key: secret,
        is_active: true,
        created_at: iso(created_at),
        last_used_at: None,
    })
}

/// The account's keys, newest first, masked.
pub async fn list(db: impl PgExecutor<'_>, user_id: i64) -> AppResult<Vec<ApiKeyView>> {
    let rows: Vec<KeyRow> = sqlx::query_as(
        "select id, name, key_prefix, key_last4, created_at, last_used_at from api_keys where user_id = $1 order by created_at desc, id desc",
    )
    .bind(user_id)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(view).collect())
}

/// Deletes one of the account's keys; another account's key is 404.
pub async fn delete(db: impl PgExecutor<'_>, user_id: i64, key_id: i64) -> AppResult<()> {
    let done = sqlx::query("delete from api_keys where id = $1 and user_id = $2")
        .bind(key_id)
        .bind(user_id)
        .execute(db)
        .await?;
    if done.rows_affected() == 0 {
        return Err(AppError::not_found("API key"));
    }
    Ok(())
}

/// The owner of a presented key, if it exists.
pub async fn authenticate(db: impl PgExecutor<'_>, secret: &str) -> AppResult<Option<KeyOwner>> {
    if !secret.starts_with(crypto::KEY_PREFIX) || secret.len() > 200 {
        return Ok(None);
    }
    let row: Option<(i64, i64, Option<i64>)> =
        sqlx::query_as("select id, user_id, machine_id from api_keys where key_hash = $1")
            .bind(crypto::sha256(secret))
            .fetch_optional(db)
            .await?;
    Ok(row.map(|(key_id, user_id, machine_id)| KeyOwner {
        key_id,
        user_id,
        machine_id,
    }))
}
