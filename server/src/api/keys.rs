//! `/api/keys`: the account's API keys, with a bearer token.
use axum::extract::{Path, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::doc::{Data, ErrorBody, Message};
use super::extract::{BearerAuth, Body};
use app::core::error::{AppError, AppResult, FieldError};
use app::core::keys;
use app::core::state::AppState;
use app::core::validate::{Fields, FromFields};
use app::types::ApiKeyView;

#[utoipa::path(get, path = "/api/keys", tag = "keys",
    security(("bearer" = [])),
    responses((status = 200, description = "The account's keys, secrets masked", body = Data<Vec<ApiKeyView>>)))]
/// List the account's API keys (masked).
pub async fn list_keys(
    State(state): State<AppState>,
    BearerAuth(user_id): BearerAuth,
) -> AppResult<Json<Data<Vec<ApiKeyView>>>> {
    Ok(Data::new(keys::list(&state.pool, user_id).await?))
}

/// A key to create.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({"name": "laptop agent"}))]
pub struct CreateKeyRequest {
    /// 1 to 100 characters after trimming.
    #[schema(min_length = 1, max_length = 100)]
    pub name: String,
}

impl FromFields for CreateKeyRequest {
    fn from_fields(f: &mut Fields) -> Self {
        CreateKeyRequest {
            name: f.required_str("name", 1, 100),
        }
    }
}

/// A new key: `data.key` holds the whole secret, shown this once.
#[derive(Serialize, ToSchema)]
pub struct KeyCreated {
    pub success: bool,
    pub data: ApiKeyView,
    pub message: String,
}

#[utoipa::path(post, path = "/api/keys", tag = "keys",
    security(("bearer" = [])),
    request_body = CreateKeyRequest,
    responses((status = 200, description = "Created; the secret is in `data.key`, shown only now", body = KeyCreated)))]
/// Create an API key.
pub async fn create_key(
    State(state): State<AppState>,
    BearerAuth(user_id): BearerAuth,
    Body(req): Body<CreateKeyRequest>,
) -> AppResult<Json<KeyCreated>> {
    let key = keys::create(&state.pool, user_id, None, &req.name).await?;
    Ok(Json(KeyCreated {
        success: true,
        data: key,
        message: "API key created: store it now, it is not shown again".into(),
    }))
}

#[utoipa::path(delete, path = "/api/keys/{id}", tag = "keys",
    security(("bearer" = [])),
    params(("id" = i64, Path, description = "The key's id")),
    responses(
        (status = 200, description = "Revoked: the key fails at once", body = Message),
        (status = 404, description = "No such key in this account", body = ErrorBody),
    ))]
/// Revoke (delete) an API key.
pub async fn delete_key(
    State(state): State<AppState>,
    BearerAuth(user_id): BearerAuth,
    Path(id): Path<String>,
) -> AppResult<Json<Message>> {
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
    Ok(Message::new("API key revoked"))
}
