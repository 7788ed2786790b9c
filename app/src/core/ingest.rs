//! The ingestion job: `processing` → embed → classify → store → `completed`. Idempotent: a
//! re-delivered job (after a crash) or a retry never stores a second memory for one task, because
//! `memories.task_id` is unique and the memory and the task's completion commit together.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, Utc};
use pgvector::Vector;
use serde_json::Value;
use sqlx::PgPool;
use tokio::sync::OnceCell;
use uuid::Uuid;

use super::classify::{importance, Classifier, SECTORS};
use super::dates;
use super::embed::{EmbedderHandle, MODEL_NAME};
use super::group::GroupCommit;
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
    classifier: OnceCell<Classifier>,
    /// Group commit for the jobs' claims of their tasks (started on first use).
    claims: std::sync::OnceLock<GroupCommit<Uuid, Result<Option<Claimed>, String>>>,
    /// Group commit for embedded memories (started on first use).
    stores: std::sync::OnceLock<GroupCommit<Store, Result<(), String>>>,
    /// Statements the claim and store writers have run (tests and benchmarks read them).
    pub claim_statements: Arc<AtomicU64>,
    pub store_statements: Arc<AtomicU64>,
}

/// Most memories stored in one statement.
const MAX_STORE_BATCH: usize = 64;
/// Most tasks claimed in one statement.
const MAX_CLAIM_BATCH: usize = 64;

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
            classifier: OnceCell::new(),
            claims: std::sync::OnceLock::new(),
            stores: std::sync::OnceLock::new(),
            claim_statements: Arc::default(),
            store_statements: Arc::default(),
        })
    }

    async fn classifier(&self) -> anyhow::Result<&Classifier> {
        self.classifier
            .get_or_try_init(|| Classifier::load_or_fit(&self.embedder))
            .await
    }

    /// Loads the model and the sector classifier before the first job.
    pub async fn warm_up(&self) -> anyhow::Result<()> {
        self.embedder.warm_up().await?;
        self.classifier().await.map(|_| ())
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
#[derive(sqlx::FromRow, Clone)]
struct Claimed {
    id: Uuid,
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
    let claimed = ctx
        .claims()
        .submit(task_id)
        .await
        .ok_or_else(|| anyhow::anyhow!("the claim writer stopped"))?
        .map_err(|e| anyhow::anyhow!(e))?;
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
                metrics::counter!("engram_tasks_total", "outcome" => "retried").increment(1);
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
                metrics::counter!("engram_tasks_total", "outcome" => "failed").increment(1);
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
    let classifier = ctx.classifier().await?;
    let local_sector = classifier.classify(&embedding, &task.content);
    let (sector, llm_importance) = match &ctx.llm {
        Some(settings) => match llm::classify(&ctx.http, settings, &task.content).await {
            Ok(answer) => (answer.sector, answer.importance),
            Err(e) => {
                tracing::warn!(task.id = %task_id, error = %format!("{e:#}"), "LLM classification failed, the local classifier decides");
                (local_sector, None)
            }
        },
        None => (local_sector, None),
    };
    let event_day = dates::event_day(task.metadata.as_ref().map(|m| &m.0))
        .unwrap_or_else(|| dates::utc_day(task.created_at));
    ctx.stores()
        .submit(Store {
            task_id,
            user_id: task.user_id,
            project_id: task.project_id.clone(),
            content: task.content.clone(),
            metadata: task.metadata.clone(),
            agent_id: task.agent_id.clone(),
            local_sector,
            sector,
            llm_importance,
            vector: Vector::from(embedding),
            seq: task.seq,
            event_day,
        })
        .await
        .ok_or_else(|| anyhow::anyhow!("the store writer stopped"))?
        .map_err(|e| anyhow::anyhow!(e))
}

/// An embedded, classified memory on its way to the database.
struct Store {
    task_id: Uuid,
    user_id: i64,
    project_id: String,
    content: String,
    metadata: Option<sqlx::types::Json<Value>>,
    agent_id: Option<String>,
    /// The local classifier's sector (the importance's prior when the LLM gives none).
    local_sector: usize,
    /// The sector stored.
    sector: usize,
    /// The LLM's importance, when it gave one.
    llm_importance: Option<f32>,
    vector: Vector,
    seq: i64,
    event_day: NaiveDate,
}

impl IngestContext {
    /// Group commit for claims ([`super::group`]): a fetch hands the worker up to its
    /// concurrency of jobs at once, and each marked its task `processing` in a statement of its
    /// own, a burst of a few dozen statements just when new memories are arriving; together
    /// they are one.
    fn claims(&self) -> &GroupCommit<Uuid, Result<Option<Claimed>, String>> {
        self.claims.get_or_init(|| {
            let (pool, statements) = (self.bookkeeping.clone(), self.claim_statements.clone());
            GroupCommit::spawn(MAX_CLAIM_BATCH, move |ids: Vec<Uuid>| {
                let (pool, statements) = (pool.clone(), statements.clone());
                async move {
                    statements.fetch_add(1, Ordering::Relaxed);
                    match claim_batch(&pool, &ids).await {
                        Ok(claimed) => ids.iter().map(|id| Ok(claimed.get(id).cloned())).collect(),
                        Err(e) => {
                            let message = format!("{e:#}");
                            ids.iter().map(|_| Err(message.clone())).collect()
                        }
                    }
                }
            })
        })
    }

    /// Group commit for embedded memories. A model batch finishes up to 16 jobs together;
    /// stored one transaction each, they were 16 WAL flushes (each carrying HNSW and GIN index
    /// changes) for every forward pass, about a hundred a second, and a new memory's
    /// acknowledgement, which waits for its own flush, kept finding the disk busy with one of
    /// them (sampled wait events: the API's writes waiting in `WALSync` and `WALWrite` behind
    /// the worker's). Written together, a forward pass's memories are one or two flushes. One
    /// statement at a time, so the stores' index inserts take one core at most, and the API
    /// keeps the other.
    fn stores(&self) -> &GroupCommit<Store, Result<(), String>> {
        self.stores.get_or_init(|| {
            let (pool, statements) = (self.pool.clone(), self.store_statements.clone());
            GroupCommit::spawn(MAX_STORE_BATCH, move |batch: Vec<Store>| {
                let (pool, statements) = (pool.clone(), statements.clone());
                async move {
                    statements.fetch_add(1, Ordering::Relaxed);
                    match store_batch(&pool, &batch).await {
                        Ok(()) => batch.iter().map(|_| Ok(())).collect(),
                        // One bad row (its project deleted meanwhile) must not fail the others:
                        // each on its own, with its own answer.
                        Err(_) if batch.len() > 1 => {
                            let mut results = Vec::with_capacity(batch.len());
                            for s in &batch {
                                statements.fetch_add(1, Ordering::Relaxed);
                                results.push(
                                    store_batch(&pool, std::slice::from_ref(s))
                                        .await
                                        .map_err(|e| format!("{e:#}")),
                                );
                            }
                            results
                        }
                        Err(e) => vec![Err(format!("{e:#}"))],
                    }
                }
            })
        })
    }
}

/// Marks the tasks `processing` (each one try more); the ones still to do, by id. A task already
/// completed or failed, or deleted with its project, is not among them.
async fn claim_batch(pool: &PgPool, ids: &[Uuid]) -> sqlx::Result<HashMap<Uuid, Claimed>> {
    let claimed: Vec<Claimed> = sqlx::query_as(
        "update tasks set status = 'processing', started_at = coalesce(started_at, now()), attempts = attempts + 1
         where id = any($1) and status in ('pending', 'processing')
         returning id, user_id, project_id, content, metadata, agent_id, attempts, seq, created_at",
    )
    .bind(ids)
    .fetch_all(pool)
    .await?;
    Ok(claimed.into_iter().map(|c| (c.id, c)).collect())
}

/// Stores a batch: each memory's novelty against its account's stored memories (one query for
/// the batch; memories of one batch do not count against each other, as two jobs running side
/// by side never did; see the migration that defines `nearest_memory_similarity`), its
/// importance, then the memories and their tasks' completion in one statement (one
/// transaction). A memory stored by an earlier try of its task (whose answer was lost) is kept
/// and reported instead.
async fn store_batch(pool: &PgPool, batch: &[Store]) -> anyhow::Result<()> {
    let users: Vec<i64> = batch.iter().map(|s| s.user_id).collect();
    let vectors: Vec<&Vector> = batch.iter().map(|s| &s.vector).collect();
    let nearest: Vec<Option<f32>> = sqlx::query_scalar(
        "select nearest_memory_similarity(b.user_id, b.embedding, $3)
         from unnest($1::bigint[], $2::vector[]) with ordinality as b(user_id, embedding, i)
         order by b.i",
    )
    .bind(&users)
    .bind(&vectors)
    .bind(NOVELTY_EXACT_LIMIT)
    .fetch_all(pool)
    .await?;
    anyhow::ensure!(
        nearest.len() == batch.len(),
        "novelty: {} answers for {}",
        nearest.len(),
        batch.len()
    );
    let importances: Vec<f32> = batch
        .iter()
        .zip(&nearest)
        .map(|(s, &nearest)| {
            s.llm_importance
                .unwrap_or_else(|| importance(s.local_sector, &s.content, nearest))
        })
        .collect();
    let ids: Vec<Uuid> = batch.iter().map(|_| Uuid::new_v4()).collect();
    let projects: Vec<&str> = batch.iter().map(|s| s.project_id.as_str()).collect();
    let tasks: Vec<Uuid> = batch.iter().map(|s| s.task_id).collect();
    let contents: Vec<&str> = batch.iter().map(|s| s.content.as_str()).collect();
    let metadata: Vec<Option<&sqlx::types::Json<Value>>> =
        batch.iter().map(|s| s.metadata.as_ref()).collect();
    let agents: Vec<Option<&str>> = batch.iter().map(|s| s.agent_id.as_deref()).collect();
    let sectors: Vec<&str> = batch.iter().map(|s| SECTORS[s.sector]).collect();
    let seqs: Vec<i64> = batch.iter().map(|s| s.seq).collect();
    let days: Vec<NaiveDate> = batch.iter().map(|s| s.event_day).collect();
    let done = sqlx::query(
        "with batch as (
             select * from unnest($1::uuid[], $2::bigint[], $3::text[], $4::uuid[], $5::text[],
                 $6::jsonb[], $7::text[], $8::text[], $9::real[], $10::vector[], $11::bigint[],
                 $12::date[])
             as b(id, user_id, project_id, task_id, content, metadata, agent_id, cognitive_sector,
                 importance_score, embedding, seq, event_day)),
         inserted as (
             insert into memories (id, user_id, project_id, task_id, content, metadata, agent_id,
                 cognitive_sector, importance_score, embedding, embedding_model, seq, event_day)
             select id, user_id, project_id, task_id, content, metadata, agent_id,
                 cognitive_sector, importance_score, embedding, $13, seq, event_day
             from batch
             on conflict (task_id) do nothing
             returning id, task_id, cognitive_sector, importance_score),
         stored as (
             select id, task_id, cognitive_sector, importance_score from inserted
             union all
             select id, task_id, cognitive_sector, importance_score from memories
             where task_id in (select task_id from batch))
         update tasks t set status = 'completed', memory_id = s.id, cognitive_sector = s.cognitive_sector,
             importance_score = s.importance_score, completed_at = now(), error = null
         from stored s where t.id = s.task_id",
    )
    .bind(&ids)
    .bind(&users)
    .bind(&projects)
    .bind(&tasks)
    .bind(&contents)
    .bind(&metadata)
    .bind(&agents)
    .bind(&sectors)
    .bind(&importances)
    .bind(&vectors)
    .bind(&seqs)
    .bind(&days)
    .bind(MODEL_NAME)
    .execute(pool)
    .await?;
    metrics::counter!("engram_tasks_total", "outcome" => "completed")
        .increment(done.rows_affected());
    Ok(())
}

/// Accounts up to this many memories are compared exactly for novelty; larger ones through the
/// HNSW index (approximate, which novelty can afford).
const NOVELTY_EXACT_LIMIT: i32 = 500;
