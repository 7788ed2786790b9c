//! `/api/v1/models/search`: the public model catalogue (no credential; a per-address limit).
use axum::extract::{Path, State};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::doc::{Data, ErrorBody};
use super::extract::{ClientIp, Query};
use app::core::error::{AppError, AppResult};
use app::core::models::{self, ModelQuery};
use app::core::state::AppState;
use app::types::ModelView;

/// A page of the catalogue.
#[derive(Serialize, ToSchema)]
pub struct ModelPage {
    pub success: bool,
    pub data: Vec<ModelView>,
    /// Every model matching the query and filters.
    pub total: i64,
    pub limit: i64,
    pub offset: i64,
}

#[utoipa::path(get, path = "/api/v1/models/search", tag = "models",
    params(ModelQuery),
    responses(
        (status = 200, description = "Matching models, best first unless `sort` says otherwise", body = ModelPage),
        (status = 429, description = "Too many searches from this address; see `Retry-After`", body = ErrorBody),
    ))]
/// Search the public catalogue of LLMs: context window, prices per million tokens, capabilities.
pub async fn search_models(
    State(state): State<AppState>,
    ClientIp(client): ClientIp,
    Query(query): Query<ModelQuery>,
) -> AppResult<Json<ModelPage>> {
    let catalog = models::for_client(&state, &client).await?;
    let found = models::search(&catalog, &query);
    Ok(Json(ModelPage {
        success: true,
        data: found.items.into_iter().cloned().collect(),
        total: found.total as i64,
        limit: query.limit,
        offset: query.offset,
    }))
}

#[utoipa::path(get, path = "/api/v1/models/search/{model_id}", tag = "models",
    params(("model_id" = String, Path, description = "The model's id; a `/` in it is sent as `%2F` (`azure%2Fgpt-4o`)")),
    responses(
        (status = 200, description = "The model", body = Data<ModelView>),
        (status = 404, description = "No such model in the catalogue", body = ErrorBody),
        (status = 429, description = "Too many searches from this address; see `Retry-After`", body = ErrorBody),
    ))]
/// One model of the public catalogue.
pub async fn get_model(
    State(state): State<AppState>,
    ClientIp(client): ClientIp,
    Path(id): Path<String>,
) -> AppResult<Json<Data<ModelView>>> {
    let catalog = models::for_client(&state, &client).await?;
    let model = catalog
        .get(&id)
        .cloned()
        .ok_or_else(|| AppError::not_found("Model"))?;
    Ok(Data::new(model))
}
