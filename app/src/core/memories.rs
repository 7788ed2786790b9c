//! Memories: queued as tasks (one transaction with their queue job), listed, read, deleted.
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgExecutor, PgPool};
use uuid::Uuid;

use super::error::{AppError, AppResult};
use super::group::GroupCommit;
use super::projects;
use super::state::{AppState, CHECK_IDLE_AFTER, CONNECT_TIMEOUT};
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

/// Resolves the project, then has the writer store the `pending` task and its queue job; answers
/// once they are committed: an answered task id is never lost.
pub async fn enqueue(state: &AppState, user_id: i64, new: &NewMemory) -> AppResult<Uuid> {
    // Every account has its default project (it cannot be deleted): no lookup for it. Were it
    // missing, the write's foreign key would answer 404 as the lookup does.
    let project_id = if new.project == projects::DEFAULT {
        projects::DEFAULT.to_string()
    } else {
        projects::resolve(&state.pool, user_id, &new.project).await?
    };
    state.writer.submit(user_id, project_id, new.clone()).await
}

struct Pending {
    user_id: i64,
    project_id: String,
    new: NewMemory,
}

/// Group commit for new memories ([`super::group`]): concurrent requests are written together,
/// each batch as one transaction (tasks and their queue jobs), and every request is answered
/// after its batch commits.
pub struct EnqueueWriter {
    group: GroupCommit<Pending, AppResult<Uuid>>,
}

/// A batch this large means requests are queueing for their acknowledgement (a batch takes
/// 1-3 ms to write, so this is thousands of writes a second): the model yields to them (see
/// [`super::embed::Foreground`]). Ordinary traffic, even a thousand writes a second from 64
/// clients, seldom fills one and leaves ingestion at full speed.
const PRESSURE_BATCH: usize = 8;

/// Most memories written in one transaction.
const MAX_WRITE_BATCH: usize = 256;

impl EnqueueWriter {
    /// Starts the writer on a thread of its own, with a connection of its own.
    ///
    /// Every acknowledgement waits on the writer twice (to start its batch, and to answer once
    /// PostgreSQL has committed it), and on the server's runtime, while 64 clients post, each
    /// of those wake-ups waited behind whatever HTTP work the runtime's two threads had queued.
    /// On its own thread the kernel wakes the writer as soon as PostgreSQL answers: a batch
    /// took 1.2-1.7 ms instead of 1.6-2.3 ms and ack p95 of 1,000-memory rounds was 5.9-9.9 ms
    /// instead of 7.0-12.9 ms (`bench ingest`, three rounds each way, alternated). A pooled
    /// connection could not go with it: a socket answers on the runtime it was opened on.
    pub fn spawn(
        pool: PgPool,
        foreground: std::sync::Arc<super::embed::Foreground>,
    ) -> std::sync::Arc<Self> {
        let conn = std::sync::Arc::new(tokio::sync::Mutex::new(OwnConnection::new(&pool)));
        let (group, writer) = GroupCommit::new(MAX_WRITE_BATCH, move |batch: Vec<Pending>| {
            let (conn, foreground) = (conn.clone(), foreground.clone());
            async move {
                // Many requests queued while the last batch was written: the API is under
                // load, and ingestion's model yields to it for a while.
                if batch.len() >= PRESSURE_BATCH {
                    foreground.pressed();
                }
                let mut conn = conn.lock().await;
                let ids: Vec<Uuid> = batch.iter().map(|_| Uuid::new_v4()).collect();
                match conn.write(&batch, &ids).await {
                    Ok(()) => ids.into_iter().map(Ok).collect(),
                    // One bad row (a project deleted meanwhile) must not fail the others: write
                    // them one by one.
                    Err(_) if batch.len() > 1 => {
                        let mut results = Vec::with_capacity(batch.len());
                        for (p, id) in batch.iter().zip(ids) {
                            results
                                .push(conn.write(std::slice::from_ref(p), &[id]).await.map(|_| id));
                        }
                        results
                    }
                    Err(e) => vec![Err(e)],
                }
            }
        });
        std::thread::Builder::new()
            .name("memory-writer".into())
            .spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("building the memory writer's runtime")
                    .block_on(writer)
            })
            .expect("spawning the memory writer");
        std::sync::Arc::new(Self { group })
    }

    async fn submit(&self, user_id: i64, project_id: String, new: NewMemory) -> AppResult<Uuid> {
        self.group
            .submit(Pending {
                user_id,
                project_id,
                new,
            })
            .await
            .ok_or_else(|| anyhow::anyhow!("the memory writer stopped"))?
    }
}

/// The writer's own connection, opened on its thread and kept there. As the pool does with its
/// connections (see `server::pool_options`), one idle longer than [`CHECK_IDLE_AFTER`] is
/// checked before use, and one that failed is replaced at the next batch.
struct OwnConnection {
    options: sqlx::postgres::PgConnectOptions,
    /// The connection and when it was last used.
    conn: Option<(sqlx::PgConnection, std::time::Instant)>,
}

/// How the writer's connection shows in `pg_stat_activity`.
pub const WRITER_APPLICATION_NAME: &str = "engram memory writer";

impl OwnConnection {
    fn new(pool: &PgPool) -> Self {
        Self {
            options: (*pool.connect_options())
                .clone()
                .application_name(WRITER_APPLICATION_NAME),
            conn: None,
        }
    }

    async fn write(&mut self, batch: &[Pending], ids: &[Uuid]) -> AppResult<()> {
        use sqlx::Connection;
        if let Some((conn, used)) = &mut self.conn {
            if used.elapsed() > CHECK_IDLE_AFTER && conn.ping().await.is_err() {
                self.conn = None;
            }
        }
        let conn = match &mut self.conn {
            Some((conn, used)) => {
                *used = std::time::Instant::now();
                conn
            }
            None => {
                let conn = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    sqlx::PgConnection::connect_with(&self.options),
                )
                .await
                .map_err(|_| AppError::Unavailable)??;
                &mut self.conn.insert((conn, std::time::Instant::now())).0
            }
        };
        let written = write_batch(&mut *conn, batch, ids).await;
        if matches!(written, Err(AppError::Unavailable | AppError::Internal(_))) {
            // A lost connection, say: the next batch starts on a fresh one.
            self.conn = None;
        }
        written
    }
}

/// Writes a batch of new memories, their tasks and queue jobs, in one statement: one round trip
/// to PostgreSQL, which runs a single statement as its own transaction (BEGIN, two inserts and
/// COMMIT sent one by one cost four round trips, each a wake-up of the backend and of this task,
/// and were most of a write's latency). The jobs are the rows apalis's `push_tasks` writes (its
/// `sink.sql`, apalis-postgres 1.0): a ULID id, the JSON-encoded job, `Pending`, priority 0, no
/// metadata, run now; the worker tests fail if the two ever disagree.
async fn write_batch(db: impl PgExecutor<'_>, batch: &[Pending], ids: &[Uuid]) -> AppResult<()> {
    let users: Vec<i64> = batch.iter().map(|p| p.user_id).collect();
    let projects: Vec<&str> = batch.iter().map(|p| p.project_id.as_str()).collect();
    let contents: Vec<&str> = batch.iter().map(|p| p.new.content.as_str()).collect();
    let metadata: Vec<sqlx::types::Json<Value>> = batch
        .iter()
        .map(|p| {
            sqlx::types::Json(
                p.new
                    .metadata
                    .clone()
                    .unwrap_or_else(|| Value::Object(Default::default())),
            )
        })
        .collect();
    let agents: Vec<Option<String>> = batch.iter().map(|p| p.new.agent_id.clone()).collect();
    let job_ids: Vec<String> = ids
        .iter()
        .map(|_| ulid::Ulid::generate().to_string())
        .collect();
    let jobs = ids
        .iter()
        .map(|&task_id| serde_json::to_vec(&IngestJob { task_id }))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::from)?;
    // A data-modifying CTE always runs to completion, and the statement is atomic: both inserts
    // land or neither does.
    let written = sqlx::query(
        "with new_tasks as (
             insert into tasks (id, user_id, project_id, content, metadata, agent_id)
             select * from unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[], $5::jsonb[], $6::text[])
         )
         insert into apalis.jobs (id, job_type, job, status, attempts, max_attempts, run_at, priority, metadata, idempotency_key)
         select j.id, $7, j.job, 'Pending', 0, $8, now(), 0, ''::hstore, null
         from unnest($9::text[], $10::bytea[]) as j(id, job)",
    )
    .bind(ids)
    .bind(&users)
    .bind(&projects)
    .bind(&contents)
    .bind(&metadata)
    .bind(&agents)
    .bind(QUEUE)
    .bind(JOB_MAX_ATTEMPTS as i32)
    .bind(&job_ids)
    .bind(&jobs)
    .execute(db)
    .await;
    match written {
        Ok(_) => Ok(()),
        // The project went away between resolving and writing.
        Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23503") => {
            Err(AppError::not_found("Project"))
        }
        Err(e) => Err(e.into()),
    }
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
