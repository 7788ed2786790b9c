//! Memory tasks as clients poll them: one memory's task, or a batch's.
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::error::{AppError, AppResult};
use super::time::{iso, iso_opt};
use crate::types::{BatchCounts, TaskView};

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

/// The task `id` of the account: a memory's task, else a batch's ([`batch`]).
pub async fn get(pool: &PgPool, user_id: i64, id: &str) -> AppResult<TaskView> {
    let id = Uuid::parse_str(id).map_err(|_| AppError::not_found("Task"))?;
    let row: Option<Row> = sqlx::query_as(
        "select id, status, memory_id, cognitive_sector, importance_score, created_at, completed_at, error from tasks where id = $1 and user_id = $2",
    )
    .bind(id)
    .bind(user_id)
    .fetch_optional(pool)
    .await?;
    let Some((
        id,
        status,
        memory_id,
        cognitive_sector,
        importance_score,
        created_at,
        completed_at,
        error,
    )) = row
    else {
        return batch(pool, user_id, id).await;
    };
    Ok(TaskView {
        task_id: id.to_string(),
        status,
        memory_id: memory_id.map(|m| m.to_string()),
        cognitive_sector,
        importance_score,
        created_at: iso(created_at),
        completed_at: iso_opt(completed_at),
        error,
        batch: None,
    })
}

/// A batch's task, read from its memories' tasks: `pending` until one starts, `processing`
/// while any is pending or processing, then `completed` when every memory is stored, or
/// `failed` (with the count in `error`) when any failed. `completed_at` is the last one's.
/// Memories whose project was deleted meanwhile count as failed.
async fn batch(pool: &PgPool, user_id: i64, id: Uuid) -> AppResult<TaskView> {
    type BatchRow = (
        i32,
        DateTime<Utc>,
        i64,
        i64,
        i64,
        i64,
        Option<DateTime<Utc>>,
        Vec<Uuid>,
    );
    let row: Option<BatchRow> = sqlx::query_as(
        "select b.total, b.created_at,
                count(t.id) filter (where t.status = 'pending'),
                count(t.id) filter (where t.status = 'processing'),
                count(t.id) filter (where t.status = 'completed'),
                count(t.id) filter (where t.status = 'failed'),
                max(t.completed_at),
                coalesce(array_agg(t.memory_id order by t.seq) filter (where t.memory_id is not null), '{}')
         from task_batches b left join tasks t on t.batch_id = b.id and t.user_id = b.user_id
         where b.id = $1 and b.user_id = $2
         group by b.id",
    )
    .bind(id)
    .bind(user_id)
    .fetch_optional(pool)
    .await?;
    let (total, created_at, pending, processing, completed, failed, last, memory_ids) =
        row.ok_or_else(|| AppError::not_found("Task"))?;
    let total = i64::from(total);
    // Tasks gone with a deleted project never finish: count them failed.
    let failed = failed + (total - pending - processing - completed - failed).max(0);
    let status = if pending + processing > 0 {
        if pending == total {
            "pending"
        } else {
            "processing"
        }
    } else if failed > 0 {
        "failed"
    } else {
        "completed"
    };
    let done = pending + processing == 0;
    Ok(TaskView {
        task_id: id.to_string(),
        status: status.into(),
        memory_id: None,
        cognitive_sector: None,
        importance_score: None,
        created_at: iso(created_at),
        completed_at: if done { iso_opt(last) } else { None },
        error: (done && failed > 0)
            .then(|| format!("{failed} of {total} memories of the batch could not be stored")),
        batch: Some(BatchCounts {
            total,
            pending,
            processing,
            completed,
            failed,
            memory_ids: memory_ids.iter().map(Uuid::to_string).collect(),
        }),
    })
}
