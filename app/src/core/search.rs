//! Hybrid search: a vector part (pgvector cosine), a keyword part (PostgreSQL full text scored
//! as BM25), the day the query names, the memory's neighbours in its stream and whether the
//! query names its author, fused into one score in [0, 1].
//!
//! ```text
//! own(m)   = W_VECTOR     · clamp(cosine(query, m), 0, 1)
//!          + W_KEYWORD    · bm25(m) / max bm25 among the candidates
//!          + W_IMPORTANCE · importance_score(m)
//!          + W_DATE       · [m's event day lies in the days the query names]
//! final(m) = own(m) + NEIGHBOUR · max(own(previous(m)), own(next(m)))
//!          + AREA         · max(own(n) for n 2 to REACH places before or after m)
//!          + W_AUTHOR     · [the query names m's author]
//! score(m) = final(m) / ((W_VECTOR + W_KEYWORD + W_IMPORTANCE [+ W_DATE]) · (1 + NEIGHBOUR + AREA)
//!                        [+ W_AUTHOR])
//! ```
//!
//! - `bm25(m)` counts a query term's occurrences in `m` plus `CONTEXT_TERMS` times those in its
//!   two neighbours (and the lengths likewise), with IDF from the scope's document frequencies.
//! - A memory's neighbours are the memories submitted just before and after it in its stream
//!   (same account, project, agent and conversation, at most `NEIGHBOUR_GAP` apart: the
//!   `stream` column). A conversation stored
//!   turn by turn keeps a question and its answer side by side, and the answer ("a sunset") is
//!   often found only through the question ("What did you paint?"). Both neighbours count
//!   alike: weighting the memory after `m` at 0.3, 0.5 or 0.7 of the one before lowered
//!   recall@10 on LoCoMo from 0.765 to 0.757, 0.758 and 0.760.
//! - `AREA`: a memory amid others that match the query is more likely to match too (a
//!   conversation stays on a subject for a while): the best own score 2 to `REACH` places away in
//!   its stream counts, beside the direct neighbours'. On LoCoMo (`engram bench locomo`)
//!   recall@10 0.779 → 0.796 (tune 0.802 → 0.812, report 0.755 → 0.780). On the tune
//!   conversations (an offline copy of this ranking) 0.3 did better than 0.2 (0.809 / 0.807); a
//!   reach of 5 did better than 3 (0.815) but reads 10 memories around each candidate, not 6.
//! - A memory's author is the label its content starts with ("Caroline: I went to …", one to
//!   three capitalised words before `": "`; the label is stored with the memory in
//!   `content_label`), else its metadata's `speaker` or `author`. The query
//!   names it when one of its words is the author's first name (any case). In a conversation
//!   stored turn by turn, "What did Caroline research?" is answered by Caroline's turns, while
//!   the other speaker's turns also carry her name ("Hey Caroline!"): on LoCoMo's dev
//!   conversations 96 % of the evidence of questions naming one speaker is that speaker's. The
//!   cosine sees the label only faintly and BM25 hardly (the name is in half the turns). On
//!   LoCoMo recall@10 0.764 → 0.779 (tune 0.788 → 0.802, report 0.741 → 0.755).
//! - `W_DATE` applies only when the query names a day, a month or a year ("on 9 November, 2022")
//!   and the memory's event day (from its metadata, else the day it was submitted) lies in it.
//!
//! On the LoCoMo dev set each part raised recall@10 (`engram bench locomo`): the weights and
//! BM25's `b` come from sweeps there. Candidates are the best `pool` of each part (plus, for a
//! short date range, the best of that range) and their neighbours; every candidate gets every
//! part computed.
//!
//! Tenant filtering never drops results: where the scope (account, or project) holds few
//! memories the vector part is an exact scan of the scope; where it holds many, the HNSW index is
//! scanned iteratively (pgvector 0.8) until enough rows of the scope are found.
//!
//! Latency: the keyword part needs no embedding, so it runs in PostgreSQL while the model embeds
//! the query, and reads its candidates' neighbours and every part's inputs in the same statement
//! (their vectors too: the cosine is computed here once the query is embedded). The vector part
//! (its candidates, their neighbours and inputs) is one statement that starts as soon as the
//! query is embedded, beside the keyword statement if that is still running: a search takes
//! about the longer of the two paths, then one read of the results' fields.
use std::collections::HashMap;
use std::time::Instant;

use chrono::{DateTime, NaiveDate, Utc};
use pgvector::Vector;
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use super::dates::{self, DayRange};
use super::embed::EmbedderHandle;
use super::error::AppResult;
use super::projects;
use super::terms;
use super::time::iso;
use crate::types::SearchHit;

pub const W_VECTOR: f32 = 0.6;
pub const W_KEYWORD: f32 = 0.35;
pub const W_IMPORTANCE: f32 = 0.05;
pub const W_DATE: f32 = 0.2;
pub const NEIGHBOUR: f32 = 0.3;
pub const AREA: f32 = 0.3;
/// How far (in memories of its stream) a memory's area reaches on each side.
pub const REACH: usize = 3;
pub const W_AUTHOR: f32 = 0.15;
pub const CONTEXT_TERMS: f64 = 0.3;
/// Memories further apart than this are not each other's context.
pub const NEIGHBOUR_GAP: chrono::TimeDelta = chrono::TimeDelta::hours(1);
/// Scopes up to this size are searched exactly; larger ones through the HNSW index.
pub const EXACT_SCAN_LIMIT: i64 = 3_000;
/// A term in more than this many memories (or 30 % of the scope) selects no candidates: it
/// would select most of the scope and weighs little. It still scores.
const DF_CAP: f64 = 1_000.0;
/// About how many memories the keyword part reads to pick its candidates.
const KEYWORD_BUDGET: f64 = 300.0;
/// Date candidates only for ranges up to this many days (a month); a year still scores.
const DATE_CANDIDATE_DAYS: i64 = 31;
const BM25_K1: f64 = 1.2;
const BM25_B: f64 = 0.3;

/// The weights of the fused score (the bench compares each part alone against the fusion).
#[derive(Debug, Clone, Copy)]
pub struct Weights {
    pub vector: f32,
    pub keyword: f32,
    pub importance: f32,
    pub date: f32,
    pub neighbour: f32,
    pub area: f32,
    pub context_terms: f64,
    pub author: f32,
}

impl Default for Weights {
    fn default() -> Self {
        Self {
            vector: W_VECTOR,
            keyword: W_KEYWORD,
            importance: W_IMPORTANCE,
            date: W_DATE,
            neighbour: NEIGHBOUR,
            area: AREA,
            context_terms: CONTEXT_TERMS,
            author: W_AUTHOR,
        }
    }
}

impl Weights {
    /// One part alone: the cosine, or BM25 of the memory's own words.
    pub fn only(vector: f32, keyword: f32) -> Self {
        Self {
            vector,
            keyword,
            importance: 0.0,
            date: 0.0,
            neighbour: 0.0,
            area: 0.0,
            context_terms: 0.0,
            author: 0.0,
        }
    }
}

/// Where the time of one search went, for the latency bench (milliseconds). A search takes
/// about `max(keyword_ms, embed_ms + vector_ms) + finish_ms`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Timings {
    /// From the start until the query was embedded.
    pub embed_ms: f64,
    /// From the start until the keyword part was read from PostgreSQL (the query's terms, then
    /// the candidates, their neighbours, every part's inputs), beside the embedding.
    pub keyword_ms: f64,
    /// The vector part's statement, once the query was embedded (beside the keyword part if
    /// that was still running).
    pub vector_ms: f64,
    /// Once both parts were read: the ranking and the results' fields.
    pub finish_ms: f64,
}

/// The account, or one of its projects.
struct Scope<'a> {
    user_id: i64,
    project_id: Option<&'a str>,
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

/// A search a client asked for (the API's routes, MCP, the portal): held to the plan's daily
/// searches (402) and counted, with its time, in the account's statistics.
pub async fn search_for(
    state: &super::state::AppState,
    user_id: i64,
    project: Option<&str>,
    query: &str,
    limit: i64,
) -> AppResult<(Vec<SearchHit>, Timings)> {
    use super::plans::Quota;
    let charge = state
        .quotas
        .charge(&state.pool, &state.stats, user_id, Quota::SearchesPerDay, 1)
        .await?;
    let started = std::time::Instant::now();
    let result = search(&state.pool, &state.embedder, user_id, project, query, limit).await;
    // A failed search is given back (the charge is dropped).
    if result.is_ok() {
        state
            .stats
            .search(user_id, started.elapsed().as_secs_f64() * 1e3);
        charge.done();
    }
    result
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
    let project_id = match project {
        Some(p) => Some(projects::resolve(pool, user_id, p).await?),
        None => None,
    };
    let scope = Scope {
        user_id,
        project_id: project_id.as_deref(),
    };
    let range = dates::find_range(query);
    // Candidates per part: on LoCoMo twice the limit found as much as five times it.
    let pool_size = (limit * 2).max(20);

    let started = Instant::now();
    // The model embeds the query on its own thread while PostgreSQL works: first the query's
    // terms, then the keyword statement; the vector statement starts as soon as the embedding is
    // ready, beside the keyword statement if that is still running.
    let embedding = {
        let (embedder, query) = (embedder.clone(), query.to_string());
        tokio::spawn(async move { embedder.embed_query(&query).await })
    };
    let keyword = query_terms(pool, &scope, query).await?;
    if keyword.scope_size == 0 {
        embedding.abort();
        return Ok((vec![], Timings::default()));
    }
    let keyword_read = async {
        let rows = keyword_rows(pool, &scope, &keyword, range, pool_size).await;
        (rows, started.elapsed())
    };
    let vector_read = async {
        let embedding = embedding
            .await
            .map_err(|e| anyhow::anyhow!("embedding the query: {e}"))??;
        let embedded = started.elapsed();
        let rows = vector_rows(
            pool,
            &scope,
            &Vector::from(embedding.clone()),
            keyword.scope_size,
            &keyword.lexemes,
            range,
            pool_size,
        )
        .await?;
        AppResult::Ok((embedding, rows, embedded, started.elapsed()))
    };
    let ((keyword_read, keyword_time), vector_read) = tokio::join!(keyword_read, vector_read);
    let (embedding, vector_read, embed_time, vector_time) = vector_read?;
    let mut rows = keyword_read?;
    let mut timings = Timings {
        embed_ms: embed_time.as_secs_f64() * 1e3,
        keyword_ms: keyword_time.as_secs_f64() * 1e3,
        vector_ms: (vector_time - embed_time).as_secs_f64() * 1e3,
        finish_ms: 0.0,
    };

    let finish = Instant::now();
    for r in &mut rows {
        r.cosine = r.embedding.take().map(|e| cosine(e.as_slice(), &embedding));
    }
    rows.extend(vector_read);
    let rows = merge(rows);
    let ranked = rank(
        &rows,
        &keyword,
        &query_words(query),
        range.is_some(),
        weights,
        limit,
    );
    let hits = hits(pool, user_id, &ranked).await?;
    timings.finish_ms = finish.elapsed().as_secs_f64() * 1e3;
    Ok((hits, timings))
}

/// The query's words, lowercased (for the memories' authors it names).
fn query_words(query: &str) -> Vec<String> {
    query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect()
}

/// Whether the query names the memory's author: one of its words is the author's first name.
fn names_author(words: &[String], author: Option<&str>) -> bool {
    let Some(first) = author
        .and_then(|a| a.split_whitespace().next())
        .map(|f| {
            f.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .filter(|f| !f.is_empty())
    else {
        return false;
    };
    words.contains(&first)
}

/// The ranked memories as search results, in rank order.
async fn hits(pool: &PgPool, user_id: i64, ranked: &[(Uuid, f32)]) -> AppResult<Vec<SearchHit>> {
    type Display = (
        Uuid,
        String,
        String,
        Option<sqlx::types::Json<Value>>,
        String,
        f32,
        DateTime<Utc>,
    );
    let ids: Vec<Uuid> = ranked.iter().map(|(id, _)| *id).collect();
    let rows: Vec<Display> = sqlx::query_as(
        "select id, content, project_id, metadata, cognitive_sector, importance_score, created_at
         from memories where id = any($1) and user_id = $2",
    )
    .bind(&ids)
    .bind(user_id)
    .fetch_all(pool)
    .await?;
    let mut rows: HashMap<Uuid, Display> = rows.into_iter().map(|r| (r.0, r)).collect();
    Ok(ranked
        .iter()
        .filter_map(|(id, score)| {
            let (id, content, project_id, metadata, sector, importance, created_at) =
                rows.remove(id)?;
            Some(SearchHit {
                id: id.to_string(),
                content,
                score: *score,
                category: sector.clone(),
                cognitive_sector: sector,
                importance_score: importance,
                project_id,
                metadata: metadata.map(|j| j.0).unwrap_or(Value::Null),
                created_at: iso(created_at),
            })
        })
        .collect())
}

/// The keyword part: the query's terms, their IDF in the scope, and the best memories by BM25 of
/// their own words.
struct KeywordPart {
    /// Memories in the scope (as of its term statistics).
    scope_size: i64,
    lexemes: Vec<String>,
    idf: Vec<f64>,
    /// Mean number of distinct terms in a memory.
    avgdl: f64,
    /// The query terms that select the keyword candidates (none: no keyword candidates).
    selective: Vec<String>,
}

/// The query's terms, their IDF in the scope, and those that select keyword candidates.
async fn query_terms(pool: &PgPool, scope: &Scope<'_>, query: &str) -> AppResult<KeywordPart> {
    let stats = terms::of_scope(pool, scope.user_id, scope.project_id).await?;
    let lexemes: Vec<String> =
        sqlx::query_scalar("select unnest(tsvector_to_array(to_tsvector('english', $1)))")
            .bind(query)
            .fetch_all(pool)
            .await?;
    let n = stats.memories as f64;
    // The rarest terms select the candidates, up to about KEYWORD_BUDGET memories: they carry
    // most of BM25's weight, and every memory selected costs a read of its terms (about 11 µs
    // in PostgreSQL, on the core the model would otherwise have to itself). Where the rarest term
    // alone is more common than that (large scopes), its newest KEYWORD_BUDGET memories are
    // scored (finding them reads each match's row, about 1 µs; only those kept are unpacked).
    let mut by_rarity: Vec<(&String, f64)> = lexemes
        .iter()
        .map(|l| (l, stats.df.get(l).copied().unwrap_or(0) as f64))
        .filter(|&(_, df)| df < DF_CAP && (df < 0.3 * n || n < 20.0))
        .collect();
    by_rarity.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut selected = 0.0;
    let selective: Vec<String> = by_rarity
        .into_iter()
        .take_while(|&(_, df)| {
            let first = selected == 0.0;
            selected += df.max(1.0);
            first || selected <= KEYWORD_BUDGET
        })
        .map(|(l, _)| l.clone())
        .collect();
    Ok(KeywordPart {
        scope_size: stats.memories,
        idf: lexemes.iter().map(|l| stats.idf(l)).collect(),
        lexemes,
        avgdl: stats.avgdl,
        selective,
    })
}

/// The keyword candidates (the best `pool_size` by BM25 of their own words) and their
/// neighbours, with every part's inputs but the cosine (their vectors instead).
async fn keyword_rows(
    pool: &PgPool,
    scope: &Scope<'_>,
    part: &KeywordPart,
    range: Option<DayRange>,
    pool_size: i64,
) -> AppResult<Vec<Row>> {
    if part.selective.is_empty() {
        return Ok(vec![]);
    }
    let anchors = "q as (select * from unnest($3::text[], $6::float8[]) as q(l, idf)),
         cand as (select * from (select id, tsv, project_id, stream, seq from memories
                                 where user_id = $1 and ($2::text is null or project_id = $2)
                                   and tsv @@ (select string_agg(quote_literal(l), ' | ')::tsquery
                                               from unnest($7::text[]) l)
                                 offset 0) matched
                  order by seq desc limit $12),
         anchors as (select c.id, c.project_id, c.stream, c.seq from cand c
                     cross join lateral (select lexeme, coalesce(array_length(positions, 1), 1)::float8 as tf
                                         from unnest(ts_filter(setweight(c.tsv, 'A', $3), '{a}'))) u
                     join q on q.l = u.lexeme
                     group by c.id, c.tsv, c.project_id, c.stream, c.seq
                     order by sum(q.idf * u.tf * ($8 + 1) / (u.tf + $8 * (1 - $9 + $9 * length(c.tsv) / $10))) desc
                     limit $11)";
    let (from, to) = days(range);
    Ok(
        sqlx::query_as(sqlx::AssertSqlSafe(rows_sql(anchors, false)))
            .bind(scope.user_id)
            .bind(scope.project_id)
            .bind(&part.lexemes)
            .bind(from)
            .bind(to)
            .bind(&part.idf)
            .bind(&part.selective)
            .bind(BM25_K1)
            .bind(BM25_B)
            .bind(part.avgdl.max(1.0))
            .bind(pool_size)
            .bind(KEYWORD_BUDGET as i64)
            .fetch_all(pool)
            .await?,
    )
}

fn days(range: Option<DayRange>) -> (Option<NaiveDate>, Option<NaiveDate>) {
    match range {
        Some(r) => (Some(r.start), Some(r.end)),
        None => (None, None),
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    // Both are L2-normalised; the norms guard against rounding.
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (*x as f64, *y as f64);
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 || nb == 0.0 {
        return 0.0;
    }
    dot / (na.sqrt() * nb.sqrt())
}

/// A memory's query terms with their positions are `ts_filter(setweight(tsv, 'A', terms),
/// '{a}')`: the query's lexemes marked, then only the marked kept (`tsv` carries no weights of
/// its own, and `to_tsvector` gives every lexeme a position to mark), all inside the tsvector's
/// C functions. Unnesting the whole `tsv` and joining it with
/// the terms cost about 11 µs a memory, most of the keyword statement's time; this about 1 µs.
///
/// The statement that reads candidates and their neighbours: `anchors` defines CTEs ending in
/// `anchors (id, project_id, stream, seq)`; with `cosine`, `$6` is the query's vector,
/// otherwise the rows carry their vectors. Shared parameters: `$1` account, `$3` query terms,
/// `$4`/`$5` the days the query names. Memories are read by primary key: the `limit 1` keeps
/// the lookups apart (a join of the candidates with `memories` is planned as a scan of the
/// whole scope, 4 ms at 10,000 memories, when the planner overestimates the candidates).
fn rows_sql(anchors: &str, cosine: bool) -> String {
    let vector = if cosine {
        "(1 - (m.embedding <=> $6))::float8 as cosine, null::vector as embedding"
    } else {
        "null::float8 as cosine, m.embedding"
    };
    format!(
        "with {anchors},
         win as (select a.id as anchor, a.id from anchors a
                 union all
                 select a.id, p.id from anchors a cross join lateral (
                     select id from memories p where p.user_id = $1 and p.project_id = a.project_id
                       and p.stream = a.stream and p.seq < a.seq
                     order by p.seq desc limit {REACH}) p
                 union all
                 select a.id, n.id from anchors a cross join lateral (
                     select id from memories n where n.user_id = $1 and n.project_id = a.project_id
                       and n.stream = a.stream and n.seq > a.seq
                     order by n.seq limit {REACH}) n),
         ids as (select id, array_agg(anchor) as anchors from win group by id)
         select m.id, i.anchors, m.seq, m.importance_score, m.created_at, {vector},
                array(select t.lexeme || ' ' || coalesce(array_length(t.positions, 1), 1)
                      from unnest(ts_filter(setweight(m.tsv, 'A', $3), '{{a}}')) t) as terms,
                length(m.tsv) as len,
                coalesce(m.event_day between $4 and $5, false) as in_range,
                m.content_label as label,
                coalesce(m.metadata->>'speaker', m.metadata->>'author') as speaker
         from ids i cross join lateral (select * from memories m where m.id = i.id limit 1) m"
    )
}

/// A memory among the candidates or their neighbours, with every part's inputs.
#[derive(sqlx::FromRow)]
struct Row {
    id: Uuid,
    /// The candidates whose stream window holds this memory (itself included if it is one).
    anchors: Vec<Uuid>,
    seq: i64,
    importance_score: f32,
    created_at: DateTime<Utc>,
    /// Computed in the statement, or from `embedding` once the query is embedded.
    cosine: Option<f64>,
    embedding: Option<Vector>,
    /// The query terms the memory holds, each as "term count".
    terms: Vec<String>,
    /// Distinct terms in the memory.
    len: i32,
    in_range: bool,
    /// What the content's first 60 characters hold before their first `": "`, if they hold one
    /// (the `content_label` column, stored with the memory).
    label: Option<String>,
    /// The metadata's `speaker`, else its `author`.
    speaker: Option<String>,
}

/// A memory's author: the label its content starts with if that looks like a name ("Caroline:
/// …", one to three capitalised words), else its metadata's speaker or author.
fn author<'a>(label: Option<&'a str>, speaker: Option<&'a str>) -> Option<&'a str> {
    let name = |l: &str| {
        (1..=3).contains(&l.split(' ').count())
            && l.split(' ').all(|w| {
                w.starts_with(|c: char| c.is_uppercase())
                    && w.chars().all(|c| c.is_alphabetic() || "'.-".contains(c))
            })
    };
    label.filter(|l| name(l)).or(speaker)
}

/// The vector candidates (and, for a short date range, the best of those days), with the
/// `REACH` memories before and after each in its stream. (Some may be keyword candidates too:
/// the two statements run at the same time, and `merge` joins their rows.)
async fn vector_rows(
    pool: &PgPool,
    scope: &Scope<'_>,
    embedding: &Vector,
    scope_size: i64,
    lexemes: &[String],
    range: Option<DayRange>,
    pool_size: i64,
) -> AppResult<Vec<Row>> {
    // Small scopes: the subquery (`offset 0`) keeps the planner off the HNSW index, an exact scan.
    let vector = if scope_size <= EXACT_SCAN_LIMIT {
        "select id from (select id, embedding from memories
                         where user_id = $1 and ($2::text is null or project_id = $2) offset 0) s
         order by embedding <=> $6 limit $7"
    } else {
        "select memory_vector_candidates($1, $2, $6, $7::int) as id"
    };
    let (from, to) = days(range);
    let date_candidates = range.is_some_and(|r| r.days() <= DATE_CANDIDATE_DAYS);
    let anchors = format!(
        "vec as ({vector}),
         day as (select id from (select id, embedding from memories
                                 where $8 and user_id = $1 and ($2::text is null or project_id = $2)
                                   and event_day between $4 and $5 limit 2000) d
                 order by embedding <=> $6 limit $7),
         anchors as (select m.id, m.project_id, m.stream, m.seq
                     from (select id from vec union select id from day) c
                     cross join lateral (select id, project_id, stream, seq from memories m
                                         where m.id = c.id and m.user_id = $1 limit 1) m)"
    );
    Ok(
        sqlx::query_as(sqlx::AssertSqlSafe(rows_sql(&anchors, true)))
            .bind(scope.user_id)
            .bind(scope.project_id)
            .bind(lexemes)
            .bind(from)
            .bind(to)
            .bind(embedding)
            .bind(pool_size)
            .bind(date_candidates)
            .fetch_all(pool)
            .await?,
    )
}

/// One row per memory: a memory read by both parts keeps the candidates of both.
fn merge(rows: Vec<Row>) -> Vec<Row> {
    let mut at: HashMap<Uuid, usize> = HashMap::new();
    let mut merged: Vec<Row> = Vec::with_capacity(rows.len());
    for r in rows {
        match at.get(&r.id) {
            Some(&i) => {
                let anchors = &mut merged[i].anchors;
                for a in r.anchors {
                    if !anchors.contains(&a) {
                        anchors.push(a);
                    }
                }
            }
            None => {
                at.insert(r.id, merged.len());
                merged.push(r);
            }
        }
    }
    merged
}

/// Scores the candidates and their neighbours (the module's formula); the best `limit`, with
/// their scores.
fn rank(
    rows: &[Row],
    keyword: &KeywordPart,
    query_words: &[String],
    has_range: bool,
    w: Weights,
    limit: i64,
) -> Vec<(Uuid, f32)> {
    // Each candidate's window is a run of its stream: consecutive members are neighbours (when
    // submitted close enough in time); the candidate and the memories next to it are ranked.
    let tf: Vec<Vec<f64>> = rows
        .iter()
        .map(|r| {
            let mut counts = vec![0.0; keyword.lexemes.len()];
            for term in &r.terms {
                let (lexeme, n) = term.rsplit_once(' ').unwrap_or((term, "1"));
                if let Some(t) = keyword.lexemes.iter().position(|l| l == lexeme) {
                    counts[t] = n.parse().unwrap_or(1.0);
                }
            }
            counts
        })
        .collect();
    let mut windows: HashMap<Uuid, Vec<usize>> = HashMap::new();
    for (i, r) in rows.iter().enumerate() {
        for a in &r.anchors {
            windows.entry(*a).or_default().push(i);
        }
    }
    let mut prev = vec![None; rows.len()];
    let mut next = vec![None; rows.len()];
    let mut ranked = vec![false; rows.len()];
    for (anchor, mut members) in windows {
        members.sort_by_key(|&i| rows[i].seq);
        for pair in members.windows(2) {
            let (a, b) = (&rows[pair[0]], &rows[pair[1]]);
            if (b.created_at - a.created_at).abs() <= NEIGHBOUR_GAP {
                next[pair[0]] = Some(pair[1]);
                prev[pair[1]] = Some(pair[0]);
            }
        }
        if let Some(pos) = members.iter().position(|&i| rows[i].id == anchor) {
            for &i in &members[pos.saturating_sub(1)..(pos + 2).min(members.len())] {
                ranked[i] = true;
            }
        }
    }

    // BM25 over the memory's own terms plus its neighbours' at CONTEXT_TERMS weight.
    let c = w.context_terms;
    let avg = keyword.avgdl.max(1.0) * (1.0 + 2.0 * c);
    let bm25: Vec<f64> = (0..rows.len())
        .map(|i| {
            let around = [prev[i], next[i]];
            let len = rows[i].len as f64
                + c * around
                    .iter()
                    .flatten()
                    .map(|&j| rows[j].len as f64)
                    .sum::<f64>();
            keyword
                .idf
                .iter()
                .enumerate()
                .map(|(t, idf)| {
                    let tf = tf[i][t] + c * around.iter().flatten().map(|&j| tf[j][t]).sum::<f64>();
                    if tf == 0.0 {
                        return 0.0;
                    }
                    idf * tf * (BM25_K1 + 1.0)
                        / (tf + BM25_K1 * (1.0 - BM25_B + BM25_B * len / avg))
                })
                .sum()
        })
        .collect();
    let max_bm25 = bm25.iter().copied().fold(0.0, f64::max);
    let own: Vec<f32> = rows
        .iter()
        .zip(&bm25)
        .map(|(r, &bm)| {
            let keyword = if max_bm25 > 0.0 { bm / max_bm25 } else { 0.0 };
            w.vector * (r.cosine.unwrap_or(0.0) as f32).clamp(0.0, 1.0)
                + w.keyword * keyword as f32
                + w.importance * r.importance_score.clamp(0.0, 1.0)
                + if r.in_range { w.date } else { 0.0 }
        })
        .collect();
    let named: Vec<bool> = rows
        .iter()
        .map(|r| {
            names_author(
                query_words,
                author(r.label.as_deref(), r.speaker.as_deref()),
            )
        })
        .collect();
    let author = if named.iter().any(|&n| n) {
        w.author
    } else {
        0.0
    };
    let total = (w.vector + w.keyword + w.importance + if has_range { w.date } else { 0.0 })
        * (1.0 + w.neighbour + w.area)
        + author;
    let mut scored: Vec<(f32, usize)> = (0..rows.len())
        .filter(|&i| ranked[i])
        .map(|i| {
            let around = [prev[i], next[i]]
                .iter()
                .flatten()
                .map(|&j| own[j])
                .fold(0.0f32, f32::max);
            // The area: 2 to REACH places away on either side, along the links.
            let mut area = 0.0f32;
            for link in [&prev, &next] {
                let mut at = link[i].and_then(|j| link[j]);
                for _ in 2..=REACH {
                    let Some(j) = at else { break };
                    area = area.max(own[j]);
                    at = link[j];
                }
            }
            let by_author = if named[i] { author } else { 0.0 };
            let score = (own[i] + w.neighbour * around + w.area * area + by_author)
                / total.max(f32::EPSILON);
            (score.clamp(0.0, 1.0), i)
        })
        .collect();
    scored.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then_with(|| rows[b.1].created_at.cmp(&rows[a.1].created_at))
            .then_with(|| rows[b.1].seq.cmp(&rows[a.1].seq))
    });
    scored.truncate(limit.max(0) as usize);
    scored
        .into_iter()
        .map(|(score, i)| (rows[i].id, score))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_names_an_author_by_first_name_in_any_case() {
        let words = query_words("What did caroline's friend Mel say to O'Brien?");
        assert_eq!(
            words,
            ["what", "did", "caroline", "s", "friend", "mel", "say", "to", "o", "brien"]
        );
        assert!(names_author(&words, Some("Caroline")));
        assert!(names_author(&words, Some("Mel Stone")));
        // Only the first name counts, and whole words only.
        assert!(!names_author(&words, Some("Stone Mel")));
        assert!(!names_author(&words, Some("Carol")));
        assert!(!names_author(&words, Some("Dr. Who")));
        assert!(!names_author(&words, Some("")));
        assert!(!names_author(&words, None));
        assert!(names_author(
            &query_words("ask dr smith"),
            Some("Dr. Smith")
        ));
    }

    #[test]
    fn a_memory_s_author_is_a_name_like_label_else_its_metadata_s() {
        for label in [
            "Caroline",
            "Mary Jane Watson",
            "Dr. O'Brien",
            "Zoë",
            "Jean-Luc",
        ] {
            assert_eq!(author(Some(label), Some("Bob")), Some(label));
        }
        // Not a name: lowercase, four words, a digit, an empty label.
        for label in ["note", "Note to self", "A B C D", "Step 2", "", "TODO list"] {
            assert_eq!(author(Some(label), Some("Bob")), Some("Bob"), "{label}");
            assert_eq!(author(Some(label), None), None, "{label}");
        }
        assert_eq!(author(None, Some("Bob")), Some("Bob"));
        assert_eq!(author(None, None), None);
    }
}
