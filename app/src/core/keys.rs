//! API keys: created with the full secret shown once, stored as SHA-256 only.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::postgres::PgListener;
use sqlx::{PgExecutor, PgPool};

use super::crypto;
use super::error::{AppError, AppResult};
use super::time::{iso, iso_opt};
use crate::types::ApiKeyView;

/// The account (and machine) a valid key acts for.
#[derive(Debug, Clone, Copy)]
pub struct KeyOwner {
    pub key_id: i64,
    pub user_id: i64,
    /// The machine account that created the key, if any.
    pub machine_id: Option<i64>,
}

type KeyRow = (
    i64,
    String,
    String,
    String,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
);

fn view((id, name, prefix, last4, created_at, last_used_at): KeyRow) -> ApiKeyView {
    ApiKeyView {
        id,
        name,
        key: crypto::mask_key(&prefix, &last4),
        is_active: true,
        created_at: iso(created_at),
        last_used_at: iso_opt(last_used_at),
    }
}

/// Creates a key; the returned view carries the full secret, the only time it is shown.
pub async fn create(
    db: impl PgExecutor<'_>,
    user_id: i64,
    machine_id: Option<i64>,
    name: &str,
) -> AppResult<ApiKeyView> {
    let secret = crypto::new_api_key();
    let prefix: String = secret.chars().take(crypto::KEY_PREFIX.len() + 4).collect();
    let last4: String = secret.chars().skip(secret.chars().count() - 4).collect();
    let (id, created_at): (i64, DateTime<Utc>) = sqlx::query_as(
        "insert into api_keys (user_id, machine_id, name, key_hash, key_prefix, key_last4) values ($1, $2, $3, $4, $5, $6) returning id, created_at",
    )
    .bind(user_id)
    .bind(machine_id)
    .bind(name)
    .bind(crypto::sha256(&secret))
    .bind(&prefix)
    .bind(&last4)
    .fetch_one(db)
    .await?;
    Ok(ApiKeyView {
        id,
        name: name.to_string(),
        key: secret,
        is_active: true,
        created_at: iso(created_at),
        last_used_at: None,
    })
}

/// The account's keys, newest first, masked.
pub async fn list(db: impl PgExecutor<'_>, user_id: i64) -> AppResult<Vec<ApiKeyView>> {
    let rows: Vec<KeyRow> = sqlx::query_as(
        "select id, name, key_prefix, key_last4, created_at, last_used_at from api_keys where user_id = $1 order by created_at desc, id desc",
    )
    .bind(user_id)
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(view).collect())
}

/// Deletes one of the account's keys; another account's key is 404. The key fails at once:
/// the deletion is committed before the cache forgets, so no later lookup can find it.
pub async fn delete(pool: &PgPool, cache: &KeyCache, user_id: i64, key_id: i64) -> AppResult<()> {
    let done = sqlx::query("delete from api_keys where id = $1 and user_id = $2")
        .bind(key_id)
        .bind(user_id)
        .execute(pool)
        .await;
    cache.forget_all();
    if done?.rows_affected() == 0 {
        return Err(AppError::not_found("API key"));
    }
    Ok(())
}

/// The owner of a presented key, if it exists (always asks the database; see [`KeyCache`]).
pub async fn authenticate(db: impl PgExecutor<'_>, secret: &str) -> AppResult<Option<KeyOwner>> {
    if !well_formed(secret) {
        return Ok(None);
    }
    let row: Option<(i64, i64, Option<i64>)> =
        sqlx::query_as("select id, user_id, machine_id from api_keys where key_hash = $1")
            .bind(crypto::sha256(secret))
            .fetch_optional(db)
            .await?;
    Ok(row.map(|(key_id, user_id, machine_id)| KeyOwner {
        key_id,
        user_id,
        machine_id,
    }))
}

/// Whether `secret` could be one of our keys at all (anything else is refused unasked).
fn well_formed(secret: &str) -> bool {
    secret.starts_with(crypto::KEY_PREFIX) && secret.len() <= 200
}

/// The channel the `api_keys` trigger notifies on every deletion or change of owner (see the
/// migration `key_changes`), from any process.
pub const CHANGES_CHANNEL: &str = "engram_api_keys";
/// Longest an entry is trusted without asking the database again.
const CACHE_TTL: Duration = Duration::from_secs(30);
/// Most keys remembered; past it the cache starts over.
const CACHE_MAX: usize = 10_000;

/// The owners of keys presented recently. Every API call presents a key; under load its lookup
/// was one database round trip per request. An entry is used only while this process listens
/// for key changes ([`KeyCache::listen`]): the trigger's notification, sent when the change
/// commits, empties the cache, and so does every deletion or claim this process makes itself,
/// after its commit (a deleted key answers 401 at once here, and elsewhere once the
/// notification arrives, a few milliseconds). A lookup that began before a change never fills
/// the cache after it (`epoch`). Without the listener (lost connection) every call asks the
/// database, as when the cache is off. Unknown keys are never cached.
pub struct KeyCache {
    inner: Mutex<CacheInner>,
    enabled: bool,
    hits: AtomicU64,
    lookups: AtomicU64,
}

/// One database lookup of a key, shared by the requests that present the key while it runs,
/// failure included: when the database is unreachable every request waiting answers 503 at
/// once, instead of each trying again in turn after the one before it timed out (seen during
/// a PostgreSQL restart: requests queued behind one key waited 3 s each).
type Lookup = Arc<tokio::sync::OnceCell<Result<Option<KeyOwner>, LookupFailed>>>;

#[derive(Clone, Debug)]
enum LookupFailed {
    Unavailable,
    Other(String),
}

impl From<AppError> for LookupFailed {
    fn from(e: AppError) -> Self {
        match e {
            AppError::Unavailable => LookupFailed::Unavailable,
            other => LookupFailed::Other(format!("{other:#}")),
        }
    }
}

impl From<LookupFailed> for AppError {
    fn from(e: LookupFailed) -> Self {
        match e {
            LookupFailed::Unavailable => AppError::Unavailable,
            LookupFailed::Other(message) => AppError::Internal(anyhow::anyhow!(message)),
        }
    }
}

#[derive(Default)]
struct CacheInner {
    listening: bool,
    epoch: u64,
    entries: HashMap<Vec<u8>, (KeyOwner, Instant)>,
    /// Lookups under way: concurrent requests with a key not yet cached ask the database once
    /// (a client opening many connections at once, or a busy key whose entry just expired,
    /// would otherwise send one query per request, each wanting a connection of its own).
    pending: HashMap<Vec<u8>, Lookup>,
}

impl CacheInner {
    /// Empties the cache; lookups already under way will not fill it, and requests from now
    /// on do not join them.
    fn forget_all(&mut self) {
        self.epoch += 1;
        self.entries.clear();
        self.pending.clear();
    }
}

impl KeyCache {
    /// A cache; `enabled: false` makes every lookup ask the database (`ENGRAM_KEY_CACHE=off`).
    pub fn new(enabled: bool) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::default(),
            enabled,
            hits: AtomicU64::new(0),
            lookups: AtomicU64::new(0),
        })
    }

    /// Lookups answered from the cache so far.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Database lookups the cache has made so far (requests sharing one count once).
    pub fn lookups(&self) -> u64 {
        self.lookups.load(Ordering::Relaxed)
    }

    /// Whether the listener is connected (entries are used only then).
    pub fn listening(&self) -> bool {
        self.lock().listening
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The owner of a presented key, from the cache when it can be trusted.
    pub async fn authenticate(&self, pool: &PgPool, secret: &str) -> AppResult<Option<KeyOwner>> {
        if !self.enabled || !well_formed(secret) {
            return authenticate(pool, secret).await;
        }
        let hash = crypto::sha256(secret);
        let (epoch, lookup) = {
            let mut inner = self.lock();
            if inner.listening {
                if let Some((owner, at)) = inner.entries.get(&hash) {
                    if at.elapsed() < CACHE_TTL {
                        self.hits.fetch_add(1, Ordering::Relaxed);
                        return Ok(Some(*owner));
                    }
                }
            }
            if inner.pending.len() >= CACHE_MAX {
                inner.pending.clear();
            }
            let lookup: Lookup = inner.pending.entry(hash.clone()).or_default().clone();
            (inner.epoch, lookup)
        };
        // The first request runs the query and the others wait for its answer, or its failure;
        // if its request goes away, the next one waiting runs it again.
        let owner = lookup
            .get_or_init(|| {
                self.lookups.fetch_add(1, Ordering::Relaxed);
                async { authenticate(pool, secret).await.map_err(LookupFailed::from) }
            })
            .await
            .clone()
            .map_err(AppError::from);
        let mut inner = self.lock();
        if inner
            .pending
            .get(&hash)
            .is_some_and(|l| Arc::ptr_eq(l, &lookup))
        {
            inner.pending.remove(&hash);
        }
        if let Ok(Some(owner)) = owner {
            if inner.listening && inner.epoch == epoch {
                if inner.entries.len() >= CACHE_MAX {
                    inner.entries.clear();
                }
                inner.entries.insert(hash, (owner, Instant::now()));
            }
        }
        owner
    }

    /// Forgets every key (after a change to `api_keys` has committed).
    pub fn forget_all(&self) {
        self.lock().forget_all();
    }

    /// Starting or stopping to listen empties the cache too (changes may have been missed).
    fn set_listening(&self, listening: bool) {
        let mut inner = self.lock();
        inner.listening = listening;
        inner.forget_all();
    }

    /// Listens for key changes until the pool closes (a task of its own); the cache is used only
    /// while the listener is connected.
    pub fn listen(self: &Arc<Self>, pool: PgPool) {
        if !self.enabled {
            return;
        }
        let cache = Arc::downgrade(self);
        tokio::spawn(async move {
            while !pool.is_closed() {
                match subscribe(&pool).await {
                    Ok(mut listener) => {
                        let Some(this) = cache.upgrade() else { return };
                        this.set_listening(true);
                        drop(this);
                        loop {
                            let got = listener.try_recv().await;
                            let Some(this) = cache.upgrade() else { return };
                            match got {
                                // A change, or a lost connection just re-established (a
                                // change may have been missed meanwhile).
                                Ok(_) => this.forget_all(),
                                Err(e) => {
                                    this.set_listening(false);
                                    if !pool.is_closed() {
                                        tracing::warn!(error = %e, "key change listener lost; API keys are looked up every time until it is back");
                                    }
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) => {
                        if !pool.is_closed() {
                            tracing::warn!(error = %e, "cannot listen for key changes; retrying");
                        }
                    }
                }
                if cache.strong_count() == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }
}

async fn subscribe(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANGES_CHANNEL).await?;
    Ok(listener)
}
