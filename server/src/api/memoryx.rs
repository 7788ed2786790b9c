//! The paths MemoryX's published SDKs call (`t0ken-memoryx`, `memoryx-server-sdk`; see
//! `shared/spec/memoryx-clients.md`), as thin aliases over the same domain functions as our own
//! routes. Our own paths and shapes never change for them; the shared search and delete paths
//! need no alias (search items carry `category` beside `cognitive_sector`).
use axum::extract::{Path, State};
use axum::Json;
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::{IntoParams, ToSchema};

use super::agents::{register_machine, AutoRegisterRequest};
use super::doc::ErrorBody;
use super::extract::{ApiKeyAuth, Body, ClientIp, Query};
use super::memories::{list_page, MemoryPage};
use app::core::error::{AppResult, FieldError};
use app::core::memories::{self, ListFilter, NewMemory, MAX_BATCH};
use app::core::state::AppState;
use app::core::validate::{Fields, FromFields, MAX_OFFSET};
use app::core::{machines, projects, tasks};
use app::types::TaskView;

/// MemoryX's registration body. `platform` is Python's `platform.system().lower()`: `darwin`
/// is taken as `macos`, any other value we do not know is dropped rather than refused.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({"agent_id": "python_sdk-3f0c2a9b", "machine_fingerprint":
    "3f0c2a9b8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a", "agent_type": "python_sdk",
    "agent_name": "build-box", "platform": "linux", "platform_version": "6.1.0"}))]
pub struct MemoryxRegisterRequest {
    #[schema(min_length = 16, max_length = 256, pattern = "^[A-Za-z0-9._:-]+$")]
    pub machine_fingerprint: String,
    #[schema(max_length = 128)]
    pub agent_id: Option<String>,
    #[schema(max_length = 128)]
    pub agent_type: Option<String>,
    /// Kept as the machine's hostname.
    #[schema(max_length = 255)]
    pub agent_name: Option<String>,
    pub platform: Option<String>,
    #[schema(max_length = 255)]
    pub platform_version: Option<String>,
}

impl FromFields for MemoryxRegisterRequest {
    fn from_fields(f: &mut Fields) -> Self {
        let platform = f.optional_str("platform", 64).map(|p| p.to_lowercase());
        MemoryxRegisterRequest {
            machine_fingerprint: machines::read_fingerprint(f),
            agent_id: f.optional_str("agent_id", 128).filter(|a| !a.is_empty()),
            agent_type: f.optional_str("agent_type", 128),
            agent_name: f.optional_str("agent_name", 255).filter(|h| !h.is_empty()),
            platform,
            platform_version: f.optional_str("platform_version", 255),
        }
    }
}

/// The registration with its fields at the top level, where MemoryX's client reads them.
#[derive(Serialize, ToSchema)]
pub struct MemoryxRegistered {
    pub success: bool,
    pub api_key: String,
    /// The `agent_id` sent, else one made from the fingerprint.
    pub agent_id: String,
    pub project_id: String,
    pub user_id: String,
    pub is_machine_account: bool,
    pub machine_fingerprint: String,
    pub created_at: String,
}

#[utoipa::path(post, path = "/api/agents/auto-register", tag = "memoryx",
    request_body = MemoryxRegisterRequest,
    responses(
        (status = 200, description = "The machine account and a new key, at the top level", body = MemoryxRegistered),
        (status = 409, description = "The machine was claimed: use the account's own keys", body = ErrorBody),
        (status = 429, description = "Too many registrations from this address; see `Retry-After`", body = ErrorBody),
    ))]
/// MemoryX's `auto_register()`: as `POST /api/v1/agents/auto-register`.
pub async fn auto_register(
    State(state): State<AppState>,
    ClientIp(client): ClientIp,
    Body(req): Body<MemoryxRegisterRequest>,
) -> AppResult<Json<MemoryxRegistered>> {
    let platform = match req.platform.as_deref() {
        Some("darwin") => Some("macos".to_string()),
        Some(p) if machines::PLATFORMS.contains(&p) => Some(p.to_string()),
        _ => None,
    };
    let account = register_machine(
        &state,
        &client,
        &AutoRegisterRequest {
            machine_fingerprint: req.machine_fingerprint.clone(),
            platform,
            hostname: req.agent_name.clone(),
        },
    )
    .await?;
    let agent_id = req.agent_id.unwrap_or_else(|| {
        let kind = req.agent_type.as_deref().unwrap_or("agent");
        format!("{kind}-{}", &req.machine_fingerprint[..8])
    });
    Ok(Json(MemoryxRegistered {
        success: true,
        api_key: account.api_key,
        agent_id,
        project_id: account.project_id,
        user_id: account.user_id,
        is_machine_account: account.is_machine_account,
        machine_fingerprint: account.machine_fingerprint,
        created_at: account.created_at,
    }))
}

/// One memory of a batch, as documented: the batch's `project_id` names the project for all.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct BatchMemory {
    /// The text, 1 to 32,768 characters after trimming.
    #[schema(min_length = 1, max_length = 32768)]
    content: String,
    /// A JSON object of at most 16 KiB serialised, or null.
    #[schema(value_type = Option<Object>)]
    metadata: Option<Value>,
    #[schema(max_length = 128)]
    agent_id: Option<String>,
}

/// Several memories queued as one task.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({"memories": [
    {"content": "Ana's flight to Lisbon leaves on 3 March", "metadata": {"category": "episodic"}},
    {"content": "Ana is allergic to peanuts"}
], "project_id": "default"}))]
pub struct BatchRequest {
    /// 1 to 200 memories, each under the rules of `POST /api/v1/memories`; an item's own
    /// `project_id`, if any, must be the batch's.
    #[schema(min_items = 1, max_items = 200, value_type = Vec<BatchMemory>)]
    pub memories: Vec<NewMemory>,
    /// A project's id or name for all of them; `default` when omitted.
    #[schema(max_length = 256)]
    pub project_id: Option<String>,
}

impl FromFields for BatchRequest {
    fn from_fields(f: &mut Fields) -> Self {
        let project_id = f.optional_str("project_id", 256).filter(|p| !p.is_empty());
        let project = project_id.as_deref().unwrap_or(projects::DEFAULT);
        let mut read = Vec::new();
        for (i, item) in f
            .list("memories", 1, MAX_BATCH)
            .into_iter()
            .flatten()
            .enumerate()
        {
            // An item without a project of its own goes to the batch's.
            let own_project = item
                .get("project_id")
                .and_then(Value::as_str)
                .is_some_and(|p| !p.trim().is_empty());
            // Each item under the single memory's rules; its errors located in the list.
            match f.item::<NewMemory>("memories", i, item) {
                Some(mut memory) if !own_project => {
                    memory.project = project.to_string();
                    read.push(memory);
                }
                Some(memory) if memory.project != project => {
                    let mut e = FieldError::new(
                        &["body", "memories"],
                        "value_error",
                        "Value error, a batch's memories go to the batch's project_id",
                    )
                    .input(json!(memory.project));
                    e.loc.extend([json!(i), json!("project_id")]);
                    f.push_error(e);
                }
                Some(memory) => read.push(memory),
                None => {}
            }
        }
        BatchRequest {
            memories: read,
            project_id,
        }
    }
}

/// A batch queued: one task for all its memories.
#[derive(Serialize, ToSchema)]
pub struct BatchQueued {
    pub success: bool,
    pub message: String,
    /// Completes when every memory of the batch is stored; `GET /api/v1/tasks/{task_id}`
    /// shows the counts.
    pub task_id: String,
    /// Always `pending`.
    pub status: String,
    pub queued_count: usize,
}

#[utoipa::path(post, path = "/api/v1/memories/batch", tag = "memories",
    security(("api_key" = [])),
    request_body = BatchRequest,
    responses(
        (status = 200, description = "Queued as one task", body = BatchQueued),
        (status = 404, description = "Unknown project", body = ErrorBody),
    ))]
/// Queue up to 200 memories as one task (MemoryX's `send_memories` with several).
pub async fn create_batch(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Body(req): Body<BatchRequest>,
) -> AppResult<Json<BatchQueued>> {
    let project = req.project_id.as_deref().unwrap_or(projects::DEFAULT);
    let count = req.memories.len();
    let id = memories::enqueue_batch(&state, owner.user_id, project, req.memories).await?;
    Ok(Json(BatchQueued {
        success: true,
        message: format!("{count} memories queued for processing"),
        task_id: id.to_string(),
        status: "pending".into(),
        queued_count: count,
    }))
}

/// MemoryX's list query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MemoryxListQuery {
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000, default = 50)]
    pub limit: i64,
    #[serde(default)]
    #[param(minimum = 0, maximum = 1000000000, default = 0)]
    pub offset: i64,
    /// A project's id or name; all projects when omitted.
    #[param(max_length = 256)]
    pub project_id: Option<String>,
    /// Created at or after: `YYYY-MM-DD HH:MM:SS`, `YYYY-MM-DD` or RFC 3339 (UTC).
    #[param(max_length = 64)]
    pub time_start: Option<String>,
    /// Created at or before, as `time_start`.
    #[param(max_length = 64)]
    pub time_end: Option<String>,
    /// Comma-separated cognitive sectors.
    #[param(max_length = 1024)]
    pub categories: Option<String>,
    /// Comma-separated tags, matched in `metadata.tags`.
    #[param(max_length = 1024)]
    pub tags: Option<String>,
    #[serde(skip)]
    #[param(ignore)]
    pub filter: ListFilter,
}

/// A time as MemoryX's clients send it.
fn parse_time(s: &str, end: bool) -> Option<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Some(t.with_timezone(&Utc));
    }
    if let Ok(t) = NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S") {
        return Some(t.and_utc());
    }
    let day = NaiveDate::parse_from_str(s, "%Y-%m-%d").ok()?;
    let t = if end {
        day.and_hms_milli_opt(23, 59, 59, 999)?
    } else {
        day.and_hms_opt(0, 0, 0)?
    };
    Some(t.and_utc())
}

fn comma_list(s: Option<&str>) -> Vec<String> {
    s.unwrap_or_default()
        .split(',')
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect()
}

impl FromFields for MemoryxListQuery {
    fn from_fields(q: &mut Fields) -> Self {
        let limit = q.int_in("limit", 50, 1, 1000);
        let offset = q.int_in("offset", 0, 0, MAX_OFFSET);
        let project_id = q.optional_str("project_id", 256).filter(|p| !p.is_empty());
        let time = |q: &mut Fields, name: &str, end: bool| {
            let Some(raw) = q.optional_str(name, 64).filter(|t| !t.is_empty()) else {
                return (None, None);
            };
            let parsed = parse_time(&raw, end);
            if parsed.is_none() {
                q.error(
                    name,
                    "datetime_parsing",
                    "Input should be a valid datetime: YYYY-MM-DD HH:MM:SS, YYYY-MM-DD or RFC 3339",
                    None,
                );
            }
            (parsed, Some(raw))
        };
        let (from, time_start) = time(q, "time_start", false);
        let (to, time_end) = time(q, "time_end", true);
        let categories = q.optional_str("categories", 1024);
        let tags = q.optional_str("tags", 1024);
        MemoryxListQuery {
            limit,
            offset,
            project_id,
            filter: ListFilter {
                sectors: comma_list(categories.as_deref()),
                from,
                to,
                tags: comma_list(tags.as_deref()),
            },
            time_start,
            time_end,
            categories,
            tags,
        }
    }
}

#[utoipa::path(get, path = "/api/v1/memories/list", tag = "memoryx",
    security(("api_key" = [])),
    params(MemoryxListQuery),
    responses(
        (status = 200, description = "A page of memories, newest first", body = MemoryPage),
        (status = 404, description = "Unknown project", body = ErrorBody),
    ))]
/// MemoryX's `list()`: as `GET /api/v1/memories`, with its filters.
pub async fn list_memories(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Query(q): Query<MemoryxListQuery>,
) -> AppResult<Json<MemoryPage>> {
    let project = q.project_id.as_deref();
    list_page(&state, owner.user_id, project, &q.filter, q.limit, q.offset).await
}

/// A task in Celery's words, where MemoryX's clients look for them, with our record beside.
#[derive(Serialize, ToSchema)]
pub struct MemoryxTask {
    pub success: bool,
    pub task_id: String,
    /// `PENDING`, `STARTED`, `SUCCESS` or `FAILURE`.
    pub status: String,
    /// Once it succeeded: the task record (`memory_id`, sector, importance, a batch's counts).
    pub result: Option<TaskView>,
    pub error: Option<String>,
    /// The task record, in our own words.
    pub data: TaskView,
}

#[utoipa::path(get, path = "/api/v1/memories/task/{task_id}", tag = "memoryx",
    security(("api_key" = [])),
    params(("task_id" = String, Path, description = "A task id (or a batch's)")),
    responses(
        (status = 200, description = "The task in Celery's words", body = MemoryxTask),
        (status = 404, description = "No such task in this account", body = ErrorBody),
    ))]
/// MemoryX's `get_task_status()`: as `GET /api/v1/tasks/{task_id}`.
pub async fn get_task(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Path(id): Path<String>,
) -> AppResult<Json<MemoryxTask>> {
    let task = tasks::get(&state.pool, owner.user_id, &id).await?;
    let status = match task.status.as_str() {
        "pending" => "PENDING",
        "processing" => "STARTED",
        "completed" => "SUCCESS",
        _ => "FAILURE",
    };
    Ok(Json(MemoryxTask {
        success: true,
        task_id: task.task_id.clone(),
        status: status.into(),
        result: (status == "SUCCESS").then(|| task.clone()),
        error: task.error.clone(),
        data: task,
    }))
}

/// MemoryX's `send_conversation` body.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({"conversation_id": "chat-2026-11-24", "messages": [
    {"role": "user", "content": "Book the usual table for Friday", "timestamp": 1764000000000_i64, "tokens": 7},
    {"role": "assistant", "content": "Done: Friday 8 pm at Cervejaria Ramiro", "timestamp": 1764000004000_i64, "tokens": 11}
]}))]
pub struct FlushRequest {
    /// The client's id for the conversation: appended to if the account has one with this id,
    /// else created. Null starts a new conversation.
    #[schema(max_length = 256)]
    pub conversation_id: Option<String>,
    /// 1 to 100 messages, in order.
    #[schema(min_items = 1, max_items = 100)]
    pub messages: Vec<app::core::conversations::NewMessage>,
    /// A project's id or name for a new conversation; `default` when omitted.
    #[schema(max_length = 256)]
    pub project_id: Option<String>,
}

impl FromFields for FlushRequest {
    fn from_fields(f: &mut Fields) -> Self {
        FlushRequest {
            conversation_id: f
                .optional_str("conversation_id", 256)
                .filter(|c| !c.is_empty()),
            messages: app::core::conversations::read_messages(f),
            project_id: f.optional_str("project_id", 256).filter(|p| !p.is_empty()),
        }
    }
}

/// A flush queued: one task for its messages' memories.
#[derive(Serialize, ToSchema)]
pub struct FlushQueued {
    pub success: bool,
    /// Completes when every remembered message is stored (`GET /api/v1/tasks/{task_id}`).
    pub task_id: String,
    /// `queued`, as MemoryX answers.
    pub status: String,
    pub message_count: usize,
    /// The conversation's id here (a UUID).
    pub conversation_id: String,
}

#[utoipa::path(post, path = "/api/v1/conversations/flush", tag = "memoryx",
    security(("api_key" = [])),
    request_body = FlushRequest,
    responses(
        (status = 200, description = "Stored; the messages' memories queued as one task", body = FlushQueued),
        (status = 404, description = "Unknown project", body = ErrorBody),
    ))]
/// MemoryX's `send_conversation`: append to (or create) the conversation with the client's id.
pub async fn flush_conversation(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Body(req): Body<FlushRequest>,
) -> AppResult<Json<FlushQueued>> {
    use app::core::conversations::{self, Target};
    let project = match req.project_id.as_deref() {
        Some(p) => projects::resolve(&state.pool, owner.user_id, p).await?,
        None => projects::DEFAULT.to_string(),
    };
    let target = match req.conversation_id {
        Some(id) => Target::External { id, project },
        None => Target::New {
            id: uuid::Uuid::new_v4(),
            project,
        },
    };
    let done = conversations::append(&state, owner.user_id, &target, &req.messages, true).await?;
    Ok(Json(FlushQueued {
        success: true,
        task_id: done.batch_id.map(|b| b.to_string()).unwrap_or_default(),
        status: "queued".into(),
        message_count: req.messages.len(),
        conversation_id: done.conversation_id.to_string(),
    }))
}
