//! `GET /api/v1/export` and `POST /api/v1/import`: an account as JSON Lines (see
//! `app::core::transfer`), streamed both ways so an account of any size fits in little memory.
use axum::body::Body as HttpBody;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Serialize;
use utoipa::ToSchema;

use super::doc::ErrorBody;
use super::extract::ApiKeyAuth;
use app::core::error::{AppError, AppResult};
use app::core::state::AppState;
use app::core::transfer::{self, Import, ImportReport, Stage};

/// The export of `user_id` as a byte stream of JSON Lines.
pub fn export_stream(
    pool: sqlx::PgPool,
    user_id: i64,
    email: Option<String>,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> {
    futures::stream::unfold(Some(Stage::Start), move |stage| {
        let (pool, email) = (pool.clone(), email.clone());
        async move {
            let stage = stage?;
            match transfer::next_chunk(&pool, user_id, email.as_deref(), stage).await {
                Ok(Some((chunk, next))) => Some((Ok(bytes::Bytes::from(chunk)), Some(next))),
                Ok(None) => None,
                Err(e) => {
                    tracing::error!(error = %e, "export broke off");
                    Some((Err(std::io::Error::other("export failed")), None))
                }
            }
        }
    })
}

#[utoipa::path(get, path = "/api/v1/export", tag = "transfer",
    security(("api_key" = [])),
    responses((status = 200, description = "The account as JSON Lines: a `header`, then `project`, `conversation` (with its messages) and `memory` records (with their vectors), one a line",
        content_type = "application/x-ndjson", body = String)))]
/// Export the account: projects, conversations and memories, streamed as JSON Lines.
pub async fn export(State(state): State<AppState>, ApiKeyAuth(owner): ApiKeyAuth) -> Response {
    let stream = export_stream(state.pool.clone(), owner.user_id, None);
    (
        [
            (header::CONTENT_TYPE, "application/x-ndjson"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"engram-export.jsonl\"",
            ),
        ],
        HttpBody::from_stream(stream),
    )
        .into_response()
}

/// What an import did.
#[derive(Serialize, ToSchema)]
pub struct Imported {
    pub success: bool,
    pub data: ImportReport,
}

/// Largest import body.
pub const IMPORT_LIMIT: usize = 4 * 1024 * 1024 * 1024;

/// Imports JSON Lines from a stream of chunks, in one transaction.
pub async fn import_stream<S, E>(
    state: &AppState,
    user_id: i64,
    mut chunks: S,
) -> AppResult<ImportReport>
where
    S: futures::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut import = Import::begin(&state.pool, user_id).await?;
    let mut pending: Vec<u8> = vec![];
    let mut read = 0usize;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk
            .map_err(|e| AppError::BadRequest(format!("Could not read the request body: {e}")))?;
        read += chunk.len();
        if read > IMPORT_LIMIT {
            return Err(AppError::PayloadTooLarge);
        }
        pending.extend_from_slice(&chunk);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let raw: Vec<u8> = pending.drain(..=end).collect();
            let text = String::from_utf8(raw)
                .map_err(|_| AppError::BadRequest("The import is not UTF-8 text".into()))?;
            import.line(&text).await?;
        }
    }
    if !pending.is_empty() {
        let text = String::from_utf8(pending)
            .map_err(|_| AppError::BadRequest("The import is not UTF-8 text".into()))?;
        import.line(&text).await?;
    }
    // The plan's memories quota holds for imports too (402, nothing imported).
    let n = import.memory_count();
    app::core::memories::charged(state, user_id, n, import.commit()).await
}

#[utoipa::path(post, path = "/api/v1/import", tag = "transfer",
    security(("api_key" = [])),
    request_body(content = String, content_type = "application/x-ndjson",
        description = "An export of `GET /api/v1/export` (JSON Lines)"),
    responses(
        (status = 200, description = "Imported, all of it (one transaction)", body = Imported),
        (status = 400, description = "Not UTF-8 text", body = ErrorBody),
    ))]
/// Import an export into this account: projects matched by name, conversations and memories
/// added; memories of this server's model keep their vectors, others are queued.
pub async fn import(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    body: HttpBody,
) -> AppResult<Json<Imported>> {
    let data = import_stream(&state, owner.user_id, body.into_data_stream()).await?;
    Ok(Json(Imported {
        success: true,
        data,
    }))
}
