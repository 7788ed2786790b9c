//! The ingestion job: `processing` → embed → classify → store → `completed`. Idempotent: a
//! re-delivered job (after a crash) or a retry never stores a second memory for one task, because
//! `memories.task_id` is unique and the memory and the task's completion commit together.
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use pgvector::Vector;
use serde_json::Value;
use sqlx::PgPool;
use tokio::sync::OnceCell;
use uuid::Uuid;

use super::classify::{importance, Centroids, SECTORS};
use super::dates;
use super::embed::{EmbedderHandle, MODEL_NAME};
use super::llm;
use super::state::LlmSettings;

/// How the worker retries and (in tests) misbehaves.
#[derive(Clone, Debug)]
pub struct IngestOptions {
    /// Tries of one task before it is marked `failed`.
    pub max_tries: u32,
    /// Wait before the second try; doubled before each further one.
    pub backoff: Duration,
    /// Failpoint: the first N tries of every task fail with a transient error (tests only).
    pub fail_first_tries: u32,
    /// Failpoint: sleep this long after marking a task `processing` (tests only: a window in
    /// which to kill the process).
    pub delay_after_start: Duration,
}

impl Default for IngestOptions {
    fn default() -> Self {
        Self {
            max_tries: 4,
            backoff: Duration::from_millis(250),
            fail_first_tries: 0,
            delay_after_start: Duration::ZERO,
        }
    }
}

/// What a worker process shares between jobs.
pub struct IngestContext {
    pub pool: PgPool,
    /// The same database for the queue's bookkeeping, committed without waiting for the disk
    /// (see [`bookkeeping_pool`]).
    pub bookkeeping: PgPool,
    pub embedder: EmbedderHandle,
    pub http: reqwest::Client,
    pub llm: Option<LlmSettings>,
    pub options: IngestOptions,
    centroids: OnceCell<Centroids>,
    /// Turns at the database for the writes of embedded memories (see [`DB_TURNS`]).
    db_turns: tokio::sync::Semaphore,
}

/// Jobs of one process at the database at once after embedding. A model batch finishes 16
/// jobs together; their 16 novelty queries and stores (each an HNSW and a GIN insert) at once
/// took both cores for tens of milliseconds every batch, and the API's answers waited behind
/// them. One at a time they take one core at most, and still keep up with the model (a batch's
/// writes take a fraction of its forward pass).
const DB_TURNS: usize = 1;

impl IngestContext {
    pub fn new(
        pool: PgPool,
        embedder: EmbedderHandle,
        http: reqwest::Client,
        llm: Option<LlmSettings>,
        options: IngestOptions,
    ) -> Arc<Self> {
        Arc::new(Self {
            bookkeeping: bookkeeping_pool(&pool),
            pool,
            embedder,
            http,
            llm,
            options,
            centroids: OnceCell::new(),
            db_turns: tokio::sync::Semaphore::new(DB_TURNS),
        })
    }

    async fn centroids(&self) -> anyhow::Result<&Centroids> {
        self.centroids
            .get_or_try_init(|| Centroids::load_or_fit(&self.embedder))
            .await
    }

    /// Loads the model and the centroids before the first job.
    pub async fn warm_up(&self) -> anyhow::Result<()> {
        self.embedder.warm_up().await?;
        self.centroids().await.map(|_| ())
    }
}

/// Connections for the worker's bookkeeping: apalis's fetches, locks, acknowledgements and
/// heartbeats, and a task's `processing` mark. They commit with `synchronous_commit = off`:
/// PostgreSQL does not wait for the disk before answering, and writes them out within a few
/// hundred milliseconds, or with the next transaction that does wait.
///
/// Why: each of these used to wait for a WAL flush of its own, about six per memory (at 100
/// memories/s, 600 flushes a second of about 0.8 ms each kept this VM's disk busy most of the
/// time), and a new memory's acknowledgement, which must wait for its flush, queued behind them.
///
/// Why it is safe: only a crash of PostgreSQL itself (not of a worker) can undo such a
/// commit, and undoing any of them costs at most a repeated try. A lost fetch or lock leaves the
/// job pending again, or running under a worker whose heartbeat stops, which apalis re-queues; a
/// lost acknowledgement leaves the job to be delivered again, and [`process`] finds its task
/// completed; a lost `processing` mark leaves the task `pending` with one try fewer. What a
/// client relies on still waits for the disk: the new task and its job (the memory writer), and
/// the memory with its task's completion or failure (this module's other writes, on `pool`).
/// A transaction that waits also flushes everything committed before it.
pub fn bookkeeping_pool(pool: &PgPool) -> PgPool {
    let options = (*pool.connect_options())
        .clone()
        .options([("synchronous_commit", "off")]);
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(options)
}

/// A task as the worker claims it.
#[derive(sqlx::FromRow)]
struct Claimed {
    user_id: i64,
    project_id: String,
    content: String,
    metadata: Option<sqlx::types::Json<Value>>,
    agent_id: Option<String>,
    attempts: i32,
    seq: i64,
    created_at: DateTime<Utc>,
}

/// Runs one task to `completed` or `failed`. An `Err` is returned only when the database cannot
/// be reached to record the outcome, so the queue delivers the job again.
pub async fn process(ctx: &IngestContext, task_id: Uuid) -> anyhow::Result<()> {
    let claimed: Option<Claimed> = sqlx::query_as(
        "update tasks set status = 'processing', started_at = coalesce(started_at, now()), attempts = attempts + 1
         where id = $1 and status in ('pending', 'processing')
         returning user_id, project_id, content, metadata, agent_id, attempts, seq, created_at",
    )
    .bind(task_id)
    .fetch_optional(&ctx.bookkeeping)
    .await?;
    // Already completed or failed, or deleted with its project: nothing to do.
    let Some(task) = claimed else {
        return Ok(());
    };
    if !ctx.options.delay_after_start.is_zero() {
        tokio::time::sleep(ctx.options.delay_after_start).await;
    }
    // Deliveries after a crash count as tries too, so a task that kills its worker ends `failed`.
    let mut tries = task.attempts.max(1) as u32;
    loop {
        match try_once(ctx, task_id, &task, tries).await {
            Ok(()) => return Ok(()),
            Err(e) if tries < ctx.options.max_tries => {
                let wait = ctx.options.backoff * 2u32.saturating_pow(tries - 1);
                tracing::warn!(task.id = %task_id, attempt = tries, error = %format!("{e:#}"), wait_ms = wait.as_millis() as u64, "ingest failed, retrying");
                tokio::time::sleep(wait).await;
                // `attempts` counts every try, so clients and tests see the retries.
                let next: Option<i32> = sqlx::query_scalar("update tasks set attempts = attempts + 1 where id = $1 and status = 'processing' returning attempts")
                    .bind(task_id)
                    .fetch_optional(&ctx.bookkeeping)
                    .await?;
                let Some(next) = next else { return Ok(()) };
                tries = next as u32;
            }
            Err(e) => {
                tracing::error!(task.id = %task_id, attempt = tries, error = %format!("{e:#}"), "ingest failed for good");
                let message = format!("Processing failed after {tries} attempts: {e}");
                sqlx::query("update tasks set status = 'failed', error = $2, completed_at = now() where id = $1 and status = 'processing'")
                    .bind(task_id)
                    .bind(message)
                    .execute(&ctx.pool)
                    .await?;
                return Ok(());
            }
        }
    }
}

async fn try_once(
    ctx: &IngestContext,
    task_id: Uuid,
    task: &Claimed,
    try_number: u32,
) -> anyhow::Result<()> {
    if try_number <= ctx.options.fail_first_tries {
        anyhow::bail!("injected transient failure (try {try_number})");
    }
    let embedding = ctx.embedder.embed(&task.content).await?;
    let vector = Vector::from(embedding.clone());
    let nearest = {
        let _turn = ctx.db_turns.acquire().await?;
        nearest_similarity(&ctx.pool, task.user_id, &vector).await?
    };
    let centroids = ctx.centroids().await?;
    let local_sector = centroids.classify(&embedding, &task.content);
    let local_importance = importance(local_sector, &task.content, nearest);
    let (sector, importance_score) = match &ctx.llm {
        Some(settings) => match llm::classify(&ctx.http, settings, &task.content).await {
            Ok(answer) => (answer.sector, answer.importance.unwrap_or(local_importance)),
            Err(e) => {
                tracing::warn!(task.id = %task_id, error = %format!("{e:#}"), "LLM classification failed, the local classifier decides");
                (local_sector, local_importance)
            }
        },
        None => (local_sector, local_importance),
    };

    // The memory and the task's completion in one statement (one transaction). A memory stored
    // by an earlier try of this task (whose answer was lost) is kept and reported instead.
    let event_day = dates::event_day(task.metadata.as_ref().map(|m| &m.0))
        .unwrap_or_else(|| dates::utc_day(task.created_at));
    let _turn = ctx.db_turns.acquire().await?;
    sqlx::query(
        "with inserted as (
             insert into memories (id, user_id, project_id, task_id, content, metadata, agent_id,
                 cognitive_sector, importance_score, embedding, embedding_model, seq, event_day)
             values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
             on conflict (task_id) do nothing
             returning id, cognitive_sector, importance_score),
         stored as (
             select id, cognitive_sector, importance_score from inserted
             union all
             select id, cognitive_sector, importance_score from memories where task_id = $4)
         update tasks t set status = 'completed', memory_id = s.id, cognitive_sector = s.cognitive_sector,
             importance_score = s.importance_score, completed_at = now(), error = null
         from stored s where t.id = $4",
    )
    .bind(Uuid::new_v4())
    .bind(task.user_id)
    .bind(&task.project_id)
    .bind(task_id)
    .bind(&task.content)
    .bind(&task.metadata)
    .bind(&task.agent_id)
    .bind(SECTORS[sector])
    .bind(importance_score)
    .bind(&vector)
    .bind(MODEL_NAME)
    .bind(task.seq)
    .bind(event_day)
    .execute(&ctx.pool)
    .await?;
    Ok(())
}

/// Accounts up to this many memories are compared exactly for novelty; larger ones through the
/// HNSW index (approximate, which novelty can afford).
const NOVELTY_EXACT_LIMIT: i32 = 500;

/// The cosine similarity of the account's memory nearest to `vector` (`None` for a new account);
/// see the migration that defines `nearest_memory_similarity`.
async fn nearest_similarity(
    pool: &PgPool,
    user_id: i64,
    vector: &Vector,
) -> anyhow::Result<Option<f32>> {
    Ok(
        sqlx::query_scalar("select nearest_memory_similarity($1, $2, $3)")
            .bind(user_id)
            .bind(vector)
            .bind(NOVELTY_EXACT_LIMIT)
            .fetch_one(pool)
            .await?,
    )
}
