//! Prometheus metrics: `GET /metrics` in the text exposition format, recorded with the `metrics`
//! facade and rendered by `metrics-exporter-prometheus` (the established pair; the recorder
//! keeps lock-free atomics per series, so recording on the request path costs a few atomic
//! adds).
//!
//! Served on its own address (`ENGRAM_METRICS_BIND`, default `127.0.0.1:9464`), never on the
//! public one: queue depths and route latencies are for the operator's scraper. Series:
//!
//! - `engram_http_requests_total{method, route, status}` and
//!   `engram_http_request_duration_seconds{method, route, status}` (histogram), the route as the
//!   router matched it (`/api/v1/memories/{memory_id}`), so ids do not explode the series;
//! - `engram_queue_pending_jobs`, `engram_queue_oldest_pending_seconds` (read at each scrape);
//! - `engram_tasks_total{outcome = completed | failed | retried}` (counted by the worker);
//! - `engram_embed_batches_total{lane}`, `engram_embed_texts_total{lane}`,
//!   `engram_embed_busy_seconds_total{lane}` and `engram_embed_batch_size{lane}` (histogram);
//! - `engram_db_pool_connections{state = in_use | idle}`;
//! - `engram_rate_limited_total{limit}` (429s by the limit that refused).
use std::sync::OnceLock;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use app::core::embed::Lane;
use app::core::state::AppState;

/// Latency buckets, in seconds: from a cached key's answer to a slow proxied chat.
const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5, 5.0, 10.0,
];
const BATCH_BUCKETS: [f64; 8] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// The process's recorder, installed once (every router of the process shares it).
pub fn handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("engram_http_request_duration_seconds".into()),
                    &LATENCY_BUCKETS,
                )
                .and_then(|b| {
                    b.set_buckets_for_metric(
                        Matcher::Full("engram_embed_batch_size".into()),
                        &BATCH_BUCKETS,
                    )
                })
                .expect("valid buckets")
                .install_recorder()
                .expect("installing the metrics recorder")
        })
        .clone()
}

/// Middleware: counts and times every request by its matched route and status.
pub async fn track(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "(unmatched)".into());
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    let labels = [("method", method), ("route", route), ("status", status)];
    metrics::counter!("engram_http_requests_total", &labels).increment(1);
    metrics::histogram!("engram_http_request_duration_seconds", &labels)
        .record(started.elapsed().as_secs_f64());
    response
}

/// The metrics router: `GET /metrics`.
pub fn router(state: AppState) -> Router {
    let handle = handle();
    Router::new()
        .route(
            "/metrics",
            get(move |State(state): State<AppState>| {
                let handle = handle.clone();
                async move { render(&state, &handle).await }
            }),
        )
        .with_state(state)
}

/// Reads the gauges that are cheaper to read at a scrape than to keep, then renders.
async fn render(state: &AppState, handle: &PrometheusHandle) -> Response {
    let queue: Result<(i64, Option<f64>), sqlx::Error> = sqlx::query_as(
        "select count(*), extract(epoch from now() - min(run_at))::float8
         from apalis.jobs where job_type = $1 and status = 'Pending'",
    )
    .bind(app::core::memories::QUEUE)
    .fetch_one(&state.pool)
    .await;
    if let Ok((pending, oldest)) = queue {
        metrics::gauge!("engram_queue_pending_jobs").set(pending as f64);
        metrics::gauge!("engram_queue_oldest_pending_seconds").set(oldest.unwrap_or(0.0).max(0.0));
    }
    let size = state.pool.size() as f64;
    let idle = state.pool.num_idle() as f64;
    metrics::gauge!("engram_db_pool_connections", "state" => "in_use").set(size - idle);
    metrics::gauge!("engram_db_pool_connections", "state" => "idle").set(idle);
    for (lane, name) in [(Lane::Query, "query"), (Lane::Bulk, "bulk")] {
        let s = state.embedder.stats(lane);
        use std::sync::atomic::Ordering::Relaxed;
        metrics::counter!("engram_embed_batches_total", "lane" => name)
            .absolute(s.batches.load(Relaxed));
        metrics::counter!("engram_embed_texts_total", "lane" => name)
            .absolute(s.texts.load(Relaxed));
        metrics::gauge!("engram_embed_busy_seconds_total", "lane" => name)
            .set(s.busy_ns.load(Relaxed) as f64 / 1e9);
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        handle.render(),
    )
        .into_response()
}
