//! Memories: queued as tasks (one transaction with their queue job), listed, read, deleted.
use apalis::prelude::TaskBuilder;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

use super::error::{AppError, AppResult};
use super::projects;
use super::time::iso;
use super::validate::Fields;
use crate::types::MemoryView;

/// The apalis queue of memory ingestion jobs.
pub const QUEUE: &str = "engram-ingest";
/// Deliveries of one job before apalis gives up on it (crashes, not handler errors: the handler
/// retries transient errors itself and records the final failure on the task).
pub const JOB_MAX_ATTEMPTS: usize = 5;

/// The queue job: ids only, the content waits in the task row.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IngestJob {
    pub task_id: Uuid,
}

/// A validated memory to store.
#[derive(Debug, Clone)]
pub struct NewMemory {
    pub content: String,
    pub project: String,
    /// `None` when absent (stored as `{}`), `Some(Null)` when sent as null.
    pub metadata: Option<Value>,
    pub agent_id: Option<String>,
}

/// Reads and checks a memory body (the contract's limits).
pub fn read_new(fields: &mut Fields) -> NewMemory {
    let content = fields.required_str("content", 1, 32_768);
    let project = fields
        .optional_str("project_id", 256)
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| projects::DEFAULT.into());
    let metadata = fields.metadata("metadata", 16 * 1024);
    let agent_id = fields.optional_str("agent_id", 128);
    NewMemory {
        content,
        project,
        metadata,
        agent_id,
    }
}

/// Resolves the project, then writes the `pending` task and its queue job in one transaction:
/// an answered task id is never lost.
pub async fn enqueue(pool: &PgPool, user_id: i64, new: &NewMemory) -> AppResult<Uuid> {
    let mut tx = pool.begin().await?;
    let project_id = projects::resolve(&mut *tx, user_id, &new.project).await?;
    let task_id = Uuid::new_v4();
    let metadata = new
        .metadata
        .clone()
        .unwrap_or_else(|| Value::Object(Default::default()));
    sqlx::query("insert into tasks (id, user_id, project_id, content, metadata, agent_id) values ($1, $2, $3, $4, $5, $6)")
        .bind(task_id)
        .bind(user_id)
        .bind(&project_id)
        .bind(&new.content)
        .bind(sqlx::types::Json(&metadata))
        .bind(&new.agent_id)
        .execute(&mut *tx)
        .await?;
    let job =
        TaskBuilder::new(serde_json::to_vec(&IngestJob { task_id }).map_err(anyhow::Error::from)?)
            .max_attempts(JOB_MAX_ATTEMPTS)
            .build();
    apalis_postgres::queries::push_tasks(&mut *tx, QUEUE, vec![job])
        .await
        .map_err(|e| anyhow::anyhow!("queueing the memory: {e}"))?;
    tx.commit().await?;
    Ok(task_id)
}

type Row = (
    Uuid,
    String,
    String,
    Option<sqlx::types::Json<Value>>,
    Option<String>,
    String,
    f32,
    DateTime<Utc>,
    DateTime<Utc>,
);

pub(crate) const COLUMNS: &str = "id, content, project_id, metadata, agent_id, cognitive_sector, importance_score, created_at, updated_at";

fn view(
    (
        id,
        content,
        project_id,
        metadata,
        agent_id,
        cognitive_sector,
        importance_score,
        created_at,
        updated_at,
    ): Row,
) -> MemoryView {
    MemoryView {
        id: id.to_string(),
        content,
        project_id,
        metadata: metadata.map(|j| j.0).unwrap_or(Value::Null),
        agent_id,
        cognitive_sector,
        importance_score,
        created_at: iso(created_at),
        updated_at: iso(updated_at),
    }
}

/// A page of the account's memories, newest first, and how many match in all.
pub async fn list(
    pool: &PgPool,
    user_id: i64,
    project: Option<&str>,
    limit: i64,
    offset: i64,
) -> AppResult<(Vec<MemoryView>, i64)> {
    let project_id = match project {
        Some(p) => Some(projects::resolve(pool, user_id, p).await?),
        None => None,
    };
    let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "select {COLUMNS} from memories where user_id = $1 and ($2::text is null or project_id = $2)
         order by created_at desc, id desc limit $3 offset $4"
    )))
    .bind(user_id)
    .bind(&project_id)
    .bind(limit)
    .bind(offset)
    .fetch_all(pool)
    .await?;
    let total: i64 = sqlx::query_scalar("select count(*) from memories where user_id = $1 and ($2::text is null or project_id = $2)")
        .bind(user_id)
        .bind(&project_id)
        .fetch_one(pool)
        .await?;
    Ok((rows.into_iter().map(view).collect(), total))
}

fn parse_id(id: &str) -> AppResult<Uuid> {
    // A malformed id cannot name an existing memory: answer as for any unknown id.
    Uuid::parse_str(id).map_err(|_| AppError::not_found("Memory"))
}

pub async fn get(db: impl PgExecutor<'_>, user_id: i64, id: &str) -> AppResult<MemoryView> {
    let id = parse_id(id)?;
    let row: Option<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "select {COLUMNS} from memories where id = $1 and user_id = $2"
    )))
    .bind(id)
    .bind(user_id)
    .fetch_optional(db)
    .await?;
    row.map(view).ok_or_else(|| AppError::not_found("Memory"))
}

pub async fn delete(db: impl PgExecutor<'_>, user_id: i64, id: &str) -> AppResult<()> {
    let id = parse_id(id)?;
    let done = sqlx::query("delete from memories where id = $1 and user_id = $2")
        .bind(id)
        .bind(user_id)
        .execute(db)
        .await?;
    if done.rows_affected() == 0 {
        return Err(AppError::not_found("Memory"));
    }
    Ok(())
}
