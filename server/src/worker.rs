//! The apalis worker that runs ingestion jobs from PostgreSQL (inside `serve`, or alone as
//! `engram worker`). Up to `concurrency` jobs run at once; the embedder batches their model
//! calls, so two model batches' worth keeps the model busy while the previous batch is stored.
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use apalis::prelude::*;
use apalis_postgres::{Config as QueueConfig, PostgresStorage, Pubsub};
use futures::{Stream, StreamExt};
use sqlx::PgPool;
use tokio::time::{Instant, Interval, Sleep};

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
///
/// apalis stops a worker at the first error of its backend (a fetch or a heartbeat that cannot
/// reach PostgreSQL). So when the database restarts, this starts a new worker (a new name) once
/// it answers again, after handing the stopped worker's jobs back to the queue: that worker's
/// handlers were dropped with it, so those jobs would otherwise wait for apalis's orphan
/// timeout (three heartbeats) before anyone ran them. A job is at most started twice this way,
/// and the task it carries is stored once (`memories.task_id` is unique, and a claimed task
/// already completed is skipped).
pub async fn run(
    pool: PgPool,
    ctx: Arc<IngestContext>,
    concurrency: usize,
    heartbeat: Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
    loop {
        let name = worker_name();
        let stop = shutdown.clone();
        match run_one(&pool, &ctx, &name, concurrency, heartbeat, stop).await {
            Ok(()) => return Ok(()),
            Err(e) => {
                if futures::FutureExt::now_or_never(shutdown.clone()).is_some() {
                    return Ok(());
                }
                tracing::error!(worker = %name, error = %format!("{e:#}"), "worker stopped; starting another once the database answers");
                metrics::counter!("engram_worker_restarts_total").increment(1);
                loop {
                    let released = sqlx::query(
                        "update apalis.jobs set status = 'Pending', lock_by = null, lock_at = null
                         where lock_by = $1 and status in ('Queued', 'Running')",
                    )
                    .bind(&name)
                    .execute(&pool)
                    .await;
                    match released {
                        Ok(r) => {
                            tracing::info!(worker = %name, jobs = r.rows_affected(), "jobs of the stopped worker handed back");
                            break;
                        }
                        // Still unreachable: try again, unless told to stop meanwhile.
                        Err(_) => tokio::select! {
                            _ = shutdown.clone() => return Ok(()),
                            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                        },
                    }
                }
            }
        }
    }
}

async fn run_one(
    pool: &PgPool,
    ctx: &Arc<IngestContext>,
    name: &str,
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
    let backend = PollWith::new(
        PostgresStorage::new(&ctx.bookkeeping).with_config(config),
        StreamStrategy::new(Wakeups::new(Pubsub::new(pool.clone(), QUEUE.into()))),
    );
    tracing::info!(worker = %name, concurrency, "worker started");
    let worker = WorkerBuilder::new(name)
        .backend(backend)
        .concurrency(concurrency)
        .data(ctx.clone())
        .build(handle);
    worker
        .run_until(async move {
            shutdown.await;
            Ok::<(), std::io::Error>(())
        })
        .await
        .map_err(|e| anyhow::anyhow!("worker stopped: {e}"))
}

/// How long after a new job's notification the worker looks at the queue once more.
const FOLLOW_UP: Duration = Duration::from_millis(25);
/// How often an idle worker looks at the queue even without a notification (one missed while
/// the listening connection was being re-established, say).
const FALLBACK_POLL: Duration = Duration::from_secs(1);

/// When the worker fetches jobs: on each new job's notification (apalis's pubsub), again
/// `FOLLOW_UP` later, and every `FALLBACK_POLL`.
///
/// apalis's poll (apalis-core 1.0, `PollWith` over `Persisted`) takes one notification per
/// poll and then polls the fetch; when a fetch begun before the new job committed is still
/// running, the notification is spent on that fetch, which comes back empty, and nothing wakes
/// the worker again until its heartbeat: an idle memory then waited up to a heartbeat (seen:
/// 7.4 and 8.5 s with a 10 s heartbeat). The follow-up wake makes a fresh fetch after every
/// notification, so such a job waits `FOLLOW_UP` at most.
struct Wakeups<S> {
    notifications: S,
    follow_up: Option<Pin<Box<Sleep>>>,
    /// A notification came after the pending follow-up was armed (its fetch may be in flight
    /// when the follow-up fires): arm another.
    again: bool,
    fallback: Interval,
}

impl<S> Wakeups<S> {
    fn new(notifications: S) -> Self {
        let mut fallback = tokio::time::interval_at(Instant::now() + FALLBACK_POLL, FALLBACK_POLL);
        fallback.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            notifications,
            follow_up: None,
            again: false,
            fallback,
        }
    }
}

impl<S: Stream + Unpin> Stream for Wakeups<S> {
    type Item = ();

    /// Ready when the worker should fetch; every source is polled each time, so each has
    /// registered its waker whenever this answers.
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<()>> {
        let this = &mut *self;
        let mut wake = false;
        // Drain the notifications (each one only says "fetch"); a closed stream leaves the
        // timers to wake the worker.
        while let Poll::Ready(Some(_)) = this.notifications.poll_next_unpin(cx) {
            wake = true;
            if this.follow_up.is_some() {
                this.again = true;
            } else {
                this.follow_up = Some(Box::pin(tokio::time::sleep(FOLLOW_UP)));
            }
        }
        if let Some(timer) = this.follow_up.as_mut() {
            if timer.as_mut().poll(cx).is_ready() {
                wake = true;
                this.follow_up = None;
                if std::mem::take(&mut this.again) {
                    let mut timer = Box::pin(tokio::time::sleep(FOLLOW_UP));
                    let _ = timer.as_mut().poll(cx);
                    this.follow_up = Some(timer);
                }
            }
        }
        if this.fallback.poll_tick(cx).is_ready() {
            wake = true;
        }
        if wake {
            Poll::Ready(Some(()))
        } else {
            Poll::Pending
        }
    }
}
