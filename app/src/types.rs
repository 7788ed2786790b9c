//! Records as the API and the portal show them (compiled for server and browser alike).
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// An API key as listed: the secret is masked except at creation.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct ApiKeyView {
    pub id: i64,
    pub name: String,
    pub key: String,
    pub is_active: bool,
    pub created_at: String,
    pub last_used_at: Option<String>,
}

/// A project with the number of memories it holds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct ProjectView {
    pub id: String,
    pub name: String,
    pub description: Option<String>,
    pub created_at: String,
    pub memory_count: i64,
}

/// A memory record: all nine fields of the interface.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct MemoryView {
    pub id: String,
    pub content: String,
    pub project_id: String,
    /// The object given at creation, `{}` when omitted, `null` when sent as null.
    #[cfg_attr(feature = "ssr", schema(value_type = Option<Object>))]
    pub metadata: Value,
    pub agent_id: Option<String>,
    pub cognitive_sector: String,
    pub importance_score: f32,
    pub created_at: String,
    pub updated_at: String,
    /// The cognitive sector again, under the name MemoryX's clients read.
    pub category: String,
}

/// A memory task: every field of the interface's Task, null until known.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct TaskView {
    pub task_id: String,
    pub status: String,
    pub memory_id: Option<String>,
    pub cognitive_sector: Option<String>,
    pub importance_score: Option<f32>,
    pub created_at: String,
    pub completed_at: Option<String>,
    pub error: Option<String>,
    /// A batch's task only (`POST /api/v1/memories/batch`): its memories' progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchCounts>,
}

/// How far the memories of a batch have got: the batch's task completes when none is left
/// pending or processing.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct BatchCounts {
    pub total: i64,
    pub pending: i64,
    pub processing: i64,
    pub completed: i64,
    pub failed: i64,
    /// The stored memories' ids, in the batch's order.
    pub memory_ids: Vec<String>,
}

/// One search result.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct SearchHit {
    pub id: String,
    pub content: String,
    pub score: f32,
    pub cognitive_sector: String,
    pub importance_score: f32,
    pub project_id: String,
    #[cfg_attr(feature = "ssr", schema(value_type = Option<Object>))]
    pub metadata: Value,
    pub created_at: String,
    /// The cognitive sector again, under the name MemoryX's clients read.
    pub category: String,
}

/// A machine claimed into the account, for the portal's machines section.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct MachineView {
    pub user_id: String,
    pub hostname: Option<String>,
    pub platform: Option<String>,
    pub created_at: String,
    pub claimed_at: Option<String>,
}

/// A message of the development mailbox.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct MailView {
    pub id: i64,
    pub to_address: String,
    pub subject: String,
    pub text_body: String,
    pub created_at: String,
}

/// A live claim as the portal's claim page shows it to the human it names.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct PendingClaim {
    pub machine_id: i64,
    pub hostname: Option<String>,
    pub platform: Option<String>,
    pub projects: i64,
    pub memories: i64,
    pub expires_at: String,
}

/// A model of the public catalogue: limits, prices (USD per million tokens, exact from the
/// source) and capabilities.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "ssr", schema(example = json!({
    "id": "gpt-4o", "provider": "openai", "mode": "chat", "family": "gpt",
    "context_window": 128000, "max_output_tokens": 16384,
    "input_price_per_mtok": 2.5, "output_price_per_mtok": 10.0,
    "capabilities": ["tools", "vision", "json", "caching"],
    "deprecation_date": null
})))]
pub struct ModelView {
    /// The catalogue's id (litellm's name for the model, with its route prefix if any).
    pub id: String,
    pub provider: String,
    /// `chat`, `embedding`, `completion`, `image_generation`, `audio_transcription`, …
    pub mode: String,
    /// The model family (`gpt`, `claude`, `llama`, …) when recognised.
    pub family: Option<String>,
    /// Input tokens the model takes.
    pub context_window: Option<i64>,
    pub max_output_tokens: Option<i64>,
    /// USD per million input tokens.
    pub input_price_per_mtok: Option<f64>,
    /// USD per million output tokens.
    pub output_price_per_mtok: Option<f64>,
    /// Of `tools`, `parallel_tools`, `vision`, `json`, `caching`, `reasoning`, `audio_input`,
    /// `audio_output`, `pdf`, `web_search`.
    #[cfg_attr(feature = "ssr", schema(value_type = Vec<crate::core::models::Capability>))]
    pub capabilities: Vec<String>,
    /// `YYYY-MM-DD` when the provider retires it.
    pub deprecation_date: Option<String>,
}

/// A conversation, with how many messages it holds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct ConversationView {
    pub id: String,
    pub project_id: String,
    pub title: Option<String>,
    /// The client's own id for it (MemoryX's flush `conversation_id`, or the proxy's
    /// `X-Engram-Conversation` when it is not one of ours).
    pub external_id: Option<String>,
    pub message_count: i64,
    pub created_at: String,
    pub updated_at: String,
}

/// A message of a conversation, with the memory it produced (user and assistant messages).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct MessageView {
    pub id: String,
    /// 1, 2, … in the conversation's order.
    pub position: i32,
    /// `user`, `assistant`, `system` or `tool`.
    pub role: String,
    pub content: String,
    pub name: Option<String>,
    pub tokens: Option<i32>,
    /// When the client says it was sent.
    pub timestamp: Option<String>,
    pub created_at: String,
    /// The task remembering it; null for system and tool messages.
    pub task_id: Option<String>,
    /// The task's status: `pending`, `processing`, `completed` or `failed`.
    pub task_status: Option<String>,
    /// The memory it became, once stored.
    pub memory_id: Option<String>,
    pub cognitive_sector: Option<String>,
    pub importance_score: Option<f32>,
}

/// A memory the LLM proxy put into a chat, with its search score.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct InjectedMemory {
    pub id: String,
    pub content: String,
    pub score: f32,
    pub created_at: String,
}
