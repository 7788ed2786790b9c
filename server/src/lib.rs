//! # Layout
//! The Engram server: one binary (`engram`) with subcommands.
//! - `config`: settings from the environment;
//! - `api`: the JSON API under `/api`, and its OpenAPI document;
//! - `guide`: the plain-text agent guide at `/agent-guide`;
//! - `mcp`: the MCP endpoint at `/mcp` (streamable HTTP, the API's tools);
//! - `metrics`: Prometheus metrics at `/metrics`, on an address of its own;
//! - `portal`: the Leptos portal (SSR + hydration), its sessions and cross-site protection;
//! - `sessions`: the PostgreSQL session store;
//! - `standin`: a stand-in OpenAI-compatible LLM for the proxy's tests and bench;
//! - `worker`: the apalis ingestion worker;
//! - `telemetry`: logs, one line per request;
//! - `bench`: the benchmark and evaluation commands.
pub mod api;
pub mod bench;
pub mod config;
pub mod guide;
pub mod mcp;
pub mod metrics;
pub mod portal;
pub mod sessions;
pub mod standin;
pub mod telemetry;
pub mod worker;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::Router;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use sqlx::PgPool;

use app::core::embed::EmbedderHandle;
use app::core::ingest::{IngestContext, IngestOptions};
use app::core::state::{AppState, Settings, CHECK_IDLE_AFTER, CONNECT_TIMEOUT};

/// Our migrations (apalis keeps its own in schema `apalis`).
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// Request bodies above this are 413.
pub const BODY_LIMIT: usize = 1024 * 1024;

/// The pool every process uses. It fails fast when the database is unreachable, so requests
/// answer 503 quickly.
///
/// sqlx checks an idle connection before handing it out with a round trip to PostgreSQL (its
/// `test_before_acquire`), so every statement cost two: under 64 clients posting, a memory
/// write batch took 15 % longer with it (`bench ingest` without the worker). A connection used
/// within the last second is handed out as it is; one idle longer is checked as before, so a
/// connection the server dropped meanwhile (a restart) is replaced, not handed to a request.
pub fn pool_options() -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(20)
        .acquire_timeout(CONNECT_TIMEOUT)
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for > CHECK_IDLE_AFTER {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

pub async fn connect(url: &str) -> anyhow::Result<PgPool> {
    Ok(pool_options().connect_with(connect_options(url)?).await?)
}

/// How every session connects:
/// - an HNSW scan with a filter (an account, a project) goes on through the index until enough
///   rows pass it (pgvector 0.8's iterative scans), instead of keeping only those of the first
///   `ef_search` candidates that happen to pass;
/// - no JIT compilation: our statements are short, and a mis-estimated cost once had a 6 ms
///   statement spend 360 ms compiling;
/// - a server on this machine (loopback) is reached without TLS unless the URL asks for it with
///   `sslmode`: sqlx's default (`prefer`) would encrypt every query on loopback, which cost about
///   a quarter of the CPU time of each API write here and gains nothing.
pub fn connect_options(url: &str) -> anyhow::Result<PgConnectOptions> {
    let mut options = url
        .parse::<PgConnectOptions>()?
        .options([("hnsw.iterative_scan", "relaxed_order"), ("jit", "off")]);
    let loopback = matches!(
        options.get_host(),
        "localhost" | "127.0.0.1" | "::1" | "[::1]"
    );
    if loopback && !url.contains("sslmode=") {
        options = options.ssl_mode(PgSslMode::Disable);
    }
    Ok(options)
}

/// Applies the queue's and our migrations.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    apalis_postgres::PostgresStorage::setup(pool)
        .await
        .map_err(|e| anyhow::anyhow!("apalis migrations: {e}"))?;
    MIGRATOR.run(pool).await?;
    Ok(())
}

/// The state shared by the API and the portal.
pub fn build_state(
    pool: PgPool,
    settings: Settings,
    embedder: EmbedderHandle,
    site_root: &str,
) -> AppState {
    // rustls needs one process-wide crypto provider (ring, as sqlx uses); a second install is a no-op.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let keys = app::core::keys::KeyCache::new(settings.key_cache);
    keys.listen(pool.clone());
    let quotas: Arc<app::core::plans::Quotas> = Default::default();
    quotas.listen(pool.clone());
    AppState::new(app::core::state::AppStateInner {
        quotas,
        limiter: Arc::new(app::core::ratelimit::RateLimiter::new(pool.clone())),
        stats: Default::default(),
        keys,
        writer: app::core::memories::EnqueueWriter::spawn(pool.clone(), embedder.foreground()),
        pool,
        settings: Arc::new(settings),
        usage: Default::default(),
        models: Default::default(),
        embedder,
        leptos_options: portal::leptos_options(site_root),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("building the HTTP client"),
    })
}

/// The ingestion context of a worker in this process.
pub fn ingest_context(state: &AppState, options: IngestOptions) -> Arc<IngestContext> {
    IngestContext::new(
        state.pool.clone(),
        state.embedder.clone(),
        state.http.clone(),
        state.settings.llm.clone(),
        options,
    )
}

/// Where setup puts litellm's price list.
pub const DEFAULT_MODEL_CATALOG: &str = "models/litellm/model_prices_and_context_window.json";

/// One line saying what a catalogue import did.
pub fn describe_import(file: &std::path::Path, r: &app::core::models::ImportReport) -> String {
    let mut reasons: std::collections::BTreeMap<&str, usize> = Default::default();
    for s in &r.skipped {
        *reasons.entry(s.reason).or_default() += 1;
    }
    let reasons: Vec<String> = reasons
        .iter()
        .map(|(why, n)| format!("{n} {why}"))
        .collect();
    format!(
        "{}: {} models ({} new, {} updated, {} unchanged), {} removed; skipped {}: {}",
        file.display(),
        r.inserted + r.updated + r.unchanged,
        r.inserted,
        r.updated,
        r.unchanged,
        r.removed,
        r.skipped.len(),
        reasons.join("; ")
    )
}

/// Imports the price list into an empty catalogue (a new install), so the model search works
/// from the first start. A missing file is only logged: the rest of the service runs without it.
pub async fn seed_model_catalog(pool: &PgPool, file: &std::path::Path) {
    let empty: Result<bool, sqlx::Error> =
        sqlx::query_scalar("select not exists (select 1 from models)")
            .fetch_one(pool)
            .await;
    if !matches!(empty, Ok(true)) {
        return;
    }
    match std::fs::read(file) {
        Ok(bytes) => match app::core::models::import(pool, &bytes).await {
            Ok(report) => tracing::info!("model catalogue: {}", describe_import(file, &report)),
            Err(e) => tracing::warn!(error = %e, "the model catalogue could not be imported"),
        },
        Err(e) => tracing::warn!(
            file = %file.display(),
            error = %e,
            "no model catalogue to import: run `make setup`, then `engram models import`"
        ),
    }
}

/// The whole HTTP application: API and portal on one router.
pub fn router(state: AppState) -> Router {
    let api = api::router()
        .merge(mcp::router())
        .merge(guide::router())
        .layer(DefaultBodyLimit::max(BODY_LIMIT));
    portal::router(&state)
        .merge(api)
        .layer(axum::middleware::from_fn(metrics::track))
        .layer(axum::middleware::from_fn(telemetry::log_request))
        .with_state(state)
}

/// Writes this process's daily counts and reads again the quota use of the accounts it serves,
/// every 2 seconds (see `app::core::plans`).
pub fn spawn_quota_refresh(state: AppState) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            if let Err(e) = state.quotas.refresh(&state.pool, &state.stats).await {
                tracing::warn!(error = %e, "reading quota use failed; retrying");
            }
        }
    })
}

/// Writes batched API-call counts, analyzes `memories` again when enough of it changed (every
/// 30 seconds: search's plans need current statistics), removes ended rate-limit windows (every
/// minute) and expired sessions, every few seconds.
pub fn spawn_housekeeping(state: AppState, every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = 0u64;
        loop {
            tokio::time::sleep(every).await;
            if let Err(e) = state.usage.flush(&state.pool).await {
                tracing::warn!(error = %e, "flushing API usage failed, kept for the next try");
            }
            ticks += 1;
            if ticks.is_multiple_of(6) {
                if let Err(e) = app::core::memories::analyze_if_changed(&state.pool).await {
                    tracing::warn!(error = %e, "analyzing memories failed");
                }
            }
            if ticks.is_multiple_of(12) {
                if let Err(e) = app::core::ratelimit::RateLimiter::prune(&state.pool).await {
                    tracing::warn!(error = %e, "removing ended rate-limit windows failed");
                }
            }
            if ticks.is_multiple_of(600) {
                let _ = sessions::delete_expired(&state.pool).await;
            }
        }
    })
}
