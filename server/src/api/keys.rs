//! `/api/keys`: the account's API keys, with a bearer token.
use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use super::extract::{BearerAuth, JsonFields};
use app::core::error::{AppError, AppResult, FieldError};
use app::core::keys;
use app::core::state::AppState;

pub async fn list_keys(
    State(state): State<AppState>,
    BearerAuth(user_id): BearerAuth,
) -> AppResult<Json<Value>> {
    Ok(Json(
        json!({"success": true, "data": keys::list(&state.pool, user_id).await?}),
    ))
}

pub async fn create_key(
    State(state): State<AppState>,
    BearerAuth(user_id): BearerAuth,
    JsonFields(mut f): JsonFields,
) -> AppResult<Json<Value>> {
    let name = f.required_str("name", 1, 100);
    f.finish()?;
    let key = keys::create(&state.pool, user_id, None, &name).await?;
    Ok(Json(
        json!({"success": true, "data": key, "message": "API key created: store it now, it is not shown again"}),
    ))
}

pub async fn delete_key(
    State(state): State<AppState>,
    BearerAuth(user_id): BearerAuth,
    Path(id): Path<String>,
) -> AppResult<Json<Value>> {
    let id: i64 = id.parse().map_err(|_| {
        AppError::validation(
            FieldError::new(
                &["path", "id"],
                "int_parsing",
                "Input should be a valid integer, unable to parse string as an integer",
            )
            .input(json!(id)),
        )
    })?;
    keys::delete(&state.pool, &state.keys, user_id, id).await?;
    Ok(Json(json!({"success": true, "message": "API key revoked"})))
}
