//! # Layout
//! The JSON API under `/api`: one module per resource, handlers named `<verb>_<resource>`, each
//! with its request and response types beside it and its `#[utoipa::path]` documentation.
//! - `doc`: the shared envelopes and error bodies, and the OpenAPI document's own parts;
//! - `extract`: typed bodies and queries (422s in FastAPI's shape) and the two credentials;
//! - `accounts`, `keys`: `/api/auth/*`, `/api/keys` (bearer token);
//! - `projects`, `memories`: `/api/v1/projects`, `/api/v1/memories`, `/api/v1/tasks` (`X-API-Key`);
//! - `agents`: `/api/v1/agents/*`;
//! - `conversations`: `/api/v1/conversations`;
//! - `chat`: the OpenAI-compatible proxy, `/api/v1/chat/completions`, `/api/v1/models` and
//!   `/api/v1/proxy/settings`;
//! - `models`: `/api/v1/models/search`, the public model catalogue;
//! - `transfer`: `/api/v1/export`, `/api/v1/import` (JSON Lines);
//! - `stats`: `/api/stats`, `/api/stats/usage`, `/api/subscription/*`, MemoryX's `/api/v1/quota`;
//! - `memoryx`: the paths MemoryX's SDKs call, as aliases over the same functions.
//!
//! Routes are registered through utoipa-axum's `routes!`, which adds a handler and its
//! documentation together: a JSON route cannot exist without its entry in `/api/openapi.json`.
pub mod accounts;
pub mod agents;
pub mod chat;
pub mod conversations;
pub mod doc;
pub mod extract;
pub mod keys;
pub mod memories;
pub mod memoryx;
pub mod models;
pub mod projects;
pub mod stats;
pub mod transfer;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{any, get};
use axum::{Json, Router};
use serde::Serialize;
use utoipa::openapi::OpenApi;
use utoipa::{Modify, OpenApi as _, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use app::core::error::AppError;
use app::core::state::AppState;

/// The documented routes and their document.
fn documented() -> (Router<AppState>, OpenApi) {
    let (router, mut openapi) = OpenApiRouter::with_openapi(doc::ApiDoc::openapi())
        .routes(routes!(health))
        .routes(routes!(ready))
        .routes(routes!(accounts::register))
        .routes(routes!(accounts::login))
        .routes(routes!(accounts::me))
        .routes(routes!(keys::list_keys, keys::create_key))
        .routes(routes!(keys::delete_key))
        .routes(routes!(projects::list_projects, projects::create_project))
        .routes(routes!(projects::get_project, projects::delete_project))
        .routes(routes!(memories::list_memories, memories::create_memory))
        .routes(routes!(memories::search_memories))
        .routes(routes!(memories::get_memory, memories::delete_memory))
        .routes(routes!(memories::get_task))
        .routes(routes!(agents::auto_register))
        .routes(routes!(agents::claim_init))
        .routes(routes!(agents::claim_verify))
        .routes(routes!(agents::machine_stats))
        .routes(routes!(memoryx::auto_register))
        .routes(routes!(memoryx::create_batch))
        .routes(routes!(memoryx::list_memories))
        .routes(routes!(memoryx::get_task))
        .routes(routes!(
            conversations::list_conversations,
            conversations::create_conversation
        ))
        .routes(routes!(
            conversations::get_conversation,
            conversations::delete_conversation
        ))
        .routes(routes!(conversations::append_messages))
        .routes(routes!(memoryx::flush_conversation))
        .routes(routes!(chat::chat_completions))
        .routes(routes!(chat::list_models))
        .routes(routes!(
            chat::get_proxy_settings,
            chat::put_proxy_settings,
            chat::delete_proxy_settings
        ))
        .routes(routes!(transfer::export))
        .routes(routes!(transfer::import))
        .routes(routes!(models::search_models))
        .routes(routes!(models::get_model))
        .routes(routes!(stats::get_stats))
        .routes(routes!(stats::get_usage))
        .routes(routes!(stats::get_subscription))
        .routes(routes!(stats::get_quota))
        .routes(routes!(stats::billing_webhook))
        .split_for_parts();
    doc::StandardErrors.modify(&mut openapi);
    (router, openapi)
}

/// The OpenAPI 3.1 document of every JSON route.
pub fn openapi() -> OpenApi {
    documented().1
}

pub fn router() -> Router<AppState> {
    let (router, openapi) = documented();
    let document = bytes::Bytes::from(openapi.to_json().expect("serialising the OpenAPI document"));
    router
        .route(
            "/api/openapi.json",
            get(move || async move { ([(header::CONTENT_TYPE, "application/json")], document) }),
        )
        .merge(
            swagger_ui_dist::generate_routes(swagger_ui_dist::ApiDefinition {
                uri_prefix: "/api/docs",
                api_definition: swagger_ui_dist::OpenApiSource::Uri("/api/openapi.json"),
                title: Some("Engram API"),
            })
            .with_state(()),
        )
        .route(
            "/api/{*rest}",
            any(|| async { AppError::NotFound("Not Found".into()) }),
        )
}

/// The process's health.
#[derive(Serialize, ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: String,
}

#[utoipa::path(get, path = "/api/health", tag = "service",
    responses((status = 200, description = "The process is alive", body = Health)))]
/// Liveness: the process answers.
async fn health() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
    })
}

/// Readiness.
#[derive(Serialize, ToSchema)]
pub struct Ready {
    /// `ready`.
    pub status: String,
    /// The latest migration applied.
    pub migration: i64,
}

#[utoipa::path(get, path = "/api/ready", tag = "service",
    responses(
        (status = 200, description = "The database answers and every migration is applied", body = Ready),
    ))]
/// Readiness: the database answers and every migration is applied (503 otherwise).
async fn ready(State(state): State<AppState>) -> axum::response::Response {
    let latest = crate::MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let applied: Result<Option<i64>, sqlx::Error> =
        sqlx::query_scalar("select max(version) from _sqlx_migrations where success")
            .fetch_one(&state.pool)
            .await;
    match applied {
        Ok(Some(v)) if v >= latest => Json(Ready {
            status: "ready".into(),
            migration: v,
        })
        .into_response(),
        Ok(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [("retry-after", "5")],
            Json(doc::ErrorBody {
                success: false,
                detail: "Migrations are not applied: run `engram migrate`".into(),
            }),
        )
            .into_response(),
        Err(e) => AppError::from(e).into_response(),
    }
}
