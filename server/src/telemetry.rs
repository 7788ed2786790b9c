//! Logs through `tracing`: one line per request with its id, method, path, status and duration.
use std::time::Instant;

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

pub fn init(default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("ENGRAM_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{default_level},sqlx=warn,apalis=warn,apalis_postgres=warn,apalis_core=warn,tower_sessions=warn")));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .try_init();
}

/// Middleware: gives each request an id (or keeps the caller's `x-request-id`), logs it once
/// answered, and returns the id in the response.
pub async fn log_request(req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.len() <= 64 && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        .map(str::to_string)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let span = tracing::info_span!("request", request.id = %id, method = %req.method(), path = %req.uri().path());
    let started = Instant::now();
    let mut response = next.run(req).instrument(span.clone()).await;
    let status = response.status().as_u16();
    span.in_scope(|| {
        tracing::info!(
            status,
            duration_ms = (started.elapsed().as_secs_f64() * 1e3 * 100.0).round() / 100.0,
            "request"
        )
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", v);
    }
    response
}
