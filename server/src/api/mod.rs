//! # Layout
//! The JSON API under `/api`: one module per resource, handlers named `<verb>_<resource>`.
//! - `extract`: bodies, queries and credentials;
//! - `accounts`, `keys`: `/api/auth/*`, `/api/keys` (bearer token);
//! - `projects`, `memories`: `/api/v1/projects`, `/api/v1/memories`, `/api/v1/tasks` (`X-API-Key`);
//! - `agents`: `/api/v1/agents/*`.
pub mod accounts;
pub mod agents;
pub mod extract;
pub mod keys;
pub mod memories;
pub mod projects;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{any, delete, get, post};
use axum::{Json, Router};
use serde_json::json;

use app::core::error::AppError;
use app::core::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/api/health", get(health))
        .route("/api/ready", get(ready))
        .route("/api/auth/register", post(accounts::register))
        .route("/api/auth/login", post(accounts::login))
        .route("/api/auth/me", get(accounts::me))
        .route("/api/keys", get(keys::list_keys).post(keys::create_key))
        .route("/api/keys/{id}", delete(keys::delete_key))
        .route(
            "/api/v1/projects",
            get(projects::list_projects).post(projects::create_project),
        )
        .route(
            "/api/v1/projects/{project_id}",
            get(projects::get_project).delete(projects::delete_project),
        )
        .route(
            "/api/v1/memories",
            get(memories::list_memories).post(memories::create_memory),
        )
        .route("/api/v1/memories/search", post(memories::search_memories))
        .route(
            "/api/v1/memories/{memory_id}",
            get(memories::get_memory).delete(memories::delete_memory),
        )
        .route("/api/v1/tasks/{task_id}", get(memories::get_task))
        .route("/api/v1/agents/auto-register", post(agents::auto_register))
        .route("/api/v1/agents/claim/init", post(agents::claim_init))
        .route("/api/v1/agents/claim/verify", post(agents::claim_verify))
        .route("/api/v1/agents/machine-stats", get(agents::machine_stats))
        .route(
            "/api/{*rest}",
            any(|| async { AppError::NotFound("Not Found".into()) }),
        )
}

/// The process is alive.
async fn health() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

/// The database answers and every migration is applied.
async fn ready(State(state): State<AppState>) -> impl IntoResponse {
    let latest = crate::MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let applied: Result<Option<i64>, sqlx::Error> =
        sqlx::query_scalar("select max(version) from _sqlx_migrations where success")
            .fetch_one(&state.pool)
            .await;
    match applied {
        Ok(Some(v)) if v >= latest => (StatusCode::OK, Json(json!({"status": "ready", "migration": v}))).into_response(),
        Ok(_) => (StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "5")], Json(json!({"success": false, "detail": "Migrations are not applied: run `engram migrate`"}))).into_response(),
        Err(e) => AppError::from(e).into_response(),
    }
}
