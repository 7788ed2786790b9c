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

/// Memories of one sector.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct SectorCount {
    /// `episodic`, `semantic`, `procedural`, `emotional` or `reflective`.
    pub sector: String,
    pub memories: i64,
}

/// A project's size.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct ProjectSize {
    pub project_id: String,
    pub name: String,
    pub memories: i64,
    pub storage_bytes: i64,
}

/// An account's totals (`GET /api/stats`), with MemoryX's field names where it had them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct AccountStats {
    pub success: bool,
    /// Memories stored (queued ones are `tasks_pending`).
    pub total_memories: i64,
    pub total_projects: i64,
    pub total_conversations: i64,
    pub total_api_keys: i64,
    /// Machine accounts claimed into this account.
    pub machines_claimed: i64,
    /// Memories queued and not yet stored.
    pub tasks_pending: i64,
    /// Bytes stored: text, metadata and vectors.
    pub storage_bytes: i64,
    /// `storage_bytes` for people, e.g. `1.4 MB`.
    pub storage_used: String,
    /// Calls with the account's API keys today (UTC).
    pub api_calls_today: i64,
    /// … and since the 1st of this month (UTC).
    pub api_calls_this_month: i64,
    pub account_created: String,
    /// The account's plan (`GET /api/subscription/status` for its quotas).
    pub plan: String,
    /// Memories per sector, every sector listed.
    pub sectors: Vec<SectorCount>,
    /// The ten largest projects, largest first.
    pub top_projects: Vec<ProjectSize>,
}

/// One day of an account's usage.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct DailyUsage {
    /// `YYYY-MM-DD` (UTC).
    pub date: String,
    /// API calls with the account's keys.
    pub calls: i64,
    pub memories_created: i64,
    pub searches: i64,
    /// Median search time (server side), when there were searches.
    pub search_p50_ms: Option<f64>,
    pub tasks_completed: i64,
    pub tasks_failed: i64,
    /// Median time from `POST` to `completed`, when tasks completed.
    pub task_p50_ms: Option<f64>,
    /// Requests through the LLM proxy, and their tokens.
    pub proxy_requests: i64,
    pub tokens_in: i64,
    pub tokens_out: i64,
}

/// Usage per day (`GET /api/stats/usage`), oldest first.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct UsageHistory {
    pub success: bool,
    pub days: i64,
    pub daily: Vec<DailyUsage>,
}

/// A plan's quotas; `null` is unlimited.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct PlanLimits {
    /// Memories stored (queued ones included).
    pub memories: Option<i64>,
    pub api_calls_per_month: Option<i64>,
    pub searches_per_day: Option<i64>,
    /// Proxy tokens (in and out) per month.
    pub proxy_tokens_per_month: Option<i64>,
    pub projects: Option<i64>,
    /// Machine accounts claimed.
    pub machines: Option<i64>,
}

/// A subscription plan.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct PlanView {
    pub name: String,
    pub display_name: String,
    pub price_label: String,
    pub limits: PlanLimits,
    /// The plan new accounts get.
    pub is_default: bool,
}

/// One quota's use.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct QuotaUse {
    /// `memories`, `api_calls_per_month`, `searches_per_day`, `proxy_tokens_per_month`,
    /// `projects` or `machines`.
    pub quota: String,
    /// The quota in words.
    pub label: String,
    pub used: i64,
    /// `null`: unlimited.
    pub limit: Option<i64>,
    pub remaining: Option<i64>,
    /// When the count starts again (monthly and daily quotas).
    pub resets_at: Option<String>,
}

/// How to change plans.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct Billing {
    /// The checkout page, when billing is configured.
    pub checkout_url: Option<String>,
    /// Whom to ask (the operator), when set.
    pub contact: Option<String>,
}

/// The account's plan and each quota's use (`GET /api/subscription/status`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "ssr", derive(utoipa::ToSchema))]
pub struct SubscriptionStatus {
    pub success: bool,
    pub plan: PlanView,
    /// When the plan ends (then the account returns to the default plan); `null`: no end.
    pub plan_until: Option<String>,
    /// The current monthly period: the 1st of this month to the 1st of the next (UTC).
    pub period_start: String,
    pub period_end: String,
    pub quotas: Vec<QuotaUse>,
    /// Every plan there is, for choosing.
    pub plans: Vec<PlanView>,
    pub billing: Billing,
}
