//! The apalis worker that runs ingestion jobs from PostgreSQL (inside `serve`, or alone as
//! `engram worker`). The fetched batch runs concurrently (apalis drives a worker's jobs
//! together); the embedder batches their model calls.
use std::sync::Arc;
use std::time::Duration;

use apalis::prelude::*;
use apalis_postgres::{Config as QueueConfig, PostgresStorage};
use sqlx::PgPool;

use app::core::ingest::{self, IngestContext};
use app::core::memories::{IngestJob, QUEUE};

async fn handle(job: IngestJob, ctx: Data<Arc<IngestContext>>) -> Result<(), BoxDynError> {
    ingest::process(&ctx, job.task_id)
        .await
        .map_err(|e| -> BoxDynError { e.into() })
}

/// A worker id unique to this process (worker ids are primary keys in apalis).
pub fn worker_name() -> String {
    format!(
        "engram-{}-{}-{}",
        hostname(),
        std::process::id(),
        app::core::crypto::random_token(6)
    )
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "host".into())
}

/// Runs the worker until `shutdown` resolves.
pub async fn run(
    pool: PgPool,
    ctx: Arc<IngestContext>,
    concurrency: usize,
    heartbeat: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let config = QueueConfig::default()
        .queue(QUEUE)
        .batch_size(concurrency)
        .heartbeat_interval(heartbeat);
    let backend = PostgresStorage::new(&pool)
        .with_config(config)
        .with_pubsub();
    let name = worker_name();
    tracing::info!(worker = %name, concurrency, "worker started");
    let worker = WorkerBuilder::new(name)
        .backend(backend)
        .data(ctx)
        .build(handle);
    worker
        .run_until(async move {
            shutdown.await;
            Ok::<(), std::io::Error>(())
        })
        .await
        .map_err(|e| anyhow::anyhow!("worker stopped: {e}"))
}
