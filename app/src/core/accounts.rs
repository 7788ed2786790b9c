//! Human accounts: registration, login, the user record.
use serde::Serialize;
use sqlx::{PgExecutor, PgPool};

use super::crypto;
use super::error::{is_unique_violation, AppError, AppResult};
use super::projects;
use super::time::iso;
use super::validate::{email_problem, Fields};

/// The user record of `/api/auth/me`.
#[derive(Debug, Serialize, Clone, utoipa::ToSchema)]
pub struct UserRecord {
    pub id: i64,
    pub email: Option<String>,
    pub created_at: String,
}

/// Reads and checks the e-mail and password fields (the contract's rules).
pub fn read_credentials(fields: &mut Fields, email_field: &str) -> (String, String) {
    let email = fields.required_str(email_field, 1, 254).to_lowercase();
    if !email.is_empty() {
        if let Some(problem) = email_problem(&email) {
            fields.error(email_field, "value_error", problem, None);
        }
    }
    let password = fields.required_raw_str("password", 8, 256);
    (email, password)
}

/// Creates a human account with its `default` project. 409 when the e-mail is taken.
pub async fn register(pool: &PgPool, email: &str, password: &str) -> AppResult<UserRecord> {
    let password = password.to_string();
    let hash = tokio::task::spawn_blocking(move || crypto::hash_password(&password))
        .await
        .map_err(anyhow::Error::from)??;
    let mut tx = pool.begin().await?;
    let row: (i64, chrono::DateTime<chrono::Utc>) = match sqlx::query_as(
        "insert into users (email, password_hash) values ($1, $2) returning id, created_at",
    )
    .bind(email)
    .bind(&hash)
    .fetch_one(&mut *tx)
    .await
    {
        Ok(row) => row,
        Err(e) if is_unique_violation(&e, "users_email_key") => {
            return Err(AppError::Conflict("Email already registered".into()))
        }
        Err(e) => return Err(e.into()),
    };
    projects::create_default(&mut *tx, row.0).await?;
    tx.commit().await?;
    Ok(UserRecord {
        id: row.0,
        email: Some(email.to_string()),
        created_at: iso(row.1),
    })
}

/// The user id for a correct e-mail and password; 401 otherwise (same answer and about the same
/// time whether the e-mail is unknown or the password wrong).
pub async fn authenticate(pool: &PgPool, email: &str, password: &str) -> AppResult<i64> {
    let row: Option<(i64, Option<String>)> =
        sqlx::query_as("select id, password_hash from users where email = $1 and not is_machine")
            .bind(email.to_lowercase())
            .fetch_optional(pool)
            .await?;
    let (id, hash) = match row {
        Some((id, Some(hash))) => (Some(id), hash),
        _ => (None, crypto::dummy_password_hash().to_string()),
    };
    let password = password.to_string();
    let ok = tokio::task::spawn_blocking(move || crypto::verify_password(&password, &hash))
        .await
        .map_err(anyhow::Error::from)?;
    match (id, ok) {
        (Some(id), true) => Ok(id),
        _ => Err(AppError::Unauthorized("Incorrect email or password".into())),
    }
}

/// The user record, if the user exists.
pub async fn find(db: impl PgExecutor<'_>, user_id: i64) -> AppResult<Option<UserRecord>> {
    let row: Option<(i64, Option<String>, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "select id, email, created_at from users where id = $1 and claimed_by is null",
    )
    .bind(user_id)
    .fetch_optional(db)
    .await?;
    Ok(row.map(|(id, email, created_at)| UserRecord {
        id,
        email,
        created_at: iso(created_at),
    }))
}
