//! `/api/v1/projects`.
use axum::extract::{Path, State};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::doc::{Data, ErrorBody};
use super::extract::{ApiKeyAuth, Body};
use app::core::error::AppResult;
use app::core::projects::{self, NewProject};
use app::core::state::AppState;
use app::types::ProjectView;

#[utoipa::path(get, path = "/api/v1/projects", tag = "projects",
    security(("api_key" = [])),
    responses((status = 200, description = "The account's projects, `default` first", body = Data<Vec<ProjectView>>)))]
/// List the account's projects with their memory counts.
pub async fn list_projects(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
) -> AppResult<Json<Data<Vec<ProjectView>>>> {
    Ok(Data::new(projects::list(&state.pool, owner.user_id).await?))
}

#[utoipa::path(post, path = "/api/v1/projects", tag = "projects",
    security(("api_key" = [])),
    request_body = NewProject,
    responses(
        (status = 200, description = "Created", body = Data<ProjectView>),
        (status = 409, description = "The name is taken in this account", body = ErrorBody),
    ))]
/// Create a project.
pub async fn create_project(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Body(new): Body<NewProject>,
) -> AppResult<Json<Data<ProjectView>>> {
    let project =
        projects::create_for(&state, owner.user_id, &new.name, new.description.as_deref()).await?;
    Ok(Data::new(project))
}

#[utoipa::path(get, path = "/api/v1/projects/{project_id}", tag = "projects",
    security(("api_key" = [])),
    params(("project_id" = String, Path, description = "The project's id or name")),
    responses(
        (status = 200, description = "The project", body = Data<ProjectView>),
        (status = 404, description = "No such project in this account", body = ErrorBody),
    ))]
/// Read one project.
pub async fn get_project(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Path(id): Path<String>,
) -> AppResult<Json<Data<ProjectView>>> {
    Ok(Data::new(
        projects::get(&state.pool, owner.user_id, &id).await?,
    ))
}

/// What a project's deletion removed.
#[derive(Serialize, ToSchema)]
pub struct ProjectDeleted {
    pub project_id: String,
    pub deleted_memories: i64,
}

/// A deletion's confirmation.
#[derive(Serialize, ToSchema)]
pub struct ProjectDeletion {
    pub success: bool,
    pub message: String,
    pub data: ProjectDeleted,
}

#[utoipa::path(delete, path = "/api/v1/projects/{project_id}", tag = "projects",
    security(("api_key" = [])),
    params(("project_id" = String, Path, description = "The project's id or name")),
    responses(
        (status = 200, description = "Deleted with all its memories", body = ProjectDeletion),
        (status = 404, description = "No such project in this account", body = ErrorBody),
        (status = 409, description = "The `default` project cannot be deleted", body = ErrorBody),
    ))]
/// Delete a project and all its memories, permanently.
pub async fn delete_project(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Path(id): Path<String>,
) -> AppResult<Json<ProjectDeletion>> {
    let (id, deleted) = projects::delete(&state.pool, owner.user_id, &id).await?;
    Ok(Json(ProjectDeletion {
        success: true,
        message: format!("Project '{id}' deleted with {deleted} memories"),
        data: ProjectDeleted {
            project_id: id,
            deleted_memories: deleted,
        },
    }))
}
