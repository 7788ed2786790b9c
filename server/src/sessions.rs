//! A tower-sessions store on PostgreSQL (the `sessions` table): the published sqlx store is built
//! on sqlx 0.8 and does not compile with tower-sessions 0.15, so ours is small and local.
use async_trait::async_trait;
use sqlx::PgPool;
use tower_sessions::session::{Id, Record};
use tower_sessions::session_store::{self, SessionStore};

#[derive(Clone, Debug)]
pub struct PgSessionStore {
    pool: PgPool,
}

impl PgSessionStore {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

fn backend<E: std::fmt::Display>(e: E) -> session_store::Error {
    session_store::Error::Backend(e.to_string())
}

fn expiry(record: &Record) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(record.expiry_date.unix_timestamp(), 0)
        .unwrap_or_else(chrono::Utc::now)
}

#[async_trait]
impl SessionStore for PgSessionStore {
    async fn create(&self, record: &mut Record) -> session_store::Result<()> {
        loop {
            let data = serde_json::to_vec(&*record).map_err(backend)?;
            let inserted = sqlx::query("insert into sessions (id, data, expiry_date) values ($1, $2, $3) on conflict (id) do nothing")
                .bind(record.id.to_string())
                .bind(data)
                .bind(expiry(record))
                .execute(&self.pool)
                .await
                .map_err(backend)?;
            if inserted.rows_affected() == 1 {
                return Ok(());
            }
            record.id = Id::default();
        }
    }

    async fn save(&self, record: &Record) -> session_store::Result<()> {
        let data = serde_json::to_vec(record).map_err(backend)?;
        sqlx::query("insert into sessions (id, data, expiry_date) values ($1, $2, $3) on conflict (id) do update set data = excluded.data, expiry_date = excluded.expiry_date")
            .bind(record.id.to_string())
            .bind(data)
            .bind(expiry(record))
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(())
    }

    async fn load(&self, id: &Id) -> session_store::Result<Option<Record>> {
        let data: Option<Vec<u8>> =
            sqlx::query_scalar("select data from sessions where id = $1 and expiry_date > now()")
                .bind(id.to_string())
                .fetch_optional(&self.pool)
                .await
                .map_err(backend)?;
        data.map(|d| serde_json::from_slice(&d).map_err(backend))
            .transpose()
    }

    async fn delete(&self, id: &Id) -> session_store::Result<()> {
        sqlx::query("delete from sessions where id = $1")
            .bind(id.to_string())
            .execute(&self.pool)
            .await
            .map_err(backend)?;
        Ok(())
    }
}

/// Removes expired sessions (run periodically by the server).
pub async fn delete_expired(pool: &PgPool) -> Result<u64, sqlx::Error> {
    Ok(
        sqlx::query("delete from sessions where expiry_date < now()")
            .execute(pool)
            .await?
            .rows_affected(),
    )
}
