//! Memory tasks as clients poll them.
use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

use super::error::{AppError, AppResult};
use super::time::{iso, iso_opt};
use crate::types::TaskView;

type Row = (
    Uuid,
    String,
    Option<Uuid>,
    Option<String>,
    Option<f32>,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<String>,
);

pub async fn get(db: impl PgExecutor<'_>, user_id: i64, id: &str) -> AppResult<TaskView> {
    let id = Uuid::parse_str(id).map_err(|_| AppError::not_found("Task"))?;
    let row: Option<Row> = sqlx::query_as(
        "select id, status, memory_id, cognitive_sector, importance_score, created_at, completed_at, error from tasks where id = $1 and user_id = $2",
    )
    .bind(id)
    .bind(user_id)
    .fetch_optional(db)
    .await?;
    let (
        id,
        status,
        memory_id,
        cognitive_sector,
        importance_score,
        created_at,
        completed_at,
        error,
    ) = row.ok_or_else(|| AppError::not_found("Task"))?;
    Ok(TaskView {
        task_id: id.to_string(),
        status,
        memory_id: memory_id.map(|m| m.to_string()),
        cognitive_sector,
        importance_score,
        created_at: iso(created_at),
        completed_at: iso_opt(completed_at),
        error,
    })
}
