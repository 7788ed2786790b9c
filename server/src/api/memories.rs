//! `/api/v1/memories` and `/api/v1/tasks`.
use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use super::extract::{ApiKeyAuth, JsonFields, QueryFields};
use app::core::error::AppResult;
use app::core::state::AppState;
use app::core::{memories, search, tasks};

pub async fn create_memory(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    JsonFields(mut f): JsonFields,
) -> AppResult<Json<Value>> {
    let new = memories::read_new(&mut f);
    f.finish()?;
    let task_id = memories::enqueue(&state, owner.user_id, &new).await?;
    Ok(Json(
        json!({"success": true, "message": "Memory queued for processing", "task_id": task_id, "status": "pending"}),
    ))
}

pub async fn list_memories(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    QueryFields(mut q): QueryFields,
) -> AppResult<Json<Value>> {
    let project = q.optional_str("project_id", 256).filter(|p| !p.is_empty());
    let limit = q.int_in("limit", 100, 1, 1000);
    let offset = q.int_in("offset", 0, 0, i64::MAX / 2);
    q.finish()?;
    let (data, total) = memories::list(
        &state.pool,
        owner.user_id,
        project.as_deref(),
        limit,
        offset,
    )
    .await?;
    Ok(Json(
        json!({"success": true, "data": data, "total": total, "limit": limit, "offset": offset}),
    ))
}

pub async fn get_memory(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Path(id): Path<String>,
) -> AppResult<Json<Value>> {
    Ok(Json(
        json!({"success": true, "data": memories::get(&state.pool, owner.user_id, &id).await?}),
    ))
}

pub async fn delete_memory(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Path(id): Path<String>,
) -> AppResult<Json<Value>> {
    memories::delete(&state.pool, owner.user_id, &id).await?;
    Ok(Json(json!({"success": true, "message": "Memory deleted"})))
}

pub async fn search_memories(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    JsonFields(mut f): JsonFields,
) -> AppResult<Json<Value>> {
    let query = f.required_str("query", 1, 4096);
    let project = f.optional_str("project_id", 256).filter(|p| !p.is_empty());
    let limit = f.int_in("limit", 10, 1, 100);
    f.finish()?;
    let (hits, timings) = search::search(
        &state.pool,
        &state.embedder,
        owner.user_id,
        project.as_deref(),
        &query,
        limit,
    )
    .await?;
    tracing::debug!(
        search.embed_ms = timings.embed_ms,
        search.keyword_ms = timings.keyword_ms,
        search.candidates_ms = timings.candidates_ms,
        "search"
    );
    Ok(Json(json!({"success": true, "data": hits, "query": query})))
}

pub async fn get_task(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Path(id): Path<String>,
) -> AppResult<Json<Value>> {
    Ok(Json(
        json!({"success": true, "data": tasks::get(&state.pool, owner.user_id, &id).await?}),
    ))
}
