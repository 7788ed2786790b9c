//! `/api/v1/memories` and `/api/v1/tasks`.
use axum::extract::{Path, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::doc::{Data, ErrorBody, Message};
use super::extract::{ApiKeyAuth, Body, Query};
use app::core::error::AppResult;
use app::core::memories::NewMemory;
use app::core::state::AppState;
use app::core::validate::{Fields, FromFields, MAX_OFFSET};
use app::core::{memories, search, tasks};
use app::types::{MemoryView, SearchHit, TaskView};

/// A memory queued: follow `task_id` at `GET /api/v1/tasks/{task_id}`.
#[derive(Serialize, ToSchema)]
#[schema(example = json!({"success": true, "message": "Memory queued for processing",
    "task_id": "6f1c1d2e-8a53-4c1e-9a57-0d5b3c1f2a11", "status": "pending"}))]
pub struct Queued {
    pub success: bool,
    pub message: String,
    pub task_id: String,
    /// Always `pending`.
    pub status: String,
}

impl Queued {
    pub fn new(task_id: uuid::Uuid, message: &str) -> Json<Self> {
        Json(Self {
            success: true,
            message: message.into(),
            task_id: task_id.to_string(),
            status: "pending".into(),
        })
    }
}

#[utoipa::path(post, path = "/api/v1/memories", tag = "memories",
    security(("api_key" = [])),
    request_body = NewMemory,
    responses(
        (status = 200, description = "Queued", body = Queued),
        (status = 404, description = "Unknown project", body = ErrorBody),
    ))]
/// Queue a memory. It is embedded, classified and stored by a worker; the answer's `task_id`
/// is committed before the answer is sent.
pub async fn create_memory(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Body(new): Body<NewMemory>,
) -> AppResult<Json<Queued>> {
    let task_id = memories::enqueue(&state, owner.user_id, &new).await?;
    Ok(Queued::new(task_id, "Memory queued for processing"))
}

/// Paging and filter of the memory list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// A project's id or name; all projects when omitted.
    #[param(max_length = 256)]
    pub project_id: Option<String>,
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000, default = 100)]
    pub limit: i64,
    #[serde(default)]
    #[param(minimum = 0, maximum = 1000000000, default = 0)]
    pub offset: i64,
}

impl FromFields for ListQuery {
    fn from_fields(q: &mut Fields) -> Self {
        ListQuery {
            project_id: q.optional_str("project_id", 256).filter(|p| !p.is_empty()),
            limit: q.int_in("limit", 100, 1, 1000),
            offset: q.int_in("offset", 0, 0, MAX_OFFSET),
        }
    }
}

/// A page of memories, newest first.
#[derive(Serialize, ToSchema)]
pub struct MemoryPage {
    pub success: bool,
    pub data: Vec<MemoryView>,
    /// Every memory matching the filter.
    pub total: i64,
    pub limit: i64,
    pub offset: i64,
}

#[utoipa::path(get, path = "/api/v1/memories", tag = "memories",
    security(("api_key" = [])),
    params(ListQuery),
    responses(
        (status = 200, description = "A page of memories, newest first", body = MemoryPage),
        (status = 404, description = "Unknown project", body = ErrorBody),
    ))]
/// List memories, newest first.
pub async fn list_memories(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Query(page): Query<ListQuery>,
) -> AppResult<Json<MemoryPage>> {
    let filter = memories::ListFilter::default();
    list_page(
        &state,
        owner.user_id,
        page.project_id.as_deref(),
        &filter,
        page.limit,
        page.offset,
    )
    .await
}

/// A page of the account's memories: our list and MemoryX's share it.
pub async fn list_page(
    state: &AppState,
    user_id: i64,
    project: Option<&str>,
    filter: &memories::ListFilter,
    limit: i64,
    offset: i64,
) -> AppResult<Json<MemoryPage>> {
    let (data, total) =
        memories::list_filtered(&state.pool, user_id, project, filter, limit, offset).await?;
    Ok(Json(MemoryPage {
        success: true,
        data,
        total,
        limit,
        offset,
    }))
}

#[utoipa::path(get, path = "/api/v1/memories/{memory_id}", tag = "memories",
    security(("api_key" = [])),
    params(("memory_id" = String, Path, description = "The memory's id (a UUID)")),
    responses(
        (status = 200, description = "The memory", body = Data<MemoryView>),
        (status = 404, description = "No such memory in this account", body = ErrorBody),
    ))]
/// Read one memory.
pub async fn get_memory(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Path(id): Path<String>,
) -> AppResult<Json<Data<MemoryView>>> {
    Ok(Data::new(
        memories::get(&state.pool, owner.user_id, &id).await?,
    ))
}

#[utoipa::path(delete, path = "/api/v1/memories/{memory_id}", tag = "memories",
    security(("api_key" = [])),
    params(("memory_id" = String, Path, description = "The memory's id (a UUID)")),
    responses(
        (status = 200, description = "Deleted", body = Message),
        (status = 404, description = "No such memory in this account", body = ErrorBody),
    ))]
/// Delete one memory.
pub async fn delete_memory(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Path(id): Path<String>,
) -> AppResult<Json<Message>> {
    memories::delete(&state.pool, owner.user_id, &id).await?;
    Ok(Message::new("Memory deleted"))
}

/// A search.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({"query": "where does Ana like to sit?", "limit": 5}))]
pub struct SearchRequest {
    /// 1 to 4,096 characters.
    #[schema(min_length = 1, max_length = 4096)]
    pub query: String,
    /// A project's id or name; all the account's projects when omitted.
    #[schema(max_length = 256)]
    pub project_id: Option<String>,
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100, default = 10)]
    pub limit: i64,
}

impl FromFields for SearchRequest {
    fn from_fields(f: &mut Fields) -> Self {
        SearchRequest {
            query: f.required_str("query", 1, 4096),
            project_id: f.optional_str("project_id", 256).filter(|p| !p.is_empty()),
            limit: f.int_in("limit", 10, 1, 100),
        }
    }
}

/// Search results, best first, with the query echoed.
#[derive(Serialize, ToSchema)]
pub struct SearchResults {
    pub success: bool,
    pub data: Vec<SearchHit>,
    pub query: String,
}

/// Runs a search for the account (the REST route, MemoryX's and the MCP tool share it).
pub async fn run_search(
    state: &AppState,
    user_id: i64,
    req: &SearchRequest,
) -> AppResult<Vec<SearchHit>> {
    let (hits, timings) = search::search_for(
        state,
        user_id,
        req.project_id.as_deref(),
        &req.query,
        req.limit,
    )
    .await?;
    tracing::debug!(
        search.embed_ms = timings.embed_ms,
        search.keyword_ms = timings.keyword_ms,
        search.vector_ms = timings.vector_ms,
        search.finish_ms = timings.finish_ms,
        "search"
    );
    Ok(hits)
}

#[utoipa::path(post, path = "/api/v1/memories/search", tag = "memories",
    security(("api_key" = [])),
    request_body = SearchRequest,
    responses(
        (status = 200, description = "The best matches, `score` in [0, 1], best first", body = SearchResults),
        (status = 404, description = "Unknown project", body = ErrorBody),
    ))]
/// Hybrid search (vector + keyword) over the account's memories, or one project's.
pub async fn search_memories(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Body(req): Body<SearchRequest>,
) -> AppResult<Json<SearchResults>> {
    let data = run_search(&state, owner.user_id, &req).await?;
    Ok(Json(SearchResults {
        success: true,
        data,
        query: req.query,
    }))
}

#[utoipa::path(get, path = "/api/v1/tasks/{task_id}", tag = "tasks",
    security(("api_key" = [])),
    params(("task_id" = String, Path, description = "A task id (or a batch's) as answered at creation")),
    responses(
        (status = 200, description = "The task: `pending`, `processing`, `completed` or `failed`", body = Data<TaskView>),
        (status = 404, description = "No such task in this account", body = ErrorBody),
    ))]
/// Follow a queued memory, or a batch, until it is stored. Poll every second or two.
pub async fn get_task(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Path(id): Path<String>,
) -> AppResult<Json<Data<TaskView>>> {
    Ok(Data::new(
        tasks::get(&state.pool, owner.user_id, &id).await?,
    ))
}
