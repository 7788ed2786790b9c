//! `/api/v1/projects`.
use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use super::extract::{ApiKeyAuth, JsonFields};
use app::core::error::AppResult;
use app::core::projects;
use app::core::state::AppState;

pub async fn list_projects(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
) -> AppResult<Json<Value>> {
    Ok(Json(
        json!({"success": true, "data": projects::list(&state.pool, owner.user_id).await?}),
    ))
}

pub async fn create_project(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    JsonFields(mut f): JsonFields,
) -> AppResult<Json<Value>> {
    let (name, description) = projects::read_new(&mut f);
    f.finish()?;
    let project =
        projects::create(&state.pool, owner.user_id, &name, description.as_deref()).await?;
    Ok(Json(json!({"success": true, "data": project})))
}

pub async fn get_project(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Path(id): Path<String>,
) -> AppResult<Json<Value>> {
    Ok(Json(
        json!({"success": true, "data": projects::get(&state.pool, owner.user_id, &id).await?}),
    ))
}

pub async fn delete_project(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Path(id): Path<String>,
) -> AppResult<Json<Value>> {
    let (id, deleted) = projects::delete(&state.pool, owner.user_id, &id).await?;
    Ok(Json(json!({
        "success": true,
        "message": format!("Project '{id}' deleted with {deleted} memories"),
        "data": {"project_id": id, "deleted_memories": deleted},
    })))
}
