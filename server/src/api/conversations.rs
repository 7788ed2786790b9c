//! `/api/v1/conversations`: chats stored message by message, user and assistant messages
//! remembered as memories (see `app::core::conversations`).
use axum::extract::{Path, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::doc::{Data, ErrorBody, Message};
use super::extract::{ApiKeyAuth, Body, Query};
use app::core::conversations::{self, NewMessage, Target};
use app::core::error::AppResult;
use app::core::projects;
use app::core::state::AppState;
use app::core::validate::{Fields, FromFields, MAX_OFFSET};
use app::types::{ConversationView, MessageView};

/// A new conversation.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({"title": "Trip to Lisbon", "project_id": "default"}))]
pub struct NewConversation {
    #[schema(max_length = 200)]
    pub title: Option<String>,
    /// A project's id or name; `default` when omitted. Its messages' memories go there.
    #[schema(max_length = 256)]
    pub project_id: Option<String>,
}

impl FromFields for NewConversation {
    fn from_fields(f: &mut Fields) -> Self {
        NewConversation {
            title: f.optional_str("title", 200).filter(|t| !t.is_empty()),
            project_id: f.optional_str("project_id", 256).filter(|p| !p.is_empty()),
        }
    }
}

#[utoipa::path(post, path = "/api/v1/conversations", tag = "conversations",
    security(("api_key" = [])),
    request_body = NewConversation,
    responses(
        (status = 200, description = "Created", body = Data<ConversationView>),
        (status = 404, description = "Unknown project", body = ErrorBody),
    ))]
/// Start a conversation.
pub async fn create_conversation(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Body(new): Body<NewConversation>,
) -> AppResult<Json<Data<ConversationView>>> {
    let project = new.project_id.as_deref().unwrap_or(projects::DEFAULT);
    let created =
        conversations::create(&state.pool, owner.user_id, project, new.title.as_deref()).await?;
    Ok(Data::new(created))
}

/// Paging of a list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct Page {
    #[serde(default)]
    #[param(minimum = 1, maximum = 1000, default = 50)]
    pub limit: i64,
    #[serde(default)]
    #[param(minimum = 0, maximum = 1000000000, default = 0)]
    pub offset: i64,
}

impl FromFields for Page {
    fn from_fields(q: &mut Fields) -> Self {
        Page {
            limit: q.int_in("limit", 50, 1, 1000),
            offset: q.int_in("offset", 0, 0, MAX_OFFSET),
        }
    }
}

/// A page of conversations, most recently active first.
#[derive(Serialize, ToSchema)]
pub struct ConversationPage {
    pub success: bool,
    pub data: Vec<ConversationView>,
    pub total: i64,
    pub limit: i64,
    pub offset: i64,
}

#[utoipa::path(get, path = "/api/v1/conversations", tag = "conversations",
    security(("api_key" = [])),
    params(Page),
    responses((status = 200, description = "The account's conversations, most recently active first", body = ConversationPage)))]
/// List conversations with their message counts.
pub async fn list_conversations(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Query(page): Query<Page>,
) -> AppResult<Json<ConversationPage>> {
    let (data, total) =
        conversations::list(&state.pool, owner.user_id, page.limit, page.offset).await?;
    Ok(Json(ConversationPage {
        success: true,
        data,
        total,
        limit: page.limit,
        offset: page.offset,
    }))
}

/// A conversation and a page of its messages.
#[derive(Serialize, ToSchema)]
pub struct ConversationDetail {
    pub success: bool,
    pub data: ConversationView,
    /// Messages in order, from `offset`; `data.message_count` counts them all.
    pub messages: Vec<MessageView>,
    pub limit: i64,
    pub offset: i64,
}

#[utoipa::path(get, path = "/api/v1/conversations/{conversation_id}", tag = "conversations",
    security(("api_key" = [])),
    params(("conversation_id" = String, Path, description = "The conversation's id (a UUID)"), Page),
    responses(
        (status = 200, description = "The conversation and its messages", body = ConversationDetail),
        (status = 404, description = "No such conversation in this account", body = ErrorBody),
    ))]
/// Read a conversation and its messages, each with the memory it produced.
pub async fn get_conversation(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Path(id): Path<String>,
    Query(page): Query<Page>,
) -> AppResult<Json<ConversationDetail>> {
    let data = conversations::get(&state.pool, owner.user_id, &id).await?;
    let messages =
        conversations::messages(&state.pool, owner.user_id, &id, page.limit, page.offset).await?;
    Ok(Json(ConversationDetail {
        success: true,
        data,
        messages,
        limit: page.limit,
        offset: page.offset,
    }))
}

/// Messages to append.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({"messages": [
    {"role": "user", "content": "I moved to Lisbon last spring"},
    {"role": "assistant", "content": "How are you finding Lisbon so far?"}
]}))]
pub struct AppendMessages {
    /// 1 to 100 messages, in order.
    #[schema(min_items = 1, max_items = 100)]
    pub messages: Vec<NewMessage>,
}

impl FromFields for AppendMessages {
    fn from_fields(f: &mut Fields) -> Self {
        AppendMessages {
            messages: conversations::read_messages(f),
        }
    }
}

/// Messages appended.
#[derive(Serialize, ToSchema)]
pub struct Appended {
    pub success: bool,
    pub conversation_id: String,
    /// The new messages' ids, in order.
    pub message_ids: Vec<String>,
    /// Per message, the task remembering it (`GET /api/v1/tasks/{task_id}`); null for system
    /// and tool messages, which are stored but not remembered.
    pub task_ids: Vec<Option<String>>,
}

#[utoipa::path(post, path = "/api/v1/conversations/{conversation_id}/messages", tag = "conversations",
    security(("api_key" = [])),
    params(("conversation_id" = String, Path, description = "The conversation's id (a UUID)")),
    request_body = AppendMessages,
    responses(
        (status = 200, description = "Stored; user and assistant messages queued as memories", body = Appended),
        (status = 404, description = "No such conversation in this account", body = ErrorBody),
    ))]
/// Append messages; each user or assistant message is queued as a memory.
pub async fn append_messages(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Path(id): Path<String>,
    Body(req): Body<AppendMessages>,
) -> AppResult<Json<Appended>> {
    let id = uuid::Uuid::parse_str(&id)
        .map_err(|_| app::core::error::AppError::not_found("Conversation"))?;
    let done =
        conversations::append(&state, owner.user_id, &Target::Id(id), &req.messages, false).await?;
    Ok(Json(Appended {
        success: true,
        conversation_id: done.conversation_id.to_string(),
        message_ids: done.message_ids.iter().map(ToString::to_string).collect(),
        task_ids: done
            .task_ids
            .iter()
            .map(|t| t.map(|t| t.to_string()))
            .collect(),
    }))
}

/// What a deletion takes with it.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// `delete` also deletes the memories its messages produced; `keep` (the default) keeps
    /// them.
    #[param(inline, value_type = Option<MemoriesOnDelete>)]
    pub memories: Option<String>,
}

/// What becomes of a deleted conversation's memories.
#[derive(ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum MemoriesOnDelete {
    Keep,
    Delete,
}

impl FromFields for DeleteQuery {
    fn from_fields(q: &mut Fields) -> Self {
        DeleteQuery {
            memories: q.optional_enum("memories", &["keep", "delete"]),
        }
    }
}

#[utoipa::path(delete, path = "/api/v1/conversations/{conversation_id}", tag = "conversations",
    security(("api_key" = [])),
    params(("conversation_id" = String, Path, description = "The conversation's id (a UUID)"), DeleteQuery),
    responses(
        (status = 200, description = "Deleted", body = Message),
        (status = 404, description = "No such conversation in this account", body = ErrorBody),
    ))]
/// Delete a conversation and its messages; its memories stay unless `?memories=delete`.
pub async fn delete_conversation(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Path(id): Path<String>,
    Query(q): Query<DeleteQuery>,
) -> AppResult<Json<Message>> {
    let with_memories = q.memories.as_deref() == Some("delete");
    conversations::delete(&state.pool, owner.user_id, &id, with_memories).await?;
    Ok(Message::new(if with_memories {
        "Conversation and its memories deleted"
    } else {
        "Conversation deleted; its memories stay"
    }))
}
