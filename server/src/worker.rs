//! The apalis worker that runs ingestion jobs from PostgreSQL (inside `serve`, or alone as
//! `engram worker`). Up to `concurrency` jobs run at once; the embedder batches their model
//! calls, so two model batches' worth keeps the model busy while the previous batch is stored.
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
    // A worker holds at most `concurrency` running jobs (plus one fetched batch): the rest stay
    // `Pending` in the queue for other workers, and no task says `processing` while it waits.
    let config = QueueConfig::default()
        .queue(QUEUE)
        .batch_size(concurrency.min(app::core::embed::MAX_BATCH))
        .heartbeat_interval(heartbeat);
    let backend = PostgresStorage::new(&pool)
        .with_config(config)
        .with_pubsub();
    let name = worker_name();
    tracing::info!(worker = %name, concurrency, "worker started");
    let worker = WorkerBuilder::new(name)
        .backend(backend)
        .concurrency(concurrency)
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
