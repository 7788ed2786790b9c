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
use super::validate::{Fields, FromFields};
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

/// A memory to store: the body of `POST /api/v1/memories`, checked by its [`FromFields`] rules.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[schema(as = CreateMemoryRequest, example = json!({
    "content": "Ana prefers window seats on long flights",
    "project_id": "default",
    "metadata": {"source": "chat"},
    "agent_id": "travel-agent"
}))]
pub struct NewMemory {
    /// The text, 1 to 32,768 characters after trimming.
    #[schema(min_length = 1, max_length = 32768)]
    pub content: String,
    /// A project's id or name; `default` when omitted or null.
    #[serde(rename = "project_id", default = "default_project")]
    #[schema(max_length = 256, default = "default", value_type = Option<String>)]
    pub project: String,
    /// A JSON object of at most 16 KiB serialised, or null. `None` when absent (stored as `{}`),
    /// `Some(Null)` when sent as null.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    #[schema(max_length = 128)]
    pub agent_id: Option<String>,
}

fn default_project() -> String {
    projects::DEFAULT.into()
}

impl FromFields for NewMemory {
    fn from_fields(fields: &mut Fields) -> Self {
        let content = fields.required_str("content", 1, 32_768);
        let project = fields
            .optional_str("project_id", 256)
            .filter(|p| !p.is_empty())
            .unwrap_or_else(default_project);
        let metadata = fields.metadata("metadata", 16 * 1024);
        let agent_id = fields.optional_str("agent_id", 128);
        NewMemory {
            content,
            project,
            metadata,
            agent_id,
        }
    }
}

/// Resolves the project, then has the writer store the `pending` task and its queue job; answers
/// once they are committed: an answered task id is never lost.
pub async fn enqueue(state: &AppState, user_id: i64, new: &NewMemory) -> AppResult<Uuid> {
    let project_id = resolve_project(state, user_id, &new.project).await?;
    charged(state, user_id, 1, async {
        state
            .writer
            .submit(Pending {
                user_id,
                project_id,
                memories: vec![new.clone()],
                batch: false,
            })
            .await
    })
    .await
}

/// Runs `write` (which queues `n` memories) if the plan's memories quota allows `n` more (402
/// otherwise, nothing written); a failed write gives its count back.
pub async fn charged<T>(
    state: &AppState,
    user_id: i64,
    n: usize,
    write: impl std::future::Future<Output = AppResult<T>>,
) -> AppResult<T> {
    use super::plans::Quota;
    let n = n as i64;
    let charge = if n > 0 {
        Some(
            state
                .quotas
                .charge(&state.pool, &state.stats, user_id, Quota::Memories, n)
                .await?,
        )
    } else {
        None
    };
    let result = write.await;
    // Written: it counts; failed: the charge is dropped, so given back.
    if let (Ok(_), Some(charge)) = (&result, charge) {
        charge.done();
    }
    result
}

/// Most memories in one batch (MemoryX's clients send up to 200).
pub const MAX_BATCH: usize = 200;

/// Queues several memories of one project as one batch: a task per memory, all written in one
/// statement with the batch's own row, whose id is answered. The batch's task completes when
/// all its memories are stored ([`super::tasks::get`]).
pub async fn enqueue_batch(
    state: &AppState,
    user_id: i64,
    project: &str,
    memories: Vec<NewMemory>,
) -> AppResult<Uuid> {
    let project_id = resolve_project(state, user_id, project).await?;
    let n = memories.len();
    charged(state, user_id, n, async {
        state
            .writer
            .submit(Pending {
                user_id,
                project_id,
                memories,
                batch: true,
            })
            .await
    })
    .await
}

/// Queues memories of one project inside the caller's transaction, written with rows of its
/// own (a conversation's messages): their task ids in order, and the batch's id when `batch`.
pub async fn enqueue_in(
    db: &mut sqlx::PgConnection,
    user_id: i64,
    project_id: &str,
    memories: Vec<NewMemory>,
    batch: bool,
) -> AppResult<(Vec<Uuid>, Option<Uuid>)> {
    let pending = Pending {
        user_id,
        project_id: project_id.to_string(),
        memories,
        batch,
    };
    let ids = Ids::new(&pending);
    write_batch(
        db,
        std::slice::from_ref(&pending),
        std::slice::from_ref(&ids),
    )
    .await?;
    Ok((ids.tasks, ids.batch))
}

pub(crate) async fn resolve_project(
    state: &AppState,
    user_id: i64,
    project: &str,
) -> AppResult<String> {
    // Every account has its default project (it cannot be deleted): no lookup for it. Were it
    // missing, the write's foreign key would answer 404 as the lookup does.
    if project == projects::DEFAULT {
        Ok(projects::DEFAULT.to_string())
    } else {
        projects::resolve(&state.pool, user_id, project).await
    }
}

/// One request's memories: one, or a batch (then answered with the batch's id).
struct Pending {
    user_id: i64,
    project_id: String,
    memories: Vec<NewMemory>,
    batch: bool,
}

/// The ids a request's rows get: one task id per memory, and the batch's id.
struct Ids {
    tasks: Vec<Uuid>,
    batch: Option<Uuid>,
}

impl Ids {
    fn new(p: &Pending) -> Self {
        Self {
            tasks: p.memories.iter().map(|_| Uuid::new_v4()).collect(),
            batch: p.batch.then(Uuid::new_v4),
        }
    }
    /// What the request is answered: the batch's id, or its one task's.
    fn answer(&self) -> Uuid {
        self.batch.unwrap_or(self.tasks[0])
    }
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
                let ids: Vec<Ids> = batch.iter().map(Ids::new).collect();
                match conn.write(&batch, &ids).await {
                    Ok(()) => ids.iter().map(|i| Ok(i.answer())).collect(),
                    // One bad request (a project deleted meanwhile) must not fail the others:
                    // write them one by one.
                    Err(_) if batch.len() > 1 => {
                        let mut results = Vec::with_capacity(batch.len());
                        for (p, id) in batch.iter().zip(ids) {
                            let written =
                                conn.write(std::slice::from_ref(p), std::slice::from_ref(&id));
                            results.push(written.await.map(|_| id.answer()));
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

    async fn submit(&self, pending: Pending) -> AppResult<Uuid> {
        self.group
            .submit(pending)
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

    async fn write(&mut self, batch: &[Pending], ids: &[Ids]) -> AppResult<()> {
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
async fn write_batch(db: impl PgExecutor<'_>, batch: &[Pending], ids: &[Ids]) -> AppResult<()> {
    let rows = || {
        batch.iter().zip(ids).flat_map(|(p, i)| {
            p.memories
                .iter()
                .zip(&i.tasks)
                .map(move |(m, t)| (p, i, m, *t))
        })
    };
    let task_ids: Vec<Uuid> = rows().map(|(_, _, _, t)| t).collect();
    let users: Vec<i64> = rows().map(|(p, ..)| p.user_id).collect();
    let projects: Vec<&str> = rows().map(|(p, ..)| p.project_id.as_str()).collect();
    let contents: Vec<&str> = rows().map(|(_, _, m, _)| m.content.as_str()).collect();
    let metadata: Vec<sqlx::types::Json<Value>> = rows()
        .map(|(_, _, m, _)| {
            sqlx::types::Json(
                m.metadata
                    .clone()
                    .unwrap_or_else(|| Value::Object(Default::default())),
            )
        })
        .collect();
    let agents: Vec<Option<&str>> = rows().map(|(_, _, m, _)| m.agent_id.as_deref()).collect();
    let batch_of: Vec<Option<Uuid>> = rows().map(|(_, i, _, _)| i.batch).collect();
    let batches: Vec<(Uuid, i64, i32)> = batch
        .iter()
        .zip(ids)
        .filter_map(|(p, i)| Some((i.batch?, p.user_id, p.memories.len() as i32)))
        .collect();
    let batch_ids: Vec<Uuid> = batches.iter().map(|b| b.0).collect();
    let batch_users: Vec<i64> = batches.iter().map(|b| b.1).collect();
    let batch_totals: Vec<i32> = batches.iter().map(|b| b.2).collect();
    let job_ids: Vec<String> = task_ids
        .iter()
        .map(|_| ulid::Ulid::generate().to_string())
        .collect();
    let jobs = task_ids
        .iter()
        .map(|&task_id| serde_json::to_vec(&IngestJob { task_id }))
        .collect::<Result<Vec<_>, _>>()
        .map_err(anyhow::Error::from)?;
    // A data-modifying CTE always runs to completion, and the statement is atomic: both inserts
    // land or neither does.
    let written = sqlx::query(
        "with new_batches as (
             insert into task_batches (id, user_id, total)
             select * from unnest($11::uuid[], $12::bigint[], $13::int[])
         ), new_tasks as (
             insert into tasks (id, user_id, project_id, content, metadata, agent_id, batch_id)
             select * from unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[], $5::jsonb[], $6::text[], $14::uuid[])
         )
         insert into apalis.jobs (id, job_type, job, status, attempts, max_attempts, run_at, priority, metadata, idempotency_key)
         select j.id, $7, j.job, 'Pending', 0, $8, now(), 0, ''::hstore, null
         from unnest($9::text[], $10::bytea[]) as j(id, job)",
    )
    .bind(&task_ids)
    .bind(&users)
    .bind(&projects)
    .bind(&contents)
    .bind(&metadata)
    .bind(&agents)
    .bind(QUEUE)
    .bind(JOB_MAX_ATTEMPTS as i32)
    .bind(&job_ids)
    .bind(&jobs)
    .bind(&batch_ids)
    .bind(&batch_users)
    .bind(&batch_totals)
    .bind(&batch_of)
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
        category: cognitive_sector.clone(),
        cognitive_sector,
        importance_score,
        created_at: iso(created_at),
        updated_at: iso(updated_at),
    }
}

/// Narrower lists (MemoryX's list filters): sectors, a time range, tags in `metadata.tags`.
#[derive(Debug, Default, Clone)]
pub struct ListFilter {
    /// Any of these sectors; all when empty.
    pub sectors: Vec<String>,
    /// Created at or after.
    pub from: Option<DateTime<Utc>>,
    /// Created at or before.
    pub to: Option<DateTime<Utc>>,
    /// `metadata.tags` (an array of strings) holds any of these; all when empty.
    pub tags: Vec<String>,
}

/// A page of the account's memories, newest first, and how many match in all.
pub async fn list(
    pool: &PgPool,
    user_id: i64,
    project: Option<&str>,
    limit: i64,
    offset: i64,
) -> AppResult<(Vec<MemoryView>, i64)> {
    list_filtered(
        pool,
        user_id,
        project,
        &ListFilter::default(),
        limit,
        offset,
    )
    .await
}

/// [`list`] with a [`ListFilter`].
pub async fn list_filtered(
    pool: &PgPool,
    user_id: i64,
    project: Option<&str>,
    filter: &ListFilter,
    limit: i64,
    offset: i64,
) -> AppResult<(Vec<MemoryView>, i64)> {
    let project_id = match project {
        Some(p) => Some(projects::resolve(pool, user_id, p).await?),
        None => None,
    };
    const WHERE: &str = "where user_id = $1 and ($2::text is null or project_id = $2)
        and (cardinality($3::text[]) = 0 or cognitive_sector = any($3))
        and ($4::timestamptz is null or created_at >= $4)
        and ($5::timestamptz is null or created_at <= $5)
        and (cardinality($6::text[]) = 0 or (jsonb_typeof(metadata -> 'tags') = 'array' and metadata -> 'tags' ?| $6))";
    let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "select {COLUMNS} from memories {WHERE} order by created_at desc, id desc limit $7 offset $8"
    )))
    .bind(user_id)
    .bind(&project_id)
    .bind(&filter.sectors)
    .bind(filter.from)
    .bind(filter.to)
    .bind(&filter.tags)
    .bind(limit)
    .bind(offset)
    .fetch_all(pool)
    .await?;
    let total: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "select count(*) from memories {WHERE}"
    )))
    .bind(user_id)
    .bind(&project_id)
    .bind(&filter.sectors)
    .bind(filter.from)
    .bind(filter.to)
    .bind(&filter.tags)
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

/// `memories` is analyzed again once this many rows changed since its last ANALYZE…
pub const ANALYZE_AFTER_ROWS: i64 = 1_000;
/// …plus this share of its rows.
pub const ANALYZE_AFTER_SHARE: f64 = 0.005;

/// Runs ANALYZE on `memories` when enough of it changed since the last one (by anyone, autovacuum
/// included); whether it ran. The housekeeping loop calls it every 30 seconds.
///
/// Search's plans depend on the account's row estimate. Autovacuum analyzes a table only after
/// 10 % of it changed, and not at all where it is off: with 100,000 memories of one account
/// stored, a second account's first 2,760 left the statistics saying it held none, and each of
/// its searches read its stream windows through the `(user_id, event_day)` index instead of the
/// stream index (EXPLAIN ANALYZE: 50 and 111 ms for the two statements, 4.8 and 2.9 ms once
/// analyzed). ANALYZE samples at most 30,000 rows (~0.6 s at 100,000 memories here). One server
/// at a time runs it (a transaction-level advisory lock; the others skip).
pub async fn analyze_if_changed(pool: &PgPool) -> AppResult<bool> {
    let changed: Option<bool> = sqlx::query_scalar(
        "select n_mod_since_analyze > $1 + $2 * n_live_tup
         from pg_stat_user_tables where relid = 'memories'::regclass",
    )
    .bind(ANALYZE_AFTER_ROWS)
    .bind(ANALYZE_AFTER_SHARE)
    .fetch_optional(pool)
    .await?;
    if changed != Some(true) {
        return Ok(false);
    }
    let mut tx = pool.begin().await?;
    let ours: bool = sqlx::query_scalar(
        "select pg_try_advisory_xact_lock(hashtext('engram: analyze memories'))",
    )
    .fetch_one(&mut *tx)
    .await?;
    if ours {
        sqlx::query("analyze memories").execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(ours)
}
