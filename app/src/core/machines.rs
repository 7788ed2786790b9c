//! Machine accounts: agents register by fingerprint (stored hashed) and share one pool.
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use super::crypto;
use super::error::{AppError, AppResult};
use super::keys::{self, KeyOwner};
use super::projects;
use super::time::iso;
use super::usage::UsageCounter;
use super::validate::Fields;

pub const PLATFORMS: [&str; 3] = ["macos", "linux", "windows"];

/// The answer of auto-register.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MachineAccount {
    pub user_id: String,
    pub api_key: String,
    pub project_id: String,
    pub is_machine_account: bool,
    pub machine_fingerprint: String,
    pub created_at: String,
}

/// The contract's fingerprint rule: 16 to 256 characters of `[A-Za-z0-9._:-]`.
pub fn read_fingerprint(fields: &mut Fields) -> String {
    let fp = fields.required_str("machine_fingerprint", 16, 256);
    if !fp.is_empty()
        && !fp
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".:_-".contains(c))
    {
        fields.error(
            "machine_fingerprint",
            "string_pattern_mismatch",
            "String should match pattern '^[A-Za-z0-9._:-]{16,256}$'",
            Some(serde_json::json!({"pattern": "^[A-Za-z0-9._:-]{16,256}$"})),
        );
    }
    fp
}

/// The machine row for a fingerprint: (id, claimed_by, created_at, hostname, platform).
pub async fn find(
    db: impl sqlx::PgExecutor<'_>,
    fingerprint: &str,
) -> AppResult<
    Option<(
        i64,
        Option<i64>,
        DateTime<Utc>,
        Option<String>,
        Option<String>,
    )>,
> {
    Ok(sqlx::query_as("select id, claimed_by, created_at, hostname, platform from users where fingerprint_hash = $1")
        .bind(crypto::sha256(fingerprint))
        .fetch_optional(db)
        .await?)
}

/// Creates the machine account on first sight, and a new key on every call.
pub async fn auto_register(
    pool: &PgPool,
    fingerprint: &str,
    platform: Option<&str>,
    hostname: Option<&str>,
) -> AppResult<MachineAccount> {
    let mut tx = pool.begin().await?;
    let inserted: Option<i64> = sqlx::query_scalar(
        "insert into users (is_machine, fingerprint_hash, platform, hostname) values (true, $1, $2, $3)
         on conflict (fingerprint_hash) do nothing returning id",
    )
    .bind(crypto::sha256(fingerprint))
    .bind(platform)
    .bind(hostname)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(id) = inserted {
        projects::create_default(&mut *tx, id).await?;
    }
    let (id, claimed_by, created_at, _, _) = find(&mut *tx, fingerprint)
        .await?
        .ok_or_else(|| anyhow::anyhow!("machine row vanished"))?;
    if claimed_by.is_some() {
        return Err(AppError::Conflict(
            "This machine has been claimed into a user account: use an API key of that account (create one in the portal)".into(),
        ));
    }
    if inserted.is_none() {
        sqlx::query("update users set platform = coalesce($2, platform), hostname = coalesce($3, hostname) where id = $1")
            .bind(id)
            .bind(platform)
            .bind(hostname)
            .execute(&mut *tx)
            .await?;
    }
    let key = keys::create(
        &mut *tx,
        id,
        Some(id),
        &format!("agent {}", hostname.unwrap_or("machine")),
    )
    .await?;
    tx.commit().await?;
    Ok(MachineAccount {
        user_id: id.to_string(),
        api_key: key.key,
        project_id: projects::DEFAULT.into(),
        is_machine_account: true,
        machine_fingerprint: fingerprint.to_string(),
        created_at: iso(created_at),
    })
}

/// Machine stats.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct MachineStats {
    pub total_memories: i64,
    pub total_projects: i64,
    pub api_calls_24h: i64,
    pub storage_used: String,
    pub storage_bytes: i64,
    pub created_at: String,
}

/// Real figures for the machine of `fingerprint`, asked with a key of that machine (or, after a
/// claim, of the account it merged into); any other fingerprint is 404.
pub async fn stats(
    pool: &PgPool,
    usage: &UsageCounter,
    owner: KeyOwner,
    fingerprint: &str,
) -> AppResult<MachineStats> {
    let (machine_id, claimed_by, created_at, _, _) = find(pool, fingerprint)
        .await?
        .ok_or_else(|| AppError::not_found("Machine"))?;
    let account = claimed_by.unwrap_or(machine_id);
    if owner.user_id != account {
        return Err(AppError::not_found("Machine"));
    }
    let (total_memories, storage_bytes): (i64, i64) =
        sqlx::query_as("select count(*), coalesce(sum(pg_column_size(m.*)), 0)::bigint from memories m where user_id = $1").bind(account).fetch_one(pool).await?;
    let total_projects: i64 =
        sqlx::query_scalar("select count(*) from projects where user_id = $1")
            .bind(account)
            .fetch_one(pool)
            .await?;
    let key_ids: Vec<i64> = sqlx::query_scalar("select id from api_keys where machine_id = $1")
        .bind(machine_id)
        .fetch_all(pool)
        .await?;
    let flushed: i64 = sqlx::query_scalar("select coalesce(sum(calls), 0)::bigint from api_key_usage where key_id = any($1) and hour > now() - interval '24 hours'")
        .bind(&key_ids)
        .fetch_one(pool)
        .await?;
    Ok(MachineStats {
        total_memories,
        total_projects,
        api_calls_24h: flushed + usage.unflushed(&key_ids),
        storage_used: human_size(storage_bytes),
        storage_bytes,
        created_at: iso(created_at),
    })
}

/// `1.4 MB`, in powers of 1024 as file managers show them.
pub fn human_size(bytes: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut value = bytes.max(0) as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Machines claimed into an account.
pub async fn claimed_into(
    pool: &PgPool,
    user_id: i64,
) -> AppResult<Vec<crate::types::MachineView>> {
    type Row = (
        i64,
        Option<String>,
        Option<String>,
        DateTime<Utc>,
        Option<DateTime<Utc>>,
    );
    let rows: Vec<Row> =
        sqlx::query_as("select id, hostname, platform, created_at, claimed_at from users where claimed_by = $1 order by claimed_at desc")
            .bind(user_id)
            .fetch_all(pool)
            .await?;
    Ok(rows
        .into_iter()
        .map(
            |(id, hostname, platform, created_at, claimed_at)| crate::types::MachineView {
                user_id: id.to_string(),
                hostname,
                platform,
                created_at: iso(created_at),
                claimed_at: claimed_at.map(iso),
            },
        )
        .collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_read_like_a_file_manager() {
        assert_eq!(super::human_size(512), "512 B");
        assert_eq!(super::human_size(1_468_006), "1.4 MB");
    }
}
