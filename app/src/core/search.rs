//! Hybrid search: a vector part (pgvector cosine) and a keyword part (PostgreSQL full text with
//! BM25 weighting), fused into one score in [0, 1].
//!
//! ```text
//! score = W_VECTOR  · clamp(cosine(query, memory), 0, 1)
//!       + W_KEYWORD · bm25(memory) / max bm25 among the candidates
//!       + W_IMPORTANCE · importance_score
//! ```
//! (the weights add up to 1). Candidates are the union of the best `pool` of each part; every
//! candidate gets both parts computed, so a memory found by only one part still has a fair score.
//!
//! Tenant filtering never drops results: where the scope (account, or project) holds few
//! memories the vector part is an exact scan of the scope; where it holds many, the HNSW index is
//! scanned iteratively (pgvector 0.8) until enough rows of the scope are found.
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use pgvector::Vector;
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use super::embed::EmbedderHandle;
use super::error::AppResult;
use super::projects;
use super::time::iso;
use crate::types::SearchHit;

pub const W_VECTOR: f32 = 0.6;
pub const W_KEYWORD: f32 = 0.35;
pub const W_IMPORTANCE: f32 = 0.05;
pub const VECTOR_MINMAX: bool = false;
/// Scopes up to this size are searched exactly.
pub const EXACT_SCAN_LIMIT: i64 = 3_000;
/// Document frequencies are counted up to this many rows; a lexeme that common selects no
/// candidates (it would select most of the scope) and weighs little.
const DF_CAP: i64 = 1_000;
const BM25_K1: f64 = 1.2;
const BM25_B: f64 = 0.75;

/// The weights of the fused score (the bench compares each part alone against the fusion).
#[derive(Debug, Clone, Copy)]
pub struct Weights {
    pub vector: f32,
    pub keyword: f32,
    pub importance: f32,
    /// Min-max normalise the cosine among the candidates instead of using it as it is.
    pub vector_minmax: bool,
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            vector: W_VECTOR,
            keyword: W_KEYWORD,
            importance: W_IMPORTANCE,
            vector_minmax: VECTOR_MINMAX,
        }
    }
}

/// Where the time of one search went, for the latency bench.
#[derive(Debug, Default, Clone, Copy)]
pub struct Timings {
    pub embed_ms: f64,
    pub db_ms: f64,
}

/// Searches the account (or one of its projects) for `query`; the best `limit` memories.
pub async fn search(
    pool: &PgPool,
    embedder: &EmbedderHandle,
    user_id: i64,
    project: Option<&str>,
    query: &str,
    limit: i64,
) -> AppResult<(Vec<SearchHit>, Timings)> {
    search_with(
        pool,
        embedder,
        user_id,
        project,
        query,
        limit,
        Weights::default(),
    )
    .await
}

/// `search` with other weights (benchmarks).
pub async fn search_with(
    pool: &PgPool,
    embedder: &EmbedderHandle,
    user_id: i64,
    project: Option<&str>,
    query: &str,
    limit: i64,
    weights: Weights,
) -> AppResult<(Vec<SearchHit>, Timings)> {
    let mut timings = Timings::default();
    let project_id = match project {
        Some(p) => Some(projects::resolve(pool, user_id, p).await?),
        None => None,
    };
    let started = std::time::Instant::now();
    let embedding = Vector::from(embedder.embed(query).await?);
    timings.embed_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = std::time::Instant::now();
    let pool_size = (limit * 5).max(50);

    let mut tx = pool.begin().await?;
    let scope_size: i64 = sqlx::query_scalar(
        "select count(*) from (select 1 from memories where user_id = $1 and ($2::text is null or project_id = $2) limit $3) s",
    )
    .bind(user_id)
    .bind(&project_id)
    .bind(EXACT_SCAN_LIMIT + 1)
    .fetch_one(&mut *tx)
    .await?;
    if scope_size == 0 {
        return Ok((vec![], timings));
    }

    // Vector candidates.
    let vector_ids: Vec<Uuid> = if scope_size <= EXACT_SCAN_LIMIT {
        // The materialised CTE keeps the planner off the HNSW index: an exact scan of the scope.
        sqlx::query_scalar(
            "with scope as materialized (
                 select id, embedding from memories where user_id = $1 and ($2::text is null or project_id = $2))
             select id from scope order by embedding <=> $3 limit $4",
        )
        .bind(user_id)
        .bind(&project_id)
        .bind(&embedding)
        .bind(pool_size)
        .fetch_all(&mut *tx)
        .await?
    } else {
        sqlx::query("set local hnsw.iterative_scan = relaxed_order")
            .execute(&mut *tx)
            .await?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "set local hnsw.ef_search = {}",
            pool_size.clamp(40, 1000)
        )))
        .execute(&mut *tx)
        .await?;
        sqlx::query_scalar(
            "select id from (select id, embedding <=> $3 as d from memories
                             where user_id = $1 and ($2::text is null or project_id = $2)
                             order by embedding <=> $3 limit $4) s order by d",
        )
        .bind(user_id)
        .bind(&project_id)
        .bind(&embedding)
        .bind(pool_size)
        .fetch_all(&mut *tx)
        .await?
    };

    // Keyword candidates, BM25-weighted: each query lexeme's IDF from its document frequency in
    // the scope (counted up to a cap: a lexeme that common carries almost no weight anyway).
    let lexemes: Vec<String> =
        sqlx::query_scalar("select unnest(tsvector_to_array(to_tsvector('english', $1)))")
            .bind(query)
            .fetch_all(&mut *tx)
            .await?;
    let mut bm25: HashMap<Uuid, f64> = HashMap::new();
    if !lexemes.is_empty() {
        let cap = DF_CAP;
        let dfs: Vec<i64> = sqlx::query_scalar(
            "select (select count(*) from (select 1 from memories m
                     where m.user_id = $1 and ($2::text is null or m.project_id = $2)
                       and m.tsv @@ to_tsquery('simple', quote_literal(l)) limit $4) c)
             from unnest($3::text[]) with ordinality as u(l, n) order by n",
        )
        .bind(user_id)
        .bind(&project_id)
        .bind(&lexemes)
        .bind(cap)
        .fetch_all(&mut *tx)
        .await?;
        // The scope's size for IDF: exact when small, otherwise a count cached for a minute
        // (IDF needs the order of magnitude, not the last row).
        let n = if scope_size <= EXACT_SCAN_LIMIT {
            scope_size
        } else {
            scope_count(&mut tx, user_id, project_id.as_deref()).await?
        } as f64;
        let idf: Vec<f64> = dfs
            .iter()
            .map(|&df| ((n - df as f64 + 0.5) / (df as f64 + 0.5) + 1.0).ln())
            .collect();
        // Only lexemes that are not everywhere select candidates (they still score).
        let selective: Vec<String> = lexemes
            .iter()
            .zip(&dfs)
            .filter(|(_, &df)| df < DF_CAP && ((df as f64) < 0.3 * n || n < 20.0))
            .map(|(l, _)| l.clone())
            .collect();
        if !selective.is_empty() {
            let rows: Vec<(Uuid, f64)> = sqlx::query_as(
                "with q as (select * from unnest($3::text[], $4::float8[]) as q(lexeme, idf)),
                      cand as (select id, tsv from memories
                               where user_id = $1 and ($2::text is null or project_id = $2)
                                 and tsv @@ (select string_agg(quote_literal(l), ' | ')::tsquery from unnest($5::text[]) l)),
                      avg_len as (select greatest(avg(length(tsv)), 1)::float8 as a from cand)
                 select c.id, sum(q.idf * (u.tf * ($6 + 1)) / (u.tf + $6 * (1 - $7 + $7 * length(c.tsv) / (select a from avg_len))))::float8 as s
                 from cand c
                 cross join lateral (select lexeme, coalesce(array_length(positions, 1), 1)::float8 as tf from unnest(c.tsv)) u
                 join q on q.lexeme = u.lexeme
                 group by c.id order by s desc limit $8",
            )
            .bind(user_id)
            .bind(&project_id)
            .bind(&lexemes)
            .bind(&idf)
            .bind(&selective)
            .bind(BM25_K1)
            .bind(BM25_B)
            .bind(pool_size)
            .fetch_all(&mut *tx)
            .await?;
            bm25.extend(rows);
        }
    }

    // Both parts for every candidate, then the fused score.
    let mut ids = vector_ids;
    ids.extend(bm25.keys().copied());
    ids.sort();
    ids.dedup();
    type Row = (
        Uuid,
        String,
        String,
        Option<sqlx::types::Json<Value>>,
        String,
        f32,
        DateTime<Utc>,
        f64,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "select id, content, project_id, metadata, cognitive_sector, importance_score, created_at, (1 - (embedding <=> $3))::float8
         from memories where id = any($2) and user_id = $1",
    )
    .bind(user_id)
    .bind(&ids)
    .bind(&embedding)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    timings.db_ms = started.elapsed().as_secs_f64() * 1e3;

    let max_bm25 = bm25.values().copied().fold(0.0f64, f64::max);
    let (min_cos, max_cos) = rows.iter().fold((f64::MAX, f64::MIN), |(lo, hi), r| {
        (lo.min(r.7), hi.max(r.7))
    });
    let vector_part = |cos: f64| -> f32 {
        if weights.vector_minmax && max_cos > min_cos {
            ((cos - min_cos) / (max_cos - min_cos)) as f32
        } else {
            (cos as f32).clamp(0.0, 1.0)
        }
    };
    let mut hits: Vec<SearchHit> = rows
        .into_iter()
        .map(
            |(id, content, project_id, metadata, sector, importance, created_at, cos)| {
                let keyword = if max_bm25 > 0.0 {
                    bm25.get(&id).copied().unwrap_or(0.0) / max_bm25
                } else {
                    0.0
                };
                let score = weights.vector * vector_part(cos)
                    + weights.keyword * keyword as f32
                    + weights.importance * importance.clamp(0.0, 1.0);
                SearchHit {
                    id: id.to_string(),
                    content,
                    score: score.clamp(0.0, 1.0),
                    cognitive_sector: sector,
                    importance_score: importance,
                    project_id,
                    metadata: metadata.map(|j| j.0).unwrap_or(Value::Null),
                    created_at: iso(created_at),
                }
            },
        )
        .collect();
    hits.sort_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| b.created_at.cmp(&a.created_at))
    });
    hits.truncate(limit.max(0) as usize);
    Ok((hits, timings))
}

type CountCache = std::sync::Mutex<HashMap<(i64, Option<String>), (std::time::Instant, i64)>>;

/// How many memories a large scope holds, counted at most once a minute per scope.
async fn scope_count(
    tx: &mut sqlx::PgConnection,
    user_id: i64,
    project_id: Option<&str>,
) -> AppResult<i64> {
    static CACHE: std::sync::OnceLock<CountCache> = std::sync::OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (user_id, project_id.map(str::to_string));
    if let Some((at, n)) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        if at.elapsed() < std::time::Duration::from_secs(60) {
            return Ok(*n);
        }
    }
    let n: i64 = sqlx::query_scalar("select count(*) from memories where user_id = $1 and ($2::text is null or project_id = $2)")
        .bind(user_id)
        .bind(project_id)
        .fetch_one(&mut *tx)
        .await?;
    let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
    if cache.len() > 10_000 {
        cache.clear();
    }
    cache.insert(key, (std::time::Instant::now(), n));
    Ok(n)
}
