//! Term statistics of a search scope (an account, or one of its projects) for BM25: how many
//! memories it holds, their mean number of distinct terms, and each term's document frequency.
//!
//! Counting them for every query costs a read of every memory in the scope, so each process
//! keeps them per scope and reuses them: a scope's statistics are rebuilt in the background once
//! they are older than `MAX_AGE`, and queries meanwhile use the previous ones (IDF needs
//! proportions, which a few recent memories barely move). Only a scope's first query waits for
//! the build (measured: 2 ms for 400 memories, 20 ms for 2,800).
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::error::AppResult;

/// How long a scope's statistics are used before a rebuild starts.
pub const MAX_AGE: Duration = Duration::from_secs(30);
/// Scopes kept per process; beyond it the least recently built are dropped.
const MAX_SCOPES: usize = 1024;

/// One scope's statistics.
#[derive(Debug, Default)]
pub struct TermStats {
    /// Memories in the scope.
    pub memories: i64,
    /// Mean number of distinct terms in a memory.
    pub avgdl: f64,
    /// Memories holding each term.
    pub df: HashMap<String, i64>,
}

impl TermStats {
    /// BM25's IDF of `lexeme` in the scope.
    pub fn idf(&self, lexeme: &str) -> f64 {
        let n = self.memories as f64;
        let df = self.df.get(lexeme).copied().unwrap_or(0) as f64;
        ((n - df + 0.5) / (df + 0.5) + 1.0).ln()
    }
}

type Key = (i64, Option<String>);

struct Entry {
    stats: Arc<TermStats>,
    built: Instant,
    rebuilding: bool,
}

fn scopes() -> &'static Mutex<HashMap<Key, Entry>> {
    static CACHE: OnceLock<Mutex<HashMap<Key, Entry>>> = OnceLock::new();
    CACHE.get_or_init(Default::default)
}

/// The statistics of the scope (`project_id` `None`: the whole account).
pub async fn of_scope(
    pool: &PgPool,
    user_id: i64,
    project_id: Option<&str>,
) -> AppResult<Arc<TermStats>> {
    let key = (user_id, project_id.map(str::to_string));
    {
        let mut cache = scopes().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = cache.get_mut(&key) {
            if entry.built.elapsed() > MAX_AGE && !entry.rebuilding {
                entry.rebuilding = true;
                let (pool, key) = (pool.clone(), key.clone());
                tokio::spawn(async move {
                    let built = build(&pool, key.0, key.1.as_deref()).await;
                    let mut cache = scopes().lock().unwrap_or_else(|p| p.into_inner());
                    match built {
                        Ok(stats) => store(&mut cache, key, stats),
                        Err(e) => {
                            tracing::warn!(error = %e, "rebuilding term statistics failed");
                            if let Some(entry) = cache.get_mut(&key) {
                                entry.rebuilding = false;
                            }
                        }
                    }
                });
            }
            return Ok(entry.stats.clone());
        }
    }
    let stats = build(pool, user_id, project_id).await?;
    let mut cache = scopes().lock().unwrap_or_else(|p| p.into_inner());
    store(&mut cache, key, stats.clone());
    Ok(stats)
}

fn store(cache: &mut HashMap<Key, Entry>, key: Key, stats: Arc<TermStats>) {
    if cache.len() >= MAX_SCOPES && !cache.contains_key(&key) {
        if let Some(oldest) = cache
            .iter()
            .min_by_key(|(_, e)| e.built)
            .map(|(k, _)| k.clone())
        {
            cache.remove(&oldest);
        }
    }
    cache.insert(
        key,
        Entry {
            stats,
            built: Instant::now(),
            rebuilding: false,
        },
    );
}

async fn build(pool: &PgPool, user_id: i64, project_id: Option<&str>) -> AppResult<Arc<TermStats>> {
    let (memories, total): (i64, i64) = sqlx::query_as(
        "select count(*), coalesce(sum(length(tsv)), 0)::bigint from memories
         where user_id = $1 and ($2::text is null or project_id = $2)",
    )
    .bind(user_id)
    .bind(project_id)
    .fetch_one(pool)
    .await?;
    // ts_stat runs a query given as text: the scope goes in through format()'s quoting.
    let df: Vec<(String, i32)> = sqlx::query_as(
        "select word, ndoc from ts_stat(format(
             'select tsv from memories where user_id = %s and (%L::text is null or project_id = %L)',
             $1, $2::text, $2::text))",
    )
    .bind(user_id)
    .bind(project_id)
    .fetch_all(pool)
    .await?;
    Ok(Arc::new(TermStats {
        memories,
        avgdl: if memories > 0 {
            total as f64 / memories as f64
        } else {
            0.0
        },
        df: df.into_iter().map(|(w, n)| (w, n as i64)).collect(),
    }))
}
